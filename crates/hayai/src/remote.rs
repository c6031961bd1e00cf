//! Commands around HTTP: the server, and the harness that scores any OpenAI-compatible server.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use hayai_bench::{registry, DatasetSpec, Endpoint};
use hayai_engine::Engine;
use hayai_server::{HayaiText, ServerConfig};
use hayai_tokenizer::{ChatMessage, ChatTemplate, Tokenizer};
use serde_json::json;

use crate::local::{self, ModelArgs};

/// The model's chat template source: GGUF metadata, `chat_template.jinja` or
/// `tokenizer_config.json`; `None` when it ships none.
pub fn template_source(path: &Path) -> Result<Option<String>> {
    if path.is_dir() {
        return Ok(hayai_tokenizer::hf_chat_template(path)?);
    }
    let g = hayai_core::GgufFile::open(path)?;
    Ok(hayai_tokenizer::gguf_chat_template(&g))
}

pub fn chat_template_for(path: &Path, tok: &Tokenizer) -> Result<ChatTemplate> {
    let src = template_source(path)?;
    Ok(ChatTemplate::for_model(src.as_deref(), tok)?)
}

#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[arg(long, env = "HOST", default_value = "127.0.0.1")]
    host: String,
    #[arg(long, env = "PORT", default_value_t = 8000)]
    port: u16,
    /// Name clients put in `model` (default: MODEL_ID, else the model file name).
    #[arg(long, env = "SERVED_MODEL_NAME")]
    served_model_name: Option<String>,
    /// Requests allowed to wait behind the running one (more are answered 503).
    #[arg(long, default_value_t = 64)]
    queue_capacity: usize,
}

pub fn serve(mut a: ServeArgs) -> Result<ExitCode> {
    if a.model.model.is_none() {
        a.model.model = std::env::var("MODEL_ID").ok();
    }
    let l = local::load(&a.model)?;
    let tok = l.tokenizer.clone().with_context(|| {
        format!(
            "{} has no tokenizer; the server needs one",
            l.path.display()
        )
    })?;
    let template = chat_template_for(&l.tokenizer_path, &tok)?;
    let text = Arc::new(HayaiText::new(tok, template));
    let runner = local::make_runner(&l, &a.model)?;
    eprintln!("backend: {}", runner.info().backend);
    let engine = Engine::new(runner);
    // The name clients send: SERVED_MODEL_NAME / --served-model-name, else MODEL_ID (the
    // harness's convention), else the model's file name.
    let default_name = std::env::var("MODEL_ID").ok().unwrap_or_else(|| {
        l.path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "hayai".into())
    });
    let cfg = ServerConfig {
        host: a.host,
        port: a.port,
        served_model_name: a.served_model_name.unwrap_or(default_name),
        model_id: l.path.display().to_string(),
        queue_capacity: a.queue_capacity,
        ..ServerConfig::default()
    };
    hayai_server::run(engine, text, cfg)?;
    Ok(ExitCode::SUCCESS)
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum EndpointArg {
    Chat,
    Completions,
}

impl From<EndpointArg> for Endpoint {
    fn from(e: EndpointArg) -> Self {
        match e {
            EndpointArg::Chat => Endpoint::Chat,
            EndpointArg::Completions => Endpoint::Completions,
        }
    }
}

/// Where a harness command records its run.
#[derive(Args, Clone)]
pub struct OutArgs {
    /// Write the run's files here.
    #[arg(long)]
    output_dir: Option<PathBuf>,
    /// Record the run under RESULTS/<run-name>/ (with run_environment.json) for `hayai report`.
    #[arg(long)]
    run_name: Option<String>,
    #[arg(long, default_value = "results")]
    results_dir: PathBuf,
}

impl OutArgs {
    fn dir(&self) -> Result<Option<PathBuf>> {
        if let Some(d) = &self.output_dir {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
            return Ok(Some(d.clone()));
        }
        match &self.run_name {
            Some(n) => Ok(Some(registry::run_dir(&self.results_dir, n)?)),
            None => Ok(None),
        }
    }

    fn dir_or_default(&self, prefix: &str) -> Result<PathBuf> {
        match self.dir()? {
            Some(d) => Ok(d),
            None => Ok(registry::run_dir(
                &self.results_dir,
                &registry::default_run_name(prefix),
            )?),
        }
    }
}

fn write_env(dir: &Path, base_url: &str, flags: serde_json::Value) -> Result<()> {
    registry::collect_environment(Some(base_url), flags).write(dir)?;
    Ok(())
}

fn cli_flags() -> serde_json::Value {
    json!({ "argv": std::env::args().collect::<Vec<_>>(), "hayai": crate::setup::build_info() })
}

#[derive(Args)]
pub struct BenchArgs {
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    base_url: String,
    /// Served model name (default: the first the server lists).
    #[arg(long)]
    model: Option<String>,
    /// ShareGPT JSON file, or `random`.
    #[arg(long)]
    dataset: String,
    /// Words per prompt for `--dataset random`.
    #[arg(long, default_value_t = 256)]
    random_input_words: usize,
    #[arg(long, default_value_t = 128)]
    num_prompts: usize,
    #[arg(long, default_value_t = 512)]
    output_len: u32,
    #[arg(long, default_value_t = 1)]
    max_concurrency: usize,
    #[arg(long, default_value_t = 4)]
    warmup_requests: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Generate exactly output_len tokens.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    ignore_eos: bool,
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Stream responses (adds TTFT / ITL / TPOT).
    #[arg(long)]
    stream: bool,
    #[arg(long, value_enum, default_value = "chat")]
    endpoint: EndpointArg,
    /// Keep the file order instead of shuffling with the seed.
    #[arg(long)]
    no_shuffle: bool,
    #[arg(long)]
    no_progress: bool,
    #[command(flatten)]
    out: OutArgs,
}

pub fn bench_options(a: &BenchArgs, out: Option<PathBuf>) -> hayai_bench::BenchOptions {
    let dataset = if a.dataset == "random" {
        DatasetSpec::Random {
            input_words: a.random_input_words,
        }
    } else {
        DatasetSpec::ShareGpt(PathBuf::from(&a.dataset))
    };
    hayai_bench::BenchOptions {
        base_url: a.base_url.clone(),
        model: a.model.clone(),
        dataset,
        num_prompts: a.num_prompts,
        shuffle: !a.no_shuffle,
        output_len: a.output_len,
        max_concurrency: a.max_concurrency,
        warmup_requests: a.warmup_requests,
        seed: a.seed,
        ignore_eos: a.ignore_eos,
        temperature: a.temperature,
        stream: a.stream,
        endpoint: a.endpoint.into(),
        output_dir: out,
        show_progress: !a.no_progress,
        ..Default::default()
    }
}

pub fn bench(a: BenchArgs) -> Result<ExitCode> {
    let out = a.out.dir()?;
    let opts = bench_options(&a, out.clone());
    let r = hayai_bench::run_bench(&opts)?;
    r.print();
    if let Some(d) = &out {
        write_env(d, &a.base_url, cli_flags())?;
        eprintln!("results written to {}", d.display());
    }
    Ok(if r.failed() > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

pub fn ppl_endpoint(
    url: &str,
    model: Option<String>,
    records: &Path,
    output_dir: Option<PathBuf>,
    limit: Option<usize>,
    as_json: bool,
) -> Result<ExitCode> {
    let opts = hayai_bench::ppl::PplOptions {
        base_url: url.to_string(),
        model,
        records: records.to_path_buf(),
        output_dir: output_dir.clone(),
        bos_token_id: Some(2),
        limit,
        show_progress: !as_json,
        request_timeout: Some(Duration::from_secs(3600)),
        wait_ready: Some(Duration::from_secs(5)),
    };
    let r = hayai_bench::ppl::run_ppl(&opts)?;
    if as_json {
        println!("{}", serde_json::to_string_pretty(&r.summary)?);
    } else {
        r.print();
    }
    if let Some(d) = &output_dir {
        write_env(d, url, cli_flags())?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Prompt text → ids with the model's chat template applied client-side (one user turn).
fn prompt_encoder(model: &str) -> Result<impl Fn(&str) -> anyhow::Result<Vec<u32>>> {
    let path = crate::fetch::resolve_model(Some(model))?;
    let tok = local::load_tokenizer(&path)?
        .with_context(|| format!("{} has no tokenizer", path.display()))?;
    let tmpl = chat_template_for(&path, &tok)?;
    Ok(move |text: &str| -> anyhow::Result<Vec<u32>> {
        let rendered = tmpl.render(&[ChatMessage::user(text)], true)?;
        Ok(tok.encode(&rendered, false))
    })
}

#[derive(Args)]
pub struct CaptureArgs {
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    base_url: String,
    #[arg(long)]
    model: Option<String>,
    /// ShareGPT prompts.
    #[arg(long)]
    prompts: PathBuf,
    /// Model (GGUF or HF dir, or `gemma-3-270m`) whose tokenizer and chat template turn prompts
    /// into ids client-side.
    #[arg(long, default_value = "gemma-3-270m")]
    tokenizer: String,
    #[arg(long)]
    num_prompts: Option<usize>,
    #[arg(long, default_value_t = 512)]
    max_tokens: u32,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[arg(long)]
    no_progress: bool,
    #[command(flatten)]
    out: OutArgs,
}

pub fn capture(a: CaptureArgs) -> Result<ExitCode> {
    let enc = prompt_encoder(&a.tokenizer)?;
    let out = a.out.dir_or_default("capture")?;
    let opts = hayai_bench::capture::CaptureOptions {
        base_url: a.base_url.clone(),
        model: a.model.clone(),
        prompts: a.prompts.clone(),
        num_prompts: a.num_prompts,
        max_tokens: a.max_tokens,
        seed: a.seed,
        output_dir: Some(out.clone()),
        show_progress: !a.no_progress,
        request_timeout: Some(Duration::from_secs(3600)),
        wait_ready: Some(Duration::from_secs(5)),
    };
    let r = hayai_bench::capture::run_capture(&opts, &enc)?;
    r.print();
    write_env(&out, &a.base_url, cli_flags())?;
    eprintln!("capture written to {}", out.display());
    Ok(ExitCode::SUCCESS)
}

#[derive(Args)]
pub struct IdentityArgs {
    /// decode_outputs.jsonl (or a run directory holding one).
    a: PathBuf,
    b: PathBuf,
    #[arg(long)]
    json: bool,
}

fn capture_file(p: &Path) -> PathBuf {
    if p.is_dir() {
        p.join("decode_outputs.jsonl")
    } else {
        p.to_path_buf()
    }
}

pub fn identity(a: IdentityArgs) -> Result<ExitCode> {
    let r = hayai_bench::identity::compare_capture_files(&capture_file(&a.a), &capture_file(&a.b))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        r.print();
    }
    Ok(ExitCode::from(r.exit_code() as u8))
}

#[derive(Args)]
pub struct VerifyArgs {
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    base_url: String,
    #[arg(long)]
    model: Option<String>,
    /// Public prompt set (ShareGPT).
    #[arg(long)]
    prompts: PathBuf,
    /// A second ("private") prompt set; default: the public file split into disjoint halves.
    #[arg(long)]
    private_prompts: Option<PathBuf>,
    #[arg(long, default_value_t = 2)]
    repeats: usize,
    #[arg(long, default_value_t = 128)]
    num_prompts: usize,
    #[arg(long, default_value_t = 512)]
    output_len: u32,
    #[arg(long, default_value_t = 4)]
    warmup_requests: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// PPL records (challenge format).
    #[arg(long)]
    ppl_records: PathBuf,
    /// Absolute PPL cap.
    #[arg(long, conflicts_with = "ppl_reference")]
    ppl_cap: Option<f64>,
    /// Reference PPL; the cap is 1.05 × this.
    #[arg(long)]
    ppl_reference: Option<f64>,
    /// Allowed relative TPS difference between the prompt sets.
    #[arg(long, default_value_t = 0.05)]
    tps_tolerance: f64,
    /// Allowed (max - min) / median across repeated runs.
    #[arg(long, default_value_t = 0.05)]
    spread_tolerance: f64,
    /// A reference decode_outputs.jsonl for the greedy-identity check.
    #[arg(long)]
    reference_capture: Option<PathBuf>,
    /// Model whose tokenizer/chat template builds capture prompts (needed with a reference).
    #[arg(long, default_value = "gemma-3-270m")]
    tokenizer: String,
    #[arg(long, default_value_t = 512)]
    capture_max_tokens: u32,
    #[arg(long)]
    no_progress: bool,
    #[command(flatten)]
    out: OutArgs,
}

pub fn verify(a: VerifyArgs) -> Result<ExitCode> {
    use hayai_bench::verify::{run_verify, PplCap, VerifyOptions};
    let cap = match (a.ppl_cap, a.ppl_reference) {
        (Some(c), None) => PplCap::Absolute(c),
        (None, Some(r)) => PplCap::reference(r),
        _ => bail!("give --ppl-cap or --ppl-reference"),
    };
    let out = a.out.dir_or_default("verify")?;
    let opts = VerifyOptions {
        base_url: a.base_url.clone(),
        model: a.model.clone(),
        public_prompts: a.prompts.clone(),
        private_prompts: a.private_prompts.clone(),
        repeats: a.repeats,
        num_prompts: a.num_prompts,
        output_len: a.output_len,
        max_concurrency: 1,
        warmup_requests: a.warmup_requests,
        seed: a.seed,
        endpoint: Endpoint::Chat,
        ppl_records: a.ppl_records.clone(),
        ppl_cap: cap,
        ppl_bos_token_id: Some(2),
        tps_tolerance: a.tps_tolerance,
        spread_tolerance: a.spread_tolerance,
        reference_capture: a.reference_capture.clone(),
        capture_prompts: None,
        capture_max_tokens: a.capture_max_tokens,
        output_dir: Some(out.clone()),
        show_progress: !a.no_progress,
        request_timeout: Some(Duration::from_secs(3600)),
        wait_ready: Some(Duration::from_secs(5)),
    };
    let report = if a.reference_capture.is_some() {
        let enc = prompt_encoder(&a.tokenizer)?;
        run_verify(&opts, Some(&enc))?
    } else {
        run_verify(&opts, None)?
    };
    report.print();
    write_env(&out, &a.base_url, cli_flags())?;
    eprintln!("verify written to {}", out.display());
    Ok(if report.is_valid() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

#[derive(Args)]
pub struct ReportArgs {
    #[arg(long, default_value = "results")]
    results_dir: PathBuf,
    /// Markdown leaderboard output (default RESULTS/leaderboard.md).
    #[arg(long)]
    markdown: Option<PathBuf>,
    /// SVG chart output (default RESULTS/tps.svg).
    #[arg(long)]
    svg: Option<PathBuf>,
}

pub fn report(a: ReportArgs) -> Result<ExitCode> {
    let opts = hayai_bench::report::ReportOptions {
        results_root: a.results_dir.clone(),
        markdown_out: Some(
            a.markdown
                .unwrap_or_else(|| a.results_dir.join("leaderboard.md")),
        ),
        svg_out: Some(a.svg.unwrap_or_else(|| a.results_dir.join("tps.svg"))),
    };
    let r = hayai_bench::report::run_report(&opts)?;
    r.print();
    Ok(ExitCode::SUCCESS)
}
