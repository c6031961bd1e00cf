//! Greedy-identity capture (HARNESS.md §3.1).
//!
//! Prompts come from a ShareGPT file, shuffled with `seed` exactly like CPython's
//! `random.seed(seed); random.shuffle(prompts)` (see [`crate::rng`]), first `num_prompts` kept. The
//! chat template is applied client-side by a caller-supplied encoder (`prompt text → token ids`), so
//! the server sees exactly the ids we hash: `POST /v1/completions` with integer ids, `temperature=0`,
//! `ignore_eos`, `add_special_tokens=false`, `return_token_ids`; the generated ids are read from
//! `choices[0].token_ids`.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::dataset;
use crate::error::{Error, Result};
use crate::http::Client;
use crate::util;

/// Turns one user message into prompt token ids with the chat template applied (and the model-turn
/// header appended). The CLI builds it from `hayai-tokenizer`.
pub type PromptEncoder<'a> = &'a dyn Fn(&str) -> anyhow::Result<Vec<u32>>;

/// Options of [`run_capture`].
#[derive(Debug, Clone, Serialize)]
pub struct CaptureOptions {
    pub base_url: String,
    /// `None` → first id of `GET /v1/models`.
    pub model: Option<String>,
    /// ShareGPT prompt file.
    pub prompts: PathBuf,
    /// `None` → every prompt of the file.
    pub num_prompts: Option<usize>,
    pub max_tokens: u32,
    pub seed: u64,
    /// When set, `decode_outputs.jsonl` and `capture_summary.json` are written here.
    pub output_dir: Option<PathBuf>,
    pub show_progress: bool,
    pub request_timeout: Option<Duration>,
    /// Poll `GET /v1/models` for up to this long before starting (`None`: no polling).
    pub wait_ready: Option<Duration>,
}

impl Default for CaptureOptions {
    fn default() -> Self {
        CaptureOptions {
            base_url: "http://127.0.0.1:8000".into(),
            model: None,
            prompts: PathBuf::from("eval_prompts_sharegpt.json"),
            num_prompts: None,
            max_tokens: 512,
            seed: 1,
            output_dir: None,
            show_progress: true,
            request_timeout: Some(Duration::from_secs(3600)),
            wait_ready: Some(crate::http::DEFAULT_WAIT_READY),
        }
    }
}

/// One line of `decode_outputs.jsonl`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureRecord {
    pub id: String,
    /// SHA-256 of the prompt text (the user message before templating).
    pub prompt_sha256: String,
    /// `sha256(",".join(prompt_ids))` of the templated prompt ids actually sent.
    pub prompt_token_ids_sha256: String,
    pub num_prompt_tokens: usize,
    pub token_ids: Vec<u32>,
    pub num_tokens: usize,
    /// `sha256(",".join(token_ids))`.
    pub sha256: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<String>,
}

/// `capture_summary.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaptureSummary {
    pub model: String,
    pub base_url: String,
    pub prompts_file: String,
    pub num_prompts: usize,
    pub max_tokens: u32,
    pub seed: u64,
    /// The shuffle used to order/select prompts.
    pub shuffle: String,
    pub total_tokens: u64,
    /// Records with fewer than `max_tokens` ids.
    pub short_records: usize,
    pub duration_s: f64,
    pub timestamp: String,
    pub unix_time: f64,
}

/// What [`run_capture`] returns.
#[derive(Debug, Clone)]
pub struct CaptureResult {
    pub summary: CaptureSummary,
    pub records: Vec<CaptureRecord>,
}

impl CaptureResult {
    /// Write `decode_outputs.jsonl` and `capture_summary.json` into `dir`.
    pub fn write(&self, dir: &Path) -> Result<()> {
        util::write_jsonl(&dir.join("decode_outputs.jsonl"), &self.records)?;
        util::write_json(&dir.join("capture_summary.json"), &self.summary)
    }

    pub fn render(&self) -> String {
        let s = &self.summary;
        format!(
            "captured {} prompts ({} generated tokens, {} short of {}) from {} at {} in {:.1} s\n",
            s.num_prompts,
            s.total_tokens,
            s.short_records,
            s.max_tokens,
            s.model,
            s.base_url,
            s.duration_s
        )
    }

    pub fn print(&self) {
        print!("{}", self.render());
    }
}

/// The §3.1 request body for one prompt.
pub fn request_body(model: &str, prompt_ids: &[u32], max_tokens: u32) -> Value {
    json!({
        "model": model,
        "prompt": prompt_ids,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": true,
        "add_special_tokens": false,
        "return_token_ids": true,
        "stream": false,
    })
}

/// Extract and check `choices[0].token_ids`.
fn generated_ids(v: &Value, max_tokens: u32) -> std::result::Result<Vec<u32>, String> {
    let arr = v
        .pointer("/choices/0/token_ids")
        .and_then(Value::as_array)
        .ok_or("response has no choices[0].token_ids array (return_token_ids)")?;
    let ids: Vec<u32> = arr
        .iter()
        .enumerate()
        .map(|(i, t)| {
            t.as_u64()
                .and_then(|x| u32::try_from(x).ok())
                .ok_or_else(|| format!("token_ids[{i}] = {t} is not a token id"))
        })
        .collect::<std::result::Result<_, _>>()?;
    if ids.len() > max_tokens as usize {
        return Err(format!(
            "{} tokens returned for max_tokens={max_tokens}",
            ids.len()
        ));
    }
    if let Some(n) = v
        .pointer("/usage/completion_tokens")
        .and_then(Value::as_u64)
    {
        if n != ids.len() as u64 {
            return Err(format!(
                "usage.completion_tokens={n} but token_ids has {} ids",
                ids.len()
            ));
        }
    }
    Ok(ids)
}

/// Run a capture. Requests are sequential; any failure aborts naming the prompt.
pub fn run_capture(opts: &CaptureOptions, encode: PromptEncoder<'_>) -> Result<CaptureResult> {
    if opts.max_tokens == 0 {
        return Err(Error::Options("max_tokens must be at least 1".into()));
    }
    let all = dataset::load_sharegpt(&opts.prompts)?;
    let n = opts.num_prompts.unwrap_or(all.len());
    if n == 0 {
        return Err(Error::Options("num_prompts must be at least 1".into()));
    }
    let prompts = dataset::select(all, n, opts.seed, true);
    let client = Client::new(&opts.base_url, opts.request_timeout)?;
    let model = client.prepare(opts.model.as_deref(), opts.wait_ready)?;
    let pb = util::progress_bar(prompts.len() as u64, opts.show_progress, "capture");
    let start = Instant::now();
    let (timestamp, unix_time) = util::now_stamp();
    let mut records = Vec::with_capacity(prompts.len());
    for p in &prompts {
        let prompt_ids = encode(&p.text).map_err(|e| Error::Encode {
            id: p.id.clone(),
            msg: format!("{e:#}"),
        })?;
        if prompt_ids.is_empty() {
            return Err(Error::Encode {
                id: p.id.clone(),
                msg: "encoder returned no tokens".into(),
            });
        }
        let v = client
            .post_json(
                "/v1/completions",
                &request_body(&model, &prompt_ids, opts.max_tokens),
            )
            .map_err(|e| Error::Protocol(format!("capture of prompt {}: {e}", p.id)))?;
        let ids = generated_ids(&v, opts.max_tokens)
            .map_err(|m| Error::Protocol(format!("capture of prompt {}: {m}", p.id)))?;
        records.push(CaptureRecord {
            id: p.id.clone(),
            prompt_sha256: util::sha256_hex(p.text.as_bytes()),
            prompt_token_ids_sha256: util::ids_sha256(&prompt_ids),
            num_prompt_tokens: prompt_ids.len(),
            num_tokens: ids.len(),
            sha256: util::ids_sha256(&ids),
            token_ids: ids,
            finish_reason: v
                .pointer("/choices/0/finish_reason")
                .and_then(Value::as_str)
                .map(str::to_string),
        });
        pb.inc(1);
    }
    pb.finish_and_clear();
    let summary = CaptureSummary {
        model,
        base_url: client.base_url().to_string(),
        prompts_file: opts.prompts.display().to_string(),
        num_prompts: records.len(),
        max_tokens: opts.max_tokens,
        seed: opts.seed,
        shuffle: "cpython random.seed(seed); random.shuffle(prompts)".into(),
        total_tokens: records.iter().map(|r| r.num_tokens as u64).sum(),
        short_records: records
            .iter()
            .filter(|r| r.num_tokens < opts.max_tokens as usize)
            .count(),
        duration_s: start.elapsed().as_secs_f64(),
        timestamp,
        unix_time,
    };
    let result = CaptureResult { summary, records };
    if let Some(dir) = &opts.output_dir {
        result.write(dir)?;
    }
    Ok(result)
}

/// Parse capture JSONL text, checking each record's hash and length fields and id uniqueness.
pub fn parse_capture(text: &str) -> std::result::Result<Vec<CaptureRecord>, String> {
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let r: CaptureRecord =
            serde_json::from_str(line).map_err(|e| format!("line {}: {e}", i + 1))?;
        if r.num_tokens != r.token_ids.len() {
            return Err(format!(
                "line {} ({}): num_tokens={} but {} token_ids",
                i + 1,
                r.id,
                r.num_tokens,
                r.token_ids.len()
            ));
        }
        if r.sha256 != util::ids_sha256(&r.token_ids) {
            return Err(format!(
                "line {} ({}): sha256 does not match token_ids",
                i + 1,
                r.id
            ));
        }
        if !seen.insert(r.id.clone()) {
            return Err(format!("line {}: duplicate id {}", i + 1, r.id));
        }
        out.push(r);
    }
    if out.is_empty() {
        return Err("no records".into());
    }
    Ok(out)
}

/// Load a `decode_outputs.jsonl` capture (see [`parse_capture`]).
pub fn load_capture(path: &Path) -> Result<Vec<CaptureRecord>> {
    let text = util::read_to_string(path)?;
    parse_capture(&text).map_err(|msg| Error::Capture {
        path: path.to_path_buf(),
        msg,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_ids_extraction_checks_the_response() {
        let ok = json!({"choices": [{"token_ids": [5, 6, 7]}], "usage": {"completion_tokens": 3}});
        assert_eq!(generated_ids(&ok, 3).unwrap(), vec![5, 6, 7]);
        assert!(generated_ids(&json!({"choices": [{"text": "x"}]}), 3)
            .unwrap_err()
            .contains("token_ids"));
        assert!(generated_ids(&json!({"choices": [{"token_ids": [1, -2]}]}), 3).is_err());
        assert!(
            generated_ids(&json!({"choices": [{"token_ids": [1, 2, 3, 4]}]}), 3)
                .unwrap_err()
                .contains("max_tokens")
        );
        let bad_usage = json!({"choices": [{"token_ids": [5]}], "usage": {"completion_tokens": 2}});
        assert!(generated_ids(&bad_usage, 3).unwrap_err().contains("usage"));
    }

    #[test]
    fn capture_files_are_validated() {
        let good = CaptureRecord {
            id: "a".into(),
            prompt_sha256: "p".into(),
            prompt_token_ids_sha256: "q".into(),
            num_prompt_tokens: 3,
            token_ids: vec![1, 2],
            num_tokens: 2,
            sha256: util::ids_sha256(&[1, 2]),
            finish_reason: None,
        };
        let line = serde_json::to_string(&good).unwrap();
        assert_eq!(parse_capture(&line).unwrap(), vec![good.clone()]);
        let mut tampered = good.clone();
        tampered.token_ids = vec![1, 3];
        let e = parse_capture(&serde_json::to_string(&tampered).unwrap()).unwrap_err();
        assert!(e.contains("sha256"), "{e}");
        assert!(parse_capture(&format!("{line}\n{line}"))
            .unwrap_err()
            .contains("duplicate"));
        assert!(parse_capture("").unwrap_err().contains("no records"));
    }
}
