// Final logit softcap and a two-stage argmax (lowest index wins ties, NaN never wins), so only
// the token id leaves the device.
#include "common.cuh"

struct ArgmaxParams {
    float* logits;    // [n] (softcapped in place)
    float* blk_val;   // [blocks]
    int* blk_idx;     // [blocks]
    int* step_io;     // [tok, pos]: stage 2 stores the argmax as the next input, pos += 1
    int* out_tok;     // [1]
    int* host_tok;    // [2] mapped host memory, or null: the token also goes to slot pos & 1
    int n, blocks;
    float softcap;    // 0: none
    int own;          // streamed step: stage 1 over each SM's own lm_head rows, stage 2 over
                      // gridDim.x results (kernels/stream_step.cu ss_argmax_own)
};

__device__ __forceinline__ void better(float& bv, int& bi, float v, int i) {
    // v > bv is false for NaN, so NaN never wins; equal values keep the lower index.
    if (v > bv || (v == bv && i < bi)) {
        bv = v;
        bi = i;
    }
}

// Logit i softcapped in place and taken into the running best (every first stage's step).
__device__ __forceinline__ void argmax_take(const ArgmaxParams& p, int i, float& bv, int& bi) {
    float v = p.logits[i];
    if (p.softcap > 0.f) {
        v = p.softcap * tanhf(v / p.softcap);
        p.logits[i] = v;
    }
    better(bv, bi, v, i);
}

// G: the threads that run it (the block, or the streamed step's consumer warps).
template <class G = BlockThreads>
__device__ void block_argmax(float& bv, int& bi, G g = G()) {
    __shared__ float sv[32];
    __shared__ int si[32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(HAYAI_FULL_MASK, bv, o);
        int oi = __shfl_xor_sync(HAYAI_FULL_MASK, bi, o);
        better(bv, bi, ov, oi);
    }
    const int lane = g.tu() & 31, warp = g.tu() >> 5;
    if (lane == 0) {
        sv[warp] = bv;
        si[warp] = bi;
    }
    g.sync();
    if (warp == 0) {
        const int nw = g.nu() >> 5;
        bv = lane < nw ? sv[lane] : -INFINITY;
        bi = lane < nw ? si[lane] : 0x7fffffff;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(HAYAI_FULL_MASK, bv, o);
            int oi = __shfl_xor_sync(HAYAI_FULL_MASK, bi, o);
            better(bv, bi, ov, oi);
        }
    }
}

extern "C" __global__ void argmax_stage1(const ArgmaxParams p) {
    pdl_wait();  // the logits come from the lm_head GEMV
    pdl_launch_dependents();
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += gridDim.x * blockDim.x) argmax_take(p, i, bv, bi);
    block_argmax(bv, bi);
    if (threadIdx.x == 0) {
        p.blk_val[blockIdx.x] = bv;
        p.blk_idx[blockIdx.x] = bi;
    }
}

// The step's token out: the next step's input (step_io), `out_tok`, and the host's slot. The
// host clears slot pos & 1 before it queues the step and spins on it (runner: greedy_decode),
// so no copy or event sits between two steps; the volatile store goes straight to the host
// (system scope), not held in this GPU's caches.
__device__ __forceinline__ void emit_token(const ArgmaxParams& p, int tok) {
    const int pos = p.step_io[1];
    *p.out_tok = tok;
    p.step_io[0] = tok;
    p.step_io[1] = pos + 1;
    if (p.host_tok) *(volatile int*)(p.host_tok + (pos & 1)) = tok;
}

// One block over the stage-1 results.
extern "C" __global__ void argmax_stage2(const ArgmaxParams p) {
    pdl_wait();
    pdl_launch_dependents();
    const int blocks = p.blocks;
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < blocks; i += blockDim.x) better(bv, bi, p.blk_val[i], p.blk_idx[i]);
    block_argmax(bv, bi);
    if (threadIdx.x == 0) emit_token(p, bi == 0x7fffffff ? 0 : bi);
}
