//! GPU-vs-CPU parity checks, shared by the tests and the `gpu_check` example.
//!
//! The CPU reference runs on exactly the weights the GPU uses ([`round_model_bf16`] or
//! [`quantize_model_int4`]), so any difference comes from arithmetic order alone.

use std::sync::Arc;

use hayai_model::cpu::{CpuRunner, MatmulInputs};
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
    /// With int8 activations: what last-bit differences before the int8 rounding do to this
    /// model on the CPU by themselves (the reference against itself with every matrix input
    /// nudged by one ulp, `MatmulInputs::Int8Nudged`): (rel L2, argmax mismatches).
    pub rounding_floor: Option<(f64, usize)>,
    /// The GPU summed on tensor cores, whose f32 accumulation is not IEEE round-to-nearest
    /// (products are aligned to the largest and truncated inside each mma): the rel-L2 tolerance
    /// is at least [`TENSOR_CORE_TOL`], greedy tokens must still be identical.
    pub tensor_core_sums: bool,
}

/// Smallest rel-L2 tolerance for tensor-core sums against a sequential f32 reference. Measured
/// on the H200 (2026-11-30): `gemv_mma` sits 12-14x further from its twin than the CUDA-core
/// GEMV on both small models (1.0e-4 vs 9.1e-6 Gemma 4, 8.7e-6 vs 6.2e-7 Gemma 3) — a constant
/// factor, as a systematic accumulation difference gives; a layout or fragment error gives O(1).
pub const TENSOR_CORE_TOL: f64 = 1e-3;

impl ParityReport {
    /// From every prompt logit row of both sides and the greedy tokens each generated.
    fn new(
        quant: Quant,
        gpu_rows: &[Vec<f32>],
        cpu_rows: &[Vec<f32>],
        steps: usize,
        gpu_tokens: &[u32],
        cpu_tokens: &[u32],
    ) -> ParityReport {
        let (max_abs, max_ref, rel_l2, mism) = compare_rows(gpu_rows, cpu_rows);
        ParityReport {
            quant,
            prompt_len: gpu_rows.len(),
            max_abs,
            max_ref,
            rel_l2,
            prompt_argmax_mismatches: mism,
            greedy_steps: steps,
            greedy_agree: gpu_tokens
                .iter()
                .zip(cpu_tokens)
                .take_while(|(a, b)| a == b)
                .count(),
            rounding_floor: None,
            tensor_core_sums: false,
        }
    }

    /// Within `tol` (rel L2; at least [`TENSOR_CORE_TOL`] for tensor-core sums) with every
    /// greedy token identical, or — where a rounding step
    /// (int8 activations) turns last-bit differences into whole rounding flips — within twice
    /// what those flips do by themselves (`rounding_floor`) plus one argmax flip.
    pub fn agrees(&self, tol: f64) -> bool {
        let tol = if self.tensor_core_sums {
            tol.max(TENSOR_CORE_TOL)
        } else {
            tol
        };
        let tight = self.rel_l2 < tol && self.greedy_identical();
        tight
            || within_floor(
                self.rel_l2,
                self.prompt_argmax_mismatches,
                self.rounding_floor,
            )
    }

    pub fn greedy_identical(&self) -> bool {
        self.greedy_agree == self.greedy_steps
    }
    pub fn line(&self) -> String {
        let floor = match self.rounding_floor {
            Some((rel, mism)) => {
                format!(" (one-ulp nudges alone, CPU: rel_l2 {rel:.2e} argmax-mismatch {mism})")
            }
            None if self.tensor_core_sums => " (tensor-core sums)".to_string(),
            None => String::new(),
        };
        format!(
            "{} prompt {} : max|d| {:.2e} (max|ref| {:.2}) rel_l2 {:.2e} argmax-mismatch {}{floor} | greedy {}/{} identical",
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

/// A difference (rel L2, argmax mismatches) within twice what a rounding does to the model by
/// itself on the CPU (`floor`), plus one argmax flip: what random-weight models, which amplify
/// any rounding difference, can be held to.
fn within_floor(rel: f64, mism: usize, floor: Option<(f64, usize)>) -> bool {
    floor.is_some_and(|(frel, fmism)| rel <= 2.0 * frel && mism <= 2 * fmism + 1)
}

/// The CPU reference model for `quant`.
pub fn reference_model(model: &Model, quant: Quant) -> Model {
    match quant {
        Quant::Bf16 => round_model_bf16(model),
        Quant::Int4 => quantize_model_int4(model),
    }
}

/// The CPU reference model of the decode step `opts` runs: [`reference_model`], with the exact
/// int8 output head where [`CudaOptions::lm_head`] takes one (`LmHead::int8_blocks`, as the GPU
/// runner decides; where `Int8` finds none the runner refuses).
pub fn decode_reference_model(model: &Model, opts: &CudaOptions) -> Model {
    match opts
        .lm_head
        .int8_blocks(opts.quant, model.weights.lm_head())
    {
        Ok(Some(head)) => crate::quant::round_model_bf16_int8_head(model, &head),
        _ => reference_model(model, opts.quant),
    }
}

fn all_logits(r: &mut dyn Runner, tokens: &[u32]) -> Result<Vec<Vec<f32>>, CudaError> {
    let mut out = Vec::new();
    r.forward(tokens, Rows::All, &mut |_, l| out.push(l.to_vec()))?;
    Ok(out)
}

/// Every prompt row's logits through the batched prefill (to compare prefill forms whose
/// outputs must be bit-identical).
pub fn prefill_logits(
    model: &Model,
    opts: &CudaOptions,
    prompt: &[u32],
) -> Result<Vec<Vec<f32>>, CudaError> {
    let o = CudaOptions {
        max_context: Some(prompt.len() + 1),
        batched_prefill: true,
        ..opts.clone()
    };
    let mut r = CudaRunner::new(Arc::new(model.clone()), o)?;
    all_logits(&mut r, prompt)
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

/// Compare every prompt logit row: (max |d|, max |ref|, rel L2, argmax mismatches).
pub fn compare_rows(g: &[Vec<f32>], c: &[Vec<f32>]) -> (f32, f32, f64, usize) {
    let (mut max_abs, mut max_ref, mut num, mut den, mut mism) = (0f32, 0f32, 0f64, 0f64, 0);
    for (gr, cr) in g.iter().zip(c) {
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
    if g.len() != c.len() {
        mism += g.len().abs_diff(c.len());
    }
    (max_abs, max_ref, (num / den.max(1e-30)).sqrt(), mism)
}

/// The batched (tensor-core) prefill against its CPU twins.
#[derive(Clone, Debug)]
pub struct PrefillReport {
    /// Against the twin: the CPU reference on the GPU's prefill operands (bf16 weights as the
    /// GEMMs see them, every matrix-product input rounded to bf16), then f32 decoding.
    pub twin: ParityReport,
    /// Precise mode (`CudaOptions::precise_prefill`, GEMM inputs as a bf16 pair) against its CPU
    /// twin (`MatmulInputs::Bf16Pair` on the same weights): (max |d|, rel L2, argmax mismatches).
    /// Both round identically, so what is left is summation order, as on the decode path; the
    /// default mode's distance to its twin is not a tight check on random-weight models, which
    /// amplify any bf16 rounding flip chaotically.
    pub precise: Option<(f32, f64, usize)>,
    /// What the precise mode's rounding does to this model by itself, on the CPU: its twin
    /// against the f32 reference on the same weights (rel L2, argmax mismatches). Random-weight
    /// Gemma 4 models amplify a 2^-17 rounding to ~3e-3 (docs/performance.md §Prefill).
    pub precise_floor: Option<(f64, usize)>,
    /// The prompt fed in two pieces (split at `split`) gave bit-identical logits to one piece.
    pub chunking_invariant: bool,
    pub split: usize,
}

impl PrefillReport {
    /// The precise mode agrees with its twin: within 1e-3 (rel L2) with argmax flips on at most
    /// 1 row in 50, or — on models that amplify rounding — within twice what the rounding does
    /// by itself (`precise_floor`) plus one flip; and chunking changes nothing.
    pub fn precise_ok(&self) -> bool {
        let Some((_, rel, mism)) = self.precise else {
            return false;
        };
        let tight = rel < 1e-3 && mism * 50 <= self.twin.prompt_len;
        (tight || within_floor(rel, mism, self.precise_floor)) && self.chunking_invariant
    }

    pub fn line(&self) -> String {
        let floor = match self.precise_floor {
            Some((rel, mism)) => {
                format!(" (its rounding alone, CPU: rel_l2 {rel:.2e} argmax-mismatch {mism})")
            }
            None => String::new(),
        };
        let precise = match self.precise {
            Some((max, rel, mism)) => format!(
                " | precise mode vs its twin: max|d| {max:.2e} rel_l2 {rel:.2e} argmax-mismatch {mism}{floor}"
            ),
            None => String::new(),
        };
        format!(
            "batched prefill vs CPU twin {}{} | split at {}: logits {}",
            self.twin.line(),
            precise,
            self.split,
            if self.chunking_invariant {
                "bit-identical"
            } else {
                "DIFFER"
            }
        )
    }
}

/// Batched prefill of `prompt` (every logit row) against its CPU twin, the same prompt fed in
/// two pieces (must be bit-identical: rows depend only on their own prefix), then `steps` greedy
/// decode steps after a `Rows::Last` prefill on both. With `precise`, also the precise mode's
/// prompt logits against its own CPU twin.
pub fn prefill_parity(
    model: &Model,
    opts: &CudaOptions,
    prompt: &[u32],
    steps: usize,
    precise: bool,
) -> Result<PrefillReport, CudaError> {
    let quant = opts.quant;
    let exact = reference_model(model, quant);
    // What the prefill GEMMs multiply: bf16 weights, int4 as bf16(q * scale).
    let twin_model = Arc::new(round_model_bf16(&exact));
    let m = Arc::new(model.clone());
    let o = CudaOptions {
        max_context: Some(prompt.len() + steps + 1),
        batched_prefill: true,
        ..opts.clone()
    };
    let mut gpu = CudaRunner::new(m.clone(), o.clone())?;
    let g = all_logits(&mut gpu, prompt)?;
    let mut twin = CpuRunner::new(twin_model.clone())?;
    twin.set_matmul_inputs(MatmulInputs::Bf16);
    let c = all_logits(&mut twin, prompt)?;
    let (precise, precise_floor) = if precise {
        let mut p = CudaRunner::new(
            m.clone(),
            CudaOptions {
                precise_prefill: true,
                ..o.clone()
            },
        )?;
        let gp = all_logits(&mut p, prompt)?;
        drop(p);
        let mut r = CpuRunner::new(twin_model.clone())?;
        r.set_matmul_inputs(MatmulInputs::Bf16Pair);
        let f = all_logits(&mut r, prompt)?;
        let (max, _, rel, mism) = compare_rows(&gp, &f);
        let mut r = CpuRunner::new(twin_model)?;
        let f32_logits = all_logits(&mut r, prompt)?;
        let (_, _, frel, fmism) = compare_rows(&f, &f32_logits);
        (Some((max, rel, mism)), Some((frel, fmism)))
    } else {
        (None, None)
    };

    let split = (prompt.len() * 2 / 5).max(1);
    gpu.truncate(0);
    let mut two = all_logits(&mut gpu, &prompt[..split])?;
    two.extend(all_logits(&mut gpu, &prompt[split..])?);
    let chunking_invariant = two == g;

    // Decoding after the prompt as a generation does it (Rows::Last): the GPU batches all
    // tokens but the last and feeds that one through the f32 decode step; the twin keeps its
    // bf16 prefill of those tokens and redoes the last one in f32.
    gpu.truncate(0);
    let mut first = 0u32;
    gpu.forward(prompt, Rows::Last, &mut |_, l| first = argmax(l))?;
    let n = prompt.len();
    // The twin of the step that runs (`StreamedStep::Auto` decided by the runner).
    set_decode_twin(&mut twin, gpu.options());
    let mut cfirst = 0u32;
    twin.truncate(n.saturating_sub(1));
    twin.forward(&prompt[n.saturating_sub(1)..], Rows::Last, &mut |_, l| {
        cfirst = argmax(l)
    })?;
    let (gs, cs) = if first == cfirst {
        (
            greedy(&mut gpu, first, steps)?,
            greedy(&mut twin, first, steps)?,
        )
    } else {
        (vec![first], vec![cfirst])
    };
    Ok(PrefillReport {
        twin: ParityReport::new(quant, &g, &c, steps, &gs, &cs),
        precise,
        precise_floor,
        chunking_invariant,
        split,
    })
}

/// How the CPU twin rounds its matrix inputs to compute what the decode GEMVs of `opts` compute:
/// int8 activations (one scale per 128 columns; integer sums on either int8 path, so no
/// tensor-core accumulation error), x as a bf16 pair (tensor cores), or f32 (also the streamed
/// step's int4 without int8 activations: x as a 23-bit fixed point per 128 columns, integer sums).
fn decode_matmul_inputs(opts: &CudaOptions) -> MatmulInputs {
    if opts.uses_int8_activations() {
        MatmulInputs::Int8 { group: 128 }
    } else if opts.uses_tensor_cores() {
        MatmulInputs::Bf16Pair
    } else {
        MatmulInputs::F32
    }
}

/// `cpu` as the CPU twin of the decode step of `opts`: its matrix inputs rounded as
/// `decode_matmul_inputs` says.
fn set_decode_twin(cpu: &mut CpuRunner, opts: &CudaOptions) {
    cpu.set_matmul_inputs(decode_matmul_inputs(opts));
}

/// Feed `prompt` to both backends comparing every logit row, then run `steps` greedy steps on
/// each and count how long they agree. This checks the decode path: prompts are fed one decode
/// step per token here (see [`prefill_parity`] for the batched path).
pub fn parity(
    model: &Model,
    opts: &CudaOptions,
    prompt: &[u32],
    steps: usize,
) -> Result<ParityReport, CudaError> {
    let quant = opts.quant;
    let reference = Arc::new(decode_reference_model(model, opts));
    let max_context = Some(prompt.len() + steps + 1);
    let mut gpu = CudaRunner::new(
        Arc::new(model.clone()),
        CudaOptions {
            max_context,
            batched_prefill: false,
            ..opts.clone()
        },
    )?;
    let mut cpu = CpuRunner::new(reference.clone())?;
    // The options in effect (`StreamedStep::Auto` decided by the runner).
    let opts = &gpu.options().clone();
    let int8 = opts.uses_int8_activations();
    let tc = opts.uses_tensor_cores();
    set_decode_twin(&mut cpu, opts);
    let g = all_logits(&mut gpu, prompt)?;
    let c = all_logits(&mut cpu, prompt)?;
    let first = argmax(c.last().map(|v| &v[..]).unwrap_or(&[]));
    let gs = greedy(&mut gpu, first, steps)?;
    let cs = greedy(&mut cpu, first, steps)?;
    let mut r = ParityReport::new(quant, &g, &c, steps, &gs, &cs);
    r.tensor_core_sums = tc && !int8;
    if int8 {
        r.rounding_floor = Some(int8_rounding_floor(reference, prompt, 128)?);
    }
    Ok(r)
}

/// Nudge patterns `int8_rounding_floor` takes the largest effect of.
pub const NUDGE_PATTERNS: u64 = 4;

/// How far one-ulp differences in every matrix input move `model` through int8 activation
/// rounding (per `group` columns), on the CPU alone: (rel L2, argmax mismatches) of the prompt
/// logits with the inputs nudged against without, the largest over [`NUDGE_PATTERNS`] patterns
/// of up/down nudges. One pattern is a poor estimate: whether a rounding flips at all is chance,
/// and one flip moves a small model's logits by ~1e-3 (measured on the small Gemma 3 of the
/// streamed-step checks: 1.8e-7 with the first pattern, 3.5e-3 to 1.1e-2 with seven others).
pub fn int8_rounding_floor(
    model: Arc<Model>,
    prompt: &[u32],
    group: usize,
) -> Result<(f64, usize), CudaError> {
    let mut a = CpuRunner::new(model.clone())?;
    a.set_matmul_inputs(MatmulInputs::Int8 { group });
    let la = all_logits(&mut a, prompt)?;
    let mut floor = (0f64, 0usize);
    for seed in 0..NUDGE_PATTERNS {
        let mut b = CpuRunner::new(model.clone())?;
        b.set_matmul_inputs(MatmulInputs::Int8Nudged { group, seed });
        let (_, _, rel, mism) = compare_rows(&all_logits(&mut b, prompt)?, &la);
        floor = (floor.0.max(rel), floor.1.max(mism));
    }
    Ok(floor)
}

/// Two decode configurations that must compute the same arithmetic (e.g. `fuse_ple`,
/// `gemv_unroll8` on and off) give bit-identical prompt logits (fed through the decode graph)
/// and `steps` greedy tokens.
pub fn same_results(
    model: &Model,
    a: &CudaOptions,
    b: &CudaOptions,
    prompt: &[u32],
    steps: usize,
) -> Result<bool, CudaError> {
    let m = Arc::new(model.clone());
    let mut out = Vec::new();
    for o in [a, b] {
        let mut r = CudaRunner::new(
            m.clone(),
            CudaOptions {
                max_context: Some(prompt.len() + steps + 1),
                batched_prefill: false,
                ..o.clone()
            },
        )?;
        let logits = all_logits(&mut r, prompt)?;
        let first = argmax(logits.last().map(|v| &v[..]).unwrap_or(&[]));
        out.push((logits, greedy(&mut r, first, steps)?));
    }
    Ok(out[0] == out[1])
}

/// Logits of the graph path and the eager (kernel-by-kernel) path must be bit-identical.
pub fn graph_matches_eager(
    model: &Model,
    quant: Quant,
    persistent_gemv: bool,
    prompt: &[u32],
) -> Result<bool, CudaError> {
    let graph = CudaOptions {
        quant,
        persistent_gemv,
        ..Default::default()
    };
    let eager = CudaOptions {
        use_graph: false,
        ..graph.clone()
    };
    same_results(model, &graph, &eager, prompt, 0)
}

/// One decode step's operations on two configurations of the same model, after both have taken
/// `prompt` through the batched prefill with every row computed there (`Rows::All`), so both
/// caches hold the same prefill kernels' entries (empty: the step starts from an empty cache; one
/// token goes through each configuration's own decode step): per operation, its label, the rel
/// L2 of `b`'s output from `a`'s and the largest |a| (`CudaRunner::op_outputs`). The first
/// operation that moves localizes a difference between two decode paths.
pub fn op_outputs_compare(
    model: &Model,
    a: &CudaOptions,
    b: &CudaOptions,
    prompt: &[u32],
    token: u32,
) -> Result<Vec<(&'static str, f64, f32)>, CudaError> {
    let run = |o: &CudaOptions| -> Result<Vec<(&'static str, Vec<f32>)>, CudaError> {
        let mut r = CudaRunner::new(
            Arc::new(model.clone()),
            CudaOptions {
                max_context: Some(prompt.len() + 2),
                batched_prefill: true,
                ..o.clone()
            },
        )?;
        if !prompt.is_empty() {
            r.forward(prompt, Rows::All, &mut |_, _| {})?;
        }
        r.op_outputs(token)
    };
    let (oa, ob) = (run(a)?, run(b)?);
    if oa.len() != ob.len() || oa.iter().zip(&ob).any(|(x, y)| x.0 != y.0) {
        return Err(CudaError::Unsupported(
            "operation outputs: the two plans' operations differ".into(),
        ));
    }
    Ok(oa
        .iter()
        .zip(&ob)
        .map(|((label, va), (_, vb))| {
            let (_, max, rel, _) = compare_rows(std::slice::from_ref(vb), std::slice::from_ref(va));
            let rel = if va.len() != vb.len() {
                f64::INFINITY
            } else {
                rel
            };
            (*label, rel, max)
        })
        .collect())
}
