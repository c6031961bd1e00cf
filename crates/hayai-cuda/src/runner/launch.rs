//! Kernel parameter blocks (mirrored field by field from the kernels' structs) and the recorded
//! launches of the decode plan.

use cudarc::driver::sys;

use crate::device::{drv, Gpu};
use crate::CudaError;

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct GemvParams {
    pub(crate) w: u64,
    pub(crate) scales: u64,
    pub(crate) out: u64,
    pub(crate) input: u64,
    pub(crate) act_mult: u64,
    pub(crate) res_in: u64,
    pub(crate) res_out: u64,
    pub(crate) res_w: u64,
    pub(crate) norm_w: u64,
    pub(crate) gather_tok: u64,
    pub(crate) gather_table: u64,
    pub(crate) out_final: u64,
    pub(crate) counters: u64,
    pub(crate) rows: i32,
    pub(crate) cols: i32,
    pub(crate) splits: i32,
    pub(crate) glu: i32,
    pub(crate) in_splits: i32,
    pub(crate) in_ld: i32,
    pub(crate) res_scalar: f32,
    pub(crate) eps: f32,
    pub(crate) gather_scale: f32,
    pub(crate) int4: i32,
    pub(crate) in_glu: i32,
    pub(crate) kwarps: i32,
    pub(crate) pf: L2Prefetch,
}

/// Weights to pull into L2 (kernels/common.cuh `L2Prefetch`), the last field of the GEMV and
/// attention parameter blocks.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct L2Prefetch {
    pub(crate) p: [u64; 2],
    pub(crate) bytes: [i64; 2],
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct AttnParams {
    pub(crate) q: u64,
    pub(crate) counters: u64,
    pub(crate) k_cache: u64,
    pub(crate) v_cache: u64,
    pub(crate) part_ml: u64,
    pub(crate) part_acc: u64,
    pub(crate) out: u64,
    pub(crate) pos: u64,
    pub(crate) nh: i32,
    pub(crate) nkv: i32,
    pub(crate) hd: i32,
    pub(crate) cap: i32,
    pub(crate) window: i32,
    pub(crate) splits: i32,
    pub(crate) scale: f32,
    pub(crate) softcap: f32,
    pub(crate) qkv: u64,
    pub(crate) q_norm: u64,
    pub(crate) k_norm: u64,
    pub(crate) inv_freq: u64,
    pub(crate) own_kv: i32,
    pub(crate) v_norm: i32,
    pub(crate) eps: f32,
    pub(crate) prefetch: i32,
    pub(crate) qkv_splits: i32,
    pub(crate) qkv_ld: i32,
    pub(crate) pf: L2Prefetch,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct ArgmaxParams {
    pub(crate) logits: u64,
    pub(crate) blk_val: u64,
    pub(crate) blk_idx: u64,
    pub(crate) step_io: u64,
    pub(crate) out_tok: u64,
    /// `TokenSlots::dev()`: the token also goes to mapped host slot `position & 1`.
    pub(crate) host_tok: u64,
    pub(crate) n: i32,
    pub(crate) blocks: i32,
    pub(crate) softcap: f32,
    /// 1: the streamed step's stages over each SM's own lm_head rows (`stream_records`).
    pub(crate) own: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct PleParams {
    pub(crate) tok: u64,
    pub(crate) table: u64,
    pub(crate) ctx: u64,
    pub(crate) norm_w: u64,
    pub(crate) out: u64,
    pub(crate) splits: i32,
    pub(crate) ld: i32,
    pub(crate) dim: i32,
    pub(crate) tok_scale: f32,
    pub(crate) ctx_scale: f32,
    pub(crate) mix_scale: f32,
    pub(crate) eps: f32,
}

/// Two GEMVs in one launch (kernels/gemv.cu `gemv_pair`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct GemvPairParams {
    pub(crate) a: GemvParams,
    pub(crate) b: GemvParams,
    pub(crate) barrier: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct BwParams {
    pub data: u64,
    pub n16: u64,
    pub sink: u64,
}

/// Profiling slots per operation of the single-kernel step (kernels/step.cu `STEP_STAMPS`).
pub(crate) const STEP_STAMPS: usize = 8;
/// Bytes of one operation of the single-kernel step (kernels/step.cu `StepOp`).
pub(crate) const STEP_OP_BYTES: usize = 256;
/// Threads, warps and 16-byte chunks per lane and ring stage of the single-kernel step.
pub(crate) const STEP_WARPS: usize = 8;
pub(crate) const STEP_U: usize = 4;
/// Shared memory of one attention item (kernels/attention.cu `AttnSmem`).
pub(crate) const ATTN_SMEM_BYTES: usize = 7072;
/// ... of the single-kernel step's two attention items per block.
pub(crate) const STEP_ATTN_FLOATS: usize = 2 * ATTN_SMEM_BYTES / 4;

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct StepParams {
    pub(crate) ops: u64,
    pub(crate) barrier: u64,
    pub(crate) timing: u64,
    pub(crate) n_ops: i32,
    pub(crate) first_gemv: i32,
    pub(crate) x_floats: i32,
}

/// The streamed step's parameters (kernels/stream_step.cu `StreamParams`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct StreamParams {
    pub(crate) ops: u64,
    pub(crate) stream: u64,
    pub(crate) sm_base: u64,
    pub(crate) sm_cells: u64,
    pub(crate) shares: u64,
    pub(crate) done: u64,
    pub(crate) timing: u64,
    pub(crate) n_ops: i32,
    pub(crate) n_gemv: i32,
    pub(crate) x_floats: i32,
    /// Positive: at most this many key rows per attention tile and ranges of as many tiles as
    /// the staging area allows (`HAYAI_STREAM_ATTN_TK`, for checks of the several-tile and
    /// several-range paths on short contexts); 0: tiles as large as the staging area holds.
    pub(crate) attn_tk: i32,
    /// With `attn_tk` 0, the fewest keys an attention range takes (the ranges otherwise spread
    /// over the SMs, one item an SM at most; no more than a tile's rows): [`STREAM_ATTN_MIN_KEYS`], or
    /// `HAYAI_STREAM_ATTN_MIN_KEYS` for measurements.
    pub(crate) attn_min_keys: i32,
    /// The step's position (`step_io[1]`, every attention's `pos`), read once at the start.
    pub(crate) pos: u64,
    /// The int8 cells' scale stream (stream_layout `Streams::scale_bytes`; 0: none), each SM's
    /// offset in it in 16-byte units (`[SM]` u64) and its first chunk with scales (`[SM]` u32).
    pub(crate) sc_stream: u64,
    pub(crate) sc_base: u64,
    pub(crate) sc_from: u64,
}

/// Consumer warps per SM of the streamed step (kernels/stream_step.cu `SS_NW`: 11, or what a
/// measurement build's `-DSS_NW=N` set, as build.rs reports it), its threads, and the bytes of
/// one ring chunk (16 cells of 1,056 bytes) and of the int8 input fragments (96 groups of 16
/// entries of 8 bytes).
pub(crate) const STREAM_WARPS: usize = parse_warps(env!("HAYAI_STREAM_WARPS"));

/// A decimal count at compile time (build.rs validated it).
const fn parse_warps(s: &str) -> usize {
    let b = s.as_bytes();
    let mut n = 0;
    let mut i = 0;
    while i < b.len() {
        assert!(b[i].is_ascii_digit(), "HAYAI_STREAM_WARPS: not a number");
        n = n * 10 + (b[i] - b'0') as usize;
        i += 1;
    }
    assert!(n > 0, "HAYAI_STREAM_WARPS: no warps");
    n
}
/// Ring chunks per SM the streamed step's timeline records at most (kernels/stream_step.cu
/// `SS_TL_CHUNKS`).
pub(crate) const STREAM_TL_CHUNKS: usize = 4096;
/// Stamps per SM and operation in that timeline (`SS_TL_SLOTS`).
pub(crate) const STREAM_TL_SLOTS: usize = 10;
pub(crate) const STREAM_THREADS: usize = (STREAM_WARPS + 1) * 32;
pub(crate) const STREAM_CHUNK_BYTES: usize = 16 * 1056;
/// A ring chunk of bf16 cells (`SS_W16_U4`: 16 cells of 2,048 bytes).
pub(crate) const STREAM_W16_CHUNK_BYTES: usize = 16 * 2048;
pub(crate) const STREAM_XF_BYTES: usize = 96 * 16 * 8;
/// An int8 output head's scales beside a bf16 ring: `SCALE_CELL_BYTES` a cell, a chunk's worth
/// a ring slot (kernels/stream_step.cu `sring`, after the int8 fragments' area).
pub(crate) const STREAM_W16_SCALE_CHUNK_BYTES: usize =
    crate::stream_layout::CHUNK_CELLS * crate::stream_layout::SCALE_CELL_BYTES;
/// GemvParams.int4 of a streamed GEMV over int8 cells (stream_step.cu `SS_W_INT8`).
pub(crate) const STREAM_W_INT8: i32 = 8;
/// Query heads per KV head the streamed step's attention takes (`SSA_MAXR`).
pub(crate) const STREAM_ATTN_MAX_GROUP: usize = 8;

/// One recorded kernel launch of the decode plan.
#[derive(Clone)]
pub(crate) struct Launch {
    pub label: &'static str,
    pub(crate) kernel: &'static str,
    pub(crate) func: sys::CUfunction,
    pub(crate) grid: (u32, u32, u32),
    pub(crate) block: u32,
    pub(crate) smem: u32,
    pub(crate) params: Vec<u64>,
    /// The kernel may be launched with programmatic stream serialization.
    pub(crate) pdl: bool,
    /// The weights this launch streams (pointer, bytes; up to two ranges), for the L2 prefetch
    /// of the launch before it.
    pub(crate) reads: [(u64, usize); 2],
    /// Byte offset of an `L2Prefetch` in the parameter block, where the kernel takes one.
    pub(crate) prefetch_at: Option<usize>,
}

/// Copies the bytes of `v` (plain #[repr(C)] data) into a parameter block at byte offset `at`.
pub(crate) fn write_param<T: Copy>(params: &mut [u64], at: usize, v: &T) {
    let n = std::mem::size_of::<T>();
    assert!(
        at + n <= params.len() * 8,
        "parameter write out of the block"
    );
    // SAFETY: bounds checked above; T is plain data, so its bytes are its value.
    unsafe {
        std::ptr::copy_nonoverlapping(
            v as *const T as *const u8,
            (params.as_mut_ptr() as *mut u8).add(at),
            n,
        );
    }
}

/// `launches` captured from the GPU's stream into an instantiated, uploaded CUDA graph.
pub(crate) fn capture_graph<'a>(
    gpu: &Gpu,
    launches: impl IntoIterator<Item = &'a Launch>,
) -> Result<cudarc::driver::CudaGraph, CudaError> {
    let st = &gpu.stream;
    st.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
        .map_err(drv)?;
    let mut res = Ok(());
    for l in launches {
        if let Err(e) = l.run(gpu) {
            res = Err(e);
            break;
        }
    }
    // The capture is ended whatever happened, so the stream is usable again.
    let g = st
        .end_capture(sys::CUgraphInstantiate_flags(0))
        .map_err(drv)?;
    res?;
    let g = g.ok_or_else(|| CudaError::Driver("graph capture produced no graph".into()))?;
    g.upload().map_err(drv)?;
    Ok(g)
}

/// The `T` at byte offset `at` of a parameter block (plain #[repr(C)] data).
pub(crate) fn read_param<T: Copy + Default>(params: &[u64], at: usize) -> T {
    let n = std::mem::size_of::<T>();
    assert!(
        at + n <= params.len() * 8,
        "parameter read out of the block"
    );
    let mut v = T::default();
    // SAFETY: bounds checked above; T is plain data, any bytes written by write_param are valid.
    unsafe {
        std::ptr::copy_nonoverlapping(
            (params.as_ptr() as *const u8).add(at),
            &mut v as *mut T as *mut u8,
            n,
        );
    }
    v
}

impl Launch {
    pub(crate) fn new<P: Copy>(
        gpu: &Gpu,
        label: &'static str,
        kernel: &'static str,
        grid: (u32, u32, u32),
        block: u32,
        smem: u32,
        p: &P,
    ) -> Launch {
        let mut params = vec![0u64; std::mem::size_of::<P>().div_ceil(8)];
        write_param(&mut params, 0, p);
        Launch {
            label,
            kernel,
            func: gpu.func(kernel),
            grid,
            block,
            smem,
            params,
            pdl: crate::device::KERNELS.contains(&(kernel, true)),
            reads: [(0, 0); 2],
            prefetch_at: None,
        }
    }

    pub(crate) fn set_prefetch(&mut self, pf: L2Prefetch) {
        if let Some(at) = self.prefetch_at {
            write_param(&mut self.params, at, &pf);
        }
    }

    /// Launch on the GPU's stream; with programmatic dependent launch where the GPU and the
    /// kernel allow it (the kernel may then start before the previous one has finished and
    /// waits for it in `pdl_wait`). Stream capture records that as a programmatic graph edge.
    pub fn run(&self, gpu: &Gpu) -> Result<(), CudaError> {
        let mut args = [self.params.as_ptr() as *mut std::ffi::c_void];
        if self.pdl && gpu.pdl {
            // SAFETY: an all-zero attribute is valid plain data; the id and the union member
            // set below belong together (programmatic stream serialization).
            let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
            attr.id =
                sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            attr.value.programmaticStreamSerializationAllowed = 1;
            let cfg = sys::CUlaunchConfig {
                gridDimX: self.grid.0,
                gridDimY: self.grid.1,
                gridDimZ: self.grid.2,
                blockDimX: self.block,
                blockDimY: 1,
                blockDimZ: 1,
                sharedMemBytes: self.smem,
                hStream: gpu.stream.cu_stream(),
                attrs: &mut attr,
                numAttrs: 1,
            };
            // SAFETY: `cfg`, `attr` and the parameter block outlive the call (the driver copies
            // the parameters at launch); the parameter block mirrors the kernel's struct.
            return unsafe {
                sys::cuLaunchKernelEx(&cfg, self.func, args.as_mut_ptr(), std::ptr::null_mut())
            }
            .result()
            .map_err(drv);
        }
        unsafe {
            cudarc::driver::result::launch_kernel(
                self.func,
                self.grid,
                (self.block, 1, 1),
                self.smem,
                gpu.stream.cu_stream(),
                &mut args,
            )
        }
        .map_err(drv)
    }
}

/// Largest matrix the L2 prefetch asks for (the H200's L2 is 50 MB, the A10G's 6 MB; a larger
/// request only evicts what the current kernel still needs).
pub(crate) const L2_PREFETCH_MAX: usize = 32 << 20;

/// Which launches [`link_prefetches`] gives a prefetch.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum PrefetchFrom {
    Every,
    /// Only the decode attention launches (label "attention"): the one kernel of a layer that
    /// reads almost nothing from DRAM.
    Attention,
}

/// Points every launch that takes an `L2Prefetch` (or, with [`PrefetchFrom::Attention`], every
/// attention launch) at the weights of the `ahead`-th launch after it that reads weights (within
/// the step), or with `ahead` 0 and `own`, every weighted launch at its own weights (none for
/// `ahead` 0 without `own`).
pub(crate) fn link_prefetches(plan: &mut [Launch], ahead: usize, own: bool, from: PrefetchFrom) {
    if ahead == 0 && !own {
        return;
    }
    let weighted: Vec<usize> = (0..plan.len())
        .filter(|&j| plan[j].reads[0].1 > 0)
        .collect();
    for i in 0..plan.len() {
        if from == PrefetchFrom::Attention && plan[i].label != "attention" {
            continue;
        }
        let j = if ahead == 0 {
            if plan[i].reads[0].1 == 0 {
                continue;
            }
            i
        } else {
            let k = weighted.partition_point(|&j| j <= i) + ahead - 1;
            let Some(&j) = weighted.get(k) else { continue };
            j
        };
        let r = plan[j].reads;
        if r[0].1 + r[1].1 > L2_PREFETCH_MAX {
            continue;
        }
        plan[i].set_prefetch(L2Prefetch {
            p: [r[0].0, r[1].0],
            bytes: [r[0].1 as i64, r[1].1 as i64],
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_warps_follow_the_kernels_define() {
        assert_eq!(parse_warps("11"), 11);
        assert_eq!(parse_warps("15"), 15);
        // build.rs reports the kernels' SS_NW: 11 unless a measurement build set it.
        let defines = option_env!("HAYAI_CUDA_DEFINES_BUILT").unwrap_or("");
        let set = defines
            .split_whitespace()
            .find_map(|d| d.strip_prefix("-DSS_NW="));
        assert_eq!(STREAM_WARPS, set.map_or(11, |v| v.parse().unwrap()));
        assert_eq!(STREAM_THREADS, (STREAM_WARPS + 1) * 32);
    }

    /// A launch of a GEMV-like kernel (no GPU needed: it is never run).
    fn launch(reads: [(u64, usize); 2], prefetchable: bool) -> Launch {
        let mut params = vec![0u64; std::mem::size_of::<GemvParams>().div_ceil(8)];
        write_param(&mut params, 0, &GemvParams::default());
        Launch {
            label: "test",
            kernel: "gemv",
            func: std::ptr::null_mut(),
            grid: (1, 1, 1),
            block: 256,
            smem: 0,
            params,
            pdl: false,
            reads,
            prefetch_at: prefetchable.then_some(std::mem::offset_of!(GemvParams, pf)),
        }
    }

    fn prefetch_of(l: &Launch) -> L2Prefetch {
        read_param(&l.params, std::mem::offset_of!(GemvParams, pf))
    }

    #[test]
    fn attention_launches_alone_can_prefetch_a_later_gemv() {
        let mut plan = vec![
            launch([(0x1000, 100), (0x2000, 10)], true), // 0: QKV
            launch([(0, 0), (0, 0)], true),              // 1: attention
            launch([(0x3000, 300), (0x3800, 30)], true), // 2: O
            launch([(0x4000, 400), (0x4800, 40)], true), // 3: gate/up
        ];
        plan[1].label = "attention";
        link_prefetches(&mut plan, 2, false, PrefetchFrom::Attention);
        let pf: Vec<L2Prefetch> = plan.iter().map(prefetch_of).collect();
        assert_eq!((pf[1].p, pf[1].bytes), ([0x4000, 0x4800], [400, 40]));
        for i in [0, 2, 3] {
            assert_eq!(pf[i].p, [0, 0], "launch {i} is not attention");
        }
    }

    #[test]
    fn each_launch_prefetches_the_weights_of_the_nth_weighted_launch_after_it() {
        let big = L2_PREFETCH_MAX + 1;
        let mk = || {
            vec![
                launch([(0x1000, 100), (0x2000, 10)], true), // 0: weighted
                launch([(0, 0), (0, 0)], true),              // 1: no weights (attention-like)
                launch([(0x3000, 300), (0, 0)], true),       // 2: weighted
                launch([(0x4000, big), (0, 0)], true),       // 3: too large to prefetch
                launch([(0x5000, 500), (0, 0)], false),      // 4: kernel takes no prefetch
            ]
        };
        let mut plan = mk();
        link_prefetches(&mut plan, 1, false, PrefetchFrom::Every);
        let pf: Vec<L2Prefetch> = plan.iter().map(prefetch_of).collect();
        assert_eq!((pf[0].p, pf[0].bytes), ([0x3000, 0], [300, 0]));
        assert_eq!((pf[1].p, pf[1].bytes), ([0x3000, 0], [300, 0]));
        // Launch 2's next weighted launch is over the limit: nothing.
        assert_eq!(pf[2].p, [0, 0]);
        assert_eq!((pf[3].p, pf[3].bytes), ([0x5000, 0], [500, 0]));
        // Launch 4 is last and takes no prefetch anyway.
        assert_eq!(pf[4].p, [0, 0]);

        // Two ahead: launch 0 and 1 would take launch 3 (too large), launch 2 takes launch 4.
        let mut plan = mk();
        link_prefetches(&mut plan, 2, false, PrefetchFrom::Every);
        let pf: Vec<L2Prefetch> = plan.iter().map(prefetch_of).collect();
        assert_eq!(pf[0].p, [0, 0]);
        assert_eq!(pf[1].p, [0, 0]);
        assert_eq!((pf[2].p, pf[2].bytes), ([0x5000, 0], [500, 0]));
        assert_eq!(pf[3].p, [0, 0]);
        let mut plan = mk();
        link_prefetches(&mut plan, 0, false, PrefetchFrom::Every);
        assert!(plan.iter().map(prefetch_of).all(|p| p.p == [0, 0]));

        // Own weights: every weighted launch under the limit takes its own.
        let mut plan = mk();
        link_prefetches(&mut plan, 0, true, PrefetchFrom::Every);
        let pf: Vec<L2Prefetch> = plan.iter().map(prefetch_of).collect();
        assert_eq!((pf[0].p, pf[0].bytes), ([0x1000, 0x2000], [100, 10]));
        assert_eq!(pf[1].p, [0, 0]);
        assert_eq!((pf[2].p, pf[2].bytes), ([0x3000, 0], [300, 0]));
        assert_eq!(pf[3].p, [0, 0]);
        assert_eq!(pf[4].p, [0, 0]);
    }
}
