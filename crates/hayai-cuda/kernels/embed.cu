// Per-layer embeddings (Gemma 4 E-series): combine the gathered PLE table row with the
// normalized projection of the token embedding, one block per layer slice.
#include "common.cuh"

struct PleParams {
    const int* tok;
    const uint16_t* table;  // bf16 [vocab][n_layers * dim]
    const float* ctx;       // [splits][ld] projection partials
    const float* norm_w;    // [dim]
    float* out;             // [n_layers * dim]
    int splits, ld, dim;
    float tok_scale, ctx_scale, mix_scale, eps;
};

// grid: n_layers blocks of `dim` threads (dim <= 1024).
extern "C" __global__ void ple_combine(const PleParams p) {
    __shared__ float red[32];
    const int j = blockIdx.x * p.dim + threadIdx.x;
    const float nw = p.norm_w[threadIdx.x];  // constant: read before the wait
    pdl_wait();  // ctx and the token id come from earlier kernels
    pdl_launch_dependents();
    float c = 0.f;
    for (int s = 0; s < p.splits; s++) c += p.ctx[(size_t)s * p.ld + j];
    c *= p.ctx_scale;
    float t = block_sum(c * c, red);
    c = c * rsqrtf(t / (float)p.dim + p.eps) * nw;
    const size_t row = (size_t)(*p.tok) * ((size_t)gridDim.x * p.dim);
    const float e = bf16_to_f32(p.table[row + j]) * p.tok_scale;
    p.out[j] = (c + e) * p.mix_scale;
}
