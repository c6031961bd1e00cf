// Matrix-vector products y = W x for batch-1 decode: bf16 or int4 (group 128, bf16 scales)
// weights, f32 activations. One warp computes 8 rows with 4 lanes per row, each lane streaming
// 16-byte chunks; x sits in shared memory. A configurable prologue builds x (sum of the
// producer's split-K partials, GeGLU-style gate, residual add with RMSNorm, input RMSNorm), so
// the norms and residual adds of a layer need no kernels of their own.
#include "common.cuh"

struct GemvParams {
    const void* w;           // bf16 [rows][cols] or packed int4 (see pack layout below)
    const uint16_t* scales;  // int4: bf16 [rows][cols/128]
    float* out;              // [splits][rows] partial sums, or [rows/2] when glu
    const float* in;         // [in_splits][in_ld] input partials (summed in order)
    const float* act_mult;   // if set: x = gelu(x) * act_mult
    const float* res_in;     // if set: x = (res_in + rmsnorm(x) * res_w) * res_scalar
    float* res_out;          // block (0,0) stores that new residual here
    const float* res_w;      // weights of the residual-branch norm (null: no norm, plain add)
    const float* norm_w;     // if set: x = rmsnorm(x) * norm_w (input norm)
    const int* gather_tok;   // if set: x = bf16 table row `*gather_tok` * gather_scale
    const uint16_t* gather_table;
    float* out_final;        // splits > 1: the last block of a row tile sums the partials here
    int* counters;           // splits > 1: one zeroed counter per row tile (reset after use)
    int rows, cols, splits, glu;
    int in_splits, in_ld;
    float res_scalar, eps, gather_scale;
    int int4;
    int in_glu;              // `in` holds interleaved (gate, up) partials: x = gelu(gate) * up
    int kwarps;              // gemv_mma_kw: warps sharing a 16-row tile along K (1, 2, 4 or 8)
    L2Prefetch pf;           // a later kernel's weights to pull into L2 (see common.cuh)
};
static_assert(sizeof(GemvParams) == 184, "GemvParams is mirrored by the host (runner/launch.rs)");

// A group's int8 quantization (MatmulInputs::Int8 { group: 128 }) for a warp that holds it, this
// lane's 4 columns in `v`: q = round(x * 127 / max|x|), clamped to [-127, 127]. Returns max|x|.
__device__ __forceinline__ float act8_quantize4(const float4 v, int q[4]) {
    const float m = warp_max(fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
    const float inv = m > 0.f ? 127.f / m : 0.f;
    const float vals[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) q[i] = (int)fminf(fmaxf(roundf(vals[i] * inv), -127.f), 127.f);
    return m;
}

// int8 activations for int4 weights (`gemv_a8`): x quantized per 128-column group, scale
// t = max|x| / 127, q = round(x * (127 / max|x|)) — the CPU reference's
// MatmulInputs::Int8 { group: 128 } — and multiplied with DP4A: integer sums, exact, then one
// float multiply by (weight scale * t) per group and lane. Shared memory after x (cols floats):
// the quantized x as 32-bit words in the order the weight nibbles need them, per group
// [lane l][word u][A, B] (A pairs with the low nibbles of weight word u, B with the high ones),
// then per group and lane the sum of its 32 quantized values (for the +8 nibble offset), then
// per group t.
// Groups [g0, g1) only: the ones this block multiplies.
__device__ void gemv_act8_quantize(const float* xs, int cols, int g0, int g1) {
    uint8_t* x8 = (uint8_t*)(xs + cols);
    int* xsum = (int*)(x8 + cols);
    float* tq = (float*)(xsum + (cols >> 7) * 4);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int g = g0 + warp; g < g1; g += blockDim.x >> 5) {
        // Lane owns columns 4 lane .. 4 lane + 3 of the group.
        int qv[4];
        const float m = act8_quantize4(((const float4*)(xs + g * 128))[lane], qv);
        int qsum = 0;
        // Column c = 4 lane + i: weight word u = lane / 8, half = (lane % 8) / 4 (columns +16),
        // weight lane l = lane % 4, nibble k = 4 half + i: byte k / 2 of word A (k even) or B.
        const int u = lane >> 3, half = (lane >> 2) & 1, l = lane & 3;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int q = qv[i];
            qsum += q;
            const int k = 4 * half + i;
            const int word = g * 32 + (l * 4 + u) * 2 + (k & 1);
            x8[word * 4 + (k >> 1)] = (uint8_t)(int8_t)q;
        }
        // Lanes with the same l hold that weight lane's columns.
        qsum += __shfl_xor_sync(HAYAI_FULL_MASK, qsum, 4);
        qsum += __shfl_xor_sync(HAYAI_FULL_MASK, qsum, 8);
        qsum += __shfl_xor_sync(HAYAI_FULL_MASK, qsum, 16);
        if (lane < 4) xsum[g * 4 + lane] = qsum;
        if (lane == 0) tq[g] = m / 127.f;
    }
    __syncthreads();
}

// One 128-column group of an int4 row (this lane's 16 bytes) against the int8 x: the exact
// integer dot minus the nibble offset.
__device__ __forceinline__ int dot_group_a8(uint4 w, const uint4* xw, int xsum) {
    const uint4 a = xw[0], b = xw[1];
    int d = 0;
    d = __dp4a((int)(w.x & 0x0F0F0F0Fu), (int)a.x, d);
    d = __dp4a((int)((w.x >> 4) & 0x0F0F0F0Fu), (int)a.y, d);
    d = __dp4a((int)(w.y & 0x0F0F0F0Fu), (int)a.z, d);
    d = __dp4a((int)((w.y >> 4) & 0x0F0F0F0Fu), (int)a.w, d);
    d = __dp4a((int)(w.z & 0x0F0F0F0Fu), (int)b.x, d);
    d = __dp4a((int)((w.z >> 4) & 0x0F0F0F0Fu), (int)b.y, d);
    d = __dp4a((int)(w.w & 0x0F0F0F0Fu), (int)b.z, d);
    d = __dp4a((int)((w.w >> 4) & 0x0F0F0F0Fu), (int)b.w, d);
    return d - 8 * xsum;
}

// Builds x (length cols, a multiple of 4) in shared memory. Loads are float4 and independent
// across iterations so the prologue costs a few L2 round trips, not one per element. When
// `scaled_store`, stores x[j] * 2^(-4 (j % 4)) for the int4 dequantization trick (see below).
// STEP: the single-kernel and streamed decode steps' variant (kernels/step.cu,
// kernels/stream_step.cu), which also reads GeGLU partials (`in_glu`) and requests two columns'
// partials at a time (see the branch); the launch-per-operation kernels keep the plain loop
// (fewer registers: their occupancy depends on it).
// [j0, j1): the float4s of x this block multiplies (its K split). Without a norm, a residual
// input or a residual to store (which need the whole vector) only those are built: a K split
// of `down` needs 1/7 of its 40 KB input, not all of it.
// `cst` (launch-per-operation GEMVs; null elsewhere): 3 x cols shared floats where
// gemv_constants_async has begun copying the norm weights before the wait; the residual input is
// then read in the same pass as the input partials, so the prologue waits on one memory round
// trip instead of three.
// PENDING: cp.async groups committed after the constants' that may stay in flight (a caller's
// own weight copies). G: the threads that run it (a whole block, or a group with its own named
// barrier beside warps that never join it, as a streamed step's producer warp). tl: the streamed
// step's per-SM timeline slots (kernels/stream_step.cu SS_TIMELINE; null elsewhere).
template <bool STEP = false, int PENDING = 0, class G = BlockThreads>
__device__ void gemv_prologue(const GemvParams& p, float* xs, float* red, bool scaled_store,
                              unsigned long long* stamps = nullptr, int j0 = 0, int j1 = -1,
                              float* cst = nullptr, G g = G(), unsigned long long* tl = nullptr) {
    const int n4 = p.cols >> 2;
    const bool early_res = cst && p.res_in;
    const bool whole = j1 < 0 || p.res_in || p.norm_w || p.res_out;
    if (whole) {
        j0 = 0;
        j1 = n4;
    }
    // One block writes the new residual (for the persistent decode step: block 0 of its grid).
    const bool first = blockIdx.x == 0 && blockIdx.y == 0;
    float4* x4 = (float4*)xs;
    float ss_res = 0.f;
    if (STEP && !p.gather_tok) {
        // The step's variant: the residual input copied straight into `cst` (no registers), and
        // two columns per thread at a time with all their partials requested before either is
        // used, so the inputs cost one memory round trip where they cost one per column (the
        // next column's loads do not pass this one's shared-memory stores). Sums in split order,
        // the sum of squares in column order, as before.
        if (early_res) {
            for (int j = j0 + g.tu(); j < j1; j += g.nu()) cp_async16(cst + 4 * j, p.res_in + 4 * j);
            cp_async_commit();
        }
        for (int ja = j0 + g.tu(); ja < j1; ja += 2 * g.nu()) {
            const int jb = ja + g.nu();
            const bool two = jb < j1;
            float4 va, vb = make_float4(0.f, 0.f, 0.f, 0.f);
            if (p.in_glu) {
                const float4* q = (const float4*)p.in;
                float4 a0 = q[2 * ja], a1 = q[2 * ja + 1], b0 = vb, b1 = vb;
                if (two) {
                    b0 = q[2 * jb];
                    b1 = q[2 * jb + 1];
                }
                for (int s = 1; s < p.in_splits; s++) {
                    const float4* r = (const float4*)(p.in + (size_t)s * p.in_ld);
                    const float4 c0 = r[2 * ja], c1 = r[2 * ja + 1];
                    a0.x += c0.x; a0.y += c0.y; a0.z += c0.z; a0.w += c0.w;
                    a1.x += c1.x; a1.y += c1.y; a1.z += c1.z; a1.w += c1.w;
                    if (two) {
                        const float4 d0 = r[2 * jb], d1 = r[2 * jb + 1];
                        b0.x += d0.x; b0.y += d0.y; b0.z += d0.z; b0.w += d0.w;
                        b1.x += d1.x; b1.y += d1.y; b1.z += d1.z; b1.w += d1.w;
                    }
                }
                va = make_float4(gelu_tanh(a0.x) * a0.y, gelu_tanh(a0.z) * a0.w, gelu_tanh(a1.x) * a1.y,
                                 gelu_tanh(a1.z) * a1.w);
                vb = make_float4(gelu_tanh(b0.x) * b0.y, gelu_tanh(b0.z) * b0.w, gelu_tanh(b1.x) * b1.y,
                                 gelu_tanh(b1.z) * b1.w);
            } else {
                const float4* q = (const float4*)p.in;
                va = q[ja];
                if (two) vb = q[jb];
                float4 ua[3], ub[3];
#pragma unroll
                for (int k = 0; k < 3; k++) ua[k] = ub[k] = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
                for (int k = 0; k < 3; k++) {
                    if (k + 1 < p.in_splits) {
                        const float4* r = (const float4*)(p.in + (size_t)(k + 1) * p.in_ld);
                        ua[k] = r[ja];
                        if (two) ub[k] = r[jb];
                    }
                }
#pragma unroll
                for (int k = 0; k < 3; k++) {
                    if (k + 1 < p.in_splits) {
                        va.x += ua[k].x; va.y += ua[k].y; va.z += ua[k].z; va.w += ua[k].w;
                        vb.x += ub[k].x; vb.y += ub[k].y; vb.z += ub[k].z; vb.w += ub[k].w;
                    }
                }
                // Splits past four (none in the shapes measured), one at a time, in order.
                for (int s = 4; s < p.in_splits; s++) {
                    const float4* r = (const float4*)(p.in + (size_t)s * p.in_ld);
                    const float4 c = r[ja];
                    va.x += c.x; va.y += c.y; va.z += c.z; va.w += c.w;
                    if (two) {
                        const float4 d = r[jb];
                        vb.x += d.x; vb.y += d.y; vb.z += d.z; vb.w += d.w;
                    }
                }
            }
            if (p.act_mult) {
                const float4 m = ((const float4*)p.act_mult)[ja];
                va = make_float4(gelu_tanh(va.x) * m.x, gelu_tanh(va.y) * m.y, gelu_tanh(va.z) * m.z,
                                 gelu_tanh(va.w) * m.w);
                if (two) {
                    const float4 n = ((const float4*)p.act_mult)[jb];
                    vb = make_float4(gelu_tanh(vb.x) * n.x, gelu_tanh(vb.y) * n.y, gelu_tanh(vb.z) * n.z,
                                     gelu_tanh(vb.w) * n.w);
                }
            }
            x4[ja] = va;
            ss_res += va.x * va.x + va.y * va.y + va.z * va.z + va.w * va.w;
            if (two) {
                x4[jb] = vb;
                ss_res += vb.x * vb.x + vb.y * vb.y + vb.z * vb.z + vb.w * vb.w;
            }
        }
    } else {
#pragma unroll 4
        for (int j = j0 + g.tu(); j < j1; j += g.nu()) {
            float4 v;
            if (p.gather_tok) {
                const uint2 b = *(const uint2*)(p.gather_table + (size_t)(*p.gather_tok) * p.cols + 4 * j);
                const float sc = p.gather_scale;
                v = make_float4(bf16_lo(b.x) * sc, bf16_hi(b.x) * sc, bf16_lo(b.y) * sc, bf16_hi(b.y) * sc);
                if (first && p.res_out) ((float4*)p.res_out)[j] = v;
            } else {
                v = ((const float4*)p.in)[j];
                for (int s = 1; s < p.in_splits; s++) {
                    const float4 u = ((const float4*)(p.in + (size_t)s * p.in_ld))[j];
                    v.x += u.x; v.y += u.y; v.z += u.z; v.w += u.w;
                }
            }
            if (p.act_mult) {
                const float4 m = ((const float4*)p.act_mult)[j];
                v = make_float4(gelu_tanh(v.x) * m.x, gelu_tanh(v.y) * m.y, gelu_tanh(v.z) * m.z,
                                gelu_tanh(v.w) * m.w);
            }
            x4[j] = v;
            if (early_res) ((float4*)cst)[j] = ((const float4*)p.res_in)[j];
            ss_res += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
    }
    if (STEP) stamp_at(stamps, 1);
    if (STEP && tl && g.t() == 0) tl[4] = global_ns();
    if (cst) cp_async_wait<PENDING>();  // the norm weights (block_sum's barrier publishes them)
    if (STEP && tl && g.t() == 0) tl[8] = global_ns();
    const int n = p.cols;
    const float4* res_src = (const float4*)(early_res ? cst : p.res_in);
    const float4* res_w = (const float4*)(cst ? cst + n : p.res_w);
    const float4* norm_w = (const float4*)(cst ? cst + 2 * n : p.norm_w);
    // Sum of squares of x for the input norm, accumulated per thread over the same j as a
    // separate pass would (same value, one pass less).
    float ss = ss_res;
    if (p.res_in) {
        float scale = 1.f;
        if (p.res_w) {
            float t = group_sum(ss_res, red, g);
            scale = rsqrtf(t / (float)n + p.eps);
        }
        if (STEP && tl && g.t() == 0) tl[9] = global_ns();
        g.sync();
        ss = 0.f;
#pragma unroll 4
        for (int j = g.tu(); j < n4; j += g.nu()) {
            float4 b = x4[j];
            const float4 r = res_src[j];
            if (p.res_w) {
                const float4 w = res_w[j];
                b = make_float4(b.x * scale * w.x, b.y * scale * w.y, b.z * scale * w.z, b.w * scale * w.w);
            }
            const float c = p.res_scalar;
            const float4 h = make_float4((r.x + b.x) * c, (r.y + b.y) * c, (r.z + b.z) * c, (r.w + b.w) * c);
            x4[j] = h;
            ss += h.x * h.x + h.y * h.y + h.z * h.z + h.w * h.w;
            if (first && p.res_out) ((float4*)p.res_out)[j] = h;
        }
    }
    if (STEP) stamp_at(stamps, 2);
    if (STEP && tl && g.t() == 0) tl[5] = global_ns();
    if (p.norm_w) {
        float t = group_sum(ss, red, g);
        float scale = rsqrtf(t / (float)n + p.eps);
#pragma unroll 4
        for (int j = g.tu(); j < n4; j += g.nu()) {
            float4 v = x4[j];
            const float4 w = norm_w[j];
            x4[j] = make_float4(v.x * scale * w.x, v.y * scale * w.y, v.z * scale * w.z, v.w * scale * w.w);
        }
    }
    if (scaled_store) {
        g.sync();
        for (int j = j0 + g.tu(); j < j1; j += g.nu()) {
            float4 v = x4[j];
            x4[j] = make_float4(v.x, v.y * (1.f / 16.f), v.z * (1.f / 256.f), v.w * (1.f / 4096.f));
        }
    }
    g.sync();
}

// Starts copying the prologue's norm weights into `cst` (see gemv_prologue); they are constant,
// so this runs before the wait for the previous kernel.
__device__ void gemv_constants_async(const GemvParams& p, float* cst) {
    for (int j = threadIdx.x; j < (p.cols >> 2); j += blockDim.x) {
        if (p.res_w) cp_async16(cst + p.cols + 4 * j, p.res_w + 4 * j);
        if (p.norm_w) cp_async16(cst + 2 * p.cols + 4 * j, p.norm_w + 4 * j);
    }
    cp_async_commit();
}

// Shared floats before the prologue's constants: x, and for gemv_a8 its int8 copy, sums and
// scales (16-byte aligned). The host sizes the dynamic shared memory the same way.
__device__ __forceinline__ int gemv_cst_offset(int cols, bool a8) {
    return a8 ? ((cols + cols / 4 + (cols >> 7) * 5 + 3) & ~3) : cols;
}

// int4 layout: row r, group g (128 columns) occupies 64 bytes at r*cols/2 + g*64; lane l (0..3)
// of the row's quad owns bytes l*16..l*16+15 of it. Nibble k (0..7) of 32-bit word u of a lane
// holds column 16*(2u + k/4) + 4l + (k%4) as q + 8 (q in -8..7). With this order the four lanes
// of a row read x as consecutive float4s (no bank conflicts) and a nibble can be turned into a
// float with one LOP3 + one FADD: bits 0x4B000000 | (w & (0xF << 4e)) is 2^23 + q' 16^e, exact.
// The LOP3 takes one immediate, so the magic 0x4B000000 is kept in a register and the AND-OR is
// written as one lop3 (LUT for (a & b) | c: (0xF0 & 0xCC) | 0xAA = 0xEA); written in C, the two
// immediates cost two LOP3 per nibble.
template <uint32_t MASK>
__device__ __forceinline__ float nibble_bits(uint32_t w, uint32_t magic) {
    uint32_t d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(w), "n"(MASK), "r"(magic));
    return __uint_as_float(d);
}

__device__ __forceinline__ float dot_half(uint32_t w, float4 x, float acc, uint32_t magic) {
    acc = fmaf(nibble_bits<0x000Fu>(w, magic) - 8388616.f, x.x, acc);
    acc = fmaf(nibble_bits<0x00F0u>(w, magic) - 8388736.f, x.y, acc);
    acc = fmaf(nibble_bits<0x0F00u>(w, magic) - 8390656.f, x.z, acc);
    acc = fmaf(nibble_bits<0xF000u>(w, magic) - 8421376.f, x.w, acc);
    return acc;
}

__device__ __forceinline__ float dot_group_int4(uint4 w, const float4* xg, uint32_t magic) {
    float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
    a0 = dot_half(w.x, xg[0], a0, magic);
    a1 = dot_half(w.x >> 16, xg[4], a1, magic);
    a2 = dot_half(w.y, xg[8], a2, magic);
    a3 = dot_half(w.y >> 16, xg[12], a3, magic);
    a0 = dot_half(w.z, xg[16], a0, magic);
    a1 = dot_half(w.z >> 16, xg[20], a1, magic);
    a2 = dot_half(w.w, xg[24], a2, magic);
    a3 = dot_half(w.w >> 16, xg[28], a3, magic);
    return (a0 + a1) + (a2 + a3);
}

__device__ __forceinline__ float dot_chunk_bf16(uint4 w, const float4* xc) {
    const float4 a = xc[0], b = xc[1];
    float s0 = bf16_lo(w.x) * a.x, s1 = bf16_hi(w.x) * a.y;
    s0 = fmaf(bf16_lo(w.y), a.z, s0);
    s1 = fmaf(bf16_hi(w.y), a.w, s1);
    s0 = fmaf(bf16_lo(w.z), b.x, s0);
    s1 = fmaf(bf16_hi(w.z), b.y, s1);
    s0 = fmaf(bf16_lo(w.w), b.z, s0);
    s1 = fmaf(bf16_hi(w.w), b.w, s1);
    return s0 + s1;
}

// int8 weights with an f16 scale per 32 columns (`gemv_q8`; GGML's Q8_0 blocks, row-major):
// lane l of a row's quad takes columns 16 l .. 16 l + 15 of every 64-column unit, one 16-byte
// load, half a block. Each byte becomes a float by one PRMT and one FADD: with u = q + 128 (the
// XOR), 0x4B0000uu is 2^23 + u, so subtracting 2^23 + 128 gives q exactly.
__device__ __forceinline__ float dot_chunk_int8(uint4 w, const float4* xc) {
    const uint32_t ws[4] = {w.x ^ 0x80808080u, w.y ^ 0x80808080u, w.z ^ 0x80808080u, w.w ^ 0x80808080u};
    constexpr float OFS = 8388736.f;  // 2^23 + 128
    float s0 = 0.f, s1 = 0.f;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const float4 b = xc[k];
        s0 = fmaf(__uint_as_float(__byte_perm(ws[k], 0x4B000000u, 0x7540)) - OFS, b.x, s0);
        s1 = fmaf(__uint_as_float(__byte_perm(ws[k], 0x4B000000u, 0x7541)) - OFS, b.y, s1);
        s0 = fmaf(__uint_as_float(__byte_perm(ws[k], 0x4B000000u, 0x7542)) - OFS, b.z, s0);
        s1 = fmaf(__uint_as_float(__byte_perm(ws[k], 0x4B000000u, 0x7543)) - OFS, b.w, s1);
    }
    return s0 + s1;
}

__device__ __forceinline__ float f16_to_f32(uint32_t h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((unsigned short)h));
    return f;
}

#define GEMV_THREADS 256
#define GEMV_ROWS_PER_BLOCK 64
#define GEMV_UNROLL 4

__device__ __forceinline__ const uint4* gemv_wrow(const GemvParams& p, int row, int l) {
    return p.int4 ? (const uint4*)((const uint8_t*)p.w + (size_t)row * (p.cols >> 1)) + l
                  : (const uint4*)((const uint16_t*)p.w + (size_t)row * p.cols) + l;
}

// Requests units g0 .. g0 + U - 1 (those below u1) of one row: this lane's 16-byte chunk of each
// and, for int4, the group scales (W8: the lane's block's f16 scale, two a unit from srow). Both
// are constant, so this may run before pdl_wait. Scales stay raw bits until they are used:
// converting here would make the thread wait for each scale load in turn.
template <int U, bool W8 = false>
__device__ __forceinline__ void gemv_load_batch(const GemvParams& p, const uint4* wrow,
                                                const uint16_t* srow, int g0, int u1,
                                                uint4 (&wv)[U], uint32_t (&sc)[U]) {
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int g = g0 + u;
        if (g < u1) {
            wv[u] = ld_stream(wrow + (size_t)g * 4);
            if constexpr (W8)
                sc[u] = srow[2 * g];
            else
                sc[u] = p.int4 ? srow[g] : 0u;
        }
    }
}

// This lane's part of one row's dot product over units [u0, u1) with x in shared memory. `wv` and
// `sc` come in holding the batch at u0 (requested by the caller before the prologue); each batch
// is multiplied while the next one is in flight.
template <int U, bool A8 = false, bool W8 = false>
__device__ __forceinline__ float gemv_row_dot(const GemvParams& p, const uint4* wrow,
                                              const uint16_t* srow, int u0, int u1, int l,
                                              const float* xs, uint4 (&wv)[U], uint32_t (&sc)[U]) {
    const uint32_t magic = 0x4B000000u;
    const uint32_t* x8 = (const uint32_t*)(xs + p.cols);
    const int* xsum = (const int*)(x8 + (p.cols >> 2));
    const float* tq = (const float*)(xsum + (p.cols >> 7) * 4);
    float acc = 0.f;
    for (int g = u0; g < u1; g += U) {
        uint4 cw[U];
        uint32_t cs[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            cw[u] = wv[u];
            cs[u] = sc[u];
        }
        gemv_load_batch<U, W8>(p, wrow, srow, g + U, u1, wv, sc);
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (g + u < u1) {
                if constexpr (W8) {
                    acc = fmaf(dot_chunk_int8(cw[u], (const float4*)(xs + (g + u) * 64 + 16 * l)), f16_to_f32(cs[u]),
                               acc);
                } else if (A8) {
                    const int gg = g + u;
                    const int d = dot_group_a8(cw[u], (const uint4*)(x8 + gg * 32 + l * 8), xsum[gg * 4 + l]);
                    acc = fmaf((float)d, __uint_as_float(cs[u] << 16) * tq[gg], acc);
                } else if (p.int4) {
                    acc = fmaf(dot_group_int4(cw[u], (const float4*)(xs + (g + u) * 128 + 4 * l), magic),
                               __uint_as_float(cs[u] << 16), acc);
                } else {
                    acc += dot_chunk_bf16(cw[u], (const float4*)(xs + (g + u) * 32 + 8 * l));
                }
            }
        }
    }
    return acc;
}

// Split-K epilogue of the last block of a row tile (rows [r0, r0 + n), n <= blockDim.x, n a
// multiple of 32): adds the partials in split order into out_final; with `glu` the tile's
// interleaved (gate, up) rows become gelu(gate) * up at out_final[row / 2]. Used by gemv_mma;
// gemv_tiled keeps its GLU-free copy of the same sum so the default kernel's code stays the one
// measured (2026-11-30) until a GPU run covers the change.
__device__ __forceinline__ void gemv_reduce_splits(const GemvParams& p, int r0, int n) {
    if (threadIdx.x >= n) return;
    const int r = r0 + threadIdx.x;
    float t = 0.f;
    if (r < p.rows)
        for (int k = 0; k < p.splits; k++) t += __ldcg(p.out + (size_t)k * p.rows + r);
    if (p.glu) {
        const float up = __shfl_down_sync(HAYAI_FULL_MASK, t, 1);
        if ((r & 1) == 0 && r < p.rows) p.out_final[r >> 1] = gelu_tanh(t) * up;
    } else if (r < p.rows) {
        p.out_final[r] = t;
    }
}

// The tiled GEMV: one 64-row tile and one K split per block; U = 16-byte loads in flight per
// lane (the per-lane order of additions is the same for every U, so results are too).
template <int U, bool A8 = false, bool W8 = false>
__device__ __forceinline__ void gemv_tiled(const GemvParams& p, float* xs) {
    __shared__ float red[32];
    __shared__ int last;

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int quad = lane >> 2, l = lane & 3;
    const int row = blockIdx.x * GEMV_ROWS_PER_BLOCK + warp * 8 + quad;
    const bool valid = row < p.rows;
    const int s = blockIdx.y;
    // Units are 128-column groups (int4) or 32-column chunks (bf16); each is one 16-byte load
    // per lane. The first batch of weights is requested before the prologue (and before the
    // wait for the previous kernel) so its memory latency overlaps that.
    // (W8: 64-column units, the lane's f16 scales at srow[2 g].)
    const int units = W8 ? (p.cols >> 6) : p.int4 ? (p.cols >> 7) : (p.cols >> 5);
    const int per = (units + p.splits - 1) / p.splits;
    const int u0 = s * per, u1 = min(units, u0 + per);
    const int vr = valid ? row : 0;
    const uint4* wrow = W8 ? (const uint4*)((const int8_t*)p.w + (size_t)vr * p.cols) + l : gemv_wrow(p, vr, l);
    const uint16_t* srow = W8 ? p.scales + (size_t)vr * (p.cols >> 5) + (l >> 1) : p.scales + (size_t)vr * (p.cols >> 7);
    uint4 wv[U];
    uint32_t sc[U];
    if (valid) gemv_load_batch<U, W8>(p, wrow, srow, u0, u1, wv, sc);
    l2_prefetch(p.pf, blockIdx.y * gridDim.x + blockIdx.x, gridDim.x * gridDim.y);
    float* cst = (p.res_in || p.norm_w) ? xs + gemv_cst_offset(p.cols, A8) : nullptr;
    if (cst) gemv_constants_async(p, cst);

    pdl_wait();
    pdl_launch_dependents();
    // The float4s of x this split multiplies.
    const int j0 = W8 ? u0 * 16 : p.int4 ? u0 * 32 : u0 * 8, j1 = W8 ? u1 * 16 : p.int4 ? u1 * 32 : u1 * 8;
    if (A8) {
        gemv_prologue(p, xs, red, false, nullptr, j0, j1, cst);
        gemv_act8_quantize(xs, p.cols, u0, u1);
    } else {
        gemv_prologue(p, xs, red, p.int4 != 0, nullptr, j0, j1, cst);
    }

    float acc = 0.f;
    if (valid) acc = gemv_row_dot<U, A8, W8>(p, wrow, srow, u0, u1, l, xs, wv, sc);
    acc += __shfl_xor_sync(HAYAI_FULL_MASK, acc, 1);
    acc += __shfl_xor_sync(HAYAI_FULL_MASK, acc, 2);
    if (p.glu) {
        // Rows are interleaved gate/up pairs: row 2i is gate i, row 2i+1 is up i.
        // (The host never splits a GeGLU GEMV on this kernel: its sums must be whole here.)
        const float up = __shfl_xor_sync(HAYAI_FULL_MASK, acc, 4);
        if (valid && l == 0 && (quad & 1) == 0) p.out[row >> 1] = gelu_tanh(acc) * up;
        return;
    }
    if (valid && l == 0) p.out[(size_t)s * p.rows + row] = acc;
    if (p.splits == 1) return;
    // Split-K: the last block of this row tile adds the partials in split order (deterministic)
    // so consumers read one vector.
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        const int prev = atomicAdd(p.counters + blockIdx.x, 1);
        last = prev == p.splits - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    const int r = blockIdx.x * GEMV_ROWS_PER_BLOCK + threadIdx.x;
    if (threadIdx.x < GEMV_ROWS_PER_BLOCK && r < p.rows) {
        float t = 0.f;
        for (int k = 0; k < p.splits; k++) t += __ldcg(p.out + (size_t)k * p.rows + r);
        p.out_final[r] = t;
    }
    if (threadIdx.x == 0) p.counters[blockIdx.x] = 0;
}

// x starts 16 bytes past the dynamic shared memory's start (the host asks for that much more:
// GEMV_XS_OFFSET_BYTES, runner/shapes.rs): the start is 128-byte aligned for gemv_mma's sake (gemv_mma.cu), and this
// kernel measured 3.3% slower (bf16 E4B, 227.7 -> 220.2 tok/s) with x there than at its former
// 16-byte-aligned offset; the mechanism is not established.
#define GEMV_XS_OFFSET 4
extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv(const GemvParams p) {
    extern __shared__ float xs[];
    gemv_tiled<GEMV_UNROLL>(p, xs + GEMV_XS_OFFSET);
}

// int4 weights with int8 activations (see gemv_act8_quantize); int4 matrices only.
extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_a8(const GemvParams p) {
    extern __shared__ float xs[];
    gemv_tiled<GEMV_UNROLL, true>(p, xs);
}

// int8 weights with an f16 scale per 32 columns (GGML's Q8_0 blocks; the output head of a file
// that stores it so: `CudaOptions::lm_head`). x as gemv_a8's, at the start.
extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_q8(const GemvParams p) {
    extern __shared__ float xs[];
    gemv_tiled<GEMV_UNROLL, false, true>(p, xs);
}

// The same with 8 loads in flight per lane (fewer dependent round trips per row, more registers).
extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_u8(const GemvParams p) {
    extern __shared__ float xs[];
    gemv_tiled<8>(p, xs);
}

// Persistent variant: a grid the GPU holds at once (sized by the host from the occupancy), the
// prologue built once per block, and each warp looping over work items = (8-row octet, K split).
// A split octet is finished by the last warp to complete it (per-octet counter), which adds the
// partials in split order (deterministic) and applies the GeGLU epilogue when asked; with
// `counters` null the partials stay in `out` ([splits][rows]) for the consumer's prologue to add.
#define GEMV_P_UNROLL 4

// Every block of the grid arrives, then waits for all (the grid must be resident at once: the
// host sizes it from the occupancy). `bar` = {arrive, depart}; see grid_depart for the reset.
__device__ __forceinline__ void grid_barrier(unsigned int* bar) {
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        atomicAdd(bar, 1u);
        unsigned int seen;
        do {
            asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(seen) : "l"(bar) : "memory");
            if (seen < gridDim.x) __nanosleep(32);
        } while (seen < gridDim.x);
    }
    __syncthreads();
}

// The last block to leave resets the barrier for the next launch: every block has passed the
// barrier by then (it departs after its second phase), so no one still spins on `arrive`.
__device__ __forceinline__ void grid_depart(unsigned int* bar) {
    __syncthreads();
    if (threadIdx.x == 0 && atomicAdd(bar + 1, 1u) == gridDim.x - 1) {
        bar[0] = 0;
        bar[1] = 0;
    }
}

// One persistent GEMV over the grid. Before its prologue it waits for the previous kernel
// (`bar` null, PDL) or for the whole grid (`bar` set: the second GEMV of gemv_pair); the first
// weight batch is requested before either wait.
__device__ void gemv_phase(const GemvParams& p, float* xs, float* red, unsigned int* bar) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int quad = lane >> 2, l = lane & 3;
    const int octets = (p.rows + 7) >> 3;
    const int items = octets * p.splits;
    const int nwarps = gridDim.x * (GEMV_THREADS / 32);
    const int units = p.int4 ? (p.cols >> 7) : (p.cols >> 5);
    const int per = (units + p.splits - 1) / p.splits;
    const int groups = p.cols >> 7;

    int item = blockIdx.x * (GEMV_THREADS / 32) + warp;
    uint4 wv[GEMV_P_UNROLL];
    uint32_t sc[GEMV_P_UNROLL];
    // Request the first item's first batch before the prologue and the wait.
    if (item < items) {
        const int oct = item / p.splits, s = item % p.splits;
        const int row = min(oct * 8 + quad, p.rows - 1);
        const int u0 = s * per, u1 = min(units, u0 + per);
        gemv_load_batch<GEMV_P_UNROLL>(p, gemv_wrow(p, row, l), p.scales + (size_t)row * groups,
                                       u0, u1, wv, sc);
    }
    if (bar) {
        grid_barrier(bar);
    } else {
        pdl_wait();
        pdl_launch_dependents();
    }
    gemv_prologue(p, xs, red, p.int4 != 0);

    bool preloaded = true;
    for (; item < items; item += nwarps) {
        const int oct = item / p.splits, s = item % p.splits;
        const int row0 = oct * 8 + quad;
        const bool valid = row0 < p.rows;
        const int row = min(row0, p.rows - 1);
        const int u0 = s * per, u1 = min(units, u0 + per);
        const uint4* wrow = gemv_wrow(p, row, l);
        const uint16_t* srow = p.scales + (size_t)row * groups;
        if (!preloaded) gemv_load_batch<GEMV_P_UNROLL>(p, wrow, srow, u0, u1, wv, sc);
        preloaded = false;
        float acc = gemv_row_dot<GEMV_P_UNROLL>(p, wrow, srow, u0, u1, l, xs, wv, sc);
        acc += __shfl_xor_sync(HAYAI_FULL_MASK, acc, 1);
        acc += __shfl_xor_sync(HAYAI_FULL_MASK, acc, 2);
        if (p.splits == 1) {
            if (p.glu) {
                const float up = __shfl_xor_sync(HAYAI_FULL_MASK, acc, 4);
                if (valid && l == 0 && (quad & 1) == 0) p.out[row0 >> 1] = gelu_tanh(acc) * up;
            } else if (valid && l == 0) {
                p.out[row0] = acc;
            }
            continue;
        }
        if (valid && l == 0) p.out[(size_t)s * p.rows + row0] = acc;
        if (!p.counters) continue;
        __threadfence();
        __syncwarp();
        int prev = 0;
        if (lane == 0) prev = atomicAdd(p.counters + oct, 1);
        prev = __shfl_sync(HAYAI_FULL_MASK, prev, 0);
        if (prev != p.splits - 1) continue;
        __threadfence();
        const int r = oct * 8 + (lane & 7);
        float t = 0.f;
        if (r < p.rows)
            for (int k = 0; k < p.splits; k++) t += __ldcg(p.out + (size_t)k * p.rows + r);
        if (p.glu) {
            const float up = __shfl_xor_sync(HAYAI_FULL_MASK, t, 1);
            if (lane < 8 && (lane & 1) == 0 && r < p.rows) p.out_final[r >> 1] = gelu_tanh(t) * up;
        } else if (lane < 8 && r < p.rows) {
            p.out_final[r] = t;
        }
        if (lane == 0) p.counters[oct] = 0;
    }
}

extern "C" __global__ void __launch_bounds__(GEMV_THREADS, 3) gemv_persistent(const GemvParams p) {
    extern __shared__ float xs[];
    __shared__ float red[32];
    gemv_phase(p, xs, red, nullptr);
}

// Two dependent GEMVs in one launch (the per-layer-embedding gate and projection): the first
// leaves its split-K partials, a grid-wide barrier, then the second adds them in its prologue in
// split order, exactly as the separate launches would (same partials, same order of addition).
// Saves a launch, its ramp and the first GEMV's split-K epilogue.
struct GemvPairParams {
    GemvParams a, b;
    unsigned int* barrier;  // {arrive, depart}, zeroed; reset by the last block
};

extern "C" __global__ void __launch_bounds__(GEMV_THREADS, 3) gemv_pair(const GemvPairParams p) {
    extern __shared__ float xs[];
    __shared__ float red[32];
    gemv_phase(p.a, xs, red, nullptr);
    gemv_phase(p.b, xs, red, p.barrier);
    grid_depart(p.barrier);
}
