//! Commands that run the model in-process: tokenize, generate, ppl, inspect, info, synth,
//! bench-engine.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use hayai_engine::{Engine, GenRequest, LogprobEntry, SamplingParams};
use hayai_model::cpu::CpuRunner;
use hayai_model::load::load_model;
use hayai_model::{Model, Rows, Runner};
use hayai_tokenizer::Tokenizer;
use serde_json::json;

use crate::fetch;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Device {
    Auto,
    Cuda,
    Cpu,
}

/// The decode step's output head on the CUDA backend (`hayai_cuda::LmHead`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LmHeadArg {
    /// int8 where the model stores its head as Q8_0 exactly and --quant is bf16 (the file's own
    /// values, half the bytes of bf16), else as the weights.
    Auto,
    /// int8 blocks with f16 scales (GGML's Q8_0); an error where the head is not exactly so.
    Int8,
    /// In the weights' format (--quant): the head rounded to bf16, or int4.
    Quant,
}

/// How the CUDA backend feeds a prompt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Prefill {
    /// In chunks of up to 256 tokens through tensor-core GEMMs (bf16 activations), the last
    /// token through the decode step.
    Batched,
    /// One decode step per token (f32 activations, as the CPU reference; slow for long prompts).
    Stepwise,
}

/// How the CPU backend rounds the input of every matrix product (what-if numerics: the quality
/// a kernel with such activations would have, measured on the reference).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CpuMatmulInputs {
    /// f32 (the reference).
    F32,
    /// Rounded to bf16.
    Bf16,
    /// bf16 value + bf16 remainder.
    Bf16Pair,
    /// int8, one scale per 32 columns.
    Int8G32,
    /// int8, one scale per 128 columns.
    Int8G128,
}

impl From<CpuMatmulInputs> for hayai_model::cpu::MatmulInputs {
    fn from(c: CpuMatmulInputs) -> Self {
        use hayai_model::cpu::MatmulInputs as M;
        match c {
            CpuMatmulInputs::F32 => M::F32,
            CpuMatmulInputs::Bf16 => M::Bf16,
            CpuMatmulInputs::Bf16Pair => M::Bf16Pair,
            CpuMatmulInputs::Int8G32 => M::Int8 { group: 32 },
            CpuMatmulInputs::Int8G128 => M::Int8 { group: 128 },
        }
    }
}

/// Whose arithmetic the CPU backend follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CpuNumerics {
    /// The f32 reference (the model as defined).
    Reference,
    /// llama.cpp's CPU backend bit for bit (x86 AVX-512 build of the version vendored by
    /// llama-cpp-python 0.3.36, flash attention off): Gemma 3 GGUF files with Q4_K/Q5_0/Q6_K/
    /// Q8_0 weights.
    #[value(name = "llama-cpp")]
    LlamaCpp,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Quant {
    /// The checkpoint's own weights (dequantized to f32 on the CPU, bf16 on the GPU).
    Native,
    Bf16,
    /// int4 group-128, symmetric, bf16 scales (RTN at load).
    Int4,
    /// `int4`'s weights, the inputs of their products rounded to int8 per 128 columns (W4A8;
    /// `int4` is W4A16).
    #[value(name = "int4-a8")]
    Int4A8,
}

impl Quant {
    /// The CPU reference's rounding of matrix-product inputs this format implies, if any.
    pub fn matmul_inputs(self) -> Option<hayai_model::cpu::MatmulInputs> {
        match self {
            Quant::Int4A8 => Some(hayai_model::cpu::MatmulInputs::Int8 { group: 128 }),
            Quant::Native | Quant::Bf16 | Quant::Int4 => None,
        }
    }
}

/// Model selection shared by every in-process command.
#[derive(Args, Clone, Debug)]
pub struct ModelArgs {
    /// A .gguf file, an HF model directory, or `gemma-3-270m` (the default, downloaded once).
    #[arg(long, env = "HAYAI_MODEL")]
    pub model: Option<String>,
    /// Where to run.
    #[arg(long, value_enum, default_value = "auto")]
    pub device: Device,
    /// Weight format on the device.
    #[arg(long, value_enum, default_value = "native")]
    pub quant: Quant,
    /// Take the tokenizer and chat template from this GGUF file or HF directory instead of the
    /// model (for checkpoints that ship none, e.g. synthetic ones).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// How the CUDA backend feeds prompts (no effect on the CPU).
    #[arg(long, value_enum, default_value = "batched")]
    pub prefill: Prefill,
    /// CPU backend only: round every matrix product's input like this (f32 is the reference;
    /// the others measure what a kernel with such activations would cost in quality).
    #[arg(long, value_enum, default_value = "f32")]
    pub cpu_matmul_inputs: CpuMatmulInputs,
    /// CPU backend only: `llama-cpp` reproduces llama.cpp's CPU results bit for bit (its
    /// quantized kernels, summation orders and roundings) instead of the f32 reference.
    #[arg(long, value_enum, default_value = "reference")]
    pub cpu_numerics: CpuNumerics,
    #[command(flatten)]
    pub variant: GpuVariantArgs,
}

pub struct Loaded {
    pub path: PathBuf,
    /// Where the tokenizer and chat template come from (the model unless `--tokenizer`).
    pub tokenizer_path: PathBuf,
    pub model: Arc<Model>,
    pub tokenizer: Option<Arc<Tokenizer>>,
}

/// The tokenizer shipped with a model: GGUF metadata, or tokenizer.json in a directory.
/// `Ok(None)` when a directory has no tokenizer files (id-based commands still work).
pub fn load_tokenizer(path: &Path) -> Result<Option<Tokenizer>> {
    if path.is_dir() {
        if !path.join("tokenizer.json").exists() {
            return Ok(None);
        }
        return Ok(Some(Tokenizer::from_hf_dir(path).with_context(|| {
            format!("loading the tokenizer of {}", path.display())
        })?));
    }
    let gguf = hayai_core::GgufFile::open(path)?;
    Ok(Some(Tokenizer::from_gguf(&gguf).with_context(|| {
        format!("loading the tokenizer of {}", path.display())
    })?))
}

fn require_tokenizer(l: &Loaded) -> Result<&Arc<Tokenizer>> {
    l.tokenizer.as_ref().with_context(|| {
        format!(
            "{} has no tokenizer files; use token ids (--prompt-ids) instead",
            l.path.display()
        )
    })
}

pub fn load(args: &ModelArgs) -> Result<Loaded> {
    let path = fetch::resolve_model(args.model.as_deref())?;
    let t0 = Instant::now();
    let model = load_model(&path).with_context(|| format!("loading {}", path.display()))?;
    let tokenizer_path = args.tokenizer.clone().unwrap_or_else(|| path.clone());
    if !tokenizer_path.exists() {
        bail!("tokenizer path {} does not exist", tokenizer_path.display());
    }
    let tokenizer = load_tokenizer(&tokenizer_path)?.map(Arc::new);
    if let Some(t) = &tokenizer {
        if t.vocab_size() > model.spec.vocab {
            bail!(
                "the tokenizer has {} entries but the model only {} logits",
                t.vocab_size(),
                model.spec.vocab
            );
        }
    }
    tracing_note(&format!(
        "loaded {} ({}, {} layers, vocab {}) in {:.1}s",
        path.display(),
        model.spec.arch.name(),
        model.spec.n_layers(),
        model.spec.vocab,
        t0.elapsed().as_secs_f64()
    ));
    Ok(Loaded {
        path,
        tokenizer_path,
        model: Arc::new(model),
        tokenizer,
    })
}

fn tracing_note(msg: &str) {
    if std::env::var_os("HAYAI_QUIET").is_none() {
        eprintln!("{msg}");
    }
}

/// Build the runner for the requested device and weight format.
pub fn make_runner(l: &Loaded, args: &ModelArgs) -> Result<Box<dyn Runner>> {
    if args.cpu_numerics == CpuNumerics::LlamaCpp {
        return Ok(Box::new(llama_cpp_runner(l, args)?));
    }
    let want_cuda = match args.device {
        Device::Cpu => false,
        Device::Cuda => true,
        Device::Auto => crate::setup::gpu_available(),
    };
    if want_cuda {
        if args.cpu_matmul_inputs != CpuMatmulInputs::F32 {
            anyhow::bail!("--cpu-matmul-inputs applies to the CPU backend only (use --device cpu)");
        }
        return crate::setup::cuda_runner(l, args);
    }
    Ok(Box::new(cpu_runner(l.model.clone(), args)?))
}

/// The CPU forward with llama.cpp's arithmetic, on the GGUF file itself.
fn llama_cpp_runner(l: &Loaded, args: &ModelArgs) -> Result<hayai_model::ggml::GgmlGemma3> {
    if args.device == Device::Cuda {
        bail!("--cpu-numerics llama-cpp runs on the CPU (use --device cpu or auto)");
    }
    if args.quant != Quant::Native || args.cpu_matmul_inputs != CpuMatmulInputs::F32 {
        bail!("--cpu-numerics llama-cpp uses the file's own weights and kernels; drop --quant and --cpu-matmul-inputs");
    }
    args.variant.require_default_on_cpu()?;
    if l.path.is_dir() {
        bail!(
            "--cpu-numerics llama-cpp needs a GGUF file ({} is a directory)",
            l.path.display()
        );
    }
    hayai_model::ggml::GgmlGemma3::open(&l.path)
        .with_context(|| format!("opening {} for llama.cpp numerics", l.path.display()))
}

/// The CPU reference for `model` in the requested weight format and matrix-product inputs (the
/// CUDA decode-kernel variants are an error here).
pub fn cpu_runner(model: Arc<Model>, args: &ModelArgs) -> Result<CpuRunner> {
    args.variant.require_default_on_cpu()?;
    if args.cpu_numerics != CpuNumerics::Reference {
        bail!("--cpu-numerics llama-cpp is not available for this command");
    }
    let inputs = match (args.quant.matmul_inputs(), args.cpu_matmul_inputs) {
        (None, c) => c.into(),
        (Some(m), CpuMatmulInputs::F32) => m,
        (Some(_), _) => bail!(
            "--quant int4-a8 fixes the matrix products' inputs (int8 per 128 columns); drop --cpu-matmul-inputs"
        ),
    };
    let model = match args.quant {
        Quant::Native => model,
        // The GPU's bf16 twin: with the head's exact int8 blocks where `--lm-head` takes them
        // (`auto`: where the file stores them), as the CUDA backend decides.
        Quant::Bf16 => {
            let head = args
                .variant
                .lm_head()
                .int8_blocks(hayai_cuda::Quant::Bf16, model.weights.lm_head())?;
            Arc::new(match head {
                Some(h) => hayai_cuda::quant::round_model_bf16_int8_head(&model, &h),
                None => crate::setup::round_model_bf16(&model),
            })
        }
        Quant::Int4 | Quant::Int4A8 => {
            if args.variant.lm_head == LmHeadArg::Int8 {
                bail!("--lm-head int8 is for --quant bf16");
            }
            Arc::new(crate::setup::quantize_model_int4(&model))
        }
    };
    let mut r = CpuRunner::new(model)?;
    r.set_matmul_inputs(inputs);
    Ok(r)
}

// ---------------------------------------------------------------------------------------------

#[derive(Args)]
pub struct FetchArgs {
    /// Re-hash a cached file.
    #[arg(long)]
    verify: bool,
}

pub fn fetch_model(a: FetchArgs) -> Result<ExitCode> {
    let p = fetch::ensure_default_model(a.verify)?;
    println!("{}", p.display());
    Ok(ExitCode::SUCCESS)
}

#[derive(Args)]
pub struct InfoArgs {
    #[arg(long)]
    json: bool,
}

pub fn info(a: InfoArgs) -> Result<ExitCode> {
    let v = crate::setup::build_info();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        for (k, val) in v.as_object().unwrap() {
            println!("{k}: {val}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Args)]
pub struct InspectArgs {
    #[arg(long, env = "HAYAI_MODEL")]
    model: Option<String>,
    /// Also list every tensor.
    #[arg(long)]
    tensors: bool,
}

pub fn inspect(a: InspectArgs) -> Result<ExitCode> {
    let path = fetch::resolve_model(a.model.as_deref())?;
    if path.is_file() {
        let g = hayai_core::GgufFile::open(&path)?;
        println!("GGUF v{} {}", g.version(), path.display());
        for (k, v) in g.metadata() {
            let s = format!("{v:?}");
            let s = if s.len() > 120 {
                format!("{}… ({} chars)", &s[..120], s.len())
            } else {
                s
            };
            println!("  {k} = {s}");
        }
        println!("  {} tensors", g.tensors().len());
        if a.tensors {
            for t in g.tensors() {
                println!("  {} {:?} {:?}", t.name, t.ggml_type, t.shape());
            }
        }
    }
    let m = load_model(&path)?;
    let s = &m.spec;
    println!(
        "model: {} hidden {} layers {} vocab {} window {} max_context {}",
        s.arch.name(),
        s.hidden,
        s.n_layers(),
        s.vocab,
        s.sliding_window,
        s.max_context
    );
    for (i, l) in s.layers.iter().enumerate() {
        println!(
            "  layer {i:2}: {} head_dim {} heads {}/{} ff {} rope θ={} pairs {} kv_source {}",
            if l.sliding { "sliding" } else { "full   " },
            l.head_dim,
            l.n_heads,
            l.n_kv_heads,
            l.intermediate,
            l.rope.theta,
            l.rope.rotary_pairs,
            l.kv_source
        );
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Args)]
pub struct TokenizeArgs {
    #[arg(long, env = "HAYAI_MODEL")]
    model: Option<String>,
    /// Do not prepend BOS.
    #[arg(long)]
    no_bos: bool,
    /// Print `{"ids": [...]}`.
    #[arg(long)]
    json: bool,
}

pub fn tokenize(a: TokenizeArgs) -> Result<ExitCode> {
    let path = fetch::resolve_model(a.model.as_deref())?;
    let tok = load_tokenizer(&path)?
        .with_context(|| format!("{} has no tokenizer files", path.display()))?;
    let mut text = String::new();
    std::io::stdin()
        .read_to_string(&mut text)
        .context("reading text from stdin (must be UTF-8)")?;
    let ids = tok.encode(&text, !a.no_bos);
    if a.json {
        println!("{}", json!({ "ids": ids }));
    } else {
        for id in &ids {
            println!("{id}\t{:?}", tok.id_to_token(*id).unwrap_or("?"));
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Args)]
pub struct TokenizerCheckArgs {
    #[arg(long, env = "HAYAI_MODEL")]
    model: Option<String>,
    /// Challenge-format records (context_token_ids + target_token_ids).
    #[arg(long)]
    records: PathBuf,
    #[arg(long)]
    json: bool,
}

pub fn tokenizer_check(a: TokenizerCheckArgs) -> Result<ExitCode> {
    let path = fetch::resolve_model(a.model.as_deref())?;
    let tok = load_tokenizer(&path)?
        .with_context(|| format!("{} has no tokenizer files", path.display()))?;
    let records = hayai_bench::ppl::load_records(&a.records)
        .with_context(|| format!("reading records from {}", a.records.display()))?;
    let seqs: Vec<Vec<u32>> = records
        .iter()
        .map(|r| {
            let mut v = r.context_token_ids.clone();
            v.extend_from_slice(&r.target_token_ids);
            v
        })
        .collect();
    let rep = hayai_tokenizer::roundtrip_report(&tok, &seqs)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rep)?);
    } else {
        println!("{rep}");
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt text (tokenized with BOS; special-token strings are parsed).
    #[arg(long, conflicts_with = "prompt_ids")]
    prompt: Option<String>,
    /// Prompt as comma-separated token ids (used as is).
    #[arg(long, value_delimiter = ',')]
    prompt_ids: Option<Vec<u32>>,
    /// Wrap the prompt in the model's chat template as one user turn.
    #[arg(long)]
    chat: bool,
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    #[arg(long)]
    seed: Option<u64>,
    /// Keep going past end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// Print `{"ids": [...], "text": ...}`.
    #[arg(long)]
    json: bool,
    /// MTP assistant checkpoint (Gemma 4 drafter): greedy speculative decoding on the CPU. The
    /// output is identical to plain greedy decoding; only the speed differs.
    #[arg(long)]
    assistant: Option<PathBuf>,
    /// Draft tokens per verify pass with --assistant.
    #[arg(long, default_value_t = 4)]
    draft_len: usize,
}

/// Greedy speculative decoding with an MTP assistant on the CPU reference.
fn generate_speculative(
    l: &Loaded,
    a: &GenerateArgs,
    assistant: &std::path::Path,
    prompt: &[u32],
) -> Result<Vec<u32>> {
    use hayai_engine::speculative::{generate_greedy, CpuMtp, SpecConfig};
    if a.temperature != 0.0 {
        bail!("--assistant supports greedy decoding only (--temperature 0)");
    }
    if a.model.device == Device::Cuda {
        bail!("--assistant runs on the CPU backend only (use --device cpu)");
    }
    let asst = hayai_model::assistant::Assistant::load_hf_dir(assistant)
        .with_context(|| format!("loading the assistant {}", assistant.display()))?;
    let runner = cpu_runner(l.model.clone(), &a.model)?;
    let mut mtp = CpuMtp::new(runner, Arc::new(asst))?;
    let cfg = SpecConfig {
        draft_len: a.draft_len,
        max_tokens: a.max_tokens,
        stop_tokens: if a.ignore_eos {
            Vec::new()
        } else {
            l.model.spec.eos_token_ids.clone()
        },
    };
    let t0 = Instant::now();
    let out = generate_greedy(&mut mtp, prompt, &cfg, &mut |_| true)?;
    tracing_note(&format!(
        "speculative: {} tokens in {} verify passes ({:.2} tokens/pass, {}/{} drafts accepted), {:.2}s",
        out.tokens.len(),
        out.rounds,
        out.tokens_per_round(),
        out.accepted,
        out.drafted,
        t0.elapsed().as_secs_f64()
    ));
    Ok(out.tokens)
}

pub fn generate(a: GenerateArgs) -> Result<ExitCode> {
    let l = load(&a.model)?;
    let prompt: Vec<u32> = match (&a.prompt, &a.prompt_ids) {
        (Some(text), None) => {
            let tok = require_tokenizer(&l)?;
            if a.chat {
                let rendered = crate::setup::render_user_turn(&l, tok, text)?;
                tok.encode(&rendered, false)
            } else {
                tok.encode(text, true)
            }
        }
        (None, Some(ids)) => ids.clone(),
        _ => bail!("give exactly one of --prompt or --prompt-ids"),
    };
    if let Some(asst) = &a.assistant {
        let ids = generate_speculative(&l, &a, asst, &prompt)?;
        let text = match &l.tokenizer {
            Some(t) => Some(t.decode(&ids, false)?),
            None => None,
        };
        if a.json {
            println!("{}", json!({ "ids": ids, "text": text }));
        } else {
            println!("{}", text.unwrap_or_else(|| format!("{ids:?}")));
        }
        return Ok(ExitCode::SUCCESS);
    }
    let runner = make_runner(&l, &a.model)?;
    let mut engine = Engine::new(runner);
    let req = GenRequest {
        prompt,
        max_tokens: a.max_tokens,
        sampling: SamplingParams {
            temperature: a.temperature,
            top_k: a.top_k,
            top_p: a.top_p,
            seed: a.seed,
        },
        stop_token_ids: Vec::new(),
        ignore_eos: a.ignore_eos,
        prompt_logprobs: None,
        logprobs: None,
    };
    let t0 = Instant::now();
    let out = engine.generate(&req, &mut |_| hayai_engine::Flow::Continue)?;
    let secs = t0.elapsed().as_secs_f64();
    let text = match &l.tokenizer {
        Some(t) => Some(t.decode(&out.tokens, false)?),
        None => None,
    };
    if a.json {
        println!("{}", json!({ "ids": out.tokens, "text": text }));
    } else {
        println!("{}", text.unwrap_or_else(|| format!("{:?}", out.tokens)));
    }
    let n = out.tokens.len();
    tracing_note(&format!(
        "{n} tokens, prefill {:.3}s, decode {:.1} tok/s, total {secs:.2}s, finish {:?}",
        out.timings.prefill.as_secs_f64(),
        if n > 1 {
            (n - 1) as f64 / out.timings.decode.as_secs_f64().max(1e-9)
        } else {
            0.0
        },
        out.finish
    ));
    Ok(ExitCode::SUCCESS)
}

#[derive(Args)]
pub struct PplArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Challenge-format records (JSONL: id, context_token_ids, target_token_ids).
    #[arg(long)]
    records: PathBuf,
    /// Score against an OpenAI-compatible endpoint instead of in-process.
    #[arg(long)]
    base_url: Option<String>,
    /// Served model name (endpoint mode; default: the first one the server lists).
    #[arg(long)]
    served_model: Option<String>,
    /// Where endpoint mode writes ppl_summary.json and per-record results.
    #[arg(long)]
    output_dir: Option<PathBuf>,
    /// Score only the first N records.
    #[arg(long)]
    limit: Option<usize>,
    #[arg(long)]
    json: bool,
}

pub fn ppl(a: PplArgs) -> Result<ExitCode> {
    if let Some(url) = &a.base_url {
        return crate::remote::ppl_endpoint(
            url,
            a.served_model.clone(),
            &a.records,
            a.output_dir.clone(),
            a.limit,
            a.json,
        );
    }
    let mut records = hayai_bench::ppl::load_records(&a.records)
        .with_context(|| format!("reading PPL records from {}", a.records.display()))?;
    if let Some(n) = a.limit {
        records.truncate(n);
    }
    let l = load(&a.model)?;
    let mut runner = make_runner(&l, &a.model)?;
    let vocab = runner.info().vocab_size;
    let mut acc = hayai_bench::ppl::PplAccumulator::default();
    let t0 = Instant::now();
    let mut n_tokens = 0usize;
    for r in &records {
        let mut seq = r.context_token_ids.clone();
        seq.extend_from_slice(&r.target_token_ids);
        if let Some(&bad) = seq.iter().find(|&&t| t as usize >= vocab) {
            bail!(
                "record {}: token id {bad} is out of range (vocabulary has {vocab} entries)",
                r.id
            );
        }
        let first_target = r.context_token_ids.len();
        let mut lps = Vec::with_capacity(r.target_token_ids.len());
        runner.truncate(0);
        runner
            .forward(&seq, Rows::All, &mut |i, logits| {
                if i + 1 >= first_target && i + 1 < seq.len() {
                    lps.push(LogprobEntry::from_logits(logits, seq[i + 1], 0).logprob as f64);
                }
            })
            .with_context(|| format!("record {}", r.id))?;
        n_tokens += seq.len();
        acc.add(&r.id, &lps)?;
    }
    let s = acc.summary();
    let secs = t0.elapsed().as_secs_f64();
    if a.json {
        println!(
            "{}",
            json!({
                "ppl": s.ppl,
                "tokens": s.num_tokens,
                "records": s.num_records,
                "mean_record_ppl": s.mean_record_ppl,
                "seconds": secs,
            })
        );
    } else {
        println!(
            "ppl {:.4} over {} target tokens in {} records (mean record ppl {:.4}); {:.1}s, {:.0} tok/s",
            s.ppl,
            s.num_tokens,
            s.num_records,
            s.mean_record_ppl,
            secs,
            n_tokens as f64 / secs
        );
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Args)]
pub struct SynthArgs {
    /// Shape preset (tiny, e2b, e4b, e4b-assistant, ...).
    #[arg(long)]
    preset: String,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[arg(long)]
    out: PathBuf,
    /// Weight dtype of the written safetensors.
    #[arg(long, default_value = "bf16")]
    dtype: String,
}

pub fn synth(a: SynthArgs) -> Result<ExitCode> {
    crate::setup::synth(&a.preset, a.seed, &a.out, &a.dtype)?;
    println!("{}", a.out.display());
    Ok(ExitCode::SUCCESS)
}

#[derive(Args)]
pub struct BenchEngineArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[arg(long, default_value_t = 128)]
    prompt_len: usize,
    #[arg(long, default_value_t = 128)]
    gen: usize,
    #[arg(long)]
    json: bool,
    /// CUDA: also time every operation of the decode step on its own (its launches back to
    /// back, each layer's weights from DRAM), with and without its prologue's norms.
    #[arg(long)]
    ops: bool,
}

/// Decode-kernel variants of the CUDA backend, for A/B measurements (the defaults are the
/// measured best; docs/performance.md); every in-process command takes them.
#[derive(Args, Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuVariantArgs {
    /// Launch without programmatic dependent launch (sm_90+ only has it).
    #[arg(long)]
    pub no_pdl: bool,
    /// Persistent GEMV kernel instead of the tiled one.
    #[arg(long)]
    pub persistent_gemv: bool,
    /// Per-layer-embedding GEMV pair in one launch with a grid barrier (no int8 activations:
    /// not with --quant int4-a8).
    #[arg(long)]
    pub fuse_ple: bool,
    /// Tiled GEMV with 8 loads in flight per lane.
    #[arg(long)]
    pub gemv_unroll8: bool,
    /// The output head: int8 with an f16 scale per 32 columns, the file's own values, where the
    /// model stores it so (a GGUF's Q8_0 token_embd, as the Gemma 3 270M's) and --quant is bf16
    /// (auto); always (int8: an error where it cannot); or as the weights (quant).
    #[arg(long, value_enum, default_value = "auto")]
    pub lm_head: LmHeadArg,
    /// Decode attention pulls its first K/V tile into L2 before waiting for the previous kernel.
    #[arg(long)]
    pub attn_prefetch: bool,
    /// The whole decode step as one persistent kernel (weights streamed ahead through shared
    /// memory, grid-wide barriers between operations).
    #[arg(long)]
    pub single_kernel: bool,
    /// The decode step as the streamed step (one block per SM, the GEMV weights streamed per SM
    /// through a shared-memory ring; docs/streamed-step.md), in the format's arithmetic: int4
    /// W4A16 (x as a 23-bit fixed point per 128 columns), int4-a8 W4A8, bf16; an error where
    /// it cannot run. The default runs it wherever its measured (deepest) ring fits the GPU's
    /// shared memory and no launch-plan variant is asked for, else the launch plan.
    #[arg(long)]
    pub streamed_step: bool,
    /// The decode step as the launch plan (one kernel per operation, replayed as a CUDA graph)
    /// even where the streamed step could run.
    #[arg(long, conflicts_with = "streamed_step")]
    pub no_streamed_step: bool,
    /// Decode attention copies its K/V tile into shared memory before waiting for the QKV GEMV.
    #[arg(long)]
    pub attn_tile: bool,
    /// Decode attention with the head dim as a run-time value (the bf16 default; int4's is
    /// compiled for head dims 256 and 512, with its p.V phase by warps).
    #[arg(long, conflicts_with = "attn_hd_kernels")]
    pub attn_runtime_hd: bool,
    /// Decode attention compiled for head dims 256 and 512 (the int4 default) whatever the
    /// quantization.
    #[arg(long)]
    pub attn_hd_kernels: bool,
    /// Decode attention's p.V phase by threads, one dimension each, instead of by warps.
    #[arg(long)]
    pub no_attn_warp_values: bool,
    /// Decode attention splits only as many ways as give each split at least N keys of the
    /// current context, N = 8 or 32 (with the head-dim kernels and p.V by warps; 0: every
    /// split of the plan takes part).
    #[arg(long, default_value_t = 32, value_name = "N", value_parser = parse_min_keys)]
    pub attn_min_keys: usize,
    /// int4 GEMVs on CUDA cores (f32 activations) instead of tensor cores (bf16-pair
    /// activations, the default).
    #[arg(long)]
    pub no_tc_gemv: bool,
    /// Tensor-core GEMVs stream their weights through a cp.async ring in shared memory.
    #[arg(long)]
    pub tc_ring: bool,
    /// Small tensor-core GEMVs (up to 8 MB) split along K across blocks instead of with their
    /// 16-row tiles shared by up to 8 warps along K inside a block (the default).
    #[arg(long)]
    pub no_tc_kwarps: bool,
    /// Every decode kernel pulls the weights of the N-th GEMV after it into L2 (0: off).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub l2_prefetch: usize,
    /// Every decode GEMV pulls its own weights into L2 before waiting for the previous kernel.
    #[arg(long)]
    pub l2_prefetch_own: bool,
    /// Size the decode plan for N tokens of context (as a server is, 8,192 by default) instead
    /// of the benchmark's prompt + generation: the attention's split count follows it.
    #[arg(long, value_name = "N")]
    pub max_context: Option<usize>,
    /// Every decode attention pulls the weights of the N-th GEMV after it into L2 (0: off;
    /// 2: gate/up).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub l2_prefetch_attn: usize,
}

/// `--attn-min-keys`: the values with a compiled kernel.
fn parse_min_keys(v: &str) -> Result<usize, String> {
    match v.parse::<usize>() {
        Ok(n @ (0 | 8 | 32)) => Ok(n),
        _ => Err(format!("`{v}`: expected 0, 8 or 32")),
    }
}

impl GpuVariantArgs {
    /// The variants as parsed from no flags (clap's defaults: `Default` would give 0 where a
    /// flag's default value is not).
    pub fn defaults() -> GpuVariantArgs {
        #[derive(clap::Parser)]
        struct Only {
            #[command(flatten)]
            v: GpuVariantArgs,
        }
        <Only as clap::Parser>::parse_from(["hayai"]).v
    }

    /// The output head these arguments ask for.
    pub fn lm_head(&self) -> hayai_cuda::LmHead {
        match self.lm_head {
            LmHeadArg::Auto => hayai_cuda::LmHead::Auto,
            LmHeadArg::Int8 => hayai_cuda::LmHead::Int8,
            LmHeadArg::Quant => hayai_cuda::LmHead::Quant,
        }
    }

    /// The variants select CUDA kernels: on the CPU backend anything but the defaults is an error
    /// (`--lm-head` is the model's arithmetic, which the CPU reference takes too: `cpu_runner`).
    pub fn require_default_on_cpu(&self) -> Result<()> {
        let d = GpuVariantArgs::defaults();
        if (GpuVariantArgs {
            lm_head: d.lm_head,
            ..*self
        }) != d
        {
            bail!(
                "decode-kernel variants (--streamed-step, --no-pdl, --persistent-gemv, --no-tc-gemv, ...) apply to the CUDA backend only (use --device cuda on a machine with a GPU)"
            );
        }
        Ok(())
    }

    /// `o` with these variants switched on (or PDL off).
    pub fn apply(&self, o: hayai_cuda::CudaOptions) -> hayai_cuda::CudaOptions {
        hayai_cuda::CudaOptions {
            pdl: !self.no_pdl,
            persistent_gemv: self.persistent_gemv,
            fuse_ple: self.fuse_ple,
            gemv_unroll8: self.gemv_unroll8,
            lm_head: self.lm_head(),
            attn_prefetch: self.attn_prefetch,
            single_kernel: self.single_kernel,
            streamed_step: if self.streamed_step {
                hayai_cuda::StreamedStep::On
            } else if self.no_streamed_step {
                hayai_cuda::StreamedStep::Off
            } else {
                hayai_cuda::StreamedStep::Auto
            },
            attn_smem_tile: self.attn_tile,
            attn_by_head_dim: if self.attn_runtime_hd {
                Some(false)
            } else if self.attn_hd_kernels {
                Some(true)
            } else {
                None
            },
            attn_warp_values: !self.no_attn_warp_values,
            attn_min_keys: self.attn_min_keys,
            tensor_core_gemv: !self.no_tc_gemv,
            tensor_core_ring: self.tc_ring,
            tensor_core_kwarps: !self.no_tc_kwarps,
            l2_prefetch: self.l2_prefetch,
            l2_prefetch_own: self.l2_prefetch_own,
            l2_prefetch_attn: self.l2_prefetch_attn,
            max_context: self.max_context.or(o.max_context),
            ..o
        }
    }

    /// These variants as command-line arguments (the non-default ones), so a child process
    /// (`hayai demo`'s server) runs the kernels this one was asked for.
    pub fn to_args(self) -> Vec<String> {
        let d = GpuVariantArgs::defaults();
        let mut v: Vec<String> = Vec::new();
        for (on, name) in [
            (self.no_pdl, "--no-pdl"),
            (self.persistent_gemv, "--persistent-gemv"),
            (self.fuse_ple, "--fuse-ple"),
            (self.gemv_unroll8, "--gemv-unroll8"),
            (self.attn_prefetch, "--attn-prefetch"),
            (self.single_kernel, "--single-kernel"),
            (self.streamed_step, "--streamed-step"),
            (self.no_streamed_step, "--no-streamed-step"),
            (self.attn_tile, "--attn-tile"),
            (self.attn_runtime_hd, "--attn-runtime-hd"),
            (self.attn_hd_kernels, "--attn-hd-kernels"),
            (self.no_attn_warp_values, "--no-attn-warp-values"),
            (self.no_tc_gemv, "--no-tc-gemv"),
            (self.tc_ring, "--tc-ring"),
            (self.no_tc_kwarps, "--no-tc-kwarps"),
            (self.l2_prefetch_own, "--l2-prefetch-own"),
        ] {
            if on {
                v.push(name.into());
            }
        }
        for (n, dn, name) in [
            (self.attn_min_keys, d.attn_min_keys, "--attn-min-keys"),
            (self.l2_prefetch, d.l2_prefetch, "--l2-prefetch"),
            (
                self.l2_prefetch_attn,
                d.l2_prefetch_attn,
                "--l2-prefetch-attn",
            ),
        ] {
            if n != dn {
                v.extend([name.to_string(), n.to_string()]);
            }
        }
        if self.lm_head != d.lm_head {
            let name = self.lm_head.to_possible_value().expect("a named value");
            v.extend(["--lm-head".to_string(), name.get_name().to_string()]);
        }
        if let Some(n) = self.max_context {
            v.extend(["--max-context".to_string(), n.to_string()]);
        }
        v
    }
}

impl ModelArgs {
    /// The options that decide how the model runs, as arguments for a child `hayai serve` (the
    /// model, device and quantization are the caller's to pass): the prefill, the CPU
    /// backend's numerics and the decode-kernel variants, where not the defaults.
    pub fn run_args(&self) -> Vec<String> {
        let mut v = Vec::new();
        let name = |p: Option<clap::builder::PossibleValue>| {
            p.map(|p| p.get_name().to_string()).unwrap_or_default()
        };
        if self.prefill != Prefill::Batched {
            v.extend(["--prefill".into(), name(self.prefill.to_possible_value())]);
        }
        if self.cpu_matmul_inputs != CpuMatmulInputs::F32 {
            v.extend([
                "--cpu-matmul-inputs".into(),
                name(self.cpu_matmul_inputs.to_possible_value()),
            ]);
        }
        if self.cpu_numerics != CpuNumerics::Reference {
            v.extend([
                "--cpu-numerics".into(),
                name(self.cpu_numerics.to_possible_value()),
            ]);
        }
        v.extend(self.variant.to_args());
        v
    }
}

pub fn bench_engine(a: BenchEngineArgs) -> Result<ExitCode> {
    crate::setup::bench_engine(&a.model, a.prompt_len, a.gen, a.json, a.ops)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    #[derive(Parser)]
    struct Only {
        #[command(flatten)]
        m: ModelArgs,
    }

    /// Every option of `ModelArgs` but the model, device, quantization and tokenizer (the
    /// caller's), each set away from its default, survives `run_args` and a second parse:
    /// an option added later without a line in `to_args` / `run_args` fails here.
    #[test]
    fn run_args_carry_every_option_to_a_child() {
        let caller = ["model", "device", "quant", "tokenizer", "help"];
        let defaults = Only::parse_from(["hayai"]).m.run_args();
        assert!(
            defaults.is_empty(),
            "defaults forward nothing: {defaults:?}"
        );
        let mut seen = 0;
        for arg in Only::command().get_arguments() {
            let id = arg.get_id().as_str();
            if caller.contains(&id) {
                continue;
            }
            let long = format!("--{}", arg.get_long().expect("a long name"));
            let mut argv = vec!["hayai".to_string(), long.clone()];
            if arg.get_action().takes_values() {
                // A value other than the default that the option accepts.
                let pv = arg.get_possible_values();
                let dv: Vec<String> = arg
                    .get_default_values()
                    .iter()
                    .map(|d| d.to_string_lossy().into_owned())
                    .collect();
                let val = if pv.is_empty() {
                    "8".to_string()
                } else {
                    pv.iter()
                        .map(|p| p.get_name().to_string())
                        .find(|n| !dv.contains(n))
                        .expect("a non-default value")
                };
                argv.push(val);
            }
            let m = Only::try_parse_from(&argv)
                .unwrap_or_else(|e| panic!("{argv:?}: {e}"))
                .m;
            let fwd = m.run_args();
            assert!(!fwd.is_empty(), "{long} is not forwarded");
            let back =
                Only::try_parse_from(std::iter::once("hayai".to_string()).chain(fwd.clone()))
                    .unwrap_or_else(|e| panic!("{fwd:?}: {e}"))
                    .m;
            assert_eq!(back.variant, m.variant, "{long}: {fwd:?}");
            assert_eq!(back.prefill, m.prefill, "{long}");
            assert_eq!(back.cpu_matmul_inputs, m.cpu_matmul_inputs, "{long}");
            assert_eq!(back.cpu_numerics, m.cpu_numerics, "{long}");
            seen += 1;
        }
        assert!(seen >= 20, "only {seen} options checked");
    }
}
