//! The real Gemma 3 270M behind `hayai serve` (CPU): the server's greedy token ids equal
//! `hayai generate`, endpoint perplexity equals in-process perplexity, and concurrent requests
//! are all served.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

fn model() -> String {
    let p = hayai_core::cache::real_model_path();
    assert!(p.exists(), "real model missing at {}", p.display());
    p.display().to_string()
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

struct Server {
    child: Child,
    base: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_server() -> Server {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(env!("CARGO_BIN_EXE_hayai"))
        .args(["serve", "--device", "cpu", "--port", &port.to_string()])
        .args(["--served-model-name", "g3", "--model", &model()])
        .env("HAYAI_QUIET", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let t0 = Instant::now();
    while ureq::get(&format!("{base}/v1/models")).call().is_err() {
        assert!(t0.elapsed() < Duration::from_secs(120), "server not ready");
        std::thread::sleep(Duration::from_millis(200));
    }
    Server { child, base }
}

fn post(base: &str, path: &str, body: Value) -> Value {
    let mut resp = ureq::post(&format!("{base}{path}"))
        .send_json(&body)
        .unwrap();
    resp.body_mut().read_json().unwrap()
}

#[test]
fn server_matches_cli_and_in_process() {
    let s = start_server();
    let prompt = [2u32, 14946, 3324, 496, 990, 236764, 528, 496, 1944, 9744];

    // 1. Greedy ids from the server equal `hayai generate`.
    let r = post(
        &s.base,
        "/v1/completions",
        json!({"model": "g3", "prompt": prompt, "max_tokens": 24, "temperature": 0.0,
               "ignore_eos": true, "add_special_tokens": false, "return_token_ids": true}),
    );
    let served: Vec<u64> = serde_json::from_value(r["choices"][0]["token_ids"].clone()).unwrap();
    let ids = prompt
        .iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let out = Command::new(env!("CARGO_BIN_EXE_hayai"))
        .args([
            "generate",
            "--device",
            "cpu",
            "--model",
            &model(),
            "--prompt-ids",
            &ids,
        ])
        .args(["--max-tokens", "24", "--ignore-eos", "--json"])
        .env("HAYAI_QUIET", "1")
        .output()
        .unwrap();
    assert!(out.status.success());
    let cli: Value = serde_json::from_slice(&out.stdout).unwrap();
    let cli: Vec<u64> = serde_json::from_value(cli["ids"].clone()).unwrap();
    assert_eq!(served, cli);
    assert_eq!(r["usage"]["completion_tokens"], 24);

    // 2. Endpoint PPL (harness) equals in-process PPL on one record.
    let dir = tempfile::tempdir().unwrap();
    let rec = std::fs::read_to_string(repo().join("data/reference/apache-2.0-ppl-records.jsonl"))
        .unwrap();
    let one = dir.path().join("one.jsonl");
    std::fs::write(&one, rec.lines().nth(1).unwrap()).unwrap();
    let ppl = |extra: &[&str]| -> f64 {
        let out = Command::new(env!("CARGO_BIN_EXE_hayai"))
            .args([
                "ppl",
                "--device",
                "cpu",
                "--model",
                &model(),
                "--json",
                "--records",
            ])
            .arg(&one)
            .args(extra)
            .env("HAYAI_QUIET", "1")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v["ppl"].as_f64().unwrap()
    };
    let local = ppl(&[]);
    let remote = ppl(&["--base-url", &s.base]);
    assert!(
        (local / remote - 1.0).abs() < 1e-5,
        "in-process {local} vs endpoint {remote}"
    );

    // 3. Four concurrent chat requests (the benchmark's warm-up) all succeed.
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let base = s.base.clone();
            std::thread::spawn(move || {
                post(
                    &base,
                    "/v1/chat/completions",
                    json!({"model": "g3", "messages": [{"role": "user", "content": format!("Count to {i}")}],
                           "max_tokens": 8, "temperature": 0.0, "ignore_eos": true}),
                )
            })
        })
        .collect();
    for h in handles {
        let v = h.join().unwrap();
        assert_eq!(v["usage"]["completion_tokens"], 8, "{v}");
    }
    // The server is still healthy and says so in its metrics.
    let mut m = ureq::get(&format!("{}/metrics", s.base)).call().unwrap();
    let text = m.body_mut().read_to_string().unwrap();
    let served_ok = BufReader::new(text.as_bytes())
        .lines()
        .map_while(Result::ok)
        .any(|l| {
            l.starts_with(
                "hayai_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"} 4",
            )
        });
    assert!(served_ok, "{text}");
}
