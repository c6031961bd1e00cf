// Per-head q/k RMSNorm, RoPE (default and proportional: pairs past `rotary_pairs` have zero
// frequency, encoded as inv_freq = 0), weightless v norm, and the K/V append into the cache
// (slot = pos % cap: a ring buffer for sliding layers). Input is the QKV GEMV's split-K partials.
#include "common.cuh"

struct RopeParams {
    const float* qkv;      // [splits][ld]: q (nh*hd) | k (nkv*hd) | v (nkv*hd)
    float* q_out;          // [nh*hd]
    float* k_cache;        // [nkv][cap][hd]; null on KV-shared layers
    float* v_cache;
    const float* q_norm;   // [hd]
    const float* k_norm;   // [hd]
    const float* inv_freq; // [hd/2]
    const int* pos;
    int splits, ld, nh, nkv, hd, cap, v_norm;
    float eps;
};

// grid: nh (+ 2*nkv when the layer owns its cache) blocks of hd/2 threads.
extern "C" __global__ void qk_norm_rope(const RopeParams p) {
    __shared__ float red[32];
    const int b = blockIdx.x, i = threadIdx.x, half = p.hd >> 1;
    int kind, head, off;
    if (b < p.nh) { kind = 0; head = b; off = b * p.hd; }
    else if (b < p.nh + p.nkv) { kind = 1; head = b - p.nh; off = p.nh * p.hd + head * p.hd; }
    else { kind = 2; head = b - p.nh - p.nkv; off = (p.nh + p.nkv) * p.hd + head * p.hd; }
    float a = 0.f, c = 0.f;
    for (int s = 0; s < p.splits; s++) {
        a += p.qkv[(size_t)s * p.ld + off + i];
        c += p.qkv[(size_t)s * p.ld + off + i + half];
    }
    // q and k are always normalized (a missing k weight means a weightless norm, as in the
    // reference); v only where the architecture says so.
    const float* w = kind == 0 ? p.q_norm : (kind == 1 ? p.k_norm : nullptr);
    if (kind < 2 || p.v_norm) {
        float t = block_sum(a * a + c * c, red);
        float r = rsqrtf(t / (float)p.hd + p.eps);
        a *= r;
        c *= r;
        if (w) {
            a *= w[i];
            c *= w[i + half];
        }
    }
    const int pos = *p.pos;
    if (kind < 2) {
        float sn, cs;
        sincosf((float)pos * p.inv_freq[i], &sn, &cs);
        float a2 = a * cs - c * sn;
        float c2 = c * cs + a * sn;
        a = a2;
        c = c2;
    }
    if (kind == 0) {
        p.q_out[off + i] = a;
        p.q_out[off + i + half] = c;
    } else {
        float* cache = kind == 1 ? p.k_cache : p.v_cache;
        size_t base = ((size_t)head * p.cap + (size_t)(pos % p.cap)) * p.hd;
        cache[base + i] = a;
        cache[base + i + half] = c;
    }
}
