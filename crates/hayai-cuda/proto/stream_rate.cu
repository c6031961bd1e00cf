// How fast can one persistent block per SM stream its own contiguous share of a large buffer into
// shared memory? The streamed-step prototype (stream_step.cu) measured 2.9 TB/s for its weight
// stream however deep its ring, against 4.4-4.5 TB/s for a grid-stride read of the same size.
// This isolates the copy engine from the prototype's consumers: no computation, no activations,
// each configuration streams the same bytes (E4B's 2.395 GB step by default) and prints TB/s.
//
//   bulk  : one thread issues 1-D bulk copies (TMA, sm_90) of CHUNK bytes into a ring of SLOTS
//           slots and re-issues a slot as soon as its copy has landed (mbarrier parity wait);
//           BLOCKS_PER_SM blocks share an SM's stream by chunk.
//   ldg   : every thread of the block reads its SM's stream with 16-byte loads, U in flight.
//   grid  : the grid-stride read (the reference).
//   and the prototype's own chunks (16 cells of 1,056 bytes) from sources 0-1,056 bytes off a
//   128-byte boundary.
//
// Usage (GPU machine): nvcc -O3 -std=c++17 -arch=sm_90 -o /tmp/sr stream_rate.cu && /tmp/sr [GB]
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "proto.cuh"

// One SM's share: [base, base + bytes) of the buffer, SM s = blockIdx.x / per_sm; the blocks of
// an SM take its chunks round robin. Each block keeps `slots` copies of `chunk` bytes in flight.
__global__ void bulk_stream(const unsigned char* buf, size_t share, int per_sm, unsigned chunk, int slots,
                            unsigned* sink, unsigned offset) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ uint64_t full[32];
    const int s = blockIdx.x / per_sm, b = blockIdx.x % per_sm;
    const unsigned char* src = buf + (size_t)s * share + offset;  // offset: source alignment
    const size_t nch = (share - offset) / chunk;
    if (threadIdx.x != 0) return;
    for (int i = 0; i < slots; i++)
        asm volatile("mbarrier.init.shared.b64 [%0], 1;" ::"r"(smem_u32(&full[i])) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    size_t issued = 0;  // this block's chunks issued
    auto issue = [&](size_t c, int slot) {
        asm volatile("{ .reg .b64 st; mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1; }" ::"r"(
                         smem_u32(&full[slot])),
                     "r"(chunk)
                     : "memory");
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                smem_u32(smem + (size_t)slot * chunk)),
            "l"(src + c * chunk), "r"(chunk), "r"(smem_u32(&full[slot]))
            : "memory");
    };
    size_t c = b;
    for (int i = 0; i < slots && c < nch; i++, c += per_sm) issue(c, i), issued++;
    unsigned acc = 0;
    for (size_t k = 0; k < issued; k++) {
        const int slot = (int)(k % slots);
        const unsigned parity = (unsigned)((k / slots) & 1);
        unsigned ok = 0;
        while (!ok)
            asm volatile(
                "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                : "=r"(ok)
                : "r"(smem_u32(&full[slot])), "r"(parity)
                : "memory");
        acc += smem[(size_t)slot * chunk];
        if (c < nch) {
            issue(c, slot);
            issued++;
            c += per_sm;
        }
    }
    if (acc == 0xdeadbeefu) *sink = acc;
#endif
}

// Every thread reads 16-byte words of its SM's share, U loads in flight per thread.
template <int U>
__global__ void ldg_stream(const uint4* buf, size_t share16, int per_sm, unsigned* sink) {
    const int s = blockIdx.x / per_sm, b = blockIdx.x % per_sm;
    const uint4* src = buf + (size_t)s * share16;
    const size_t stride = (size_t)blockDim.x * per_sm;
    uint4 a = make_uint4(0, 0, 0, 0);
    size_t i = (size_t)b * blockDim.x + threadIdx.x;
    for (; i + (U - 1) * stride < share16; i += U * stride) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; u++) v[u] = __ldcs(src + i + u * stride);
#pragma unroll
        for (int u = 0; u < U; u++) a.x ^= v[u].x, a.y ^= v[u].y, a.z ^= v[u].z, a.w ^= v[u].w;
    }
    if ((a.x ^ a.y ^ a.z ^ a.w) == 0x12345678u) *sink = a.x;
}

__global__ void grid_read(const uint4* p, size_t n, unsigned* sink) {
    uint4 a = make_uint4(0, 0, 0, 0);
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint4 v = __ldcs(p + i);
        a.x ^= v.x, a.y ^= v.y, a.z ^= v.z, a.w ^= v.w;
    }
    if ((a.x ^ a.y ^ a.z ^ a.w) == 0x12345678u) *sink = a.x;
}

template <class F>
static double time_ms(F launch) {
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    launch();
    CK(cudaDeviceSynchronize());
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        cudaEventRecord(a);
        launch();
        cudaEventRecord(b);
        CK(cudaEventSynchronize(b));
        float ms;
        cudaEventElapsedTime(&ms, a, b);
        if (ms < best) best = ms;
    }
    CK(cudaGetLastError());
    return best;
}

int main(int argc, char** argv) {
    const double gb = argc > 1 ? atof(argv[1]) : 2.395;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const int P = prop.multiProcessorCount;
    // Each SM's share a multiple of 64 KB (every chunk size below divides it).
    const size_t share = ((size_t)(gb * 1e9 / P) >> 16) << 16;
    const size_t bytes = share * P;
    unsigned char* buf;
    unsigned* sink;
    CK(cudaMalloc(&buf, bytes));
    CK(cudaMalloc(&sink, 64));
    CK(cudaMemset(buf, 1, bytes));
    printf("device %s, %d SMs; %.3f GB, %zu KB per SM\n", prop.name, P, bytes / 1e9, share >> 10);
    auto tbs = [&](double ms) { return bytes / (ms * 1e-3) / 1e12; };
    printf("grid-stride read, %d x 1024 threads: %.2f TB/s\n", 4 * P,
           tbs(time_ms([&] { grid_read<<<4 * P, 1024>>>((const uint4*)buf, bytes / 16, sink); })));
    for (int per_sm : {1, 2})
        for (int threads : {256, 512, 1024}) {
            if (per_sm * threads > 2048) continue;
            printf("ldg per-SM share, %d block(s) x %d threads, U=4: %.2f TB/s; U=8: %.2f TB/s\n", per_sm,
                   threads,
                   tbs(time_ms([&] { ldg_stream<4><<<P * per_sm, threads>>>((const uint4*)buf, share / 16, per_sm, sink); })),
                   tbs(time_ms([&] { ldg_stream<8><<<P * per_sm, threads>>>((const uint4*)buf, share / 16, per_sm, sink); })));
        }
    if (prop.major >= 9) {
        const unsigned chunks[] = {4096, 8192, 16384, 32768};
        for (int per_sm : {1, 2, 4})
            for (unsigned chunk : chunks)
                for (int slots : {2, 4, 8, 16}) {
                    const size_t sm = (size_t)chunk * slots;
                    if (sm * per_sm > 220 * 1024 || slots > 32) continue;
                    CK(cudaFuncSetAttribute(bulk_stream, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
                    const double ms =
                        time_ms([&] { bulk_stream<<<P * per_sm, 32, sm>>>(buf, share, per_sm, chunk, slots, sink, 0); });
                    printf("bulk: %d block(s)/SM, chunk %2u KB x %2d slots (%3zu KB in flight per SM): %.2f TB/s\n",
                           per_sm, chunk >> 10, slots, sm * per_sm >> 10, tbs(ms));
                }
        // The streamed-step prototype's chunks: 16 cells of 1,056 bytes, sources 32-byte aligned.
        for (unsigned offset : {0u, 32u, 64u, 96u, 1056u})
            for (int slots : {4, 8, 11}) {
                const unsigned chunk = 16 * 1056;
                const size_t sm = (size_t)chunk * slots;
                CK(cudaFuncSetAttribute(bulk_stream, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
                const double ms =
                    time_ms([&] { bulk_stream<<<P, 32, sm>>>(buf, share, 1, chunk, slots, sink, offset); });
                printf("bulk: chunk 16 x 1056 B x %2d slots, source offset %4u B: %.2f TB/s\n", slots, offset,
                       (double)((share - offset) / chunk * chunk) * P / (ms * 1e-3) / 1e12);
            }
    }
    return 0;
}
