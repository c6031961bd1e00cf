//! The results registry: `results/<run-name>/` directories holding a run's outputs
//! (`summary.json`, `benchmark.jsonl`, `ppl_summary.json`, `ppl_records.jsonl`,
//! `decode_outputs.jsonl`, `capture_summary.json`, `verify.json`) plus `run_environment.json`
//! describing where and how the run was made.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::http::Client;
use crate::util;

/// Check a run name (`[A-Za-z0-9._-]+`, not `.`/`..`) and create `results_root/<run_name>/`.
pub fn run_dir(results_root: &Path, run_name: &str) -> Result<PathBuf> {
    let valid = !run_name.is_empty()
        && run_name != "."
        && run_name != ".."
        && run_name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if !valid {
        return Err(Error::Options(format!(
            "run name {run_name:?} must be non-empty and use only letters, digits, '.', '_' and '-'"
        )));
    }
    let dir = results_root.join(run_name);
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    Ok(dir)
}

/// `<prefix>-YYYYMMDDTHHMMSSZ`, a default run name.
pub fn default_run_name(prefix: &str) -> String {
    let (ts, _) = util::now_stamp();
    let compact: String = ts.chars().filter(|c| *c != '-' && *c != ':').collect();
    format!("{prefix}-{compact}")
}

/// `run_environment.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunEnvironment {
    pub timestamp: String,
    pub unix_time: f64,
    pub hostname: Option<String>,
    pub os: Option<String>,
    pub kernel: Option<String>,
    pub cpu_model: Option<String>,
    pub cpu_count: usize,
    /// One line per GPU from `nvidia-smi` (name, memory, driver), empty when there is none.
    pub gpus: Vec<String>,
    pub git_commit: Option<String>,
    pub git_dirty: Option<bool>,
    /// The process command line.
    pub command_line: Vec<String>,
    /// The run's options as the caller describes them.
    pub flags: Value,
    pub base_url: Option<String>,
    /// `GET /v1/models` of the server under test (or `{"error": ...}`).
    pub server_models: Option<Value>,
    pub harness_version: String,
}

impl RunEnvironment {
    /// Write `run_environment.json` into `dir`.
    pub fn write(&self, dir: &Path) -> Result<()> {
        util::write_json(&dir.join("run_environment.json"), self)
    }
}

fn command_stdout(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

fn os_pretty_name() -> Option<String> {
    let text = std::fs::read_to_string("/etc/os-release").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|v| v.trim_matches('"').to_string())
        .or_else(|| Some(std::env::consts::OS.to_string()))
}

fn cpu_model() -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    text.lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
}

/// Gather the environment. `base_url`, when given, is queried for `/v1/models` (10 s timeout).
pub fn collect_environment(base_url: Option<&str>, flags: Value) -> RunEnvironment {
    let (timestamp, unix_time) = util::now_stamp();
    let gpus = command_stdout(
        "nvidia-smi",
        &[
            "--query-gpu=name,memory.total,driver_version",
            "--format=csv,noheader",
        ],
    )
    .map(|s| s.lines().map(|l| l.trim().to_string()).collect())
    .unwrap_or_default();
    let git_commit = command_stdout("git", &["rev-parse", "HEAD"]);
    // `command_stdout` is `None` for empty output, i.e. a clean tree.
    let git_dirty = git_commit.as_ref().map(|_| {
        command_stdout("git", &["status", "--porcelain", "--untracked-files=no"]).is_some()
    });
    let server_models = base_url.map(|u| {
        match Client::new(u, Some(Duration::from_secs(10))).and_then(|c| c.get_json("/v1/models")) {
            Ok(v) => v,
            Err(e) => serde_json::json!({"error": e.to_string()}),
        }
    });
    RunEnvironment {
        timestamp,
        unix_time,
        hostname: read_trimmed("/proc/sys/kernel/hostname")
            .or_else(|| command_stdout("hostname", &[])),
        os: os_pretty_name(),
        kernel: read_trimmed("/proc/sys/kernel/osrelease"),
        cpu_model: cpu_model(),
        cpu_count: std::thread::available_parallelism().map_or(0, |n| n.get()),
        gpus,
        git_commit,
        git_dirty,
        command_line: std::env::args().collect(),
        flags,
        base_url: base_url.map(str::to_string),
        server_models,
        harness_version: env!("CARGO_PKG_VERSION").to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_names_are_validated() {
        let tmp = tempfile::tempdir().unwrap();
        let d = run_dir(tmp.path(), "gemma3-270m_q4.run-1").unwrap();
        assert!(d.is_dir());
        for bad in ["", ".", "..", "a/b", "x y", "../up"] {
            assert!(run_dir(tmp.path(), bad).is_err(), "{bad:?}");
        }
        let n = default_run_name("bench");
        assert!(
            n.starts_with("bench-") && n.ends_with('Z') && !n.contains(':'),
            "{n}"
        );
    }

    #[test]
    fn environment_is_collected_and_serialises() {
        let env = collect_environment(None, serde_json::json!({"num_prompts": 128}));
        assert!(env.cpu_count >= 1);
        assert_eq!(env.flags["num_prompts"], 128);
        assert!(env.server_models.is_none());
        let tmp = tempfile::tempdir().unwrap();
        env.write(tmp.path()).unwrap();
        let back: RunEnvironment = serde_json::from_str(
            &std::fs::read_to_string(tmp.path().join("run_environment.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(back.hostname, env.hostname);
        assert_eq!(back.flags, env.flags);
        assert_eq!(back.timestamp, env.timestamp);
    }
}
