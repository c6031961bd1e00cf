//! The single-kernel decode step (`CudaOptions::single_kernel`, kernels/step.cu): its launch
//! shape on this GPU and the plan's operations packed into its operation list.

use super::*;

impl CudaRunner {
    /// Shared memory, ring depth and grid of the single-kernel step on this GPU.
    pub(super) fn step_config(&self, max_cols: usize) -> Result<StepConfig, CudaError> {
        let spec = &self.model.spec;
        if let Some(p) = &spec.ple {
            if p.dim > 256 {
                return Err(CudaError::Unsupported(format!(
                    "single-kernel step: per-layer embedding width {} (at most 256)",
                    p.dim
                )));
            }
        }
        let x_floats = max_cols.max(STEP_ATTN_FLOATS).next_multiple_of(4);
        let stage = STEP_WARPS * STEP_U * (32 + 1) * 16;
        // Three ring stages (measured faster than six on the H200: docs/performance.md);
        // HAYAI_STEP_STAGES=6 selects the deep ring for measurements.
        let (kernel, stages) = match std::env::var("HAYAI_STEP_STAGES").as_deref() {
            Ok("6") => ("decode_step_s6", 6),
            _ => ("decode_step_s3", 3),
        };
        let smem = x_floats * 4 + stages * stage;
        let optin = self.gpu.max_dynamic_smem(kernel)?;
        if smem > optin {
            return Err(CudaError::Unsupported(format!(
                "single-kernel step: GEMV width {max_cols} needs {smem} bytes of shared memory, a block can have {optin}"
            )));
        }
        self.gpu.set_max_dynamic_smem(kernel, smem)?;
        let per_sm = unsafe {
            cudarc::driver::result::occupancy::max_active_block_per_multiprocessor(
                self.gpu.func(kernel),
                256,
                smem,
            )
        }
        .map_err(drv)? as usize;
        if per_sm == 0 {
            return Err(CudaError::Unsupported(
                "single-kernel step: no block fits on an SM".into(),
            ));
        }
        let grid = per_sm * self.gpu.sm_count as usize;
        Ok(StepConfig {
            kernel,
            grid,
            smem,
            x_floats,
            warps: grid * STEP_WARPS,
        })
    }

    /// The recorded launch plan as the single-kernel step's operation list, uploaded, and the
    /// one launch that runs it.
    pub(super) fn step_launch(&mut self) -> Result<Launch, CudaError> {
        let cfg = self.step_kernel.as_ref().expect("step config");
        let kinds: Vec<i32> = self
            .plan
            .iter()
            .map(|l| match l.kernel {
                "gemv" => Ok(0),
                "attn_split" | "attn_split_hd256" | "attn_split_hd512" => Ok(1),
                "attn_split_wv_hd256" | "attn_split_wv_hd512" => Ok(1),
                "ple_combine" => Ok(2),
                "argmax_stage1" => Ok(3),
                "argmax_stage2" => Ok(4),
                k => Err(CudaError::Unsupported(format!(
                    "single-kernel step: no operation for kernel {k}"
                ))),
            })
            .collect::<Result<_, _>>()?;
        let n = kinds.len();
        let mut bytes = vec![0u8; n * STEP_OP_BYTES];
        let mut next = n as i32;
        for i in (0..n).rev() {
            let op = &mut bytes[i * STEP_OP_BYTES..(i + 1) * STEP_OP_BYTES];
            op[0..4].copy_from_slice(&kinds[i].to_le_bytes());
            op[4..8].copy_from_slice(&next.to_le_bytes());
            let params: Vec<u8> = self.plan[i]
                .params
                .iter()
                .flat_map(|w| w.to_le_bytes())
                .collect();
            if params.len() > STEP_OP_BYTES - 8 {
                return Err(CudaError::Unsupported(format!(
                    "single-kernel step: {} parameters exceed an operation",
                    self.plan[i].label
                )));
            }
            op[8..8 + params.len()].copy_from_slice(&params);
            if kinds[i] == 0 {
                next = i as i32;
            }
        }
        let first_gemv = next;
        let ops = self.gpu.upload(&bytes)?;
        let barrier = self.gpu.alloc(16)?;
        let timing = self.gpu.alloc(n * STEP_STAMPS * 8)?;
        let p = StepParams {
            ops: ops.ptr(),
            barrier: barrier.ptr(),
            timing: 0,
            n_ops: n as i32,
            first_gemv,
            x_floats: cfg.x_floats as i32,
        };
        let launch = |p: &StepParams| {
            Launch::new(
                &self.gpu,
                "decode_step",
                cfg.kernel,
                (cfg.grid as u32, 1, 1),
                256,
                cfg.smem as u32,
                p,
            )
        };
        let l = launch(&p);
        let profiled = launch(&StepParams {
            timing: timing.ptr(),
            ..p
        });
        let labels = self.plan.iter().map(|l| l.label).collect();
        self.step_profile = Some((profiled, labels, timing.ptr()));
        self.step_bufs = vec![ops, barrier, timing];
        Ok(l)
    }
}
