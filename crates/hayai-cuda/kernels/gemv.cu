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
    int rows, cols, splits, glu;
    int in_splits, in_ld;
    float res_scalar, eps, gather_scale;
    int int4;
};

// Builds x (length cols) in shared memory. When `scaled_store`, stores x[j] * 2^(-4 (j % 4))
// for the int4 dequantization trick (see below).
__device__ void gemv_prologue(const GemvParams& p, float* xs, float* red, bool scaled_store) {
    const int n = p.cols;
    const bool first = blockIdx.x == 0 && blockIdx.y == 0;
    float ss_res = 0.f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        float v;
        if (p.gather_tok) {
            v = bf16_to_f32(p.gather_table[(size_t)(*p.gather_tok) * n + j]) * p.gather_scale;
            if (first && p.res_out) p.res_out[j] = v;
        } else {
            v = 0.f;
            for (int s = 0; s < p.in_splits; s++) v += p.in[(size_t)s * p.in_ld + j];
        }
        if (p.act_mult) v = gelu_tanh(v) * p.act_mult[j];
        xs[j] = v;
        ss_res += v * v;
    }
    if (p.res_in) {
        float scale = 1.f;
        if (p.res_w) {
            float t = block_sum(ss_res, red);
            scale = rsqrtf(t / (float)n + p.eps);
        }
        __syncthreads();
        for (int j = threadIdx.x; j < n; j += blockDim.x) {
            float b = xs[j];
            if (p.res_w) b = b * scale * p.res_w[j];
            float h = (p.res_in[j] + b) * p.res_scalar;
            xs[j] = h;
            if (first && p.res_out) p.res_out[j] = h;
        }
    }
    if (p.norm_w) {
        float ss = 0.f;
        __syncthreads();
        for (int j = threadIdx.x; j < n; j += blockDim.x) ss += xs[j] * xs[j];
        float t = block_sum(ss, red);
        float scale = rsqrtf(t / (float)n + p.eps);
        for (int j = threadIdx.x; j < n; j += blockDim.x) xs[j] = xs[j] * scale * p.norm_w[j];
    }
    if (scaled_store) {
        __syncthreads();
        const float mul[4] = {1.f, 1.f / 16.f, 1.f / 256.f, 1.f / 4096.f};
        for (int j = threadIdx.x; j < n; j += blockDim.x) xs[j] *= mul[j & 3];
    }
    __syncthreads();
}

// int4 layout: row r, group g (128 columns) occupies 64 bytes at r*cols/2 + g*64; lane l (0..3)
// of the row's quad owns bytes l*16..l*16+15 of it. Nibble k (0..7) of 32-bit word u of a lane
// holds column 16*(2u + k/4) + 4l + (k%4) as q + 8 (q in -8..7). With this order the four lanes
// of a row read x as consecutive float4s (no bank conflicts) and a nibble can be turned into a
// float with one LOP3 + one FADD: bits 0x4B000000 | (w & (0xF << 4e)) is 2^23 + q' 16^e, exact.
__device__ __forceinline__ float dot_word(uint32_t w, float4 xa, float4 xb, float acc) {
    const uint32_t lo = w, hi = w >> 16;
    acc = fmaf(__uint_as_float(0x4B000000u | (lo & 0x000Fu)) - 8388616.f, xa.x, acc);
    acc = fmaf(__uint_as_float(0x4B000000u | (lo & 0x00F0u)) - 8388736.f, xa.y, acc);
    acc = fmaf(__uint_as_float(0x4B000000u | (lo & 0x0F00u)) - 8390656.f, xa.z, acc);
    acc = fmaf(__uint_as_float(0x4B000000u | (lo & 0xF000u)) - 8421376.f, xa.w, acc);
    acc = fmaf(__uint_as_float(0x4B000000u | (hi & 0x000Fu)) - 8388616.f, xb.x, acc);
    acc = fmaf(__uint_as_float(0x4B000000u | (hi & 0x00F0u)) - 8388736.f, xb.y, acc);
    acc = fmaf(__uint_as_float(0x4B000000u | (hi & 0x0F00u)) - 8390656.f, xb.z, acc);
    acc = fmaf(__uint_as_float(0x4B000000u | (hi & 0xF000u)) - 8421376.f, xb.w, acc);
    return acc;
}

#define GEMV_THREADS 256
#define GEMV_ROWS_PER_BLOCK 64
#define GEMV_UNROLL 4

extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv(const GemvParams p) {
    extern __shared__ float xs[];
    __shared__ float red[32];
    gemv_prologue(p, xs, red, p.int4 != 0);

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int quad = lane >> 2, l = lane & 3;
    const int row = blockIdx.x * GEMV_ROWS_PER_BLOCK + warp * 8 + quad;
    const bool valid = row < p.rows;
    const int s = blockIdx.y;
    float acc = 0.f;
    if (p.int4) {
        const int groups = p.cols >> 7;
        const int per = (groups + p.splits - 1) / p.splits;
        const int g0 = s * per, g1 = min(groups, g0 + per);
        if (valid) {
            const uint4* wrow = (const uint4*)((const uint8_t*)p.w + (size_t)row * (p.cols >> 1)) + l;
            const uint16_t* srow = p.scales + (size_t)row * groups;
            for (int g = g0; g < g1; g += GEMV_UNROLL) {
                uint4 wv[GEMV_UNROLL];
                float sc[GEMV_UNROLL];
#pragma unroll
                for (int u = 0; u < GEMV_UNROLL; u++) {
                    if (g + u < g1) {
                        wv[u] = ld_stream(wrow + (size_t)(g + u) * 4);
                        sc[u] = bf16_to_f32(srow[g + u]);
                    }
                }
#pragma unroll
                for (int u = 0; u < GEMV_UNROLL; u++) {
                    if (g + u < g1) {
                        const float4* xg = (const float4*)(xs + (g + u) * 128 + 4 * l);
                        float a = 0.f;
                        a = dot_word(wv[u].x, xg[0], xg[4], a);
                        a = dot_word(wv[u].y, xg[8], xg[12], a);
                        a = dot_word(wv[u].z, xg[16], xg[20], a);
                        a = dot_word(wv[u].w, xg[24], xg[28], a);
                        acc = fmaf(a, sc[u], acc);
                    }
                }
            }
        }
    } else {
        // bf16: lane l reads 8 columns at chunk*32 + 8l.
        const int chunks = p.cols >> 5;
        const int per = (chunks + p.splits - 1) / p.splits;
        const int c0 = s * per, c1 = min(chunks, c0 + per);
        if (valid) {
            const uint4* wrow = (const uint4*)((const uint16_t*)p.w + (size_t)row * p.cols) + l;
            for (int c = c0; c < c1; c += GEMV_UNROLL) {
                uint4 wv[GEMV_UNROLL];
#pragma unroll
                for (int u = 0; u < GEMV_UNROLL; u++)
                    if (c + u < c1) wv[u] = ld_stream(wrow + (size_t)(c + u) * 4);
#pragma unroll
                for (int u = 0; u < GEMV_UNROLL; u++) {
                    if (c + u < c1) {
                        const float4* xc = (const float4*)(xs + (c + u) * 32 + 8 * l);
                        float4 a = xc[0], b = xc[1];
                        acc = fmaf(bf16_lo(wv[u].x), a.x, acc);
                        acc = fmaf(bf16_hi(wv[u].x), a.y, acc);
                        acc = fmaf(bf16_lo(wv[u].y), a.z, acc);
                        acc = fmaf(bf16_hi(wv[u].y), a.w, acc);
                        acc = fmaf(bf16_lo(wv[u].z), b.x, acc);
                        acc = fmaf(bf16_hi(wv[u].z), b.y, acc);
                        acc = fmaf(bf16_lo(wv[u].w), b.z, acc);
                        acc = fmaf(bf16_hi(wv[u].w), b.w, acc);
                    }
                }
            }
        }
    }
    acc += __shfl_xor_sync(HAYAI_FULL_MASK, acc, 1);
    acc += __shfl_xor_sync(HAYAI_FULL_MASK, acc, 2);
    if (p.glu) {
        // Rows are interleaved gate/up pairs: row 2i is gate i, row 2i+1 is up i.
        const float up = __shfl_xor_sync(HAYAI_FULL_MASK, acc, 4);
        if (valid && l == 0 && (quad & 1) == 0) p.out[row >> 1] = gelu_tanh(acc) * up;
    } else if (valid && l == 0) {
        p.out[(size_t)s * p.rows + row] = acc;
    }
}
