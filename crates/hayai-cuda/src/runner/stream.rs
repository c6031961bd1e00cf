//! The streamed decode step (`CudaOptions::streamed_step`, kernels/stream_step.cu,
//! docs/streamed-step.md): the single-kernel step's operation list run by one block per SM whose
//! producer warp streams the SM's GEMV weights from a per-SM stream laid out at load
//! (`step_streams`), while its consumer warps run the operations.

use super::*;
use crate::step_streams::step_streams;
use crate::stream_layout::SmShare;

/// Ring depths the kernel is compiled for (`decode_stream_r{N}`), deepest first.
const RINGS: [(usize, &str); 2] = [(10, "decode_stream_r10"), (2, "decode_stream_r2")];

impl CudaRunner {
    /// The streamed step's launch shape on this GPU: the deepest ring that fits beside the GEMV
    /// input (or three attention items' scratch) and the int8 fragments.
    pub(super) fn stream_config(&self, max_cols: usize) -> Result<StepConfig, CudaError> {
        let spec = &self.model.spec;
        if self.quant != Quant::Int4 {
            return Err(CudaError::Unsupported(
                "streamed step: int4 weights only (--quant int4)".into(),
            ));
        }
        if max_cols > 96 * 128 {
            return Err(CudaError::Unsupported(format!(
                "streamed step: GEMV width {max_cols} (at most 12,288)"
            )));
        }
        if let Some(p) = &spec.ple {
            if p.dim > STREAM_WARPS * 32 {
                return Err(CudaError::Unsupported(format!(
                    "streamed step: per-layer embedding width {} (at most {})",
                    p.dim,
                    STREAM_WARPS * 32
                )));
            }
        }
        // Three attention items of 7,072 bytes each (kernels/attention.cu `AttnSmem`).
        let x_floats = max_cols.max(3 * 7072 / 4).next_multiple_of(4);
        let optin = self.gpu.max_smem_optin()?;
        let (nch, kernel) = RINGS
            .iter()
            .copied()
            .find(|&(n, _)| n * STREAM_CHUNK_BYTES + x_floats * 4 + STREAM_XF_BYTES <= optin)
            .ok_or_else(|| {
                CudaError::Unsupported(format!(
                    "streamed step: GEMV width {max_cols} leaves no room for a ring in {optin} bytes of shared memory"
                ))
            })?;
        let smem = nch * STREAM_CHUNK_BYTES + x_floats * 4 + STREAM_XF_BYTES;
        self.gpu.set_max_dynamic_smem(kernel, smem)?;
        let per_sm = unsafe {
            cudarc::driver::result::occupancy::max_active_block_per_multiprocessor(
                self.gpu.func(kernel),
                STREAM_THREADS as i32,
                smem,
            )
        }
        .map_err(drv)? as usize;
        if per_sm == 0 {
            return Err(CudaError::Unsupported(
                "streamed step: no block fits on an SM".into(),
            ));
        }
        Ok(StepConfig {
            kernel,
            grid: self.gpu.sm_count as usize,
            smem,
            x_floats,
            warps: self.gpu.sm_count as usize * STREAM_WARPS,
        })
    }

    /// The recorded launch plan as the streamed step's operation list, the per-SM weight
    /// streams built and uploaded, and the one launch that runs it.
    pub(super) fn stream_launch(&mut self) -> Result<Launch, CudaError> {
        let cfg = self.step_kernel.as_ref().expect("stream config");
        let (kernel, grid, smem, x_floats) = (cfg.kernel, cfg.grid, cfg.smem, cfg.x_floats);
        let st = step_streams(&self.model, Quant::Int4, grid, STREAM_WARPS)?;
        let streams = &st.streams;
        let n = self.plan.len();
        let mut bytes = vec![0u8; n * STEP_OP_BYTES];
        let mut gi = 0usize;
        for (i, l) in self.plan.iter().enumerate() {
            let kind: i32 = match l.kernel {
                "gemv" => 0,
                "attn_split" => 1,
                "ple_combine" => 2,
                "argmax_stage1" => 3,
                "argmax_stage2" => 4,
                k => {
                    return Err(CudaError::Unsupported(format!(
                        "streamed step: no operation for kernel {k}"
                    )))
                }
            };
            let params: Vec<u8> = l.params.iter().flat_map(|w| w.to_le_bytes()).collect();
            if params.len() > STEP_OP_BYTES - 8 {
                return Err(CudaError::Unsupported(format!(
                    "streamed step: {} parameters exceed an operation",
                    l.label
                )));
            }
            // A GEMV's second word is its ordinal among the GEMVs (its shares' column).
            let mut second = 0i32;
            if kind == 0 {
                let field = |off: usize| {
                    i32::from_le_bytes(params[off..off + 4].try_into().expect("4 bytes")) as usize
                };
                let (rows, cols, splits) = (
                    field(std::mem::offset_of!(GemvParams, rows)),
                    field(std::mem::offset_of!(GemvParams, cols)),
                    field(std::mem::offset_of!(GemvParams, splits)),
                );
                let plan = streams.ops.get(gi).ok_or_else(|| {
                    CudaError::Unsupported("streamed step: more GEMVs than streams".into())
                })?;
                if st.labels[gi] != l.label
                    || plan.rows != rows
                    || plan.groups * 128 != cols
                    || plan.splits != splits
                {
                    return Err(CudaError::Unsupported(format!(
                        "streamed step: GEMV {gi} ({}, {rows} x {cols}, {splits} K splits) does not match its stream ({}, {} x {}, {})",
                        l.label,
                        st.labels[gi],
                        plan.rows,
                        plan.groups * 128,
                        plan.splits
                    )));
                }
                second = gi as i32;
                gi += 1;
            }
            let op = &mut bytes[i * STEP_OP_BYTES..(i + 1) * STEP_OP_BYTES];
            op[0..4].copy_from_slice(&kind.to_le_bytes());
            op[4..8].copy_from_slice(&second.to_le_bytes());
            op[8..8 + params.len()].copy_from_slice(&params);
        }
        if gi != streams.ops.len() {
            return Err(CudaError::Unsupported(format!(
                "streamed step: {gi} GEMVs in the plan, {} streams",
                streams.ops.len()
            )));
        }
        if n < 2 {
            return Err(CudaError::Unsupported(
                "streamed step: fewer than two operations".into(),
            ));
        }
        let shares: Vec<SmShare> = (0..grid).flat_map(|s| streams.sm_shares(s)).collect();
        let sm_base: Vec<u64> = streams.sm_base[..grid].iter().map(|&b| b as u64).collect();
        let sm_cells: Vec<u32> = (0..grid).map(|s| streams.sm_cells(s) as u32).collect();
        let ops = self.gpu.upload(&bytes)?;
        let stream = self.gpu.upload(&streams.bytes)?;
        let base = self.gpu.upload(&sm_base)?;
        let cells = self.gpu.upload(&sm_cells)?;
        let shares = self.gpu.upload(&shares)?;
        let done = self.gpu.alloc(n * 4)?;
        let timing = self.gpu.alloc(n * STEP_STAMPS * 8)?;
        let p = StreamParams {
            ops: ops.ptr(),
            stream: stream.ptr(),
            sm_base: base.ptr(),
            sm_cells: cells.ptr(),
            shares: shares.ptr(),
            done: done.ptr(),
            timing: 0,
            n_ops: n as i32,
            n_gemv: gi as i32,
            x_floats: x_floats as i32,
            pad: 0,
        };
        let launch = |p: &StreamParams| {
            Launch::new(
                &self.gpu,
                "decode_stream",
                kernel,
                (grid as u32, 1, 1),
                STREAM_THREADS as u32,
                smem as u32,
                p,
            )
        };
        let l = launch(&p);
        let profiled = launch(&StreamParams {
            timing: timing.ptr(),
            ..p
        });
        let labels = self.plan.iter().map(|l| l.label).collect();
        self.step_profile = Some((profiled, labels, timing.ptr()));
        self.step_bufs = vec![ops, stream, base, cells, shares, done, timing];
        Ok(l)
    }
}
