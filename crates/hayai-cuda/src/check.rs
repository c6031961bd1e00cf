//! GPU-vs-CPU parity checks, shared by the tests and the `gpu_check` example.
//!
//! The CPU reference runs on exactly the weights the GPU uses ([`round_model_bf16`] or
//! [`quantize_model_int4`]), so any difference comes from arithmetic order alone.

use std::sync::Arc;

use hayai_model::cpu::CpuRunner;
use hayai_model::{argmax, Model, Rows, Runner};

use crate::quant::{quantize_model_int4, round_model_bf16};
use crate::runner::{CudaOptions, CudaRunner, Quant};
use crate::CudaError;

#[derive(Clone, Debug)]
pub struct ParityReport {
    pub quant: Quant,
    pub prompt_len: usize,
    /// Largest |gpu - cpu| over every prompt logit.
    pub max_abs: f32,
    /// Largest |cpu| logit (scale of `max_abs`).
    pub max_ref: f32,
    /// ||gpu - cpu|| / ||cpu|| over every prompt logit.
    pub rel_l2: f64,
    /// Prompt positions whose argmax differs.
    pub prompt_argmax_mismatches: usize,
    pub greedy_steps: usize,
    /// Greedy steps that agree before the first difference.
    pub greedy_agree: usize,
}

impl ParityReport {
    pub fn greedy_identical(&self) -> bool {
        self.greedy_agree == self.greedy_steps
    }
    pub fn line(&self) -> String {
        format!(
            "{} prompt {} : max|d| {:.2e} (max|ref| {:.2}) rel_l2 {:.2e} argmax-mismatch {} | greedy {}/{} identical",
            self.quant.name(),
            self.prompt_len,
            self.max_abs,
            self.max_ref,
            self.rel_l2,
            self.prompt_argmax_mismatches,
            self.greedy_agree,
            self.greedy_steps
        )
    }
}

/// The CPU reference model for `quant`.
pub fn reference_model(model: &Model, quant: Quant) -> Model {
    match quant {
        Quant::Bf16 => round_model_bf16(model),
        Quant::Int4 => quantize_model_int4(model),
    }
}

fn all_logits(r: &mut dyn Runner, tokens: &[u32]) -> Result<Vec<Vec<f32>>, CudaError> {
    let mut out = Vec::new();
    r.forward(tokens, Rows::All, &mut |_, l| out.push(l.to_vec()))?;
    Ok(out)
}

fn greedy(r: &mut dyn Runner, first: u32, steps: usize) -> Result<Vec<u32>, CudaError> {
    let mut t = first;
    let mut out = Vec::with_capacity(steps);
    for _ in 0..steps {
        t = r.greedy_step(t)?;
        out.push(t);
    }
    Ok(out)
}

/// Feed `prompt` to both backends comparing every logit row, then run `steps` greedy steps on
/// each and count how long they agree.
pub fn parity(
    model: &Model,
    opts: &CudaOptions,
    prompt: &[u32],
    steps: usize,
) -> Result<ParityReport, CudaError> {
    let quant = opts.quant;
    let reference = Arc::new(reference_model(model, quant));
    let max_context = Some(prompt.len() + steps + 1);
    let mut gpu = CudaRunner::new(
        Arc::new(model.clone()),
        CudaOptions {
            max_context,
            ..opts.clone()
        },
    )?;
    let mut cpu = CpuRunner::new(reference)?;
    let g = all_logits(&mut gpu, prompt)?;
    let c = all_logits(&mut cpu, prompt)?;
    let (mut max_abs, mut max_ref, mut num, mut den, mut mism) = (0f32, 0f32, 0f64, 0f64, 0);
    for (gr, cr) in g.iter().zip(&c) {
        for (&a, &b) in gr.iter().zip(cr) {
            let d = a - b;
            max_abs = max_abs.max(if d.is_nan() { f32::INFINITY } else { d.abs() });
            max_ref = max_ref.max(b.abs());
            num += (d as f64) * (d as f64);
            den += (b as f64) * (b as f64);
        }
        if argmax(gr) != argmax(cr) {
            mism += 1;
        }
    }
    let first = argmax(c.last().map(|v| &v[..]).unwrap_or(&[]));
    let gs = greedy(&mut gpu, first, steps)?;
    let cs = greedy(&mut cpu, first, steps)?;
    let agree = gs.iter().zip(&cs).take_while(|(a, b)| a == b).count();
    Ok(ParityReport {
        quant,
        prompt_len: prompt.len(),
        max_abs,
        max_ref,
        rel_l2: (num / den.max(1e-30)).sqrt(),
        prompt_argmax_mismatches: mism,
        greedy_steps: steps,
        greedy_agree: agree,
    })
}

/// Logits of the graph path and the eager (kernel-by-kernel) path must be bit-identical.
pub fn graph_matches_eager(
    model: &Model,
    quant: Quant,
    persistent_gemv: bool,
    prompt: &[u32],
) -> Result<bool, CudaError> {
    let m = Arc::new(model.clone());
    let mut out = Vec::new();
    for use_graph in [true, false] {
        let mut r = CudaRunner::new(
            m.clone(),
            CudaOptions {
                quant,
                max_context: Some(prompt.len() + 1),
                use_graph,
                persistent_gemv,
                ..Default::default()
            },
        )?;
        out.push(all_logits(&mut r, prompt)?);
    }
    Ok(out[0] == out[1])
}
