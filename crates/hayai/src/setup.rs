//! Glue between the CLI and the backends: device selection, build facts, engine benchmark,
//! chat rendering, synthetic checkpoints, and the main job (`hayai demo`).

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use hayai_model::{Model, Rows, Runner};
use hayai_tokenizer::Tokenizer;
use serde_json::{json, Value};

use crate::local::{Loaded, ModelArgs, Quant};

pub fn gpu_available() -> bool {
    hayai_cuda::build_info().cuda_kernels > 0 && hayai_cuda::probe().is_some()
}

fn cuda_quant(q: Quant) -> hayai_cuda::Quant {
    match q {
        Quant::Int4 | Quant::Int4A8 => hayai_cuda::Quant::Int4,
        Quant::Native | Quant::Bf16 => hayai_cuda::Quant::Bf16,
    }
}

/// The CUDA backend's options for these arguments. The arithmetic is the format's (`--quant`),
/// never a kernel variant's: int8 activations (W4A8) come with `--quant int4-a8` and only with it.
pub fn cuda_options(args: &ModelArgs) -> Result<hayai_cuda::CudaOptions> {
    let a8 = args.quant == Quant::Int4A8;
    let opts = args.variant.apply(hayai_cuda::CudaOptions {
        quant: cuda_quant(args.quant),
        int8_activations: a8,
        batched_prefill: args.prefill == crate::local::Prefill::Batched,
        ..Default::default()
    });
    if a8 && !opts.uses_int8_activations() {
        anyhow::bail!(
            "--quant int4-a8: the chosen decode variant (--persistent-gemv or --single-kernel) has no int8-activation path"
        );
    }
    if let Some(c) = opts.conflict() {
        anyhow::bail!(c);
    }
    Ok(opts)
}

pub fn cuda_runner(l: &Loaded, args: &ModelArgs) -> Result<Box<dyn Runner>> {
    let opts = cuda_options(args)?;
    hayai_cuda::load_runner(l.model.clone(), opts).context("starting the CUDA backend")
}

pub fn round_model_bf16(m: &Model) -> Model {
    hayai_cuda::round_model_bf16(m)
}

pub fn quantize_model_int4(m: &Model) -> Model {
    hayai_cuda::quantize_model_int4(m)
}

pub fn build_info() -> Value {
    let b = hayai_cuda::build_info();
    let gpu = hayai_cuda::probe().map(|g| {
        json!({
            "name": g.name,
            "compute_capability": format!("{}.{}", g.compute_capability.0, g.compute_capability.1),
            "memory_bytes": g.total_mem_bytes,
            "multiprocessors": g.sm_count,
            "driver_cuda_version": g.driver_version,
        })
    });
    json!({
        "version": env!("CARGO_PKG_VERSION"),
        "cuda_archs": b.cuda_archs,
        "cuda_kernels": b.cuda_kernels,
        "fatbin_bytes": b.fatbin_bytes,
        "gpu": gpu,
        "cpu_threads": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "target": std::env::consts::ARCH,
        "os": std::env::consts::OS,
    })
}

/// Render one user message with the model's chat template (or the built-in Gemma format).
pub fn render_user_turn(l: &Loaded, tok: &Tokenizer, text: &str) -> Result<String> {
    let tmpl = chat_template(l, tok)?;
    let msgs = [hayai_tokenizer::ChatMessage::user(text)];
    Ok(tmpl.render(&msgs, true)?)
}

/// The model's own chat template if it ships one, else the built-in format of its family.
pub fn chat_template(l: &Loaded, tok: &Tokenizer) -> Result<hayai_tokenizer::ChatTemplate> {
    crate::remote::chat_template_for(&l.tokenizer_path, tok)
}

pub fn synth(preset: &str, seed: u64, out: &Path, dtype: &str) -> Result<()> {
    let dtype: hayai_model::synth::SynthDtype = dtype.parse().map_err(anyhow::Error::msg)?;
    hayai_model::synth::synth(preset, seed, out, dtype)
        .with_context(|| format!("writing preset `{preset}` to {}", out.display()))?;
    Ok(())
}

/// Resolve `synth:PRESET` (an in-memory random model) or a model path.
fn bench_model(args: &ModelArgs) -> Result<(String, Arc<Model>)> {
    if let Some(preset) = args.model.as_deref().and_then(|m| m.strip_prefix("synth:")) {
        let spec = hayai_cuda::synth::spec_by_name(preset).with_context(|| {
            format!(
                "unknown synthetic preset `{preset}` (known: {})",
                hayai_cuda::synth::SPEC_NAMES.join(", ")
            )
        })?;
        return Ok((
            format!("synth:{preset}"),
            Arc::new(hayai_cuda::synth::random_model_bf16(&spec, 7)),
        ));
    }
    let l = crate::local::load(args)?;
    Ok((l.path.display().to_string(), l.model))
}

pub fn bench_engine(
    args: &ModelArgs,
    prompt_len: usize,
    gen: usize,
    as_json: bool,
    ops: bool,
) -> Result<ExitCode> {
    let (name, model) = bench_model(args)?;
    let use_cuda = match args.device {
        crate::local::Device::Cpu => false,
        crate::local::Device::Cuda => true,
        crate::local::Device::Auto => gpu_available(),
    };
    if !use_cuda && ops {
        anyhow::bail!(
            "--ops times the CUDA backend's kernels (use --device cuda on a machine with a GPU)"
        );
    }
    if use_cuda {
        let opts = hayai_cuda::BenchOptions {
            prompt_len,
            gen,
            cuda: cuda_options(args)?,
            ops,
            ..Default::default()
        };
        let r = hayai_cuda::bench_engine(model, &opts)?;
        if as_json {
            let mut v = json!({
                    "model": name, "backend": "cuda", "gpu": r.gpu, "quant": r.cuda.quant.name(),
                    "prompt_len": r.prompt_len, "gen": r.gen, "prefill_ms": r.prefill_ms,
                    "tok_s": r.tok_s, "runs_tok_s": r.runs_tok_s, "ms_per_token": r.ms_per_token,
                    "kernels_per_step": r.kernels_per_step,
                    "pdl": r.pdl, "persistent_gemv": r.cuda.persistent_gemv, "fuse_ple": r.cuda.fuse_ple,
                    "gemv_unroll8": r.cuda.gemv_unroll8, "attn_prefetch": r.cuda.attn_prefetch, "lm_head": if r.cuda.lm_head == hayai_cuda::LmHead::Int8 { "int8" } else { "quant" },
                    "single_kernel": r.cuda.single_kernel, "streamed_step": r.cuda.streamed(), "launch_plan_reason": r.launch_plan_reason, "attn_smem_tile": r.cuda.attn_smem_tile,
                    "int8_activations": r.cuda.int8_activations, "l2_prefetch": r.cuda.l2_prefetch,
                    "tensor_core_gemv": r.cuda.tensor_core_gemv, "gemv": r.cuda.gemv_name(),
                    "weight_bytes_per_token": r.weight_bytes_per_token,
                    "achieved_gb_s": r.achieved_gb_s, "measured_read_gb_s": r.measured_read_gb_s,
                    "pct_of_measured": r.pct_of_measured, "stepwise_tok_s": r.stepwise_tok_s, "chained_tok_s": r.chained_tok_s,
                    "per_kernel": r.per_kernel.iter().map(|k| json!({"label": k.label, "launches": k.launches, "ms": k.ms})).collect::<Vec<_>>(),
                    "ops": r.ops.iter().map(|o| json!({"label": o.label, "kernel": o.kernel, "grid": [o.grid.0, o.grid.1], "launches": o.launches, "bytes": o.bytes, "us": o.us, "us_without_norm": o.us_without_norm})).collect::<Vec<_>>(),
            });
            // (Beside the literal: one more key would pass json!'s recursion limit.)
            v["timing_probe"] = json!(r.timing_probe);
            println!("{v}");
        } else {
            println!("model: {name}\n{}", r.to_text());
        }
        return Ok(ExitCode::SUCCESS);
    }
    // CPU: the reference backend (f32 math; weights as loaded or re-rounded).
    let mut r = crate::local::cpu_runner(model, args)?;
    let model = r.model().clone();
    let bytes = weight_bytes_per_token(&model);
    let prompt = hayai_cuda::bench::bench_prompt(prompt_len, model.spec.vocab);
    let t0 = Instant::now();
    let mut next = 0;
    r.forward(&prompt, Rows::Last, &mut |_, l| {
        next = hayai_model::argmax(l)
    })?;
    let prefill = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    for _ in 0..gen {
        next = r.greedy_step(next)?;
    }
    let secs = t1.elapsed().as_secs_f64();
    let tok_s = gen as f64 / secs;
    let gbs = bytes as f64 * tok_s / 1e9;
    if as_json {
        println!(
            "{}",
            json!({"model": name, "backend": "cpu", "prompt_len": prompt_len, "gen": gen,
                   "prefill_ms": prefill * 1e3, "tok_s": tok_s, "ms_per_token": 1e3 / tok_s,
                   "weight_bytes_per_token": bytes, "achieved_gb_s": gbs,
                   "threads": rayon::current_num_threads()})
        );
    } else {
        println!(
            "model: {name}\nbackend: cpu ({} threads)\nprefill: {prompt_len} tokens in {:.2} s ({:.1} tok/s)\ndecode: {:.2} tok/s, {:.1} ms/token over {gen} tokens\nweight bytes/token: {:.3} GB, achieved {:.1} GB/s",
            rayon::current_num_threads(),
            prefill,
            prompt_len as f64 / prefill,
            tok_s,
            1e3 / tok_s,
            bytes as f64 / 1e9,
            gbs
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Bytes of weights a CPU decode step streams: every projection plus the head, at their stored
/// width (PLE and embedding rows are gathers and not counted).
pub fn weight_bytes_per_token(m: &Model) -> usize {
    let w = &m.weights;
    let mut total = w.lm_head().n_bytes();
    for l in &w.layers {
        total +=
            l.q.n_bytes() + l.o.n_bytes() + l.gate.n_bytes() + l.up.n_bytes() + l.down.n_bytes();
        total += l.k.as_ref().map_or(0, |k| k.n_bytes()) + l.v.as_ref().map_or(0, |v| v.n_bytes());
        if let Some(p) = &l.ple {
            total += p.gate.n_bytes() + p.proj.n_bytes();
        }
    }
    if let Some(p) = &w.ple {
        total += p.model_proj.n_bytes();
    }
    total
}

#[derive(clap::Args)]
pub struct DemoArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompts to bench (default: all 128 on a GPU, 8 on the CPU).
    #[arg(long)]
    num_prompts: Option<usize>,
    /// Tokens per request (default: 512 on a GPU, 48 on the CPU).
    #[arg(long)]
    output_len: Option<u32>,
    /// PPL records to score (default: all 128 on a GPU, 3 on the CPU).
    #[arg(long)]
    ppl_records: Option<usize>,
    /// Benchmark prompts (ShareGPT).
    #[arg(long, default_value = "data/challenge/eval_prompts_sharegpt.json")]
    dataset: std::path::PathBuf,
    /// PPL records file.
    #[arg(long, default_value = "data/challenge/ppl_ground_truth_tokens.jsonl")]
    records: std::path::PathBuf,
    #[arg(long, default_value = "results")]
    results_dir: std::path::PathBuf,
    /// Port for the server (default: a free one).
    #[arg(long)]
    port: Option<u16>,
}

/// Kills the server child when the demo ends, however it ends.
struct ChildGuard(std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(l.local_addr()?.port())
}

fn wait_ready(base: &str, child: &mut std::process::Child, log: &Path) -> Result<()> {
    let t0 = Instant::now();
    let url = format!("{base}/v1/models");
    loop {
        if let Some(st) = child.try_wait()? {
            let tail = std::fs::read_to_string(log).unwrap_or_default();
            let tail: String = tail
                .lines()
                .rev()
                .take(20)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n");
            anyhow::bail!("the server exited ({st}) before becoming ready:\n{tail}");
        }
        if let Ok(resp) = ureq::get(&url).call() {
            if resp.status() == 200 {
                return Ok(());
            }
        }
        if t0.elapsed().as_secs() > 600 {
            anyhow::bail!(
                "the server did not become ready within 10 minutes (log: {})",
                log.display()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
}

pub fn demo(a: DemoArgs) -> Result<ExitCode> {
    let model_path = crate::fetch::resolve_model(a.model.model.as_deref())?;
    let gpu = match a.model.device {
        crate::local::Device::Cpu => false,
        crate::local::Device::Cuda => true,
        crate::local::Device::Auto => gpu_available(),
    };
    let num_prompts = a.num_prompts.unwrap_or(if gpu { 128 } else { 8 });
    let output_len = a.output_len.unwrap_or(if gpu { 512 } else { 48 });
    let ppl_limit = a.ppl_records.unwrap_or(if gpu { 128 } else { 3 });
    for f in [&a.dataset, &a.records] {
        if !f.exists() {
            anyhow::bail!(
                "{} not found (run from the repository root or pass the path)",
                f.display()
            );
        }
    }
    let run = hayai_bench::registry::default_run_name("demo");
    let dir = hayai_bench::registry::run_dir(&a.results_dir, &run)?;
    let port = match a.port {
        Some(p) => p,
        None => free_port()?,
    };
    let base = format!("http://127.0.0.1:{port}");
    let log = dir.join("server.log");
    let exe = std::env::current_exe().context("locating the hayai binary")?;
    let quant = format!("{:?}", a.model.quant).to_lowercase();
    let device = if gpu { "cuda" } else { "cpu" };
    // The decode options given to the demo (e.g. --streamed-step) go to its server.
    let run_args = a.model.run_args();
    let backend = if run_args.is_empty() {
        format!("{device} ({quant})")
    } else {
        format!("{device} ({quant}; {})", run_args.join(" "))
    };
    eprintln!(
        "demo: serving {} on {base} ({backend}); bench {num_prompts} prompts x {output_len} tokens, PPL on {ppl_limit} records",
        model_path.display()
    );
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["serve", "--host", "127.0.0.1", "--port", &port.to_string()]);
    if let Some(t) = &a.model.tokenizer {
        cmd.arg("--tokenizer").arg(t);
    }
    let child = cmd
        .arg("--model")
        .arg(&model_path)
        .args([
            "--device",
            device,
            "--quant",
            &quant,
            "--served-model-name",
            "hayai-demo",
        ])
        .args(&run_args)
        .stdout(std::fs::File::create(&log)?)
        .stderr(std::fs::File::create(dir.join("server.stderr.log"))?)
        .spawn()
        .context("starting the server")?;
    let mut guard = ChildGuard(child);
    wait_ready(&base, &mut guard.0, &dir.join("server.stderr.log"))?;
    // What the server runs on, as it says (e.g. which decode step, and why not the other).
    let engine = hayai_bench::http::Client::new(&base, None)
        .and_then(|c| c.get_json("/health"))
        .ok()
        .and_then(|h| h["backend"].as_str().map(str::to_string))
        .unwrap_or_else(|| "(the server's /health gave none)".into());

    let bench = hayai_bench::BenchOptions {
        base_url: base.clone(),
        model: Some("hayai-demo".into()),
        dataset: hayai_bench::DatasetSpec::ShareGpt(a.dataset.clone()),
        num_prompts,
        output_len,
        output_dir: Some(dir.clone()),
        ..Default::default()
    };
    // The server's own totals around the timed requests: where a request's time goes on its
    // side. The warm-up requests (the same as run_bench's) go first, apart, so they are not in
    // the difference.
    let totals = || {
        hayai_bench::http::Client::new(&base, None)
            .and_then(|c| c.get_text("/metrics"))
            .ok()
            .and_then(|t| hayai_server::metrics::Totals::parse(&t))
    };
    hayai_bench::bench::run_warmup(&bench)?;
    let before = totals();
    let b = hayai_bench::run_bench(&hayai_bench::BenchOptions {
        warmup_requests: 0,
        ..bench.clone()
    })?;
    b.print();
    let server_view = match (before, totals()) {
        (Some(a), Some(z)) => {
            let d = z.since(&a);
            format!(
                "{} requests: first token {:.2} ms mean (queue, prefill of {:.0} tokens, first step); \
                 decode {:.1} tok/s after it; {:.1} ms mean in the server",
                d.requests,
                d.mean_ttft_s() * 1e3,
                d.prompt_tokens as f64 / d.requests.max(1) as f64,
                d.decode_tps(),
                d.mean_e2e_s() * 1e3,
            )
        }
        _ => "(the server's /metrics gave no totals)".into(),
    };
    let ppl = hayai_bench::ppl::PplOptions {
        base_url: base.clone(),
        model: Some("hayai-demo".into()),
        records: a.records.clone(),
        output_dir: Some(dir.clone()),
        bos_token_id: Some(2),
        limit: Some(ppl_limit),
        show_progress: true,
        request_timeout: Some(std::time::Duration::from_secs(3600)),
        wait_ready: None,
    };
    let p = hayai_bench::ppl::run_ppl(&ppl)?;
    p.print();
    hayai_bench::registry::collect_environment(
        Some(&base),
        json!({"argv": std::env::args().collect::<Vec<_>>(), "device": device, "quant": quant,
               "warmup": format!("{} requests of {} tokens, sent apart before the benchmark (its summary records 0)",
                                 bench.warmup_requests, bench.warmup_output_len),
               "model": model_path.display().to_string(), "hayai": build_info()}),
    )
    .write(&dir)?;
    drop(guard);
    println!();
    println!("== hayai demo: {} ==", model_path.display());
    println!("backend          {backend}");
    println!("engine           {engine}");
    println!(
        "requests         {} completed, {} failed",
        b.summary.completed,
        b.failed()
    );
    println!(
        "output tok/s     {:.2}  (the score: completion tokens / wall time)",
        b.summary.output_tps
    );
    println!("total tok/s      {:.2}", b.summary.total_tps);
    println!(
        "mean latency     {:.0} ms",
        b.summary.mean_e2e_latency_ms.unwrap_or(f64::NAN)
    );
    println!("server's view    {server_view}");
    println!(
        "PPL              {:.4} over {} tokens ({} records)",
        p.summary.ppl, p.summary.ppl_num_tokens, p.summary.num_records
    );
    println!("results          {}", dir.display());
    Ok(if b.failed() > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
