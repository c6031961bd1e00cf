//! Throughput benchmark with SGLang `bench_serving` semantics (HARNESS.md §1).
//!
//! * Prompts: a ShareGPT file (seed-shuffled, first `num_prompts`) or seeded random-word prompts.
//! * Warm-up: `warmup_requests` requests of 32 output tokens released *at the same time* (a barrier),
//!   untimed; any warm-up failure aborts before timing starts.
//! * Timed run: `max_concurrency` worker threads pull prompts in order, request rate unlimited.
//!   Each request: `max_tokens = output_len`, `temperature` (default 0.0), `ignore_eos`.
//! * Duration: first request sent → last response received. TPS = Σ usage.completion_tokens ÷ duration.
//! * A request that fails at the HTTP level is counted in `failed` and logged; a 2xx response without
//!   `usage.completion_tokens`/`usage.prompt_tokens` breaks the contract and aborts the run.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::dataset::{self, DatasetSpec, Prompt};
use crate::error::{Error, Result};
use crate::http::Client;
use crate::stats::Distribution;
use crate::util;

/// Which OpenAI endpoint the benchmark drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Endpoint {
    /// `POST /v1/chat/completions`, the prompt as one user message (server-side chat template).
    Chat,
    /// `POST /v1/completions`, the prompt text sent raw.
    Completions,
}

impl Endpoint {
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Chat => "/v1/chat/completions",
            Endpoint::Completions => "/v1/completions",
        }
    }
}

/// Options of [`run_bench`]. `Default` gives the challenge rig except the dataset path.
#[derive(Debug, Clone, Serialize)]
pub struct BenchOptions {
    pub base_url: String,
    /// Served model name; `None` → first id of `GET /v1/models`.
    pub model: Option<String>,
    pub dataset: DatasetSpec,
    /// Prompts to send (all of the file when it has fewer).
    pub num_prompts: usize,
    /// Shuffle the file with `seed` before taking `num_prompts` (CPython `random.shuffle` order).
    pub shuffle: bool,
    pub output_len: u32,
    pub max_concurrency: usize,
    /// Concurrent, untimed warm-up requests (0 disables).
    pub warmup_requests: usize,
    pub warmup_output_len: u32,
    pub seed: u64,
    pub ignore_eos: bool,
    pub temperature: f32,
    pub stream: bool,
    pub endpoint: Endpoint,
    /// When set, [`run_bench`] writes `summary.json` and `benchmark.jsonl` here.
    pub output_dir: Option<PathBuf>,
    pub show_progress: bool,
    /// Per-request timeout; `None` waits forever.
    pub request_timeout: Option<Duration>,
    /// Poll `GET /v1/models` for up to this long before starting (`None`: no polling).
    pub wait_ready: Option<Duration>,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            base_url: "http://127.0.0.1:8000".into(),
            model: None,
            dataset: DatasetSpec::ShareGpt(PathBuf::from("eval_prompts_sharegpt.json")),
            num_prompts: 128,
            shuffle: true,
            output_len: 512,
            max_concurrency: 1,
            warmup_requests: 4,
            warmup_output_len: 32,
            seed: 1,
            ignore_eos: true,
            temperature: 0.0,
            stream: false,
            endpoint: Endpoint::Chat,
            output_dir: None,
            show_progress: true,
            request_timeout: Some(Duration::from_secs(3600)),
            wait_ready: Some(crate::http::DEFAULT_WAIT_READY),
        }
    }
}

/// One timed request, a line of `benchmark.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// Position in the send order.
    pub index: usize,
    /// Prompt id from the dataset.
    pub id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completion_tokens: Option<u64>,
    /// Milliseconds from the benchmark start to this request being sent.
    pub start_ms: f64,
    /// End-to-end latency (also set for failed requests: time until the failure).
    pub latency_ms: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttft_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub itl_ms: Option<Vec<f64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tpot_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `summary.json`. Field names follow SGLang's bench_serving where one exists (`output_throughput`,
/// `mean_e2e_latency_ms`, ...) plus the harness aliases (`tps`, `output_tps`, `total_tps`, ...).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchSummary {
    /// The score: output tokens per second (= `output_throughput`).
    pub tps: f64,
    pub output_tps: f64,
    pub output_throughput: f64,
    pub input_throughput: f64,
    /// (input + output tokens) / duration.
    pub total_tps: f64,
    pub completed: usize,
    pub failed: usize,
    /// Completed requests that returned fewer than `output_len` tokens (a server ignoring
    /// `ignore_eos` shows up here).
    pub short_outputs: usize,
    pub duration_s: f64,
    pub request_throughput_req_s: f64,
    pub total_input_tokens: u64,
    pub total_output_tokens: u64,
    pub mean_e2e_latency_ms: Option<f64>,
    pub median_e2e_latency_ms: Option<f64>,
    pub p90_e2e_latency_ms: Option<f64>,
    pub p99_e2e_latency_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_ms: Option<Distribution>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub itl_ms: Option<Distribution>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tpot_ms: Option<Distribution>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_ttft_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub median_ttft_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p99_ttft_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_itl_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub median_itl_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p99_itl_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_tpot_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub median_tpot_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p99_tpot_ms: Option<f64>,
    /// Run metadata.
    pub base_url: String,
    pub model: String,
    pub endpoint: Endpoint,
    pub dataset: String,
    pub num_prompts: usize,
    pub output_len: u32,
    pub max_concurrency: usize,
    pub warmup_requests: usize,
    pub seed: u64,
    pub ignore_eos: bool,
    pub temperature: f32,
    pub stream: bool,
    /// RFC 3339 UTC time the timed run started.
    pub timestamp: String,
    pub unix_time: f64,
}

/// What [`run_bench`] returns.
#[derive(Debug, Clone)]
pub struct BenchResult {
    pub summary: BenchSummary,
    pub requests: Vec<RequestRecord>,
}

impl BenchResult {
    /// Number of failed requests (a non-zero value should fail the command).
    pub fn failed(&self) -> usize {
        self.summary.failed
    }

    /// Write `summary.json` and `benchmark.jsonl` into `dir`.
    pub fn write(&self, dir: &Path) -> Result<()> {
        util::write_json(&dir.join("summary.json"), &self.summary)?;
        util::write_jsonl(&dir.join("benchmark.jsonl"), &self.requests)
    }

    /// Human-readable report (SGLang-style table).
    pub fn render(&self) -> String {
        let s = &self.summary;
        let mut o = String::new();
        let mut line = |k: &str, v: String| o.push_str(&format!("{k:<40}{v:>16}\n"));
        line("Backend / model:", s.model.clone());
        line("Endpoint:", format!("{:?}", s.endpoint));
        line("Dataset:", s.dataset.clone());
        line("Successful requests:", s.completed.to_string());
        line("Failed requests:", s.failed.to_string());
        line("Benchmark duration (s):", format!("{:.2}", s.duration_s));
        line("Total input tokens:", s.total_input_tokens.to_string());
        line("Total generated tokens:", s.total_output_tokens.to_string());
        line(
            "Request throughput (req/s):",
            format!("{:.3}", s.request_throughput_req_s),
        );
        line(
            "Output token throughput (tok/s) [TPS]:",
            format!("{:.2}", s.output_throughput),
        );
        line(
            "Total token throughput (tok/s):",
            format!("{:.2}", s.total_tps),
        );
        let f = |x: Option<f64>| x.map_or("n/a".to_string(), |v| format!("{v:.2}"));
        line("Mean E2E latency (ms):", f(s.mean_e2e_latency_ms));
        line("Median E2E latency (ms):", f(s.median_e2e_latency_ms));
        line("P99 E2E latency (ms):", f(s.p99_e2e_latency_ms));
        if s.stream {
            line("Mean TTFT (ms):", f(s.mean_ttft_ms));
            line("Median TTFT (ms):", f(s.median_ttft_ms));
            line("P99 TTFT (ms):", f(s.p99_ttft_ms));
            line("Mean ITL (ms):", f(s.mean_itl_ms));
            line("Median ITL (ms):", f(s.median_itl_ms));
            line("P99 ITL (ms):", f(s.p99_itl_ms));
            line("Mean TPOT (ms):", f(s.mean_tpot_ms));
            line("Median TPOT (ms):", f(s.median_tpot_ms));
            line("P99 TPOT (ms):", f(s.p99_tpot_ms));
        }
        if s.short_outputs > 0 {
            line("Requests short of output_len:", s.short_outputs.to_string());
        }
        for r in self.requests.iter().filter(|r| r.error.is_some()).take(5) {
            o.push_str(&format!(
                "failed request {} ({}): {}\n",
                r.index,
                r.id,
                r.error.as_deref().unwrap_or("")
            ));
        }
        o
    }

    /// Print [`Self::render`] to stdout.
    pub fn print(&self) {
        print!("{}", self.render());
    }
}

/// Outcome of one request, before it is turned into a record.
struct Outcome {
    prompt_tokens: u64,
    completion_tokens: u64,
    ttft: Option<Duration>,
    itl: Vec<Duration>,
    finish_reason: Option<String>,
}

/// Failure classes: `Request` failures are counted, `Contract` failures abort the run.
enum ReqError {
    Request(String),
    Contract(String),
}

impl From<Error> for ReqError {
    fn from(e: Error) -> Self {
        match e {
            Error::Protocol(m) => ReqError::Contract(m),
            other => ReqError::Request(other.to_string()),
        }
    }
}

fn request_body(
    model: &str,
    endpoint: Endpoint,
    prompt: &str,
    max_tokens: u32,
    opts: &BenchOptions,
    stream: bool,
) -> Value {
    let mut body = json!({
        "model": model,
        "max_tokens": max_tokens,
        "temperature": opts.temperature,
        "ignore_eos": opts.ignore_eos,
        "stream": stream,
    });
    match endpoint {
        Endpoint::Chat => body["messages"] = json!([{"role": "user", "content": prompt}]),
        Endpoint::Completions => body["prompt"] = json!(prompt),
    }
    if stream {
        // Token counts must come from `usage`, which OpenAI-style servers only put in the final
        // stream chunk when asked.
        body["stream_options"] = json!({"include_usage": true});
    }
    body
}

fn usage_counts(v: &Value, what: &str) -> std::result::Result<(u64, u64), ReqError> {
    let usage = v
        .get("usage")
        .filter(|u| !u.is_null())
        .ok_or_else(|| ReqError::Contract(format!("{what}: response has no `usage` object")))?;
    let get = |k: &str| {
        usage.get(k).and_then(Value::as_u64).ok_or_else(|| {
            ReqError::Contract(format!(
                "{what}: response has no integer `usage.{k}`: {usage}"
            ))
        })
    };
    Ok((get("prompt_tokens")?, get("completion_tokens")?))
}

fn send_one(
    client: &Client,
    model: &str,
    prompt: &Prompt,
    max_tokens: u32,
    opts: &BenchOptions,
    stream: bool,
    start: Instant,
) -> std::result::Result<Outcome, ReqError> {
    let what = format!("prompt {}", prompt.id);
    let body = request_body(model, opts.endpoint, &prompt.text, max_tokens, opts, stream);
    if !stream {
        let v = client.post_json(opts.endpoint.path(), &body)?;
        let (prompt_tokens, completion_tokens) = usage_counts(&v, &what)?;
        let finish_reason = v
            .pointer("/choices/0/finish_reason")
            .and_then(Value::as_str)
            .map(str::to_string);
        return Ok(Outcome {
            prompt_tokens,
            completion_tokens,
            ttft: None,
            itl: Vec::new(),
            finish_reason,
        });
    }
    let mut first: Option<Instant> = None;
    let mut last = start;
    let mut itl = Vec::new();
    let mut usage: Option<(u64, u64)> = None;
    let mut finish_reason = None;
    let mut contract: Option<String> = None;
    let content_key = match opts.endpoint {
        Endpoint::Chat => "/choices/0/delta",
        Endpoint::Completions => "/choices/0",
    };
    client.post_stream(opts.endpoint.path(), &body, |now, ev| {
        if ev.get("usage").is_some_and(|u| !u.is_null()) {
            match usage_counts(ev, &what) {
                Ok(c) => usage = Some(c),
                Err(ReqError::Contract(m) | ReqError::Request(m)) => contract = Some(m),
            }
        }
        if let Some(fr) = ev
            .pointer("/choices/0/finish_reason")
            .and_then(Value::as_str)
        {
            finish_reason = Some(fr.to_string());
        }
        // A chunk counts as output when it carries text (content, reasoning or completion text).
        let has_text = ev.pointer(content_key).is_some_and(|c| {
            ["content", "reasoning_content", "text"].iter().any(|k| {
                c.get(*k)
                    .and_then(Value::as_str)
                    .is_some_and(|s| !s.is_empty())
            })
        });
        if has_text {
            match first {
                None => first = Some(now),
                Some(_) => itl.push(now - last),
            }
            last = now;
        }
        Ok(())
    })?;
    if let Some(m) = contract {
        return Err(ReqError::Contract(m));
    }
    let (prompt_tokens, completion_tokens) = usage.ok_or_else(|| {
        ReqError::Contract(format!(
            "{what}: stream ended without a `usage` chunk (stream_options.include_usage)"
        ))
    })?;
    Ok(Outcome {
        prompt_tokens,
        completion_tokens,
        ttft: first.map(|f| f - start),
        itl,
        finish_reason,
    })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Fire `n` warm-up requests at the same instant and wait for all of them.
fn warmup(client: &Client, model: &str, prompts: &[Prompt], opts: &BenchOptions) -> Result<()> {
    let n = opts.warmup_requests;
    if n == 0 {
        return Ok(());
    }
    let barrier = Arc::new(Barrier::new(n));
    let errors: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let barrier = barrier.clone();
                let prompt = &prompts[i % prompts.len()];
                s.spawn(move || {
                    barrier.wait();
                    let t = Instant::now();
                    send_one(
                        client,
                        model,
                        prompt,
                        opts.warmup_output_len,
                        opts,
                        opts.stream,
                        t,
                    )
                })
            })
            .collect();
        handles
            .into_iter()
            .filter_map(|h| match h.join() {
                Ok(Ok(_)) => None,
                Ok(Err(ReqError::Request(m) | ReqError::Contract(m))) => Some(m),
                Err(_) => Some("warm-up thread panicked".into()),
            })
            .collect()
    });
    if errors.is_empty() {
        Ok(())
    } else {
        Err(Error::Warmup(format!(
            "{} of {n} concurrent warm-up requests failed: {}",
            errors.len(),
            errors.join("; ")
        )))
    }
}

/// Run the benchmark against `opts.base_url`.
pub fn run_bench(opts: &BenchOptions) -> Result<BenchResult> {
    if opts.max_concurrency == 0 {
        return Err(Error::Options("max_concurrency must be at least 1".into()));
    }
    if opts.output_len == 0 {
        return Err(Error::Options("output_len must be at least 1".into()));
    }
    let (prompts, client, model) = connect(opts)?;
    run_bench_on(&client, &model, &prompts, opts, &opts.dataset.describe())
}

/// The prompts `opts` names, a client of its server, and the model to ask for.
fn connect(opts: &BenchOptions) -> Result<(Vec<Prompt>, Client, String)> {
    let prompts = dataset::load(&opts.dataset, opts.num_prompts, opts.seed, opts.shuffle)?;
    let client = Client::new(&opts.base_url, opts.request_timeout)?;
    let model = client.prepare(opts.model.as_deref(), opts.wait_ready)?;
    Ok((prompts, client, model))
}

/// Only the warm-up requests `run_bench` would send first (`opts.warmup_requests` of
/// `opts.warmup_output_len` tokens, concurrently): for a caller that wants to look at the server
/// between them and a `run_bench` with `warmup_requests: 0`.
pub fn run_warmup(opts: &BenchOptions) -> Result<()> {
    let (prompts, client, model) = connect(opts)?;
    if prompts.is_empty() {
        return Err(Error::Options("empty prompt set".into()));
    }
    warmup(&client, &model, &prompts, opts)
}

/// Run the benchmark on an already loaded prompt list (`opts.dataset` is ignored; `dataset_label`
/// is recorded instead). Used by verify for derived prompt sets.
pub fn run_bench_with_prompts(
    opts: &BenchOptions,
    prompts: &[Prompt],
    dataset_label: &str,
) -> Result<BenchResult> {
    if prompts.is_empty() {
        return Err(Error::Options("empty prompt set".into()));
    }
    let client = Client::new(&opts.base_url, opts.request_timeout)?;
    let model = client.prepare(opts.model.as_deref(), opts.wait_ready)?;
    run_bench_on(&client, &model, prompts, opts, dataset_label)
}

fn run_bench_on(
    client: &Client,
    model: &str,
    prompts: &[Prompt],
    opts: &BenchOptions,
    dataset_label: &str,
) -> Result<BenchResult> {
    if opts.max_concurrency == 0 {
        return Err(Error::Options("max_concurrency must be at least 1".into()));
    }
    warmup(client, model, prompts, opts)?;

    let (timestamp, unix_time) = util::now_stamp();
    let pb = util::progress_bar(prompts.len() as u64, opts.show_progress, "bench");
    let next = AtomicUsize::new(0);
    let abort = AtomicBool::new(false);
    let contract_error: Mutex<Option<String>> = Mutex::new(None);
    let slots: Mutex<Vec<Option<(RequestRecord, Instant)>>> = Mutex::new(vec![None; prompts.len()]);
    let bench_start = Instant::now();
    let workers = opts.max_concurrency.min(prompts.len());
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                if abort.load(Ordering::Relaxed) {
                    return;
                }
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= prompts.len() {
                    return;
                }
                let prompt = &prompts[i];
                let sent = Instant::now();
                let res = send_one(
                    client,
                    model,
                    prompt,
                    opts.output_len,
                    opts,
                    opts.stream,
                    sent,
                );
                let done = Instant::now();
                let mut rec = RequestRecord {
                    index: i,
                    id: prompt.id.clone(),
                    prompt_tokens: None,
                    completion_tokens: None,
                    start_ms: ms(sent - bench_start),
                    latency_ms: ms(done - sent),
                    ttft_ms: None,
                    itl_ms: None,
                    tpot_ms: None,
                    finish_reason: None,
                    error: None,
                };
                match res {
                    Ok(o) => {
                        rec.prompt_tokens = Some(o.prompt_tokens);
                        rec.completion_tokens = Some(o.completion_tokens);
                        rec.finish_reason = o.finish_reason;
                        if opts.stream {
                            rec.ttft_ms = o.ttft.map(ms);
                            rec.itl_ms = Some(o.itl.iter().copied().map(ms).collect());
                            if let Some(ttft) = o.ttft {
                                if o.completion_tokens > 1 {
                                    rec.tpot_ms = Some(
                                        ms((done - sent).saturating_sub(ttft))
                                            / (o.completion_tokens - 1) as f64,
                                    );
                                }
                            }
                        }
                    }
                    Err(ReqError::Request(m)) => rec.error = Some(m),
                    Err(ReqError::Contract(m)) => {
                        abort.store(true, Ordering::Relaxed);
                        let mut ce = contract_error.lock().unwrap_or_else(|p| p.into_inner());
                        ce.get_or_insert(m);
                        return;
                    }
                }
                slots.lock().unwrap_or_else(|p| p.into_inner())[i] = Some((rec, done));
                pb.inc(1);
            });
        }
    });
    pb.finish_and_clear();
    if let Some(m) = contract_error
        .into_inner()
        .unwrap_or_else(|p| p.into_inner())
    {
        return Err(Error::Protocol(m));
    }
    let slots = slots.into_inner().unwrap_or_else(|p| p.into_inner());
    let mut requests = Vec::with_capacity(slots.len());
    let mut last_done = bench_start;
    for (i, slot) in slots.into_iter().enumerate() {
        let (rec, done) = slot
            .ok_or_else(|| Error::Protocol(format!("internal: request {i} produced no record")))?;
        last_done = last_done.max(done);
        requests.push(rec);
    }
    // The first request is sent right after `bench_start`; measure from the earliest send.
    let first_sent_ms = requests
        .iter()
        .map(|r| r.start_ms)
        .fold(f64::INFINITY, f64::min);
    let duration_s = (ms(last_done - bench_start) - first_sent_ms).max(1e-9) / 1e3;
    let summary = summarize(
        &requests,
        duration_s,
        model,
        client.base_url(),
        opts,
        dataset_label,
        timestamp,
        unix_time,
    );
    let result = BenchResult { summary, requests };
    if let Some(dir) = &opts.output_dir {
        result.write(dir)?;
    }
    Ok(result)
}

/// Aggregate request records into a summary (pure; exposed for tests and re-scoring logs).
#[allow(clippy::too_many_arguments)]
pub fn summarize(
    requests: &[RequestRecord],
    duration_s: f64,
    model: &str,
    base_url: &str,
    opts: &BenchOptions,
    dataset: &str,
    timestamp: String,
    unix_time: f64,
) -> BenchSummary {
    let ok: Vec<&RequestRecord> = requests.iter().filter(|r| r.error.is_none()).collect();
    let completed = ok.len();
    let failed = requests.len() - completed;
    let total_in: u64 = ok.iter().filter_map(|r| r.prompt_tokens).sum();
    let total_out: u64 = ok.iter().filter_map(|r| r.completion_tokens).sum();
    let short_outputs = ok
        .iter()
        .filter(|r| r.completion_tokens.unwrap_or(0) < u64::from(opts.output_len))
        .count();
    let lat: Vec<f64> = ok.iter().map(|r| r.latency_ms).collect();
    let e2e = Distribution::of(&lat);
    let out_tps = total_out as f64 / duration_s;
    let (ttft, itl, tpot) = if opts.stream {
        let t: Vec<f64> = ok.iter().filter_map(|r| r.ttft_ms).collect();
        let i: Vec<f64> = ok
            .iter()
            .filter_map(|r| r.itl_ms.as_ref())
            .flatten()
            .copied()
            .collect();
        let p: Vec<f64> = ok.iter().filter_map(|r| r.tpot_ms).collect();
        (
            Some(Distribution::of(&t)),
            Some(Distribution::of(&i)),
            Some(Distribution::of(&p)),
        )
    } else {
        (None, None, None)
    };
    BenchSummary {
        tps: out_tps,
        output_tps: out_tps,
        output_throughput: out_tps,
        input_throughput: total_in as f64 / duration_s,
        total_tps: (total_in + total_out) as f64 / duration_s,
        completed,
        failed,
        short_outputs,
        duration_s,
        request_throughput_req_s: completed as f64 / duration_s,
        total_input_tokens: total_in,
        total_output_tokens: total_out,
        mean_e2e_latency_ms: e2e.mean,
        median_e2e_latency_ms: e2e.median,
        p90_e2e_latency_ms: e2e.p90,
        p99_e2e_latency_ms: e2e.p99,
        mean_ttft_ms: ttft.and_then(|d| d.mean),
        median_ttft_ms: ttft.and_then(|d| d.median),
        p99_ttft_ms: ttft.and_then(|d| d.p99),
        mean_itl_ms: itl.and_then(|d| d.mean),
        median_itl_ms: itl.and_then(|d| d.median),
        p99_itl_ms: itl.and_then(|d| d.p99),
        mean_tpot_ms: tpot.and_then(|d| d.mean),
        median_tpot_ms: tpot.and_then(|d| d.median),
        p99_tpot_ms: tpot.and_then(|d| d.p99),
        ttft_ms: ttft,
        itl_ms: itl,
        tpot_ms: tpot,
        base_url: base_url.to_string(),
        model: model.to_string(),
        endpoint: opts.endpoint,
        dataset: dataset.to_string(),
        num_prompts: requests.len(),
        output_len: opts.output_len,
        max_concurrency: opts.max_concurrency,
        warmup_requests: opts.warmup_requests,
        seed: opts.seed,
        ignore_eos: opts.ignore_eos,
        temperature: opts.temperature,
        stream: opts.stream,
        timestamp,
        unix_time,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_bodies() {
        let o = BenchOptions::default();
        let chat = request_body("m", Endpoint::Chat, "hi", 512, &o, false);
        assert_eq!(
            chat,
            json!({"model": "m", "max_tokens": 512, "temperature": 0.0, "ignore_eos": true,
                   "stream": false, "messages": [{"role": "user", "content": "hi"}]})
        );
        let comp = request_body("m", Endpoint::Completions, "hi", 8, &o, true);
        assert_eq!(comp["prompt"], "hi");
        assert_eq!(comp["stream_options"]["include_usage"], true);
        assert!(comp.get("messages").is_none());
    }

    #[test]
    fn options_serialise_for_run_metadata() {
        let v = serde_json::to_value(BenchOptions::default()).unwrap();
        assert_eq!(v["num_prompts"], 128);
        assert_eq!(v["output_len"], 512);
        assert_eq!(v["endpoint"], "chat");
    }

    #[test]
    fn summary_math_is_pure() {
        let rec = |i: usize, p: u64, c: u64, lat: f64, err: bool| RequestRecord {
            index: i,
            id: format!("r{i}"),
            prompt_tokens: (!err).then_some(p),
            completion_tokens: (!err).then_some(c),
            start_ms: 0.0,
            latency_ms: lat,
            ttft_ms: None,
            itl_ms: None,
            tpot_ms: None,
            finish_reason: None,
            error: err.then(|| "boom".to_string()),
        };
        let o = BenchOptions {
            output_len: 10,
            ..BenchOptions::default()
        };
        let reqs = [
            rec(0, 5, 10, 100.0, false),
            rec(1, 7, 10, 300.0, false),
            rec(2, 9, 4, 200.0, false),
            rec(3, 1, 1, 50.0, true),
        ];
        let s = summarize(&reqs, 2.0, "m", "u", &o, "d", "t".into(), 0.0);
        assert_eq!((s.completed, s.failed, s.short_outputs), (3, 1, 1));
        assert_eq!((s.total_input_tokens, s.total_output_tokens), (21, 24));
        assert_eq!(s.tps, 12.0);
        assert_eq!(s.total_tps, 22.5);
        assert_eq!(s.request_throughput_req_s, 1.5);
        assert_eq!(s.mean_e2e_latency_ms, Some(200.0));
        assert_eq!(s.median_e2e_latency_ms, Some(200.0));
        assert!((s.p99_e2e_latency_ms.unwrap() - 298.0).abs() < 1e-9);
        assert!(s.mean_ttft_ms.is_none() && s.ttft_ms.is_none());
    }
}
