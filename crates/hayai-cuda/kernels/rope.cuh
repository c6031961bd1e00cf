// Per-head RMSNorm + RoPE, shared by decode attention and prefill.
#pragma once
#include "common.cuh"

// RMSNorm (optional weight) + optional RoPE of one head from `src` into shared `dst`.
__device__ void norm_rope_head(const float* src, float* dst, const float* w, const float* inv_freq,
                               int hd, int pos, bool norm, float eps, float* red) {
    const int half = hd >> 1;
    float ss = 0.f;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        const float v = src[i];
        dst[i] = v;
        ss += v * v;
    }
    const float tot = block_sum(ss, red);
    const float r = norm ? rsqrtf(tot / (float)hd + eps) : 1.f;
    __syncthreads();
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float a = dst[i], c = dst[i + half];
        if (norm) {
            a *= r;
            c *= r;
            if (w) {
                a *= w[i];
                c *= w[i + half];
            }
        }
        if (inv_freq) {
            float sn, cs;
            sincosf((float)pos * inv_freq[i], &sn, &cs);
            const float a2 = a * cs - c * sn;
            c = c * cs + a * sn;
            a = a2;
        }
        dst[i] = a;
        dst[i + half] = c;
    }
    __syncthreads();
}
