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

// Loads of a tile are issued together (keys unrolled by 4 in the q.k phase, by 8 in the
// p.V phase) so a block waits for a few memory round trips, not one per key.
extern "C" __global__ void __launch_bounds__(ATTN_THREADS) attn_split(const AttnParams p) {
    __shared__ float sc[ATTN_TILE];
    __shared__ int slot_s[ATTN_TILE];
    __shared__ float tile_m, tile_corr, tile_sum;
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
        // q.k: warp w takes keys w*8 .. w*8+7 of the tile, four at a time.
#pragma unroll
        for (int jj = 0; jj < 8; jj += 4) {
            float4 kk[4][4];
            int slots[4];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int j = warp * 8 + jj + u;
                slots[u] = (first + t0 + min(j, nt - 1)) % p.cap;
                const float* kr = K + (size_t)slots[u] * p.hd + 4 * lane;
#pragma unroll
                for (int i = 0; i < 4; i++)
                    if (i < nv && j < nt) kk[u][i] = *(const float4*)(kr + 128 * i);
            }
#pragma unroll
            for (int u = 0; u < 4; u++) {
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
                    slot_s[j] = slots[u];
                }
            }
        }
        __syncthreads();
        // Warp 0: one key per lane; tile max, probabilities and their sum.
        if (warp == 0) {
            const float v = lane < nt ? sc[lane] : -INFINITY;
            const float mn = fmaxf(m, warp_max(v));
            const float pj = lane < nt ? expf(v - mn) : 0.f;
            const float sum = warp_sum(pj);
            sc[lane] = pj;
            if (lane == 0) {
                tile_m = mn;
                tile_corr = expf(m - mn);
                tile_sum = sum;
            }
        }
        __syncthreads();
        const float corr = tile_corr;
        m = tile_m;
        l = l * corr + tile_sum;
#pragma unroll
        for (int d = 0; d < 4; d++) acc[d] *= corr;
        for (int j0 = 0; j0 < nt; j0 += 8) {
            float vv[8][4];
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const float* vr = V + (size_t)slot_s[min(j0 + u, nt - 1)] * p.hd + t;
#pragma unroll
                for (int d = 0; d < 4; d++)
                    if (d < nv) vv[u][d] = vr[128 * d];
            }
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const float pj = j0 + u < nt ? sc[j0 + u] : 0.f;
#pragma unroll
                for (int d = 0; d < 4; d++)
                    if (d < nv) acc[d] = fmaf(pj, vv[u][d], acc[d]);
            }
        }
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

#define ATTN_MAX_SPLITS 128

// grid: nh blocks of 128 threads. Split weights are computed once into shared memory, then
// every thread adds its dims over the splits with independent loads.
extern "C" __global__ void attn_combine(const AttnParams p) {
    __shared__ float wsh[ATTN_MAX_SPLITS];
    __shared__ float inv_l;
    const int h = blockIdx.x, t = threadIdx.x, nv = p.hd >> 7;
    if (t < 32) {
        float mx = -INFINITY;
        for (int s = t; s < p.splits; s += 32) mx = fmaxf(mx, p.part_ml[2 * ((size_t)h * p.splits + s)]);
        mx = warp_max(mx);
        float L = 0.f;
        for (int s = t; s < p.splits; s += 32) {
            const size_t pi = (size_t)h * p.splits + s;
            const float ms = p.part_ml[2 * pi];
            const float e = ms == -INFINITY ? 0.f : expf(ms - mx);
            wsh[s] = e;
            L = fmaf(p.part_ml[2 * pi + 1], e, L);
        }
        L = warp_sum(L);
        if (t == 0) inv_l = 1.f / L;
    }
    __syncthreads();
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 8
    for (int s = 0; s < p.splits; s++) {
        const float e = wsh[s];
        const float* a = p.part_acc + ((size_t)h * p.splits + s) * p.hd + t;
#pragma unroll
        for (int d = 0; d < 4; d++)
            if (d < nv) acc[d] = fmaf(a[128 * d], e, acc[d]);
    }
    const float inv = inv_l;
#pragma unroll
    for (int d = 0; d < 4; d++)
        if (d < nv) p.out[(size_t)h * p.hd + t + 128 * d] = acc[d] * inv;
}
