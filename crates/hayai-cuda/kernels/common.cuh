// Shared helpers for the hayai kernels. Activations are f32 everywhere (they are a few KB per
// step); weights are bf16 or int4. Every kernel is `extern "C"` so the host finds it by name.
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

#define HAYAI_FULL_MASK 0xffffffffu

__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ float bf16_to_f32(uint16_t b) {
    return __uint_as_float(((uint32_t)b) << 16);
}

// Round to nearest even.
__device__ __forceinline__ uint16_t f32_to_bf16_bits(float v) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(HAYAI_FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(HAYAI_FULL_MASK, v, o));
    return v;
}

// Sum over the block; every thread gets the result. `scratch` holds >= 32 floats.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nwarps = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float t = 0.f;
    for (int i = 0; i < nwarps; i++) t += scratch[i];
    return t;
}

// The threads that run a piece of work together: a whole block, or a 128-thread group of one
// (the persistent decode step runs two attention items per block) with its own named barrier.
struct BlockThreads {
    __device__ __forceinline__ int t() const { return threadIdx.x; }
    __device__ __forceinline__ int n() const { return blockDim.x; }
    // As threadIdx.x / blockDim.x are typed (unsigned): loops written with them keep their code.
    __device__ __forceinline__ unsigned tu() const { return threadIdx.x; }
    __device__ __forceinline__ unsigned nu() const { return blockDim.x; }
    __device__ __forceinline__ void sync() const { __syncthreads(); }
};

struct GroupThreads {
    int id;  // named barrier 1.. (0 is __syncthreads)
    __device__ __forceinline__ int t() const { return threadIdx.x & 127; }
    __device__ __forceinline__ int n() const { return 128; }
    __device__ __forceinline__ unsigned tu() const { return threadIdx.x & 127; }
    __device__ __forceinline__ unsigned nu() const { return 128; }
    __device__ __forceinline__ void sync() const {
        asm volatile("bar.sync %0, 128;" ::"r"(id) : "memory");
    }
};

// Sum over the threads of `g`; every thread gets the result. `scratch` holds >= 32 floats. A
// whole block takes block_sum itself (written alike, the template compiled to other code).
__device__ __forceinline__ float group_sum(float v, float* scratch, BlockThreads) { return block_sum(v, scratch); }
template <class G>
__device__ __forceinline__ float group_sum(float v, float* scratch, G g) {
    const int lane = g.t() & 31, warp = g.t() >> 5;
    const int nwarps = (g.n() + 31) >> 5;
    v = warp_sum(v);
    g.sync();
    if (lane == 0) scratch[warp] = v;
    g.sync();
    float t = 0.f;
    for (int i = 0; i < nwarps; i++) t += scratch[i];
    return t;
}

// tanh-approximated GELU (gelu_pytorch_tanh), in f32.
__device__ __forceinline__ float gelu_tanh(float x) {
    const float k = 0.7978845608028654f;  // sqrt(2/pi)
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

// D += A B on tensor cores, m16n8k16, bf16 inputs, f32 accumulators (sm_80+). Fragments as the
// PTX ISA lays them out: lane = 4 g + c holds A rows g, g + 8 and k pairs 2c, 2c + 8; B k pairs
// 2c, 2c + 8 of column g; D rows g, g + 8 and columns 2c, 2c + 1.
__device__ __forceinline__ void mma_bf16(float* d, const uint32_t* a, const uint32_t* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// D += A B on the integer tensor cores, m16n8k32, u8 A (row) x s8 B (col), s32 accumulators
// (sm_80+): lane 4 g + c holds A rows g (a0, a2) and g + 8 (a1, a3) at k slots 4c..4c+3 (a0,
// a1) and 16+4c.. (a2, a3); B slots 4c..4c+3 (b0) and 16+4c.. (b1) of column g; D as mma_bf16.
__device__ __forceinline__ void mma_u8s8(int* d, const uint32_t* a, const uint32_t* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Asynchronous 16-byte global -> shared copies (sm_80+), completed per thread by cp_async_wait.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
// The same with the source's bytes counted: `live` false copies nothing and zero-fills the 16
// bytes (the address must still be a valid one).
__device__ __forceinline__ void cp_async16_zfill(void* smem, const void* gmem, bool live) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(live ? 16 : 0)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Whether the shared-memory mbarrier `bar` has completed the phase of parity `parity`.
__device__ __forceinline__ bool mbar_done(uint64_t* bar, unsigned parity) {
    unsigned ok;
    asm volatile("{ .reg .pred p; mbarrier.test_wait.parity.shared.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(ok)
                 : "r"((unsigned)__cvta_generic_to_shared(bar)), "r"(parity)
                 : "memory");
    return ok != 0;
}

// Nanoseconds of the GPU's global timer (profiling stamps).
__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}

// Profiling stamp: thread 0 of block 0 writes the time into slot `i` of `stamps` (if set).
__device__ __forceinline__ void stamp_at(unsigned long long* stamps, int i) {
    if (stamps && blockIdx.x == 0 && threadIdx.x == 0) stamps[i] = global_ns();
}

// Weights of a later kernel of the step, pulled into L2 while this kernel runs (pointer null:
// nothing). The host fills it from the launch plan (`CudaOptions::l2_prefetch`): at batch 1 the
// step is a chain of short dependent kernels, and DRAM sits idle between one kernel's weight
// loads and the next's unless someone asks for those bytes early. Weights never change during a
// step, so this may run before pdl_wait.
struct L2Prefetch {
    const char* p[2];
    long long bytes[2];
};

// This block's share (of `nblocks`) of both ranges, one prefetch per 128-byte line.
__device__ __forceinline__ void l2_prefetch(const L2Prefetch& pf, int block, int nblocks) {
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (!pf.p[r]) continue;
        const long long lines = (pf.bytes[r] + 127) >> 7;
        const long long l1 = lines * (block + 1) / nblocks;
        for (long long i = lines * block / nblocks + threadIdx.x; i < l1; i += blockDim.x)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(pf.p[r] + (i << 7)));
    }
}

// Streaming 16-byte load of weights that are read once per step.
__device__ __forceinline__ uint4 ld_stream(const uint4* p) { return __ldcs(p); }

// Programmatic dependent launch (sm_90+, where the host launches the decode kernels with
// programmatic stream serialization). Every kernel calls pdl_launch_dependents right after its
// wait, so the next kernel's blocks can be scheduled (and request their weights) while this one
// runs, but no kernel further ahead: a trigger before the wait let whole chains of future
// kernels occupy the GPU and measured slower. Every thread calls pdl_wait
// before it reads anything an earlier kernel of the step writes (activations, partials,
// counters, KV cache, step_io, logits) and before its first global write. pdl_wait returns once
// the previous kernel has completed and its writes are visible; since every kernel waits before
// it finishes, that kernel's completion implies all earlier ones'. Before the wait only constant
// data (weights, scales, norm weights, inv_freq, tables) may be read. Below sm_90 both are
// no-ops and launches are plainly stream-ordered.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
#endif
}

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
