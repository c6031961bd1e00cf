// What does one link of the decode chain cost — every SM writes its rows of a vector, then every
// SM reads the whole vector — when the SMs are persistent and pass it through global memory?
// The streamed-step prototype (stream_step.cu) pays ~3.4 us per operation with almost no bytes
// (`--tiny`); this isolates the hand-over from everything else and compares ways to do it:
//
//   counter : the prototype's: block barrier, one release add per SM to a per-round counter,
//             thread 0 polls it with acquire loads, block barrier, then the vector is read.
//   flags   : block barrier, one release store per SM into its own flag word of the round;
//             warp 0 polls all SMs' flags (a few cache lines), block barrier, then the read.
//   ll      : no barrier and no fence: every value travels with the round's tag in the same
//             8-byte word (NCCL's "LL" idea), so reading the vector is the wait: each thread
//             spins on its words until their tags are the round's.
//   llc     : ll's tagged words, and a per-round counter as a hint of when to read them: a
//             relaxed add after the block's stores (no barrier, no fence), thread 0 polls it
//             with relaxed loads, then the words are read (and read again while any tag is stale).
//   none    : no synchronization (the values are stale and counted as wrong): the read alone.
//   counter/G: the counter split into G words (SM s adds to word s % G), so no word takes more
//             than ceil(nsm / G) of the round's adds; lanes 0..G-1 of warp 0 poll one word each
//             with acquire loads, all in flight together. Whether the adds to one address are a
//             serial cost of the plain counter (132 of them a link in the streamed step).
//   stagger/P: the plain counter, polled by lane 0 of warps 0..P-1 instead of thread 0 alone,
//             each with relaxed loads one at a time, their first polls cyc/P cycles apart, and each
//             poll's value looked at only cyc cycles after it was issued (so a poller never waits
//             on a load in flight: it watches a shared word meanwhile); the poller that sees the
//             count takes the acquire (`fence.acquire.gpu`: an L1 invalidation, no wait for
//             stores) and sets the shared word, the others leave without waiting for their loads.
//             Whether a poll every cyc/P cycles finds the count sooner than one poller's
//             back-to-back acquire loads (each a full round trip, the next issued after it).
//             H200, 2,560 floats: no (2.53-2.58 us at 900 cycles, counter 2.07; twenty-eighth
//             session, docs/performance.md).
//   warprel : the counter, published by every warp instead of once per block: each warp's lane 0
//             adds 1 with a release after the warp's own stores (`__syncwarp`), with no block
//             barrier before; thread 0 polls for nsm x warps adds. Whether a block's release
//             waits on more than its own warp's stores (one fence a warp, none behind a barrier).
//             H200, 2,560 floats: 3.12 us (the adds on one counter cost more than the barrier).
//   cluster/C (sm_90): the hand-over inside a thread-block cluster of C blocks instead of the
//             whole grid: each block writes its share of the vector into its own shared memory,
//             the cluster's hardware barrier (arrive.release / wait.acquire), then every block
//             reads the whole vector from the C blocks' shared memory (distributed shared memory,
//             float4 loads). One block per SM (the dynamic shared memory asks for more than half
//             an SM's), clusters side by side, as many as fit, each passing its own vector.
//   cown/C  : cluster/C reading only the block's own share back after the barrier.
//   cbar/C  : cluster/C's barrier alone (no read): what the cluster's synchronization costs.
//             H200, 2,560 floats (twenty-ninth session, docs/performance.md): counter 2.07 us;
//             cluster 1.23 / 1.32 / 1.34 / 1.41 us at C = 2 / 4 / 8 / 16, cown 0.74-0.62, cbar
//             0.36-0.31; 10,240 floats: counter 2.43, cluster 2.56-3.46, cbar 0.58-0.35. The
//             barrier is cheap; reading the whole vector over DSMEM is not (~1 us and more, more
//             with C), and only 120 SMs (C = 4, 8) or 112 (C = 16) of 132 hold clusters.
//             256 floats (thirtieth session): counter 1.97, cluster 0.85-0.89, cbar 0.30-0.32;
//             the streamed step on 120 SMs instead of 132 ran 5.6% slower (HAYAI_STREAM_SMS).
//   red/C   : a reduction link (split-K across SMs fused into the hand-over): C SMs each add a
//             partial to *every* element of the vector with integer atomics on 64-bit
//             fixed-point words (`red.global.add.u64`: the sum is the same whatever the order,
//             so greedy output cannot depend on timing), then the plain counter, then every SM
//             reads the whole vector. What fusing a GEMV's K split into the previous operation
//             (gate/up with down, the PLE gate with its projection) would pay instead of a link.
//   red32/C : the same with 32-bit words (less range or resolution, half the traffic).
//   bred/C  : red/C's sums with sm_90's bulk reduction: each contributing SM writes its partial
//             vector (64-bit fixed point) into shared memory and one thread hands it to the L2
//             as `cp.reduce.async.bulk .add.u64` copies of 4 KB, waits for them to complete, then
//             the plain counter. Whether the L2 adds a line at a time much faster than it takes
//             one atomic per element (sm_90 only; other archs print nothing for it).
//
// Each round: the rows a block owns are written (value = row + round + a term that is 0 when
// the previous round's reads were all right, so the chain is a real dependency), then the whole
// vector is read, every value checked, and summed by the block. Prints us per round (the
// difference of two run lengths, so the launch is not counted) and the wrong reads.
//
// Usage (GPU machine): nvcc -O3 -std=c++17 -arch=sm_90 -o /tmp/lr link_rate.cu && /tmp/lr
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <utility>

#include <cooperative_groups.h>

#include "proto.cuh"

namespace cg = cooperative_groups;

enum Scheme { COUNTER, FLAGS, LL, NONE, LLC, COUNTERG, RED, RED32, BRED, STAGGER, WARPREL };

__device__ __forceinline__ unsigned ld_relaxed_u32(const unsigned* p) {
    unsigned v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
// 16 bytes: two tagged words, each read whole (8-byte single-copy atomicity per half).
__device__ __forceinline__ ulonglong2 ld_relaxed_u128(const ulonglong2* p) {
    ulonglong2 v;
    asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];" : "=l"(v.x), "=l"(v.y) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ unsigned long long ld_relaxed_u64(const unsigned long long* p) {
    unsigned long long v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void st_relaxed_u64(unsigned long long* p, unsigned long long v) {
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// stagger/P's poll (see the scheme list): returns once `seen` holds `key`, having set it itself
// after an acquire if its own poll found the count.
__device__ void poll_stagger(const unsigned* p, unsigned target, volatile unsigned* seen, unsigned key, int w, int P,
                             long long cyc) {
    const long long start = clock64() + (long long)w * cyc / P;
    while (clock64() < start)
        if (*seen == key) return;
    for (;;) {
        const unsigned v = ld_relaxed_u32(p);
        const long long t0 = clock64();
        for (;;) {
            if (*seen == key) return;
            if (clock64() - t0 >= cyc) break;
        }
        if (v >= target) {
            asm volatile("fence.acquire.gpu;" ::: "memory");
            *seen = key;
            return;
        }
    }
}

// Block-wide sum (fixed order), every thread gets it.
__device__ float block_sum(float v, float* red) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    __syncthreads();  // red[] free (the previous call's readers are done)
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float s = 0.f;
    for (int w = 0; w < nw; w++) s += red[w];
    return s;
}

// A reduction link's vector of fixed-point words (Word: 64- or 32-bit, signed), every thread's
// 16-byte loads issued together, then each value in `unit`s checked against the sum the
// contributors made (m times row + round).
template <int J, typename Word>
__device__ void check_fixed(const void* base, int n, int k, float m, float unit, unsigned& wrong, float& sum) {
    constexpr int PER = 16 / (int)sizeof(Word);
    const int tid = threadIdx.x, T = blockDim.x;
    const uint4* p = (const uint4*)base;
    uint4 w[J];
#pragma unroll
    for (int j = 0; j < J; j++)
        if (tid + j * T < n / PER) w[j] = __ldcg(p + tid + j * T);
#pragma unroll
    for (int j = 0; j < J; j++) {
        const int c = tid + j * T;
        if (c < n / PER) {
            const Word* x = (const Word*)&w[j];
#pragma unroll
            for (int i = 0; i < PER; i++) {
                const float a = (float)x[i] * unit, e = m * (float)(PER * c + i + k);
                wrong += a != e;
                sum += a - e;
            }
        }
    }
}

// vec: per round, n floats (counter/flags/none) or n tagged words (ll). sync: per round, the
// counter (1 word) or the flags (nsm words). bad: wrong reads, summed over blocks.
template <int SCHEME, int J>
__global__ void link_rounds(float* vec, unsigned long long* llvec, unsigned* sync, int n, int rounds, int nap,
                            unsigned* bad, int groups = 1, long long cyc = 0) {
    __shared__ float red[32];
    __shared__ volatile unsigned seen;  // STAGGER: the last round whose count a poller saw
    if (threadIdx.x == 0) seen = 0xffffffffu;
    __syncthreads();
    extern __shared__ __align__(16) unsigned long long bred_buf[];  // BRED: n words
    const int s = blockIdx.x, nsm = gridDim.x, tid = threadIdx.x, T = blockDim.x;
    const int r0 = (int)((long long)n * s / nsm), r1 = (int)((long long)n * (s + 1) / nsm);
    unsigned wrong = 0;
    float prev_ok = 0.f;  // 0 when the previous round read everything right
    for (int k = 0; k < rounds; k++) {
        // Write this block's rows (a reduction link: add to every row, if this SM contributes).
        if (SCHEME == RED || SCHEME == RED32) {
            if (s < groups)
                for (int r = tid; r < n; r += T) {
                    // Fixed point, 2^-16 units (whole units in 32 bits, which would overflow): the
                    // sum over the contributors is groups * (r + k).
                    const long long v = (long long)(((float)(r + k) + prev_ok) * (SCHEME == RED ? 65536.f : 1.f));
                    if (SCHEME == RED)
                        asm volatile("red.relaxed.gpu.global.add.u64 [%0], %1;" ::"l"(llvec + (size_t)k * n + r), "l"(v)
                                     : "memory");
                    else
                        asm volatile("red.relaxed.gpu.global.add.u32 [%0], %1;" ::"l"((unsigned*)llvec + (size_t)k * n + r),
                                     "r"((unsigned)v)
                                     : "memory");
                }
        } else if (SCHEME == BRED) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
            if (s < groups) {
                for (int r = tid; r < n; r += T)
                    bred_buf[r] = (unsigned long long)(long long)(((float)(r + k) + prev_ok) * 65536.f);
                // The generic proxy's shared-memory writes before the async proxy reads them.
                asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
                __syncthreads();
                if (tid == 0) {
                    const unsigned bytes = (unsigned)n * 8u;
                    for (unsigned o = 0; o < bytes; o += 4096u) {
                        const unsigned sz = bytes - o < 4096u ? bytes - o : 4096u;
                        asm volatile(
                            "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.u64 [%0], [%1], %2;" ::"l"(
                                (char*)(llvec + (size_t)k * n) + o),
                            "r"((unsigned)__cvta_generic_to_shared((char*)bred_buf + o)), "r"(sz)
                            : "memory");
                    }
                    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
                    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
                    // The async proxy's global writes ordered before the release below.
                    asm volatile("fence.proxy.async.global;" ::: "memory");
                }
            }
#endif
        } else
        for (int r = r0 + tid; r < r1; r += T) {
            const float v = (float)(r + k) + prev_ok;
            if (SCHEME == LL || SCHEME == LLC)
                st_relaxed_u64(llvec + (size_t)k * n + r, (unsigned long long)(k + 1) << 32 | __float_as_uint(v));
            else
                __stcg(vec + (size_t)k * n + r, v);
        }
        // Publish and wait.
        if (SCHEME == COUNTER || SCHEME == RED || SCHEME == RED32 || SCHEME == BRED) {
            __syncthreads();
            if (tid == 0) {
                asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(sync + k) : "memory");
                while (ld_acquire_gpu(sync + k) < (unsigned)nsm)
                    if (nap) __nanosleep(nap);
            }
            __syncthreads();
        } else if (SCHEME == WARPREL) {
            __syncwarp();
            if ((tid & 31) == 0) asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(sync + k) : "memory");
            if (tid == 0)
                while (ld_acquire_gpu(sync + k) < (unsigned)(nsm * (T >> 5)))
                    if (nap) __nanosleep(nap);
            __syncthreads();
        } else if (SCHEME == STAGGER) {
            __syncthreads();
            if (tid == 0) asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(sync + k) : "memory");
            if ((tid & 31) == 0 && (tid >> 5) < groups) poll_stagger(sync + k, (unsigned)nsm, &seen, (unsigned)k, tid >> 5, groups, cyc);
            __syncthreads();
        } else if (SCHEME == COUNTERG) {
            // sync: per round, `groups` words (the SMs s with s % groups == g add to word g).
            unsigned* c = sync + (size_t)k * groups;
            __syncthreads();
            if (tid == 0) asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(c + s % groups) : "memory");
            if (tid < 32) {
                const unsigned want = tid < groups && tid < nsm ? (unsigned)((nsm - 1 - tid) / groups + 1) : 0u;
                for (;;) {
                    const bool ok = tid >= groups || ld_acquire_gpu(c + tid) >= want;
                    if (__all_sync(0xffffffffu, ok)) break;
                    if (nap) __nanosleep(nap);
                }
            }
            __syncthreads();
        } else if (SCHEME == LLC) {
            // No fence: the tags, not the counter, say whether a word is this round's.
            __syncthreads();
            if (tid == 0) {
                asm volatile("red.relaxed.gpu.global.add.u32 [%0], 1;" ::"l"(sync + k) : "memory");
                while (ld_relaxed_u32(sync + k) < (unsigned)nsm)
                    if (nap) __nanosleep(nap);
            }
            __syncthreads();
        } else if (SCHEME == FLAGS) {
            unsigned* f = sync + (size_t)k * nsm;
            __syncthreads();
            if (tid == 0) asm volatile("st.release.gpu.global.u32 [%0], 1;" ::"l"(f + s) : "memory");
            if (tid < 32) {
                // Relaxed loads, all in flight at once, then one acquire fence.
                for (;;) {
                    bool all = true;
#pragma unroll
                    for (int j = 0; j < 8; j++)
                        if (tid + 32 * j < nsm) all &= ld_relaxed_u32(f + tid + 32 * j) != 0u;
                    if (__all_sync(0xffffffffu, all)) break;
                    if (nap) __nanosleep(nap);
                }
                asm volatile("fence.acq_rel.gpu;" ::: "memory");
            }
            __syncthreads();
        }
        // Read and check the whole vector: every thread's loads issued together (J per thread,
        // 16 bytes each: 4 floats, or 2 tagged words), so a read costs about one L2 round trip.
        float sum = 0.f;
        if (SCHEME == RED || SCHEME == RED32 || SCHEME == BRED) {
            // Fixed point back to float (the value as a float times the contributors).
            const float m = (float)groups;
            if (SCHEME == RED32) check_fixed<J, int>((const int*)llvec + (size_t)k * n, n, k, m, 1.f, wrong, sum);
            else check_fixed<J, long long>(llvec + (size_t)k * n, n, k, m, 1.f / 65536.f, wrong, sum);
        } else if (SCHEME == LL || SCHEME == LLC) {
            const ulonglong2* p = (const ulonglong2*)(llvec + (size_t)k * n);
            ulonglong2 w[J];
#pragma unroll
            for (int j = 0; j < J; j++) {
                const int c = tid + j * T;
                if (c < n / 2) w[j] = ld_relaxed_u128(p + c);
            }
            // Until every word carries this round's tag: the stale ones read again, together.
            const unsigned tag = (unsigned)(k + 1);
            for (;;) {
                bool all = true;
#pragma unroll
                for (int j = 0; j < J; j++)
                    if (tid + j * T < n / 2) all &= (unsigned)(w[j].x >> 32) == tag && (unsigned)(w[j].y >> 32) == tag;
                if (all) break;
                if (nap) __nanosleep(nap);
#pragma unroll
                for (int j = 0; j < J; j++) {
                    const int c = tid + j * T;
                    if (c < n / 2 && ((unsigned)(w[j].x >> 32) != tag || (unsigned)(w[j].y >> 32) != tag))
                        w[j] = ld_relaxed_u128(p + c);
                }
            }
#pragma unroll
            for (int j = 0; j < J; j++) {
                const int c = tid + j * T;
                if (c < n / 2) {
                    const float a = __uint_as_float((unsigned)w[j].x), b = __uint_as_float((unsigned)w[j].y);
                    wrong += (a != (float)(2 * c + k)) + (b != (float)(2 * c + 1 + k));
                    sum += (a - (float)(2 * c + k)) + (b - (float)(2 * c + 1 + k));
                }
            }
        } else {
            const float4* p = (const float4*)(vec + (size_t)k * n);
            float4 v[J];
#pragma unroll
            for (int j = 0; j < J; j++) {
                const int c = tid + j * T;
                if (c < n / 4) v[j] = __ldcg(p + c);
            }
#pragma unroll
            for (int j = 0; j < J; j++) {
                const int c = tid + j * T;
                if (c < n / 4) {
                    const float e = (float)(4 * c + k);
                    wrong += (v[j].x != e) + (v[j].y != e + 1.f) + (v[j].z != e + 2.f) + (v[j].w != e + 3.f);
                    sum += (v[j].x - e) + (v[j].y - (e + 1.f)) + (v[j].z - (e + 2.f)) + (v[j].w - (e + 3.f));
                }
            }
        }
        prev_ok = block_sum(sum, red);  // 0 if every block's rows were right
    }
    if (wrong) atomicAdd(bad, wrong);
}

// cluster/C: rounds of the vector handed over inside each cluster (see the scheme list). Shared
// memory: two buffers of ceil(n / C) floats (a round's writes go to the buffer the round before
// last read: every block has passed this round's predecessor's barrier, so those reads are done).
// READ: 2 = the whole vector from the C blocks (float4 loads through distributed shared memory),
// 1 = only the block's own share (local shared memory), 0 = none (the cluster barrier alone).
template <int READ>
__global__ void cluster_rounds(int n, int rounds, unsigned* bad) {
    extern __shared__ __align__(16) float cbuf[];
    __shared__ float red[32];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cg::cluster_group cl = cg::this_cluster();
    const int C = (int)cl.num_blocks(), rank = (int)cl.block_rank(), tid = threadIdx.x, T = blockDim.x;
    const int per = (n + C - 1) / C, per4 = per / 4;  // the host keeps n a multiple of 4 C
    unsigned wrong = 0;
    float prev_ok = 0.f;
    for (int k = 0; k < rounds; k++) {
        float* mine = cbuf + (k & 1) * per;
        for (int i = tid; i < per; i += T) {
            const int r = rank * per + i;
            if (r < n) mine[i] = (float)(r + k) + prev_ok;
        }
        cl.sync();
        float sum = 0.f;
        if (READ == 2) {
#pragma unroll 4
            for (int q = tid; q < n / 4; q += T) {
                const int owner = q / per4, r = q * 4;
                const float4 v = reinterpret_cast<const float4*>(cl.map_shared_rank(mine, owner))[q - owner * per4];
                const float e = (float)(r + k);
                wrong += (v.x != e) + (v.y != e + 1.f) + (v.z != e + 2.f) + (v.w != e + 3.f);
                sum += (v.x - e) + (v.y - e - 1.f) + (v.z - e - 2.f) + (v.w - e - 3.f);
            }
        } else if (READ == 1) {
            for (int i = tid; i < per; i += T) {
                const float e = (float)(rank * per + i + k);
                wrong += mine[i] != e;
                sum += mine[i] - e;
            }
        }
        prev_ok = READ ? block_sum(sum, red) : 0.f;
    }
    cl.sync();  // no block leaves while another may still read its shared memory
    if (wrong) atomicAdd(bad, wrong);
#else
    (void)n;
    (void)rounds;
    (void)bad;
    (void)red;
#endif
}

// Rounds per timed launch: a scheme's µs per round is the difference of the two lengths' times,
// so the launch itself is not counted.
constexpr int R1 = 200, R2 = 1200;

// µs per round of the kernel `start(rounds)` launches (after resetting its own buffers), best of
// five pairs after a warm-up, and the wrong reads it counted into `bad` over them.
template <class Start>
static std::pair<double, unsigned> us_per_round(Start start, unsigned* bad, cudaEvent_t e0, cudaEvent_t e1) {
    auto launch = [&](int rounds) {
        CK(cudaMemset(bad, 0, 4));
        CK(cudaEventRecord(e0));
        start(rounds);
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        CK(cudaGetLastError());
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        unsigned hb;
        CK(cudaMemcpy(&hb, bad, 4, cudaMemcpyDeviceToHost));
        return std::make_pair((double)ms, hb);
    };
    launch(R1);  // warm-up
    double best = 1e30;
    unsigned wrong = 0;
    for (int rep = 0; rep < 5; rep++) {
        const auto a = launch(R1), b = launch(R2);
        best = std::min(best, (b.first - a.first) * 1e3 / (R2 - R1));
        wrong += a.second + b.second;
    }
    return {best, wrong};
}

// The cluster schemes' µs per round for C = 2 .. 16 (sm_90 only; C above 8 where the device
// allows it). Each block asks for more than half an SM's shared memory, so one block runs per SM
// as in the persistent step (left to the occupancy, several would share an SM).
template <int READ>
static void cluster_links(const char* name, int n, int threads, unsigned* bad, const cudaDeviceProp& prop) {
    const size_t one_per_sm = prop.sharedMemPerMultiprocessor / 2 + 1024;
    CK(cudaFuncSetAttribute(cluster_rounds<READ>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    CK(cudaFuncSetAttribute(cluster_rounds<READ>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)one_per_sm));
    const int cs[] = {2, 4, 8, 16};
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int C : cs) {
        if (n % (4 * C)) continue;
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = (unsigned)C;
        attr[0].val.clusterDim.y = 1;
        attr[0].val.clusterDim.z = 1;
        cfg.blockDim = dim3((unsigned)threads);
        cfg.dynamicSmemBytes = std::max(one_per_sm, 2 * (size_t)(n / C) * sizeof(float));
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        cfg.gridDim = dim3((unsigned)C);
        int clusters = 0;
        if (cudaOccupancyMaxActiveClusters(&clusters, cluster_rounds<READ>, &cfg) != cudaSuccess || clusters < 1) {
            (void)cudaGetLastError();
            printf("%s/%-3d: not available on this device\n", name, C);
            continue;
        }
        cfg.gridDim = dim3((unsigned)(clusters * C));
        const auto [best, wrong] = us_per_round(
            [&](int rounds) { CK(cudaLaunchKernelEx(&cfg, cluster_rounds<READ>, n, rounds, bad)); }, bad, e0, e1);
        printf("%s/%-2d: %.3f us per link (%d clusters side by side, %d SMs), wrong reads %u%s\n", name, C, best,
               clusters, clusters * C, wrong, wrong ? "  <-- FAIL" : "");
    }
}

int main(int argc, char** argv) {
    int n = 2560, threads = 384, nap = 0;
    long long cyc = 1200;  // stagger/P: cycles between a poll's issue and the look at its value
    bool stagger_only = false;  // --stagger-only: counter, none, the stagger/P schemes and warprel
    bool cluster_only = false;  // --cluster-only: counter, none and the cluster schemes
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--n") && i + 1 < argc) n = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--nap") && i + 1 < argc) nap = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--cyc") && i + 1 < argc) cyc = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--stagger-only")) stagger_only = true;
        else if (!strcmp(argv[i], "--cluster-only")) cluster_only = true;
        else {
            fprintf(stderr, "usage: %s [--n N] [--threads T] [--nap NS] [--cyc CYCLES] [--stagger-only] [--cluster-only]\n", argv[0]);
            return 2;
        }
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const int P = prop.multiProcessorCount;
    if (n % 4 || n / 2 > 16 * threads) { fprintf(stderr, "--n: a multiple of 4, at most 32 x threads\n"); return 2; }
    float* vec;
    unsigned long long* llvec;
    unsigned *sync, *bad;
    CK(cudaMalloc(&vec, (size_t)R2 * n * 4));
    CK(cudaMalloc(&llvec, (size_t)R2 * n * 8));
    CK(cudaMalloc(&sync, (size_t)R2 * P * 4));
    CK(cudaMalloc(&bad, 4));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    printf("device: %s, %d SMs; vector of %d floats, %d threads per block, poll nap %d ns, stagger cycles %lld\n",
           prop.name, P, n, threads, nap, cyc);
    const char* names[] = {"counter", "flags", "ll", "none", "llc"};
    // The plain schemes, then the split counter with 2 .. 32 words.
    const int gs[] = {2, 4, 8, 16, 32};
    const int ngs = (int)(sizeof gs / sizeof gs[0]);
    // Then the reduction links: all SMs, 64 and 32 contributing (64-bit words), all SMs (32-bit).
    const int reds[] = {P, 64, 32};
    const int nreds = (int)(sizeof reds / sizeof reds[0]);
    // Then the bulk reductions (sm_90): all SMs, 64, 32.
    const int nb = prop.major >= 9 ? nreds : 0;
    // Then the staggered pollers: 1 (thread 0 alone, as counter but relaxed + fence.acquire), 2, 4, 8, 11.
    const int ps[] = {1, 2, 4, 8, 11};
    const int nps = (int)(sizeof ps / sizeof ps[0]);
    CK(cudaFuncSetAttribute(link_rounds<BRED, 16>, cudaFuncAttributeMaxDynamicSharedMemorySize, n * 8));
    const int nstag = 5 + ngs + nreds + 1 + nb;  // the first staggered scheme
    for (int scheme = 0; scheme < nstag + nps + 1; scheme++) {
        const int kind = scheme < 5                    ? scheme
                         : scheme < 5 + ngs            ? COUNTERG
                         : scheme < 5 + ngs + nreds    ? RED
                         : scheme == 5 + ngs + nreds   ? RED32
                         : scheme < nstag              ? BRED
                         : scheme < nstag + nps        ? STAGGER
                                                       : WARPREL;
        const int G = kind == COUNTERG ? gs[scheme - 5]
                      : kind == RED    ? reds[scheme - 5 - ngs]
                      : kind == BRED   ? reds[scheme - 6 - ngs - nreds]
                      : kind == RED32  ? P
                      : kind == STAGGER ? ps[scheme - nstag]
                                       : 1;
        if (kind == STAGGER && G * 32 > threads) continue;
        if (stagger_only && kind != STAGGER && kind != COUNTER && kind != NONE && kind != WARPREL) continue;
        if (cluster_only && kind != COUNTER && kind != NONE) continue;
        auto start = [&](int rounds) {
            CK(cudaMemset(vec, 0, (size_t)R2 * n * 4));
            CK(cudaMemset(llvec, 0, (size_t)R2 * n * 8));
            CK(cudaMemset(sync, 0, (size_t)R2 * P * 4));
            switch (kind) {
            case COUNTER: link_rounds<COUNTER, 16><<<P, threads>>>(vec, llvec, sync, n, rounds, nap, bad); break;
            case FLAGS: link_rounds<FLAGS, 16><<<P, threads>>>(vec, llvec, sync, n, rounds, nap, bad); break;
            case LL: link_rounds<LL, 16><<<P, threads>>>(vec, llvec, sync, n, rounds, nap, bad); break;
            case LLC: link_rounds<LLC, 16><<<P, threads>>>(vec, llvec, sync, n, rounds, nap, bad); break;
            case NONE: link_rounds<NONE, 16><<<P, threads>>>(vec, llvec, sync, n, rounds, nap, bad); break;
            case COUNTERG: link_rounds<COUNTERG, 16><<<P, threads>>>(vec, llvec, sync, n, rounds, nap, bad, G); break;
            case RED: link_rounds<RED, 16><<<P, threads>>>(vec, llvec, sync, n, rounds, nap, bad, G); break;
            case RED32: link_rounds<RED32, 16><<<P, threads>>>(vec, llvec, sync, n, rounds, nap, bad, G); break;
            case WARPREL: link_rounds<WARPREL, 16><<<P, threads>>>(vec, llvec, sync, n, rounds, nap, bad); break;
            case STAGGER: link_rounds<STAGGER, 16><<<P, threads>>>(vec, llvec, sync, n, rounds, nap, bad, G, cyc); break;
            default: link_rounds<BRED, 16><<<P, threads, n * 8>>>(vec, llvec, sync, n, rounds, nap, bad, G); break;
            }
        };
        const auto [best, wrong] = us_per_round(start, bad, e0, e1);
        char name[32];
        if (scheme < 5) snprintf(name, sizeof name, "%s", names[scheme]);
        else if (kind == WARPREL) snprintf(name, sizeof name, "warprel");
        else if (kind == COUNTERG) snprintf(name, sizeof name, "counter/%d", G);
        else if (kind == STAGGER) snprintf(name, sizeof name, "stagger/%d", G);
        else snprintf(name, sizeof name, "%s/%d", kind == RED ? "red" : kind == RED32 ? "red32" : "bred", G);
        printf("%-10s: %.3f us per link, wrong reads %u%s\n", name, best, wrong,
               kind == NONE ? " (unsynchronized: expected)" : wrong ? "  <-- FAIL" : "");
    }
    if (prop.major >= 9) {
        cluster_links<2>("cluster", n, threads, bad, prop);
        cluster_links<1>("cown", n, threads, bad, prop);
        cluster_links<0>("cbar", n, threads, bad, prop);
    }
    return 0;
}
