// int4 GEMV on tensor cores (`gemv_mma`, CudaOptions::tensor_core_gemv): y = W x with W int4 in
// the GEMV layout (gemv.cu) and x entering as a pair of bf16 (hi = bf16(x), lo = bf16(x - hi):
// 16 significant bits, relative error <= 2^-17; the CPU twin is MatmulInputs::Bf16Pair). Why:
// the f32 GEMV spends ~3.4 instructions per int4 weight (LOP3, FADD, FFMA) plus a shared-memory
// read of x per weight, and at batch 1 that issue rate, not DRAM, bounds the large matrices. Here
// a pair of nibbles becomes an exact bf16 pair with one LOP3 (plus a shift for three pairs in
// four) and one bf16x2 subtract, and one mma.sync multiplies 8 weights per lane against both
// halves of x at once (columns 0 and 1 of the B operand; the other six are zero).
//
// Mapping: a warp owns 16 rows (r0 + g and r0 + g + 8 for lane 4g + c) and, per 128-column
// group, lane c's 16-byte chunk of each of its two rows, as in the f32 kernel. The 32 nibbles of
// a chunk are the 32 k positions lane c contributes to the group's 8 mma steps: step s takes
// word u = s / 2 of the chunk, nibble pairs (k0, k0 + 4) and (k0 + 1, k0 + 5) with
// k0 = 2 (s % 2) — one LOP3 each yields such a pair as bf16x2 — and the B fragment of lane
// (g < 2, c) holds x (g = 0: hi, g = 1: lo) at exactly those columns. The dot product is a sum
// over k, so any bijection of k positions works as long as A and B agree; gemv_mma_fragments
// builds B in that order once per block. The group sum (exact products, f32 accumulation) is
// scaled by the row's group scale as in the f32 kernel. quant.rs checks the mapping on the CPU.
#include "common.cuh"

#define GMMA_ROWS 128  // 8 warps x 16 rows

// Column (within its group) of nibble k of word u of lane chunk c (gemv.cu's int4 layout).
__device__ __forceinline__ int gmma_col(int u, int k, int c) {
    return 32 * u + 16 * (k >> 2) + 4 * c + (k & 3);
}

// B fragments for groups [g0, g1): fr[((g - g0) * 8 + s) * 8 + 2 c + n] = (b0, b1) of lane
// (g = n, c) at step s, n = 0 for hi, 1 for lo.
__device__ void gemv_mma_fragments(const float* xs, uint2* fr, int g0, int g1) {
    for (int i = threadIdx.x; i < (g1 - g0) * 32; i += blockDim.x) {
        const int gi = i >> 5, s = (i >> 2) & 7, c = i & 3;
        const int u = s >> 1, k0 = 2 * (s & 1);
        const float* x = xs + (g0 + gi) * 128;
        const float v[4] = {x[gmma_col(u, k0, c)], x[gmma_col(u, k0 + 4, c)],
                            x[gmma_col(u, k0 + 1, c)], x[gmma_col(u, k0 + 5, c)]};
        uint32_t hi[4], lo[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const __nv_bfloat16 h = __float2bfloat16_rn(v[j]);
            hi[j] = __bfloat16_as_ushort(h);
            lo[j] = f32_to_bf16_bits(v[j] - __bfloat162float(h));
        }
        uint2* f = fr + (gi * 8 + s) * 8 + 2 * c;
        f[0] = make_uint2(hi[0] | (hi[1] << 16), hi[2] | (hi[3] << 16));
        f[1] = make_uint2(lo[0] | (lo[1] << 16), lo[2] | (lo[3] << 16));
    }
}

// The nibbles at bits 0-3 and 16-19 of `w` (nibbles k and k + 4 of a word shifted right by 4k)
// as a bf16x2 of q = nibble - 8, the first in the low half: (w & 0x000F000F) | 0x43004300 is
// bf16 (128 + nibble) twice, exact, and subtracting 136 leaves q, exact.
__device__ __forceinline__ uint32_t gmma_pair(uint32_t w, uint32_t magic) {
    uint32_t d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(w), "n"(0x000F000Fu), "r"(magic));
    const __nv_bfloat162 q = __hsub2(*(const __nv_bfloat162*)&d, __floats2bfloat162_rn(136.f, 136.f));
    return *(const uint32_t*)&q;
}

// One group's products of a warp's 16 rows: (row g, row g + 8) sums of lane (g, c = 0), hi and
// lo columns added; `ca`/`cb` are this lane's 16 bytes of rows g and g + 8, `f` the group's B
// fragments for this lane.
__device__ __forceinline__ float2 gemv_mma_group(const uint4 ca, const uint4 cb, const uint2* f,
                                                 int g, uint32_t magic) {
    float d[4] = {0.f, 0.f, 0.f, 0.f};
    const uint32_t wa4[4] = {ca.x, ca.y, ca.z, ca.w};
    const uint32_t wb4[4] = {cb.x, cb.y, cb.z, cb.w};
#pragma unroll
    for (int s = 0; s < 8; s++) {
        const int u = s >> 1, sh = 8 * (s & 1);  // 4 k0
        const uint32_t a[4] = {gmma_pair(wa4[u] >> sh, magic), gmma_pair(wb4[u] >> sh, magic),
                               gmma_pair(wa4[u] >> (sh + 4), magic),
                               gmma_pair(wb4[u] >> (sh + 4), magic)};
        uint2 bv = make_uint2(0u, 0u);
        if (g < 2) bv = f[s * 8];
        const uint32_t b[2] = {bv.x, bv.y};
        mma_bf16(d, a, b);
    }
    // Columns 0 (hi) and 1 (lo) live in lanes c = 0.
    return make_float2(d[0] + d[1], d[2] + d[3]);
}

// W4A8 on tensor cores (`gemv_mma_a8`, CudaOptions::int8_activations with tensor cores): x
// quantized to int8 per 128-column group exactly as `gemv_a8` and the CPU twin
// (MatmulInputs::Int8 { group: 128 }) do it, and the products taken by the integer tensor cores
// (m16n8k32, u8 nibbles x s8 inputs, int32 sums: exact). Per weight word one LOP3 (the low
// nibbles, as bytes) and one shift + LOP3 (the high ones) give two A registers, against 11
// instructions for four on the bf16-pair path; the nibbles' +8 comes off exactly through the
// group's integer x sum. Step u of a group takes word u of the lane's chunk of rows g and g + 8:
// a0 / a1 their low nibbles (k slots 4c..4c+3), a2 / a3 their high nibbles (slots 16+4c..), so
// the B fragment of lane (0, c) is b0 = the int8 x at the columns of nibbles 0, 2, 4, 6 of word u
// of chunk c and b1 at those of nibbles 1, 3, 5, 7. Measured first in the streamed-step
// prototype (crates/hayai-cuda/proto/stream_step.cu: lm_head 131 -> 94 µs). mma_u8s8: common.cuh.

// The int8 B fragments of groups [g0, g1) from x (f32, shared): fr8[(g - g0) * 16 + 4 u + c],
// then per group its integer x sum (int, `per` of them) and scale max|x| / 127 (float). One warp
// per group; `q8` is 128 bytes of scratch per warp.
__device__ void gemv_mma_a8_fragments(const float* xs, uint2* fr8, int per, int g0, int g1, int8_t* q8) {
    int* xsum = (int*)(fr8 + per * 16);
    float* tq = (float*)(xsum + per);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int8_t* q = q8 + warp * 128;
    for (int g = g0 + warp; g < g1; g += blockDim.x >> 5) {
        // gemv_a8's quantization (gemv.cu): lane owns columns 4 lane .. + 3.
        int qv[4];
        const float m = act8_quantize4(((const float4*)(xs + g * 128))[lane], qv);
        int qsum = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            qsum += qv[i];
            q[4 * lane + i] = (int8_t)qv[i];
        }
        qsum = __reduce_add_sync(HAYAI_FULL_MASK, qsum);
        __syncwarp();
        if (lane < 16) {
            const int u = lane >> 2, c = lane & 3;
            // Nibble k of word u of chunk c: column gmma_col(u, k, c).
            uint32_t b0 = 0, b1 = 0;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                b0 |= (uint32_t)(uint8_t)q[gmma_col(u, 2 * j, c)] << (8 * j);
                b1 |= (uint32_t)(uint8_t)q[gmma_col(u, 2 * j + 1, c)] << (8 * j);
            }
            fr8[(g - g0) * 16 + lane] = make_uint2(b0, b1);
        }
        if (lane == 0) {
            xsum[g - g0] = qsum;
            tq[g - g0] = m / 127.f;
        }
        __syncwarp();
    }
}

// One group of a warp's 16 rows on the integer tensor cores: (row g, row g + 8) integer dot
// products with the int8 x (lanes c = 0), nibble offset not yet removed.
__device__ __forceinline__ int2 gemv_mma_group_a8(const uint4 ca, const uint4 cb, const uint2* f, int g) {
    int d[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
    const uint32_t wa4[4] = {ca.x, ca.y, ca.z, ca.w};
    const uint32_t wb4[4] = {cb.x, cb.y, cb.z, cb.w};
#pragma unroll
    for (int u = 0; u < 4; u++) {
        const uint32_t a[4] = {wa4[u] & 0x0F0F0F0Fu, wb4[u] & 0x0F0F0F0Fu, (wa4[u] >> 4) & 0x0F0F0F0Fu,
                               (wb4[u] >> 4) & 0x0F0F0F0Fu};
        uint2 bv = make_uint2(0u, 0u);
        if (g == 0) bv = f[u * 4];
        const uint32_t b[2] = {bv.x, bv.y};
        mma_u8s8(d[u & 1], a, b);
    }
    return make_int2(d[0][0] + d[1][0], d[0][2] + d[1][2]);
}

// Rows ra, rb's sums (lanes c = 0) to `out`: GeGLU'd when unsplit, else as split partials that
// the last block of the row tile (`tile_rows` rows) adds up.
__device__ __forceinline__ void gemv_mma_epilogue(const GemvParams& p, float acc_a, float acc_b,
                                                  int ra, int rb, int g, int c, int* last,
                                                  int tile_rows) {
    const bool va = ra < p.rows, vb = rb < p.rows;
    if (p.glu && p.splits == 1) {
        // Interleaved (gate, up) rows: gate 2i in lane 4g (g even), up 2i + 1 in lane 4g + 4.
        const float up_a = __shfl_down_sync(HAYAI_FULL_MASK, acc_a, 4);
        const float up_b = __shfl_down_sync(HAYAI_FULL_MASK, acc_b, 4);
        if (c == 0 && (g & 1) == 0) {
            if (va) p.out[ra >> 1] = gelu_tanh(acc_a) * up_a;
            if (vb) p.out[rb >> 1] = gelu_tanh(acc_b) * up_b;
        }
        return;
    }
    const int s = blockIdx.y;
    if (c == 0) {
        if (va) p.out[(size_t)s * p.rows + ra] = acc_a;
        if (vb) p.out[(size_t)s * p.rows + rb] = acc_b;
    }
    if (p.splits == 1) return;
    // Split-K: the last block of this row tile adds the partials in split order.
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) *last = atomicAdd(p.counters + blockIdx.x, 1) == p.splits - 1;
    __syncthreads();
    if (!*last) return;
    __threadfence();
    gemv_reduce_splits(p, blockIdx.x * tile_rows, tile_rows);
    if (threadIdx.x == 0) p.counters[blockIdx.x] = 0;
}

// What one lane of a gemv_mma block works on: rows ra = r0 + g and rb = ra + 8 of its warp's
// 16 (invalid rows read row 0 and are not stored), this lane's 16-byte chunk c of each row per
// group, and the block's K split: groups [u0, u1) of `units`. With `kw` > 1 warps sharing a
// 16-row tile (gemv_mma_kw), the block holds 128 / kw rows and warp slice ks takes groups
// u0 + ks, u0 + ks + kw, ...
struct GmmaLane {
    int g, c, ra, rb, units, per, u0, u1, ks;
    bool va, vb;
    const uint4* wa;
    const uint4* wb;
    __device__ __forceinline__ GmmaLane(const GemvParams& p, int kw) {
        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
        g = lane >> 2;
        c = lane & 3;
        ks = warp % kw;
        ra = blockIdx.x * (GMMA_ROWS / kw) + (warp / kw) * 16 + g;
        rb = ra + 8;
        va = ra < p.rows;
        vb = rb < p.rows;
        units = p.cols >> 7;
        per = (units + p.splits - 1) / p.splits;
        u0 = blockIdx.y * per;
        u1 = min(units, u0 + per);
        const size_t rbytes = (size_t)(p.cols >> 1);
        wa = (const uint4*)((const uint8_t*)p.w + (size_t)(va ? ra : 0) * rbytes) + c;
        wb = (const uint4*)((const uint8_t*)p.w + (size_t)(vb ? rb : 0) * rbytes) + c;
    }
};

// GMMA_U: groups in flight per lane (two 16-byte loads each); the order of additions is the
// same for every U, so results are too. KW: the block's warps share 16-row tiles along K
// (`p.kwarps` per tile; gemv_mma_kw), their sums added in slice order through shared memory.
template <int GMMA_U, bool KW, bool A8 = false>
__device__ __forceinline__ void gemv_mma_tiled(const GemvParams& p, float* xs) {
    __shared__ float red[32];
    __shared__ int last;
    const int kw = KW ? p.kwarps : 1;
    const GmmaLane L(p, kw);
    const int g = L.g, c = L.c, units = L.units, u0 = L.u0, u1 = L.u1, ks = L.ks;
    int ra = L.ra, rb = L.rb;
    const bool va = L.va, vb = L.vb;
    const uint4* wa = L.wa;
    const uint4* wb = L.wb;
    const uint16_t* sa = p.scales + (size_t)(va ? ra : 0) * units;
    const uint16_t* sb = p.scales + (size_t)(vb ? rb : 0) * units;

    // The first batch of weights before the prologue and the wait (constant data).
    uint4 na[GMMA_U], nb[GMMA_U];
    uint32_t nsa[GMMA_U], nsb[GMMA_U];
    auto load = [&](int g0) {
#pragma unroll
        for (int k = 0; k < GMMA_U; k++) {
            const int gi = g0 + k * kw;
            if (gi < u1) {
                na[k] = ld_stream(wa + (size_t)gi * 4);
                nb[k] = ld_stream(wb + (size_t)gi * 4);
                nsa[k] = sa[gi];
                nsb[k] = sb[gi];
            }
        }
    };
    load(u0 + ks);
    l2_prefetch(p.pf, blockIdx.y * gridDim.x + blockIdx.x, gridDim.x * gridDim.y);
    const bool has_cst = p.res_in || p.norm_w;
    float* cst = has_cst ? xs + gemv_cst_offset(p.cols, false) : nullptr;
    if (cst) gemv_constants_async(p, cst);
    uint2* fr = (uint2*)(xs + gemv_cst_offset(p.cols, false) + (has_cst ? 3 * p.cols : 0));

    pdl_wait();
    pdl_launch_dependents();
    gemv_prologue(p, xs, red, false, nullptr, u0 * 32, u1 * 32, cst);
    if constexpr (A8) {
        __shared__ int8_t q8[GEMV_THREADS / 32 * 128];
        gemv_mma_a8_fragments(xs, fr, L.per, u0, u1, q8);
    } else {
        gemv_mma_fragments(xs, fr, u0, u1);
    }
    __syncthreads();

    const uint32_t magic = 0x43004300u;
    float acc_a = 0.f, acc_b = 0.f;
    for (int g0 = u0 + ks; g0 < u1; g0 += GMMA_U * kw) {
        uint4 ca[GMMA_U], cb[GMMA_U];
        uint32_t csa[GMMA_U], csb[GMMA_U];
#pragma unroll
        for (int k = 0; k < GMMA_U; k++) {
            ca[k] = na[k];
            cb[k] = nb[k];
            csa[k] = nsa[k];
            csb[k] = nsb[k];
        }
        load(g0 + GMMA_U * kw);
#pragma unroll
        for (int k = 0; k < GMMA_U; k++) {
            const int gi = g0 + k * kw;
            if (gi >= u1) break;
            if constexpr (A8) {
                // As gemv_a8: (integer dot - 8 x sum) times (weight scale * x scale).
                const int* xsum = (const int*)(fr + L.per * 16);
                const float* tq = (const float*)(xsum + L.per);
                const int2 d = gemv_mma_group_a8(ca[k], cb[k], fr + (gi - u0) * 16 + c, g);
                const int off = 8 * xsum[gi - u0];
                const float t = tq[gi - u0];
                acc_a = fmaf((float)(d.x - off), __uint_as_float(csa[k] << 16) * t, acc_a);
                acc_b = fmaf((float)(d.y - off), __uint_as_float(csb[k] << 16) * t, acc_b);
            } else {
                const float2 d = gemv_mma_group(ca[k], cb[k], fr + (gi - u0) * 64 + 2 * c + g, g, magic);
                acc_a = fmaf(d.x, __uint_as_float(csa[k] << 16), acc_a);
                acc_b = fmaf(d.y, __uint_as_float(csb[k] << 16), acc_b);
            }
        }
    }
    if constexpr (KW) {
        // Slice 0 of each tile adds the others' sums in slice order; the other warps store
        // nothing (their rows marked past the end) but still take part in the epilogue's
        // block-wide steps.
        __shared__ float part[8][16];
        const int warp = threadIdx.x >> 5;
        if (c == 0) {
            part[warp][g] = acc_a;
            part[warp][g + 8] = acc_b;
        }
        __syncthreads();
        if (ks == 0) {
            for (int j = 1; j < kw; j++) {
                acc_a += part[warp + j][g];
                acc_b += part[warp + j][g + 8];
            }
        } else {
            ra = rb = p.rows;
        }
    }
    gemv_mma_epilogue(p, acc_a, acc_b, ra, rb, g, c, &last, GMMA_ROWS / kw);
}

// Dynamic shared memory 128-byte aligned. Every kernel of the module shares the placement (the
// strictest alignment any `extern __shared__` declares applies to all: stream_step.cu's also asks
// for 128), so this is module-wide. Measured on the H200 (E4B int4, A/B/A in one call, twice):
// 404.6-405.4 -> 433.9-434.4 tok/s when these kernels' dynamic shared memory moved from offset
// 0x90 to 0x100, their SASS otherwise identical; why the 16-byte-aligned start cost that much is
// not established (the bf16 `gemv` measured the other way: kernels/gemv.cu GEMV_XS_OFFSET).
extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_mma(const GemvParams p) {
    extern __shared__ __align__(128) float xs_mma[];
    gemv_mma_tiled<2, false>(p, xs_mma);
}

// Four groups in flight per lane (more bytes in flight per warp, more registers).
extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_mma_u4(const GemvParams p) {
    extern __shared__ __align__(128) float xs_mma[];
    gemv_mma_tiled<4, false>(p, xs_mma);
}

// 16-row tiles shared by p.kwarps warps along K (CudaOptions::tensor_core_kwarps): more, smaller
// blocks whose K is summed inside the block, so a matrix with few rows fills the GPU without
// split-K's partial stores, counter and second pass. Same products; the slices' sums are added
// in another order than one warp's (tolerance, not bit identity).
extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_mma_kw(const GemvParams p) {
    extern __shared__ __align__(128) float xs_mma[];
    gemv_mma_tiled<2, true>(p, xs_mma);
}

extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_mma_kw_u4(const GemvParams p) {
    extern __shared__ __align__(128) float xs_mma[];
    gemv_mma_tiled<4, true>(p, xs_mma);
}

// W4A8 on tensor cores (see gemv_mma_a8_fragments): the gemv_mma and gemv_mma_kw shapes.
extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_mma_a8(const GemvParams p) {
    extern __shared__ __align__(128) float xs_mma[];
    gemv_mma_tiled<2, false, true>(p, xs_mma);
}

extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_mma_kw_a8(const GemvParams p) {
    extern __shared__ __align__(128) float xs_mma[];
    gemv_mma_tiled<2, true, true>(p, xs_mma);
}

// The same products with the weights streamed through a per-thread ring of GMMA_RING stages in
// shared memory (cp.async, GMMA_RING_U groups per stage) instead of registers: registers cap
// the bytes a register pipeline keeps in flight near what DRAM latency needs at full bandwidth
// (~50 KB per SM), shared memory does not (2 blocks per SM x 48 KB here). Every stage is
// requested before the wait for the previous kernel; each thread reads back only what it copied
// itself, so the ring needs no barrier. Group scales go to shared memory before the wait too.
// Shared memory after gemv_mma's: [128 rows][per] scales, then the ring
// [GMMA_RING][GMMA_RING_U][2 rows][256 threads] x 16 bytes (runner/shapes.rs sizes the same).
#define GMMA_RING 3
#define GMMA_RING_U 2
extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_mma_ring(const GemvParams p) {
    constexpr int S = GMMA_RING, U = GMMA_RING_U;
    extern __shared__ float xs[];
    __shared__ float red[32];
    __shared__ int last;
    const GmmaLane L(p, 1);
    const int g = L.g, c = L.c, ra = L.ra, rb = L.rb, units = L.units, per = L.per, u0 = L.u0,
              u1 = L.u1;
    const uint4* wa = L.wa;
    const uint4* wb = L.wb;
    const int warp = threadIdx.x >> 5, rbase = blockIdx.x * GMMA_ROWS;

    const bool has_cst = p.res_in || p.norm_w;
    float* cst = has_cst ? xs + gemv_cst_offset(p.cols, false) : nullptr;
    uint2* fr = (uint2*)(xs + gemv_cst_offset(p.cols, false) + (has_cst ? 3 * p.cols : 0));
    uint16_t* ssc = (uint16_t*)(fr + per * 64);
    uint4* ring = (uint4*)(ssc + GMMA_ROWS * per);
    // The constants' copy group first: the prologue waits for it with the S ring stages pending.
    if (cst) gemv_constants_async(p, cst);
    auto issue = [&](int st, int gb) {
#pragma unroll
        for (int k = 0; k < U; k++) {
            if (gb + k < u1) {
                uint4* d = ring + (st * U + k) * 2 * GEMV_THREADS + threadIdx.x;
                cp_async16(d, wa + (size_t)(gb + k) * 4);
                cp_async16(d + GEMV_THREADS, wb + (size_t)(gb + k) * 4);
            }
        }
        cp_async_commit();
    };
#pragma unroll
    for (int st = 0; st < S; st++) issue(st, u0 + st * U);
    for (int i = threadIdx.x; i < GMMA_ROWS * per; i += GEMV_THREADS) {
        const int r = rbase + i / per, gi = u0 + i % per;
        ssc[i] = r < p.rows && gi < u1 ? p.scales[(size_t)r * units + gi] : (uint16_t)0;
    }
    l2_prefetch(p.pf, blockIdx.y * gridDim.x + blockIdx.x, gridDim.x * gridDim.y);

    pdl_wait();
    pdl_launch_dependents();
    if (cst) {
        gemv_prologue<false, S>(p, xs, red, false, nullptr, u0 * 32, u1 * 32, cst);
    } else {
        gemv_prologue(p, xs, red, false, nullptr, u0 * 32, u1 * 32, nullptr);
    }
    gemv_mma_fragments(xs, fr, u0, u1);
    __syncthreads();  // also publishes the scales

    const uint32_t magic = 0x43004300u;
    const uint16_t* sca = ssc + (warp * 16 + g) * per - u0;
    const uint16_t* scb = sca + 8 * per;
    float acc_a = 0.f, acc_b = 0.f;
    int st = 0;
    for (int g0 = u0; g0 < u1; g0 += U) {
        cp_async_wait<S - 1>();  // this thread's copies of stage `st` have landed
        uint4 ca[U], cb[U];
#pragma unroll
        for (int k = 0; k < U; k++) {
            const uint4* d = ring + (st * U + k) * 2 * GEMV_THREADS + threadIdx.x;
            ca[k] = d[0];
            cb[k] = d[GEMV_THREADS];
        }
#pragma unroll
        for (int k = 0; k < U; k++) {
            if (g0 + k >= u1) break;
            const float2 d = gemv_mma_group(ca[k], cb[k], fr + (g0 + k - u0) * 64 + 2 * c + g, g, magic);
            acc_a = fmaf(d.x, __uint_as_float((uint32_t)sca[g0 + k] << 16), acc_a);
            acc_b = fmaf(d.y, __uint_as_float((uint32_t)scb[g0 + k] << 16), acc_b);
        }
        // The slot just read (its values are consumed above) takes the stage S ahead.
        issue(st, g0 + S * U);
        st = st + 1 == S ? 0 : st + 1;
    }
    cp_async_wait<0>();
    gemv_mma_epilogue(p, acc_a, acc_b, ra, rb, g, c, &last, GMMA_ROWS);
}
