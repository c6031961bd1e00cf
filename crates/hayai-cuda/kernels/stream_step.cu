// The streamed decode step (docs/streamed-step.md): the whole step as one persistent kernel, one
// block per SM, whose GEMV weights are not read by the consumers from the matrices but streamed
// into a shared-memory ring by one producer warp per SM, from a per-SM stream the host laid out
// at load (src/stream_layout.rs: each SM's cells of every GEMV in the order its warps take them).
// The producer never waits for activations, so an operation's weights are in flight (or landed)
// while the SM waits for its input; the consumer warps (SS_NW) run the operations of the
// single-kernel step's list (kernels/step.cu: the same records, prologues, per-layer embedding
// mix and argmax; attention its own way, ssa_op below), an operation starting once every SM has
// published the one before.
//
// GEMVs are int4 with int8 activations (W4A8, the CPU twin's MatmulInputs::Int8: x quantized per
// 128 columns, q = round(x * 127 / max|x|)) on the integer tensor cores: a cell is one 16-row
// tile's 128-column group (1,024 bytes of nibbles in the m16n8k32 fragment order, then the 16
// rows' bf16 scales). A GEMV's rows are cut into units (a tile's K slice; `splits` slices), each
// SM taking a contiguous range of units (`SmShare`, from the host) in passes of up to SS_NW
// units, kw warps per unit when it has fewer units than warps; the slices' partial vectors
// [splits][rows] are added in slice order by the consumer's prologue, so no result depends on
// the schedule.
//
// The ring: SS_CH cells per chunk, NCH chunks. Only the producer waits on the copies' mbarriers
// (sm_90: one bulk copy per chunk; sm_80-89: cp.async by its 32 lanes); it publishes how many
// chunks have landed in a shared word, each consumer warp how many it is done with in its own,
// and a slot is refilled once every warp has passed it. The producer holds its copies while an
// operation publishes (the output stores otherwise queue behind the stream; held on through the
// next operation's wait, or its prologue too, it measured 1.5-2.4% slower: twenty-eighth
// session) and on sm_90 pulls the next chunks into L2 while the ring is full. Measured in the prototype
// (proto/stream_step.cu, docs/performance.md, tenth session).
#include "common.cuh"

// 11 consumer warps + the producer: 12 warps, 3 per SM sub-partition, so each thread may hold 168
// registers (13 warps put 4 on one sub-partition: 128, and the kernel spilled; measured: 12
// consumer warps 355.8 tok/s, 11 425.5, same attention code).
// -DSS_NW=N: a measurement build of N consumer warps (build.rs hands N to the host, runner/launch.rs
// STREAM_WARPS). 15 (16 warps, 128 registers) measured 543.8-544.1 against 570.9-571.9 tok/s:
// an SM's cells are no faster with more warps (docs/performance.md, twenty-sixth session).
#ifndef SS_NW
#define SS_NW 11                        // consumer warps
#endif
#define SS_THREADS ((SS_NW + 1) * 32)   // + the producer warp
#define SS_CELL_BYTES 1056
#define SS_CELL_U4 (SS_CELL_BYTES / 16)
// bf16 cells (the W16 kernels, decode_stream_w16_r*): 16 rows x 64 columns in the m16n8k16 A
// order (stream_layout.rs `CellFormat::Bf16`), 2,048 bytes, 32-KB chunks (the prototype's best
// for bf16: 16 cells a chunk against 8, docs/performance.md, tenth session).
#define SS_W16_U4 (2048 / 16)
// The cell formats a kernel is compiled for (stream_body's FMT): int4 cells times int8 x (W4A8,
// --quant int4-a8), bf16 cells times float x (--quant bf16), int4 cells times x as a 23-bit fixed
// point per 128 columns on the integer tensor cores (W4A16, --quant int4: each x within 2^-22 of
// its group's largest |x|; docs/decisions.md).
#define SS_FMT_A8 0
#define SS_FMT_W16 1
#define SS_FMT_W4 2
// int8 cells (16 x 128, a bf16 cell's 2,048 bytes, stream_layout.rs `CellFormat::Int8`) times
// float x, with an f16 scale per 32 columns: an output head stored as Q8_0 (the
// decode_stream_w16q8 kernels only, an operation whose GemvParams.int4 is SS_W_INT8; --lm-head).
// The scales come with their chunk into a ring of their own (SS_SC_U4 uint4s a cell, after the
// int8 fragments' area).
#define SS_FMT_I8 3
#define SS_W_INT8 8
#define SS_SC_U4 8
#define SS_XF_BYTES (SS_MAXG * 16 * 8)  // the int8 fragments' area (runner/launch.rs STREAM_XF_BYTES)
#define SS_DIG 160  // bytes between a W4 input group's digit tables (ss_x_digits)
#define SS_CH 16                        // cells per ring chunk
#define SS_MAXG 96                      // input groups: K <= 12,288
#define SS_BAR 4                        // the consumers' named barrier (attention groups take 1-3)
#ifndef SS_PFD
#define SS_PFD 8                        // sm_90: chunks pulled into L2 ahead while the ring is full (0-16 measured: 8)
#endif
// The same for the 32-KB chunks of bf16 cells: none (8, 4 and 2 measured slower: 245, 281 and
// 292 against 308 tok/s, docs/performance.md, thirty-fifth session; at 8 the look-ahead and the
// ring would hold ~55 MB of a 50-MB L2). Only while the consumers wait on a link, 4-12 chunks
// measured slower too (305-296): the prefetches queue ahead of the next operation's input reads.
#ifndef SS_PFD16
#define SS_PFD16 0
#endif
// sm_90: at most this many ns the idle producer waits on its oldest copy (a slot freed meanwhile
// waits for it). 100 and 30 measured the same as 300 (573.3-574.3, 572.5-575.5 against
// 572.7-574.3 tok/s in one call; docs/performance.md, thirty-fourth session).
#ifndef SS_PSLEEP
#define SS_PSLEEP 300
#endif
// SS_PRE_CST (default 1; -DSS_PRE_CST=0 builds without): a GEMV's residual and norm weights are
// copied into shared memory before the wait for its input (the launch plan's `cst`), and its
// residual input is loaded with the input partials instead of after them (measured A/B/A:
// 439.0-439.5 -> 452.3-452.7 tok/s on E4B shapes, docs/performance.md, thirteenth session).
#ifndef SS_PRE_CST
#define SS_PRE_CST 1
#endif
// SS_CELL_DP4A (sm_90 on, sm_80-89 off): a cell's integer dot products by `dp4a` on the integer
// pipe instead of four `mma` m16n8k32 of which one of the 8 columns is used (the same integers;
// each lane's 32 columns then scaled and summed apart: ss_cell). On the H200 the `mma.sync` pipe
// bounds the cells (the prototype: ~110 cycles a cell a scheduler whatever the warp count;
// `dp4a` +14% resident): the step with `dp4a` cells 535.2-536.3 tok/s against 523.8-524.4, and
// 539.3 with each lane's sums apart (twentieth session). On the A10G (sm_86) `mma.sync` is the
// tensor cores' native form (on sm_90 the full rate is `wgmma`'s): not measured there, so its
// path stays the `mma`'s (checked on the H200 by the compute_80 PTX-only build).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define SS_CELL_DP4A 1
#else
#define SS_CELL_DP4A 0
#endif

// SS_TIMELINE=1 (a measurement build, HAYAI_CUDA_DEFINES=-DSS_TIMELINE=1; off): the profiled
// launch also records every SM's view (after the STEP_STAMPS area of `timing`): per operation
// [SS_TL_SLOTS] = its wait begins, its input is ready, its GEMV input is quantized, it is done
// (before the publication), and for a GEMV its prologue's inputs loaded, residual added, prologue
// done, cells done, then (slots 8, 9) its residual input landed and the residual's norm summed
// (for attention, of its first item: begun (slot 9), thread 0's q/k/v partials landed (8), its
// q/k/v vector done (2), every warp's (7), the newest row and the tile ready (4); then its
// items done (5), every SM's ranges stored (6)); then per ring chunk [2] = the producer issued
// it, saw it land (SS_TL_CHUNKS chunks per SM at most). The host writes them out
// (HAYAI_STREAM_TIMELINE) for scripts/stream_timeline.py.
#ifndef SS_TIMELINE
#define SS_TIMELINE 0
#endif
#define SS_TL_CHUNKS 4096
#define SS_TL_SLOTS 10

// One SM's share of one GEMV (src/stream_layout.rs `SmShare`, uploaded as is).
struct SmShare {
    unsigned first_unit, units, first_slice, last_slice, np, kw, rounds, first_tile, first_cell;
};
static_assert(sizeof(SmShare) == 36, "SmShare is mirrored by the host");

struct StreamParams {
    const StepOp* ops;              // the step's operations; a GEMV's `next_gemv` is its GEMV ordinal
    const uint4* stream;            // every SM's cells
    const unsigned long long* sm_base;  // [SM] first cell of its stream
    const unsigned* sm_cells;       // [SM] cells in its stream
    const SmShare* shares;          // [SM][GEMV]
    unsigned* done;                 // [2][n_ops] SMs done with each operation, and with their
                                    // share of an attention's ranges (monotonic over launches)
    // Profiling (null: off): [n_ops][STEP_STAMPS] ns as the single-kernel step's: 0 SM 0 starts
    // the operation (its input ready), 1-2 its GEMV prologue, 3 its inputs quantized, 4 SM 0
    // done, 5 the last SM done.
    unsigned long long* timing;
    int n_ops, n_gemv;
    int x_floats;                   // shared floats of the GEMV input x (or attention scratch)
    int attn_tk;                    // > 0: at most this many key rows per attention tile and the
                                    // ranges as many tiles (checks); 0: ranges spread over the SMs
    int attn_min_keys;              // with attn_tk 0: the fewest keys a range takes
    const int* pos;                 // the step's position (step_io[1]; every attention's `pos`)
    // int8 cells' scales (W16 kernels; stream_layout.rs `scale_bytes`; null: none): SM s's from
    // its chunk sc_from[s] on (0xffffffff: none) at sc_stream + sc_base[s], SS_SC_U4 a cell.
    const uint4* sc_stream;
    const unsigned long long* sc_base;
    const unsigned* sc_from;
};

static_assert(sizeof(StreamParams) == 112, "StreamParams is mirrored by the host");

// The consumer warps as a thread group (gemv_prologue, group_sum) with their own barrier.
struct ConsumerThreads {
    __device__ __forceinline__ int t() const { return threadIdx.x; }
    __device__ __forceinline__ int n() const { return SS_NW * 32; }
    __device__ __forceinline__ unsigned tu() const { return threadIdx.x; }
    __device__ __forceinline__ unsigned nu() const { return SS_NW * 32; }
    __device__ __forceinline__ void sync() const { asm volatile("bar.sync %0, %1;" ::"n"(SS_BAR), "n"(SS_NW * 32) : "memory"); }
};

__device__ __forceinline__ unsigned ss_smem(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ unsigned ss_ld_acquire_cta(unsigned addr) {
    unsigned v;
    asm volatile("ld.acquire.cta.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
    return v;
}
__device__ __forceinline__ unsigned ss_ld_acquire_gpu(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
// Until the counter at p reaches target (a wrapping compare), then acquire. Measured against
// this (twentieth session): relaxed polls with one acquire fence after, 10% slower a step;
// 100 ns between polls the same, 300 ns 1.8% slower. Twenty-eighth session: 4 or 8 pollers
// (lane 0 of as many warps), staggered, relaxed loads looked at 900-1,200 cycles after issue,
// `fence.acquire.gpu` by the one that saw the count: 508.5-520.6 tok/s against 572.3-573.1, and
// every staggered form slower than this one in the bare link too (proto/link_rate.cu stagger/P).
__device__ __forceinline__ void ss_wait_count(const unsigned* p, unsigned target) {
    while ((int)(ss_ld_acquire_gpu(p) - target) < 0) __nanosleep(20);
}
__device__ __forceinline__ void ss_st_release_cta(unsigned addr, unsigned v) {
    asm volatile("st.release.cta.shared.u32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}

// SS_TIMELINE: this SM's slots of operation k, and of ring chunk c (null: not recording).
__device__ __forceinline__ unsigned long long* ss_tl_op(const StreamParams& P, int k) {
    return SS_TIMELINE && P.timing ? P.timing + STEP_STAMPS * P.n_ops + ((size_t)blockIdx.x * P.n_ops + k) * SS_TL_SLOTS
                                   : nullptr;
}
__device__ __forceinline__ void ss_tl_chunk(const StreamParams& P, unsigned c, int i) {
    if (SS_TIMELINE && P.timing && c < SS_TL_CHUNKS)
        P.timing[STEP_STAMPS * P.n_ops + (size_t)gridDim.x * P.n_ops * SS_TL_SLOTS + ((size_t)blockIdx.x * SS_TL_CHUNKS + c) * 2 +
                 i] = global_ns();
}
__device__ __forceinline__ void ss_tl_at(unsigned long long* tl, int i) {
    if (SS_TIMELINE && tl && threadIdx.x == 0) tl[i] = global_ns();
}

// The producer warp: this SM's `total` cells into the ring chunk by chunk; chunk c goes into slot
// c % NCH once chunk c - NCH has landed and every consumer warp is done with it.
template <int NCH, int CU4 = SS_CELL_U4, bool I8H = false>
__device__ void ss_produce(const StreamParams& P, unsigned char* ring, uint64_t* full, unsigned total,
                           int lane, volatile int* hold, unsigned* landed, const unsigned* wdone,
                           uint4* sring) {
    const uint4* src = P.stream + P.sm_base[blockIdx.x] * CU4;
    const unsigned nch = (total + SS_CH - 1) / SS_CH;
    // The int8 cells' scales (the bf16 kernels with an int8 head only): chunks from sc0 on copy
    // theirs too.
    unsigned sc0 = 0xffffffffu;
    const uint4* scsrc = nullptr;
    if constexpr (I8H) {
        if (P.sc_stream) {
            sc0 = P.sc_from[blockIdx.x];
            scsrc = P.sc_stream + P.sc_base[blockIdx.x];
        }
    }
    unsigned issued = 0, done = 0, pf = 0;
    // The ring's copies mark their lines evict-first: every step reads its weights once through
    // the L2 (2.4-9.3 GB a step against 50 MB), and what it reads again (partials, flags, KV rows,
    // the look-ahead's lines) then stays. Measured with the copies' policy as a build switch:
    // W4A16 550.7-551.8 against 545.4-545.5 tok/s, bf16 308.4 against 303.6, W4A8 574.4
    // against 572.8 (docs/performance.md, thirty-eighth session); the look-ahead's pulls as
    // evict-last on top of it no better (547.9-549.5), a deeper look-ahead still slower.
    uint64_t pol_copy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol_copy));
    while (done < nch) {
        bool moved = false;
        if (issued < nch && (issued < NCH || done > issued - NCH)) {
            unsigned freed = lane < SS_NW ? ss_ld_acquire_cta(ss_smem(wdone + lane)) : 0xffffffffu;
            freed = __reduce_min_sync(HAYAI_FULL_MASK, freed);
            if ((issued < NCH || freed > issued - NCH) && !*hold) {
                const unsigned slot = issued % NCH;
                const unsigned ncell = min((unsigned)SS_CH, total - issued * SS_CH);
                const unsigned n16 = ncell * CU4;
                uint4* dst = (uint4*)ring + slot * SS_CH * CU4;
                const uint4* from = src + (size_t)issued * SS_CH * CU4;
                // This chunk's scales (int8 cells; the I8H kernels only): 0 uint4s where it has
                // none.
                const unsigned s16 = I8H && issued >= sc0 ? ncell * SS_SC_U4 : 0u;
                uint4* sdst = sring + slot * SS_CH * SS_SC_U4;
                const uint4* sfrom = scsrc + (size_t)(issued - sc0) * SS_CH * SS_SC_U4;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
                if (lane == 0) {
                    asm volatile("{ .reg .b64 st; mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1; }" ::"r"(
                                     ss_smem(&full[slot])),
                                 "r"((n16 + s16) * 16)
                                 : "memory");
                    asm volatile(
                        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], "
                        "%2, [%3], %4;" ::"r"(ss_smem(dst)),
                        "l"(from), "r"(n16 * 16), "r"(ss_smem(&full[slot])), "l"(pol_copy)
                        : "memory");
                    if (s16)
                        asm volatile(
                            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], "
                            "[%1], %2, [%3], %4;" ::"r"(ss_smem(sdst)),
                            "l"(sfrom), "r"(s16 * 16), "r"(ss_smem(&full[slot])), "l"(pol_copy)
                            : "memory");
                }
#else
                for (unsigned i = lane; i < n16; i += 32)
                    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(ss_smem(dst + i)),
                                 "l"(from + i), "l"(pol_copy)
                                 : "memory");
                if constexpr (I8H) {
                    for (unsigned i = lane; i < s16; i += 32)
                        asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(
                                         ss_smem(sdst + i)),
                                     "l"(sfrom + i), "l"(pol_copy)
                                     : "memory");
                }
                asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];" ::"r"(ss_smem(&full[slot])) : "memory");
#endif
                if (lane == 0) ss_tl_chunk(P, issued, 0);
                issued++;
                moved = true;
            }
        }
        if (done < issued && mbar_done(&full[done % NCH], (done / NCH) & 1u)) {
            done++;
            __syncwarp();
            if (lane == 0) {
                ss_st_release_cta(ss_smem(landed), done);
                ss_tl_chunk(P, done - 1, 1);
            }
            moved = true;
        }
        if (!moved) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
            // Nothing to copy or publish: pull the next chunks into L2 (up to SS_PFD ahead).
            constexpr unsigned PFD = CU4 == SS_CELL_U4 ? SS_PFD : SS_PFD16;
            if (pf < issued) pf = issued;
            if (pf < nch && pf < issued + PFD && !*hold) {
                if (lane == 0)
                    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src + (size_t)pf * SS_CH * CU4),
                                 "r"(min((unsigned)SS_CH, total - pf * SS_CH) * CU4 * 16)
                                 : "memory");
                pf++;
                continue;
            }
            if (done < issued) {  // a copy in flight: sleep until it lands (at most SS_PSLEEP ns)
                asm volatile(
                    "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1, %2; }" ::"r"(
                        ss_smem(&full[done % NCH])),
                    "r"((done / NCH) & 1u), "r"((unsigned)SS_PSLEEP)
                    : "memory");
                continue;
            }
#endif
            __nanosleep(20);
        }
    }
    (void)pf;
}

// A consumer warp's view of the ring (positions in cells of this SM's stream; CU4: a cell's uint4s).
template <int NCH, int CU4 = SS_CELL_U4>
struct SsRing {
    const uint4* cells;
    unsigned have;    // chunks [0, have) are known to have landed
    unsigned rel;     // chunks [0, rel) are released by this warp
    unsigned landed;  // shared address of the producer's landed count
    unsigned wdone;   // shared address of this warp's done count

    __device__ __forceinline__ void land(unsigned c) {
        while (have <= c) have = ss_ld_acquire_cta(landed);
    }
    // Chunks before pos's are done with. A release store: the chunk's shared-memory reads are
    // ordered before the producer's refill by the memory model, not only by issue order (a
    // plain store, the prototype's, measured 0.7% faster: not worth a data race by the model).
    __device__ __forceinline__ void release_to(unsigned pos) {
        const unsigned c = pos / SS_CH;
        if (rel >= c) return;
        rel = c;
        ss_st_release_cta(wdone, c);
    }
    __device__ __forceinline__ unsigned slot(unsigned pos) const { return (pos / SS_CH) % NCH * SS_CH + pos % SS_CH; }
    __device__ __forceinline__ const uint4* cell(unsigned pos) const { return cells + slot(pos) * CU4; }
};

// a (4 unsigned bytes) . b (4 signed bytes) + c.
__device__ __forceinline__ int dp4a_u8s8(uint32_t a, uint32_t b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// An int4 cell's bytes for lane (g, c) (stream_layout.rs `encode_cell`; ss_cell): its 8 words and
// its rows' bf16 scales (rows g and g + 8).
__device__ __forceinline__ void ss_cell_load(const uint4* cp, int lane, uint32_t (&ws)[8], float& sa, float& sb) {
    const uint4 w0 = cp[lane], w1 = cp[32 + lane];
    ws[0] = w0.x, ws[1] = w0.y, ws[2] = w0.z, ws[3] = w0.w, ws[4] = w1.x, ws[5] = w1.y, ws[6] = w1.z, ws[7] = w1.w;
    const uint16_t* sc = (const uint16_t*)(cp + 64);
    const int g = lane >> 2;
    sa = __uint_as_float((uint32_t)sc[g] << 16);
    sb = __uint_as_float((uint32_t)sc[g + 8] << 16);
}
// The cell's four integer mma m16n8k32 (u8 nibbles, the high ones in place as 16 q) against B
// entries xb[4t], into two accumulator sets (even and odd t).
__device__ __forceinline__ void ss_cell_mma(const uint32_t (&ws)[8], const uint2* xb, int (&d)[2][4]) {
#pragma unroll
    for (int t = 0; t < 4; t++) {
        const uint32_t a[4] = {ws[2 * t] & 0x0F0F0F0Fu, ws[2 * t] & 0xF0F0F0F0u, ws[2 * t + 1] & 0x0F0F0F0Fu,
                               ws[2 * t + 1] & 0xF0F0F0F0u};
        const uint2 bv = xb[t * 4];
        const uint32_t b[2] = {bv.x, bv.y};
        mma_u8s8(d[t & 1], a, b);
    }
}

// One cell: this warp's 16 rows times the group's int8 x (sm_90 by dp4a, else on the integer
// tensor cores: SS_CELL_DP4A). Lane
// (g, c) words 2t, 2t + 1 hold, byte i, rows g (low nibble) and g + 8 (high nibble) at columns
// 32 t + 4 c + i and 32 t + 16 + 4 c + i (stream_layout.rs `encode_cell`); the high nibbles stay
// in place as 16 q (still a u8), their sums shifted back exactly. The nibbles' +8 comes off
// through the group's integer x sum `xs8`; `xsc` is the group's x scale. xb: lanes 0-3 their B
// entries, the others 16 zero entries (SS_CELL_DP4A: every lane its quad's B entries; SS_XB).
__device__ __forceinline__ void ss_cell(const uint4* cp, const uint2* xb, int xs8, float xsc, int lane,
                                        float& acc_a, float& acc_b) {
    uint32_t ws[8];
    float sa, sb;
    ss_cell_load(cp, lane, ws, sa, sb);
#if SS_CELL_DP4A
    // Lane (g, c) dots its own 32 columns (words 2t, 2t + 1 against x words 8t + c, 8t + 4 + c:
    // xb[4t]) for rows g (low nibbles: da) and g + 8: a whole byte is low + 16 high, so the whole
    // words' dot (dw) less da is 16 times row g + 8's, one mask a word. Each lane keeps its own
    // float sums, the quad's four added once a pass (ss_gemv, before the rows are stored) instead
    // of its integer dots by 4 shuffles a cell (~5% of a cell's instructions, on its dependency
    // chain): +0.8% a step (twentieth session). Each cell's four products are rounded apart
    // (parity within the same bounds). Lane c = 0 takes the nibbles' offset.
    int da = 0, dw = 0;
#pragma unroll
    for (int t = 0; t < 4; t++) {
        const uint2 bv = xb[t * 4];
        da = dp4a_u8s8(ws[2 * t] & 0x0F0F0F0Fu, bv.x, da);
        dw = dp4a_u8s8(ws[2 * t], bv.x, dw);
        da = dp4a_u8s8(ws[2 * t + 1] & 0x0F0F0F0Fu, bv.y, da);
        dw = dp4a_u8s8(ws[2 * t + 1], bv.y, dw);
    }
    const int off = (lane & 3) == 0 ? 8 * xs8 : 0;
    const float fa = (float)(da - off), fb = (float)(((dw - da) >> 4) - off);
#else
    int d[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
    ss_cell_mma(ws, xb, d);
    // As gemv_a8 and gemv_mma_a8: (integer dot - 8 x sum) times (weight scale * x scale).
    const float fa = (float)(d[0][0] + d[1][0] - 8 * xs8), fb = (float)(((d[0][2] + d[1][2]) >> 4) - 8 * xs8);
#endif
    acc_a = fmaf(fa, sa * xsc, acc_a);
    acc_b = fmaf(fb, sb * xsc, acc_b);
}

// One bf16 cell (the W16 kernels): lane (g, c) holds, per 16-column step t, rows g and g + 8 at
// columns 16 t + 2 c, + 1 (words x, y) and 16 t + 8 + 2 c, + 1 (words z, w) (stream_layout.rs
// `encode_cell`); xw: the input's float x at the group's column 2 c. On the CUDA cores: bf16
// times float products are exact in float, so the sums differ from the CPU reference's only in
// their order (the tensor cores would take x as a bf16 pair: gemv_mma); 1,024 FMAs a cell, far
// under what the stream delivers to an SM. Each lane keeps its own sums; the quad's four are
// added once a pass (ss_gemv), as the dp4a cell's.
__device__ __forceinline__ void ss_cell16(const uint4* cp, const float* xw, int lane, float& acc_a, float& acc_b) {
#pragma unroll
    for (int t = 0; t < 4; t++) {
        const uint4 w = cp[t * 32 + lane];
        const float2 xa = *(const float2*)(xw + 16 * t), xb = *(const float2*)(xw + 16 * t + 8);
        acc_a = fmaf(bf16_lo(w.x), xa.x, acc_a);
        acc_b = fmaf(bf16_lo(w.y), xa.x, acc_b);
        acc_a = fmaf(bf16_hi(w.x), xa.y, acc_a);
        acc_b = fmaf(bf16_hi(w.y), xa.y, acc_b);
        acc_a = fmaf(bf16_lo(w.z), xb.x, acc_a);
        acc_b = fmaf(bf16_lo(w.w), xb.x, acc_b);
        acc_a = fmaf(bf16_hi(w.z), xb.y, acc_a);
        acc_b = fmaf(bf16_hi(w.w), xb.y, acc_b);
    }
}

// One int8 cell (SS_FMT_I8) times float x: lane (g, c)'s load t holds, word j, columns 32 t +
// 16 (j / 2) + 4 c .. + 3 of row g + 8 (j % 2) (stream_layout.rs `CellFormat::Int8`), column
// block t of the cell; sc: its 16 bytes of the cell's scales (rows g, g + 8, blocks 0-3, f16);
// xw: x at the cell's column 4 c. Bytes become floats as in gemv_q8 (dot_chunk_int8: PRMT and
// FADD, exact); each block's sum times its scale, the lane's sums kept apart as ss_cell16's.
__device__ __forceinline__ float ss_dot4_i8(uint32_t w, float4 x) {
    constexpr float OFS = 8388736.f;  // 2^23 + 128
    w ^= 0x80808080u;
    float s = (__uint_as_float(__byte_perm(w, 0x4B000000u, 0x7540)) - OFS) * x.x;
    s = fmaf(__uint_as_float(__byte_perm(w, 0x4B000000u, 0x7541)) - OFS, x.y, s);
    s = fmaf(__uint_as_float(__byte_perm(w, 0x4B000000u, 0x7542)) - OFS, x.z, s);
    return fmaf(__uint_as_float(__byte_perm(w, 0x4B000000u, 0x7543)) - OFS, x.w, s);
}
__device__ __forceinline__ void ss_cell8(const uint4* cp, const float* xw, const uint4* sc, int lane, float& acc_a,
                                         float& acc_b) {
    const uint4 s = *sc;
    const float sa[4] = {f16_to_f32(s.x & 0xffffu), f16_to_f32(s.x >> 16), f16_to_f32(s.y & 0xffffu),
                         f16_to_f32(s.y >> 16)};
    const float sb[4] = {f16_to_f32(s.z & 0xffffu), f16_to_f32(s.z >> 16), f16_to_f32(s.w & 0xffffu),
                         f16_to_f32(s.w >> 16)};
#pragma unroll
    for (int t = 0; t < 4; t++) {
        const uint4 w = cp[t * 32 + lane];
        const float4 xa = *(const float4*)(xw + 32 * t), xb = *(const float4*)(xw + 32 * t + 16);
        acc_a = fmaf(ss_dot4_i8(w.x, xa) + ss_dot4_i8(w.z, xb), sa[t], acc_a);
        acc_b = fmaf(ss_dot4_i8(w.y, xa) + ss_dot4_i8(w.w, xb), sb[t], acc_b);
    }
}

// One int4 cell times x as a 23-bit fixed point per 128 columns (the W4 kernels, --quant int4:
// W4A16): the W4A8 cell's bytes on its integer mma (ss_cell's other branch), B columns 0, 1, 2
// the group's three digits of x_q = x / xsc (x_q = d0 + 256 d1 + 65536 d2, balanced int8 digits,
// |x_q| <= 2^22; ss_x_digits), every integer sum exact: lane c = 0 takes columns 0 and 1
// (digits 0, 1) less 8 times the low 16 bits of the group's sum of x_q (the nibbles' +8),
// lane c = 1 column 2 less 8 times the rest, times 65536; lanes c = 2, 3 nothing; the quad's
// sums added once a pass (ss_gemv).
__device__ __forceinline__ void ss_cell4(const uint4* cp, const uint2* xb, int xsum, float xsc, int lane,
                                         float& acc_a, float& acc_b) {
    uint32_t ws[8];
    float sa, sb;
    ss_cell_load(cp, lane, ws, sa, sb);
    const int c = lane & 3;
    int d[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
    ss_cell_mma(ws, xb, d);
    const int ra = d[0][0] + d[1][0], rb = d[0][1] + d[1][1];                // row g, columns 2c, 2c + 1
    const int ha = (d[0][2] + d[1][2]) >> 4, hb = (d[0][3] + d[1][3]) >> 4;  // row g + 8 (16 q nibbles)
    // Combined without branches (a branch on the lane's column kept the compiler from
    // overlapping a warp's cells: 530 against 546-548 tok/s, docs/performance.md): lane c = 0's
    // integers times 1, c = 1's times 65536, lanes c = 2, 3 a zero integer.
    const bool c0 = c == 0, c1 = c == 1;
    const int off = c0 ? 8 * (xsum & 0xFFFF) : 8 * (xsum >> 16);
    const float k = c0 ? 1.f : 65536.f;
    const float fa = (float)(c0 ? ra + 256 * rb - off : c1 ? ra - off : 0) * k;
    const float fb = (float)(c0 ? ha + 256 * hb - off : c1 ? ha - off : 0) * k;
    acc_a = fmaf(fa, sa * xsc, acc_a);
    acc_b = fmaf(fb, sb * xsc, acc_b);
}

struct SsPass {
    int np, kw, rounds;
};
// Pass p of an SM's nt units of gu groups (stream_layout.rs `pass_of`).
__device__ __forceinline__ SsPass ss_pass(int nt, int p, int gu) {
    SsPass q;
    q.np = min(nt - p * SS_NW, SS_NW);
    q.kw = SS_NW / q.np;
    q.rounds = (gu + q.kw - 1) / q.kw;
    return q;
}
// Unit first_unit + idx's (K slice, tile), stepping from the first unit's (stream_layout.rs `unit_at`).
__device__ __forceinline__ void ss_unit_at(const SmShare& sh, int tiles, int idx, int& slice, int& tile) {
    slice = (int)sh.first_slice;
    tile = (int)sh.first_tile + idx;
    while (tile >= tiles) {
        tile -= tiles;
        slice++;
    }
}

// The argmax's first stage over the logits this SM's lm_head units stored (its share `sh`,
// whole rows: one K slice), softcapped in place, its best into blk_val / blk_idx[SM]: no wait
// on the other SMs between lm_head and this stage (the second reduces gridDim.x results).
template <int NT>
__device__ void ss_argmax_own(const ArgmaxParams& m, const SmShare& sh, ConsumerThreads g) {
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    const int tiles = m.n >> 4, rows = (int)sh.units * 16;
    for (int i = threadIdx.x; i < rows; i += NT) {
        int slice, tile;
        ss_unit_at(sh, tiles, i >> 4, slice, tile);
        argmax_take(m, tile * 16 + (i & 15), bv, bi);
    }
    block_argmax(bv, bi, g);
    if (threadIdx.x == 0) {
        m.blk_val[blockIdx.x] = bv;
        m.blk_idx[blockIdx.x] = bi;
    }
}

// Shared state of the consumers' GEMV path.
struct SsShared {
    float red[2][SS_NW][16];  // a pass's per-warp row sums (alternating: no barrier between passes' uses)
    float sred[32];           // group_sum scratch
    int xs8[SS_MAXG];         // per input group: integer sum of the quantized x
    float xsc[SS_MAXG];       // per input group: x scale max|x| / 127
    uint2 xzero[16];          // the B entries of lanes without a column-0 value
};

#ifndef SS_DIG_PAIR
#define SS_DIG_PAIR 0
#endif
// ss_x_digits' arithmetic for one group in a warp's registers (this lane's 4 values): the three
// digit words, this lane's part of the sum of x_q, the exponent e.
struct SsDigits {
    uint32_t wd[3];
    int qs, e;
};
__device__ __forceinline__ SsDigits ss_digits_of(const float4 v4) {
    SsDigits d;
    const float m = warp_max(fmaxf(fmaxf(fabsf(v4.x), fabsf(v4.y)), fmaxf(fabsf(v4.z), fabsf(v4.w))));
    // m = f 2^e, f in [0.5, 1): e = biased exponent - 126 (m normal and >= 2^-100).
    d.e = max((int)((__float_as_uint(m) >> 23) & 255u) - 126, -100);
    const float up = __uint_as_float((uint32_t)(127 + 22 - d.e) << 23);  // 2^(22 - e), exact
    const float v[4] = {v4.x, v4.y, v4.z, v4.w};
    d.wd[0] = d.wd[1] = d.wd[2] = 0u;
    d.qs = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int q = __float2int_rn(v[i] * up);
        d.qs += q;
        const int d0 = (q << 24) >> 24, r = (q - d0) >> 8, d1 = (r << 24) >> 24, d2 = (r - d1) >> 8;
        d.wd[0] |= (uint32_t)(d0 & 255) << (8 * i);
        d.wd[1] |= (uint32_t)(d1 & 255) << (8 * i);
        d.wd[2] |= (uint32_t)(d2 & 255) << (8 * i);
    }
    return d;
}
// Its stores (d.qs the warp's sum by then), after the warp's __syncwarp.
__device__ __forceinline__ void ss_digits_store(const SsDigits& d, float* xs, SsShared& sm, int grp, int lane) {
    uint32_t* t = (uint32_t*)(xs + grp * 128) + ((lane >> 3) * 4 + (lane & 3)) * 2 + ((lane >> 2) & 1);
#pragma unroll
    for (int j = 0; j < 3; j++) t[SS_DIG / 4 * j] = d.wd[j];
    if (lane == 0) {
        sm.xs8[grp] = d.qs;
        sm.xsc[grp] = __uint_as_float((uint32_t)(127 + d.e - 22) << 23);  // 2^(e - 22), exact
    }
}

// The W4 kernels' input: groups g0 .. g1 of the prologue's float x, a warp a group, as x_q =
// rint(x / xsc) with xsc = 2^(e - 22), 2^e > max |x| the group's (so |x_q| <= 2^22, every
// product by xsc exact), in balanced int8 digits x_q = d0 + 256 d1 + 65536 d2, each digit's 128
// bytes in ss_store_group's B order at byte SS_DIG j of the group's 512 (in place of its floats;
// 160 apart, so the B loads of the three digits' lanes fall in different banks); the group's sum
// of x_q and xsc into sm.xs8 / sm.xsc. The scales from the exponent's bits (a group whose largest
// |x| is under 2^-100, or zero, takes e = -100: its x_q are then 0 or exact small multiples).
__device__ __forceinline__ void ss_x_digits(float* xs, SsShared& sm, int g0, int g1, int warp, int lane) {
#if SS_DIG_PAIR
    // A measurement build (-DSS_DIG_PAIR=1): a warp's groups two at a time, their loads, maxima,
    // digits and sums as two independent chains before one __syncwarp and their stores (the
    // same values: ss_digits_of's), so the chain's shuffles and conversions overlap where a
    // warp has two groups (gate/up's and down's 20 an SM on E4B's shapes).
    int grp = g0 + warp;
    for (; grp + SS_NW < g1; grp += 2 * SS_NW) {
        const float4 a = ((const float4*)(xs + grp * 128))[lane];
        const float4 b = ((const float4*)(xs + (grp + SS_NW) * 128))[lane];
        SsDigits da = ss_digits_of(a), db = ss_digits_of(b);
        da.qs = __reduce_add_sync(HAYAI_FULL_MASK, da.qs);
        db.qs = __reduce_add_sync(HAYAI_FULL_MASK, db.qs);
        __syncwarp();
        ss_digits_store(da, xs, sm, grp, lane);
        ss_digits_store(db, xs, sm, grp + SS_NW, lane);
    }
    if (grp < g1) {
        SsDigits d = ss_digits_of(((const float4*)(xs + grp * 128))[lane]);
        d.qs = __reduce_add_sync(HAYAI_FULL_MASK, d.qs);
        __syncwarp();
        ss_digits_store(d, xs, sm, grp, lane);
    }
#else
    for (int grp = g0 + warp; grp < g1; grp += SS_NW) {
        SsDigits d = ss_digits_of(((const float4*)(xs + grp * 128))[lane]);
        d.qs = __reduce_add_sync(HAYAI_FULL_MASK, d.qs);
        __syncwarp();
        ss_digits_store(d, xs, sm, grp, lane);
    }
#endif
}

// Where a lane reads input group grp's B entries for ss_cell (in ss_gemv: xf, sm, lane): the mma
// takes x from lanes 0-3 (B's column 0) and zeros elsewhere; the dp4a cell (SS_CELL_DP4A) every
// lane's quad's words.
#if SS_CELL_DP4A
#define SS_XB(grp) (xf + (grp) * 16 + (lane & 3))
#else
#define SS_XB(grp) (lane < 4 ? xf + (grp) * 16 + lane : sm.xzero)
#endif

// One GEMV: the prologue (input partials, residual, norms: gemv_prologue), the quantization of
// the groups this SM multiplies, then its units' cells from the ring, the rows of each pass stored
// as partial vector `slice` of the output.
// Where a GEMV's prologue constants go (gemv_prologue's `cst`: the residual input, its weight,
// the norm weight, `cols` floats each after x), null when SS_PRE_CST is off, the prologue has none
// or they do not fit.
__device__ __forceinline__ float* ss_cst(const GemvParams& g, float* xs, int x_floats) {
    return SS_PRE_CST && (g.res_in || g.norm_w) && 4 * g.cols <= x_floats ? xs + g.cols : nullptr;
}
// Before the wait: the prologue's weights into `cst` (gemv_constants_async by the consumer
// warps, each thread the columns it handles in gemv_prologue).
__device__ __forceinline__ void ss_constants_async(const GemvParams& g, float* xs, int x_floats) {
    float* cst = ss_cst(g, xs, x_floats);
    if (!cst) return;
    const ConsumerThreads ct;
    for (int j = ct.t(); j < (g.cols >> 2); j += ct.n()) {
        if (g.res_w) cp_async16(cst + g.cols + 4 * j, g.res_w + 4 * j);
        if (g.norm_w) cp_async16(cst + 2 * g.cols + 4 * j, g.norm_w + 4 * j);
    }
    cp_async_commit();
}

// Group grp's quantized x (this lane's 4 values q) as B entries, its integer sum qs and scale.
__device__ __forceinline__ void ss_store_group(uint2* xf, SsShared& sm, int grp, const int q[4], int qs, float m,
                                               int lane) {
    ((uint32_t*)xf)[((grp * 4 + (lane >> 3)) * 4 + (lane & 3)) * 2 + ((lane >> 2) & 1)] =
        (uint32_t)(q[0] & 255) | (uint32_t)(q[1] & 255) << 8 | (uint32_t)(q[2] & 255) << 16 |
        (uint32_t)(q[3] & 255) << 24;
    if (lane == 0) {
        sm.xs8[grp] = qs;
        sm.xsc[grp] = m / 127.f;
    }
}

// A measurement build's switch: read the probe word of each operation record (runner/stream.rs
// STREAM_PROBE_AT, mark_probes): bit 0 set by HAYAI_STREAM_PROBE_NOWAIT (the operation starts
// without its wait: stream_body), bit 1 by HAYAI_STREAM_PROBE_NOPROLOGUE (a GEMV without its
// prologue: ss_gemv). Timing only, the outputs are wrong.
#ifndef SS_PROBE_NOWAIT
#define SS_PROBE_NOWAIT 0
#endif
#define SS_PROBE_WORD (STEP_OP_BYTES / 4 - 1)
#define SS_PROBE_NOWAIT_BIT 1
#define SS_PROBE_NOPRO_BIT 2

// FMT (SS_FMT_*): A8 int4 cells times int8 x (ss_cell); W16 bf16 cells (64 columns a group,
// ss_cell16) multiplying the prologue's float x in place; W4 int4 cells times x as a 23-bit
// fixed point (ss_cell4, the input turned into int8 digits in place by ss_x_digits).
template <int NCH, int FMT = SS_FMT_A8>
__device__ void ss_gemv(const GemvParams& g, const SmShare& sh, float* xs, uint2* xf, SsShared& sm,
                        SsRing<NCH, FMT == SS_FMT_W16 || FMT == SS_FMT_I8 ? SS_W16_U4 : SS_CELL_U4>& R, int& pc,
                        volatile int* hold, unsigned long long* stamps, int x_floats, unsigned long long* tl,
                        const uint4* sring = nullptr, int probe = 0) {
    constexpr bool W16 = FMT == SS_FMT_W16, W4 = FMT == SS_FMT_W4, I8 = FMT == SS_FMT_I8;
    constexpr int CU4 = W16 || I8 ? SS_W16_U4 : SS_CELL_U4;
    constexpr int GC = W16 ? 64 : 128;  // a group's (a cell's) columns
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int G = g.cols >> (W16 ? 6 : 7), gu = G / g.splits, tiles = g.rows >> 4;
    const int nt = (int)sh.units;
    // SM 0 stores the new residual (gemv_prologue): it runs the prologue even without units.
    if (nt == 0 && !(blockIdx.x == 0 && g.res_out)) return;
    // The groups this SM multiplies: those of its slices (the prologue builds the whole vector
    // anyway when a norm or residual needs it).
    const int g0 = (int)sh.first_slice * gu, g1 = nt > 0 ? ((int)sh.last_slice + 1) * gu : g0;
    // The timing probe HAYAI_STREAM_PROBE_NOPROLOGUE (`probe`: the record's probe word, 0 in the
    // default build): the GEMV multiplies whatever x the SM holds.
    const bool nopro = (probe & SS_PROBE_NOPRO_BIT) != 0;
    if (!nopro)
        gemv_prologue<true, 0, ConsumerThreads>(g, xs, sm.sred, false, stamps, g0 * (GC / 4), g1 * (GC / 4),
                                            ss_cst(g, xs, x_floats), ConsumerThreads{}, tl);
    ss_tl_at(tl, 6);
    if (nt == 0) return;
    // This lane's columns of a bf16 cell's input (ss_cell16), from group 0.
    const float* xw0 = xs + 2 * (lane & 3);
    (void)xw0;
    // An int8 cell's (ss_cell8): column 4 c of group 0; its scales' entry g of a ring slot.
    const float* xw8 = xs + 4 * (lane & 3);
    const uint4* sc8 = sring + (lane >> 2);
    (void)xw8;
    (void)sc8;
    // This lane's B entries of an int4 cell's input (ss_cell4), from group 0: 64 uint2 a group,
    // B column n < 3 digit n's (the other columns' sums are not used: any digit's).
    const uint2* xb4 = (const uint2*)xs + SS_DIG / 8 * ((lane >> 2) < 3 ? (lane >> 2) : 0) + (lane & 3);
    (void)xb4;
    // One warp per group; lane l holds columns 4 l .. 4 l + 3, which are B entry (t = l / 8,
    // c = l % 4), half (l / 4) % 2. (bf16 cells take x as the prologue left it.)
    if constexpr (W4) {
        if (!nopro) ss_x_digits(xs, sm, g0, g1, warp, lane);
        ConsumerThreads{}.sync();
    } else if constexpr (!W16 && !I8) {
        for (int grp = g0 + warp; grp < g1 && !nopro; grp += SS_NW) {
            int q[4];
            const float m = act8_quantize4(((const float4*)(xs + grp * 128))[lane], q);
            ss_store_group(xf, sm, grp, q, __reduce_add_sync(HAYAI_FULL_MASK, q[0] + q[1] + q[2] + q[3]), m,
                           lane);
        }
        ConsumerThreads{}.sync();
    }
    stamp_at(stamps, 3);
    ss_tl_at(tl, 2);

    const unsigned base = sh.first_cell;
    for (int p = 0; p * SS_NW < nt; p++, pc++) {
        const SsPass q = p == 0 ? SsPass{(int)sh.np, (int)sh.kw, (int)sh.rounds} : ss_pass(nt, p, gu);
        const unsigned pb = base + (unsigned)(p * SS_NW * gu);
        float acc_a = 0.f, acc_b = 0.f;
        if (warp < q.np * q.kw) {
            const int ti = warp / q.kw, sl = warp % q.kw;
            int u_slice, u_tile;
            ss_unit_at(sh, tiles, p * SS_NW + ti, u_slice, u_tile);
            const int gofs = u_slice * gu;  // the unit's first group
            if (q.kw == 1) {
                // One unit a warp (gate/up's passes, lm_head's): its cells are np apart in the
                // stream, round after round, so the ring slot (the position modulo the ring's
                // cells) and the input group advance by steps instead of being worked out again
                // per cell (137 SASS instructions a pair of cells against 158; +0.9% a step,
                // docs/performance.md, nineteenth session; every pass so, kw warps a unit, +0.5%
                // with the mma cells, -0.9% with the dp4a ones: twentieth session).
                constexpr unsigned RC = (unsigned)(NCH * SS_CH);
                const unsigned np = (unsigned)q.np;
                unsigned pos = pb + (unsigned)ti, slot = pos % RC;
                const uint2* xb = SS_XB(gofs);
                const int xstep = SS_CELL_DP4A || lane < 4 ? 16 : 0;
                const int* x8 = sm.xs8 + gofs;
                const float* xc = sm.xsc + gofs;
                int r = 0;
                for (; r + 1 < gu; r += 2) {
                    unsigned slot1 = slot + np;
                    if (slot1 >= RC) slot1 -= RC;
                    R.release_to(pos);
                    R.land((pos + np) / SS_CH);
                    if constexpr (W16) {
                        ss_cell16(R.cells + slot * CU4, xw0 + (gofs + r) * GC, lane, acc_a, acc_b);
                        ss_cell16(R.cells + slot1 * CU4, xw0 + (gofs + r + 1) * GC, lane, acc_a, acc_b);
                    } else if constexpr (I8) {
                        ss_cell8(R.cells + slot * CU4, xw8 + (gofs + r) * GC, sc8 + slot * SS_SC_U4, lane, acc_a,
                                 acc_b);
                        ss_cell8(R.cells + slot1 * CU4, xw8 + (gofs + r + 1) * GC, sc8 + slot1 * SS_SC_U4, lane,
                                 acc_a, acc_b);
                    } else if constexpr (W4) {
                        ss_cell4(R.cells + slot * CU4, xb4 + (gofs + r) * 64, x8[r], xc[r], lane, acc_a, acc_b);
                        ss_cell4(R.cells + slot1 * CU4, xb4 + (gofs + r + 1) * 64, x8[r + 1], xc[r + 1], lane,
                                 acc_a, acc_b);
                    } else {
                        ss_cell(R.cells + slot * CU4, xb, x8[r], xc[r], lane, acc_a, acc_b);
                        ss_cell(R.cells + slot1 * CU4, xb + xstep, x8[r + 1], xc[r + 1], lane, acc_a,
                                acc_b);
                    }
                    xb += 2 * xstep;
                    pos += 2 * np;
                    slot = slot1 + np;
                    if (slot >= RC) slot -= RC;
                }
                if (r < gu) {
                    R.release_to(pos);
                    R.land(pos / SS_CH);
                    if constexpr (W16)
                        ss_cell16(R.cells + slot * CU4, xw0 + (gofs + r) * GC, lane, acc_a, acc_b);
                    else if constexpr (I8)
                        ss_cell8(R.cells + slot * CU4, xw8 + (gofs + r) * GC, sc8 + slot * SS_SC_U4, lane, acc_a,
                                 acc_b);
                    else if constexpr (W4)
                        ss_cell4(R.cells + slot * CU4, xb4 + (gofs + r) * 64, x8[r], xc[r], lane, acc_a, acc_b);
                    else
                        ss_cell(R.cells + slot * CU4, xb, x8[r], xc[r], lane, acc_a, acc_b);
                }
            } else {
                // Round r holds, per unit, groups r kw .. r kw + kw - 1 (fewer in the last round).
                int r = 0;
                for (; r + 1 < q.rounds; r += 2) {  // two cells at a time (rounds r and r + 1, r full)
                    const int ga = r * q.kw + sl, gb = ga + q.kw;
                    if (gb >= gu) break;
                    const int cnt1 = min(q.kw, gu - (r + 1) * q.kw);
                    const unsigned p0 = pb + (unsigned)(r * q.np * q.kw + ti * q.kw + sl);
                    const unsigned p1 = pb + (unsigned)((r + 1) * q.np * q.kw + ti * cnt1 + sl);
                    R.release_to(p0);
                    R.land(p1 / SS_CH);
                    if constexpr (W16) {
                        ss_cell16(R.cell(p0), xw0 + (gofs + ga) * GC, lane, acc_a, acc_b);
                        ss_cell16(R.cell(p1), xw0 + (gofs + gb) * GC, lane, acc_a, acc_b);
                    } else if constexpr (I8) {
                        ss_cell8(R.cell(p0), xw8 + (gofs + ga) * GC, sc8 + R.slot(p0) * SS_SC_U4, lane, acc_a,
                                 acc_b);
                        ss_cell8(R.cell(p1), xw8 + (gofs + gb) * GC, sc8 + R.slot(p1) * SS_SC_U4, lane, acc_a,
                                 acc_b);
                    } else if constexpr (W4) {
                        ss_cell4(R.cell(p0), xb4 + (gofs + ga) * 64, sm.xs8[gofs + ga], sm.xsc[gofs + ga], lane,
                                 acc_a, acc_b);
                        ss_cell4(R.cell(p1), xb4 + (gofs + gb) * 64, sm.xs8[gofs + gb], sm.xsc[gofs + gb], lane,
                                 acc_a, acc_b);
                    } else {
                        ss_cell(R.cell(p0), SS_XB(gofs + ga), sm.xs8[gofs + ga], sm.xsc[gofs + ga], lane,
                                acc_a, acc_b);
                        ss_cell(R.cell(p1), SS_XB(gofs + gb), sm.xs8[gofs + gb], sm.xsc[gofs + gb], lane,
                                acc_a, acc_b);
                    }
                }
                for (; r < q.rounds; r++) {
                    const int grp = r * q.kw + sl;
                    if (grp >= gu) break;
                    const int cnt = min(q.kw, gu - r * q.kw);
                    const unsigned pos = pb + (unsigned)(r * q.np * q.kw + ti * cnt + sl);
                    R.release_to(pos);
                    R.land(pos / SS_CH);
                    if constexpr (W16)
                        ss_cell16(R.cell(pos), xw0 + (gofs + grp) * GC, lane, acc_a, acc_b);
                    else if constexpr (I8)
                        ss_cell8(R.cell(pos), xw8 + (gofs + grp) * GC, sc8 + R.slot(pos) * SS_SC_U4, lane, acc_a,
                                 acc_b);
                    else if constexpr (W4)
                        ss_cell4(R.cell(pos), xb4 + (gofs + grp) * 64, sm.xs8[gofs + grp], sm.xsc[gofs + grp],
                                 lane, acc_a, acc_b);
                    else
                        ss_cell(R.cell(pos), SS_XB(gofs + grp), sm.xs8[gofs + grp], sm.xsc[gofs + grp], lane,
                                acc_a, acc_b);
                }
            }
            // The quad's lanes' sums of its rows (ss_cell by dp4a, ss_cell16, ss_cell4).
            if ((SS_CELL_DP4A && FMT == SS_FMT_A8) || W16 || W4 || I8) {
                acc_a += __shfl_xor_sync(HAYAI_FULL_MASK, acc_a, 1);
                acc_b += __shfl_xor_sync(HAYAI_FULL_MASK, acc_b, 1);
                acc_a += __shfl_xor_sync(HAYAI_FULL_MASK, acc_a, 2);
                acc_b += __shfl_xor_sync(HAYAI_FULL_MASK, acc_b, 2);
            }
            if ((lane & 3) == 0) {
                sm.red[pc & 1][warp][lane >> 2] = acc_a;
                sm.red[pc & 1][warp][(lane >> 2) + 8] = acc_b;
            }
        }
        // Done with this pass's cells (or idle in it): let the ring move on before the barrier.
        R.release_to(pb + (unsigned)(q.np * gu));
        ConsumerThreads{}.sync();
        ss_tl_at(tl, 7);
        // The last pass's cells are all read: hold the stream while the operation publishes.
        if (tid == 0 && (p + 1) * SS_NW >= nt) *hold = 1;
        // The np units' rows: the kw warps' sums added in slice order, into partial vector `slice`.
        for (int i = tid; i < q.np * 16; i += SS_NW * 32) {
            const int ti = i >> 4, row = i & 15;
            float sum = 0.f;
#pragma unroll
            for (int s = 0; s < SS_NW; s++)
                if (s < q.kw) sum += sm.red[pc & 1][ti * q.kw + s][row];
            int slice, tile;
            ss_unit_at(sh, tiles, p * SS_NW + ti, slice, tile);
            g.out[(size_t)slice * g.rows + tile * 16 + row] = sum;
        }
    }
    R.release_to(base + (unsigned)(nt * gu));
}

// Attention by KV head. An item is one KV head's key range [k0, k1) for all r of its query
// heads, run by the SM's consumer warps; the range's K and V rows (f32) are
// copied into shared memory (the GEMV input area, free once this SM's QKV share is done)
// *before* the wait for the QKV projection, so after the wait the item costs one round trip
// for its q/k/v inputs and none for its keys (the single-kernel step's items take ~12 dependent
// global loads, ~24 us per layer in this kernel). The ranges spread over the SMs, one item an
// SM at most and at least min_keys keys each (an E4B sliding layer, head dim 256, 512 keys on
// 132 SMs: 64 ranges of 8 keys per KV head; ranges as long as the staging area holds, 20 keys,
// had left 80 of the 132 SMs without an item and ran 540.4 against 556.4 tok/s, docs/performance.md,
// twenty-first session); a range longer than the staging area's `tk` rows runs in several tiles
// with an online softmax. The ranges' partials are merged after
// every SM has stored its own (a counter per operation, `done + n_ops`), each SM merging a
// slice of the heads' outputs, so no SM reads all of a head's partials. Same arithmetic as
// attn_item (scores, online softmax and p.V in key order; the merge's sums in another order).
#define SSA_MAXR 8  // query heads per KV head
// Before the wait, besides the first tile, the first item's q and k norm weights go to shared
// memory (the p.V accumulators' area, zeroed after the inputs; 2 KB a layer, likely evicted from
// L2 by the weight stream between steps), so after it the item loads only the QKV partials; and a
// tile's K rows and V rows are two cp.async groups, the scores waiting only for the K rows (the V
// rows land during the scores and softmax). Measured together: 501.1-502.3 -> 508.3-510.2 tok/s
// on E4B shapes, attention inputs 0.161-0.164 -> 0.101-0.105 ms a step (docs/performance.md,
// sixteenth session).
#define SSA_MR ((ATTN_MAX_SPLITS + SS_NW - 1) / SS_NW)  // ranges per warp in ssa_merge

struct SsaLayout {
    int r, hd, tk, S, chunk, n_keys, first, pos;
    float *q, *o, *kf, *vf, *cs, *m, *l, *corr, *sc, *kt, *vt;
};

// The operation's split of the keys and its shared-memory layout in `avail` floats at xs:
// q[r][hd] (normed, rotated), o[r][hd] (p.V accumulators), the fresh k and v, RoPE's cosines
// and sines at pos, per head m, l and the tile's correction, scores [r][tk], then tk rows of K
// and of V. The position (step_io, read once at the kernel's start: `pos`) was written by the
// previous step or the host (the step's last operation advances it), so this may run before the
// wait. Mirrored by the host's size check (runner/stream.rs `stream_config`).
__device__ __forceinline__ SsaLayout ssa_layout(const AttnParams& a, float* xs, int avail, int tk_max, int min_keys,
                                                int pos) {
    SsaLayout L;
    L.r = a.nh / a.nkv;
    L.hd = a.hd;
    L.pos = pos;
    L.n_keys = a.window > 0 ? min(L.pos + 1, a.window) : L.pos + 1;
    L.first = L.pos + 1 - L.n_keys;
    const int fixed = (2 * L.r + 3) * L.hd + 4 * SSA_MAXR + 4;
    L.tk = (avail - fixed) / (2 * L.hd + L.r);  // >= 1 (checked by the host: stream_config)
    if (tk_max > 0) L.tk = min(L.tk, tk_max);
    int s0 = min((L.n_keys + L.tk - 1) / L.tk, ATTN_MAX_SPLITS);
    if (tk_max <= 0) {
        // Ranges spread over the SMs, one item an SM at most (gridDim.x / nkv per KV head), and
        // at least min_keys keys a range: shorter items, the longest ones (more keys than the
        // staging area holds) run as tiles of one item instead of a second item on some SMs.
        // (min_keys at most a tile's rows: an 8-key range at head dim 512, 7 rows a tile, would
        // run as tiles of 7 and 1.)
        const int mk = max(1, min(min_keys, L.tk));
        s0 = min(min((L.n_keys + mk - 1) / mk, max(1, (int)gridDim.x / a.nkv)), ATTN_MAX_SPLITS);
    }
    L.chunk = (L.n_keys + s0 - 1) / s0;
    L.S = (L.n_keys + L.chunk - 1) / L.chunk;  // every range non-empty
    float* p = xs;
    L.q = p;
    p += L.r * L.hd;
    L.o = p;
    p += L.r * L.hd;
    L.kf = p;
    p += L.hd;
    L.vf = p;
    p += L.hd;
    L.cs = p;
    p += L.hd;
    L.m = p;
    L.l = p + SSA_MAXR;
    L.corr = p + 2 * SSA_MAXR;
    p += 4 * SSA_MAXR;
    L.sc = p;
    p += (L.r * L.tk + 3) & ~3;
    L.kt = p;
    p += L.tk * L.hd;
    L.vt = p;
    return L;
}

// Rows [kb, kb + nr) of KV head g into the tile: phase 0 by cp.async, the K rows' group then the
// V rows' (may be requested before the wait), every row but the item's own newest, which phase 1
// copies from the fresh k/v it computed. Where the cache is a donor's (a KV-shared layer) its
// newest row comes with phase 0: the donor's attention, an earlier layer's, is at least two
// operations back (this layer's QKV projection comes between).
// Phase 0 by warps w0 .. SS_NW - 1 (ssa_prestage leaves warp 0, which polls, out).
__device__ void ssa_stage(const AttnParams& a, const SsaLayout& L, int g, int kb, int nr, int phase, bool fresh,
                          int w0 = 0) {
    const int tid = threadIdx.x, hd = L.hd, c4 = hd >> 2;
    const float* K = a.k_cache + (size_t)g * a.cap * hd;
    const float* V = a.v_cache + (size_t)g * a.cap * hd;
    if (phase == 0) {
        const int warp = tid >> 5, lane = tid & 31;
        for (int kv = 0; kv < 2; kv++) {  // the K rows' group, then the V rows'
            for (int row = warp - w0; row < nr; row += SS_NW - w0) {
                const int kp = L.first + kb + row;
                if (kp == L.pos && a.own_kv) continue;  // this step's, computed by its item
                const size_t src = (size_t)(kp % a.cap) * hd;
                for (int c = lane; c < c4; c += 32)
                    cp_async16((kv ? L.vt : L.kt) + row * hd + 4 * c, (kv ? V : K) + src + 4 * c);
            }
            cp_async_commit();
        }
        return;
    }
    // The newest row of the item's own cache (a donor's newest row came with phase 0).
    const int row = L.pos - L.first - kb;
    if (!fresh || row < 0 || row >= nr) return;
    for (int i = tid; i < 2 * c4; i += SS_NW * 32) {
        const bool isv = i >= c4;
        const int c = isv ? i - c4 : i;
        *(float4*)((isv ? L.vt : L.kt) + row * hd + 4 * c) = *(const float4*)((isv ? L.vf : L.kf) + 4 * c);
    }
}

// Whether the first item's norm weights go through shared memory: room in the p.V accumulators'
// area (two head vectors) and 16-byte aligned weights.
__device__ __forceinline__ bool ssa_norm_smem(const AttnParams& a, const SsaLayout& L) {
    return L.r >= 2 && (((uintptr_t)a.q_norm | (uintptr_t)a.k_norm) & 15) == 0;
}

// Before the wait: the first item's norm weights, RoPE's cosines and sines at pos (as
// norm_rope_heads computes them) and its first tile. (Worked out after the wait instead,
// while the QKV partials are in flight, they cost more there: 494.0 against 497.9 tok/s with
// the position read once per launch, attention inputs 0.142 -> 0.185 ms a step;
// docs/performance.md, fourteenth session.)
// All of it by warps 1 .. SS_NW - 1: warp 0's thread 0 polls for the QKV projection, and on the
// SM that publishes QKV last its poll followed this work (the inverse frequencies' round trip
// before the sines, the divisions): every SM took ~2.4 us from its QKV publication to its wait
// against ~1 us before a GEMV's; now 0.8 us, and 558.5-560.4 against 555.0-557.3 tok/s with the
// min-keys cap in ssa_layout (twenty-second session). What the attention waits for after that
// is its K rows from memory (ready ~2.3 us after the projection, a GEMV ~0.9); pulling them
// into L2 one operation earlier, by the warp that stages the next record, measured slower
// (551.3-552.0 against 560.8-560.9), docs/performance.md.
__device__ void ssa_prestage(const AttnParams& a, float* xs, int avail, int tk_max, int min_keys, int pos,
                             SsaLayout& keep) {
    constexpr int NT = (SS_NW - 1) * 32;
    const int t = (int)threadIdx.x - 32;
    if (t < 0) return;
    const SsaLayout L = ssa_layout(a, xs, avail, tk_max, min_keys, pos);
    // Kept for ssa_op after the wait (the operation's barrier publishes it): worked out again
    // there, its five dependent divisions were most of an item SM's 0.74 us before its first
    // loads (kept: +1.0% a step, docs/performance.md, nineteenth session).
    if (t == 0) keep = L;
    const int it = blockIdx.x;
    if (it >= a.nkv * L.S) return;
    // The norm weights as a cp.async group of their own, before the tile's (ssa_inputs waits
    // for both once its q/k/v loads are issued).
    if (ssa_norm_smem(a, L)) {
        for (int i = t; i < (L.hd >> 2); i += NT) {
            if (a.q_norm) cp_async16(L.o + 4 * i, a.q_norm + 4 * i);
            if (a.k_norm) cp_async16(L.o + L.hd + 4 * i, a.k_norm + 4 * i);
        }
    }
    cp_async_commit();
    for (int i = t; i < (L.hd >> 1); i += NT)
        sincosf((float)L.pos * a.inv_freq[i], &L.cs[(L.hd >> 1) + i], &L.cs[i]);
    const int j = it % L.S, k0 = j * L.chunk, k1 = min(L.n_keys, k0 + L.chunk);
    ssa_stage(a, L, it / L.S, k0, min(L.tk, k1 - k0), 0, false, 1);
}

// The query heads of KV head g (and, for the item holding the newest key of its own cache, that
// key and value), one warp per vector: the QKV partials summed, RMS-normed (times the weight),
// rotated; as norm_rope_heads (the squares summed in another order). A lane holds the pairs
// (i, i + hd/2) it rotates, every load of a partial issued together with the weights'.
#define SSA_MAXP 8  // pairs per lane: head dim <= 512
// (qw, kw: the norm weights, in shared memory or global.) NP: the pairs per lane when known at
// compile time (head dims 256 and 512: no per-pair guard, +1.7% a step against the run-time
// count's ~390 SASS instructions a vector, docs/performance.md, nineteenth session), 0 for any.
template <int NP = 0>
__device__ void ssa_inputs(const AttnParams& a, const SsaLayout& L, int g, bool fresh, const float* qw,
                           const float* kw, unsigned long long* tl) {
    constexpr int MAXP = NP ? NP : SSA_MAXP;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, hd = NP ? 64 * NP : L.hd, half = hd >> 1,
              np = NP ? NP : half >> 5;
    const int jobs = L.r + (fresh ? 2 : 0);
    // One pass, a job a warp (jobs <= SSA_MAXR + 2 <= SS_NW), every warp at the barrier between
    // the loads and the rest: the wait for ssa_prestage's copies (the norm weights, the first
    // tile's K rows) comes after the q/k/v partials' loads are issued, so the two round trips
    // overlap (before the operation's barrier instead: 559.4-560.6 against 561.8-564.0 tok/s,
    // attention link 0.098 -> 0.077 ms a step; docs/performance.md, twenty-fourth session).
    static_assert(SSA_MAXR + 2 <= SS_NW, "one job a warp");
    {
        const int jb = warp;
        const bool has = jb < jobs;
        const float* src;
        float* dst;
        const float* w;
        bool rope = true, norm = true;
        if (jb < L.r) {
            src = a.qkv + (size_t)(g * L.r + jb) * hd;
            dst = L.q + jb * hd;
            w = qw;
        } else if (jb == L.r) {
            src = a.qkv + (size_t)(a.nh + g) * hd;
            dst = L.kf;
            w = kw;
        } else {
            src = a.qkv + (size_t)(a.nh + a.nkv + g) * hd;
            dst = L.vf;
            w = nullptr;
            rope = false;
            norm = a.v_norm != 0;
        }
        float x0[MAXP], x1[MAXP];
#pragma unroll
        for (int m = 0; m < MAXP; m++) {
            x0[m] = x1[m] = 0.f;  // (a warp without a job)
            if (has && m < np) {
                const int i = lane + 32 * m;
                x0[m] = __ldcg(src + i);
                x1[m] = __ldcg(src + i + half);
            }
        }
        for (int s = 1; has && s < a.qkv_splits; s++) {
            const float* sp = src + (size_t)s * a.qkv_ld;
#pragma unroll
            for (int m = 0; m < MAXP; m++) {
                if (m < np) {
                    x0[m] += __ldcg(sp + lane + 32 * m);
                    x1[m] += __ldcg(sp + lane + 32 * m + half);
                }
            }
        }
        float ss = 0.f;
#pragma unroll
        for (int m = 0; m < MAXP; m++)
            if (m < np) ss += x0[m] * x0[m] + x1[m] * x1[m];
        ss = warp_sum(ss);
        if (jb == 0) ss_tl_at(tl, 8);  // thread 0's partials landed (SS_TIMELINE)
        // This thread's copies (the norm weights' group and the tile's K rows), then every
        // thread's (the V rows may still land).
        cp_async_wait<1>();
        ConsumerThreads{}.sync();
        if (!has) return;
        const float rs = norm ? rsqrtf(ss / (float)hd + a.eps) : 1.f;
#pragma unroll
        for (int m = 0; m < MAXP; m++) {
            if (m < np) {
                const int i = lane + 32 * m;
                float v0 = x0[m], v1 = x1[m];
                if (norm) {
                    v0 *= rs;
                    v1 *= rs;
                    if (w) {
                        v0 *= w[i];
                        v1 *= w[i + half];
                    }
                }
                if (rope) {
                    const float cs = L.cs[i], sn = L.cs[half + i];
                    const float y0 = v0 * cs - v1 * sn;
                    v1 = v1 * cs + v0 * sn;
                    v0 = y0;
                }
                dst[i] = v0;
                dst[i + half] = v1;
            }
        }
    }
}

// SSA_WARP_HEAD (default 1): an item's tiles by one warp a query head, the scores, the softmax
// and p.V in the warp's registers (a lane holds the head's columns 4 lane + 128 c, as the scores'
// partial dots do, and key c0 + lane's score), so a tile costs one block barrier (its rows
// landed) instead of four; the same sums in the same order where a tile has at most 32 keys (the
// block's scores, softmax and p.V: see ssa_item). Head dims that are multiples of 128 up to 512;
// others take the block's tiles, as does `-DSSA_WARP_HEAD=0`. Measured (E4B shapes): 128 + 512,
// 573.5 and 573.5 tok/s against the block's tiles' 572.5 and 570.9 (twenty-eighth session; the
// items 0.119 -> 0.112 ms a step); 2,048 + 256, 543.7-544.5 against 541.2-542.4 in three
// alternated rounds (twenty-ninth); parity PASS with the block's figures on sm_90 and on the
// compute_80 PTX path. 168 registers against 155.
#ifndef SSA_WARP_HEAD
#define SSA_WARP_HEAD 1
#endif
#if SSA_WARP_HEAD
// Warp h's running state over the item's tiles: p.V accumulators, max and sum.
struct SsaHead {
    float acc[4][4];
    float m, l;
};
// Tile [t0, t0 + nt) for query head h (its rows in L.kt / L.vt, landed); first: the item's first.
__device__ __forceinline__ void ssa_head_tile(const AttnParams& a, const SsaLayout& L, int h, int nt, bool first,
                                              SsaHead& H) {
    const int lane = threadIdx.x & 31, hd = L.hd, nc = hd >> 7;
    float4 q[4];
#pragma unroll
    for (int c = 0; c < 4; c++)
        if (c < nc) q[c] = *(const float4*)(L.q + h * hd + 128 * c + 4 * lane);
    for (int c0 = 0; c0 < nt; c0 += 32) {
        const int nk = min(32, nt - c0);
        float sc = -INFINITY;
        for (int jj = 0; jj < nk; jj++) {
            const float* kr = L.kt + (c0 + jj) * hd;
            float d = 0.f;
#pragma unroll
            for (int c = 0; c < 4; c++) {
                if (c < nc) {
                    const float4 kv = *(const float4*)(kr + 128 * c + 4 * lane);
                    d = fmaf(q[c].x, kv.x, d);
                    d = fmaf(q[c].y, kv.y, d);
                    d = fmaf(q[c].z, kv.z, d);
                    d = fmaf(q[c].w, kv.w, d);
                }
            }
            float v = warp_sum(d) * a.scale;
            if (a.softcap > 0.f) v = a.softcap * tanhf(v / a.softcap);
            if (lane == jj) sc = v;
        }
        const float mx = warp_max(sc);
        const bool fresh_run = first && c0 == 0;
        const float mo = fresh_run ? -INFINITY : H.m, mn = fmaxf(mo, mx);
        const float p = lane < nk ? expf(sc - mn) : 0.f;
        const float sum = warp_sum(p);
        const float corr = fresh_run ? 0.f : expf(mo - mn);
        H.l = (fresh_run ? 0.f : H.l * corr) + sum;
        H.m = mn;
#pragma unroll
        for (int c = 0; c < 4; c++) {
            H.acc[c][0] *= corr;
            H.acc[c][1] *= corr;
            H.acc[c][2] *= corr;
            H.acc[c][3] *= corr;
        }
        for (int jj = 0; jj < nk; jj++) {
            const float pj = __shfl_sync(HAYAI_FULL_MASK, p, jj);
            const float* vr = L.vt + (c0 + jj) * hd;
#pragma unroll
            for (int c = 0; c < 4; c++) {
                if (c < nc) {
                    const float4 vv = *(const float4*)(vr + 128 * c + 4 * lane);
                    H.acc[c][0] = fmaf(pj, vv.x, H.acc[c][0]);
                    H.acc[c][1] = fmaf(pj, vv.y, H.acc[c][1]);
                    H.acc[c][2] = fmaf(pj, vv.z, H.acc[c][2]);
                    H.acc[c][3] = fmaf(pj, vv.w, H.acc[c][3]);
                }
            }
        }
    }
}
// An item's tiles by warps 0 .. r - 1 (ssa_item's after its inputs and the newest row's store),
// then each head's partials stored from the warp's registers.
__device__ __forceinline__ void ssa_head_item(const AttnParams& a, const SsaLayout& L, int g, int j, int it, int k0,
                                              int k1, bool fresh, bool staged, unsigned long long* stamps,
                                              unsigned long long* tl) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, hd = L.hd, r = L.r;
    const ConsumerThreads ct;
    SsaHead H;
#pragma unroll
    for (int c = 0; c < 4; c++) H.acc[c][0] = H.acc[c][1] = H.acc[c][2] = H.acc[c][3] = 0.f;
    H.m = H.l = 0.f;
    for (int t0 = k0; t0 < k1; t0 += L.tk) {
        const int nt = min(L.tk, k1 - t0);
        if (t0 > k0) {
            ct.sync();  // the previous tile's rows are done with
            ssa_stage(a, L, g, t0, nt, 0, false);
        }
        ssa_stage(a, L, g, t0, nt, 1, fresh);
        cp_async_wait<0>();  // the K and V rows
        ct.sync();
        if (t0 == k0 && it == 0) stamp_at(stamps, 6);
        if (t0 == k0 && staged) ss_tl_at(tl, 4);
        if (warp < r) ssa_head_tile(a, L, warp, nt, t0 == k0, H);
    }
    if (warp < r) {
        float* dst = a.part_acc + ((size_t)(g * r + warp) * ATTN_MAX_SPLITS + j) * hd;
#pragma unroll
        for (int c = 0; c < 4; c++)
            if (c < (hd >> 7))
                *(float4*)(dst + 128 * c + 4 * lane) = make_float4(H.acc[c][0], H.acc[c][1], H.acc[c][2], H.acc[c][3]);
        if (lane == 0) {
            const size_t pi = (size_t)(g * r + warp) * ATTN_MAX_SPLITS + j;
            a.part_ml[2 * pi] = H.m;
            a.part_ml[2 * pi + 1] = H.l;
        }
    }
}
#endif

// One item: KV head g, keys [k0, k1), its first tile already requested when `staged`.
__device__ void ssa_item(const AttnParams& a, const SsaLayout& L, int it, bool staged, unsigned long long* stamps,
                         unsigned long long* tl) {
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, hd = L.hd, r = L.r;
    const ConsumerThreads ct;
    const int g = it / L.S, j = it % L.S;
    const int k0 = j * L.chunk, k1 = min(L.n_keys, k0 + L.chunk);
    const bool fresh = a.own_kv && k1 == L.n_keys;  // this item holds the newest key of its own cache
    if (!staged) ssa_stage(a, L, g, k0, min(L.tk, k1 - k0), 0, false);
    const bool wsm = staged && ssa_norm_smem(a, L);  // ssa_prestage copied them into L.o
    if (staged) ss_tl_at(tl, 9);
    {
        const float* qw = a.q_norm && wsm ? L.o : a.q_norm;
        const float* kw = a.k_norm && wsm ? L.o + hd : a.k_norm;
        unsigned long long* itl = staged ? tl : nullptr;
        if (hd == 256)
            ssa_inputs<4>(a, L, g, fresh, qw, kw, itl);
        else if (hd == 512)
            ssa_inputs<8>(a, L, g, fresh, qw, kw, itl);
        else
            ssa_inputs(a, L, g, fresh, qw, kw, itl);
    }
    if (staged) ss_tl_at(tl, 2);
    ct.sync();  // the fresh k/v complete, the weights in L.o read
    for (int i = tid; i < r * hd; i += SS_NW * 32) L.o[i] = 0.f;  // (ordered before p.V by the tile's barrier)
    if (staged) ss_tl_at(tl, 7);
    if (fresh) {  // one item per KV head stores the new entry
        float* K = (float*)a.k_cache + ((size_t)g * a.cap + L.pos % a.cap) * hd;
        float* V = (float*)a.v_cache + ((size_t)g * a.cap + L.pos % a.cap) * hd;
        for (int i = tid; i < hd; i += SS_NW * 32) {
            K[i] = L.kf[i];
            V[i] = L.vf[i];
        }
    }
#if SSA_WARP_HEAD
    if (hd % 128 == 0 && hd <= 512) {  // (other head dims: the block's tiles below)
        ssa_head_item(a, L, g, j, it, k0, k1, fresh, staged, stamps, tl);
        ct.sync();  // the area is free for the next item
        return;
    }
#endif
    for (int t0 = k0; t0 < k1; t0 += L.tk) {
        const int nt = min(L.tk, k1 - t0);
        if (t0 > k0) {
            ct.sync();  // the previous tile's p.V is done with the rows
            ssa_stage(a, L, g, t0, nt, 0, false);
        }
        ssa_stage(a, L, g, t0, nt, 1, fresh);
        cp_async_wait<1>();  // the K rows (the V rows may still land)
        ct.sync();
        if (t0 == k0 && it == 0) stamp_at(stamps, 6);
        if (t0 == k0 && staged) ss_tl_at(tl, 4);
        // Scores: a warp per key, each K row read once for four query heads at a time; per head
        // as attn_item's (lane float4s 128 apart, then warp_sum).
        for (int jj = warp; jj < nt; jj += SS_NW) {
            const float* kr = L.kt + jj * hd;
            for (int h0 = 0; h0 < r; h0 += 4) {
                float d[4] = {0.f, 0.f, 0.f, 0.f};
                for (int i = 4 * lane; i < hd; i += 128) {
                    const float4 kv = *(const float4*)(kr + i);
#pragma unroll
                    for (int u = 0; u < 4; u++) {
                        if (h0 + u < r) {
                            const float4 qv = *(const float4*)(L.q + (h0 + u) * hd + i);
                            d[u] = fmaf(qv.x, kv.x, d[u]);
                            d[u] = fmaf(qv.y, kv.y, d[u]);
                            d[u] = fmaf(qv.z, kv.z, d[u]);
                            d[u] = fmaf(qv.w, kv.w, d[u]);
                        }
                    }
                }
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    float v = warp_sum(d[u]) * a.scale;
                    if (a.softcap > 0.f) v = a.softcap * tanhf(v / a.softcap);
                    if (lane == 0 && h0 + u < r) L.sc[(h0 + u) * L.tk + jj] = v;
                }
            }
        }
        ct.sync();
        if (warp < r) {  // online softmax, one warp per head
            float* sc = L.sc + warp * L.tk;
            float mx = -INFINITY;
            for (int i = lane; i < nt; i += 32) mx = fmaxf(mx, sc[i]);
            mx = warp_max(mx);
            const float mo = t0 == k0 ? -INFINITY : L.m[warp], mn = fmaxf(mo, mx);
            float s = 0.f;
            for (int i = lane; i < nt; i += 32) {
                const float p = expf(sc[i] - mn);
                sc[i] = p;
                s += p;
            }
            s = warp_sum(s);
            if (lane == 0) {
                const float corr = t0 == k0 ? 0.f : expf(mo - mn);
                L.l[warp] = (t0 == k0 ? 0.f : L.l[warp] * corr) + s;
                L.m[warp] = mn;
                L.corr[warp] = corr;
            }
        }
        cp_async_wait<0>();  // the V rows
        ct.sync();
        if (t0 == k0 && it == 0) stamp_at(stamps, 2);
        // p.V: a thread per dimension and four heads, each V value read once; per (head,
        // dimension) the keys in order.
        for (int i = tid; i < ((r + 3) >> 2) * hd; i += SS_NW * 32) {
            const int h0 = i / hd * 4, d = i - i / hd * hd;
            float acc[4];
#pragma unroll
            for (int u = 0; u < 4; u++) acc[u] = h0 + u < r ? L.o[(h0 + u) * hd + d] * L.corr[h0 + u] : 0.f;
            for (int jj = 0; jj < nt; jj++) {
                const float v = L.vt[jj * hd + d];
#pragma unroll
                for (int u = 0; u < 4; u++)
                    if (h0 + u < r) acc[u] = fmaf(L.sc[(h0 + u) * L.tk + jj], v, acc[u]);
            }
#pragma unroll
            for (int u = 0; u < 4; u++)
                if (h0 + u < r) L.o[(h0 + u) * hd + d] = acc[u];
        }
    }
    ct.sync();
    for (int i = tid; i < r * hd; i += SS_NW * 32) {
        const int hl = i / hd, d = i - hl * hd;
        a.part_acc[((size_t)(g * r + hl) * ATTN_MAX_SPLITS + j) * hd + d] = L.o[i];
    }
    if (tid < r) {
        const size_t pi = (size_t)(g * r + tid) * ATTN_MAX_SPLITS + j;
        a.part_ml[2 * pi] = L.m[tid];
        a.part_ml[2 * pi + 1] = L.l[tid];
    }
    ct.sync();  // the area is free for the next item
}

// The merge of outputs [o0, o1): 32 at a time, lane = output, warp w taking ranges
// w, w + SS_NW, ...; each lane's partials are loaded before the weights are known, so a chunk
// costs one memory round trip with coalesced loads (a warp per output, lanes over ranges, cost a
// round trip per output: 0.123 -> 0.092 ms a step, 496 -> 500 tok/s on E4B shapes, H200).
// Warps 0-1 work out a head's weights e_s = exp(m_s - max m) and l = sum(l_s e_s) (lanes over
// ranges, then a warp sum) into shared memory; each warp's sum over its ranges goes to
// shared memory and warp 0 adds the warps' sums in order. `ws`: shared scratch of at least
// 2 x ATTN_MAX_SPLITS + 2 + SS_NW x 32 floats (free after the ranges barrier).
__device__ void ssa_merge(const AttnParams& a, int hd, int S, int o0, int o1, float* ws) {
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const ConsumerThreads ct;
    float* ew = ws;                             // [2][ATTN_MAX_SPLITS] the chunk's heads' weights
    float* el = ws + 2 * ATTN_MAX_SPLITS;       // [2] their l
    float* red = el + 2;                        // [SS_NW][32] the warps' sums
    for (int c0 = o0; c0 < o1; c0 += 32) {
        const int o = c0 + lane, h0 = c0 / hd;  // a chunk of 32 outputs spans at most two heads (hd >= 64)
        const bool in = o < o1;
        const int h = in ? o / hd : h0, d = o - h * hd;
        float ps[SSA_MR];
        const float* pa = a.part_acc + (size_t)h * ATTN_MAX_SPLITS * hd + d;
#pragma unroll
        for (int i = 0; i < SSA_MR; i++) {
            const int s = warp + i * SS_NW;
            ps[i] = in && s < S ? __ldcg(pa + (size_t)s * hd) : 0.f;
        }
        const int hl = min(c0 + 31, o1 - 1) / hd;  // the chunk's last head
        if (warp <= hl - h0) {
            const float* ml = a.part_ml + 2 * (size_t)(h0 + warp) * ATTN_MAX_SPLITS;
            float ms[ATTN_MAX_SPLITS / 32], ls[ATTN_MAX_SPLITS / 32];
#pragma unroll
            for (int c = 0; c < ATTN_MAX_SPLITS / 32; c++) {
                const int s = lane + 32 * c;
                if (s < S) {
                    ms[c] = __ldcg(ml + 2 * s);
                    ls[c] = __ldcg(ml + 2 * s + 1);
                }
            }
            float mx = -INFINITY;
#pragma unroll
            for (int c = 0; c < ATTN_MAX_SPLITS / 32; c++)
                if (lane + 32 * c < S) mx = fmaxf(mx, ms[c]);
            mx = warp_max(mx);
            float l = 0.f;
#pragma unroll
            for (int c = 0; c < ATTN_MAX_SPLITS / 32; c++) {
                if (lane + 32 * c < S) {
                    const float e = expf(ms[c] - mx);
                    ew[warp * ATTN_MAX_SPLITS + lane + 32 * c] = e;
                    l = fmaf(ls[c], e, l);
                }
            }
            l = warp_sum(l);
            if (lane == 0) el[warp] = l;
        }
        ct.sync();
        float acc = 0.f;
        const float* e = ew + (h - h0) * ATTN_MAX_SPLITS;
#pragma unroll
        for (int i = 0; i < SSA_MR; i++) {
            const int s = warp + i * SS_NW;
            if (in && s < S) acc = fmaf(ps[i], e[s], acc);
        }
        red[warp * 32 + lane] = acc;
        ct.sync();
        if (warp == 0 && in) {
            float t = 0.f;
#pragma unroll
            for (int w = 0; w < SS_NW; w++) t += red[w * 32 + lane];
            a.out[o] = t * (1.f / el[h - h0]);
        }
        ct.sync();  // the scratch is reused by the next chunk
    }
}

// The whole operation on this SM (the first item's first tile requested by ssa_prestage).
// Profiling stamps (SM 0): 6 its first tile's inputs ready, 2 its scores and softmax done, 1 its
// items done, 7 every SM's.
__device__ void ssa_op(const AttnParams& a, float* xs, const SsaLayout& kept, unsigned* adone, unsigned target,
                       unsigned long long* stamps, unsigned long long* tl) {
    const int tid = threadIdx.x;
    const ConsumerThreads ct;
    const SsaLayout L = kept;
    const int items = a.nkv * L.S;
    for (int it = blockIdx.x; it < items; it += gridDim.x)
        ssa_item(a, L, it, it == (int)blockIdx.x, stamps, tl);
    stamp_at(stamps, 1);
    ss_tl_at(tl, 5);
    // Every SM's partials stored (the barrier orders this SM's stores before the release).
    ct.sync();
    if (tid == 0) {
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(adone) : "memory");
        ss_wait_count(adone, target);
    }
    ct.sync();
    stamp_at(stamps, 7);
    ss_tl_at(tl, 6);
    // This SM's slice of the nh * hd outputs: out = sum(acc_s e_s) / sum(l_s e_s) with
    // e_s = exp(m_s - max m) (attn_combine_head's terms, summed in another order).
    const int hd = L.hd, S = L.S, total = a.nh * hd;
    const int per = (total + gridDim.x - 1) / gridDim.x;
    const int o0 = blockIdx.x * per, o1 = min(total, o0 + per);
    ssa_merge(a, hd, S, o0, o1, xs);
}

// FMT: ss_gemv's cell format.
// I8H: a bf16 kernel that also runs an int8 output head (SS_W_INT8 operations, the scale ring);
// the plain bf16 kernels are compiled without it, so their code is the measured one.
template <int NCH, int FMT = SS_FMT_A8, bool I8H = false>
__device__ void stream_body(const StreamParams& P) {
    static_assert(!I8H || FMT == SS_FMT_W16, "an int8 head is for the bf16 kernels");
    constexpr int CU4 = FMT == SS_FMT_W16 ? SS_W16_U4 : SS_CELL_U4;
    extern __shared__ __align__(128) unsigned char ss_dyn[];
    __shared__ uint64_t full[NCH];
    __shared__ unsigned landed_w, wdone_w[SS_NW];
    __shared__ volatile int hold;
    __shared__ unsigned done_base;
    __shared__ int pos_s;  // the step's position (every attention's)
    __shared__ SsaLayout lay;  // the attention's layout, worked out before its wait
    __shared__ SsShared sm;
    __shared__ uint4 op_stage[2][STEP_OP_BYTES / 16];
    __shared__ SmShare share_stage[2];
    unsigned char* ring = ss_dyn;
    float* xs = (float*)(ss_dyn + (size_t)NCH * SS_CH * CU4 * 16);
    uint2* xf = (uint2*)(xs + P.x_floats);
    // The int8 cells' scale ring (SS_SC_U4 a cell), after the int8 fragments' area; the host
    // gives the W16 kernels room for it where the stream has int8 cells.
    uint4* sring = (uint4*)((unsigned char*)xf + SS_XF_BYTES);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, tid = threadIdx.x;
    const int nsm = gridDim.x;

    if (tid == 0) {
        for (int i = 0; i < NCH; i++) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
            const unsigned count = 1;  // the bulk copy's expect_tx arrival
#else
            const unsigned count = 32;  // the producer lanes' cp.async arrivals
#endif
            asm volatile("mbarrier.init.shared.b64 [%0], %1;" ::"r"(ss_smem(&full[i])), "r"(count) : "memory");
        }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
        landed_w = 0;
        hold = 0;
        // The step's position (attention), read once per launch (every attention's prestage paid
        // its round trip before its wait: +0.3-0.8% a step, docs/performance.md, fifteenth
        // session), requested before the counter so both are in flight.
        const int pos = P.pos ? *P.pos : 0;
        // Every SM reads the last operation's counter before it publishes anything; no SM can
        // publish the last operation before every SM has published the one before it, so this
        // is the count the previous launches left.
        unsigned v;
        asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(P.done + P.n_ops - 1) : "memory");
        done_base = v;
        pos_s = pos;
    }
    if (tid < SS_NW) wdone_w[tid] = 0;
    if (tid < 16) sm.xzero[tid] = make_uint2(0u, 0u);
    if (tid < STEP_OP_BYTES / 16) op_stage[0][tid] = ((const uint4*)P.ops)[tid];
    __syncthreads();
    if (warp == SS_NW) {
        ss_produce<NCH, CU4, I8H>(P, ring, full, P.sm_cells[blockIdx.x], lane, &hold, &landed_w, wdone_w, sring);
        return;
    }

    SsRing<NCH, CU4> R;
    R.cells = (const uint4*)ring;
    R.have = 0;
    R.rel = 0;
    R.landed = ss_smem(&landed_w);
    R.wdone = ss_smem(&wdone_w[warp]);
    const ConsumerThreads ct;
    const unsigned target = done_base + (unsigned)nsm;
    const int avail = P.x_floats + SS_MAXG * 32;  // attention staging: x and the int8 fragments
    int pc = 0;
    for (int k = 0; k < P.n_ops; k++) {
        const StepOp& op = *(const StepOp*)op_stage[k & 1];
        // The next record (and, for a GEMV, this SM's share) staged before this one's wait.
        // (Not by thread 0, which polls: a load here would put its round trip before the poll's
        // on the path of the operation's last SM.)
        if (k + 1 < P.n_ops && tid >= 64 && tid < 64 + STEP_OP_BYTES / 16)
            op_stage[(k + 1) & 1][tid - 64] = ((const uint4*)(P.ops + k + 1))[tid - 64];
        if (op.kind == STEP_GEMV && tid >= 32 && tid < 32 + 9)
            ((unsigned*)&share_stage[k & 1])[tid - 32] =
                ((const unsigned*)(P.shares + (size_t)blockIdx.x * P.n_gemv + op.next_gemv))[tid - 32];
        // Attention by KV head: this SM's first keys requested before the wait.
        if (op.kind == STEP_ATTN)
            ssa_prestage(op.a, xs, avail, P.attn_tk, P.attn_min_keys, pos_s, lay);
        if (SS_PRE_CST && op.kind == STEP_GEMV)
            ss_constants_async(op.g, xs, P.x_floats);
        unsigned long long* tl = ss_tl_op(P, k);
        ss_tl_at(tl, 0);
        // (Not an argmax over this SM's own lm_head rows: its own barrier ordered them.)
        // The timing probe HAYAI_STREAM_PROBE_NOWAIT (wrong outputs): an operation the host
        // marked starts on its stale input without waiting for the one before it, what one
        // grid-wide hand-over fewer would give with every cell still run.
#if SS_PROBE_NOWAIT
        const int probe = ((const int*)&op)[SS_PROBE_WORD];
#else
        constexpr int probe = 0;
#endif
        const bool nowait = (probe & SS_PROBE_NOWAIT_BIT) != 0;
        if (k > 0 && tid == 0 && !(op.kind == STEP_ARGMAX1 && op.m.own) && !nowait) {
            // Every SM has published operation k - 1 (acquire: its outputs are visible).
            ss_wait_count(P.done + k - 1, target);
        }
        ct.sync();
        unsigned long long* stamps = P.timing ? P.timing + STEP_STAMPS * k : nullptr;
        stamp_at(stamps, 0);
        ss_tl_at(tl, 1);
        const int kind = op.kind;
        if (kind == STEP_GEMV) {
            if (I8H && op.g.int4 == SS_W_INT8)
                ss_gemv<NCH, I8H ? SS_FMT_I8 : FMT>(op.g, share_stage[k & 1], xs, xf, sm, R, pc, &hold, stamps,
                                                     P.x_floats, tl, sring, probe);
            else
                ss_gemv<NCH, FMT>(op.g, share_stage[k & 1], xs, xf, sm, R, pc, &hold, stamps, P.x_floats, tl,
                                  nullptr, probe);
        } else if (kind == STEP_ATTN) {
            ssa_op(op.a, xs, lay, P.done + P.n_ops + k, target, stamps, tl);
        } else if (kind == STEP_PLE) {
            step_ple(op.p, op.p.ld / op.p.dim, sm.sred, ct);
        } else if (kind == STEP_ARGMAX1) {
            if (op.m.own)
                ss_argmax_own<SS_NW * 32>(op.m, share_stage[(k - 1) & 1], ct);
            else
                step_argmax1<SS_NW * 32>(op.m, ct);
        } else if (kind == STEP_ARGMAX2) {
            step_argmax2<SS_NW * 32>(op.m, ct);
        }
        // The barrier orders every consumer's writes before thread 0's release (cumulative).
        ct.sync();
        ss_tl_at(tl, 3);
        if (tid == 0) {
            asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(P.done + k) : "memory");
            hold = 0;
            if (stamps) atomicMax(stamps + 5, global_ns());
        }
        stamp_at(stamps, 4);
    }
    // Let the producer finish (cells of GEMVs this SM had no units of are none; this releases all).
    R.release_to(0xffffffffu - SS_CH);
}

// NCH ring chunks: 10 where the shared memory allows (the H200: 227 KB), else 2.
extern "C" __global__ void __launch_bounds__(SS_THREADS, 1) decode_stream_r10(const StreamParams P) {
    stream_body<10>(P);
}
extern "C" __global__ void __launch_bounds__(SS_THREADS, 1) decode_stream_r2(const StreamParams P) {
    stream_body<2>(P);
}
// bf16 weights (--quant bf16): 5 chunks of 32 KB where the shared memory allows, else 2; int4
// weights times a fixed-point x (--quant int4): int4's rings.
extern "C" __global__ void __launch_bounds__(SS_THREADS, 1) decode_stream_w16_r5(const StreamParams P) {
    stream_body<5, SS_FMT_W16>(P);
}
extern "C" __global__ void __launch_bounds__(SS_THREADS, 1) decode_stream_w16_r2(const StreamParams P) {
    stream_body<2, SS_FMT_W16>(P);
}
// The same with an int8 output head (--lm-head: int8 cells, their scale ring after the int8
// fragments' area).
extern "C" __global__ void __launch_bounds__(SS_THREADS, 1) decode_stream_w16q8_r5(const StreamParams P) {
    stream_body<5, SS_FMT_W16, true>(P);
}
extern "C" __global__ void __launch_bounds__(SS_THREADS, 1) decode_stream_w16q8_r2(const StreamParams P) {
    stream_body<2, SS_FMT_W16, true>(P);
}
extern "C" __global__ void __launch_bounds__(SS_THREADS, 1) decode_stream_w4_r10(const StreamParams P) {
    stream_body<10, SS_FMT_W4>(P);
}
extern "C" __global__ void __launch_bounds__(SS_THREADS, 1) decode_stream_w4_r2(const StreamParams P) {
    stream_body<2, SS_FMT_W4>(P);
}
