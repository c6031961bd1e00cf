//! Engine benchmark: prefill a prompt, time greedy decode, break one step down by kernel, and
//! measure the GPU's read bandwidth in the same run so the result can be read as a fraction of
//! what the card can do.

use std::sync::Arc;
use std::time::Instant;

use hayai_model::{Model, Rows, Runner};

use crate::device::Gpu;
use crate::runner::{BwParams, CudaOptions, CudaRunner, Quant};
use crate::CudaError;

#[derive(Clone, Debug)]
pub struct BenchOptions {
    pub quant: Quant,
    pub prompt_len: usize,
    pub gen: usize,
    pub device_ordinal: usize,
    /// Decode runs (after one warm-up run); the median is reported.
    pub runs: usize,
    /// See [`CudaOptions::persistent_gemv`].
    pub persistent_gemv: bool,
    /// See [`CudaOptions::pdl`].
    pub pdl: bool,
    /// See [`CudaOptions::fuse_ple`].
    pub fuse_ple: bool,
    /// See [`CudaOptions::gemv_unroll8`].
    pub gemv_unroll8: bool,
    /// See [`CudaOptions::attn_prefetch`].
    pub attn_prefetch: bool,
    /// See [`CudaOptions::single_kernel`].
    pub single_kernel: bool,
    /// See [`CudaOptions::attn_smem_tile`].
    pub attn_smem_tile: bool,
    /// See [`CudaOptions::int8_activations`].
    pub int8_activations: bool,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            quant: Quant::Int4,
            prompt_len: 128,
            gen: 512,
            device_ordinal: 0,
            runs: 3,
            persistent_gemv: false,
            pdl: true,
            fuse_ple: false,
            gemv_unroll8: false,
            attn_prefetch: false,
            single_kernel: false,
            attn_smem_tile: false,
            int8_activations: false,
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
    pub quant: Quant,
    pub persistent_gemv: bool,
    /// Programmatic dependent launch was in effect (asked for, and the GPU is sm_90+).
    pub pdl: bool,
    pub fuse_ple: bool,
    pub gemv_unroll8: bool,
    pub attn_prefetch: bool,
    pub single_kernel: bool,
    pub attn_smem_tile: bool,
    pub int8_activations: bool,
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
    /// One eagerly launched step, by kernel label (event-timed; launch gaps included).
    pub per_kernel: Vec<KernelTime>,
    pub profiled_step_ms: f64,
}

impl BenchReport {
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        s += &format!(
            "gpu: {}\nquant: {}  gemv: {}  pdl: {}  fused ple: {}  attention prefetch: {}  attention tile: {}  prompt: {}  gen: {}\n",
            self.gpu,
            self.quant.name(),
            match (
                self.single_kernel,
                self.persistent_gemv,
                self.int8_activations,
                self.gemv_unroll8
            ) {
                (true, ..) => "single-kernel step",
                (false, true, ..) => "persistent",
                (false, false, true, _) => "tiled, int8 activations (DP4A)",
                (false, false, false, true) => "tiled, 8 loads in flight",
                (false, false, false, false) => "tiled",
            },
            if self.pdl { "on" } else { "off" },
            if self.fuse_ple { "on" } else { "off" },
            if self.attn_prefetch { "on" } else { "off" },
            if self.attn_smem_tile { "shared" } else { "global" },
            self.prompt_len,
            self.gen
        );
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
            quant: opts.quant,
            max_context: Some(total),
            device_ordinal: opts.device_ordinal,
            use_graph: true,
            persistent_gemv: opts.persistent_gemv,
            pdl: opts.pdl,
            fuse_ple: opts.fuse_ple,
            gemv_unroll8: opts.gemv_unroll8,
            attn_prefetch: opts.attn_prefetch,
            single_kernel: opts.single_kernel,
            attn_smem_tile: opts.attn_smem_tile,
            int8_activations: opts.int8_activations,
            ..Default::default()
        },
    )?;
    let prompt = bench_prompt(opts.prompt_len.max(1), vocab);
    let mut runs = Vec::new();
    let mut prefill_ms = 0.0;
    for run in 0..=opts.runs.max(1) {
        r.truncate(0);
        let t = Instant::now();
        let mut next = 0u32;
        r.forward(&prompt, Rows::Last, &mut |_, l| {
            next = hayai_model::argmax(l);
        })?;
        let pf = t.elapsed().as_secs_f64() * 1e3;
        let t = Instant::now();
        for _ in 0..opts.gen {
            next = r.greedy_step(next)?;
        }
        let dt = t.elapsed().as_secs_f64();
        if run > 0 {
            runs.push(opts.gen as f64 / dt);
            prefill_ms = pf;
        }
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

    let bw = measure_read_bw(r.gpu())?;
    let wb = r.weight_bytes_per_token();
    let achieved = wb as f64 * tok_s / 1e9;
    Ok(BenchReport {
        gpu: r.gpu_name().to_string(),
        quant: opts.quant,
        persistent_gemv: opts.persistent_gemv,
        pdl: r.gpu().pdl,
        fuse_ple: opts.fuse_ple,
        gemv_unroll8: opts.gemv_unroll8,
        attn_prefetch: opts.attn_prefetch,
        single_kernel: opts.single_kernel,
        attn_smem_tile: opts.attn_smem_tile,
        int8_activations: opts.int8_activations,
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
        per_kernel: per,
        profiled_step_ms,
    })
}
