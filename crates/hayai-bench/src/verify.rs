//! Reproducibility verification: the checks the organisers apply to a submission (HARNESS.md §3),
//! run locally against any server.
//!
//! * TPS on a *private* prompt set must be within ±`tps_tolerance` (5%) of the public set's TPS,
//!   comparing medians over `repeats` runs each. Runs are interleaved (public 1, private 1,
//!   public 2, ...) so slow drift of the machine does not bias one set.
//! * Run-to-run spread `(max - min) / median` of each set must stay within `spread_tolerance`
//!   (checked when `repeats >= 2`).
//! * No request may fail.
//! * PPL (endpoint mode, §2) must be at most the cap (absolute, or reference × factor).
//! * With a reference capture, a fresh capture must be GREEDY_IDENTICAL to it.
//!
//! When no private prompt file is given, the public file is split deterministically into two
//! disjoint halves: the prompts are shuffled with `seed` (CPython order), the first half plays
//! "public" and the second half "private". This measures prompt sensitivity on prompts of the same
//! distribution without a second data set; note that the public TPS is then that of half the file.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::bench::{run_bench_with_prompts, BenchOptions, Endpoint};
use crate::capture::load_capture;
use crate::capture::{run_capture, CaptureOptions, PromptEncoder};
use crate::dataset::{self, DatasetSpec, Prompt};
use crate::error::{Error, Result};
use crate::identity::{compare_captures, IdentityResult, IdentityVerdict};
use crate::ppl::{run_ppl, PplOptions, GEMMA_BOS};
use crate::rng::shuffled_indices;
use crate::stats;
use crate::util;

/// The PPL gate.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PplCap {
    /// `ppl <= cap`.
    Absolute(f64),
    /// `ppl <= reference * factor` (the challenge uses factor 1.05).
    Reference { reference: f64, factor: f64 },
}

impl PplCap {
    /// Reference × 1.05, the challenge's rule.
    pub fn reference(reference: f64) -> Self {
        PplCap::Reference {
            reference,
            factor: 1.05,
        }
    }

    pub fn cap(&self) -> f64 {
        match *self {
            PplCap::Absolute(c) => c,
            PplCap::Reference { reference, factor } => reference * factor,
        }
    }
}

/// Options of [`run_verify`].
#[derive(Debug, Clone, Serialize)]
pub struct VerifyOptions {
    pub base_url: String,
    pub model: Option<String>,
    pub public_prompts: PathBuf,
    /// `None` → split the public file into disjoint halves (see the module docs).
    pub private_prompts: Option<PathBuf>,
    /// Bench runs per prompt set.
    pub repeats: usize,
    /// Prompts per set (each set uses all of its prompts when it has fewer).
    pub num_prompts: usize,
    pub output_len: u32,
    pub max_concurrency: usize,
    pub warmup_requests: usize,
    pub seed: u64,
    pub endpoint: Endpoint,
    pub ppl_records: PathBuf,
    pub ppl_cap: PplCap,
    pub ppl_bos_token_id: Option<u32>,
    pub tps_tolerance: f64,
    pub spread_tolerance: f64,
    /// A `decode_outputs.jsonl` to check greedy identity against (needs an encoder).
    pub reference_capture: Option<PathBuf>,
    /// Prompts for the identity capture (`None` → as many as the reference holds, the whole file
    /// when they are the same set).
    pub capture_prompts: Option<PathBuf>,
    pub capture_max_tokens: u32,
    /// When set, everything is written here: `verify.json`, `ppl_summary.json`, `ppl_records.jsonl`,
    /// `decode_outputs.jsonl`, and each bench run under `verify_runs/<set>-<k>/`.
    pub output_dir: Option<PathBuf>,
    pub show_progress: bool,
    pub request_timeout: Option<Duration>,
    /// Poll `GET /v1/models` for up to this long before starting (`None`: no polling).
    pub wait_ready: Option<Duration>,
}

impl Default for VerifyOptions {
    fn default() -> Self {
        VerifyOptions {
            base_url: "http://127.0.0.1:8000".into(),
            model: None,
            public_prompts: PathBuf::from("eval_prompts_sharegpt.json"),
            private_prompts: None,
            repeats: 3,
            num_prompts: 128,
            output_len: 512,
            max_concurrency: 1,
            warmup_requests: 4,
            seed: 1,
            endpoint: Endpoint::Chat,
            ppl_records: PathBuf::from("ppl_ground_truth_tokens.jsonl"),
            ppl_cap: PplCap::reference(2.30),
            ppl_bos_token_id: Some(GEMMA_BOS),
            tps_tolerance: 0.05,
            spread_tolerance: 0.05,
            reference_capture: None,
            capture_prompts: None,
            capture_max_tokens: 512,
            output_dir: None,
            show_progress: true,
            request_timeout: Some(Duration::from_secs(3600)),
            wait_ready: Some(crate::http::DEFAULT_WAIT_READY),
        }
    }
}

/// TPS over the repeated runs of one prompt set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SetStats {
    pub label: String,
    /// Where the prompts came from.
    pub source: String,
    pub num_prompts: usize,
    pub tps_runs: Vec<f64>,
    pub median_tps: f64,
    pub min_tps: f64,
    pub max_tps: f64,
    /// `(max - min) / median`.
    pub spread: f64,
    pub failed_requests: usize,
}

impl SetStats {
    /// Summarise the TPS values of repeated runs.
    pub fn from_runs(
        label: &str,
        source: &str,
        num_prompts: usize,
        tps: &[f64],
        failed: usize,
    ) -> Self {
        let median = stats::median(tps).unwrap_or(f64::NAN);
        let min = tps.iter().copied().fold(f64::INFINITY, f64::min);
        let max = tps.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        SetStats {
            label: label.into(),
            source: source.into(),
            num_prompts,
            tps_runs: tps.to_vec(),
            median_tps: median,
            min_tps: min,
            max_tps: max,
            spread: if median > 0.0 {
                (max - min) / median
            } else {
                f64::NAN
            },
            failed_requests: failed,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckStatus {
    Pass,
    Fail,
    NotChecked,
}

/// One validity check.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Check {
    pub name: String,
    pub status: CheckStatus,
    pub detail: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Verdict {
    Valid,
    Invalid,
}

/// `verify.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VerifyReport {
    pub verdict: Verdict,
    /// Details of the failed checks (empty when VALID).
    pub reasons: Vec<String>,
    /// Checks that could not be made (e.g. no reference capture).
    pub not_checked: Vec<String>,
    pub checks: Vec<Check>,
    pub public: SetStats,
    pub private: SetStats,
    /// `median_private / median_public - 1`.
    pub tps_gap: f64,
    pub ppl: f64,
    pub ppl_cap: f64,
    pub ppl_cap_rule: PplCap,
    pub identity: Option<IdentityResult>,
    pub model: String,
    pub base_url: String,
    pub repeats: usize,
    pub tps_tolerance: f64,
    pub spread_tolerance: f64,
    pub timestamp: String,
    pub unix_time: f64,
}

impl VerifyReport {
    pub fn is_valid(&self) -> bool {
        self.verdict == Verdict::Valid
    }

    pub fn write(&self, dir: &Path) -> Result<()> {
        util::write_json(&dir.join("verify.json"), self)
    }

    pub fn render(&self) -> String {
        let mut o = format!(
            "{}: public median {:.2} TPS {:?}, private median {:.2} TPS {:?}, gap {:+.2}%, PPL {:.4} (cap {:.4})\n",
            match self.verdict {
                Verdict::Valid => "VALID",
                Verdict::Invalid => "INVALID",
            },
            self.public.median_tps,
            self.public.tps_runs.iter().map(|v| (v * 100.0).round() / 100.0).collect::<Vec<_>>(),
            self.private.median_tps,
            self.private.tps_runs.iter().map(|v| (v * 100.0).round() / 100.0).collect::<Vec<_>>(),
            self.tps_gap * 100.0,
            self.ppl,
            self.ppl_cap
        );
        for c in &self.checks {
            let tag = match c.status {
                CheckStatus::Pass => "pass",
                CheckStatus::Fail => "FAIL",
                CheckStatus::NotChecked => "n/a ",
            };
            o.push_str(&format!("  [{tag}] {}: {}\n", c.name, c.detail));
        }
        o
    }

    pub fn print(&self) {
        print!("{}", self.render());
    }
}

/// Inputs to [`decide`]: the measured facts.
#[derive(Debug, Clone)]
pub struct Measurements {
    pub public: SetStats,
    pub private: SetStats,
    pub ppl: f64,
    pub identity: Option<IdentityResult>,
}

/// Apply the validity rules to measurements (pure; the verdict logic of [`run_verify`]).
pub fn decide(
    m: &Measurements,
    cap: PplCap,
    tps_tol: f64,
    spread_tol: f64,
    repeats: usize,
) -> (Verdict, Vec<Check>) {
    let mut checks = Vec::new();
    let mut check = |name: &str, ok: Option<bool>, detail: String| {
        checks.push(Check {
            name: name.into(),
            status: match ok {
                Some(true) => CheckStatus::Pass,
                Some(false) => CheckStatus::Fail,
                None => CheckStatus::NotChecked,
            },
            detail,
        })
    };
    let failed = m.public.failed_requests + m.private.failed_requests;
    check(
        "no_failed_requests",
        Some(failed == 0),
        format!("{failed} failed requests over all bench runs"),
    );
    let gap = m.private.median_tps / m.public.median_tps - 1.0;
    check(
        "private_vs_public_tps",
        Some(gap.is_finite() && gap.abs() <= tps_tol),
        format!(
            "private {:.2} vs public {:.2} TPS: {:+.2}% (allowed ±{:.1}%)",
            m.private.median_tps,
            m.public.median_tps,
            gap * 100.0,
            tps_tol * 100.0
        ),
    );
    for s in [&m.public, &m.private] {
        let name = format!("run_spread_{}", s.label);
        if repeats < 2 {
            check(&name, None, "needs at least 2 repeats".into());
        } else {
            check(
                &name,
                Some(s.spread.is_finite() && s.spread <= spread_tol),
                format!(
                    "(max-min)/median = {:.2}% over {} runs (allowed {:.1}%)",
                    s.spread * 100.0,
                    s.tps_runs.len(),
                    spread_tol * 100.0
                ),
            );
        }
    }
    let c = cap.cap();
    check(
        "ppl_under_cap",
        Some(m.ppl.is_finite() && m.ppl <= c),
        format!("PPL {:.4} vs cap {:.4}", m.ppl, c),
    );
    match &m.identity {
        Some(id) => check(
            "greedy_identity",
            Some(id.verdict == IdentityVerdict::GreedyIdentical),
            format!(
                "{} ({} of {} records identical{})",
                id.verdict.as_str(),
                id.num_identical,
                id.num_compared,
                id.earliest.as_ref().map_or(String::new(), |e| format!(
                    "; earliest divergence {} at {}",
                    e.id, e.first_diff_index
                ))
            ),
        ),
        None => check("greedy_identity", None, "no reference capture given".into()),
    }
    let verdict = if checks.iter().any(|c| c.status == CheckStatus::Fail) {
        Verdict::Invalid
    } else {
        Verdict::Valid
    };
    (verdict, checks)
}

/// A prompt set and a description of where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptSet {
    pub prompts: Vec<Prompt>,
    pub source: String,
}

/// The (public, private) prompt sets a verify run uses.
pub fn prompt_sets(opts: &VerifyOptions) -> Result<(PromptSet, PromptSet)> {
    let public_all = dataset::load_sharegpt(&opts.public_prompts)?;
    match &opts.private_prompts {
        Some(p) => {
            let private_all = dataset::load_sharegpt(p)?;
            Ok((
                PromptSet {
                    prompts: dataset::select(public_all, opts.num_prompts, opts.seed, true),
                    source: opts.public_prompts.display().to_string(),
                },
                PromptSet {
                    prompts: dataset::select(private_all, opts.num_prompts, opts.seed, true),
                    source: p.display().to_string(),
                },
            ))
        }
        None => {
            if public_all.len() < 2 {
                return Err(Error::Options(
                    "the public prompt file needs at least 2 prompts to derive a private half"
                        .into(),
                ));
            }
            let order = shuffled_indices(public_all.len(), opts.seed);
            let half = public_all.len().div_ceil(2);
            let pick = |idx: &[usize]| -> Vec<Prompt> {
                idx.iter()
                    .take(opts.num_prompts)
                    .map(|&i| public_all[i].clone())
                    .collect()
            };
            let src = opts.public_prompts.display();
            Ok((
                PromptSet {
                    prompts: pick(&order[..half]),
                    source: format!("{src} (seed-{} shuffled, first half)", opts.seed),
                },
                PromptSet {
                    prompts: pick(&order[half..]),
                    source: format!("{src} (seed-{} shuffled, second half)", opts.seed),
                },
            ))
        }
    }
}

/// Run the whole verification. `encoder` is needed only with a reference capture.
pub fn run_verify(
    opts: &VerifyOptions,
    encoder: Option<PromptEncoder<'_>>,
) -> Result<VerifyReport> {
    if opts.repeats == 0 {
        return Err(Error::Options("repeats must be at least 1".into()));
    }
    if opts.reference_capture.is_some() && encoder.is_none() {
        return Err(Error::Options(
            "a reference capture needs a prompt encoder (tokenizer + chat template)".into(),
        ));
    }
    let (
        PromptSet {
            prompts: public,
            source: public_src,
        },
        PromptSet {
            prompts: private,
            source: private_src,
        },
    ) = prompt_sets(opts)?;
    let client = crate::http::Client::new(&opts.base_url, opts.request_timeout)?;
    let model = client.prepare(opts.model.as_deref(), opts.wait_ready)?;
    let bench_opts = BenchOptions {
        base_url: opts.base_url.clone(),
        model: Some(model.clone()),
        dataset: DatasetSpec::ShareGpt(opts.public_prompts.clone()),
        num_prompts: opts.num_prompts,
        shuffle: false,
        output_len: opts.output_len,
        max_concurrency: opts.max_concurrency,
        warmup_requests: opts.warmup_requests,
        warmup_output_len: 32,
        seed: opts.seed,
        ignore_eos: true,
        temperature: 0.0,
        stream: false,
        endpoint: opts.endpoint,
        output_dir: None,
        show_progress: opts.show_progress,
        request_timeout: opts.request_timeout,
        wait_ready: None,
    };
    let mut tps = [Vec::new(), Vec::new()];
    let mut failed = [0usize, 0usize];
    for k in 1..=opts.repeats {
        for (s, (label, prompts, src)) in [
            ("public", &public, &public_src),
            ("private", &private, &private_src),
        ]
        .into_iter()
        .enumerate()
        {
            let r = run_bench_with_prompts(&bench_opts, prompts, src)?;
            if let Some(dir) = &opts.output_dir {
                r.write(&dir.join("verify_runs").join(format!("{label}-{k}")))?;
            }
            tps[s].push(r.summary.tps);
            failed[s] += r.summary.failed;
        }
    }
    let public_stats = SetStats::from_runs("public", &public_src, public.len(), &tps[0], failed[0]);
    let private_stats =
        SetStats::from_runs("private", &private_src, private.len(), &tps[1], failed[1]);

    let ppl = run_ppl(&PplOptions {
        base_url: opts.base_url.clone(),
        model: Some(model.clone()),
        records: opts.ppl_records.clone(),
        output_dir: opts.output_dir.clone(),
        bos_token_id: opts.ppl_bos_token_id,
        limit: None,
        show_progress: opts.show_progress,
        request_timeout: opts.request_timeout,
        wait_ready: None,
    })?;

    let identity = match (&opts.reference_capture, encoder) {
        (Some(reference), Some(enc)) => {
            let reference_records = load_capture(reference)?;
            let cap = run_capture(
                &CaptureOptions {
                    base_url: opts.base_url.clone(),
                    model: Some(model.clone()),
                    prompts: opts
                        .capture_prompts
                        .clone()
                        .unwrap_or_else(|| opts.public_prompts.clone()),
                    num_prompts: Some(reference_records.len()),
                    max_tokens: opts.capture_max_tokens,
                    seed: opts.seed,
                    output_dir: opts.output_dir.clone(),
                    show_progress: opts.show_progress,
                    request_timeout: opts.request_timeout,
                    wait_ready: None,
                },
                enc,
            )?;
            Some(compare_captures(&cap.records, &reference_records))
        }
        _ => None,
    };

    let m = Measurements {
        public: public_stats,
        private: private_stats,
        ppl: ppl.summary.ppl,
        identity,
    };
    let (verdict, checks) = decide(
        &m,
        opts.ppl_cap,
        opts.tps_tolerance,
        opts.spread_tolerance,
        opts.repeats,
    );
    let (timestamp, unix_time) = util::now_stamp();
    let report = VerifyReport {
        verdict,
        reasons: checks
            .iter()
            .filter(|c| c.status == CheckStatus::Fail)
            .map(|c| format!("{}: {}", c.name, c.detail))
            .collect(),
        not_checked: checks
            .iter()
            .filter(|c| c.status == CheckStatus::NotChecked)
            .map(|c| format!("{}: {}", c.name, c.detail))
            .collect(),
        checks,
        tps_gap: m.private.median_tps / m.public.median_tps - 1.0,
        public: m.public,
        private: m.private,
        ppl: m.ppl,
        ppl_cap: opts.ppl_cap.cap(),
        ppl_cap_rule: opts.ppl_cap,
        identity: m.identity,
        model,
        base_url: client.base_url().to_string(),
        repeats: opts.repeats,
        tps_tolerance: opts.tps_tolerance,
        spread_tolerance: opts.spread_tolerance,
        timestamp,
        unix_time,
    };
    if let Some(dir) = &opts.output_dir {
        report.write(dir)?;
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meas(public: &[f64], private: &[f64], ppl: f64) -> Measurements {
        Measurements {
            public: SetStats::from_runs("public", "p", 10, public, 0),
            private: SetStats::from_runs("private", "q", 10, private, 0),
            ppl,
            identity: None,
        }
    }

    #[test]
    fn set_stats_spread() {
        let s = SetStats::from_runs("public", "x", 4, &[100.0, 104.0, 98.0], 0);
        assert_eq!(s.median_tps, 100.0);
        assert!((s.spread - 0.06).abs() < 1e-12);
    }

    #[test]
    fn verdict_rules() {
        let cap = PplCap::reference(2.30);
        assert!((cap.cap() - 2.415).abs() < 1e-12);
        let (v, checks) = decide(
            &meas(&[100.0, 101.0, 100.5], &[97.0, 96.5, 97.5], 2.40),
            cap,
            0.05,
            0.05,
            3,
        );
        assert_eq!(v, Verdict::Valid, "{checks:?}");
        assert_eq!(
            checks
                .iter()
                .filter(|c| c.status == CheckStatus::NotChecked)
                .count(),
            1
        );

        // Private 6% slower → invalid.
        let (v, checks) = decide(&meas(&[100.0], &[94.0], 2.0), cap, 0.05, 0.05, 1);
        assert_eq!(v, Verdict::Invalid);
        let failed: Vec<&str> = checks
            .iter()
            .filter(|c| c.status == CheckStatus::Fail)
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(failed, ["private_vs_public_tps"]);

        // PPL over the cap.
        let (v, _) = decide(&meas(&[100.0], &[100.0], 2.42), cap, 0.05, 0.05, 1);
        assert_eq!(v, Verdict::Invalid);
        assert_eq!(
            decide(
                &meas(&[100.0], &[100.0], 2.42),
                PplCap::Absolute(2.5),
                0.05,
                0.05,
                1
            )
            .0,
            Verdict::Valid
        );

        // Noisy repeats.
        let (v, checks) = decide(
            &meas(&[100.0, 90.0, 100.0], &[98.0, 99.0, 98.0], 2.0),
            cap,
            0.05,
            0.05,
            3,
        );
        assert_eq!(v, Verdict::Invalid);
        assert!(checks
            .iter()
            .any(|c| c.name == "run_spread_public" && c.status == CheckStatus::Fail));

        // Failed requests and identity.
        let mut m = meas(&[100.0], &[100.0], 2.0);
        m.public.failed_requests = 1;
        assert_eq!(decide(&m, cap, 0.05, 0.05, 1).0, Verdict::Invalid);
        let mut m = meas(&[100.0], &[100.0], 2.0);
        m.identity = Some(IdentityResult {
            verdict: IdentityVerdict::Divergent,
            num_records_a: 1,
            num_records_b: 1,
            num_compared: 1,
            num_identical: 0,
            divergent: vec![],
            earliest: None,
            only_in_a: vec![],
            only_in_b: vec![],
            prompt_mismatch: vec![],
        });
        let (v, checks) = decide(&m, cap, 0.05, 0.05, 1);
        assert_eq!(v, Verdict::Invalid);
        assert!(checks
            .iter()
            .any(|c| c.name == "greedy_identity" && c.detail.starts_with("DIVERGENT")));
    }

    #[test]
    fn derived_private_set_is_a_disjoint_half() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("p.json");
        let recs: Vec<serde_json::Value> = (0..7)
            .map(|i| serde_json::json!({"id": format!("q{i}"), "conversations": [{"from": "human", "value": format!("question {i}")}]}))
            .collect();
        std::fs::write(&path, serde_json::to_string(&recs).unwrap()).unwrap();
        let opts = VerifyOptions {
            public_prompts: path,
            ..VerifyOptions::default()
        };
        let (a, b) = prompt_sets(&opts).unwrap();
        assert_eq!((a.prompts.len(), b.prompts.len()), (4, 3));
        assert!(a.prompts.iter().all(|p| !b.prompts.contains(p)));
        assert!(b.source.contains("second half"));
        // Deterministic.
        assert_eq!(prompt_sets(&opts).unwrap().0, a);
    }
}
