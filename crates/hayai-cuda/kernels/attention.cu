// Split-KV decode attention for one query token: grid (splits, heads); each block runs an
// online softmax over its slice of the visible keys and writes (max, sum, weighted V); a
// combine kernel merges the slices. Sliding layers read a ring of `cap` slots (slot = pos %
// cap); KV-shared layers simply pass their donor's cache. Head dims that are multiples of 128 up
// to 512.
#include "common.cuh"

struct AttnParams {
    const float* q;        // [nh][hd]
    const float* k_cache;  // [nkv][cap][hd]
    const float* v_cache;
    float* part_ml;        // [nh][splits][2]
    float* part_acc;       // [nh][splits][hd]
    float* out;            // [nh][hd]
    const int* pos;
    int nh, nkv, hd, cap, window, splits;
    float scale, softcap;
};

#define ATTN_THREADS 128
#define ATTN_TILE 32

extern "C" __global__ void __launch_bounds__(ATTN_THREADS) attn_split(const AttnParams p) {
    __shared__ float sc[ATTN_TILE];
    __shared__ int slot_s[ATTN_TILE];
    const int s = blockIdx.x, h = blockIdx.y;
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int pos = *p.pos;
    const int n_keys = p.window > 0 ? min(pos + 1, p.window) : pos + 1;
    const int first = pos + 1 - n_keys;
    const int chunk = (n_keys + p.splits - 1) / p.splits;
    const int k0 = s * chunk, k1 = min(n_keys, k0 + chunk);
    const int g = h / (p.nh / p.nkv);
    const int nv = p.hd >> 7;  // float4s per lane for the q.k dot
    const float* K = p.k_cache + (size_t)g * p.cap * p.hd;
    const float* V = p.v_cache + (size_t)g * p.cap * p.hd;

    float4 qv[4];
#pragma unroll
    for (int i = 0; i < 4; i++)
        if (i < nv) qv[i] = *(const float4*)(p.q + (size_t)h * p.hd + 4 * lane + 128 * i);

    float m = -INFINITY, l = 0.f, acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int t0 = k0; t0 < k1; t0 += ATTN_TILE) {
        const int nt = min(ATTN_TILE, k1 - t0);
        for (int j = warp; j < nt; j += ATTN_THREADS / 32) {
            const int slot = (first + t0 + j) % p.cap;
            const float* kr = K + (size_t)slot * p.hd + 4 * lane;
            float d = 0.f;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                if (i < nv) {
                    float4 kk = *(const float4*)(kr + 128 * i);
                    d = fmaf(qv[i].x, kk.x, d);
                    d = fmaf(qv[i].y, kk.y, d);
                    d = fmaf(qv[i].z, kk.z, d);
                    d = fmaf(qv[i].w, kk.w, d);
                }
            }
            d = warp_sum(d) * p.scale;
            if (p.softcap > 0.f) d = p.softcap * tanhf(d / p.softcap);
            if (lane == 0) {
                sc[j] = d;
                slot_s[j] = slot;
            }
        }
        __syncthreads();
        float tm = -INFINITY;
        for (int j = 0; j < nt; j++) tm = fmaxf(tm, sc[j]);
        const float mn = fmaxf(m, tm);
        const float corr = expf(m - mn);
        l *= corr;
#pragma unroll
        for (int d = 0; d < 4; d++) acc[d] *= corr;
        for (int j = 0; j < nt; j++) {
            const float pj = expf(sc[j] - mn);
            l += pj;
            const float* vr = V + (size_t)slot_s[j] * p.hd + t;
#pragma unroll
            for (int d = 0; d < 4; d++)
                if (d < nv) acc[d] = fmaf(pj, vr[128 * d], acc[d]);
        }
        m = mn;
        __syncthreads();
    }
    const size_t pi = (size_t)h * p.splits + s;
    if (t == 0) {
        p.part_ml[2 * pi] = m;
        p.part_ml[2 * pi + 1] = l;
    }
#pragma unroll
    for (int d = 0; d < 4; d++)
        if (d < nv) p.part_acc[pi * p.hd + t + 128 * d] = acc[d];
}

// grid: nh blocks of 128 threads.
extern "C" __global__ void attn_combine(const AttnParams p) {
    const int h = blockIdx.x, t = threadIdx.x, nv = p.hd >> 7;
    float mx = -INFINITY;
    for (int s = 0; s < p.splits; s++) mx = fmaxf(mx, p.part_ml[2 * ((size_t)h * p.splits + s)]);
    float L = 0.f, acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int s = 0; s < p.splits; s++) {
        const size_t pi = (size_t)h * p.splits + s;
        const float ms = p.part_ml[2 * pi];
        if (ms == -INFINITY) continue;
        const float e = expf(ms - mx);
        L = fmaf(p.part_ml[2 * pi + 1], e, L);
#pragma unroll
        for (int d = 0; d < 4; d++)
            if (d < nv) acc[d] = fmaf(p.part_acc[pi * p.hd + t + 128 * d], e, acc[d]);
    }
    const float inv = 1.f / L;
#pragma unroll
    for (int d = 0; d < 4; d++)
        if (d < nv) p.out[(size_t)h * p.hd + t + 128 * d] = acc[d] * inv;
}
