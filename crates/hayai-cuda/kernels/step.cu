// The whole decode step as one persistent kernel: a grid the GPU holds at once walks the step's
// list of operations (the same GEMVs, attention, per-layer-embedding mix and argmax as the
// launch-per-operation plan), with a grid-wide barrier between operations. What it buys over
// separate launches: each warp streams its share of every GEMV's weights through a ring of
// shared-memory stages with cp.async, independently of the activations, so the weights of the
// next operation are already in flight (or landed) while the grid waits at a barrier, computes
// a norm or runs attention. Weights never depend on the step's data; only the activations do.
//
// Work split of a GEMV: items = (8-row octet, K split); warp w of the grid (W warps in all)
// takes items w, w + W, ... of every GEMV, in plan order. A lane of an octet's quad l of row r
// owns 16-byte chunk l of each 64-byte unit (int4: 128 columns, bf16: 32 columns) as in the
// tiled GEMV, so the per-lane arithmetic is the same; K-split partials stay in [splits][rows] and
// the consumer's prologue adds them in split order after the barrier. int4 scales come in an
// octet layout ([octet][group][8 rows] bf16, 16 bytes per octet and group) so a lane can copy a
// whole batch's scales with one cp.async.
#include "common.cuh"

#define STEP_THREADS 256
#define STEP_WARPS (STEP_THREADS / 32)
#define STEP_U 4  // 16-byte chunks per lane per ring stage
#define STEP_OP_BYTES 256
// Profiling slots per operation: 0 block 0 starts; GEMV prologue (block 0): 1 inputs gathered,
// 2 residual pass done, 3 done; 4 block 0 done; 5 the last block done; attention (block 0's
// first group, first item): 6 query (and fresh key/value) normalized and rotated, 7 tile done.
#define STEP_STAMPS 8

enum StepOpKind {
    STEP_GEMV = 0,
    STEP_ATTN = 1,
    STEP_PLE = 2,
    STEP_ARGMAX1 = 3,
    STEP_ARGMAX2 = 4,
};

struct StepOp {
    int kind;
    int next_gemv;  // index of the next GEMV operation after this one (n_ops: none)
    union {
        GemvParams g;  // GEMV: `scales` in the octet layout, `counters` unused
        AttnParams a;
        PleParams p;
        ArgmaxParams m;
        unsigned char raw[STEP_OP_BYTES - 8];
    };
};
static_assert(sizeof(StepOp) == STEP_OP_BYTES, "StepOp size is mirrored by the host");

struct StepParams {
    const StepOp* ops;
    unsigned long long* barrier;  // {arrivals, released}: monotonic counters (never reset)
    // Profiling (null: off): [n_ops][STEP_STAMPS] ns, see the slots below.
    unsigned long long* timing;
    int n_ops;
    int first_gemv;
    int x_floats;  // shared floats before the ring: GEMV input x, or attention scratch
};



// Grid-wide barrier: every block adds one arrival (release); the block whose arrival completes
// the count publishes it in a second word that the others poll (acquire) with a short sleep, so
// the arrivals do not queue behind a crowd of polling loads on the same line. Both words only
// grow: a launch adds exactly (n_ops - 1) * gridDim.x, and `base` (the count when the launch
// began) is recovered by every block from whatever it first reads, since no barrier of this
// launch can complete before every block has arrived (see step_body).
// `next` (threads 0..15: one 16-byte piece each of the next operation's record, requested
// before the barrier so its latency hides behind the wait) is stored into `stage` before the
// barrier's closing __syncthreads.
__device__ __forceinline__ void step_grid_sync(unsigned long long* bar, unsigned long long target,
                                               uint4 next, uint4* stage) {
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned long long old;
        asm volatile("atom.add.acq_rel.gpu.u64 %0, [%1], 1;" : "=l"(old) : "l"(bar) : "memory");
        if (old + 1 == target) {
            asm volatile("st.release.gpu.u64 [%0], %1;" ::"l"(bar + 1), "l"(target) : "memory");
        } else {
            unsigned long long seen;
            for (;;) {
                asm volatile("ld.acquire.gpu.u64 %0, [%1];" : "=l"(seen) : "l"(bar + 1) : "memory");
                if (seen >= target) break;
                __nanosleep(40);
            }
        }
    }
    if (threadIdx.x < STEP_OP_BYTES / 16) stage[threadIdx.x] = next;
    __syncthreads();
}

__device__ __forceinline__ int gemv_units(const GemvParams& g) {
    return g.int4 ? (g.cols >> 7) : (g.cols >> 5);
}

// A warp's position in the step's stream of GEMV weights, with the shape of the GEMV it is in
// kept in registers (the operation list is read once per GEMV, not per request).
struct StepCursor {
    int op;    // GEMV operation (n_ops: the stream is finished)
    int item;  // item of that operation
    int g;     // next unit to request
    int u1;    // end of the item's units
    const uint8_t* w;
    const uint4* sc;  // octet-layout scales (int4), else null
    int rows, row_bytes, groups, splits, per, items, units;
};

__device__ void step_cursor_op(const StepParams& P, StepCursor& c) {
    const GemvParams& g = P.ops[c.op].g;
    c.units = gemv_units(g);
    c.w = (const uint8_t*)g.w;
    c.sc = g.int4 ? (const uint4*)g.scales : nullptr;
    c.rows = g.rows;
    c.row_bytes = g.int4 ? (g.cols >> 1) : (g.cols << 1);
    c.groups = g.cols >> 7;
    c.splits = g.splits;
    c.per = (c.units + g.splits - 1) / g.splits;
    c.items = ((g.rows + 7) >> 3) * g.splits;
}

// Moves the cursor to the first non-empty item at or after (op, item) for warp `gw`.
__device__ void step_settle(const StepParams& P, StepCursor& c, int gw, int W) {
    while (c.op < P.n_ops) {
        while (c.item < c.items) {
            c.g = (c.item % c.splits) * c.per;
            c.u1 = min(c.units, c.g + c.per);
            if (c.g < c.u1) return;
            c.item += W;
        }
        c.op = P.ops[c.op].next_gemv;
        c.item = gw;
        if (c.op < P.n_ops) step_cursor_op(P, c);
    }
}

// Requests the cursor's next batch (up to STEP_U units of one item) into a ring stage and
// advances; commits a cp.async group in every case so group counting stays uniform.
// The cursor lives in shared memory (one per warp, lane-uniform): it is touched once per batch,
// and registers are scarce. Every lane works on a copy; lane 0 writes it back.
__device__ __forceinline__ void step_issue(const StepParams& P, StepCursor& cs, uint4* stage,
                                           uint4* sstage, int lane, int gw, int W) {
    StepCursor c = cs;
    if (c.op < P.n_ops) {
        const int oct = c.item / c.splits;
        const int row = min(oct * 8 + (lane >> 2), c.rows - 1);
        const uint4* wrow = (const uint4*)(c.w + (size_t)row * c.row_bytes) + (lane & 3);
#pragma unroll
        for (int u = 0; u < STEP_U; u++)
            if (c.g + u < c.u1) cp_async16(stage + u * 32 + lane, wrow + (size_t)(c.g + u) * 4);
        if (c.sc && lane < STEP_U && c.g + lane < c.u1)
            cp_async16(sstage + lane, c.sc + (size_t)oct * c.groups + c.g + lane);
        c.g += STEP_U;
        if (c.g >= c.u1) {
            c.item += W;
            step_settle(P, c, gw, W);
        }
        __syncwarp();
        if (lane == 0) cs = c;
        __syncwarp();
    }
    cp_async_commit();
}

template <int S>
__device__ void step_gemv(const StepParams& P, int k, const GemvParams& g, float* xs, float* red,
                          StepCursor& cur, int& cons, uint4* ring, uint4* sring, int gw, int W) {
    const int lane = threadIdx.x & 31, quad = lane >> 2, l = lane & 3;
    // The shape read once into registers (the cp.async statements are memory clobbers).
    const int units = gemv_units(g);
    const int rows = g.rows, splits = g.splits;
    const bool int4 = g.int4 != 0;
    float* const out = g.out;
    const int items = ((rows + 7) >> 3) * splits;
    const int per = (units + splits - 1) / splits;
    if (blockIdx.x * STEP_WARPS >= items) return;  // no item for any warp of this block
    unsigned long long* stamps = P.timing ? P.timing + STEP_STAMPS * k : nullptr;
    gemv_prologue<true>(g, xs, red, int4, stamps);
    stamp_at(stamps, 3);
    const uint32_t magic = 0x4B000000u;
    for (int item = gw; item < items; item += W) {
        const int oct = item / splits, s = item % splits;
        const int u0 = s * per, u1 = min(units, u0 + per);
        const int row0 = oct * 8 + quad;
        float acc = 0.f;
        for (int gg = u0; gg < u1; gg += STEP_U) {
            cp_async_wait<S - 2>();  // this lane's copies of the oldest stage have landed
            __syncwarp();            // ... and every lane's (scales), and the stage before is free
            const int fill = (cons + S - 1) % S;
            step_issue(P, cur, ring + fill * STEP_U * 32, sring + fill * STEP_U, lane, gw, W);
            const int slot = cons % S;
            const uint4* st = ring + slot * STEP_U * 32;
            const uint16_t* ss = (const uint16_t*)(sring + slot * STEP_U);
#pragma unroll
            for (int u = 0; u < STEP_U; u++) {
                if (gg + u < u1) {
                    const uint4 w = st[u * 32 + lane];
                    if (int4) {
                        acc = fmaf(dot_group_int4(w, (const float4*)(xs + (gg + u) * 128 + 4 * l), magic),
                                   bf16_to_f32(ss[u * 8 + quad]), acc);
                    } else {
                        acc += dot_chunk_bf16(w, (const float4*)(xs + (gg + u) * 32 + 8 * l));
                    }
                }
            }
            cons++;
        }
        acc += __shfl_xor_sync(HAYAI_FULL_MASK, acc, 1);
        acc += __shfl_xor_sync(HAYAI_FULL_MASK, acc, 2);
        if (row0 < rows && l == 0) out[(size_t)s * rows + row0] = acc;
    }
}

// Per-layer-embedding mix (ple_combine) for virtual blocks = layers, `dim` <= STEP_THREADS.
// G: the threads that run it (the block, or the streamed step's consumer warps).
template <class G = BlockThreads>
__device__ void step_ple(const PleParams& p, int n_layers, float* red, G g = G()) {
    for (int b = blockIdx.x; b < n_layers; b += gridDim.x) {
        const int t = g.t();
        const bool on = t < p.dim;
        const int j = b * p.dim + t;
        float c = 0.f;
        if (on) {
            for (int s = 0; s < p.splits; s++) c += p.ctx[(size_t)s * p.ld + j];
            c *= p.ctx_scale;
        }
        // Threads beyond dim add zeros: the same sum as a block of `dim` threads (warp sums in
        // the same order, zero partial sums of whole idle warps at the end).
        const float tot = group_sum(on ? c * c : 0.f, red, g);
        if (on) {
            c = c * rsqrtf(tot / (float)p.dim + p.eps) * p.norm_w[t];
            const size_t row = (size_t)(*p.tok) * ((size_t)n_layers * p.dim);
            const float e = bf16_to_f32(p.table[row + j]) * p.tok_scale;
            p.out[j] = (c + e) * p.mix_scale;
        }
        g.sync();
    }
}

// The greedy token's two stages as operations of a persistent step (argmax_stage1/2 of
// sample.cu), run by NT threads as the group `g` (the block, or the streamed step's consumer
// warps). Stage 1 softcaps the logits in place and leaves each of `m.blocks` virtual blocks'
// best (value, index); stage 2, on block 0, reduces them and writes the token.
template <int NT, class G = BlockThreads>
__device__ void step_argmax1(const ArgmaxParams& m, G g = G()) {
    for (int b = blockIdx.x; b < m.blocks; b += gridDim.x) {
        float bv = -INFINITY;
        int bi = 0x7fffffff;
        for (int i = b * NT + threadIdx.x; i < m.n; i += m.blocks * NT) argmax_take(m, i, bv, bi);
        block_argmax(bv, bi, g);
        if (threadIdx.x == 0) {
            m.blk_val[b] = bv;
            m.blk_idx[b] = bi;
        }
        g.sync();
    }
}
template <int NT, class G = BlockThreads>
__device__ void step_argmax2(const ArgmaxParams& m, G g = G()) {
    if (blockIdx.x == 0) {
        float bv = -INFINITY;
        int bi = 0x7fffffff;
        const int blocks = m.own ? gridDim.x : m.blocks;
        for (int i = threadIdx.x; i < blocks; i += NT) better(bv, bi, m.blk_val[i], m.blk_idx[i]);
        block_argmax(bv, bi, g);
        if (threadIdx.x == 0) emit_token(m, bi == 0x7fffffff ? 0 : bi);
    }
}

template <int S>
__device__ void step_body(const StepParams& P) {
    extern __shared__ __align__(16) float step_smem[];
    __shared__ float red[32];
    __shared__ unsigned long long bar_base;
    __shared__ uint4 op_stage[2][STEP_OP_BYTES / 16];  // this operation's record and the next's
    __shared__ StepCursor cursors[STEP_WARPS];
    float* xs = step_smem;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int W = gridDim.x * STEP_WARPS, gw = blockIdx.x * STEP_WARPS + warp;
    uint4* ring = (uint4*)(step_smem + P.x_floats) + warp * S * STEP_U * 32;
    uint4* sring = (uint4*)(step_smem + P.x_floats) + STEP_WARPS * S * STEP_U * 32 + warp * S * STEP_U;
    StepCursor& cur = cursors[warp];
    const bool loader = threadIdx.x < STEP_OP_BYTES / 16;

    // Every block reads the counter before its first arrival; the launch's barriers need every
    // block, so what it reads is base + (arrivals of faster blocks at barrier 0) < base + grid.
    const unsigned long long period = (unsigned long long)(P.n_ops - 1) * gridDim.x;
    if (threadIdx.x == 0 && period > 0) {
        unsigned long long v;
        asm volatile("ld.relaxed.gpu.u64 %0, [%1];" : "=l"(v) : "l"(P.barrier) : "memory");
        bar_base = v - v % period;
    }
    if (loader) op_stage[0][threadIdx.x] = ((const uint4*)P.ops)[threadIdx.x];

    // The first S - 1 stages of this warp's weight stream.
    if (lane == 0) {
        StepCursor c;
        c.op = P.first_gemv;
        c.item = gw;
        if (c.op < P.n_ops) step_cursor_op(P, c);
        step_settle(P, c, gw, W);
        cur = c;
    }
    __syncwarp();
#pragma unroll
    for (int i = 0; i < S - 1; i++) step_issue(P, cur, ring + i * STEP_U * 32, sring + i * STEP_U, lane, gw, W);
    int cons = 0;
    __syncthreads();

    for (int k = 0; k < P.n_ops; k++) {
        if (k > 0) {
            // Request the next record before the barrier; stored in the stage after it.
            uint4 next = make_uint4(0, 0, 0, 0);
            if (loader && k + 1 < P.n_ops) next = ((const uint4*)(P.ops + k + 1))[threadIdx.x];
            if (P.timing && threadIdx.x == 0) atomicMax(P.timing + STEP_STAMPS * (k - 1) + 5, global_ns());
            step_grid_sync(P.barrier, bar_base + (unsigned long long)k * gridDim.x, next,
                           op_stage[(k + 1) & 1]);
        } else {
            if (loader && P.n_ops > 1) op_stage[1][threadIdx.x] = ((const uint4*)(P.ops + 1))[threadIdx.x];
            __syncthreads();
        }
        const StepOp& op = *(const StepOp*)op_stage[k & 1];
        unsigned long long* stamps = P.timing ? P.timing + STEP_STAMPS * k : nullptr;
        stamp_at(stamps, 0);
        const int kind = op.kind;
        if (kind == STEP_GEMV) {
            step_gemv<S>(P, k, op.g, xs, red, cur, cons, ring, sring, gw, W);
        } else if (kind == STEP_ATTN) {
            AttnSmem& sm = ((AttnSmem*)xs)[threadIdx.x >> 7];
            const GroupThreads gt{1 + (int)(threadIdx.x >> 7)};
            const int n_items = op.a.splits * op.a.nh;
            for (int it = blockIdx.x * 2 + (threadIdx.x >> 7); it < n_items; it += gridDim.x * 2) {
                gt.sync();  // the group's previous item is done with its shared memory
                // Stamps from block 0's first group, first item (its thread 0 is the block's).
                attn_item<GroupThreads, 2, 4>(op.a, it % op.a.splits, it / op.a.splits, sm, gt,
                                              it == 0 ? stamps : nullptr);
            }
        } else if (kind == STEP_PLE) {
            // ld = the projection's rows = n_layers * dim.
            step_ple(op.p, op.p.ld / op.p.dim, red);
        } else if (kind == STEP_ARGMAX1) {
            step_argmax1<STEP_THREADS>(op.m);
        } else if (kind == STEP_ARGMAX2) {
            step_argmax2<STEP_THREADS>(op.m);
        }
        stamp_at(stamps, 4);
    }
    if (P.timing && threadIdx.x == 0) atomicMax(P.timing + STEP_STAMPS * (P.n_ops - 1) + 5, global_ns());
    cp_async_wait<0>();
}

// S = ring stages per warp (S - 1 batches in flight), one block per SM. The shallow ring is the
// default everywhere (measured faster on the H200, docs/performance.md: deeper prefetch queues
// the latency-bound loads of norms and attention behind the weight stream); the deep one is
// kept for measurements (HAYAI_STEP_STAGES=6).
extern "C" __global__ void __launch_bounds__(STEP_THREADS, 1) decode_step_s6(const StepParams P) {
    step_body<6>(P);
}
extern "C" __global__ void __launch_bounds__(STEP_THREADS) decode_step_s3(const StepParams P) {
    step_body<3>(P);
}
