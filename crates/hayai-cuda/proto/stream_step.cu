// Prototype of the streamed decode step (docs/performance.md, "the persistent step"): measures
// whether weights streamed per SM across operation boundaries, with the activations passed along
// the chain by per-operation counters, get an E4B-shaped GEMV chain close to the DRAM bandwidth.
// Standalone (nvcc only, no engine), run on the GPU machine by scripts/proto-stream.sh; it checks
// every operation against a plain reference GEMV (or attention) applied to the chain's own input.
// `--cell-rate` measures the consumers' arithmetic alone (cells resident in shared memory).
//
// What it models: 1 + 42 x 6 + 1 GEMVs with E4B's shapes, int4 (or bf16 with W16) (per-layer-
// embedding model projection; per layer QKV, O, gate/up with GeGLU, down, PLE gate, PLE
// projection; lm_head), each reading the previous one's output, RMS-normalized where Gemma
// normalizes. Between QKV and O, with --ctx N, attention over an N-position bf16 KV cache
// (sliding layers: the last 512; KV-shared layers read their donor's), split over SMs by key
// range and merged per head; without it O reads the QKV output's first 8 x head_dim values. Not
// modelled: the q/k norm weights and RoPE, the KV append, residual adds, the PLE mix, argmax.
//
// Design:
// * Weights in 1,056-byte cells (16 rows x 128 columns of int4 = 1,024 bytes in the order the
//   mma fragments want them, then the 16 rows' bf16 group scales). Every operation's units (a
//   16-row tile's K range of G / S groups, S per operation chosen so every SM streams about
//   the same bytes; PROTO_BALANCE=0: whole tiles) are split into contiguous ranges, one per
//   SM; at load the cells are copied into one contiguous stream per SM, 128-byte aligned, in
//   exactly the order that SM consumes them.
// * NP producer warps per SM copy its stream into a shared-memory ring of chunks (TMA bulk
//   copies on sm_90, cp.async elsewhere; an mbarrier per chunk for the copies), never waiting for
//   activations: the next operations' weights land while the consumers wait for their input.
//   With RINGFLAGS (the default) the producer alone waits on the copies and publishes a landed
//   count; the consumers publish how far they are done (see the Ring).
// * NW consumer warps: per operation they wait for the producer operation's counter (acquire),
//   read and normalize the input, build the B fragments in shared memory (bf16 hi/lo pair, or
//   with A8 int8 per 128-column group for the integer tensor cores), and multiply cells as they
//   land. An SM's units are taken in passes of up to NW; with fewer units than warps, kw = NW /
//   units warps share a unit along K and add their sums in shared memory (fixed order:
//   deterministic). A unit's rows leave the SM whole (or as one of S partial vectors the next
//   operation adds in order), published by one release after a block barrier.
#include <cuda_runtime.h>
// The engine's device helpers (mma_bf16, mma_u8s8, cp_async16, gelu_tanh, global_ns, ...).
#include "../kernels/common.cuh"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <vector>
#include <string>
#include <algorithm>

#include "proto.cuh"

#ifndef NW
#define NW 12                      // consumer warps
#endif
#ifndef NP
#define NP 1                       // producer warps (chunk c is producer c % NP's)
#endif
#ifndef RINGFLAGS
#define RINGFLAGS 1                // see the Ring below
#endif
#define THREADS ((NW + NP) * 32)   // + the producer warps
#ifndef W16
#define W16 0                      // bf16 weights: 16 rows x 64 columns per 2,048-byte cell, no scales
#endif
#if W16
#define CELL_BYTES 2048
#define GC 64                      // columns per cell (a "group" on the input side)
#ifndef CH_CELLS
#define CH_CELLS 8                 // cells per ring chunk (16,384 bytes)
#endif
#else
#define CELL_BYTES 1056
#define GC 128
#ifndef CH_CELLS
#define CH_CELLS 16                // cells per ring chunk (16,896 bytes)
#endif
#endif
#define STEPS (GC / 16)            // k16 steps per cell on the bf16-pair paths
#define CELL_U4 (CELL_BYTES / 16)
#ifndef PF
#define PF 0                       // bulk L2 prefetch of the chunk PF ring-lengths ahead (sm_90)
#endif
#define MAXJ 12                    // input entries per thread: K <= 12,288

struct Op {
    int rows, K, G;   // G = K / GC
    int norm;         // RMS-normalize the input
    int glu;          // interleaved (gate, up) rows -> gelu(gate) * up, rows / 2 outputs
    int in_off;       // first input element
    const float* in;  // input vector
    float* out;       // output vector
    int in_op;        // operation whose counter guards `in` (-1: external)
    int S;            // K splits, slice-major: unit u is K slice u / T (groups of G / S) of tile u % T (T =
                      // rows / 16); output S partial vectors
    int in_parts;     // partial vectors of the input (its producer's S), added in order
    int in_stride;    // floats between them
    int attn;         // >= 0: an attention operation (index into Params::attn), no weights
    int pubs;         // publications per launch that complete it (SMs, or heads for attention)
    int rep;          // REPL: floats between the copies of the output
    int in_rep;       // REPL: floats between the copies of the input
};

// An attention operation (--ctx N): the query heads of the QKV output against a bf16 KV cache of
// ctx positions (sliding layers: the last `window`), split over SMs by key range; the last split
// of a head to finish merges the head (fixed split order) and publishes it. Not modelled: the
// q/k norm weights, RoPE, appending the fresh key and value (the cache is pre-filled).
struct AttnOp {
    int heads, kv_heads, hd, ctx, window, splits;
    const __nv_bfloat16* kc;  // [kv_heads][ctx][hd]
    const __nv_bfloat16* vc;
    float* part;              // [heads * splits][hd] partial outputs (shared by all layers)
    float* ml;                // [heads * splits][2] their max and sum
    unsigned* hcnt;           // [heads] splits finished (monotonic over launches)
};

// REAL's per-operation input phase (see REAL below).
enum { RES_NONE = 0, RES_POST_PRE = 1, RES_PRE = 2, RES_POST = 3, RES_GELU_PLE = 4 };
struct OpReal {
    int res;               // RES_*
    float scalar;          // layer_scalar applied to h after the residual add (RES_POST_PRE)
    const __nv_bfloat16* w_post;  // post-norm weights of the incoming output (RES_POST_PRE, RES_POST)
    const __nv_bfloat16* w_pre;   // pre-norm weights of h (RES_POST_PRE, RES_PRE)
    const __nv_bfloat16* ple;     // RES_GELU_PLE: input = gelu(incoming) x ple
};

struct Params {
    const Op* ops;
    int n_ops;
    const uint4* stream;              // all SMs' streams
    const long long* sm_base;         // first cell of SM s's stream
    const unsigned* sm_total;         // cells in SM s's stream (worked out on the host)
    const OpReal* real;               // REAL: per operation (null: off)
    const float* x0;                  // REAL: the embedding (h before layer 0)
#if ARGMAX
    float2* cand;                     // ARGMAX: per SM (value, index as float bits)
    unsigned* arg_cnt;                // ARGMAX: candidates written (monotonic over launches)
    int* token;                       // ARGMAX: the greedy token
#endif
    int interleave;                   // stream chunk c of SM s at chunk c * SMs + s of `stream`
    const AttnOp* attn;               // attention operations (--ctx)
    unsigned* done;                   // per-operation counters (monotonic over launches)
    unsigned epoch;                   // launch number, from 1
    int mode;  // 0 full chain, 1 no waits for inputs, 2 stream only, 3 compute only (no copies:
               // the ring's stale contents), 4 = 3 without reading the inputs, 5 the producer alone
    unsigned xf_bytes;                // the B fragments' shared memory (the operation table follows it)
    unsigned long long* skew;         // --skew: [n_ops][SMs][2] global time at input ready and at publish, every SM (null: off)
    unsigned long long* stamps;       // [n_ops + 1][8] the last SM (it has a tile of every operation): input ready, inputs built, cells done, published, last pass before / after its barrier, ring chunks landed at input ready, input loads done (null: off)
};

__device__ __forceinline__ void mbar_init(uint64_t* b, unsigned count) {
    asm volatile("mbarrier.init.shared.b64 [%0], %1;" ::"r"(smem_u32(b)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* b) {
    asm volatile("{ .reg .b64 st; mbarrier.arrive.shared.b64 st, [%0]; }" ::"r"(smem_u32(b)) : "memory");
}
// Phase stamps: the SM's cycle counter (all stamps of a run come from one SM), printed as µs at
// the clock measured under load; the global timer is too coarse for sub-microsecond phases.
__device__ __forceinline__ unsigned long long stamp_now() { return clock64(); }

// Watchdog: a wait that has not returned after 2 s records what it waited for in host-mapped
// memory (readable while the kernel hangs) and the kernel winds down, so a scheduling mistake
// shows up as a message instead of a hung process.
__device__ unsigned g_abort;
__device__ int* g_dbg;
__device__ __noinline__ bool watchdog(unsigned long long& t0, int what, int info, unsigned parity) {
    if (*(volatile unsigned*)&g_abort) return true;
    const unsigned long long t = global_ns();
    if (t0 == 0) {
        t0 = t;
    } else if (t - t0 > 2000000000ull) {
        if (atomicCAS(&g_abort, 0u, 1u) == 0u && g_dbg) {
            volatile int* d = g_dbg;
            d[1] = what;
            d[2] = blockIdx.x;
            d[3] = threadIdx.x >> 5;
            d[4] = info;
            d[5] = (int)parity;
            __threadfence_system();
            d[0] = 1;
        }
        return true;
    }
    return false;
}
// sm_90: try_wait suspends the warp in hardware until the phase completes (or a time slice
// passes), so waiting warps do not take issue slots from the working ones; HINT=1 asks for a
// long time slice (1 ms). Below sm_90 a test_wait with a short sleep.
#ifndef HINT
#define HINT 1
#endif
__device__ __forceinline__ bool mbar_test(uint64_t* b, unsigned parity) {
    unsigned ok;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && HINT
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3; selp.u32 %0, 1, 0, p; }"
        : "=r"(ok)
        : "r"(smem_u32(b)), "r"(parity), "r"(1000000u)
        : "memory");
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(ok)
        : "r"(smem_u32(b)), "r"(parity)
        : "memory");
#else
    asm volatile(
        "{ .reg .pred p; mbarrier.test_wait.parity.shared.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(ok)
        : "r"(smem_u32(b)), "r"(parity)
        : "memory");
    if (!ok) __nanosleep(32);
#endif
    return ok != 0;
}
// what: 1 consumer waits for a chunk to land, 2 producer waits for a slot to be released.
__device__ __forceinline__ void mbar_wait(uint64_t* b, unsigned parity, int what = 0, int info = 0) {
    unsigned long long t0 = 0;
    for (unsigned n = 1; !mbar_test(b, parity); n++)
        if ((n & 15) == 0 && watchdog(t0, what, info, parity)) return;
}
// Whether the phase of the given parity has completed, without waiting (stamps only).
__device__ __forceinline__ bool mbar_done_now(uint64_t* b, unsigned parity) {
    unsigned ok;
    asm volatile("{ .reg .pred p; mbarrier.test_wait.parity.shared.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(ok)
                 : "r"(smem_u32(b)), "r"(parity)
                 : "memory");
    return ok != 0;
}
__device__ __forceinline__ void cp_async_arrive(uint64_t* b) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];" ::"r"(smem_u32(b)) : "memory");
}
__device__ __forceinline__ void consumers_sync() {
    asm volatile("bar.sync 1, %0;" ::"n"(NW * 32) : "memory");
}
// Shared-memory words between the warps of the block (the ring's flags; loads: proto.cuh).
__device__ __forceinline__ void st_release_cta(unsigned* p, unsigned v) {
    asm volatile("st.release.cta.shared.u32 [%0], %1;" ::"r"(smem_u32(p)), "r"(v) : "memory");
}
#ifndef OFFSET
#define OFFSET 0
#endif
#ifndef FENCE
#define FENCE 0
#endif
#ifndef HI16
#define HI16 1
#endif
// STEPPED=1 (W4A8): the cell loop's pointers stepped per pair of rounds instead of recomputed per
// cell (107 SASS instructions per two cells against 125). Measured (ninth session): cells-only
// -2.6%, full chain -0.3% before OPSMEM's per-SM shares, +0.2% after: not the default.
#ifndef STEPPED
#define STEPPED 0
#endif
// POLLW=1: every consumer warp polls the input's counter itself instead of thread 0 and a block
// barrier (measured: +5% step time). KW1DIRECT=1: passes of one warp per unit store their rows
// from the warp, without the pass barrier (measured: no change). Neither is the default.
#ifndef POLLW
#define POLLW 0
#endif
#ifndef KW1DIRECT
#define KW1DIRECT 0
#endif
// ATTSTAGE=1: an attention split's K (and V, when both fit) rows are copied into shared memory
// (the B-fragment area, free between QKV and O) with cp.async *before* the split waits for its
// query, so the scores and p.V read shared memory after one barrier instead of 2 + 5 dependent
// global round trips; where only K fits, V follows into the same place after the scores,
// overlapping the softmax. Measured (tenth session, ctx 640, A/B/A): attention 6.8-7.0 -> 5.2 µs
// per layer, the chain 2.128 -> 2.060 ms; now the default (ATTSTAGE=0: loads from global memory).
// (In the engine the newest key and value come from this step's QKV: only the split holding
// the current position would have to read those two rows after the wait.)
#ifndef ATTSTAGE
#define ATTSTAGE 1
#endif
// Keys per warp loaded together for the scores, split partials per batch in the merge: the
// bf16 build is at its register limit (with 2 and 16 it spills 184 bytes).
#ifndef ATT_KB
#define ATT_KB (W16 ? 1 : 2)
#endif
#ifndef ATT_MB
#define ATT_MB (W16 ? 8 : 16)
#endif
#if ATTSTAGE
#define KV_LD(p) (*(p))  // generic: shared memory when staged
#else
#define KV_LD(p) __ldg(p)
#endif
// OPSMEM=1 (default): the operation records are copied into shared memory once per launch and
// each SM works out its share of every operation there (units, input groups, first pass, first
// unit's slice: SmOp), so the per-operation path loads no record from global memory and divides
// nothing. Measured (ninth session): full chain 1.710 -> 1.641 ms, `--tiny` 3.66 -> 3.21 µs per
// operation. OPSMEM=0: the record from global memory and the divisions per operation.
#ifndef OPSMEM
#define OPSMEM 1
#endif
// NAP: ns slept between polls of a producer's counter (0: spin; measured: no difference).
#ifndef NAP
#define NAP 20
#endif
// NOMBAR=1 (diagnostic, "cells only" mode alone): the ring's mbarrier waits and releases left
// out, the producer idle, so the consumers' cells run on the ring's stale contents with no
// chunk bookkeeping: what the bookkeeping costs the cell loop.
#ifndef NOMBAR
#define NOMBAR 0
#endif
// RINGFLAGS=1: the consumer warps touch no mbarrier. The producer warp alone waits for the copies
// (mbarrier, as the bulk copies need) and publishes how many chunks have landed in a shared word;
// each consumer warp publishes how many chunks it is done with in its own word, and the producer
// refills a slot once the minimum over the warps has passed it. A consumer then pays one shared
// load per chunk it reads instead of an mbarrier wait and an arrive on every chunk
// (the NOMBAR diagnostic: cells only 1.19 -> 0.83 ms without any chunk bookkeeping).
// Measured (tenth session, W4A8, ring 8 x 16 cells, A/B in one call): with THROTTLE and PFD=8
// the chain 1.602 -> 1.520 ms, cells only 1.195 -> 1.106; the default. RINGFLAGS=0: the
// mbarrier ring (every consumer warp waits for and releases every chunk).
// A hybrid (consumers read the landed word but release through the empty mbarriers; a second
// warp waits for the landings) measured 1.571 / 1.584 ms against 1.529 and was removed.
// RFDIAG=1 (diagnostic, RINGFLAGS=1, "cells only"): the producer declares every chunk landed at
// once and leaves, so the consumers run without it (measured 1.029 against 1.106 ms: what the
// producer's polling costs the consumers).
#if RINGFLAGS && NP != 1
#error "RINGFLAGS has one producer warp"
#endif
#if RINGFLAGS > 1
#error "RINGFLAGS is 0 or 1"
#endif
// THROTTLE=1: the producer issues no copy while the consumers publish an operation (from the
// end of its last pass to the release), so the output stores and the release are not queued
// behind the weight stream's requests. THROTTLE=2: nor until the next operation's input has been
// read (its loads not queued behind the stream either). Measured (tenth session): THROTTLE=1
// 1.662 -> 1.592 ms (gate/up's publish 1.67 -> 0.96 µs), THROTTLE=2 no better; 1 is the default.
#ifndef THROTTLE
#define THROTTLE 1
#endif
// PFD=N (sm_90): while the producer waits for a free slot, it requests the next chunks (up to N
// beyond the one waiting) into L2 with bulk prefetches, so the weight stream keeps going while the
// ring is full (during the links) and the refills come from L2. Measured (tenth session, with
// THROTTLE): RINGFLAGS=1 1.581 -> 1.529 (PFD=8) / 1.533 (16) ms; with the mbarrier ring
// (RINGFLAGS=0) 1.59 -> 1.62-1.72 ms for PFD 4-32. The default is 8; sm_80/86 have no bulk
// prefetch (PFD does nothing there). bf16 (W16, 4 x 32-KB chunks): 3.165 ms without, 4.06 with
// PFD=8, so its default is 0.
#ifndef PFD
#define PFD (W16 ? 0 : 8)
#endif
// PSLEEP=N (sm_90, RINGFLAGS=1): with a copy in flight and nothing else to do, the producer sleeps
// in the hardware's mbarrier wait for the oldest copy (woken when it lands, at most N ns) instead
// of polling, leaving its scheduler's issue slots to the consumers. Measured (tenth session):
// 1.533 -> 1.523 (300) / 1.521 (1000) ms; 300 is the default.
#ifndef PSLEEP
#define PSLEEP 300
#endif
// PNAP: ns the RINGFLAGS producer sleeps when it can neither copy nor publish a landing
// (200: 1.608 -> 1.625 ms with THROTTLE=2).
#ifndef PNAP
#define PNAP 20
#endif
// Nibbles at bits 0-3 and 16-19 as bf16x2 of (nibble - 8), exact (see gemv_mma.cu). With OFFSET
// the subtraction is left out: the pair is bf16 (136 + q), exact, and the cell's sum is corrected
// by 136 times the group's input sum, computed once per operation.
__device__ __forceinline__ uint32_t nib_pair(uint32_t w) {
    uint32_t d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(w), "n"(0x000F000Fu), "r"(0x43004300u));
#if OFFSET
    return d;
#else
    const __nv_bfloat162 q = __hsub2(*(const __nv_bfloat162*)&d, __floats2bfloat162_rn(136.f, 136.f));
    return *(const uint32_t*)&q;
#endif
}
// A lane's part of a cell: its 8 nibble words (two 16-byte loads) and the group scales of its
// rows g and g + 8.
struct CellLane {
    uint32_t ws[8];
    float sa, sb;
};
__device__ __forceinline__ CellLane cell_lane(const uint4* cp, int lane) {
    const uint4 w0 = cp[lane], w1 = cp[32 + lane];
    const uint16_t* sc = (const uint16_t*)(cp + 64);
    const int g = lane >> 2;
    return CellLane{{w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w},
                    __uint_as_float((uint32_t)sc[g] << 16),
                    __uint_as_float((uint32_t)sc[g + 8] << 16)};
}

#ifndef A8
#define A8 0
#endif
// A8 (W4A8): the input quantized to int8 per 128-column group (scale = max|x| / 127) and the
// products taken on the integer tensor cores (m16n8k32, u8 nibbles x s8 inputs, exact int32
// sums); the nibbles' offset of 8 comes off exactly through the group's integer input sum. A
// pair of LOP3 (and a shift) turns 8 nibbles into two A registers, against 11 instructions for
// 4 registers on the bf16 path.
//
// One cell (W4A8): lane (g, c) words 2t, 2t + 1 hold, byte i, rows g (low nibble) and g + 8
// (high nibble) at columns 32 t + 4 c + i and 32 t + 16 + 4 c + i.
// xb: this lane's B fragment entries (group base + lane for lanes 0-3, the only ones with a
// column-0 value), or 16 zero entries for the other lanes: one unpredicated load per step.
__device__ __forceinline__ void cell_imma(const uint4* cp, const uint2* xb, int xs8, float xsc, int lane,
                                          float& acc_a, float& acc_b) {
    const CellLane L = cell_lane(cp, lane);
    const uint32_t* ws = L.ws;
    const float sa = L.sa, sb = L.sb;
    int d[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
#pragma unroll
    for (int t = 0; t < 4; t++) {
#if HI16
        // Rows g + 8 (high nibbles) left in place as 16 q (<= 240, still a u8): one LOP3 per
        // register instead of a shift and a LOP3; their sums come out 16x, exactly.
        const uint32_t a[4] = {ws[2 * t] & 0x0F0F0F0Fu, ws[2 * t] & 0xF0F0F0F0u, ws[2 * t + 1] & 0x0F0F0F0Fu,
                               ws[2 * t + 1] & 0xF0F0F0F0u};
#else
        const uint32_t a[4] = {ws[2 * t] & 0x0F0F0F0Fu, (ws[2 * t] >> 4) & 0x0F0F0F0Fu,
                               ws[2 * t + 1] & 0x0F0F0F0Fu, (ws[2 * t + 1] >> 4) & 0x0F0F0F0Fu};
#endif
        const uint2 bv = xb[t * 4];
        const uint32_t b[2] = {bv.x, bv.y};
        mma_u8s8(d[t & 1], a, b);
    }
#if HI16
    const float fa = (float)(d[0][0] + d[1][0] - 8 * xs8), fb = (float)(((d[0][2] + d[1][2]) >> 4) - 8 * xs8);
#else
    const float fa = (float)(d[0][0] + d[1][0] - 8 * xs8), fb = (float)(d[0][2] + d[1][2] - 8 * xs8);
#endif
    acc_a = fmaf(fa * xsc, sa, acc_a);
    acc_b = fmaf(fb * xsc, sb, acc_b);
}
#ifndef DP4A
#define DP4A 0
#endif
#if DP4A && !A8
#error "DP4A takes the W4A8 inputs (A8=1)"
#endif
// DP4A=1 (--cell-rate only; measured in the tenth session: 85.7 KB/µs/SM against the tensor-core
// cell's 74.9, not yet in the chain): the same 1,056-byte int4 cell in a row-owned layout on the
// CUDA cores instead of the tensor cores (whose legacy mma.sync pipe caps the W4A8 cell at ~110
// cycles per scheduler).
// Lane = row + 16 x (K half); its 64 nibbles at bytes [16 lane, +16) and [512 + 16 lane, +16);
// the input as int8 words of even and odd positions (word 2j: inputs 8j + 0, 2, 4, 6; word
// 2j + 1: 8j + 1, 3, 5, 7), 64 bytes per half. Low nibbles masked in place, high nibbles left
// at 16q (a u8 <= 240) and their sum shifted back: two LOP3 and two dp4a per 8 weights.
__device__ __forceinline__ int dp4a_us(uint32_t a, uint32_t b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
__device__ __forceinline__ void cell_dp4a(const uint4* cp, const uint4* xq, int xs8, float xsc, int lane, float& acc) {
    const uint4 w0 = cp[lane], w1 = cp[32 + lane];
    const float sc = __uint_as_float((uint32_t)((const uint16_t*)(cp + 64))[lane & 15] << 16);
    const uint4* xh = xq + (lane >> 4) * 4;  // this K half's 16 input words
    const uint32_t w[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
    int lo = 0, hi = 0;
#pragma unroll
    for (int q = 0; q < 4; q++) {
        const uint4 x = xh[q];
        lo = dp4a_us(w[2 * q] & 0x0F0F0F0Fu, x.x, lo);
        hi = dp4a_us(w[2 * q] & 0xF0F0F0F0u, x.y, hi);
        lo = dp4a_us(w[2 * q + 1] & 0x0F0F0F0Fu, x.z, lo);
        hi = dp4a_us(w[2 * q + 1] & 0xF0F0F0F0u, x.w, hi);
    }
    int d = lo + (hi >> 4);
    d += __shfl_xor_sync(0xffffffffu, d, 16);  // the two K halves
    acc = fmaf((float)(d - 8 * xs8) * xsc, sc, acc);
}

#if W16 && (A8 || OFFSET)
#error "W16 cells take bf16-pair inputs only"
#endif
// One bf16 cell (W16): lane (g, c) holds at uint4 s * 32 + lane step s's A fragment as mma
// m16n8k16 wants it: rows g / g + 8 at columns 16 s + 2 c, + 1 and 16 s + 8 + 2 c, + 1. No
// unpacking, no scales: the products of the input's hi and lo halves (columns 0 and 1) add up.
__device__ __forceinline__ void cell_w16(const uint4* cp, const uint2* xg, int lane, float& acc_a, float& acc_b) {
    float d[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
    for (int s = 0; s < STEPS; s++) {
        const uint4 w = cp[s * 32 + lane];
        const uint32_t a[4] = {w.x, w.y, w.z, w.w};
        uint2 bv = make_uint2(0u, 0u);
        if (lane < 8) bv = xg[s * 8 + lane];
        const uint32_t b[2] = {bv.x, bv.y};
        mma_bf16(d[s & 1], a, b);
    }
    acc_a += (d[0][0] + d[1][0]) + (d[0][1] + d[1][1]);
    acc_b += (d[0][2] + d[1][2]) + (d[0][3] + d[1][3]);
}
#if W16
#define CELL(pos, grp) cell_w16(R.cell(pos), xf + (grp) * (STEPS * 8), lane, acc_a, acc_b)
#elif A8
#define CELL(pos, grp) \
    cell_imma(R.cell(pos), lane < 4 ? xf + (grp) * 16 + lane : xzero, xs8[grp], xsc[grp], lane, acc_a, acc_b)
#elif OFFSET
#define CELL(pos, grp) cell_mma(R.cell(pos), xf + (grp) * 64, xsum[grp], lane, acc_a, acc_b)
#else
#define CELL(pos, grp) cell_mma(R.cell(pos), xf + (grp) * 64, 0.f, lane, acc_a, acc_b)
#endif

__device__ __forceinline__ uint32_t bf16x2_bits(float a, float b) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
    return *(const uint32_t*)&v;
}

// The cells of one SM's share of an operation, in stream order: passes of up to NW tiles; in a
// pass of np tiles, kw = NW / np warps per tile; round r holds, per tile, groups r kw .. r kw +
// kw - 1 (fewer in the last round). Host and device agree on this order.
struct Pass {
    int np, kw, rounds;
};
__host__ __device__ inline Pass pass_of(int nt, int p, int G) {
    Pass q;
    q.np = nt - p * NW < NW ? nt - p * NW : NW;
    q.kw = NW / q.np;
    q.rounds = (G + q.kw - 1) / q.kw;
    return q;
}
__host__ __device__ inline void sm_tiles(int rows, int P, int s, int& t0, int& nt) {
    const int T = rows / 16;
    t0 = (int)((long long)T * s / P);
    nt = (int)((long long)T * (s + 1) / P) - t0;
}

// OPSMEM: what an SM needs of an operation, worked out once per launch (the divisions), so the
// per-operation path has none: its units [t0, t0 + nt), the input groups it builds [g0, g1), the
// first pass's shape, and where its first unit sits (K slice, tile within the slice).
struct SmOp {
    int t0, nt, g0, g1;
    int np0, kw0, rounds0;
    int slice0, tile0;  // t0 / T, t0 % T
};
// Unit t0 + idx's K slice and tile (slice-major numbering), stepping from the first unit's.
__device__ __forceinline__ void unit_at(const SmOp& so, int T, int idx, int& slice, int& tile) {
    slice = so.slice0;
    tile = so.tile0 + idx;
    while (tile >= T) {
        tile -= T;
        slice++;
    }
}

// A consumer warp's view of the ring: NCH chunks (a compile-time count, so slot and parity are
// cheap), positions in cells of this SM's stream (32-bit: a stream holds < 2^31 cells).
template <int NCH>
struct Ring {
    const uint4* cells;
    uint64_t* full;
    uint64_t* empty;
    unsigned have;  // chunks [0, have) are known to have landed (this warp waited for them)
    unsigned rel;   // chunks [0, rel) are released by this warp
#if RINGFLAGS
    unsigned landed;  // shared address of the producer's word: chunks [0, landed) have landed
    unsigned wdone;   // shared address of this warp's word: chunks [0, wdone) released

    __device__ __forceinline__ void land(unsigned c) {
        if (NOMBAR || have > c) return;
        unsigned long long t0 = 0;
        for (unsigned n = 1;; n++) {
            have = ld_acquire_cta(landed);
            if (have > c) return;
            if ((n & 1023) == 0 && watchdog(t0, 1, (int)c, 0)) return;
        }
    }
    // Chunks before pos's are done with; whether they landed is the producer's to check. Every
    // lane stores the same word (no branch, no warp barrier: the lanes are converged, mma.sync
    // needs them so), relaxed: the chunk's shared-memory reads have been consumed by the cells'
    // mma before this store issues, so the producer's refill cannot overtake them.
    __device__ __forceinline__ void release_to(unsigned pos, int lane) {
        const unsigned c = pos / CH_CELLS;
        if (NOMBAR || rel >= c) return;
        rel = c;
        asm volatile("st.volatile.shared.u32 [%0], %1;" ::"r"(wdone), "r"(c) : "memory");
    }
    __device__ __forceinline__ unsigned landed_ahead(unsigned pos) const {
        const unsigned l = ld_acquire_cta(landed), c = pos / CH_CELLS;
        return l > c ? min(l - c, (unsigned)NCH) : 0u;
    }
#else

    __device__ __forceinline__ void land(unsigned c) {  // wait until chunks up to c have landed
        if (NOMBAR) return;
        while (have <= c) {
            mbar_wait(&full[have % NCH], (have / NCH) & 1u, 1, (int)have);
            have++;
        }
    }
    // The warp moves its position to `pos`: the chunks before pos's chunk are released, each
    // after waiting for it to land. Waiting on every chunk in order, even ones this warp does not
    // read, keeps the parity waits unambiguous: no warp runs a whole ring ahead of the fills, and
    // a slot is never refilled while a copy into it is still in flight.
    __device__ __forceinline__ void release_to(unsigned pos, int lane) {
        if (NOMBAR) return;
        const unsigned c = pos / CH_CELLS;
        while (rel < c) {
            land(rel);
            __syncwarp();
            if (lane == 0) mbar_arrive(&empty[rel % NCH]);
            rel++;
        }
    }
    // Chunks from pos's on that have landed, in order (stamps only: how far ahead the stream is).
    __device__ __forceinline__ unsigned landed_ahead(unsigned pos) const {
        unsigned n = 0;
        for (unsigned c = pos / CH_CELLS; n < NCH && mbar_done_now(&full[c % NCH], (c / NCH) & 1u); c++) n++;
        return n;
    }
#endif
    __device__ __forceinline__ const uint4* cell(unsigned pos) const {
#if STEPPED
        constexpr unsigned n = NCH * CH_CELLS;  // the ring's cells; a mask when a power of 2
        return cells + ((n & (n - 1)) == 0 ? pos & (n - 1) : (pos / CH_CELLS) % NCH * CH_CELLS + pos % CH_CELLS) * CELL_U4;
#else
        return cells + ((pos / CH_CELLS) % NCH * CH_CELLS + pos % CH_CELLS) * CELL_U4;
#endif
    }
};

// One cell's products for this warp's 16 rows, added to acc_a (row g) / acc_b (row g + 8) in
// lanes c = 0. Two accumulator sets halve the chain of dependent mma.
__device__ __forceinline__ void cell_mma(const uint4* cp, const uint2* xg, float xsum, int lane,
                                         float& acc_a, float& acc_b) {
    const CellLane L = cell_lane(cp, lane);
    const uint32_t* ws = L.ws;
    const float sa = L.sa, sb = L.sb;
    float d[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
    for (int s = 0; s < 8; s++) {
        const uint32_t a[4] = {nib_pair(ws[s]), nib_pair(ws[s] >> 4), nib_pair(ws[s] >> 8),
                               nib_pair(ws[s] >> 12)};
        uint2 bv = make_uint2(0u, 0u);
        if (lane < 8) bv = xg[s * 8 + lane];
        const uint32_t b[2] = {bv.x, bv.y};
        mma_bf16(d[s & 1], a, b);
    }
    float da = (d[0][0] + d[1][0]) + (d[0][1] + d[1][1]), db = (d[0][2] + d[1][2]) + (d[0][3] + d[1][3]);
#if OFFSET
    da = fmaf(-136.f, xsum, da);
    db = fmaf(-136.f, xsum, db);
#endif
    acc_a = fmaf(da, sa, acc_a);
    acc_b = fmaf(db, sb, acc_b);
}

__device__ __forceinline__ void l2_prefetch(const void* src, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
#endif
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("{ .reg .b64 st; mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1; }" ::"r"(smem_u32(bar)),
                 "r"(bytes)
                 : "memory");
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
            smem_u32(dst)),
        "l"(src), "r"(bytes), "r"(smem_u32(bar))
        : "memory");
#endif
}

// Until every SM has published operation `k` in this launch (acquire: its outputs are visible).
__device__ __forceinline__ void wait_operation(const Params& P, int k, int pubs) {
    const unsigned target = P.epoch * (unsigned)pubs;
    unsigned long long t0 = 0;
    // A short sleep between polls (NAP ns; 0: spin).
    for (unsigned n = 1; (int)(ld_acquire_gpu(&P.done[k]) - target) < 0; n++) {
        if ((n & 255) == 0 && watchdog(t0, 3, k, 0)) break;
        if (NAP) __nanosleep(NAP);
    }
}

// The input groups an SM needs: all of them for a normalized input (the norm is over the whole
// vector), else those of its units' K ranges [s G, (s + 1) G) for the units' slices s (G groups per
// unit), as one range.
__device__ __forceinline__ void input_groups(const Op& op, int t0, int nt, int G, int& g0, int& g1) {
    g0 = 0;
    g1 = op.G;
    if (op.norm || op.S == 1) return;
    const int T = op.rows / 16;  // slice-major units: an SM's few units share one or two slices
    g0 = t0 / T * G;
    g1 = ((t0 + nt - 1) / T + 1) * G;
}

// The RMS norm's scale 1 / sqrt(mean x^2 + eps) from every consumer thread's partial sum of
// squares (one barrier; the warps' sums added in warp order).
__device__ __forceinline__ float consumers_rms_scale(float ss, int K, float* wsum, int warp, int lane) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) wsum[warp] = ss;
    consumers_sync();
    float t = 0.f;
    for (int i = 0; i < NW; i++) t += wsum[i];
    return rsqrtf(t / (float)K + 1e-6f);
}

// REAL=1 (W4A8): the input phases a Gemma 4 step needs. Each SM keeps the residual vector h in
// shared memory, updated identically everywhere (nobody writes it back): QKV and gate/up (and
// lm_head) add the post-normed incoming output to h (scaled by layer_scalar before QKV and
// lm_head) and then pre-normalize h — two block reductions; the PLE gate adds the post-normed
// down output to h and takes h as it is; the PLE projection's input is gelu(gate) x ple. Norm
// weights are read before the input's wait (they do not depend on it). Layer 0's QKV takes h =
// the embedding. Not yet: the PLE model projection's per-layer RMSNorm (ple here is a fixed
// vector per layer), q/k norms, RoPE, the KV append, the argmax. Measured (tenth session, 10-chunk
// ring): the GEMV chain 1.301 -> 1.503 ms, with attention (ctx 640, 8 chunks) 1.738 -> 1.956 ms;
// checked (rel L2 1.6e-4: the host's h rounds differently, so an input can quantize to the next
// step). One block reduction for both statistics (sum h'^2 expanded into sums of h^2, h x w and
// (x w)^2) measured slower (1.566 ms: more live registers, spills) and was removed.
#ifndef REAL
#define REAL 0
#endif
#if REAL && (!A8 || !OPSMEM)
#error "REAL is written for the W4A8 input path with OPSMEM's shares"
#endif

// ARGMAX=1: the greedy token after lm_head. Each SM takes the largest of its own lm_head rows
// (read back after its last pass; the first index wins ties), writes it as a candidate and adds
// to a counter; the SM whose addition completes the count reduces the candidates in SM order
// (ties: the lower index) and writes the token. Softcapping is monotonic: it does not move it.
// Written at the end of the tenth session after its device time ran out: compiled, not yet run
// (`run pending` runs it; the check compares the token with the host's argmax of the same logits).
#ifndef ARGMAX
#define ARGMAX 0
#endif

// REPL=R: every operation writes R copies of its output and SM s reads copy s % R, so the 132
// SMs' reads of the same vector spread over R times as many L2 lines (each line of an input is
// otherwise read by every SM at once). Measured (tenth session, W4A8, 11-chunk ring): 1.328 ->
// 1.301 ms with 4 copies (2 and 4 also -1% on the 8-chunk ring; 8 no better); the W4A8 default.
#ifndef REPL
#define REPL (A8 && !KW1DIRECT ? 4 : 1)
#endif
#if REPL > 1 && KW1DIRECT
#error "KW1DIRECT stores one copy"
#endif
#define OUT_STORE(o, idx, v)                                       \
    do {                                                           \
        const float v_ = (v);                                      \
        _Pragma("unroll") for (int r_ = 0; r_ < REPL; r_++)        \
            (o).out[(size_t)r_ * (o).rep + (idx)] = v_;            \
    } while (0)
// REDUXQ=1 (default): the quantization's half-warp maximum and integer sum by whole-warp
// reductions (redux, sm_80+) instead of shuffle trees. Measured (tenth session): 1.533 -> 1.497 ms.
#ifndef REDUXQ
#define REDUXQ 1
#endif
// W4A8 input entry (group grp, step t, c): inputs 32 t + 4 c + 0..3 (lo) and + 16 (hi), read from
// L2 (other SMs wrote them; mode 4 uses constants); returns their sum of squares.
__device__ __forceinline__ float a8_entry_load(const Params& P, const Op& op, int grp, int t, int c, float4& lo,
                                               float4& hi) {
    const float* x = op.in + op.in_off + grp * 128 + t * 32 + 4 * c;
    lo = hi = make_float4(1.f, 0.5f, -1.f, 0.25f);
    if (P.mode != 4) {
        lo = __ldcg((const float4*)x);
        hi = __ldcg((const float4*)(x + 16));
#pragma unroll
        for (int j = 1; j < 4; j++)
            if (j < op.in_parts) {  // the producer's partial vectors, added in order
                const float4 a = __ldcg((const float4*)(x + j * op.in_stride)),
                             b = __ldcg((const float4*)(x + j * op.in_stride + 16));
                lo = make_float4(lo.x + a.x, lo.y + a.y, lo.z + a.z, lo.w + a.w);
                hi = make_float4(hi.x + b.x, hi.y + b.y, hi.z + b.z, hi.w + b.w);
            }
    }
    return lo.x * lo.x + lo.y * lo.y + lo.z * lo.z + lo.w * lo.w + hi.x * hi.x + hi.y * hi.y + hi.z * hi.z +
           hi.w * hi.w;
}

// The entry's 8 inputs (times `scale`) quantized with its group (the 16 lanes of a half warp, all
// 32 lanes calling; `on` false: a lane without an entry, contributing nothing): the B fragment's
// bytes, the group's integer sum `qs` and max|x| `m` (on every lane of the half).
__device__ __forceinline__ uint2 a8_entry_quantize(float4 lo, float4 hi, float scale, bool on, int& qs, float& m) {
    const float x[8] = {lo.x * scale, lo.y * scale, lo.z * scale, lo.w * scale,
                        hi.x * scale, hi.y * scale, hi.z * scale, hi.w * scale};
    m = 0.f;
    if (on) {
#pragma unroll
        for (int i = 0; i < 8; i++) m = fmaxf(m, fabsf(x[i]));
    }
#if REDUXQ
    // Each half warp's maximum by two whole-warp integer reductions (|x| bit patterns order as the
    // values do) instead of four dependent shuffles.
    const bool lo_half = (threadIdx.x & 31) < 16;
    {
        const unsigned mb = __float_as_uint(m);
        const unsigned a = __reduce_max_sync(0xffffffffu, lo_half ? mb : 0u);
        const unsigned b = __reduce_max_sync(0xffffffffu, lo_half ? 0u : mb);
        m = __uint_as_float(lo_half ? a : b);
    }
#else
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
#endif
    const float inv = m > 0.f ? 127.f / m : 0.f;
    int q[8];
    qs = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        q[i] = max(-127, min(127, __float2int_rn(x[i] * inv)));
        if (on) qs += q[i];
    }
#if REDUXQ
    {
        const int a = __reduce_add_sync(0xffffffffu, lo_half ? qs : 0), b = __reduce_add_sync(0xffffffffu, lo_half ? 0 : qs);
        qs = lo_half ? a : b;
    }
#else
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) qs += __shfl_xor_sync(0xffffffffu, qs, o);
#endif
    return make_uint2((q[0] & 255) | (q[1] & 255) << 8 | (q[2] & 255) << 16 | (uint32_t)(q[3] & 255) << 24,
                      (q[4] & 255) | (q[5] & 255) << 8 | (q[6] & 255) << 16 | (uint32_t)(q[7] & 255) << 24);
}

// After a pass's barrier: the np units' rows (GeGLU'd when `glu`, whose S is 1) from the kw
// slice sums each warp left in red[warp][16], added in slice order, written to out from unit
// `tile0` on (unit u: rows of tile u % T in partial vector u / T).
// KW1DIRECT: a unit's 16 rows from the one warp that computed them (rows g in acc_a, g + 8 in
// acc_b of lanes 4 g), stored as pass_epilogue would (GeGLU: rows 2 j, 2 j + 1 of the tile are
// gate and up of output j) but without the barrier.
__device__ __forceinline__ void unit_store(const Op& op, int u, float acc_a, float acc_b, int lane) {
    const int g = lane >> 2;
    if (op.glu) {
        const float na = __shfl_down_sync(0xffffffffu, acc_a, 4), nb = __shfl_down_sync(0xffffffffu, acc_b, 4);
        if ((lane & 7) == 0) {
            op.out[u * 8 + (g >> 1)] = gelu_tanh(acc_a) * na;
            op.out[u * 8 + 4 + (g >> 1)] = gelu_tanh(acc_b) * nb;
        }
    } else if ((lane & 3) == 0) {
        const int T = op.rows / 16;
        op.out[u / T * op.rows + u % T * 16 + g] = acc_a;
        op.out[u / T * op.rows + u % T * 16 + g + 8] = acc_b;
    }
}

__device__ void pass_epilogue(const Op& op, const float (*red)[16], int np, int kw, int tile0, int tid,
                              const SmOp* so, int idx0) {
    if (op.glu) {
        for (int i = tid; i < np * 8; i += NW * 32) {
            const int ti = i >> 3, j = i & 7;
            float gsum = 0.f, usum = 0.f;
#pragma unroll
            for (int sl = 0; sl < NW; sl++)  // unrolled: the loads issue together
                if (sl < kw) {
                    gsum += red[ti * kw + sl][2 * j];
                    usum += red[ti * kw + sl][2 * j + 1];
                }
            OUT_STORE(op, (tile0 + ti) * 8 + j, gelu_tanh(gsum) * usum);
        }
    } else {
        for (int i = tid; i < np * 16; i += NW * 32) {
            const int ti = i >> 4, row = i & 15, u = tile0 + ti;
            float sum = 0.f;
#pragma unroll
            for (int sl = 0; sl < NW; sl++)
                if (sl < kw) sum += red[ti * kw + sl][row];
#if OPSMEM
            int slice, tile;  // without a division (u = so.t0 + idx0 + ti)
            unit_at(*so, op.rows >> 4, idx0 + ti, slice, tile);
            (void)u;
            OUT_STORE(op, slice * op.rows + tile * 16 + row, sum);  // partial vector `slice`
#else
            OUT_STORE(op, u / (op.rows / 16) * op.rows + u % (op.rows / 16) * 16 + row, sum);  // partial vector u / T
#endif
        }
    }
}

// Attention scratch in shared memory: the scaled query, the split's scores, its max and sum.
#define ATT_MAXK 256  // keys per split
struct AttnSmem {
    float q[512];
    float sc[ATT_MAXK];
    float m, l;
    float red[NW];
    int last;
};

// Attention item (head h, split j) of operation k on SM s: item i runs on SM nsm - 1 - i (so the
// last SM, whose stamps are printed, has one). The consumer warps score the split's keys (a warp
// per key, lanes over the head dimension), one warp takes the softmax, every thread a column of
// p.V; the split's partial goes to global memory and the last split of the head merges them in
// split order and publishes the head.
__device__ void attention_op(const Params& P, const Op& op, int in_pubs, const AttnOp& a, int k, int s, int nsm,
                             int tid, AttnSmem& sm, unsigned char* scratch) {
    const int item = nsm - 1 - s;
    const int warp = tid >> 5, lane = tid & 31;
    if (P.stamps && s == nsm - 1 && tid == 0) P.stamps[8 * k] = stamp_now();
    if (item >= a.heads * a.splits) return;
    // The split's head and keys [k0, k0 + nk) (sliding layers: the last `window` positions).
#define ATT_SPLIT_RANGE                                                                      \
    const int h = item / a.splits, j = item % a.splits, hd = a.hd;                           \
    const int kvh = h / (a.heads / a.kv_heads);                                              \
    const int lo = a.ctx > a.window ? a.ctx - a.window : 0, n = a.ctx - lo;                  \
    const int k0 = lo + n * j / a.splits, k1 = lo + n * (j + 1) / a.splits, nk = k1 - k0;
#if ATTSTAGE
    ATT_SPLIT_RANGE  // before the wait: the copies do not depend on the query
    const __nv_bfloat16* kbase = a.kc + ((size_t)kvh * a.ctx + k0) * hd;  // the split's K rows
    const __nv_bfloat16* vbase = a.vc + ((size_t)kvh * a.ctx + k0) * hd;
    const unsigned kv16 = (unsigned)nk * hd * 2 / 16;  // 16-byte pieces of the split's K (or V)
    const int stage = 2 * kv16 * 16 <= P.xf_bytes ? 2 : kv16 * 16 <= P.xf_bytes ? 1 : 0;  // K and V, K, none
    __nv_bfloat16* kst = (__nv_bfloat16*)scratch;
    if (stage) {
        for (unsigned i = tid; i < kv16; i += NW * 32) cp_async16((uint4*)kst + i, (const uint4*)kbase + i);
        if (stage == 2)
            for (unsigned i = tid; i < kv16; i += NW * 32) cp_async16((uint4*)kst + kv16 + i, (const uint4*)vbase + i);
        cp_async_commit();
    }
#else
    (void)scratch;
#endif
    if (P.mode == 0 && op.in_op >= 0) {
        if (tid == 0) wait_operation(P, op.in_op, in_pubs);
        consumers_sync();
    }
#if !ATTSTAGE
    ATT_SPLIT_RANGE  // after the wait, as measured (fewer registers live across it)
#endif
#undef ATT_SPLIT_RANGE
    // The query, RMS-normalized (unit weight) and scaled by 1 / sqrt(hd).
    float ss = 0.f;
    for (int d = tid; d < hd; d += NW * 32) {
        float v = __ldcg(op.in + h * hd + d);
        for (int jp = 1; jp < op.in_parts; jp++) v += __ldcg(op.in + jp * op.in_stride + h * hd + d);
        sm.q[d] = v;
        ss += v * v;
    }
    // The norm's barrier also completes sm.q; the second one keeps sm.red from being reused early.
    const float qs = consumers_rms_scale(ss, hd, sm.red, warp, lane) * rsqrtf((float)hd);
#if ATTSTAGE
    if (stage) {
        cp_async_wait<0>();  // this thread's copies; the barrier below makes everyone's visible
        kbase = kst;
        if (stage == 2) vbase = kst + (size_t)kv16 * 8;
    }
#endif
    consumers_sync();
    if (P.stamps && s == nsm - 1 && tid == 0) P.stamps[8 * k + 1] = stamp_now();
    // Scores: a warp per key, 8 bf16 per lane per 256 columns; two keys per warp loaded together
    // (fewer dependent memory round trips per split; more would spill registers in the step).
    constexpr int KB = ATT_KB;
    for (int i0 = warp; i0 < nk; i0 += NW * KB) {
        uint4 w[KB][2];
#pragma unroll
        for (int r = 0; r < KB; r++) {
            const int i = i0 + r * NW;
#if ATTSTAGE
            const __nv_bfloat16* kr = kbase + (size_t)i * hd;
#else
            const __nv_bfloat16* kr = a.kc + ((size_t)kvh * a.ctx + k0 + i) * hd;
#endif
#pragma unroll
            for (int c = 0; c < 2; c++)
                if (i < nk && lane * 8 + c * 256 < hd) w[r][c] = KV_LD((const uint4*)(kr + lane * 8 + c * 256));
        }
#pragma unroll
        for (int r = 0; r < KB; r++) {
            const int i = i0 + r * NW;
            if (i >= nk) break;  // warp-uniform
            float dot = 0.f;
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const int d0 = lane * 8 + c * 256;
                if (d0 >= hd) break;
                const __nv_bfloat162* w2 = (const __nv_bfloat162*)&w[r][c];
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float2 f = __bfloat1622float2(w2[e]);
                    dot = fmaf(f.x, sm.q[d0 + 2 * e], dot);
                    dot = fmaf(f.y, sm.q[d0 + 2 * e + 1], dot);
                }
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
            if (lane == 0) sm.sc[i] = dot * qs;
        }
    }
    consumers_sync();
#if ATTSTAGE
    if (stage == 1) {  // V into the place K leaves, while warp 0 takes the softmax
        for (unsigned i = tid; i < kv16; i += NW * 32) cp_async16((uint4*)kst + i, (const uint4*)vbase + i);
        cp_async_commit();
    }
#endif
    if (warp == 0) {  // softmax over the split's keys
        float m = -INFINITY;
        for (int i = lane; i < nk; i += 32) m = fmaxf(m, sm.sc[i]);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        float l = 0.f;
        for (int i = lane; i < nk; i += 32) {
            const float p = __expf(sm.sc[i] - m);
            sm.sc[i] = p;
            l += p;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
        if (lane == 0) {
            sm.m = m;
            sm.l = l;
        }
    }
#if ATTSTAGE
    if (stage == 1) {
        cp_async_wait<0>();
        vbase = kst;
    }
#endif
    consumers_sync();
    // p.V: a thread per column; the split's partial to global memory.
    for (int d = tid; d < hd; d += NW * 32) {
#if ATTSTAGE
        const __nv_bfloat16* vr = vbase + d;
#else
        const __nv_bfloat16* vr = a.vc + ((size_t)kvh * a.ctx + k0) * hd + d;
#endif
        float acc = 0.f;
        int i = 0;
        for (; i + 8 <= nk; i += 8) {  // eight loads in flight, the sum in key order as before
            float v[8];
#pragma unroll
            for (int e = 0; e < 8; e++) v[e] = __bfloat162float(vr[(size_t)(i + e) * hd]);
#pragma unroll
            for (int e = 0; e < 8; e++) acc = fmaf(sm.sc[i + e], v[e], acc);
        }
        for (; i < nk; i++) acc = fmaf(sm.sc[i], __bfloat162float(vr[(size_t)i * hd]), acc);
        a.part[(size_t)item * hd + d] = acc;
    }
    if (tid == 0) {
        a.ml[2 * item] = sm.m;
        a.ml[2 * item + 1] = sm.l;
    }
    consumers_sync();
    if (tid == 0) {  // the barrier orders the block's writes before this release (cumulative)
        __threadfence();
        const unsigned old = atomicAdd(a.hcnt + h, 1u);
        sm.last = old + 1 == P.epoch * (unsigned)a.splits;
        __threadfence();
    }
    consumers_sync();
    if (!sm.last) {
        if (P.stamps && s == nsm - 1 && tid == 0) P.stamps[8 * k + 2] = P.stamps[8 * k + 3] = stamp_now();
        return;
    }
    if (P.stamps && s == nsm - 1 && tid == 0) P.stamps[8 * k + 2] = stamp_now();
    // Merge the head's splits in split order.
    // The splits' (m, l) through shared memory (one load each), then every thread's partials in
    // flight together; sums in split order as before.
    const int i0 = h * a.splits;
    if (tid < a.splits) {
        sm.sc[2 * tid] = __ldcg(a.ml + 2 * (i0 + tid));
        sm.sc[2 * tid + 1] = __ldcg(a.ml + 2 * (i0 + tid) + 1);
    }
    consumers_sync();
    float M = -INFINITY;
    for (int t = 0; t < a.splits; t++) M = fmaxf(M, sm.sc[2 * t]);
    float L = 0.f;
    for (int t = 0; t < a.splits; t++) L += __expf(sm.sc[2 * t] - M) * sm.sc[2 * t + 1];
    for (int d = tid; d < hd; d += NW * 32) {
#if ATT_MB >= 16
        float pv[16];
#pragma unroll
        for (int t = 0; t < 16; t++)
            if (t < a.splits) pv[t] = __ldcg(a.part + (size_t)(i0 + t) * hd + d);
        float acc = 0.f;
#pragma unroll
        for (int t = 0; t < 16; t++)
            if (t < a.splits) acc += __expf(sm.sc[2 * t] - M) * pv[t];
#else
        float acc = 0.f;
        for (int t0 = 0; t0 < a.splits; t0 += ATT_MB) {  // ATT_MB partials in flight at a time
            float pv[ATT_MB];
#pragma unroll
            for (int t = 0; t < ATT_MB; t++)
                if (t0 + t < a.splits) pv[t] = __ldcg(a.part + (size_t)(i0 + t0 + t) * hd + d);
#pragma unroll
            for (int t = 0; t < ATT_MB; t++)
                if (t0 + t < a.splits) acc += __expf(sm.sc[2 * (t0 + t)] - M) * pv[t];
        }
#endif
        OUT_STORE(op, h * hd + d, acc / L);
    }
    consumers_sync();
    if (tid == 0) {
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(P.done + k) : "memory");
        if (P.stamps && s == nsm - 1) P.stamps[8 * k + 3] = stamp_now();
    }
}

// The ring's barriers (thread 0; the caller synchronizes): a chunk is full after `full_count`
// arrivals (1 bulk copy, or the 32 producer lanes' cp.async), empty after every consumer warp's.
template <int NCH>
__device__ void ring_init(uint64_t* full, uint64_t* empty, unsigned full_count) {
    for (int i = 0; i < NCH; i++) {
        mbar_init(&full[i], full_count);
        mbar_init(&empty[i], NW);
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

// Cells in SM s's stream.
__device__ unsigned sm_stream_cells(const Params& P, int s, int nsm) {
    unsigned total = 0;
    for (int k = 0; k < P.n_ops; k++) {
        int t0, nt;
        sm_tiles(P.ops[k].rows * P.ops[k].S, nsm, s, t0, nt);
        total += (unsigned)(nt * (P.ops[k].G / P.ops[k].S));
    }
    return total;
}

// The producer warp: SM s's `total` cells into the ring, chunk by chunk, each slot refilled once
// every consumer warp has released it; never waits for activations. Modes 3-4 (no copies) only
// mark the chunks full.
template <int NCH, bool BULK>
__device__ void produce(const Params& P, unsigned char* smem, uint64_t* full, uint64_t* empty, unsigned total,
                        int s, int nsm, int lane, int pw, volatile int* hold) {
    if (NOMBAR) return;
    const uint4* src = P.stream + P.sm_base[s] * CELL_U4;
    const unsigned nch = (total + CH_CELLS - 1) / CH_CELLS;
#if PFD
    unsigned pf = 0;  // chunks [0, pf) requested into L2 (or copied)
#endif
    for (unsigned c = pw; c < nch; c += NP) {
        const unsigned slot = c % NCH;
        // Mode 5 (the producer alone): a slot is reused once its previous copy has landed.
        if (c >= NCH) {
            uint64_t* eb = P.mode == 5 ? &full[slot] : &empty[slot];
            const unsigned par = ((c / NCH) - 1) & 1u;
#if PFD
            // While the slot is still taken, pull the next chunks into L2 (up to PFD ahead).
            if (pf < c) pf = c;
            const unsigned lim = min(nch, c + PFD);
            while (pf < lim && P.mode != 3 && P.mode != 4 && !P.interleave && !mbar_done_now(eb, par)) {
                if (THROTTLE && *hold) {
                    __nanosleep(32);
                    continue;
                }
                if (lane == 0) l2_prefetch(src + (size_t)pf * CH_CELLS * CELL_U4, min((unsigned)CH_CELLS, total - pf * CH_CELLS) * CELL_BYTES);
                pf++;
            }
#endif
            mbar_wait(eb, par, 2, (int)c);
        }
        const unsigned first = c * CH_CELLS;
        const unsigned n16 = min((unsigned)CH_CELLS, total - first) * CELL_U4;
        uint4* dst = (uint4*)smem + slot * CH_CELLS * CELL_U4;
        const uint4* from = P.interleave ? P.stream + ((size_t)c * nsm + s) * CH_CELLS * CELL_U4
                                         : src + (size_t)first * CELL_U4;
        if (P.mode == 3 || P.mode == 4) {
            if (BULK ? lane == 0 : true) mbar_arrive(&full[slot]);
        } else if (BULK) {
#if THROTTLE
            if (lane == 0)
                while (*hold) __nanosleep(32);
#endif
            if (lane == 0) bulk_copy(dst, from, n16 * 16, &full[slot]);
#if PF && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
            const unsigned ahead = c + PF * NCH;
            if (lane == 0 && ahead < nch && !P.interleave) {
                const unsigned pf16 = min((unsigned)CH_CELLS, total - ahead * CH_CELLS) * CELL_U4;
                asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src + (size_t)ahead * CH_CELLS * CELL_U4),
                             "r"(pf16 * 16)
                             : "memory");
            }
#endif
        } else {
            for (unsigned i = lane; i < n16; i += 32) cp_async16(dst + i, from + i);
            cp_async_arrive(&full[slot]);
        }
    }
}

#ifndef RFDIAG
#define RFDIAG 0
#endif
#if RINGFLAGS
// The producer warp with RINGFLAGS: copies chunk c into its slot once chunk c - NCH has landed
// and every consumer warp's word has passed it, and publishes landings in order. Modes 3-4 (no
// copies) count a chunk as landed when it is "issued"; mode 5 ignores the consumers.
template <int NCH, bool BULK>
__device__ void produce_flags(const Params& P, unsigned char* smem, uint64_t* full, unsigned total, int s, int nsm,
                              int lane, volatile int* hold, unsigned* landed, const unsigned* wdone) {
    if (NOMBAR) return;
    const uint4* src = P.stream + P.sm_base[s] * CELL_U4;
    const unsigned nch = (total + CH_CELLS - 1) / CH_CELLS;
    const bool nocopy = P.mode == 3 || P.mode == 4;
#if RFDIAG
    if (nocopy) {
        if (lane == 0) st_release_cta(landed, nch);
        return;
    }
#endif
    unsigned issued = 0, done = 0;
#if PFD
    unsigned pf = 0;  // chunks [0, pf) requested into L2 (or copied)
#endif
    unsigned long long t0 = 0;
    for (unsigned n = 1; done < nch; n++) {
        bool moved = false;
        if (issued < nch && (issued < NCH || done > issued - NCH)) {
            unsigned freed = 0xffffffffu;  // chunks every consumer warp is done with
            if (P.mode != 5) {
                freed = lane < NW ? ld_acquire_cta(smem_u32(wdone + lane)) : 0xffffffffu;
                freed = __reduce_min_sync(0xffffffffu, freed);
            }
            bool go = issued < NCH || freed > issued - NCH;
#if THROTTLE
            go = go && !*hold;
#endif
            if (go) {
                const unsigned c = issued, slot = c % NCH;
                const unsigned n16 = min((unsigned)CH_CELLS, total - c * CH_CELLS) * CELL_U4;
                uint4* dst = (uint4*)smem + slot * CH_CELLS * CELL_U4;
                const uint4* from = P.interleave ? P.stream + ((size_t)c * nsm + s) * CH_CELLS * CELL_U4
                                                 : src + (size_t)c * CH_CELLS * CELL_U4;
                if (!nocopy) {
                    if (BULK) {
                        if (lane == 0) bulk_copy(dst, from, n16 * 16, &full[slot]);
                    } else {
                        for (unsigned i = lane; i < n16; i += 32) cp_async16(dst + i, from + i);
                        cp_async_arrive(&full[slot]);
                    }
                }
                issued++;
                moved = true;
            }
        }
        if (done < issued && (nocopy || mbar_done_now(&full[done % NCH], (done / NCH) & 1u))) {
            done++;
            __syncwarp();
            if (lane == 0) st_release_cta(landed, done);
            moved = true;
        }
        if (!moved) {
#if PFD
            // Nothing to copy or publish: pull the next chunk into L2 (up to PFD beyond the copies).
            if (pf < issued) pf = issued;
            if (pf < nch && pf < issued + PFD && !nocopy && !P.interleave && !(THROTTLE && *hold)) {
                if (lane == 0) l2_prefetch(src + (size_t)pf * CH_CELLS * CELL_U4, min((unsigned)CH_CELLS, total - pf * CH_CELLS) * CELL_BYTES);
                pf++;
                continue;
            }
#endif
            if ((n & 1023) == 0 && watchdog(t0, 2, (int)done, 0)) return;
#if PSLEEP && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
            if (done < issued && !nocopy) {  // a copy in flight: sleep until it lands (at most PSLEEP ns)
                asm volatile(
                    "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1, %2; }" ::"r"(
                        smem_u32(&full[done % NCH])),
                    "r"((done / NCH) & 1u), "r"((unsigned)PSLEEP)
                    : "memory");
                continue;
            }
#endif
            __nanosleep(PNAP);
        }
    }
}
#endif

// NCH ring chunks; BULK: the producer copies a chunk with one bulk copy (sm_90's TMA), else with
// cp.async by its 32 lanes.
template <int NCH, bool BULK>
__global__ void __launch_bounds__(THREADS, 1) stream_step(const Params P) {
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ uint64_t full[NCH], empty[NCH];
    __shared__ float red[2][NW][16];
    __shared__ float wsum[NW];
#if ARGMAX
    __shared__ int xs_arg[NW];  // ARGMAX: the warps' best indices
#endif
#if REAL
    __shared__ float wsum2[NW];   // the second reduction's warp sums (the first's may still be read)
    __shared__ float hres[2560];  // the residual vector, this SM's copy
#endif
    __shared__ AttnSmem attn_sm;
    __shared__ volatile int hold;  // THROTTLE: the consumers are publishing
#if OFFSET
    __shared__ float xsum[96];  // per group: sum of the input
#endif
#if A8
    __shared__ int xs8[96];     // per group: integer input sum
    __shared__ float xsc[96];   // per group: input scale
    __shared__ uint2 xzero[16];  // B entries of the lanes without a column-0 value
    if (threadIdx.x < 16) xzero[threadIdx.x] = make_uint2(0u, 0u);
#endif
    Ring<NCH> R;
    R.cells = (const uint4*)smem;
    R.full = full;
    R.empty = empty;
    R.have = 0;
    R.rel = 0;
    uint2* xf = (uint2*)(smem + (size_t)NCH * CH_CELLS * CELL_BYTES);  // [G][STEPS][8 lanes]
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int s = blockIdx.x, nsm = gridDim.x;
    if (threadIdx.x == 0) {
        ring_init<NCH>(full, empty, BULK ? 1 : 32);
        hold = 0;
    }
    __syncthreads();
    if (P.stamps && s == nsm - 1 && threadIdx.x == 0) P.stamps[8 * P.n_ops] = stamp_now();  // the block starts
    // From the host: counting them here (every thread walking all operation records) cost 144 µs
    // per launch (measured, tenth session: the chain 1.56 -> 1.41 ms; PROTO_DEVTOTAL=1 counts here).
    const unsigned total = P.sm_total ? P.sm_total[s] : sm_stream_cells(P, s, nsm);
#if RINGFLAGS
    __shared__ unsigned landed_w, wdone_w[NW];
    if (threadIdx.x == 0) landed_w = 0;
    if (threadIdx.x < NW) wdone_w[threadIdx.x] = 0;
    __syncthreads();
    R.landed = smem_u32(&landed_w);
    R.wdone = smem_u32(&wdone_w[warp < NW ? warp : 0]);
    if (warp >= NW) {
        produce_flags<NCH, BULK>(P, smem, full, total, s, nsm, lane, &hold, &landed_w, wdone_w);
        return;
    }
#else
    if (warp >= NW) {
        produce<NCH, BULK>(P, smem, full, empty, total, s, nsm, lane, warp - NW, &hold);
        return;
    }
#endif

    if (P.mode == 5) return;
    const int tid = threadIdx.x;  // 0 .. NW * 32 - 1
#if OPSMEM
    Op* ops_s = (Op*)(smem + (size_t)NCH * CH_CELLS * CELL_BYTES + P.xf_bytes);
    {
        const int n = P.n_ops * (int)(sizeof(Op) / 4);
        for (int i0 = 0; i0 < n; i0 += 4 * NW * 32) {  // four loads in flight per thread
            unsigned v[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int i = i0 + tid + j * NW * 32;
                v[j] = i < n ? __ldg((const unsigned*)P.ops + i) : 0u;
            }
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int i = i0 + tid + j * NW * 32;
                if (i < n) ((unsigned*)ops_s)[i] = v[j];
            }
        }
    }
    consumers_sync();
    // This SM's share of every operation, worked out once (the divisions).
    SmOp* units_s = (SmOp*)(ops_s + P.n_ops);
    for (int k = tid; k < P.n_ops; k += NW * 32) {
        const Op& o = ops_s[k];
        SmOp so;
        sm_tiles(o.rows * o.S, nsm, s, so.t0, so.nt);
        const int G = o.G / o.S, T = o.rows / 16;
        input_groups(o, so.t0, so.nt, G, so.g0, so.g1);
        const Pass q = pass_of(so.nt, 0, G);
        so.np0 = so.nt > 0 ? q.np : 0;
        so.kw0 = so.nt > 0 ? q.kw : 0;
        so.rounds0 = so.nt > 0 ? q.rounds : 0;
        so.slice0 = T > 0 ? so.t0 / T : 0;
        so.tile0 = T > 0 ? so.t0 % T : 0;
        units_s[k] = so;
    }
    consumers_sync();
#define OPS ops_s
#else
#define OPS P.ops
#endif
#if REAL
    for (int i = tid; i < 2560; i += NW * 32) hres[i] = P.x0[i];
    consumers_sync();
#endif
    if (P.stamps && s == nsm - 1 && tid == 0) P.stamps[8 * P.n_ops + 1] = stamp_now();  // set-up done
    unsigned base = 0;            // stream position of the operation's first cell
    int pc = 0;                   // passes so far (red[] parity)
    for (int k = 0; k < P.n_ops; k++) {
        Op op = OPS[k];
        if (REPL > 1) op.in += (size_t)(s % REPL) * op.in_rep;  // this SM's copy of the input
        int t0, nt;  // this SM's units
#if OPSMEM
        const SmOp so = units_s[k];
        t0 = so.t0;
        nt = so.nt;
#else
        sm_tiles(op.rows * op.S, nsm, s, t0, nt);
#endif
        const int G = op.G / op.S;  // groups per unit
        const unsigned next_base = base + (unsigned)(nt * G);
        if (P.mode == 2) {  // stream only: consume nothing, release as the cells land
            R.release_to(next_base, lane);
            base = next_base;
            continue;
        }
        if (op.attn >= 0) {  // no weights: the ring streams the next operations' meanwhile
            attention_op(P, op, op.in_op >= 0 ? OPS[op.in_op].pubs : 0, P.attn[op.attn], k, s, nsm, tid, attn_sm,
                         (unsigned char*)xf);
            continue;
        }
#if REAL
        // The residual's updates happen on every SM (each keeps its own h), units or not.
        const OpReal rl = P.real[k];
        const bool h_update = rl.res == RES_POST_PRE || rl.res == RES_POST;
#else
        const bool h_update = false;
#endif
        if (nt == 0 && !h_update) {  // nothing to compute; still counted, the consumers wait for every SM
            if (tid == 0) asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(P.done + k) : "memory");
            base = next_base;
            continue;
        }
#if REAL
        // Weights of this thread's entry's 8 inputs (bf16, as checkpoints store norm weights), read
        // before the wait: they do not depend on it.
        uint2 wpo[2] = {}, wpr[2] = {};
        int base_i;  // the entry's first input; its 8 are base_i + 0..3 and base_i + 16..19
        {
            const int e = (int)so.g0 * 16 + tid;
            base_i = (e >> 4) * 128 + ((e >> 2) & 3) * 32 + 4 * (e & 3);
            if (e < (int)so.g1 * 16) {
                const __nv_bfloat16* wp = rl.ple ? rl.ple : rl.w_post;
#pragma unroll
                for (int h2 = 0; h2 < 2; h2++) {
                    if (wp) wpo[h2] = __ldg((const uint2*)(wp + base_i + 16 * h2));
                    if (rl.w_pre) wpr[h2] = __ldg((const uint2*)(rl.w_pre + base_i + 16 * h2));
                }
            }
        }
#endif
        // The input: wait for its producer, read it (L2, not L1: other SMs wrote it), normalize.
        if (P.mode == 0 && op.in_op >= 0) {
#if POLLW
            if (lane == 0) wait_operation(P, op.in_op, OPS[op.in_op].pubs);  // each warp on its own: no block barrier
            __syncwarp();
#else
            if (tid == 0) wait_operation(P, op.in_op, OPS[op.in_op].pubs);
            consumers_sync();
#endif
        }
        if (P.stamps && s == nsm - 1 && tid == 0) {
            P.stamps[8 * k] = stamp_now();
            P.stamps[8 * k + 6] = R.landed_ahead(base);  // the ring's fill when the input is ready
        }
        if (P.skew && tid == 0) P.skew[((size_t)k * nsm + s) * 2] = global_ns();
        // The input groups this SM builds: every group, or (no norm, so no statistic over the
        // whole input) only those of its units' K ranges.
        int g0, g1;
#if OPSMEM
        g0 = so.g0;
        g1 = so.g1;
#else
        input_groups(op, t0, nt, G, g0, g1);
#endif
#if A8
        // Entries (group, step t, c): inputs 32 t + 4 c + 0..3 and + 16; a group is 16 entries
        // (half a warp).
        const int e0 = g0 * 16, e1 = g1 * 16;
        float4 va[MAXJ / 2] = {}, vb[MAXJ / 2] = {};
        float ss = 0.f;
#pragma unroll
        for (int j = 0; j < MAXJ / 2; j++) {
            const int e = e0 + tid + j * NW * 32;
            if (e < e1) ss += a8_entry_load(P, op, e >> 4, (e >> 2) & 3, e & 3, va[j], vb[j]);
        }
        if (P.stamps && s == nsm - 1 && tid == 0 && ss != -1.f) P.stamps[8 * k + 7] = stamp_now();  // loads done
#if REAL
        float scale = 1.f;
        if (rl.res == RES_NONE) {
            scale = op.norm ? consumers_rms_scale(ss, op.K, wsum, warp, lane) : 1.f;
        } else {
            // One entry per thread (e = e0 + tid): va[0] / vb[0] hold the incoming values.
            const bool mine = e0 + tid < e1;
            float x[8] = {va[0].x, va[0].y, va[0].z, va[0].w, vb[0].x, vb[0].y, vb[0].z, vb[0].w};
            float wpost[8], wpre[8];
            int hidx[8];
#pragma unroll
            for (int i = 0; i < 8; i++) {
                hidx[i] = base_i + (i < 4 ? i : 12 + i);
                const uint32_t a = i & 2 ? wpo[i >> 2].y : wpo[i >> 2].x, b = i & 2 ? wpr[i >> 2].y : wpr[i >> 2].x;
                wpost[i] = __uint_as_float(i & 1 ? a & 0xFFFF0000u : a << 16);
                wpre[i] = __uint_as_float(i & 1 ? b & 0xFFFF0000u : b << 16);
            }
            if (rl.res == RES_GELU_PLE) {
#pragma unroll
                for (int i = 0; i < 8; i++) x[i] = gelu_tanh(x[i]) * wpost[i];
            } else {
                float h[8];
#pragma unroll
                for (int i = 0; i < 8; i++) h[i] = mine ? hres[hidx[i]] : 0.f;
                if (rl.res != RES_PRE) {
                    const float r1 = consumers_rms_scale(ss, op.K, wsum, warp, lane);  // post-norm of the incoming
#pragma unroll
                    for (int i = 0; i < 8; i++) h[i] = (h[i] + x[i] * r1 * wpost[i]) * rl.scalar;
                    if (mine) {
#pragma unroll
                        for (int i = 0; i < 8; i++) hres[hidx[i]] = h[i];
                    }
                }
                if (rl.res == RES_POST) {
#pragma unroll
                    for (int i = 0; i < 8; i++) x[i] = h[i];
                } else {
                    float s2 = 0.f;
#pragma unroll
                    for (int i = 0; i < 8; i++) s2 += h[i] * h[i];
                    const float r2 = consumers_rms_scale(s2, op.K, wsum2, warp, lane);  // pre-norm of h
#pragma unroll
                    for (int i = 0; i < 8; i++) x[i] = h[i] * r2 * wpre[i];
                }
            }
            va[0] = make_float4(x[0], x[1], x[2], x[3]);
            vb[0] = make_float4(x[4], x[5], x[6], x[7]);
        }
        if (nt == 0) {  // h updated; nothing to compute here
            consumers_sync();
            if (tid == 0) asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(P.done + k) : "memory");
            base = next_base;
            continue;
        }
#else
        const float scale = op.norm ? consumers_rms_scale(ss, op.K, wsum, warp, lane) : 1.f;
#endif
#pragma unroll
        for (int j = 0; j < MAXJ / 2; j++) {
            const int e = e0 + tid + j * NW * 32;
            // Whole warps quantize (half-warp shuffles); lanes past e1 take part without an entry.
            if (e0 + (tid & ~31) + j * NW * 32 < e1) {
                const int grp = e >> 4, t = (e >> 2) & 3, c = e & 3;
                int qs;
                float m;
                const uint2 q = a8_entry_quantize(va[j], vb[j], scale, e < e1, qs, m);
                if (e < e1) {
                    xf[(grp * 4 + t) * 4 + c] = q;
                    if ((e & 15) == 0) {
                        xs8[grp] = qs;
                        xsc[grp] = m / 127.f;
                    }
                }
            }
        }
#else
        const int e0 = g0 * (STEPS * 4), E = g1 * (STEPS * 4);  // (group, step, c) entries, 4 inputs each
        float4 v[MAXJ];
        float ss = 0.f;
#pragma unroll
        for (int j = 0; j < MAXJ; j++) {
            const int e = e0 + tid + j * NW * 32;
            if (e < E) {
                const int grp = (unsigned)e / (STEPS * 4), st = ((unsigned)e >> 2) % STEPS, c = e & 3;
                const float* x = op.in + op.in_off + grp * GC + st * 16 + 2 * c;
                float2 lo = make_float2(1.f, 0.5f), hi = make_float2(-1.f, 0.25f);
                if (P.mode != 4) {
                    lo = __ldcg((const float2*)x);
                    hi = __ldcg((const float2*)(x + 8));
#pragma unroll
                    for (int jp = 1; jp < 4; jp++)
                        if (jp < op.in_parts) {
                            const float2 a = __ldcg((const float2*)(x + jp * op.in_stride)),
                                         b = __ldcg((const float2*)(x + jp * op.in_stride + 8));
                            lo = make_float2(lo.x + a.x, lo.y + a.y);
                            hi = make_float2(hi.x + b.x, hi.y + b.y);
                        }
                }
                v[j] = make_float4(lo.x, lo.y, hi.x, hi.y);
                ss += lo.x * lo.x + lo.y * lo.y + hi.x * hi.x + hi.y * hi.y;
            }
        }
        if (P.stamps && s == nsm - 1 && tid == 0 && ss != -1.f) P.stamps[8 * k + 7] = stamp_now();  // loads done
        const float scale = op.norm ? consumers_rms_scale(ss, op.K, wsum, warp, lane) : 1.f;
#pragma unroll
        for (int j = 0; j < MAXJ; j++) {
            const int e = e0 + tid + j * NW * 32;
            if (e < E) {
                const int grp = (unsigned)e / (STEPS * 4), st = ((unsigned)e >> 2) % STEPS, c = e & 3;
                const float4 x = make_float4(v[j].x * scale, v[j].y * scale, v[j].z * scale, v[j].w * scale);
                const uint32_t h0 = bf16x2_bits(x.x, x.y), h1 = bf16x2_bits(x.z, x.w);
                const __nv_bfloat162 b0 = *(const __nv_bfloat162*)&h0, b1 = *(const __nv_bfloat162*)&h1;
                const uint32_t l0 = bf16x2_bits(x.x - __low2float(b0), x.y - __high2float(b0));
                const uint32_t l1 = bf16x2_bits(x.z - __low2float(b1), x.w - __high2float(b1));
                uint2* f = xf + grp * (STEPS * 8) + st * 8 + c;
                f[0] = make_uint2(h0, h1);  // lane c: column 0 (hi)
                f[4] = make_uint2(l0, l1);  // lane 4 + c: column 1 (lo)
#if OFFSET
                // A group's 32 entries are one warp's (e = 32 grp + lane): its sum of hi + lo.
                const __nv_bfloat162 c0 = *(const __nv_bfloat162*)&l0, c1 = *(const __nv_bfloat162*)&l1;
                float gs = ((__low2float(b0) + __low2float(c0)) + (__high2float(b0) + __high2float(c0))) +
                           ((__low2float(b1) + __low2float(c1)) + (__high2float(b1) + __high2float(c1)));
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) gs += __shfl_xor_sync(0xffffffffu, gs, o);
                if (lane == 0) xsum[grp] = gs;
#endif
            }
        }
#endif
        consumers_sync();
        if (THROTTLE == 2 && tid == 0) hold = 0;  // the input is read: the stream may go on
        if (P.stamps && s == nsm - 1 && tid == 0) P.stamps[8 * k + 1] = stamp_now();

        for (int p = 0; p * NW < nt; p++, pc++) {
#if OPSMEM
            const Pass q = p == 0 ? Pass{so.np0, so.kw0, so.rounds0} : pass_of(nt, p, G);
#else
            const Pass q = pass_of(nt, p, G);
#endif
            const unsigned pb = base + (unsigned)(p * NW * G);
            float acc_a = 0.f, acc_b = 0.f;
            if (warp < q.np * q.kw) {
                const int ti = warp / q.kw, sl = warp % q.kw;
#if OPSMEM
                int u_slice, u_tile;
                unit_at(so, op.rows >> 4, p * NW + ti, u_slice, u_tile);
                const int gofs = u_slice * G;  // the unit's first group
#else
                const int gofs = (t0 + p * NW + ti) / (op.rows / 16) * G;  // the unit's first group
#endif
                int r = 0;
#if A8 && STEPPED
                // Full rounds two at a time (independent mma chains), the cell, fragment and
                // per-group pointers stepped rather than recomputed per cell.
                const int full = G / q.kw;
                const unsigned stride = (unsigned)(q.np * q.kw);
                unsigned pp = pb + (unsigned)(ti * q.kw + sl);
                const int xstep = lane < 4 ? 16 * q.kw : 0;
                const uint2* xb = lane < 4 ? xf + (gofs + sl) * 16 + lane : xzero;
                const int* s8p = xs8 + gofs + sl;
                const float* scp = xsc + gofs + sl;
                for (; r + 1 < full; r += 2) {
                    R.release_to(pp, lane);
                    R.land((pp + stride) / CH_CELLS);
                    cell_imma(R.cell(pp), xb, s8p[0], scp[0], lane, acc_a, acc_b);
                    cell_imma(R.cell(pp + stride), xb + xstep, s8p[q.kw], scp[q.kw], lane, acc_a, acc_b);
                    pp += 2 * stride;
                    xb += 2 * xstep;
                    s8p += 2 * q.kw;
                    scp += 2 * q.kw;
                }
#else
                // Two cells at a time (rounds r and r + 1, round r full) for independent work.
                for (; r + 1 < q.rounds; r += 2) {
                    const int g0 = r * q.kw + sl, g1 = g0 + q.kw;
                    if (g1 >= G) break;
                    const int cnt1 = min(q.kw, G - (r + 1) * q.kw);
                    const unsigned p0 = pb + (unsigned)(r * q.np * q.kw + ti * q.kw + sl);
                    const unsigned p1 = pb + (unsigned)((r + 1) * q.np * q.kw + ti * cnt1 + sl);
                    R.release_to(p0, lane);
                    R.land(p1 / CH_CELLS);
                    CELL(p0, gofs + g0);
                    CELL(p1, gofs + g1);
                }
#endif
                for (; r < q.rounds; r++) {
                    const int grp = r * q.kw + sl;
                    if (grp >= G) break;
                    const int cnt = min(q.kw, G - r * q.kw);
                    const unsigned pos = pb + (unsigned)(r * q.np * q.kw + ti * cnt + sl);
                    R.release_to(pos, lane);
                    R.land(pos / CH_CELLS);
                    CELL(pos, gofs + grp);
                }
#if KW1DIRECT
                if (q.kw == 1)
                    unit_store(op, t0 + p * NW + ti, acc_a, acc_b, lane);
                else
#endif
                if ((lane & 3) == 0) {
                    red[pc & 1][warp][lane >> 2] = acc_a;
                    red[pc & 1][warp][(lane >> 2) + 8] = acc_b;
                }
            }
            // Done with this pass's cells (or idle in it): let the ring move on before the barrier.
            R.release_to(pb + (unsigned)(q.np * G), lane);
#if KW1DIRECT
            if (q.kw == 1) continue;  // rows already stored by their warps: no barrier
#endif
            if (P.stamps && s == nsm - 1 && tid == 0) P.stamps[8 * k + 4] = stamp_now();
            consumers_sync();
            // The last pass's cells are all done (not before this barrier: a warp still in its
            // cells may need a chunk not yet copied): hold the stream while the operation publishes.
            if (THROTTLE && tid == 0 && (p + 1) * NW >= nt) hold = 1;
            if (P.stamps && s == nsm - 1 && tid == 0) P.stamps[8 * k + 5] = stamp_now();
#if OPSMEM
            pass_epilogue(op, red[pc & 1], q.np, q.kw, t0 + p * NW, tid, &so, p * NW);
#else
            pass_epilogue(op, red[pc & 1], q.np, q.kw, t0 + p * NW, tid, nullptr, 0);
#endif
        }
        R.release_to(next_base, lane);
        if (P.stamps && s == nsm - 1 && tid == 0) P.stamps[8 * k + 2] = stamp_now();
#if FENCE
        __threadfence();
#endif
        // The barrier orders every consumer's output writes before thread 0's release (the
        // release is cumulative), as CUTLASS's semaphores do; FENCE=1 adds a fence per thread.
        consumers_sync();
        if (tid == 0) {
            asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(P.done + k) : "memory");
            if (THROTTLE == 1) hold = 0;
            if (P.stamps && s == nsm - 1) P.stamps[8 * k + 3] = stamp_now();
            if (P.skew) P.skew[((size_t)k * nsm + s) * 2 + 1] = global_ns();
        }
        base = next_base;
    }
#if ARGMAX && OPSMEM
    if (P.mode != 2 && P.token) {
        // This SM's lm_head rows (one K slice: its units are tiles t0 .. t0 + nt - 1), written
        // by this block before the op's last barrier.
        const int kl = P.n_ops - 1;
        const Op& op = OPS[kl];
        const SmOp so = units_s[kl];
        float bv = -INFINITY;
        int bi = 0x7fffffff;
        for (int i = tid; i < so.nt * 16; i += NW * 32) {
            const int idx = so.t0 * 16 + i;
            const float v = __ldcg(op.out + idx);
            if (v > bv) bv = v, bi = idx;  // a thread's indices grow: the first of equals stays
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
        }
        if (lane == 0) wsum[warp] = bv, xs_arg[warp] = bi;
        consumers_sync();
        if (tid == 0) {
            for (int w = 1; w < NW; w++) {
                const float ov = wsum[w];
                const int oi = xs_arg[w];
                if (ov > wsum[0] || (ov == wsum[0] && oi < xs_arg[0])) wsum[0] = ov, xs_arg[0] = oi;
            }
            __stcg(P.cand + s, make_float2(wsum[0], __int_as_float(xs_arg[0])));
            unsigned old;
            asm volatile("atom.add.acq_rel.gpu.global.u32 %0, [%1], 1;" : "=r"(old) : "l"(P.arg_cnt) : "memory");
            if (old + 1 == P.epoch * (unsigned)nsm) {  // the last candidate: reduce in SM order
                float best = -INFINITY;
                int bidx = 0x7fffffff;
                for (int i = 0; i < nsm; i++) {
                    const float2 c = __ldcg(P.cand + i);
                    const int ci = __float_as_int(c.y);
                    if (c.x > best || (c.x == best && ci < bidx)) best = c.x, bidx = ci;
                }
                *P.token = bidx;
            }
        }
    }
#endif
    R.release_to((total + CH_CELLS - 1) / CH_CELLS * CH_CELLS, lane);
    if (P.stamps && s == nsm - 1 && tid == 0) P.stamps[8 * P.n_ops + 2] = stamp_now();  // consumers done
}

// ---- reference: one warp per output row, from the canonical cell layout ----

// Nibble of (row rr, column k) of a cell: see the layout in make_cells.
__device__ __host__ inline int cell_nibble_index(int rr, int k, int& byte_off, int& shift) {
#if A8
    const int t = k >> 5, kk = k & 31, second = kk >> 4, c = (kk & 15) >> 2, i = kk & 3;
    const int lane = 4 * (rr & 7) + c, w = 2 * t + second;
    byte_off = ((w >> 2) * 32 + lane) * 16 + (w & 3) * 4 + i;
    shift = (rr >> 3) * 4;
    return 0;
#else
    const int st = k >> 4, kk = k & 15, half = kk >> 3, k8 = kk & 7, c = k8 >> 1, e = k8 & 1;
    const int lane = 4 * (rr & 7) + c, reg = (rr >> 3) + 2 * half, nib = reg + 4 * e;
    byte_off = ((st >> 2) * 32 + lane) * 16 + (st & 3) * 4 + (nib >> 1);
    shift = (nib & 1) * 4;
    return nib;
#endif
}

__global__ void ref_gemv(const uint8_t* cells, Op op) {
    const int row = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    const int rows = op.rows;
    if (row >= rows) return;
    float ss = 0.f;
    for (int i = lane; i < op.K; i += 32) {
        const float x = op.in[op.in_off + i];
        ss += x * x;
    }
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float scale = op.norm ? rsqrtf(ss / (float)op.K + 1e-6f) : 1.f;
    const int t = row >> 4, rr = row & 15;
    float acc = 0.f;
    for (int grp = 0; grp < op.G; grp++) {
        const uint8_t* cell = cells + ((size_t)t * op.G + grp) * CELL_BYTES;
#if W16
        // Column k of row rr: step k / 16, then the m16n8k16 A fragment position (see cell_w16).
        float part = 0.f;
        for (int k = lane; k < GC; k += 32) {
            const int st = k >> 4, kk = k & 15, half = kk >> 3, c = (kk & 7) >> 1, e = kk & 1;
            const int ln = 4 * (rr & 7) + c, reg = (rr >> 3) + 2 * half;
            const uint16_t w = *(const uint16_t*)(cell + (st * 32 + ln) * 16 + reg * 4 + e * 2);
            part += __uint_as_float((uint32_t)w << 16) * (op.in[op.in_off + grp * GC + k] * scale);
        }
        for (int o = 16; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
        acc += part;
        continue;
#elif A8
        float m = 0.f;
        for (int k = lane; k < 128; k += 32) m = fmaxf(m, fabsf(op.in[op.in_off + grp * 128 + k] * scale));
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        const float inv = m > 0.f ? 127.f / m : 0.f;
        int ip = 0;
        for (int k = lane; k < 128; k += 32) {
            int off, sh;
            cell_nibble_index(rr, k, off, sh);
            const int q = ((cell[off] >> sh) & 15) - 8;
            ip += q * max(-127, min(127, __float2int_rn(op.in[op.in_off + grp * 128 + k] * scale * inv)));
        }
        for (int o = 16; o > 0; o >>= 1) ip += __shfl_xor_sync(0xffffffffu, ip, o);
        const float part = (float)ip * (m / 127.f);
#else
        float part = 0.f;
        for (int k = lane; k < 128; k += 32) {
            int off, sh;
            cell_nibble_index(rr, k, off, sh);
            const int q = ((cell[off] >> sh) & 15) - 8;
            part += (float)q * (op.in[op.in_off + grp * 128 + k] * scale);
        }
        for (int o = 16; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
#endif
        const uint16_t sc = ((const uint16_t*)(cell + 1024))[rr];
        acc += part * __uint_as_float((uint32_t)sc << 16);
    }
    if (lane == 0) op.out[row] = acc;
}

// Random bf16 values uniform in [-1.7, 1.7] (KV caches).
__global__ void fill_bf16(__nv_bfloat16* p, size_t n, unsigned seed) {
    const size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    uint32_t h = (uint32_t)i * 2654435761u ^ seed * 40503u;
    h ^= h >> 15; h *= 2246822519u; h ^= h >> 13; h *= 3266489917u; h ^= h >> 16;
    p[i] = __float2bfloat16_rn(1.7f * ((float)(h & 0xffff) / 32767.5f - 1.f));
}

// Reference attention: block h computes head h over the whole window in one pass (f32).
__global__ void ref_attn(AttnOp a, const float* qkv, float* out) {
    __shared__ float q[512], sc[4096], red[32];
    const int h = blockIdx.x, hd = a.hd, kvh = h / (a.heads / a.kv_heads), t = threadIdx.x;
    const int lo = a.ctx - a.window;
    float ss = 0.f;
    for (int d = t; d < hd; d += blockDim.x) {
        q[d] = qkv[h * hd + d];
        ss += q[d] * q[d];
    }
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if ((t & 31) == 0) red[t >> 5] = ss;
    __syncthreads();
    float tot = 0.f;
    for (int i = 0; i < (int)blockDim.x / 32; i++) tot += red[i];
    const float qs = rsqrtf(tot / (float)hd + 1e-6f) * rsqrtf((float)hd);
    for (int i = t; i < a.window; i += blockDim.x) {
        const __nv_bfloat16* kr = a.kc + ((size_t)kvh * a.ctx + lo + i) * hd;
        float dot = 0.f;
        for (int d = 0; d < hd; d++) dot += __bfloat162float(kr[d]) * q[d];
        sc[i] = dot * qs;
    }
    __syncthreads();
    float m = -INFINITY;
    for (int i = 0; i < a.window; i++) m = fmaxf(m, sc[i]);
    float l = 0.f;
    for (int i = 0; i < a.window; i++) l += expf(sc[i] - m);
    for (int d = t; d < hd; d += blockDim.x) {
        float acc = 0.f;
        for (int i = 0; i < a.window; i++)
            acc += expf(sc[i] - m) * __bfloat162float(a.vc[((size_t)kvh * a.ctx + lo + i) * hd + d]);
        out[h * hd + d] = acc / l;
    }
}

__global__ void glu_kernel(const float* in, float* out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = gelu_tanh(in[2 * i]) * in[2 * i + 1];
}

// Random cells: uniform nibbles, scales ~ 1 / (6 sqrt K) so a GEMV roughly keeps the input's size.
__global__ void make_cells(uint8_t* cells, long long n_cells, int K, unsigned seed) {
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    const long long n = n_cells * (CELL_BYTES / 4);
    if (i >= n) return;
    const long long cell = i / (CELL_BYTES / 4);
    const int w = (int)(i % (CELL_BYTES / 4));
    uint32_t h = (uint32_t)i * 2654435761u ^ seed * 40503u ^ (uint32_t)(i >> 32) * 97u;
    h ^= h >> 15; h *= 2246822519u; h ^= h >> 13; h *= 3266489917u; h ^= h >> 16;
    uint32_t* p = (uint32_t*)(cells + cell * CELL_BYTES);
#if W16
    // Two bf16 weights, uniform in +-1.33 / sqrt(K) (about the int4 cells' spread).
    const float base = 1.33f / sqrtf((float)K);
    const float a = base * ((float)(h & 0xffff) / 32767.5f - 1.f), b = base * ((float)(h >> 16) / 32767.5f - 1.f);
    p[w] = (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(a)) |
           (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(b)) << 16;
    return;
#endif
    if (w < 256) {
        p[w] = h;
    } else {
        const float base = 1.f / (6.f * sqrtf((float)K));
        const float a = base * (0.75f + 0.5f * (float)(h & 0xffff) / 65535.f);
        const float b = base * (0.75f + 0.5f * (float)(h >> 16) / 65535.f);
        const uint32_t lo = __bfloat16_as_ushort(__float2bfloat16_rn(a));
        const uint32_t hi = __bfloat16_as_ushort(__float2bfloat16_rn(b));
        p[w] = lo | (hi << 16);
    }
}

// Gathers cells into the per-SM streams: dst cell i <- src cell map[i].
__global__ void gather_cells(uint4* dst, const uint4* const* srcs, const long long* map, long long n) {
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= n * CELL_U4) return;
    const long long cell = i / CELL_U4;
    const int u = (int)(i % CELL_U4);
    const long long m = map[cell];
    dst[i] = m < 0 ? make_uint4(0, 0, 0, 0) : srcs[m >> 40][(m & ((1ll << 40) - 1)) * CELL_U4 + u];
}

// --cell-rate: the consumers' arithmetic alone. RATE_CELLS cells and their input fragments sit
// in shared memory (no ring, no producer, no chain); every consumer warp multiplies its cells
// (i = warp, warp + NW, ...; two at a time, as the step's loop does) `reps` times. The rate this
// gives is the most the consumers could take from the stream: it has to be well above the
// stream's ~34 KB per microsecond per SM for the weights, not the arithmetic, to set the pace.
#define RATE_CELLS (W16 ? 48 : 64)
__global__ void __launch_bounds__(NW * 32, 1) cell_rate(int reps, unsigned long long* count, float* sink) {
    extern __shared__ __align__(128) unsigned char smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    uint32_t* w32 = (uint32_t*)smem;
    for (int i = threadIdx.x; i < RATE_CELLS * CELL_BYTES / 4; i += blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u;
        h ^= h >> 13;
#if W16
        w32[i] = (h & 0x807f807fu) | 0x3c003c00u;  // bf16 pairs of about +-0.01
#else
        w32[i] = (i % (CELL_BYTES / 4)) < 256 ? h : 0x3c003c00u;  // nibbles, then bf16 scales
#endif
    }
    uint2* xf = (uint2*)(smem + RATE_CELLS * CELL_BYTES);
    const int XF = RATE_CELLS * (A8 ? 16 : STEPS * 8);  // uint2 entries
    for (int i = threadIdx.x; i < XF; i += blockDim.x) xf[i] = make_uint2(0x01020304u * (i & 7), 0x3c003c00u);
#if A8
    __shared__ int xs8[RATE_CELLS];
    __shared__ float xsc[RATE_CELLS];
    if (threadIdx.x < RATE_CELLS) xs8[threadIdx.x] = threadIdx.x, xsc[threadIdx.x] = 0.01f;
#if !DP4A
    __shared__ uint2 xzero[16];
    if (threadIdx.x < 16) xzero[threadIdx.x] = make_uint2(0u, 0u);
#endif
#endif
    __syncthreads();
    float acc_a = 0.f, acc_b = 0.f;
    unsigned long long n = 0;
    const uint4* cells = (const uint4*)smem;
    for (int r = 0; r < reps; r++) {
        asm volatile("" ::: "memory");  // the cells are read again every repetition
        for (int i = warp; i + NW < RATE_CELLS; i += 2 * NW) {
#if W16
            cell_w16(cells + i * CELL_U4, xf + i * (STEPS * 8), lane, acc_a, acc_b);
            cell_w16(cells + (i + NW) * CELL_U4, xf + (i + NW) * (STEPS * 8), lane, acc_a, acc_b);
#elif DP4A
            cell_dp4a(cells + i * CELL_U4, (const uint4*)(xf + i * 16), xs8[i], xsc[i], lane, acc_a);
            cell_dp4a(cells + (i + NW) * CELL_U4, (const uint4*)(xf + (i + NW) * 16), xs8[i + NW], xsc[i + NW], lane,
                      acc_b);
#elif A8
            cell_imma(cells + i * CELL_U4, lane < 4 ? xf + i * 16 + lane : xzero, xs8[i], xsc[i], lane, acc_a, acc_b);
            cell_imma(cells + (i + NW) * CELL_U4, lane < 4 ? xf + (i + NW) * 16 + lane : xzero, xs8[i + NW],
                      xsc[i + NW], lane, acc_a, acc_b);
#else
            cell_mma(cells + i * CELL_U4, xf + i * 64, 0.f, lane, acc_a, acc_b);
            cell_mma(cells + (i + NW) * CELL_U4, xf + (i + NW) * 64, 0.f, lane, acc_a, acc_b);
#endif
            n += 2;
        }
    }
    if (lane == 0) atomicAdd(count, n);
    if (acc_a == 1234.5f) sink[0] = acc_b;
}

// SM clock under load: cycles counted over 2 ms of the global timer, every SM busy.
__global__ void clock_probe(unsigned long long* out) {
    const unsigned long long t0 = global_ns(), c0 = clock64();
    float x = threadIdx.x;
    while (global_ns() - t0 < 2000000ull) x = x * 0.999f + 1.f;
    const unsigned long long c1 = clock64(), t1 = global_ns();
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        out[0] = c1 - c0;
        out[1] = t1 - t0;
    }
    if (x == 12345.f) out[2] = 1;
}

__global__ void read_bw(const uint4* p, long long n, uint4* sink) {
    uint4 a = make_uint4(0, 0, 0, 0);
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const uint4 v = __ldcs(p + i);
        a.x ^= v.x; a.y ^= v.y; a.z ^= v.z; a.w ^= v.w;
    }
    if ((a.x ^ a.y ^ a.z ^ a.w) == 0x12345678u) *sink = a;
}

int main(int argc, char** argv) {
    int iters = 20;
    int n_ch_req = 0;
    int layers = 42;
    int ctx = 0;  // > 0: attention over a KV cache of ctx positions between QKV and O
    bool tiny = false;
    bool cell_rate_only = false;  // --cell-rate: the consumers' arithmetic alone
    bool skew_report = false;     // --skew: every SM's input-ready and publish times, per operation
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tiny")) tiny = true;
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--chunks") && i + 1 < argc) n_ch_req = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--layers") && i + 1 < argc) layers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--ctx") && i + 1 < argc) ctx = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--cell-rate")) cell_rate_only = true;
        else if (!strcmp(argv[i], "--skew")) skew_report = true;
    }
    setvbuf(stdout, nullptr, _IONBF, 0);
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    int* hdbg;
    CK(cudaHostAlloc(&hdbg, 64, cudaHostAllocMapped));
    memset(hdbg, 0, 64);
    {
        int* ddbg;
        CK(cudaHostGetDevicePointer(&ddbg, hdbg, 0));
        CK(cudaMemcpyToSymbol(g_dbg, &ddbg, sizeof(ddbg)));
    }
    // Waits for the device; a watchdog report ends the run with the wait that hung.
    auto sync = [&]() {
        const cudaError_t e = cudaDeviceSynchronize();
        if (hdbg[0]) {
            const char* w[] = {"?", "consumer waits for chunk", "producer waits to refill before chunk",
                               "consumers wait for operation"};
            printf("WATCHDOG: block %d warp %d: %s %d (parity %d)\n", hdbg[2], hdbg[3],
                   w[hdbg[1] < 4 ? hdbg[1] : 0], hdbg[4], hdbg[5]);
            exit(2);
        }
        CK(e);
    };
    const int P = prop.multiProcessorCount;
    printf("chunk: %d cells, L2 prefetch %d ring lengths ahead\n", CH_CELLS, PF);
    printf("consumer warps: %d, producer warps: %d, %s\n", NW, NP,
           W16 ? "W16 (bf16 weights, bf16 pair inputs)" : A8 ? "W4A8 (int8 inputs, integer tensor cores)"
           : OFFSET ? "bf16 pair inputs, offset nibbles" : "bf16 pair inputs");
    printf("device: %s, %d SMs, sm_%d%d, %zu KB shared per block (opt-in)\n", prop.name, P, prop.major,
           prop.minor, prop.sharedMemPerBlockOptin / 1024);
    if (cell_rate_only) {
        const size_t sm_bytes = (size_t)RATE_CELLS * CELL_BYTES + (size_t)RATE_CELLS * (A8 ? 16 : STEPS * 8) * 8;
        CK(cudaFuncSetAttribute(cell_rate, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm_bytes));
        unsigned long long* dcount;
        float* dsink;
        CK(cudaMalloc(&dcount, 8));
        CK(cudaMalloc(&dsink, 4));
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        for (int reps : {200, 2000, 2000}) {
            CK(cudaMemset(dcount, 0, 8));
            CK(cudaEventRecord(e0));
            cell_rate<<<P, NW * 32, sm_bytes>>>(reps, dcount, dsink);
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            CK(cudaGetLastError());
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            unsigned long long n;
            CK(cudaMemcpy(&n, dcount, 8, cudaMemcpyDeviceToHost));
            const double us = ms * 1e3;
            printf("cell rate (%d reps): %.1f cells per us per SM = %.1f KB/us per SM = %.2f TB/s over %d SMs\n", reps,
                   n / us / P, n * CELL_BYTES / us / P / 1e3, n * CELL_BYTES / us / 1e6, P);
        }
        return 0;
    }

    // The operation list (E4B shapes).
    struct HostOp { int rows, K, norm, glu, in_op, in_off, out_n; std::string name; int S = 1; int attn = -1; int res = 0; int layer = 0; };
    std::vector<HostOp> ops;
    const int H = 2560, FF = 10240, PLE = 256;
    std::vector<std::pair<int, int>> attn_layer;  // per attention operation: head dim, window
    std::vector<int> attn_donor;                  // the layer whose KV cache it reads
    ops.push_back({42 * PLE, H, 1, 0, -1, 0, 42 * PLE, "ple_model"});
    int h_op = 0;  // operation holding the current hidden vector (first H values)
    for (int l = 0; l < layers; l++) {
        const bool sliding = l % 6 != 5;
        const int hd = sliding ? 256 : 512;
        const bool own_kv = l < 24;
        const int qkv = 8 * hd + (own_kv ? 4 * hd : 0);
        const int q = (int)ops.size();
        ops.push_back({qkv, H, 1, 0, h_op, 0, qkv, "qkv"});
        ops.back().res = l == 0 ? RES_PRE : RES_POST_PRE;
        ops.back().layer = l;
        if (REAL && l == 0) ops.back().in_op = -1;  // h = the embedding: no producer
        int o_in = q;  // without attention, O reads the QKV output's first 8 hd values
        if (ctx > 0) {
            // Attention: layer l's own cache, or (KV-shared layers) the last own layer's of its kind.
            const int donor = own_kv ? l : (sliding ? 22 : 23);
            HostOp a = {0, 0, 0, 0, q, 0, 8 * hd, "attn"};
            a.attn = (int)attn_layer.size();
            attn_layer.push_back(std::make_pair(hd, sliding ? 512 : 1 << 30));
            attn_donor.push_back(donor);
            ops.push_back(a);
            o_in = q + 1;
        }
        const int o = (int)ops.size();
        ops.push_back({H, 8 * hd, 0, 0, o_in, 0, H, "o"});
        ops.push_back({2 * FF, H, 1, 1, o, 0, FF, "gate_up"});
        ops.back().res = RES_POST_PRE;
        ops.push_back({H, FF, 0, 0, o + 1, 0, H, "down"});
        ops.push_back({PLE, H, 1, 0, o + 2, 0, PLE, "ple_gate"});
        ops.back().res = RES_POST;
        ops.push_back({H, PLE, 0, 0, o + 3, 0, H, "ple_proj"});
        ops.back().res = RES_GELU_PLE;
        for (int j = o; j < (int)ops.size(); j++) ops[j].layer = l;
        h_op = o + 4;
    }
    ops.push_back({262144, H, 1, 0, h_op, 0, 262144, "lm_head"});
    ops.back().res = RES_POST_PRE;
    ops.back().layer = layers;
    if (!REAL)
        for (HostOp& o : ops) o.res = RES_NONE;
    if (tiny && ctx > 0) { fprintf(stderr, "--tiny models no attention (leave out --ctx)\n"); return 2; }
    if (ctx > 4096) { fprintf(stderr, "--ctx is at most 4096 here\n"); return 2; }
    if (tiny) {
        // The chain alone: every operation one 16 x 128 tile per SM (norms, GeGLU and the
        // dependencies as they are), so a step's time over the operation count is what one link
        // of the chain costs with (almost) no bytes.
        for (HostOp& o : ops) {
            o.rows = 16 * P;
            o.K = 128;
            o.in_off = 0;
            o.out_n = o.glu ? o.rows / 2 : o.rows;
        }
        printf("tiny: every operation 16 x 128 per SM (the chain's own cost)\n");
    }
    const int n_ops = (int)ops.size();
    // K splits (default; PROTO_BALANCE=0: whole tiles): whole 16-row tiles give some SMs one tile
    // more than others (the down projection's 160 tiles: 28 SMs carry 2, the rest 1), and every
    // operation waits for its slowest SM. Units of a tile's K range, S per tile, even the shares
    // out; S is the smallest of 1-4 within 2% of the best share (GeGLU rows need whole K: S = 1).
    // Units are slice-major, so an SM's few units of an operation without a norm share one or two
    // K slices and it builds only those slices' input fragments.
    // PROTO_SMAX=N: at most N slices (every consumer SM reads all S partial vectors of its input).
    const bool balanced = !(getenv("PROTO_BALANCE") && !strcmp(getenv("PROTO_BALANCE"), "0"));
    const int smax = getenv("PROTO_SMAX") ? std::max(1, std::min(4, atoi(getenv("PROTO_SMAX")))) : 4;
    if (balanced)
        for (HostOp& o : ops) {
            const int T = o.rows / 16, G = o.K / GC;
            long long best = -1;
            for (int S = 1; S <= smax; S++) {
                if (G % S || (o.glu && S > 1)) continue;
                const long long m = ((long long)T * S + P - 1) / P * (G / S);
                if (best < 0 || m * 102 < best * 100) best = m, o.S = S;
            }
            // PROTO_S_O=N: the O projection's slices at most N (its consumer, gate/up, reads them all).
            if (o.name == "o" && getenv("PROTO_S_O")) {
                const int so = std::max(1, atoi(getenv("PROTO_S_O")));
                while (o.S > so || G % o.S) o.S--;
            }
        }

    // Canonical weights per operation, outputs.
    std::vector<uint8_t*> wts(n_ops);
    std::vector<float*> outs(n_ops), ref_outs(n_ops), raw(n_ops, nullptr);
    long long cells_total = 0;
    for (int k = 0; k < n_ops; k++) {
        const long long nc = (long long)(ops[k].rows / 16) * (ops[k].K / GC);
        cells_total += nc;
        wts[k] = nullptr;
        if (nc > 0) {
            CK(cudaMalloc(&wts[k], nc * CELL_BYTES));
            make_cells<<<(unsigned)((nc * (CELL_BYTES / 4) + 255) / 256), 256>>>(wts[k], nc, ops[k].K, 1234u + k);
        }
        CK(cudaMalloc(&outs[k], (size_t)REPL * ops[k].S * ops[k].out_n * sizeof(float)));  // S partial vectors, REPL copies
        CK(cudaMalloc(&ref_outs[k], ops[k].out_n * sizeof(float)));
        if (ops[k].glu) CK(cudaMalloc(&raw[k], ops[k].rows * sizeof(float)));
    }
    float* x0;
    CK(cudaMalloc(&x0, H * sizeof(float)));
    {
        std::vector<float> hx(H);
        for (int i = 0; i < H; i++) hx[i] = sinf(0.37f * i) + 0.1f * cosf(1.3f * i);
        CK(cudaMemcpy(x0, hx.data(), H * sizeof(float), cudaMemcpyHostToDevice));
    }
    const double bytes = (double)cells_total * CELL_BYTES;
    printf("operations: %d, weight bytes per step: %.3f GB\n", n_ops, bytes / 1e9);

    // Per-SM streams in consumption order.
    std::vector<long long> map;
    map.reserve(cells_total);
    std::vector<long long> sm_base(P + 1);
    std::vector<unsigned> sm_total(P);
    for (int s = 0; s < P; s++) {
        sm_base[s] = (long long)map.size();
        for (int k = 0; k < n_ops; k++) {
            const int S = ops[k].S, G = ops[k].K / GC, Gu = G / S;
            int t0, nt;
            sm_tiles(ops[k].rows * S, P, s, t0, nt);
            for (int p = 0; p * NW < nt; p++) {
                const Pass q = pass_of(nt, p, Gu);
                for (int r = 0; r < q.rounds; r++)
                    for (int ti = 0; ti < q.np; ti++)
                        for (int sl = 0; sl < q.kw; sl++) {
                            const int grp = r * q.kw + sl;
                            if (grp >= Gu) continue;
                            const long long u = t0 + p * NW + ti, T = ops[k].rows / 16, t = u % T;
                            map.push_back(((long long)k << 40) | (t * G + u / T * Gu + grp));
                        }
            }
        }
        sm_total[s] = (unsigned)(map.size() - sm_base[s]);
        // Every SM's stream starts 128-byte aligned (8 cells = 66 lines): bulk copies from 32- or
        // 64-byte aligned sources stream at ~3.6 TB/s against 4.5 (proto/stream_rate.cu).
        while (map.size() % 8) map.push_back(-1);
    }
    sm_base[P] = (long long)map.size();
    long long scheduled = 0;
    for (long long m : map) scheduled += m >= 0;
    if (scheduled != cells_total) { fprintf(stderr, "schedule lost cells\n"); return 1; }
    const long long stream_cells = (long long)map.size();
    uint4* stream;
    long long* dmap;
    const uint4** dsrcs;
    long long* dbase;
    CK(cudaMalloc(&stream, stream_cells * CELL_BYTES));
    CK(cudaMalloc(&dmap, stream_cells * sizeof(long long)));
    CK(cudaMalloc(&dsrcs, n_ops * sizeof(uint4*)));
    CK(cudaMalloc(&dbase, (P + 1) * sizeof(long long)));
    CK(cudaMemcpy(dmap, map.data(), stream_cells * sizeof(long long), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dsrcs, wts.data(), n_ops * sizeof(uint4*), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dbase, sm_base.data(), (P + 1) * sizeof(long long), cudaMemcpyHostToDevice));
    unsigned* dtotal;
    CK(cudaMalloc(&dtotal, P * sizeof(unsigned)));
    CK(cudaMemcpy(dtotal, sm_total.data(), P * sizeof(unsigned), cudaMemcpyHostToDevice));
    gather_cells<<<(unsigned)((stream_cells * CELL_U4 + 255) / 256), 256>>>(stream, dsrcs, dmap, stream_cells);
    CK(cudaDeviceSynchronize());
    // The same streams interleaved by chunk across SMs (padded to the longest), so the SMs read
    // neighbouring addresses at about the same time.
    long long max_len = 0;
    for (int s = 0; s < P; s++) max_len = std::max(max_len, sm_base[s + 1] - sm_base[s]);
    const long long ich = (max_len + CH_CELLS - 1) / CH_CELLS, icells = ich * P * CH_CELLS;
    uint4* istream;
    {
        std::vector<long long> imap(icells, -1);
        for (int s = 0; s < P; s++)
            for (long long i = 0; i < sm_base[s + 1] - sm_base[s]; i++)
                imap[((i / CH_CELLS) * P + s) * CH_CELLS + i % CH_CELLS] = map[sm_base[s] + i];
        long long* dimap;
        CK(cudaMalloc(&istream, icells * CELL_BYTES));
        CK(cudaMalloc(&dimap, icells * sizeof(long long)));
        CK(cudaMemcpy(dimap, imap.data(), icells * sizeof(long long), cudaMemcpyHostToDevice));
        gather_cells<<<(unsigned)((icells * CELL_U4 + 255) / 256), 256>>>(istream, dsrcs, dimap, icells);
        CK(cudaDeviceSynchronize());
        cudaFree(dimap);
    }

    // Device operation records.
    std::vector<Op> hops(n_ops);
    int maxG = 0;
    for (int k = 0; k < n_ops; k++) {
        Op& o = hops[k];
        memset(&o, 0, sizeof(o));
        o.rows = ops[k].rows;
        o.K = ops[k].K;
        o.G = o.K / GC;
        o.norm = ops[k].norm;
        o.glu = ops[k].glu;
        o.in_off = ops[k].in_off;
        o.in_op = ops[k].in_op;
        o.in = ops[k].in_op < 0 ? x0 : outs[ops[k].in_op];
        o.out = outs[k];
        o.S = ops[k].S;
        o.in_parts = ops[k].in_op < 0 ? 1 : ops[ops[k].in_op].S;
        o.in_stride = ops[k].in_op < 0 ? 0 : ops[ops[k].in_op].out_n;
        o.attn = ops[k].attn;
        o.pubs = ops[k].attn >= 0 ? 8 : P;  // attention: one publication per head
        o.rep = ops[k].S * ops[k].out_n;
        o.in_rep = ops[k].in_op < 0 ? 0 : ops[ops[k].in_op].S * ops[ops[k].in_op].out_n;
        if (o.G > maxG) maxG = o.G;
        if (o.G * (STEPS * 4) > MAXJ * NW * 32) { fprintf(stderr, "K too large\n"); return 1; }
    }
    Op* dops;
    CK(cudaMalloc(&dops, n_ops * sizeof(Op)));
    CK(cudaMemcpy(dops, hops.data(), n_ops * sizeof(Op), cudaMemcpyHostToDevice));
    // REAL: norm weights U(0.5, 1.5), layer scalars U(0.5, 1), per-layer PLE vectors U(-1, 1).
    std::vector<std::vector<float>> hw(6, std::vector<float>(H));
    std::vector<float> hple((size_t)(layers + 1) * PLE), hls(layers + 1);
    {
        unsigned st = 12345u;
        auto rnd = [&st]() { st = st * 1664525u + 1013904223u; return (st >> 8) * (1.f / 16777216.f); };
        for (auto& v : hw)
            for (float& x : v) x = 0.5f + rnd();
        for (float& x : hple) x = 2.f * rnd() - 1.f;
        for (float& x : hls) x = 0.5f + 0.5f * rnd();
    }
    // bf16 on the device (as checkpoints store them); the host keeps the same rounded values.
    auto to_bf16 = [](std::vector<float>& v) {
        std::vector<uint16_t> b(v.size());
        for (size_t i = 0; i < v.size(); i++) {
            uint32_t u;
            memcpy(&u, &v[i], 4);
            u += 0x7FFFu + ((u >> 16) & 1u);  // round to nearest even
            b[i] = (uint16_t)(u >> 16);
            u = (uint32_t)b[i] << 16;
            memcpy(&v[i], &u, 4);
        }
        return b;
    };
    std::vector<__nv_bfloat16*> dw(6);
    for (int i = 0; i < 6; i++) {
        const std::vector<uint16_t> b = to_bf16(hw[i]);
        CK(cudaMalloc(&dw[i], H * 2));
        CK(cudaMemcpy(dw[i], b.data(), H * 2, cudaMemcpyHostToDevice));
    }
    __nv_bfloat16* dple;
    {
        const std::vector<uint16_t> b = to_bf16(hple);
        CK(cudaMalloc(&dple, b.size() * 2));
        CK(cudaMemcpy(dple, b.data(), b.size() * 2, cudaMemcpyHostToDevice));
    }
    std::vector<OpReal> hreal(n_ops);
    // Which weights each residual step uses (indices into hw): post, pre.
    auto real_of = [&](const HostOp& o, OpReal& r, int& ipost, int& ipre) {
        memset(&r, 0, sizeof(r));
        r.res = o.res;
        r.scalar = 1.f;
        ipost = ipre = -1;
        if (o.name == "qkv") ipost = 3, ipre = 0, r.scalar = o.layer > 0 ? hls[o.layer - 1] : 1.f;
        if (o.name == "gate_up") ipost = 1, ipre = 2;
        if (o.name == "ple_gate") ipost = 4;
        if (o.name == "lm_head") ipost = 3, ipre = 5, r.scalar = hls[layers - 1];
        if (o.res == RES_PRE) ipost = -1;
        if (o.res == RES_GELU_PLE) r.ple = dple + (size_t)o.layer * PLE;
        if (o.res == RES_NONE) ipost = ipre = -1;
        r.w_post = ipost >= 0 ? dw[ipost] : nullptr;
        r.w_pre = ipre >= 0 ? dw[ipre] : nullptr;
    };
    for (int k = 0; k < n_ops; k++) {
        int a, b;
        real_of(ops[k], hreal[k], a, b);
        if (ops[k].res != RES_NONE && ops[k].res != RES_GELU_PLE && ops[k].K != H && !tiny) {
            fprintf(stderr, "REAL: a residual operation's K must be the hidden size\n");
            return 1;
        }
    }
    float2* dcand;
    unsigned* darg_cnt;
    int* dtoken;
    CK(cudaMalloc(&dcand, P * sizeof(float2)));
    CK(cudaMalloc(&darg_cnt, sizeof(unsigned)));
    CK(cudaMalloc(&dtoken, sizeof(int)));
    OpReal* dreal;
    CK(cudaMalloc(&dreal, n_ops * sizeof(OpReal)));
    CK(cudaMemcpy(dreal, hreal.data(), n_ops * sizeof(OpReal), cudaMemcpyHostToDevice));
    // Attention: bf16 caches (random, pre-filled), the split scratch, the per-head counters.
    const int n_attn = (int)attn_layer.size(), splits = P / 8;
    if (n_attn > 0 && splits > 16) { fprintf(stderr, "attention: at most 16 splits per head here\n"); return 2; }
    std::vector<AttnOp> hattn(n_attn);
    AttnOp* dattn = nullptr;
    unsigned* hcnt = nullptr;
    if (n_attn > 0) {
        float *part, *ml;
        CK(cudaMalloc(&part, (size_t)8 * splits * 512 * sizeof(float)));
        CK(cudaMalloc(&ml, (size_t)8 * splits * 2 * sizeof(float)));
        CK(cudaMalloc(&hcnt, (size_t)n_attn * 8 * sizeof(unsigned)));
        std::vector<__nv_bfloat16*> kcache(layers, nullptr), vcache(layers, nullptr);
        size_t kv_bytes = 0;
        for (int i = 0; i < n_attn; i++) {
            const int hd = attn_layer[i].first, l = attn_donor[i];
            if (!kcache[l]) {
                const size_t n = (size_t)2 * ctx * hd;  // 2 KV heads
                CK(cudaMalloc(&kcache[l], n * 2));
                CK(cudaMalloc(&vcache[l], n * 2));
                fill_bf16<<<(unsigned)((n + 255) / 256), 256>>>(kcache[l], n, 77u + 2 * l);
                fill_bf16<<<(unsigned)((n + 255) / 256), 256>>>(vcache[l], n, 78u + 2 * l);
            }
            const int window = std::min(attn_layer[i].second, ctx);
            if ((window + splits - 1) / splits > ATT_MAXK) { fprintf(stderr, "--ctx too long\n"); return 2; }
            kv_bytes += (size_t)2 * 2 * window * hd * 2;
            hattn[i] = AttnOp{8, 2, hd, ctx, window, splits, kcache[l], vcache[l], part, ml, hcnt + 8 * i};
        }
        CK(cudaMalloc(&dattn, n_attn * sizeof(AttnOp)));
        CK(cudaMemcpy(dattn, hattn.data(), n_attn * sizeof(AttnOp), cudaMemcpyHostToDevice));
        printf("attention: %d operations, context %d, %d splits per head, %.1f MB of KV read per step\n", n_attn,
               ctx, splits, kv_bytes / 1e6);
    }
    unsigned* done;
    CK(cudaMalloc(&done, n_ops * sizeof(unsigned)));
    unsigned long long* stamps;
    CK(cudaMalloc(&stamps, 8 * (n_ops + 1) * sizeof(unsigned long long)));

    // B fragments: W4A8 needs 16 entries per group, the bf16-pair paths STEPS x 8; attention stages
    // its K/V tiles in the same place (ATTSTAGE), so with attention it keeps the larger size.
    // PROTO_XF_SMALL=1: the fragments' size with attention too (less staging, a deeper ring).
    const bool xf_small = A8 && (ctx == 0 || getenv("PROTO_XF_SMALL"));
    const size_t xf_bytes = (size_t)maxG * (xf_small ? 16 : STEPS * 8) * sizeof(uint2);
    const size_t ops_bytes = OPSMEM ? (size_t)n_ops * (sizeof(Op) + sizeof(SmOp)) : 0;  // operation table, SM shares (OPSMEM)
    const size_t avail = prop.sharedMemPerBlockOptin - 2048 - 2 * NW * 16 * 4 - sizeof(AttnSmem) - ops_bytes -
                         (REAL ? (2560 + NW) * 4 : 0);  // REAL: the residual vector h
    const int fit = (int)((avail - xf_bytes) / (CH_CELLS * CELL_BYTES));
    const bool hopper = prop.major >= 9;
    // The reference runs per operation on the chain's own input (see the check below).
    float* tin;
    {
        int max_n = H;
        for (const HostOp& h : ops) max_n = std::max(max_n, h.out_n);
        CK(cudaMalloc(&tin, (size_t)max_n * sizeof(float)));
    }

    // Read bandwidth, same process.
    {
        const long long n = (2ll << 30) / 16;
        uint4 *buf, *sink;
        CK(cudaMalloc(&buf, n * 16));
        CK(cudaMalloc(&sink, 16));
        CK(cudaMemset(buf, 1, n * 16));
        cudaEvent_t a, b;
        cudaEventCreate(&a);
        cudaEventCreate(&b);
        float best = 1e30f;
        for (int r = 0; r < 5; r++) {
            cudaEventRecord(a);
            read_bw<<<P * 4, 1024>>>(buf, n, sink);
            cudaEventRecord(b);
            CK(cudaEventSynchronize(b));
            float ms;
            cudaEventElapsedTime(&ms, a, b);
            if (ms < best) best = ms;
        }
        printf("read bandwidth: %.0f GB/s (2 GiB, best of 5)\n", n * 16 / (best * 1e-3) / 1e9);
        cudaFree(buf);
    }

    // Configurations: ring depth (chunks) x copy engine.
    typedef void (*Kern)(const Params);
    struct Cfg { int nch; bool bulk; bool il; Kern k; };
    std::vector<Cfg> cfgs;
    const Cfg all[] = {{11, true, false, stream_step<11, true>}, {10, true, false, stream_step<10, true>},
                       {9, true, false, stream_step<9, true>}, {8, true, false, stream_step<8, true>},
                       {6, true, false, stream_step<6, true>}, {5, true, false, stream_step<5, true>},
                       {4, true, false, stream_step<4, true>}, {3, true, false, stream_step<3, true>}, {11, false, false, stream_step<11, false>}};
    const bool copy_bulk = !getenv("PROTO_COPY") || !strcmp(getenv("PROTO_COPY"), "bulk") || !strcmp(getenv("PROTO_COPY"), "both");
    const bool copy_async = getenv("PROTO_COPY") && (!strcmp(getenv("PROTO_COPY"), "cp.async") || !strcmp(getenv("PROTO_COPY"), "both"));
    for (const Cfg& c : all) {
        if (c.nch > fit || (c.bulk && !hopper)) continue;
        if (n_ch_req > 0 && c.nch != n_ch_req) continue;
        if (c.bulk ? !copy_bulk : !copy_async) continue;
        cfgs.push_back(c);
    }
    if (cfgs.empty()) { fprintf(stderr, "no configuration fits (%d chunks)\n", fit); return 1; }
    bool all_pass = true;
    double sm_mhz = 1e3;  // stamps are SM cycles: cycles / MHz = µs
    {
        unsigned long long* dclk;
        unsigned long long hclk[3];
        CK(cudaMalloc(&dclk, 24));
        clock_probe<<<P, 256>>>(dclk);
        CK(cudaMemcpy(hclk, dclk, 24, cudaMemcpyDeviceToHost));
        sm_mhz = (double)hclk[0] / (double)hclk[1] * 1e3;
        printf("SM clock under load: %.0f MHz\n", sm_mhz);
    }
    int mode_mask = 31;
    if (getenv("PROTO_MODES")) {
        mode_mask = 0;
        for (const char* c = getenv("PROTO_MODES"); *c; c++)
            if (*c >= '0' && *c <= '5') mode_mask |= 1 << (*c - '0');
    }
    if (NOMBAR) mode_mask = 1 << 4;  // without the ring's bookkeeping only "cells only" is meaningful
    const char* names[6] = {"full chain", "no input waits", "stream only", "compute only", "cells only", "producer only"};
    for (const Cfg& cfg : cfgs) {
    const size_t smem = (size_t)cfg.nch * CH_CELLS * CELL_BYTES + xf_bytes + ops_bytes;
    CK(cudaFuncSetAttribute(cfg.k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    printf("== %sring %d chunks x %d cells = %zu KB (+ B fragments %zu KB), %s, %s\n",
           balanced ? "K-split units, " : "", cfg.nch, CH_CELLS,
           (size_t)cfg.nch * CH_CELLS * CELL_BYTES / 1024, xf_bytes / 1024,
           cfg.bulk ? "bulk copies (TMA)" : "cp.async by the producer warps",
           cfg.il ? "streams interleaved by chunk" : "one contiguous stream per SM");
    for (int mode = 0; mode < 6; mode++) {
        if (!(mode_mask >> mode & 1)) continue;
        CK(cudaMemset(done, 0, n_ops * sizeof(unsigned)));
        CK(cudaMemset(darg_cnt, 0, sizeof(unsigned)));
        if (hcnt) CK(cudaMemset(hcnt, 0, (size_t)n_attn * 8 * sizeof(unsigned)));
        CK(cudaMemset(stamps, 0, 8 * (n_ops + 1) * sizeof(unsigned long long)));
        Params prm;
        prm.ops = dops;
        prm.n_ops = n_ops;
        prm.stream = cfg.il ? istream : stream;
        prm.interleave = cfg.il;
        prm.sm_base = dbase;
        prm.sm_total = getenv("PROTO_DEVTOTAL") ? nullptr : dtotal;  // PROTO_DEVTOTAL=1: counted on the device (as before)
        prm.real = REAL ? dreal : nullptr;
#if ARGMAX
        prm.cand = dcand;
        prm.arg_cnt = darg_cnt;
        prm.token = dtoken;
#endif
        prm.x0 = x0;
        prm.done = done;
        prm.attn = dattn;
        prm.mode = mode;
        prm.stamps = nullptr;
        prm.skew = nullptr;
        prm.xf_bytes = (unsigned)xf_bytes;
        unsigned epoch = 0;
        for (int w = 0; w < 3; w++) {
            prm.epoch = ++epoch;
            cfg.k<<<P, THREADS, smem>>>(prm);
        }
        sync();
        cudaEvent_t a, b;
        cudaEventCreate(&a);
        cudaEventCreate(&b);
        cudaEventRecord(a);
        for (int it = 0; it < iters; it++) {
            prm.epoch = ++epoch;
            cfg.k<<<P, THREADS, smem>>>(prm);
        }
        cudaEventRecord(b);
        sync();
        CK(cudaGetLastError());
        float ms;
        cudaEventElapsedTime(&ms, a, b);
        const double per = ms / iters;
        printf("%-15s: %.3f ms/step (%.0f steps/s), %.0f GB/s, %.2f us per operation\n", names[mode], per,
               1e3 / per, bytes / (per * 1e-3) / 1e9, per * 1e3 / n_ops);
        if (mode == 0) {
            // Check against the reference chain.
            double worst = 0;
            int worst_k = 0, shown = 0;
            // Each operation against the reference applied to the chain's own input (its
            // producer's partial vectors added in the consumers' order): a rounding difference
            // early in a 254-operation chain of random weights grows along it (bf16 weights: 1e-5
            // after two layers, O(1) after forty), so a free-running reference chain cannot tell
            // a bug from that growth; this check can.
            // REAL: the host keeps its own h, advanced with the chain's own outputs in order.
            std::vector<float> hh(H);
            CK(cudaMemcpy(hh.data(), x0, H * sizeof(float), cudaMemcpyDeviceToHost));
            auto rms = [](const float* v, int n) {
                double t = 0;
                for (int i = 0; i < n; i++) t += (double)v[i] * v[i];
                return (float)(1.0 / sqrt(t / n + 1e-6));
            };
            for (int k = 0; k < n_ops; k++) {
                Op o = hops[k];
                if (ops[k].res != RES_NONE) {
                    std::vector<float> x(ops[k].K, 0.f);
                    if (ops[k].in_op >= 0) {
                        const HostOp& src = ops[ops[k].in_op];
                        std::vector<float> part(src.out_n);
                        for (int j = 0; j < src.S; j++) {
                            CK(cudaMemcpy(part.data(), outs[ops[k].in_op] + (size_t)j * src.out_n, part.size() * 4,
                                          cudaMemcpyDeviceToHost));
                            for (int i = 0; i < ops[k].K; i++) x[i] = j ? x[i] + part[i] : part[i];
                        }
                    }
                    OpReal r;
                    int ipost, ipre;
                    real_of(ops[k], r, ipost, ipre);
                    const int K = ops[k].K;
                    std::vector<float> y(K);
                    if (ops[k].res == RES_GELU_PLE) {
                        for (int i = 0; i < K; i++) {
                            const float v = x[i];
                            y[i] = 0.5f * v * (1.f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v))) *
                                   hple[(size_t)ops[k].layer * PLE + i];
                        }
                    } else {
                        if (ops[k].res != RES_PRE) {
                            const float r1 = rms(x.data(), K);
                            for (int i = 0; i < K; i++) hh[i] = (hh[i] + x[i] * r1 * hw[ipost][i]) * r.scalar;
                        }
                        if (ops[k].res == RES_POST) {
                            for (int i = 0; i < K; i++) y[i] = hh[i];
                        } else {
                            const float r2 = rms(hh.data(), K);
                            for (int i = 0; i < K; i++) y[i] = hh[i] * r2 * hw[ipre][i];
                        }
                    }
                    CK(cudaMemcpy(tin, y.data(), K * 4, cudaMemcpyHostToDevice));
                    o.in = tin;
                    o.in_off = 0;
                    o.norm = 0;
                } else if (ops[k].in_op >= 0) {
                    const HostOp& src = ops[ops[k].in_op];
                    std::vector<float> acc(src.out_n), part(src.out_n);
                    for (int j = 0; j < src.S; j++) {
                        CK(cudaMemcpy(part.data(), outs[ops[k].in_op] + (size_t)j * src.out_n, part.size() * 4,
                                      cudaMemcpyDeviceToHost));
                        for (size_t i = 0; i < acc.size(); i++) acc[i] = j ? acc[i] + part[i] : part[i];
                    }
                    CK(cudaMemcpy(tin, acc.data(), acc.size() * 4, cudaMemcpyHostToDevice));
                    o.in = tin;
                } else {
                    o.in = x0;
                }
                o.in_parts = 1;
                o.out = ops[k].glu ? raw[k] : ref_outs[k];
                if (o.attn >= 0) {
                    ref_attn<<<8, 256>>>(hattn[o.attn], o.in, o.out);
                } else {
                    ref_gemv<<<(o.rows + 7) / 8, 256>>>(wts[k], o);
                    if (ops[k].glu) glu_kernel<<<(ops[k].out_n + 255) / 256, 256>>>(raw[k], ref_outs[k], ops[k].out_n);
                }
                CK(cudaDeviceSynchronize());
                std::vector<float> g(ops[k].out_n), r(ops[k].out_n), part(ops[k].out_n);
                for (int j = 0; j < ops[k].S; j++) {  // the partial vectors, added in the consumers' order
                    CK(cudaMemcpy(part.data(), outs[k] + (size_t)j * ops[k].out_n, part.size() * 4,
                                  cudaMemcpyDeviceToHost));
                    for (size_t i = 0; i < g.size(); i++) g[i] = j ? g[i] + part[i] : part[i];
                }
                CK(cudaMemcpy(r.data(), ref_outs[k], r.size() * 4, cudaMemcpyDeviceToHost));
                double num = 0, den = 0;
                for (size_t i = 0; i < g.size(); i++) {
                    num += (double)(g[i] - r[i]) * (g[i] - r[i]);
                    den += (double)r[i] * r[i];
                }
                const double rel = sqrt(num / (den > 0 ? den : 1));
                if (!(rel < (A8 ? 1e-2 : 1e-3)) && shown < 3) {  // the first failures: where it starts
                    printf("  operation %d (%s, S %d, input parts %d): rel L2 %.2e\n", k, ops[k].name.c_str(), ops[k].S,
                           hops[k].in_parts, rel);
                    shown++;
                }
                if (!(rel <= worst)) { worst = rel; worst_k = k; }
            }
            // W4A8: the reference quantizes its own input, normalized with its own sum order, so
            // an input can round to the neighbouring int8 step here and not there (1.25e-3 seen).
            const bool pass = worst < (A8 ? 1e-2 : 1e-3);
            all_pass = all_pass && pass;
            printf("check: worst rel L2 against the reference per operation %.2e (operation %d, %s): %s\n", worst,
                   worst_k, ops[worst_k].name.c_str(), pass ? "PASS" : "FAIL");
            if (ARGMAX) {  // the kernel's token against the argmax of its own lm_head output
                const HostOp& lm = ops[n_ops - 1];
                std::vector<float> lo((size_t)lm.out_n);
                CK(cudaMemcpy(lo.data(), outs[n_ops - 1], lo.size() * 4, cudaMemcpyDeviceToHost));
                int want = 0;
                for (size_t i = 1; i < lo.size(); i++)
                    if (lo[i] > lo[want]) want = (int)i;
                int got = -1;
                CK(cudaMemcpy(&got, dtoken, 4, cudaMemcpyDeviceToHost));
                const bool ok = lm.S == 1 && got == want;
                all_pass = all_pass && ok;
                printf("argmax: token %d, the host's argmax of the same logits %d: %s\n", got, want, ok ? "PASS" : "FAIL");
            }
        }
        if (mode != 2 && mode != 5) {
            // One step with stamps: per-operation time on the last SM by kind.
            prm.stamps = stamps;
            prm.epoch = ++epoch;
            cfg.k<<<P, THREADS, smem>>>(prm);
            sync();
            std::vector<unsigned long long> st(8 * (n_ops + 1));
            CK(cudaMemcpy(st.data(), stamps, st.size() * 8, cudaMemcpyDeviceToHost));
            const char* kinds[] = {"qkv", "attn", "o", "gate_up", "down", "ple_gate", "ple_proj", "lm_head"};
            if (st[8 * n_ops] && st[8 * n_ops + 1] && st[8 * n_ops + 2])
                printf("last SM, one step: block start -> set-up done %.2f µs -> first operation published %.2f -> "
                       "last published %.2f -> consumers done %.2f\n",
                       (double)(st[8 * n_ops + 1] - st[8 * n_ops]) / sm_mhz, (double)(st[3] - st[8 * n_ops + 1]) / sm_mhz,
                       (double)(st[8 * (n_ops - 1) + 3] - st[3]) / sm_mhz,
                       (double)(st[8 * n_ops + 2] - st[8 * (n_ops - 1) + 3]) / sm_mhz);
            printf("last SM, one step: per operation, µs from the previous operation's end (input wait "
                   "+ prologue + compute) / of which after the input was ready: inputs built, cells, publish (cycle stamps)\n");
            for (const char* kn : kinds) {
                double tot = 0, aft = 0, pro = 0, cel = 0, pub = 0, c_own = 0, c_bar = 0, fill = 0, ld = 0;
                int n = 0;
                for (int k = 1; k < n_ops; k++) {
                    if (ops[k].name != kn) continue;
                    tot += (double)(st[8 * k + 3] - st[8 * (k - 1) + 3]) / sm_mhz;
                    aft += (double)(st[8 * k + 3] - st[8 * k]) / sm_mhz;
                    if (st[8 * k + 1] && st[8 * k + 2]) {
                        pro += (double)(st[8 * k + 1] - st[8 * k]) / sm_mhz;
                        if (st[8 * k + 7]) ld += (double)(st[8 * k + 7] - st[8 * k]) / sm_mhz;
                        cel += (double)(st[8 * k + 2] - st[8 * k + 1]) / sm_mhz;
                        pub += (double)(st[8 * k + 3] - st[8 * k + 2]) / sm_mhz;
                        fill += (double)st[8 * k + 6];
                        if (st[8 * k + 4] && st[8 * k + 5]) {  // the last pass: warp 0's cells, the pass barrier
                            c_own += (double)(st[8 * k + 4] - st[8 * k + 1]) / sm_mhz;
                            c_bar += (double)(st[8 * k + 5] - st[8 * k + 4]) / sm_mhz;
                        }
                    }
                    n++;
                }
                if (n)
                    printf("  %-9s x%-3d %7.2f / %7.2f: %6.2f %6.2f %6.2f   (inputs loaded at %.2f; cells: %.2f to the last "
                           "pass barrier, %.2f in it; ring %.1f of %d chunks landed at input ready)\n",
                           kn, n, tot / n, aft / n, pro / n, cel / n, pub / n, ld / n, c_own / n, c_bar / n, fill / n, cfg.nch);
            }
        }
        if (skew_report && mode == 0) {
            // One step recording every SM's input-ready and publish times (global timer): how
            // far the slowest SM of an operation trails the median one, and whether the same SMs
            // are always last. The global timer's resolution on the GPU bounds what this can see.
            unsigned long long* dskew;
            CK(cudaMalloc(&dskew, (size_t)n_ops * P * 2 * 8));
            CK(cudaMemset(dskew, 0, (size_t)n_ops * P * 2 * 8));
            prm.skew = dskew;
            prm.stamps = nullptr;
            prm.epoch = ++epoch;
            cfg.k<<<P, THREADS, smem>>>(prm);
            sync();
            prm.skew = nullptr;
            std::vector<unsigned long long> sk((size_t)n_ops * P * 2);
            CK(cudaMemcpy(sk.data(), dskew, sk.size() * 8, cudaMemcpyDeviceToHost));
            cudaFree(dskew);
            std::vector<int> last_count(P, 0);
            const char* kinds[] = {"qkv", "o", "gate_up", "down", "ple_gate", "ple_proj", "lm_head"};
            printf("every SM, one step: per operation kind, µs the last SM's publish trails the median SM's, "
                   "and the spread of input-ready times (global timer)\n");
            for (const char* kn : kinds) {
                double trail = 0, ready = 0;
                int n = 0;
                for (int k = 1; k < n_ops; k++) {
                    if (ops[k].name != kn) continue;
                    std::vector<unsigned long long> pub, rdy;
                    int last = 0;
                    for (int sm = 0; sm < P; sm++) {
                        const unsigned long long r = sk[((size_t)k * P + sm) * 2], p = sk[((size_t)k * P + sm) * 2 + 1];
                        if (!p) continue;  // an SM without units of this operation
                        pub.push_back(p);
                        if (r) rdy.push_back(r);
                        if (p > sk[((size_t)k * P + last) * 2 + 1]) last = sm;
                    }
                    if (pub.size() < 2) continue;
                    std::sort(pub.begin(), pub.end());
                    trail += (double)(pub.back() - pub[pub.size() / 2]) / 1e3;
                    if (rdy.size() > 1) {
                        std::sort(rdy.begin(), rdy.end());
                        ready += (double)(rdy.back() - rdy.front()) / 1e3;
                    }
                    last_count[last]++;
                    n++;
                }
                if (n) printf("  %-9s x%-3d last publish %.2f after the median, input ready spread %.2f\n", kn, n, trail / n, ready / n);
            }
            std::vector<int> idx(P);
            for (int i = 0; i < P; i++) idx[i] = i;
            std::sort(idx.begin(), idx.end(), [&](int a, int b) { return last_count[a] > last_count[b]; });
            printf("  SMs most often last:");
            for (int i = 0; i < 6 && i < P; i++) printf(" %d (%d)", idx[i], last_count[idx[i]]);
            printf("\n");
        }
    }
    }
    return all_pass ? 0 : 1;
}
