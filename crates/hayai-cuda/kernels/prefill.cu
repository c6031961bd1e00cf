// Batched prompt processing (prefill): the projections of a whole chunk of prompt tokens run as
// GEMMs on tensor cores (mma.sync m16n8k16, bf16 in, f32 accumulate; sm_80+), the rest as
// row-parallel kernels. Activations entering a GEMM are rounded to bf16; int4 weights are
// dequantized to bf16 tile by tile. Every result row depends only on its own token and the keys
// before it (fixed K order in the GEMM, whose K parts depend on the matrix only; key tiles
// aligned to absolute positions in attention), so the output does not depend on how a prompt is
// cut into chunks.
#include "common.cuh"
#include "rope.cuh"

// A GEMM input element: bf16(v) at hi[i] and, in precise mode (lo set), the remainder
// bf16(v - bf16(v)) at lo[i], so hi + lo carries 16 significant bits (relative error <= 2^-17).
__device__ __forceinline__ void store_operand(uint16_t* hi, uint16_t* lo, size_t i, float v) {
    const __nv_bfloat16 h = __float2bfloat16_rn(v);
    hi[i] = __bfloat16_as_ushort(h);
    if (lo) lo[i] = f32_to_bf16_bits(v - __bfloat162float(h));
}

// ---- Row kernels ----------------------------------------------------------------------------

struct PfRowsParams {
    float* x;                 // [n][cols] residual stream, updated in place
    const int* tok;           // if set: x = table[tok[t]] * table_scale (bf16 table)
    const uint16_t* table;
    const float* add;         // if set: x = (x + rmsnorm(add) * add_w) * scalar (add_w null: plain add)
    const float* add_w;       // (add: the sum of add_parts vectors part_stride floats apart, a K-split GEMM's)
    uint16_t* out;            // if set: bf16 [n][cols] = rmsnorm(x) * norm_w, or x when norm_w is null
    uint16_t* out_lo;         // precise mode: the remainders (see store_operand)
    const float* norm_w;
    int cols, add_ld, add_parts, part_stride;
    float table_scale, scalar, eps;
};

// Element j of the added row: its K-split parts summed in part order.
__device__ __forceinline__ float added(const PfRowsParams& p, const float* a, int j) {
    float b = a[j];
    for (int z = 1; z < p.add_parts; z++) b += a[(size_t)z * p.part_stride + j];
    return b;
}

// grid: one block per row; each thread owns the columns j = threadIdx.x + k * blockDim.x.
extern "C" __global__ void __launch_bounds__(256) pf_rows(const PfRowsParams p) {
    __shared__ float red[32];
    const int t = blockIdx.x;
    float* xr = p.x + (size_t)t * p.cols;
    if (p.tok) {
        const uint16_t* e = p.table + (size_t)p.tok[t] * p.cols;
        for (int j = threadIdx.x; j < p.cols; j += blockDim.x) xr[j] = bf16_to_f32(e[j]) * p.table_scale;
    }
    if (p.add) {
        const float* a = p.add + (size_t)t * p.add_ld;
        float sc = 1.f;
        if (p.add_w) {
            float ss = 0.f;
            for (int j = threadIdx.x; j < p.cols; j += blockDim.x) {
                const float b = added(p, a, j);
                ss += b * b;
            }
            sc = rsqrtf(block_sum(ss, red) / (float)p.cols + p.eps);
        }
        for (int j = threadIdx.x; j < p.cols; j += blockDim.x) {
            float b = added(p, a, j);
            if (p.add_w) b = b * sc * p.add_w[j];
            xr[j] = (xr[j] + b) * p.scalar;
        }
    }
    if (!p.out) return;
    uint16_t* o = p.out + (size_t)t * p.cols;
    uint16_t* lo = p.out_lo ? p.out_lo + (size_t)t * p.cols : nullptr;
    if (p.norm_w) {
        float ss = 0.f;
        for (int j = threadIdx.x; j < p.cols; j += blockDim.x) ss += xr[j] * xr[j];
        const float sc = rsqrtf(block_sum(ss, red) / (float)p.cols + p.eps);
        for (int j = threadIdx.x; j < p.cols; j += blockDim.x) store_operand(o, lo, j, xr[j] * sc * p.norm_w[j]);
    } else {
        for (int j = threadIdx.x; j < p.cols; j += blockDim.x) store_operand(o, lo, j, xr[j]);
    }
}

struct PfActParams {
    const float* in;    // glu: [n][2*cols] interleaved (gate, up) pairs; else [n][cols]
    const float* mult;  // !glu: out = gelu(in) * mult[t * mult_ld + j]
    uint16_t* out;      // bf16 [n][cols]
    uint16_t* out_lo;   // precise mode: the remainders
    int n, cols, glu, mult_ld;
    int in_parts, part_stride;  // !glu: in is the sum of in_parts vectors part_stride floats apart
};

extern "C" __global__ void pf_act(const PfActParams p) {
    const size_t total = (size_t)p.n * p.cols;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t t = i / p.cols, j = i % p.cols;
        float v;
        if (p.glu) {
            const float2 gu = *(const float2*)(p.in + t * 2 * p.cols + 2 * j);
            v = gelu_tanh(gu.x) * gu.y;
        } else {
            // A K-split GEMM's parts, summed in part order.
            float a = p.in[i];
            for (int z = 1; z < p.in_parts; z++) a += p.in[(size_t)z * p.part_stride + i];
            v = gelu_tanh(a) * p.mult[t * p.mult_ld + j];
        }
        store_operand(p.out, p.out_lo, i, v);
    }
}

// Per-layer embeddings of a chunk: grid (n tokens, n_layers), `dim` threads.
struct PfPleParams {
    const int* tok;
    const uint16_t* table;  // bf16 [vocab][n_layers * dim]
    const float* ctx;       // [n][n_layers * dim] projection of the scaled token embedding
    const float* norm_w;    // [dim]
    float* out;             // [n][n_layers * dim]
    int dim;
    float tok_scale, ctx_scale, mix_scale, eps;
};

extern "C" __global__ void pf_ple(const PfPleParams p) {
    __shared__ float red[32];
    const int t = blockIdx.x, width = gridDim.y * p.dim;
    const int j = blockIdx.y * p.dim + threadIdx.x;
    float c = p.ctx[(size_t)t * width + j] * p.ctx_scale;
    const float ss = block_sum(c * c, red);
    c = c * rsqrtf(ss / (float)p.dim + p.eps) * p.norm_w[threadIdx.x];
    const float e = bf16_to_f32(p.table[(size_t)p.tok[t] * width + j]) * p.tok_scale;
    p.out[(size_t)t * width + j] = (c + e) * p.mix_scale;
}

// q/k norm + RoPE of a chunk, K/V appended to the cache (slot = pos % cap).
// grid (n tokens, nh + 2 nkv when the layer owns its cache, else nh), 128 threads.
struct PfQkvParams {
    const float* qkv;  // [n][ld]: q (nh*hd) | k (nkv*hd) | v (nkv*hd)
    float* q;          // [n][nh*hd]
    float* k_cache;    // [nkv][cap][hd]
    float* v_cache;
    const float* q_norm;
    const float* k_norm;  // null: weightless
    const float* inv_freq;
    int ld, p0, nh, nkv, hd, cap, v_norm;
    float eps;
    int parts, part_stride;  // qkv is the sum of `parts` K-split parts part_stride floats apart
};

extern "C" __global__ void __launch_bounds__(128) pf_qkv(const PfQkvParams p) {
    __shared__ __align__(16) float buf[512];
    __shared__ float red[32];
    const int t = blockIdx.x, hh = blockIdx.y, pos = p.p0 + t;
    const float* src = p.qkv + (size_t)t * p.ld + (size_t)hh * p.hd;
    const int k = p.parts, ks = p.part_stride;
    float* dst;
    if (hh < p.nh) {
        norm_rope_head(src, buf, p.q_norm, p.inv_freq, p.hd, pos, true, p.eps, red, k, ks);
        dst = p.q + ((size_t)t * p.nh + hh) * p.hd;
    } else if (hh < p.nh + p.nkv) {
        const int g = hh - p.nh;
        norm_rope_head(src, buf, p.k_norm, p.inv_freq, p.hd, pos, true, p.eps, red, k, ks);
        dst = p.k_cache + ((size_t)g * p.cap + pos % p.cap) * p.hd;
    } else {
        const int g = hh - p.nh - p.nkv;
        norm_rope_head(src, buf, nullptr, nullptr, p.hd, pos, p.v_norm != 0, p.eps, red, k, ks);
        dst = p.v_cache + ((size_t)g * p.cap + pos % p.cap) * p.hd;
    }
    for (int i = threadIdx.x; i < p.hd; i += blockDim.x) dst[i] = buf[i];
}

// ---- Causal attention over the cache ---------------------------------------------------------
// grid (ceil(n / 16), nh), 256 x groups threads. A group of 8 warps walks every groups-th key
// tile of 16 positions (tiles aligned to multiples of 16, a tile to the group of its index's
// residue, so a row's sums never depend on the chunking); warp w of a group owns queries 2w and
// 2w+1 of the block's 16, lane l the dims 4l + 128i .. +3. Each group stages its tiles in its own
// shared memory (128 * hd bytes) by cp.async, all of a tile's copies in flight at once; with two
// groups the last block's walk (the kernel's critical path) is halved, and group 1's running
// state is merged into group 0's at the end.
#define PFA_QB 16
#define PFA_KT 16

struct PfAttnParams {
    const float* q;        // [n][nh*hd]
    const float* k_cache;  // [nkv][cap][hd]
    const float* v_cache;
    uint16_t* out;         // bf16 [n][nh*hd]
    uint16_t* out_lo;      // precise mode: the remainders
    int n, p0, nh, nkv, hd, cap, window;
    float scale, softcap;
    int groups;  // 1 or 2 (blockDim 256 x groups, shared memory 128 * hd * groups bytes)
};

__device__ __forceinline__ float dot4(float4 a, float4 b, float acc) {
    acc = fmaf(a.x, b.x, acc);
    acc = fmaf(a.y, b.y, acc);
    acc = fmaf(a.z, b.z, acc);
    return fmaf(a.w, b.w, acc);
}

// The 256 threads of group `grp` (named barrier 1 + grp).
__device__ __forceinline__ void pfa_group_sync(int grp) {
    asm volatile("bar.sync %0, 256;" ::"r"(1 + grp) : "memory");
}

extern "C" __global__ void __launch_bounds__(512) pf_attention(const PfAttnParams p) {
    extern __shared__ float4 kv_tile[];  // groups x (K [PFA_KT][hd/4] | V [PFA_KT][hd/4])
    const int h = blockIdx.y, t0 = blockIdx.x * PFA_QB;
    const int lane = threadIdx.x & 31, grp = threadIdx.x >> 8, warp = (threadIdx.x >> 5) & 7;
    const int gt = threadIdx.x & 255;  // thread within the group
    const int hd4 = p.hd >> 2, nv = p.hd >> 7;
    const int g = h / (p.nh / p.nkv);
    const float4* K = (const float4*)(p.k_cache + (size_t)g * p.cap * p.hd);
    const float4* V = (const float4*)(p.v_cache + (size_t)g * p.cap * p.hd);
    const int tile4 = PFA_KT * hd4;  // float4s of one K (or V) tile
    float4* Ks = kv_tile + (size_t)grp * 2 * tile4;
    float4* Vs = Ks + tile4;

    const int ta = t0 + 2 * warp;  // this warp's two queries (chunk rows ta, ta + 1)
    const int qpa = p.p0 + ta;
    float4 qv[2][4];
#pragma unroll
    for (int q = 0; q < 2; q++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            qv[q][i] = make_float4(0.f, 0.f, 0.f, 0.f);
            if (i < nv && ta + q < p.n)
                qv[q][i] = ((const float4*)(p.q + ((size_t)(ta + q) * p.nh + h) * p.hd))[lane + 32 * i];
        }

    const int last = min(t0 + PFA_QB, p.n) - 1;
    const int qmin = p.p0 + t0, qmax = p.p0 + last;
    const int kmin = p.window > 0 ? max(0, qmin - p.window + 1) : 0;
    // Per query: running max and sum (the same in every lane), weighted V sums per lane.
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    float4 acc[2][4];
#pragma unroll
    for (int q = 0; q < 2; q++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[q][i] = make_float4(0.f, 0.f, 0.f, 0.f);

    // The group's first tile: the first at or after kmin's whose index has its residue.
    int kt = (kmin / PFA_KT) * PFA_KT;
    kt += ((grp - kt / PFA_KT) % p.groups + p.groups) % p.groups * PFA_KT;
    for (; kt <= qmax; kt += p.groups * PFA_KT) {
        // The tile's K and V rows, every copy in flight at once; rows past the block's last
        // query zero-filled (their scores are masked, and 0 x V must stay 0).
        for (int i = gt; i < tile4; i += 256) {
            const int kp = kt + i / hd4, d4 = i % hd4;
            const bool live = kp <= qmax;
            const size_t o = (size_t)((live ? kp : kt) % p.cap) * hd4 + d4;
            cp_async16_zfill(Ks + i, K + o, live);
            cp_async16_zfill(Vs + i, V + o, live);
        }
        cp_async_commit();
        cp_async_wait<0>();
        pfa_group_sync(grp);
        // Partial q.k of (query q, key j) in s[16q + j]; a transposing butterfly leaves the full
        // sum of entry `lane` in lane `lane` (31 shuffles for all 32 sums).
        float s[32];
#pragma unroll
        for (int j = 0; j < PFA_KT; j++) {
            float d0 = 0.f, d1 = 0.f;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                if (i < nv) {
                    const float4 kk = Ks[j * hd4 + lane + 32 * i];
                    d0 = dot4(qv[0][i], kk, d0);
                    d1 = dot4(qv[1][i], kk, d1);
                }
            }
            s[j] = d0;
            s[16 + j] = d1;
        }
        // (Unroll counts spelled out: without them nvcc left s in local memory.)
#pragma unroll 5
        for (int o = 16; o > 0; o >>= 1) {
            const bool upper = (lane & o) != 0;
#pragma unroll 16
            for (int i = 0; i < o; i++) {
                const float send = upper ? s[i] : s[i + o];
                const float keep = upper ? s[i + o] : s[i];
                s[i] = keep + __shfl_xor_sync(HAYAI_FULL_MASK, send, o);
            }
        }
        const int qi = lane >> 4;
        const int kp = kt + (lane & 15), qp = qpa + qi;
        float sc = s[0] * p.scale;
        if (p.softcap > 0.f) sc = p.softcap * tanhf(sc / p.softcap);
        const bool ok = ta + qi < p.n && kp <= qp && (p.window <= 0 || kp > qp - p.window);
        if (!ok) sc = -INFINITY;
        float tm = sc;
#pragma unroll
        for (int o = 8; o > 0; o >>= 1) tm = fmaxf(tm, __shfl_xor_sync(HAYAI_FULL_MASK, tm, o));
        const float mo = qi ? m[1] : m[0];
        const float mn = fmaxf(mo, tm);
        const float pj = ok ? expf(sc - mn) : 0.f;
        float ps = pj;
#pragma unroll
        for (int o = 8; o > 0; o >>= 1) ps += __shfl_xor_sync(HAYAI_FULL_MASK, ps, o);
        const float corr = mo == -INFINITY ? 0.f : expf(mo - mn);
        float cq[2];
#pragma unroll
        for (int q = 0; q < 2; q++) {
            cq[q] = __shfl_sync(HAYAI_FULL_MASK, corr, 16 * q);
            m[q] = __shfl_sync(HAYAI_FULL_MASK, mn, 16 * q);
            l[q] = l[q] * cq[q] + __shfl_sync(HAYAI_FULL_MASK, ps, 16 * q);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                acc[q][i].x *= cq[q];
                acc[q][i].y *= cq[q];
                acc[q][i].z *= cq[q];
                acc[q][i].w *= cq[q];
            }
        }
#pragma unroll
        for (int j = 0; j < PFA_KT; j++) {
            const float pa = __shfl_sync(HAYAI_FULL_MASK, pj, j);
            const float pb = __shfl_sync(HAYAI_FULL_MASK, pj, 16 + j);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                if (i < nv) {
                    const float4 vv = Vs[j * hd4 + lane + 32 * i];
                    acc[0][i] = make_float4(fmaf(pa, vv.x, acc[0][i].x), fmaf(pa, vv.y, acc[0][i].y),
                                            fmaf(pa, vv.z, acc[0][i].z), fmaf(pa, vv.w, acc[0][i].w));
                    acc[1][i] = make_float4(fmaf(pb, vv.x, acc[1][i].x), fmaf(pb, vv.y, acc[1][i].y),
                                            fmaf(pb, vv.z, acc[1][i].z), fmaf(pb, vv.w, acc[1][i].w));
                }
            }
        }
        pfa_group_sync(grp);  // the tile is consumed
    }
    if (p.groups > 1) {
        // Group 1's state through its own tile area (its walk is over), merged into group 0's
        // in that order: per warp, 2 queries x hd sums, then the two (max, sum) pairs.
        float4* st = kv_tile + (size_t)2 * tile4 + (size_t)warp * 2 * hd4;
        float* ml = (float*)(kv_tile + (size_t)2 * tile4 + (size_t)16 * hd4) + 4 * warp;
        if (grp == 1) {
#pragma unroll
            for (int q = 0; q < 2; q++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    if (i < nv) st[q * hd4 + lane + 32 * i] = acc[q][i];
            if (lane == 0) {
                ml[0] = m[0];
                ml[1] = l[0];
                ml[2] = m[1];
                ml[3] = l[1];
            }
        }
        __syncthreads();
        if (grp == 1) return;
#pragma unroll
        for (int q = 0; q < 2; q++) {
            const float m1 = ml[2 * q], l1 = ml[2 * q + 1];
            const float mn = fmaxf(m[q], m1);
            const float c0 = m[q] == -INFINITY ? 0.f : expf(m[q] - mn);
            const float c1 = m1 == -INFINITY ? 0.f : expf(m1 - mn);
            l[q] = l[q] * c0 + l1 * c1;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                if (i < nv) {
                    const float4 o = st[q * hd4 + lane + 32 * i];
                    acc[q][i] = make_float4(fmaf(o.x, c1, acc[q][i].x * c0), fmaf(o.y, c1, acc[q][i].y * c0),
                                            fmaf(o.z, c1, acc[q][i].z * c0), fmaf(o.w, c1, acc[q][i].w * c0));
                }
            }
        }
    }
#pragma unroll
    for (int q = 0; q < 2; q++) {
        if (ta + q >= p.n) continue;
        const float inv = 1.f / l[q];
        const size_t base = ((size_t)(ta + q) * p.nh + h) * p.hd;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if (i < nv) {
                const size_t d = base + 4 * lane + 128 * i;
                store_operand(p.out, p.out_lo, d, acc[q][i].x * inv);
                store_operand(p.out, p.out_lo, d + 1, acc[q][i].y * inv);
                store_operand(p.out, p.out_lo, d + 2, acc[q][i].z * inv);
                store_operand(p.out, p.out_lo, d + 3, acc[q][i].w * inv);
            }
        }
    }
}

// ---- GEMM on tensor cores ---------------------------------------------------------------------
// C[m][n] (f32) = A[m][k] (bf16, row-major, ld = k) . W[n][k]^T, W bf16 or int4 (the GEMV layout,
// see gemv.cu). Block tile 64 x 128 x 32, 8 warps as 2 x 4, warp tile 32 x 32 (2 x 4 mma tiles).
// Register-staged double buffering: the next tile's global loads are in flight while the
// current one is multiplied. grid (n tiles, m tiles, parts): with parts > 1 block z takes the
// z-th run of K's tiles and stores its part at c + z * m * ldc, for the next kernel to sum.
#define PFG_BM 64
#define PFG_BN 128
#define PFG_BK 32
#define PFG_LDS (PFG_BK + 8)  // padded row (bf16): fragment loads are bank-conflict free

struct PfGemmParams {
    const uint16_t* a;
    const uint16_t* a_lo;    // precise mode: A = a + a_lo, two products per tile
    const void* w;
    const uint16_t* scales;  // int4: bf16 [n][k/128]
    float* c;
    int m, n, k, ldc, int4;
    float softcap;           // > 0: c = softcap * tanh(c / softcap)
};

// Two bf16 of (nibble - 8) * scale for nibbles e and e+1 of w.
__device__ __forceinline__ uint32_t dq_pair(uint32_t w, int e, float s) {
    const float a = (float)((int)((w >> (4 * e)) & 15u) - 8) * s;
    const float b = (float)((int)((w >> (4 * e + 4)) & 15u) - 8) * s;
    return f32_to_bf16_bits(a) | ((uint32_t)f32_to_bf16_bits(b) << 16);
}

// A warp's 32 x (8 NI) output tile in the mma accumulator layout (row0, col0: the lane's first
// row and column), softcapped where asked.
template <int NI>
__device__ __forceinline__ void pf_gemm_store(const PfGemmParams& p, float* c, const float (&acc)[2][NI][4], int row0,
                                              int col0) {
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int ni = 0; ni < NI; ni++)
#pragma unroll
            for (int r = 0; r < 4; r++) {
                const int row = row0 + mi * 16 + (r >> 1) * 8;
                const int col = col0 + ni * 8 + (r & 1);
                if (row < p.m && col < p.n) {
                    float v = acc[mi][ni][r];
                    if (p.softcap > 0.f) v = p.softcap * tanhf(v / p.softcap);
                    c[(size_t)row * p.ldc + col] = v;
                }
            }
}

extern "C" __global__ void __launch_bounds__(256) pf_gemm(const PfGemmParams p) {
    __shared__ __align__(16) uint16_t As[2][PFG_BM * PFG_LDS];
    __shared__ __align__(16) uint16_t Al[2][PFG_BM * PFG_LDS];  // precise mode only
    __shared__ __align__(16) uint16_t Bs[2][PFG_BN * PFG_LDS];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = (warp >> 2) * 32, wn = (warp & 3) * 32;
    const int m0 = blockIdx.y * PFG_BM, n0 = blockIdx.x * PFG_BN;
    const int gq = lane >> 2, cq = lane & 3;

    // Loader roles. A: row tid/4, 8 columns at (tid%4)*8. W bf16: rows tid/4 and tid/4 + 64,
    // same columns. W int4: row tid/2, the 32-bit words of lane chunks 2(tid%2) and 2(tid%2)+1.
    const int ar = tid >> 2, ac = (tid & 3) * 8;
    const bool a_ok = m0 + ar < p.m;
    const size_t a_off = (size_t)(a_ok ? m0 + ar : 0) * p.k + ac;
    const bool split = p.a_lo != nullptr;
    const int br = p.int4 ? (tid >> 1) : (tid >> 2);
    const bool b_ok0 = n0 + br < p.n, b_ok1 = n0 + br + 64 < p.n;
    const int bl = (tid & 1) * 2;
    uint4 ra = make_uint4(0, 0, 0, 0), ra_lo = ra, rb0 = ra, rb1 = ra;
    uint32_t rw0 = 0x88888888u, rw1 = 0x88888888u;  // zero weights when out of range
    float rs = 0.f;

    auto load = [&](int kt) {
        const int k0 = kt * PFG_BK;
        if (a_ok) {
            ra = *(const uint4*)(p.a + a_off + k0);
            if (split) ra_lo = *(const uint4*)(p.a_lo + a_off + k0);
        }
        if (p.int4) {
            if (b_ok0) {
                const int grp = k0 >> 7, u = (k0 >> 5) & 3;
                const uint8_t* base = (const uint8_t*)p.w + (size_t)(n0 + br) * (p.k >> 1) + grp * 64 + u * 4;
                rw0 = __ldg((const uint32_t*)(base + bl * 16));
                rw1 = __ldg((const uint32_t*)(base + (bl + 1) * 16));
                rs = bf16_to_f32(p.scales[(size_t)(n0 + br) * (p.k >> 7) + grp]);
            }
        } else {
            const uint16_t* wb = (const uint16_t*)p.w;
            if (b_ok0) rb0 = __ldg((const uint4*)(wb + (size_t)(n0 + br) * p.k + k0 + ac));
            if (b_ok1) rb1 = __ldg((const uint4*)(wb + (size_t)(n0 + br + 64) * p.k + k0 + ac));
        }
    };
    auto store = [&](int buf) {
        *(uint4*)&As[buf][ar * PFG_LDS + ac] = ra;
        if (split) *(uint4*)&Al[buf][ar * PFG_LDS + ac] = ra_lo;
        if (p.int4) {
            // Nibble e of lane chunk l's word is column 16 (e / 4) + 4 l + e % 4 of this k tile.
            uint16_t* row = &Bs[buf][br * PFG_LDS];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint32_t w = h ? rw1 : rw0;
                const int l = bl + h;
                *(uint2*)(row + 4 * l) = make_uint2(dq_pair(w, 0, rs), dq_pair(w, 2, rs));
                *(uint2*)(row + 16 + 4 * l) = make_uint2(dq_pair(w, 4, rs), dq_pair(w, 6, rs));
            }
        } else {
            *(uint4*)&Bs[buf][br * PFG_LDS + ac] = rb0;
            *(uint4*)&Bs[buf][(br + 64) * PFG_LDS + ac] = rb1;
        }
    };

    float acc[2][4][4] = {};

    // This block's part of K (the host keeps K's tiles a multiple of the parts).
    const int per = p.k / PFG_BK / gridDim.z, kt0 = blockIdx.z * per, kt_end = kt0 + per;
    float* c = p.c + (size_t)blockIdx.z * p.m * p.ldc;
    load(kt0);
    store(0);
    __syncthreads();
    for (int kt = kt0; kt < kt_end; kt++) {
        const int buf = (kt - kt0) & 1;
        if (kt + 1 < kt_end) load(kt + 1);
#pragma unroll
        for (int kk = 0; kk < PFG_BK; kk += 16) {
            uint32_t af[2][4], bfr[4][2];
#pragma unroll
            for (int ni = 0; ni < 4; ni++) {
                const uint16_t* r = &Bs[buf][(wn + ni * 8 + gq) * PFG_LDS + kk + 2 * cq];
                bfr[ni][0] = *(const uint32_t*)r;
                bfr[ni][1] = *(const uint32_t*)(r + 8);
            }
            // A = the bf16 values, plus in precise mode their remainders (same B fragments).
            for (int part = 0; part < (split ? 2 : 1); part++) {
                const uint16_t* tile = part ? Al[buf] : As[buf];
#pragma unroll
                for (int mi = 0; mi < 2; mi++) {
                    const uint16_t* r0 = tile + (wm + mi * 16 + gq) * PFG_LDS + kk + 2 * cq;
                    const uint16_t* r1 = r0 + 8 * PFG_LDS;
                    af[mi][0] = *(const uint32_t*)r0;
                    af[mi][1] = *(const uint32_t*)r1;
                    af[mi][2] = *(const uint32_t*)(r0 + 8);
                    af[mi][3] = *(const uint32_t*)(r1 + 8);
                }
#pragma unroll
                for (int mi = 0; mi < 2; mi++)
#pragma unroll
                    for (int ni = 0; ni < 4; ni++) mma_bf16(acc[mi][ni], af[mi], bfr[ni]);
            }
        }
        if (kt + 1 < kt_end) store(buf ^ 1);
        __syncthreads();
    }

    pf_gemm_store<4>(p, c, acc, m0 + wm + gq, n0 + wn + 2 * cq);
}

// ---- int4 weights to bf16 rows ------------------------------------------------------------------
// The int4 GEMV layout to row-major bf16 [n][k]: the values pf_gemm's int4 tiles hold in shared
// memory (dq_pair), so pf_gemm_w multiplying them gives pf_gemm's int4 outputs bit for bit. A
// prompt's int4 GEMM then dequantizes each weight once instead of once a 64-row tile.
struct PfDequantParams {
    const void* w;
    const uint16_t* scales;  // bf16 [n][k/128]
    uint16_t* out;           // bf16 [n][k]
    int n, k;
};

extern "C" __global__ void __launch_bounds__(256) pf_dequant(const PfDequantParams p) {
    // One 32-bit word a thread: 16 words a 128-column group, word 4 l + u of a group holds lane
    // chunk l's nibbles of the group's 32-column tile u (pf_gemm's loads).
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int wpr = p.k >> 3;
    if (i >= (size_t)p.n * wpr) return;
    const int n = (int)(i / wpr), wi = (int)(i % wpr);
    const int grp = wi >> 4, l = (wi >> 2) & 3, u = wi & 3;
    const uint32_t w = __ldg((const uint32_t*)p.w + i);
    const float s = bf16_to_f32(p.scales[(size_t)n * (p.k >> 7) + grp]);
    // Nibble e is column 16 (e / 4) + 4 l + e % 4 of tile u.
    uint16_t* row = p.out + (size_t)n * p.k + grp * 128 + u * 32;
    *(uint2*)(row + 4 * l) = make_uint2(dq_pair(w, 0, s), dq_pair(w, 2, s));
    *(uint2*)(row + 16 + 4 * l) = make_uint2(dq_pair(w, 4, s), dq_pair(w, 6, s));
}

// ---- The wide GEMM: block tile 64 x 256 x 32, warp tile 32 x 64 ------------------------------
// The same products as pf_gemm in the same order for every output, so the same outputs bit for
// bit; fewer shared-memory wavefronts per mma (a warp's 32 x 64 tile reads 1.5 KB of fragments
// for 16 mma per 16 of K, pf_gemm's 32 x 32 tile 1 KB for 8), its fragments by ldmatrix (one
// instruction for four 8 x 8 matrices), A and bf16 W copied by cp.async (not staged in
// registers). int4 W is staged in registers: it is dequantized on its way into shared memory.
// By default an int4 GEMM reaches this kernel as pf_dequant's bf16 rows instead (E4B int4, 272
// tokens: 28.3 ms against 39.6 with this path); the path stays for HAYAI_PREFILL_GEMM_WIDE=1
// (without it the bf16 form ran 27.3 against 27.0 ms, the same call: its SASS is the measured one).
// Dynamic shared memory: A [2][64 x 40], W [2][256 x 40], then precise mode's A remainders.
#define PFW_BN 256

__device__ __forceinline__ void ldmatrix_x4(uint32_t* r, const uint16_t* smem) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s)
                 : "memory");
}

extern "C" __global__ void __launch_bounds__(256, 2) pf_gemm_w(const PfGemmParams p) {
    extern __shared__ __align__(16) uint16_t pfw_smem[];
    constexpr int A_T = PFG_BM * PFG_LDS, B_T = PFW_BN * PFG_LDS;
    uint16_t* const As = pfw_smem;
    uint16_t* const Bs = As + 2 * A_T;
    uint16_t* const Al = Bs + 2 * B_T;  // precise mode only (the host sizes the area)
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = (warp >> 2) * 32, wn = (warp & 3) * 64;
    const int m0 = blockIdx.y * PFG_BM, n0 = blockIdx.x * PFW_BN;
    const int gq = lane >> 2, cq = lane & 3;
    const bool split = p.a_lo != nullptr;

    // Copy roles. A: row tid/4, 8 columns at (tid%4)*8 (rows past m zero-filled). W bf16: rows
    // tid/4 + 64 i, same columns. W int4: row tid, its four lane chunks' words.
    const int ar = tid >> 2, ac = (tid & 3) * 8;
    const bool a_ok = m0 + ar < p.m;
    const size_t a_off = (size_t)(a_ok ? m0 + ar : 0) * p.k + ac;
    const uint16_t* wb = (const uint16_t*)p.w;
    const bool w4_ok = n0 + tid < p.n;
    uint32_t rw[4] = {0x88888888u, 0x88888888u, 0x88888888u, 0x88888888u};  // zero weights
    float rs = 0.f;

    auto issue = [&](int kt, int buf) {
        const int k0 = kt * PFG_BK;
        cp_async16_zfill(As + buf * A_T + ar * PFG_LDS + ac, p.a + a_off + k0, a_ok);
        if (split) cp_async16_zfill(Al + buf * A_T + ar * PFG_LDS + ac, p.a_lo + a_off + k0, a_ok);
        if (p.int4) {
            if (w4_ok) {
                const int grp = k0 >> 7, u = (k0 >> 5) & 3;
                const uint8_t* base = (const uint8_t*)p.w + (size_t)(n0 + tid) * (p.k >> 1) + grp * 64 + u * 4;
#pragma unroll
                for (int l = 0; l < 4; l++) rw[l] = __ldg((const uint32_t*)(base + l * 16));
                rs = bf16_to_f32(p.scales[(size_t)(n0 + tid) * (p.k >> 7) + grp]);
            }
        } else {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int r = ar + 64 * i;
                const bool ok = n0 + r < p.n;
                cp_async16_zfill(Bs + buf * B_T + r * PFG_LDS + ac, wb + (size_t)(ok ? n0 + r : 0) * p.k + k0 + ac, ok);
            }
        }
        cp_async_commit();
    };
    // Nibble e of lane chunk l's word is column 16 (e / 4) + 4 l + e % 4 of this k tile.
    auto store_w4 = [&](int buf) {
        uint16_t* row = Bs + buf * B_T + tid * PFG_LDS;
#pragma unroll
        for (int l = 0; l < 4; l++) {
            *(uint2*)(row + 4 * l) = make_uint2(dq_pair(rw[l], 0, rs), dq_pair(rw[l], 2, rs));
            *(uint2*)(row + 16 + 4 * l) = make_uint2(dq_pair(rw[l], 4, rs), dq_pair(rw[l], 6, rs));
        }
    };

    float acc[2][8][4] = {};

    // Fragment addresses (ldmatrix: lanes 8 j .. 8 j + 7 give matrix j's rows). A: matrices
    // (rows 0-7, k 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15), the mma's a0..a3. W: (n 0-7,
    // k 0-7), (0-7, 8-15), (8-15, 0-7), (8-15, 8-15): b0, b1 of two n tiles.
    const int a_frag = (wm + (lane & 15)) * PFG_LDS + ((lane >> 4) << 3);
    const int b_frag = (wn + ((lane >> 4) << 3) + (lane & 7)) * PFG_LDS + (((lane >> 3) & 1) << 3);
    auto multiply = [&](int buf) {
#pragma unroll
        for (int kk = 0; kk < PFG_BK; kk += 16) {
            uint32_t bfr[8][2];
#pragma unroll
            for (int np = 0; np < 4; np++) {
                uint32_t r[4];
                ldmatrix_x4(r, Bs + buf * B_T + b_frag + np * 16 * PFG_LDS + kk);
                bfr[2 * np][0] = r[0];
                bfr[2 * np][1] = r[1];
                bfr[2 * np + 1][0] = r[2];
                bfr[2 * np + 1][1] = r[3];
            }
            // A = the bf16 values, plus in precise mode their remainders (same B fragments).
            for (int part = 0; part < (split ? 2 : 1); part++) {
                const uint16_t* tile = (part ? Al : As) + buf * A_T + a_frag + kk;
                uint32_t af[2][4];
#pragma unroll
                for (int mi = 0; mi < 2; mi++) ldmatrix_x4(af[mi], tile + mi * 16 * PFG_LDS);
#pragma unroll
                for (int mi = 0; mi < 2; mi++)
#pragma unroll
                    for (int ni = 0; ni < 8; ni++) mma_bf16(acc[mi][ni], af[mi], bfr[ni]);
            }
        }
    };

    // This block's part of K (the host keeps K's tiles a multiple of the parts).
    const int per = p.k / PFG_BK / gridDim.z, kt0 = blockIdx.z * per, kt_end = kt0 + per;
    float* c = p.c + (size_t)blockIdx.z * p.m * p.ldc;
    issue(kt0, 0);
    if (p.int4) store_w4(0);
    cp_async_wait<0>();
    __syncthreads();
    for (int kt = kt0; kt < kt_end; kt++) {
        const int buf = (kt - kt0) & 1;
        const bool more = kt + 1 < kt_end;
        // The other buffer was last read before the previous iteration's barrier.
        if (more) issue(kt + 1, buf ^ 1);
        multiply(buf);
        if (more) {
            if (p.int4) store_w4(buf ^ 1);
            cp_async_wait<0>();
        }
        __syncthreads();
    }

    pf_gemm_store<8>(p, c, acc, m0 + wm + gq, n0 + wn + 2 * cq);
}
