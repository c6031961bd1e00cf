// Split-KV decode attention for one query token: grid (splits, heads); each block runs an
// online softmax over its slice of the visible keys and writes (max, sum, weighted V); the
// last block of a head merges the slices. The same kernel applies the per-head q/k RMSNorm,
// RoPE (default and proportional: pairs with inv_freq = 0 pass through) and the weightless v
// norm, and appends the new K/V (slot = pos % cap: a ring buffer for sliding layers). Sliding layers read a ring of `cap` slots (slot = pos %
// cap); KV-shared layers simply pass their donor's cache. Head dims that are multiples of 128 up
// to 512.
#include "common.cuh"
#include "rope.cuh"

struct AttnParams {
    const float* q;        // [nh][hd]
    int* counters;         // [nh] zeroed; the last split block of a head combines
    const float* k_cache;  // [nkv][cap][hd]
    const float* v_cache;
    float* part_ml;        // [nh][splits][2]
    float* part_acc;       // [nh][splits][hd]
    float* out;            // [nh][hd]
    const int* pos;
    int nh, nkv, hd, cap, window, splits;
    float scale, softcap;
    // Fused q/k norm + RoPE + KV append (when qkv is set): the block derives its query head
    // from the QKV projection, and the block holding the newest key derives k and v too.
    const float* qkv;      // q (nh*hd) | k (nkv*hd) | v (nkv*hd)
    const float* q_norm;
    const float* k_norm;   // null: weightless
    const float* inv_freq; // [hd/2]
    int own_kv, v_norm;
    float eps;
    int prefetch;          // before the wait: pull this block's first K/V tile into L2
    int qkv_splits, qkv_ld;  // qkv is the sum of this many partial vectors, qkv_ld apart
    L2Prefetch pf;           // a later kernel's weights to pull into L2 (see common.cuh)
};

#define ATTN_THREADS 128
#define ATTN_TILE 32
#define ATTN_MAX_SPLITS 128

// Shared memory of one attention work item (one block, or one 128-thread group of the
// persistent decode step).
struct AttnSmem {
    float sc[ATTN_TILE];
    int slot_s[ATTN_TILE];
    __align__(16) float qs[512];
    __align__(16) float ks[512];
    __align__(16) float vs[512];
    float red[32];
    float wsh[ATTN_MAX_SPLITS];
    float tile_m, tile_corr, tile_sum, inv_l;
    int is_last;
};

template <class G, int NVT = 0>
__device__ void attn_combine_head(const AttnParams& p, int h, int splits, AttnSmem& sm, G g);

// Pull the first K/V tile of split s of head h into L2 (a hint; see AttnParams::prefetch).
__device__ void attn_prefetch_tile(const AttnParams& p, int s, int h, int t, int nt) {
    // The keys before `pos` of this block's first tile, K and V, one 128-byte line per request.
    // `pos` (step_io) was written by the previous step or the host, both ordered before this
    // step began.
    const int ppos = *p.pos;
    const int pn = p.window > 0 ? min(ppos + 1, p.window) : ppos + 1;
    const int pchunk = (pn + p.splits - 1) / p.splits;
    const int pk0 = s * pchunk, pk1 = min(min(pn, pk0 + pchunk), pk0 + ATTN_TILE);
    const int pfirst = ppos + 1 - pn;
    const int pg = h / (p.nh / p.nkv);
    const int lines = p.hd >> 5;  // 128-byte lines per row
    for (int i = t; i < (pk1 - pk0) * lines * 2; i += nt) {
        const int kp = pfirst + pk0 + i / (2 * lines);
        if (kp >= ppos) continue;
        const int rem = i % (2 * lines);
        const float* base = rem < lines ? p.k_cache : p.v_cache;
        const float* row = base + ((size_t)pg * p.cap + kp % p.cap) * p.hd;
        asm volatile("prefetch.global.L2 [%0];" ::"l"(row + 32 * (rem % lines)));
    }
}

// The keys of split s: [k0, k1) counted from the oldest visible key `first`.
struct AttnSpan {
    int pos, n_keys, first, k0, k1;
};
__device__ __forceinline__ AttnSpan attn_span(const AttnParams& p, int s) {
    AttnSpan a;
    a.pos = *p.pos;
    a.n_keys = p.window > 0 ? min(a.pos + 1, p.window) : a.pos + 1;
    a.first = a.pos + 1 - a.n_keys;
    const int chunk = (a.n_keys + p.splits - 1) / p.splits;
    a.k0 = s * chunk;
    a.k1 = min(a.n_keys, a.k0 + chunk);
    return a;
}

// Copies split s's K and V rows (one tile at most) into shared kt/vt (row j = key k0 + j) with
// cp.async. Rows before `pos` were written by earlier steps, so they may be requested before
// the wait for the previous kernel (`at_pos` false); the row at `pos` is written in this step
// (by this layer's attention or, for a KV-shared layer, its donor's) and is requested after it
// (`at_pos` true) unless this block computes it itself.
__device__ void attn_tile_copy(const AttnParams& p, int s, int h, float* kt, float* vt, int t,
                               int nthreads, bool at_pos) {
    const AttnSpan a = attn_span(p, s);
    if (a.k1 - a.k0 > ATTN_TILE) return;  // more than one tile: read from global memory
    const int g = h / (p.nh / p.nkv);
    const int c4 = p.hd >> 2;  // 16-byte pieces per row
    const int rows = max(a.k1 - a.k0, 0);
    for (int i = t; i < rows * c4 * 2; i += nthreads) {
        const int r = i / (2 * c4), rem = i % (2 * c4);
        const int kp = a.first + a.k0 + r;
        if ((kp == a.pos) != at_pos) continue;
        const bool isv = rem >= c4;
        const int c = isv ? rem - c4 : rem;
        const float* src = (isv ? p.v_cache : p.k_cache) + ((size_t)g * p.cap + kp % p.cap) * p.hd + 4 * c;
        cp_async16((isv ? vt : kt) + (size_t)r * p.hd + 4 * c, src);
    }
    cp_async_commit();
}

// Split s of head h, run by the 128 threads of `g` (see attn_split). KU keys per warp are
// loaded together in the q.k phase, VU in the p.V phase (fewer: fewer registers). NVT: the head
// dim / 128 when known at compile time (0: p.hd at run time); the same arithmetic either way,
// without the guards and predicated-off lanes of the dims a head does not have. With kt/vt
// set, the split's keys and values are in shared memory already (attn_tile_copy; the caller
// has not waited for the copies yet), else they are read from the cache.
// With `vred` (4 x 512 floats of shared memory; not with a shared tile) the p.V phase runs by
// warps instead of threads: warp w takes keys w, w + 4, ... and each lane its float4s of the
// row (as the q.k phase does), then the four warps' sums are added in order — a quarter of the
// loads, address math and predicated-off lanes per key; sums in another order than the
// thread-per-dimension loop (same tolerance to the CPU reference).
// MINK > 0: only as many of the grid's p.splits splits as give each at least MINK keys take part
// (the others return at once; the merge adds only those), so a plan sized for a long context
// (p.splits = max_keys / 32, up to 128) does not split a short one into 1-key pieces and merge
// 128 partials. The split boundaries, hence the sums' order, depend on the context only.
template <class G, int KU = 4, int VU = 8, int NVT = 0, int MINK = 0>
__device__ void attn_item(const AttnParams& p, int s, int h, AttnSmem& sm, G gr,
                          unsigned long long* stamps = nullptr, const float* kt = nullptr,
                          const float* vt = nullptr, const float* cw = nullptr,
                          float* vred = nullptr) {
    float* const sc = sm.sc;
    int* const slot_s = sm.slot_s;
    float* const qs = sm.qs;
    float* const ks = sm.ks;
    float* const vs = sm.vs;
    float* const red = sm.red;
    const int t = gr.t(), lane = t & 31, warp = t >> 5;
    const int pos = *p.pos;
    const int n_keys = p.window > 0 ? min(pos + 1, p.window) : pos + 1;
    const int first = pos + 1 - n_keys;
    const int splits = MINK ? min(p.splits, (n_keys + MINK - 1) / MINK) : p.splits;
    if (MINK && s >= splits) return;  // block-uniform: s is the block's split
    const int chunk = (n_keys + splits - 1) / splits;
    const int k0 = s * chunk, k1 = min(n_keys, k0 + chunk);
    const int g = h / (p.nh / p.nkv);
    const int hd = NVT ? NVT * 128 : p.hd;
    const int nv = hd >> 7;  // float4s per lane for the q.k dot
    const float* K = p.k_cache + (size_t)g * p.cap * hd;
    const float* V = p.v_cache + (size_t)g * p.cap * hd;

    // Does this block hold the newest key, computed here rather than read from the cache?
    const bool fresh = p.qkv && p.own_kv && k1 == n_keys && k0 < k1;
    const float* qsrc = p.q + (size_t)h * hd;
    if (p.qkv) {
        // Norm weights and RoPE frequencies from `cw` when the caller staged them there
        // (attn_stage_constants), else from global memory.
        const float* qw = cw ? cw : p.q_norm;
        const float* kw = cw ? (p.k_norm ? cw + 512 : nullptr) : p.k_norm;
        const float* fq = cw ? cw + 1024 : p.inv_freq;
        const HeadJob qj = {p.qkv + (size_t)h * hd, qs, qw, fq, true};
        qsrc = qs;
        if (fresh) {
            const float* kv0 = p.qkv + (size_t)p.nh * hd;
            const HeadJob jobs[3] = {qj,
                                     {kv0 + (size_t)g * hd, ks, kw, fq, true},
                                     {kv0 + (size_t)(p.nkv + g) * hd, vs, nullptr, nullptr, p.v_norm != 0}};
            norm_rope_heads<3>(jobs, p.qkv_splits, p.qkv_ld, hd, pos, p.eps, red, gr);
            // One block per KV head stores the new entry; the others use their own copy.
            if (h % (p.nh / p.nkv) == 0) {
                const size_t base = (size_t)(pos % p.cap) * hd;
                for (int i = t; i < hd; i += ATTN_THREADS) {
                    ((float*)K)[base + i] = ks[i];
                    ((float*)V)[base + i] = vs[i];
                }
            }
        } else {
            const HeadJob jobs[1] = {qj};
            norm_rope_heads<1>(jobs, p.qkv_splits, p.qkv_ld, hd, pos, p.eps, red, gr);
        }
    }
    stamp_at(stamps, 6);
    // The shared-memory tile when there is one and the split fits it.
    const bool tiled = kt != nullptr && k1 - k0 <= ATTN_TILE;
    if (kt != nullptr) {
        cp_async_wait<0>();
        gr.sync();
    }
    float4 qv[4];
#pragma unroll
    for (int i = 0; i < 4; i++)
        if (i < nv) qv[i] = *(const float4*)(qsrc + 4 * lane + 128 * i);

    float m = -INFINITY, l = 0.f, acc[4] = {0.f, 0.f, 0.f, 0.f};
    const bool by_warp = vred != nullptr && !tiled;
    float4 av[4];
#pragma unroll
    for (int i = 0; i < 4; i++) av[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int t0 = k0; t0 < k1; t0 += ATTN_TILE) {
        const int nt = min(ATTN_TILE, k1 - t0);
        // q.k: warp w takes keys w*8 .. w*8+7 of the tile, four at a time.
#pragma unroll
        for (int jj = 0; jj < 8; jj += KU) {
            float4 kk[KU][4];
            int slots[KU];
#pragma unroll
            for (int u = 0; u < KU; u++) {
                const int j = warp * 8 + jj + u;
                const int kp = first + t0 + min(j, nt - 1);
                slots[u] = kp % p.cap;
                const float* kr =
                    (fresh && kp == pos ? ks
                     : tiled            ? kt + (size_t)(t0 - k0 + min(j, nt - 1)) * hd
                                        : K + (size_t)slots[u] * hd) +
                    4 * lane;
#pragma unroll
                for (int i = 0; i < 4; i++)
                    if (i < nv && j < nt) kk[u][i] = *(const float4*)(kr + 128 * i);
            }
#pragma unroll
            for (int u = 0; u < KU; u++) {
                const int j = warp * 8 + jj + u;
                float d = 0.f;
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    if (i < nv && j < nt) {
                        d = fmaf(qv[i].x, kk[u][i].x, d);
                        d = fmaf(qv[i].y, kk[u][i].y, d);
                        d = fmaf(qv[i].z, kk[u][i].z, d);
                        d = fmaf(qv[i].w, kk[u][i].w, d);
                    }
                }
                d = warp_sum(d) * p.scale;
                if (p.softcap > 0.f) d = p.softcap * tanhf(d / p.softcap);
                if (lane == 0 && j < nt) {
                    sc[j] = d;
                    // -1 marks the fresh key, read from shared memory in the p.V phase.
                    // (tiled: the row of the shared tile instead of the cache slot)
                    slot_s[j] = fresh && first + t0 + j == pos ? -1 : tiled ? t0 - k0 + j : slots[u];
                }
            }
        }
        gr.sync();
        // Warp 0: one key per lane; tile max, probabilities and their sum.
        if (warp == 0) {
            const float v = lane < nt ? sc[lane] : -INFINITY;
            const float mn = fmaxf(m, warp_max(v));
            const float pj = lane < nt ? expf(v - mn) : 0.f;
            const float sum = warp_sum(pj);
            sc[lane] = pj;
            if (lane == 0) {
                sm.tile_m = mn;
                sm.tile_corr = expf(m - mn);
                sm.tile_sum = sum;
            }
        }
        gr.sync();
        const float corr = sm.tile_corr;
        m = sm.tile_m;
        l = l * corr + sm.tile_sum;
        if (by_warp) {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                av[i].x *= corr;
                av[i].y *= corr;
                av[i].z *= corr;
                av[i].w *= corr;
            }
            for (int j = warp; j < nt; j += 4) {
                const int sl = slot_s[j];
                const float pj = sc[j];
                // Warp-uniform: the fresh row from shared memory, the others from the cache.
                const float* vr = sl < 0 ? nullptr : V + (size_t)sl * hd + 4 * lane;
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    if (i < nv) {
                        const float4 v = sl < 0 ? *(const float4*)(vs + 4 * lane + 128 * i)
                                                : *(const float4*)(vr + 128 * i);
                        av[i].x = fmaf(pj, v.x, av[i].x);
                        av[i].y = fmaf(pj, v.y, av[i].y);
                        av[i].z = fmaf(pj, v.z, av[i].z);
                        av[i].w = fmaf(pj, v.w, av[i].w);
                    }
                }
            }
            gr.sync();
            continue;
        }
#pragma unroll
        for (int d = 0; d < 4; d++) acc[d] *= corr;
        for (int j0 = 0; j0 < nt; j0 += VU) {
            float vv[VU][4];
#pragma unroll
            for (int u = 0; u < VU; u++) {
                const int sl = slot_s[min(j0 + u, nt - 1)];
                const float* vr = (sl < 0 ? vs : (tiled ? vt : V) + (size_t)sl * hd) + t;
#pragma unroll
                for (int d = 0; d < 4; d++)
                    if (d < nv) vv[u][d] = vr[128 * d];
            }
#pragma unroll
            for (int u = 0; u < VU; u++) {
                const float pj = j0 + u < nt ? sc[j0 + u] : 0.f;
#pragma unroll
                for (int d = 0; d < 4; d++)
                    if (d < nv) acc[d] = fmaf(pj, vv[u][d], acc[d]);
            }
        }
        gr.sync();
    }
    if (by_warp) {
        // The warps' sums, added in warp order into the thread-per-dimension layout.
#pragma unroll
        for (int i = 0; i < 4; i++)
            if (i < nv) ((float4*)(vred + warp * 512))[lane + 32 * i] = av[i];
        gr.sync();
#pragma unroll
        for (int d = 0; d < 4; d++)
            if (d < nv) {
                const int c = t + 128 * d;
                acc[d] = ((vred[c] + vred[512 + c]) + vred[1024 + c]) + vred[1536 + c];
            }
    }
    stamp_at(stamps, 7);
    const size_t pi = (size_t)h * p.splits + s;
    if (t == 0) {
        p.part_ml[2 * pi] = m;
        p.part_ml[2 * pi + 1] = l;
    }
#pragma unroll
    for (int d = 0; d < 4; d++)
        if (d < nv) p.part_acc[pi * hd + t + 128 * d] = acc[d];
    if (p.counters == nullptr) return;
    // The last block of this head to finish merges the splits (no separate launch).
    __threadfence();
    gr.sync();
    if (t == 0) sm.is_last = atomicAdd(p.counters + h, 1) == splits - 1;
    gr.sync();
    if (!sm.is_last) return;
    __threadfence();
    attn_combine_head<G, NVT>(p, h, splits, sm, gr);
    if (t == 0) p.counters[h] = 0;
}


// Norm weights (q at 0, k at 512) and RoPE frequencies (at 1024) for attn_item's `cw`: loaded
// before the wait for the previous kernel (they are constant), stored after it. attn_item reads
// them only after two barriers of its own.
struct AttnConstants {
    float q[4], k[4], f[2];
    __device__ __forceinline__ void load(const AttnParams& p) {
        const int t = threadIdx.x;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int c = t + ATTN_THREADS * i;
            if (c < p.hd) {
                q[i] = p.q_norm[c];
                k[i] = p.k_norm ? p.k_norm[c] : 0.f;
            }
        }
#pragma unroll
        for (int i = 0; i < 2; i++)
            if (t + ATTN_THREADS * i < (p.hd >> 1)) f[i] = p.inv_freq[t + ATTN_THREADS * i];
    }
    __device__ __forceinline__ void store(const AttnParams& p, float* cw) const {
        const int t = threadIdx.x;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int c = t + ATTN_THREADS * i;
            if (c < p.hd) {
                cw[c] = q[i];
                cw[512 + c] = k[i];
            }
        }
#pragma unroll
        for (int i = 0; i < 2; i++)
            if (t + ATTN_THREADS * i < (p.hd >> 1)) cw[1024 + t + ATTN_THREADS * i] = f[i];
    }
};

template <int NVT, bool BY_WARP = false, int MINK = 0>
__device__ __forceinline__ void attn_split_block(const AttnParams& p) {
    __shared__ AttnSmem sm;
    __shared__ float cw[1280];
    __shared__ __align__(16) float vred[BY_WARP ? 4 * 512 : 4];
    AttnConstants c;
    if (p.qkv) c.load(p);
    if (p.prefetch) attn_prefetch_tile(p, blockIdx.x, blockIdx.y, threadIdx.x, ATTN_THREADS);
    l2_prefetch(p.pf, blockIdx.y * gridDim.x + blockIdx.x, gridDim.x * gridDim.y);
    pdl_wait();
    pdl_launch_dependents();
    if (p.qkv) c.store(p, cw);
    attn_item<BlockThreads, 4, 8, NVT, MINK>(p, blockIdx.x, blockIdx.y, sm, BlockThreads{}, nullptr,
                                       nullptr, nullptr, p.qkv ? cw : nullptr,
                                       BY_WARP ? vred : nullptr);
}

// Any head dim (a multiple of 128 up to 512).
extern "C" __global__ void __launch_bounds__(ATTN_THREADS) attn_split(const AttnParams p) {
    attn_split_block<0>(p);
}

// Head dims 256 and 512 (Gemma 3; Gemma 4's sliding and global layers) compiled for their size.
extern "C" __global__ void __launch_bounds__(ATTN_THREADS) attn_split_hd256(const AttnParams p) {
    attn_split_block<2>(p);
}
extern "C" __global__ void __launch_bounds__(ATTN_THREADS) attn_split_hd512(const AttnParams p) {
    attn_split_block<4>(p);
}

// The same with the p.V phase by warps (attn_item's `vred`).
extern "C" __global__ void __launch_bounds__(ATTN_THREADS) attn_split_wv_hd256(const AttnParams p) {
    attn_split_block<2, true>(p);
}
extern "C" __global__ void __launch_bounds__(ATTN_THREADS) attn_split_wv_hd512(const AttnParams p) {
    attn_split_block<4, true>(p);
}

// The same with only splits of at least 8 or 32 keys taking part (attn_item's MINK;
// CudaOptions::attn_min_keys).
extern "C" __global__ void __launch_bounds__(ATTN_THREADS) attn_split_wv_hd256_k8(const AttnParams p) {
    attn_split_block<2, true, 8>(p);
}
extern "C" __global__ void __launch_bounds__(ATTN_THREADS) attn_split_wv_hd512_k8(const AttnParams p) {
    attn_split_block<4, true, 8>(p);
}
extern "C" __global__ void __launch_bounds__(ATTN_THREADS) attn_split_wv_hd256_k32(const AttnParams p) {
    attn_split_block<2, true, 32>(p);
}
extern "C" __global__ void __launch_bounds__(ATTN_THREADS) attn_split_wv_hd512_k32(const AttnParams p) {
    attn_split_block<4, true, 32>(p);
}

// attn_split with the split's K/V tile copied into shared memory (dynamic, 2 x ATTN_TILE x hd
// floats) before the wait for the previous kernel, so the cache reads overlap its tail and the
// query norm instead of following them. Same arithmetic, same results.
extern "C" __global__ void __launch_bounds__(ATTN_THREADS) attn_split_tile(const AttnParams p) {
    __shared__ AttnSmem sm;
    extern __shared__ __align__(16) float attn_tile[];
    float* kt = attn_tile;
    float* vt = attn_tile + ATTN_TILE * p.hd;
    __shared__ float cw[1280];
    AttnConstants c;
    if (p.qkv) c.load(p);
    attn_tile_copy(p, blockIdx.x, blockIdx.y, kt, vt, threadIdx.x, ATTN_THREADS, false);
    l2_prefetch(p.pf, blockIdx.y * gridDim.x + blockIdx.x, gridDim.x * gridDim.y);
    pdl_wait();
    pdl_launch_dependents();
    if (p.qkv) c.store(p, cw);
    // The row at pos when this block does not compute it (KV-shared layers read the donor's).
    if (!(p.qkv && p.own_kv)) attn_tile_copy(p, blockIdx.x, blockIdx.y, kt, vt, threadIdx.x, ATTN_THREADS, true);
    attn_item(p, blockIdx.x, blockIdx.y, sm, BlockThreads{}, nullptr, kt, vt, p.qkv ? cw : nullptr);
}

// Merge the splits of head h (128 threads). Split weights are computed once into shared
// memory, then every thread adds its dims over the splits with independent loads.
template <class G, int NVT>
__device__ void attn_combine_head(const AttnParams& p, int h, int splits, AttnSmem& sm, G gr) {
    float* const wsh = sm.wsh;
    const int hd = NVT ? NVT * 128 : p.hd;
    const int t = gr.t(), nv = hd >> 7;
    if (t < 32) {
        float mx = -INFINITY;
        for (int s = t; s < splits; s += 32) mx = fmaxf(mx, __ldcg(p.part_ml + 2 * ((size_t)h * p.splits + s)));
        mx = warp_max(mx);
        float L = 0.f;
        for (int s = t; s < splits; s += 32) {
            const size_t pi = (size_t)h * p.splits + s;
            const float ms = __ldcg(p.part_ml + 2 * pi);
            const float e = ms == -INFINITY ? 0.f : expf(ms - mx);
            wsh[s] = e;
            L = fmaf(__ldcg(p.part_ml + 2 * pi + 1), e, L);
        }
        L = warp_sum(L);
        if (t == 0) sm.inv_l = 1.f / L;
    }
    gr.sync();
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 8
    for (int s = 0; s < splits; s++) {
        const float e = wsh[s];
        const float* a = p.part_acc + ((size_t)h * p.splits + s) * hd + t;
#pragma unroll
        for (int d = 0; d < 4; d++)
            if (d < nv) acc[d] = fmaf(__ldcg(a + 128 * d), e, acc[d]);
    }
    const float inv = sm.inv_l;
#pragma unroll
    for (int d = 0; d < 4; d++)
        if (d < nv) p.out[(size_t)h * hd + t + 128 * d] = acc[d] * inv;
}

