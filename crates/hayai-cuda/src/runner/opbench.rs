//! Per-operation benchmark of the decode plan: every launch of one operation (e.g. the 42
//! `gemv.gate_up` launches of E4B) replayed back to back from a CUDA graph, so each streams a
//! different layer's weights from DRAM (no L2 reuse) and the host is out of the loop. The
//! dependency chain between operations is not part of it: this is what each operation costs on
//! its own, next to what the step pays for it (bench_engine's per-kernel breakdown).

use std::time::Instant;

use super::launch::{capture_graph, read_param, write_param, GemvParams, Launch};
use super::CudaRunner;
use crate::device::drv;
use crate::CudaError;

/// One operation of the decode step, measured alone.
#[derive(Clone, Debug)]
pub struct OpTime {
    pub label: &'static str,
    pub kernel: &'static str,
    /// Launches of this operation per step.
    pub launches: usize,
    /// Weight bytes one launch streams (its matrix and scales).
    pub bytes: usize,
    /// Blocks of the first launch: (row tiles or splits x heads, K splits or heads).
    pub grid: (u32, u32),
    /// Microseconds per launch, back to back.
    pub us: f64,
    /// The same GEMVs with their residual add and norms taken out of the prologue (x is then the
    /// plain sum of the input partials, built for the block's K split only): what the norms cost
    /// inside every block. None for launches without a norm.
    pub us_without_norm: Option<f64>,
}

impl CudaRunner {
    /// Times each operation of the plan (by label, kernel and shape — Gemma 4's sliding and
    /// global layers apart —, in plan order) over `reps` replays of all its launches. Needs a
    /// fed context (the attention reads the current position).
    pub(crate) fn bench_ops(&mut self, reps: usize) -> Result<Vec<OpTime>, CudaError> {
        self.gpu.bind()?;
        let io = [0i32, self.len.saturating_sub(1) as i32];
        self.gpu.write(self.scratch.step_io.ptr(), &io)?;
        let mut keys: Vec<OpKey> = Vec::new();
        for l in &self.plan {
            if !keys.contains(&op_key(l)) {
                keys.push(op_key(l));
            }
        }
        let mut out = Vec::new();
        for key in keys {
            let ls: Vec<Launch> = self
                .plan
                .iter()
                .filter(|l| op_key(l) == key)
                .cloned()
                .collect();
            let label = key.0;
            let us = self.time_launches(&ls, reps)?;
            let normed: Vec<Launch> = ls.iter().filter_map(without_norm).collect();
            let us_without_norm = if normed.len() == ls.len() {
                Some(self.time_launches(&normed, reps)?)
            } else {
                None
            };
            out.push(OpTime {
                label,
                kernel: ls[0].kernel,
                launches: ls.len(),
                bytes: ls[0].reads[0].1 + ls[0].reads[1].1,
                grid: (ls[0].grid.0, ls[0].grid.1),
                us,
                us_without_norm,
            });
        }
        Ok(out)
    }

    /// Microseconds per launch of `ls` replayed `reps` times from one graph (best of 5 replays
    /// after a warm-up).
    fn time_launches(&self, ls: &[Launch], reps: usize) -> Result<f64, CudaError> {
        let g = capture_graph(&self.gpu, (0..reps.max(1)).flat_map(|_| ls.iter()))?;
        let mut best = f64::INFINITY;
        for i in 0..6 {
            let t = Instant::now();
            g.launch().map_err(drv)?;
            self.gpu.sync()?;
            if i > 0 {
                best = best.min(t.elapsed().as_secs_f64());
            }
        }
        Ok(best * 1e6 / (reps.max(1) * ls.len()) as f64)
    }
}

/// What makes launches one operation in [`CudaRunner::bench_ops`]: label, kernel, grid and
/// weight bytes.
type OpKey = (&'static str, &'static str, (u32, u32, u32), usize);

fn op_key(l: &Launch) -> OpKey {
    (l.label, l.kernel, l.grid, l.reads[0].1 + l.reads[1].1)
}

/// `l` with its prologue's residual add and norms removed, for a GEMV that has them (None
/// otherwise). The launch then computes a different vector: for timing only.
fn without_norm(l: &Launch) -> Option<Launch> {
    // Every GEMV kernel but the PLE pair takes a GemvParams block.
    if !l.kernel.starts_with("gemv") || l.kernel == "gemv_pair" {
        return None;
    }
    let mut p: GemvParams = read_param(&l.params, 0);
    if p.res_in == 0 && p.norm_w == 0 {
        return None;
    }
    p.res_in = 0;
    p.res_out = 0;
    p.res_w = 0;
    p.norm_w = 0;
    let mut m = l.clone();
    write_param(&mut m.params, 0, &p);
    Some(m)
}
