//! The perplexity guardrail (HARNESS.md §2), in endpoint mode, plus the pure pieces shared with the
//! in-process mode: the record parser ([`parse_records`]), per-record scoring ([`score_record`],
//! [`nll_from_logprobs`]) and the micro-average aggregation ([`PplAccumulator`]).
//!
//! Records are `{id, context_token_ids, target_token_ids}`; the prompt is `context + target`; only
//! target positions are scored: `NLL = -Σ logprob(actual target token)`,
//! `ppl = exp(total_nll / total_tokens)` over all records. Anything malformed aborts.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::error::{Error, Result};
use crate::http::Client;
use crate::util;

/// Gemma's BOS id; every context must start with it (and it must not appear elsewhere).
pub const GEMMA_BOS: u32 = 2;

/// Log-probabilities above this are impossible (allowing for float rounding).
const MAX_LOGPROB: f64 = 1e-3;

/// One perplexity record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PplRecord {
    pub id: String,
    pub context_token_ids: Vec<u32>,
    pub target_token_ids: Vec<u32>,
}

impl PplRecord {
    /// `context + target`, the prompt sent to the server.
    pub fn prompt(&self) -> Vec<u32> {
        let mut p = self.context_token_ids.clone();
        p.extend_from_slice(&self.target_token_ids);
        p
    }

    /// Index of the first target token in the prompt.
    pub fn target_start(&self) -> usize {
        self.context_token_ids.len()
    }
}

fn token_ids(v: Option<&Value>, field: &str) -> std::result::Result<Vec<u32>, String> {
    let arr = v
        .ok_or_else(|| format!("missing `{field}`"))?
        .as_array()
        .ok_or_else(|| format!("`{field}` is not an array"))?;
    if arr.is_empty() {
        return Err(format!("`{field}` is empty"));
    }
    arr.iter()
        .enumerate()
        .map(|(i, t)| {
            t.as_u64()
                .and_then(|x| u32::try_from(x).ok())
                .ok_or_else(|| format!("`{field}`[{i}] = {t} is not a non-negative 32-bit integer"))
        })
        .collect()
}

/// Parse and validate one JSONL line. `bos`: the id every context must start with and that may not
/// appear anywhere else (`None` disables the BOS checks for non-Gemma vocabularies).
pub fn parse_record(line: &str, line_no: usize, bos: Option<u32>) -> Result<PplRecord> {
    let bad = |id: &str, msg: String| Error::PplRecord {
        line: line_no,
        id: id.to_string(),
        msg,
    };
    let v: Value =
        serde_json::from_str(line).map_err(|e| bad("?", format!("not valid JSON: {e}")))?;
    let obj = v
        .as_object()
        .ok_or_else(|| bad("?", "record is not a JSON object".into()))?;
    let id = match obj.get("id") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        Some(other) => {
            return Err(bad(
                "?",
                format!("`id` must be a non-empty string, got {other}"),
            ))
        }
        None => return Err(bad("?", "missing `id`".into())),
    };
    let context =
        token_ids(obj.get("context_token_ids"), "context_token_ids").map_err(|m| bad(&id, m))?;
    let target =
        token_ids(obj.get("target_token_ids"), "target_token_ids").map_err(|m| bad(&id, m))?;
    if let Some(bos) = bos {
        if context[0] != bos {
            return Err(bad(
                &id,
                format!(
                    "context must start with BOS={bos}, starts with {}",
                    context[0]
                ),
            ));
        }
        if let Some(p) = context[1..].iter().position(|&t| t == bos) {
            return Err(bad(
                &id,
                format!("BOS={bos} repeated at context position {}", p + 1),
            ));
        }
        if let Some(p) = target.iter().position(|&t| t == bos) {
            return Err(bad(
                &id,
                format!("BOS={bos} inside the target at position {p}"),
            ));
        }
    }
    Ok(PplRecord {
        id,
        context_token_ids: context,
        target_token_ids: target,
    })
}

/// Parse a whole JSONL document (blank lines ignored; duplicate ids and an empty file are errors).
pub fn parse_records(text: &str, bos: Option<u32>) -> Result<Vec<PplRecord>> {
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let rec = parse_record(line, i + 1, bos)?;
        if !seen.insert(rec.id.clone()) {
            return Err(Error::PplRecord {
                line: i + 1,
                id: rec.id,
                msg: "duplicate id".into(),
            });
        }
        out.push(rec);
    }
    if out.is_empty() {
        return Err(Error::PplRecord {
            line: 0,
            id: "-".into(),
            msg: "no records".into(),
        });
    }
    Ok(out)
}

/// Read and parse a records file, enforcing Gemma's BOS convention ([`GEMMA_BOS`]).
pub fn load_records(path: &Path) -> Result<Vec<PplRecord>> {
    load_records_with_bos(path, Some(GEMMA_BOS))
}

/// Read and parse a records file with an explicit BOS convention (`None` disables the BOS checks).
pub fn load_records_with_bos(path: &Path, bos: Option<u32>) -> Result<Vec<PplRecord>> {
    let text = util::read_to_string(path)?;
    parse_records(&text, bos)
}

/// NLL of a record from the log-probabilities of its target tokens (in order). Non-finite or
/// positive log-probabilities are errors.
pub fn nll_from_logprobs(logprobs: &[f64]) -> std::result::Result<f64, String> {
    if logprobs.is_empty() {
        return Err("no target log-probabilities".into());
    }
    let mut nll = 0.0;
    for (i, &lp) in logprobs.iter().enumerate() {
        if !lp.is_finite() {
            return Err(format!("target log-probability {i} is not finite ({lp})"));
        }
        if lp > MAX_LOGPROB {
            return Err(format!("target log-probability {i} is positive ({lp})"));
        }
        nll -= lp;
    }
    Ok(nll)
}

/// Log-probability of `token` in one `prompt_logprobs` entry (`{"<id>": {"logprob": x, ...}, ...}`).
fn actual_logprob(entry: &Value, token: u32, pos: usize) -> std::result::Result<f64, String> {
    let obj = entry
        .as_object()
        .ok_or_else(|| format!("prompt_logprobs[{pos}] is not an object: {entry:.100}"))?;
    let key = token.to_string();
    let slot = obj.get(&key).ok_or_else(|| {
        format!(
            "prompt_logprobs[{pos}] lacks the actual token {token} (keys: {:?})",
            {
                let mut k: Vec<&String> = obj.keys().collect();
                k.truncate(8);
                k
            }
        )
    })?;
    let lp = slot
        .get("logprob")
        .ok_or_else(|| format!("prompt_logprobs[{pos}][\"{token}\"] has no `logprob`"))?;
    let lp = lp.as_f64().ok_or_else(|| {
        format!("prompt_logprobs[{pos}][\"{token}\"].logprob is not a number: {lp}")
    })?;
    if !lp.is_finite() || lp > MAX_LOGPROB {
        return Err(format!(
            "prompt_logprobs[{pos}][\"{token}\"].logprob = {lp} is invalid"
        ));
    }
    Ok(lp)
}

/// Validate a `choices[0].prompt_logprobs` array against the record and return the target tokens'
/// log-probabilities. The array must be exactly as long as the prompt, entry 0 must be `null`, and
/// every later entry must hold its actual prompt token with a finite log-probability.
pub fn target_logprobs(
    record: &PplRecord,
    prompt_logprobs: &Value,
) -> std::result::Result<Vec<f64>, String> {
    let prompt = record.prompt();
    let arr = prompt_logprobs
        .as_array()
        .ok_or("`prompt_logprobs` is not an array")?;
    if arr.len() != prompt.len() {
        return Err(format!(
            "`prompt_logprobs` has {} entries, the prompt has {} tokens",
            arr.len(),
            prompt.len()
        ));
    }
    if !arr[0].is_null() {
        return Err("`prompt_logprobs[0]` must be null (nothing predicts the first token)".into());
    }
    let start = record.target_start();
    let mut out = Vec::with_capacity(record.target_token_ids.len());
    for (pos, (entry, &tok)) in arr.iter().zip(&prompt).enumerate().skip(1) {
        let lp = actual_logprob(entry, tok, pos)?;
        if pos >= start {
            out.push(lp);
        }
    }
    Ok(out)
}

/// NLL over the record's target positions from a `prompt_logprobs` array.
pub fn score_record(record: &PplRecord, prompt_logprobs: &Value) -> Result<f64> {
    let err = |msg: String| Error::PplResponse {
        id: record.id.clone(),
        msg,
    };
    let lps = target_logprobs(record, prompt_logprobs).map_err(err)?;
    nll_from_logprobs(&lps).map_err(err)
}

/// Score of one record, a line of `ppl_records.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PplRecordResult {
    pub id: String,
    pub num_tokens: u64,
    pub nll: f64,
    pub ppl: f64,
}

/// Micro-average accumulation over records.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PplAccumulator {
    pub total_nll: f64,
    pub total_tokens: u64,
    pub records: Vec<PplRecordResult>,
}

impl PplAccumulator {
    pub fn new() -> Self {
        Self::default()
    }

    /// Add one record from the log-probabilities of its target tokens (validated as in
    /// [`nll_from_logprobs`]; the error names the record).
    pub fn add(&mut self, id: &str, target_logprobs: &[f64]) -> Result<&PplRecordResult> {
        let nll = nll_from_logprobs(target_logprobs).map_err(|msg| Error::PplResponse {
            id: id.to_string(),
            msg,
        })?;
        Ok(self.add_nll(id, nll, target_logprobs.len() as u64))
    }

    /// Add one record's NLL over `num_tokens` scored tokens.
    pub fn add_nll(&mut self, id: &str, nll: f64, num_tokens: u64) -> &PplRecordResult {
        self.total_nll += nll;
        self.total_tokens += num_tokens;
        let ppl = if num_tokens == 0 {
            f64::NAN
        } else {
            (nll / num_tokens as f64).exp()
        };
        self.records.push(PplRecordResult {
            id: id.to_string(),
            num_tokens,
            nll,
            ppl,
        });
        self.records.last().expect("just pushed")
    }

    /// `exp(total_nll / total_tokens)` — the gated number.
    pub fn ppl(&self) -> f64 {
        if self.total_tokens == 0 {
            f64::NAN
        } else {
            (self.total_nll / self.total_tokens as f64).exp()
        }
    }

    /// Mean of the per-record perplexities (reported, not gated).
    pub fn mean_record_ppl(&self) -> f64 {
        if self.records.is_empty() {
            f64::NAN
        } else {
            self.records.iter().map(|r| r.ppl).sum::<f64>() / self.records.len() as f64
        }
    }

    /// The aggregate numbers.
    pub fn summary(&self) -> PplStats {
        PplStats {
            ppl: self.ppl(),
            num_tokens: self.total_tokens,
            num_records: self.records.len(),
            mean_record_ppl: self.mean_record_ppl(),
            total_nll: self.total_nll,
        }
    }

    /// Build the `ppl_summary.json` document (`base_url` is `"in-process"` for the engine mode).
    pub fn to_summary(
        &self,
        model: &str,
        base_url: &str,
        records_file: &str,
        duration_s: f64,
    ) -> PplSummary {
        let (timestamp, unix_time) = util::now_stamp();
        PplSummary {
            ppl: self.ppl(),
            ppl_num_tokens: self.total_tokens,
            total_nll: self.total_nll,
            mean_record_ppl: self.mean_record_ppl(),
            num_records: self.records.len(),
            model: model.to_string(),
            base_url: base_url.to_string(),
            records_file: records_file.to_string(),
            duration_s,
            timestamp,
            unix_time,
        }
    }
}

/// Aggregate numbers of a [`PplAccumulator`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PplStats {
    pub ppl: f64,
    pub num_tokens: u64,
    pub num_records: usize,
    pub mean_record_ppl: f64,
    pub total_nll: f64,
}

/// `ppl_summary.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PplSummary {
    pub ppl: f64,
    pub ppl_num_tokens: u64,
    pub total_nll: f64,
    pub mean_record_ppl: f64,
    pub num_records: usize,
    pub model: String,
    /// The server scored (`"in-process"` for the engine-internal mode).
    pub base_url: String,
    pub records_file: String,
    pub duration_s: f64,
    pub timestamp: String,
    pub unix_time: f64,
}

/// Options of [`run_ppl`].
#[derive(Debug, Clone, Serialize)]
pub struct PplOptions {
    pub base_url: String,
    /// `None` → first id of `GET /v1/models`.
    pub model: Option<String>,
    pub records: PathBuf,
    /// When set, `ppl_summary.json` and `ppl_records.jsonl` are written here.
    pub output_dir: Option<PathBuf>,
    /// BOS convention enforced on records (default Gemma's 2).
    pub bos_token_id: Option<u32>,
    /// Score only the first N records (all by default).
    pub limit: Option<usize>,
    pub show_progress: bool,
    pub request_timeout: Option<Duration>,
    /// Poll `GET /v1/models` for up to this long before starting (`None`: no polling).
    pub wait_ready: Option<Duration>,
}

impl Default for PplOptions {
    fn default() -> Self {
        PplOptions {
            base_url: "http://127.0.0.1:8000".into(),
            model: None,
            records: PathBuf::from("ppl_ground_truth_tokens.jsonl"),
            output_dir: None,
            bos_token_id: Some(GEMMA_BOS),
            limit: None,
            show_progress: true,
            request_timeout: Some(Duration::from_secs(3600)),
            wait_ready: Some(crate::http::DEFAULT_WAIT_READY),
        }
    }
}

/// What [`run_ppl`] returns.
#[derive(Debug, Clone)]
pub struct PplResult {
    pub summary: PplSummary,
    pub records: Vec<PplRecordResult>,
}

impl PplResult {
    /// Write `ppl_summary.json` and `ppl_records.jsonl` into `dir`.
    pub fn write(&self, dir: &Path) -> Result<()> {
        util::write_json(&dir.join("ppl_summary.json"), &self.summary)?;
        util::write_jsonl(&dir.join("ppl_records.jsonl"), &self.records)
    }

    pub fn render(&self) -> String {
        let s = &self.summary;
        format!(
            "PPL {:.4} over {} target tokens in {} records (mean per-record PPL {:.4}); model {} at {}, {:.1} s\n",
            s.ppl, s.ppl_num_tokens, s.num_records, s.mean_record_ppl, s.model, s.base_url, s.duration_s
        )
    }

    pub fn print(&self) {
        print!("{}", self.render());
    }
}

/// The exact request body of §2 for one record.
pub fn request_body(model: &str, record: &PplRecord) -> Value {
    json!({
        "model": model,
        "prompt": record.prompt(),
        "max_tokens": 1,
        "temperature": 0.0,
        "stream": false,
        "prompt_logprobs": 1,
        "add_special_tokens": false,
        "return_token_ids": true,
    })
}

/// Score one record against the server (used by [`run_ppl`]).
pub fn score_record_remote(client: &Client, model: &str, record: &PplRecord) -> Result<f64> {
    let err = |msg: String| Error::PplResponse {
        id: record.id.clone(),
        msg,
    };
    let v = client
        .post_json("/v1/completions", &request_body(model, record))
        .map_err(|e| err(e.to_string()))?;
    // With return_token_ids, servers echo the prompt ids; if they do, they must be ours unchanged
    // (catches servers that re-tokenise or prepend BOS).
    if let Some(ids) = v
        .pointer("/choices/0/prompt_token_ids")
        .filter(|x| !x.is_null())
    {
        let ok = ids.as_array().is_some_and(|a| {
            a.len() == record.prompt().len()
                && a.iter()
                    .zip(record.prompt())
                    .all(|(x, t)| x.as_u64() == Some(u64::from(t)))
        });
        if !ok {
            return Err(err(
                "choices[0].prompt_token_ids differs from the prompt sent".into(),
            ));
        }
    }
    let plp = v
        .pointer("/choices/0/prompt_logprobs")
        .ok_or_else(|| err("response has no choices[0].prompt_logprobs".into()))?;
    score_record(record, plp)
}

/// Score every record sequentially against `opts.base_url`. The first failure aborts.
pub fn run_ppl(opts: &PplOptions) -> Result<PplResult> {
    let mut records = load_records_with_bos(&opts.records, opts.bos_token_id)?;
    if let Some(n) = opts.limit {
        if n == 0 {
            return Err(Error::Options("limit must be at least 1".into()));
        }
        records.truncate(n);
    }
    let client = Client::new(&opts.base_url, opts.request_timeout)?;
    let model = client.prepare(opts.model.as_deref(), opts.wait_ready)?;
    let pb = util::progress_bar(records.len() as u64, opts.show_progress, "ppl");
    let start = Instant::now();
    let mut acc = PplAccumulator::new();
    for rec in &records {
        let nll = score_record_remote(&client, &model, rec)?;
        acc.add_nll(&rec.id, nll, rec.target_token_ids.len() as u64);
        pb.inc(1);
    }
    pb.finish_and_clear();
    let summary = acc.to_summary(
        &model,
        client.base_url(),
        &opts.records.display().to_string(),
        start.elapsed().as_secs_f64(),
    );
    let result = PplResult {
        summary,
        records: acc.records,
    };
    if let Some(dir) = &opts.output_dir {
        result.write(dir)?;
    }
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: &str, c: &[u32], t: &[u32]) -> PplRecord {
        PplRecord {
            id: id.into(),
            context_token_ids: c.to_vec(),
            target_token_ids: t.to_vec(),
        }
    }

    #[test]
    fn parses_good_records() {
        let text = "{\"id\":\"a\",\"context_token_ids\":[2,105,7],\"target_token_ids\":[9,10]}\n\n\
                    {\"id\":\"b\",\"context_token_ids\":[2],\"target_token_ids\":[4],\"extra\":1}\n";
        let r = parse_records(text, Some(GEMMA_BOS)).unwrap();
        assert_eq!(
            r,
            vec![rec("a", &[2, 105, 7], &[9, 10]), rec("b", &[2], &[4])]
        );
        assert_eq!(r[0].prompt(), vec![2, 105, 7, 9, 10]);
        assert_eq!(r[0].target_start(), 3);
    }

    #[test]
    fn rejects_every_malformed_record() {
        let cases: &[(&str, &str)] = &[
            ("not json", "not valid JSON"),
            ("[1,2]", "not a JSON object"),
            (
                r#"{"context_token_ids":[2],"target_token_ids":[3]}"#,
                "missing `id`",
            ),
            (
                r#"{"id":5,"context_token_ids":[2],"target_token_ids":[3]}"#,
                "`id` must be",
            ),
            (
                r#"{"id":"","context_token_ids":[2],"target_token_ids":[3]}"#,
                "`id` must be",
            ),
            (
                r#"{"id":"x","target_token_ids":[3]}"#,
                "missing `context_token_ids`",
            ),
            (
                r#"{"id":"x","context_token_ids":[2]}"#,
                "missing `target_token_ids`",
            ),
            (
                r#"{"id":"x","context_token_ids":[2],"target_token_ids":[]}"#,
                "`target_token_ids` is empty",
            ),
            (
                r#"{"id":"x","context_token_ids":[],"target_token_ids":[3]}"#,
                "`context_token_ids` is empty",
            ),
            (
                r#"{"id":"x","context_token_ids":"2","target_token_ids":[3]}"#,
                "not an array",
            ),
            (
                r#"{"id":"x","context_token_ids":[2],"target_token_ids":[3.5]}"#,
                "not a non-negative",
            ),
            (
                r#"{"id":"x","context_token_ids":[2],"target_token_ids":[-1]}"#,
                "not a non-negative",
            ),
            (
                r#"{"id":"x","context_token_ids":[2],"target_token_ids":["3"]}"#,
                "not a non-negative",
            ),
            (
                r#"{"id":"x","context_token_ids":[2],"target_token_ids":[4294967296]}"#,
                "not a non-negative",
            ),
            (
                r#"{"id":"x","context_token_ids":[105,2],"target_token_ids":[3]}"#,
                "must start with BOS",
            ),
            (
                r#"{"id":"x","context_token_ids":[2,2],"target_token_ids":[3]}"#,
                "BOS=2 repeated",
            ),
            (
                r#"{"id":"x","context_token_ids":[2,5],"target_token_ids":[3,2]}"#,
                "inside the target",
            ),
        ];
        for (line, want) in cases {
            let e = parse_record(line, 7, Some(GEMMA_BOS))
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{line}: {e}");
            assert!(e.contains("line 7"), "{e}");
        }
        // The record is named in the error once its id is known.
        let e = parse_record(
            r#"{"id":"rec-9","context_token_ids":[2],"target_token_ids":[]}"#,
            1,
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("rec-9"), "{e}");
        // BOS checks can be disabled for other vocabularies.
        assert!(parse_record(
            r#"{"id":"x","context_token_ids":[1],"target_token_ids":[3]}"#,
            1,
            None
        )
        .is_ok());
        let dup = "{\"id\":\"a\",\"context_token_ids\":[2],\"target_token_ids\":[3]}\n\
                   {\"id\":\"a\",\"context_token_ids\":[2],\"target_token_ids\":[4]}";
        assert!(parse_records(dup, Some(2))
            .unwrap_err()
            .to_string()
            .contains("duplicate"));
        assert!(parse_records("\n\n", Some(2))
            .unwrap_err()
            .to_string()
            .contains("no records"));
    }

    #[test]
    fn nll_and_ppl_math() {
        let r = rec("a", &[2, 7], &[8, 9]);
        let plp = json!([null, {"7": {"logprob": -0.1}}, {"8": {"logprob": -0.5, "rank": 1}, "1": {"logprob": -0.4}}, {"9": {"logprob": -1.5}}]);
        let nll = score_record(&r, &plp).unwrap();
        assert!((nll - 2.0).abs() < 1e-12);
        let mut acc = PplAccumulator::new();
        acc.add_nll("a", nll, 2);
        acc.add("b", &[-0.25, -0.75]).unwrap();
        assert!(acc
            .add("c", &[f64::NAN])
            .unwrap_err()
            .to_string()
            .contains("record c"));
        assert!(acc.add("c", &[]).is_err());
        // micro: exp(3/4); mean of exp(1) and exp(0.5)
        assert!((acc.ppl() - 0.75f64.exp()).abs() < 1e-12);
        assert!((acc.mean_record_ppl() - (1f64.exp() + 0.5f64.exp()) / 2.0).abs() < 1e-12);
        assert_eq!(acc.total_tokens, 4);
        let st = acc.summary();
        assert_eq!((st.num_tokens, st.num_records), (4, 2));
        assert_eq!(st.ppl, acc.ppl());
        let doc = acc.to_summary("m", "in-process", "f.jsonl", 1.0);
        assert_eq!((doc.ppl_num_tokens, doc.num_records), (4, 2));
        assert!(PplAccumulator::new().ppl().is_nan());
    }

    #[test]
    fn malformed_logprobs_are_rejected() {
        let r = rec("rec-1", &[2, 7], &[8]);
        let cases = [
            (json!({"x": 1}), "not an array"),
            (json!([null, {"7": {"logprob": -0.1}}]), "has 2 entries"),
            (
                json!([{"2": {"logprob": 0.0}}, {"7": {"logprob": -0.1}}, {"8": {"logprob": -0.2}}]),
                "must be null",
            ),
            (
                json!([null, {"7": {"logprob": -0.1}}, {"9": {"logprob": -0.2}}]),
                "lacks the actual token 8",
            ),
            (
                json!([null, {"6": {"logprob": -0.1}}, {"8": {"logprob": -0.2}}]),
                "lacks the actual token 7",
            ),
            (
                json!([null, {"7": {"logprob": -0.1}}, {"8": {"lp": -0.2}}]),
                "no `logprob`",
            ),
            (
                json!([null, {"7": {"logprob": -0.1}}, {"8": {"logprob": "x"}}]),
                "not a number",
            ),
            (
                json!([null, {"7": {"logprob": -0.1}}, {"8": {"logprob": 0.5}}]),
                "invalid",
            ),
            (
                json!([null, {"7": {"logprob": -0.1}}, null]),
                "not an object",
            ),
            (
                json!([null, {"7": {"logprob": -0.1}}, {"8": -0.2}]),
                "no `logprob`",
            ),
        ];
        for (plp, want) in cases {
            let e = score_record(&r, &plp).unwrap_err().to_string();
            assert!(e.contains(want) && e.contains("rec-1"), "{plp}: {e}");
        }
        assert!(nll_from_logprobs(&[f64::NEG_INFINITY]).is_err());
        assert!(nll_from_logprobs(&[f64::NAN]).is_err());
        assert!(nll_from_logprobs(&[]).is_err());
    }

    #[test]
    fn request_body_is_exactly_the_contract() {
        let b = request_body("m", &rec("a", &[2, 5], &[6]));
        assert_eq!(
            b,
            json!({"model": "m", "prompt": [2, 5, 6], "max_tokens": 1, "temperature": 0.0,
                   "stream": false, "prompt_logprobs": 1, "add_special_tokens": false,
                   "return_token_ids": true})
        );
    }

    #[test]
    fn shared_records_file_parses() {
        let path = Path::new("/work/shared/data/ppl_ground_truth_tokens.jsonl");
        if path.exists() {
            let r = load_records(path).unwrap();
            assert_eq!(r.len(), 128);
            assert_eq!(
                r.iter().map(|x| x.target_token_ids.len()).sum::<usize>(),
                61_797
            );
        }
    }
}
