// Per-head RMSNorm + RoPE, shared by decode attention and prefill.
#pragma once
#include "common.cuh"

// One head for norm_rope_heads: the sum of `splits` partial vectors `ld` apart from `src`, into
// shared `dst`, RMS-normed when `norm` (times `w` if set), rotated when `inv_freq` is set.
struct HeadJob {
    const float* src;
    float* dst;
    const float* w;
    const float* inv_freq;
    bool norm;
};

// Up to three heads at once (decode attention's query and fresh key and value): per head the
// same arithmetic as norm_rope_head, with one pass of loads and one reduction for all of them
// instead of one dependent chain per head. Heads that rotate share `inv_freq` (one sincos).
// `red` holds >= 32 floats; N * warps <= 32.
template <int N, class G>
__device__ void norm_rope_heads(const HeadJob (&job)[N], int splits, int ld, int hd, int pos,
                                float eps, float* red, G g) {
    const int half = hd >> 1;
    const int lane = g.t() & 31, warp = g.t() >> 5, nwarps = (g.n() + 31) >> 5;
    float ss[N];
#pragma unroll
    for (int n = 0; n < N; n++) ss[n] = 0.f;
    for (int i = g.t(); i < hd; i += g.n()) {
        float v[N];
#pragma unroll
        for (int n = 0; n < N; n++) v[n] = job[n].src[i];
        for (int s = 1; s < splits; s++) {
#pragma unroll
            for (int n = 0; n < N; n++) v[n] += job[n].src[i + (size_t)s * ld];
        }
#pragma unroll
        for (int n = 0; n < N; n++) {
            job[n].dst[i] = v[n];
            ss[n] += v[n] * v[n];
        }
    }
    // A block (group) sum per head: warp sums, then the warps' sums in order.
#pragma unroll
    for (int n = 0; n < N; n++) ss[n] = warp_sum(ss[n]);
    g.sync();
    if (lane == 0) {
#pragma unroll
        for (int n = 0; n < N; n++) red[n * nwarps + warp] = ss[n];
    }
    g.sync();
    float r[N];
#pragma unroll
    for (int n = 0; n < N; n++) {
        float t = 0.f;
        for (int i = 0; i < nwarps; i++) t += red[n * nwarps + i];
        r[n] = job[n].norm ? rsqrtf(t / (float)hd + eps) : 1.f;
    }
    g.sync();
    for (int i = g.t(); i < half; i += g.n()) {
        float sn = 0.f, cs = 1.f;
        const float* f = nullptr;
#pragma unroll
        for (int n = 0; n < N; n++) f = f ? f : job[n].inv_freq;
        if (f) sincosf((float)pos * f[i], &sn, &cs);
#pragma unroll
        for (int n = 0; n < N; n++) {
            float* d = job[n].dst;
            float a = d[i], c = d[i + half];
            if (job[n].norm) {
                a *= r[n];
                c *= r[n];
                if (job[n].w) {
                    a *= job[n].w[i];
                    c *= job[n].w[i + half];
                }
            }
            if (job[n].inv_freq) {
                const float a2 = a * cs - c * sn;
                c = c * cs + a * sn;
                a = a2;
            }
            d[i] = a;
            d[i + half] = c;
        }
    }
    g.sync();
}

// One head of one row (prefill): RMSNorm (optional weight `w`) and RoPE (when `inv_freq` is set)
// of `src` (the sum of `splits` parts `ld` floats apart) into shared `dst`, by the whole block.
__device__ __forceinline__ void norm_rope_head(const float* src, float* dst, const float* w,
                                               const float* inv_freq, int hd, int pos, bool norm,
                                               float eps, float* red, int splits, int ld) {
    const HeadJob job[1] = {{src, dst, w, inv_freq, norm}};
    norm_rope_heads<1>(job, splits, ld, hd, pos, eps, red, BlockThreads{});
}
