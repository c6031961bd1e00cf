//! Engine benchmark: prefill a prompt, time greedy decode, break one step down by kernel, and
//! measure the GPU's read bandwidth in the same run so the result can be read as a fraction of
//! what the card can do.

use std::sync::Arc;
use std::time::Instant;

use hayai_model::{Model, Rows, Runner};

use crate::device::Gpu;
use crate::runner::{BwParams, CudaOptions, CudaRunner, OpTime};
use crate::CudaError;

#[derive(Clone, Debug)]
pub struct BenchOptions {
    pub prompt_len: usize,
    pub gen: usize,
    /// Decode runs (after one warm-up run); the median is reported.
    pub runs: usize,
    /// The runner's options (quantization, device, decode-kernel variants); the benchmark sets
    /// `max_context` to what it needs (or keeps a larger one asked for: the decode plan's
    /// attention splits follow it, as in a server sized for long contexts) and always replays
    /// the graph.
    pub cuda: CudaOptions,
    /// Also time every operation of the step on its own (`BenchReport::ops`).
    pub ops: bool,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            prompt_len: 128,
            gen: 512,
            runs: 3,
            cuda: CudaOptions::default(),
            ops: false,
        }
    }
}

#[derive(Clone, Debug)]
pub struct KernelTime {
    pub label: String,
    pub launches: usize,
    /// Total over one step, milliseconds.
    pub ms: f64,
}

#[derive(Clone, Debug)]
pub struct BenchReport {
    pub gpu: String,
    /// The runner's options in effect (`StreamedStep::Auto` decided).
    pub cuda: CudaOptions,
    /// Why `StreamedStep::Auto` kept the launch plan (None: it did not, or was not asked).
    pub launch_plan_reason: Option<String>,
    /// Programmatic dependent launch was in effect (asked for, and the GPU is sm_90+).
    pub pdl: bool,
    pub prompt_len: usize,
    pub gen: usize,
    pub prefill_ms: f64,
    /// Median decode throughput over the runs.
    pub tok_s: f64,
    /// Every run's decode throughput.
    pub runs_tok_s: Vec<f64>,
    pub ms_per_token: f64,
    pub kernels_per_step: usize,
    pub weight_bytes_per_token: usize,
    pub achieved_gb_s: f64,
    /// Read bandwidth measured with a streaming kernel in the same process.
    pub measured_read_gb_s: f64,
    pub pct_of_measured: f64,
    /// One run of the same decode by `greedy_step` in a loop (the host reads each token before
    /// it launches the next step).
    pub stepwise_tok_s: f64,
    /// One run with no host read between steps (`greedy_chain`): the bound on what the host's
    /// turn between steps costs.
    pub chained_tok_s: f64,
    /// One eagerly launched step, by kernel label (event-timed; launch gaps included).
    pub per_kernel: Vec<KernelTime>,
    pub profiled_step_ms: f64,
    /// With `BenchOptions::ops`: each operation's launches replayed back to back from a graph
    /// (each streams another layer's weights, no dependency chain): µs per launch, and without
    /// the prologue's norms where it has them.
    pub ops: Vec<OpTime>,
    /// A streamed-step timing probe was in effect: a timing only, its tokens unchecked.
    pub timing_probe: bool,
}

impl BenchReport {
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        s += &format!(
            "gpu: {}\nquant: {}  gemv: {}  pdl: {}  fused ple: {}  attention prefetch: {}  attention tile: {}  l2 prefetch: {}  prompt: {}  gen: {}\n",
            self.gpu,
            self.cuda.quant.name(),
            self.cuda.gemv_name(),
            if self.pdl { "on" } else { "off" },
            if self.cuda.fuse_ple { "on" } else { "off" },
            if self.cuda.attn_prefetch { "on" } else { "off" },
            if self.cuda.attn_smem_tile { "shared" } else { "global" },
            if self.cuda.l2_prefetch_own && self.cuda.l2_prefetch == 0 {
                "own".to_string()
            } else {
                self.cuda.l2_prefetch.to_string()
            },
            self.prompt_len,
            self.gen
        );
        if let Some(why) = &self.launch_plan_reason {
            s += &format!("launch plan, not the streamed step: {why}\n");
        }
        if self.timing_probe {
            s += "timing probe in effect: its outputs are wrong by design, tokens unchecked\n";
        }
        s += &format!("prefill: {:.1} ms\n", self.prefill_ms);
        s += &format!(
            "decode: {:.1} tok/s (median of {:?}), {:.3} ms/token\n",
            self.tok_s,
            self.runs_tok_s
                .iter()
                .map(|v| (v * 10.0).round() / 10.0)
                .collect::<Vec<_>>(),
            self.ms_per_token
        );
        let vs = |v: f64| {
            format!(
                "{v:.1} tok/s ({:+.1} us a step)",
                1e3 * (1e3 / v - self.ms_per_token)
            )
        };
        s += &format!(
            "  the host's turn: a read before each launch (greedy_step) {}; no read between steps {}\n",
            vs(self.stepwise_tok_s),
            vs(self.chained_tok_s)
        );
        s += &format!(
            "kernels/step: {}  weight bytes/token: {:.3} GB\n",
            self.kernels_per_step,
            self.weight_bytes_per_token as f64 / 1e9
        );
        s += &format!(
            "achieved: {:.0} GB/s = {:.1}% of measured read bandwidth {:.0} GB/s\n",
            self.achieved_gb_s, self.pct_of_measured, self.measured_read_gb_s
        );
        s += &format!(
            "per-kernel (one eager step, {:.3} ms):\n",
            self.profiled_step_ms
        );
        for k in &self.per_kernel {
            s += &format!(
                "  {:<16} {:>5} launches {:>9.3} ms {:>5.1}%\n",
                k.label,
                k.launches,
                k.ms,
                100.0 * k.ms / self.profiled_step_ms.max(1e-9)
            );
        }
        if !self.ops.is_empty() {
            let step: f64 = self.ops.iter().map(|o| o.us * o.launches as f64).sum();
            s += &format!(
                "per operation, alone (its launches back to back from a graph; {:.3} ms per step in all):
",
                step / 1e3
            );
            for o in &self.ops {
                let gbs = o.bytes as f64 / o.us / 1e3;
                let norm = match o.us_without_norm {
                    Some(u) => format!("  without norms {u:>6.1} us"),
                    None => String::new(),
                };
                s += &format!(
                    "  {:<16} {:<12} {:>9} {:>3} x {:>7.2} MB {:>7.1} us {:>6.0} GB/s {:>5.1}%{norm}\n",
                    o.label,
                    o.kernel,
                    format!("{}x{}", o.grid.0, o.grid.1),
                    o.launches,
                    o.bytes as f64 / 1e6,
                    o.us,
                    gbs,
                    100.0 * gbs / self.measured_read_gb_s.max(1e-9)
                );
            }
        }
        s
    }
}

/// Deterministic pseudo-random prompt ids in `[3, vocab)`.
pub fn bench_prompt(len: usize, vocab: usize) -> Vec<u32> {
    let mut r = hayai_model::random::SplitMix::new(0xB0B);
    (0..len)
        .map(|_| 3 + (r.next_u64() % (vocab as u64 - 3).max(1)) as u32)
        .collect()
}

/// Read bandwidth in GB/s: best of several passes over a 2 GiB buffer.
pub(crate) fn measure_read_bw(gpu: &Gpu) -> Result<f64, CudaError> {
    let bytes = 2usize << 30;
    let buf = gpu.alloc(bytes)?;
    let sink = gpu.alloc(16)?;
    let p = BwParams {
        data: buf.ptr(),
        n16: (bytes / 16) as u64,
        sink: sink.ptr(),
    };
    let f = gpu.func("read_bw");
    let grid = (gpu.sm_count as u32 * 8, 1, 1);
    let mut best = f64::MAX;
    for i in 0..6 {
        gpu.sync()?;
        let t = Instant::now();
        gpu.launch(f, grid, 512, 0, &p)?;
        gpu.sync()?;
        let dt = t.elapsed().as_secs_f64();
        if i > 0 {
            best = best.min(dt);
        }
    }
    Ok(bytes as f64 / best / 1e9)
}

pub fn bench_engine(model: Arc<Model>, opts: &BenchOptions) -> Result<BenchReport, CudaError> {
    let vocab = model.spec.vocab;
    let total = opts.prompt_len + opts.gen + 2;
    let mut r = CudaRunner::new(
        model,
        CudaOptions {
            max_context: Some(opts.cuda.max_context.map_or(total, |m| m.max(total))),
            use_graph: true,
            ..opts.cuda.clone()
        },
    )?;
    let prompt = bench_prompt(opts.prompt_len.max(1), vocab);
    // Prefill the prompt afresh; its argmax is the first token to feed.
    let prefill = |r: &mut CudaRunner| -> Result<(u32, f64), CudaError> {
        r.truncate(0);
        let t = Instant::now();
        let mut next = 0u32;
        r.forward(&prompt, Rows::Last, &mut |_, l| {
            next = hayai_model::argmax(l);
        })?;
        Ok((next, t.elapsed().as_secs_f64() * 1e3))
    };
    // The timed runs decode as the engine does (`greedy_decode`: a step queued ahead of the
    // host's read); one more run each way shows what the host's turn between steps costs:
    // `greedy_step` in a loop (a read and a launch between steps), and `greedy_chain` (no
    // read between steps at all). All three must end on the same token.
    let mut runs = Vec::new();
    let mut prefill_ms = 0.0;
    let mut last = 0u32;
    for run in 0..=opts.runs.max(1) {
        let (next, pf) = prefill(&mut r)?;
        let t = Instant::now();
        let n = r.greedy_decode(next, opts.gen, &mut |tok| {
            last = tok;
            true
        })?;
        let dt = t.elapsed().as_secs_f64();
        if n != opts.gen {
            return Err(CudaError::Unsupported(format!(
                "greedy_decode stopped after {n} of {} tokens",
                opts.gen
            )));
        }
        if run > 0 {
            runs.push(opts.gen as f64 / dt);
            prefill_ms = pf;
        }
    }
    let (mut next, _) = prefill(&mut r)?;
    let t = Instant::now();
    for _ in 0..opts.gen {
        next = r.greedy_step(next)?;
    }
    let stepwise_tok_s = opts.gen as f64 / t.elapsed().as_secs_f64();
    let (first, _) = prefill(&mut r)?;
    let t = Instant::now();
    let chained = r.greedy_chain(first, opts.gen)?;
    let chained_tok_s = opts.gen as f64 / t.elapsed().as_secs_f64();
    // Under a timing probe the outputs are wrong by design (and racy with the wait left out).
    let timing_probe = r.timing_probe();
    if opts.gen > 0 && !timing_probe && (next != last || chained != last) {
        return Err(CudaError::Unsupported(format!(
            "decode loops disagree: greedy_decode ended on token {last}, greedy_step on {next}, \
             greedy_chain on {chained}"
        )));
    }

    let mut sorted = runs.clone();
    sorted.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let tok_s = sorted[sorted.len() / 2];

    // Per-kernel breakdown at the end of the generated context.
    r.truncate(opts.prompt_len + opts.gen);
    let prof = r.profile_step(1)?;
    let mut per: Vec<KernelTime> = Vec::new();
    for (label, ms) in &prof {
        match per.iter_mut().find(|k| k.label == *label) {
            Some(k) => {
                k.launches += 1;
                k.ms += *ms as f64;
            }
            None => per.push(KernelTime {
                label: label.to_string(),
                launches: 1,
                ms: *ms as f64,
            }),
        }
    }
    per.sort_by(|a, b| b.ms.partial_cmp(&a.ms).unwrap());
    let profiled_step_ms = per.iter().map(|k| k.ms).sum();
    let ops = if opts.ops {
        r.bench_ops(5)?
    } else {
        Vec::new()
    };

    let bw = measure_read_bw(r.gpu())?;
    let wb = r.weight_bytes_per_token();
    let achieved = wb as f64 * tok_s / 1e9;
    Ok(BenchReport {
        gpu: r.gpu_name().to_string(),
        cuda: r.options().clone(),
        launch_plan_reason: r.launch_plan_reason().map(str::to_string),
        pdl: r.gpu().pdl,
        prompt_len: opts.prompt_len,
        gen: opts.gen,
        prefill_ms,
        tok_s,
        runs_tok_s: runs,
        ms_per_token: 1e3 / tok_s,
        kernels_per_step: r.kernels_per_step(),
        weight_bytes_per_token: wb,
        achieved_gb_s: achieved,
        measured_read_gb_s: bw,
        pct_of_measured: 100.0 * achieved / bw,
        stepwise_tok_s,
        chained_tok_s,
        per_kernel: per,
        profiled_step_ms,
        ops,
        timing_probe,
    })
}
