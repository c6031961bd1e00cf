//! Verify end to end against the mock server, then the report over the written results tree.

mod common;

use std::time::Duration;

use common::{models, MockResponse, MockServer};
use hayai_bench::capture::{run_capture, CaptureOptions};
use hayai_bench::registry::{collect_environment, run_dir};
use hayai_bench::report::{run_report, ReportOptions};
use hayai_bench::verify::{run_verify, CheckStatus, PplCap, Verdict, VerifyOptions};
use serde_json::{json, Value};

/// Chat: 16 tokens per request, slow (60 ms) for prompts mentioning PRIVATE, else 20 ms.
/// Completions: prompt_logprobs (every token at -ln 2) or greedy ids depending on the request.
fn server() -> MockServer {
    MockServer::start(|req| match req.path.as_str() {
        "/v1/models" => models("verify-model"),
        "/v1/chat/completions" => {
            let content = req.body["messages"][0]["content"].as_str().unwrap_or("");
            let n = req.body["max_tokens"].as_u64().unwrap();
            let slow = content.contains("PRIVATE") && n != 32;
            std::thread::sleep(Duration::from_millis(if slow { 60 } else { 20 }));
            MockResponse::Json(
                200,
                json!({"choices": [{"message": {"content": "x"}}],
                                            "usage": {"prompt_tokens": 5, "completion_tokens": n}}),
            )
        }
        "/v1/completions" => {
            let prompt: Vec<u64> = req.body["prompt"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap())
                .collect();
            if req.body.get("prompt_logprobs").is_some() {
                let mut plp = vec![Value::Null];
                for t in &prompt[1..] {
                    plp.push(json!({ t.to_string(): {"logprob": -std::f64::consts::LN_2} }));
                }
                MockResponse::Json(
                    200,
                    json!({"choices": [{"prompt_logprobs": plp, "token_ids": [1]}]}),
                )
            } else {
                let n = req.body["max_tokens"].as_u64().unwrap();
                let s: u64 = prompt.iter().sum();
                let ids: Vec<u64> = (0..n).map(|i| (s + i) % 500).collect();
                MockResponse::Json(200, json!({"choices": [{"token_ids": ids}]}))
            }
        }
        _ => MockResponse::Json(404, json!({})),
    })
}

fn write_prompts(path: &std::path::Path, tag: &str, n: usize) {
    let v: Vec<Value> = (0..n)
        .map(|i| json!({"id": format!("{tag}-{i}"), "conversations": [{"from": "human", "value": format!("{tag} question {i}")}]}))
        .collect();
    std::fs::write(path, serde_json::to_string(&v).unwrap()).unwrap();
}

fn encoder(text: &str) -> anyhow::Result<Vec<u32>> {
    let mut ids = vec![2u32];
    ids.extend(text.bytes().map(u32::from));
    Ok(ids)
}

#[test]
fn verify_then_report() {
    let s = server();
    let tmp = tempfile::tempdir().unwrap();
    let public = tmp.path().join("public.json");
    let private_same = tmp.path().join("private_same.json");
    let private_slow = tmp.path().join("private_slow.json");
    write_prompts(&public, "public", 4);
    write_prompts(&private_same, "other", 4);
    write_prompts(&private_slow, "PRIVATE", 4);
    let records = tmp.path().join("ppl.jsonl");
    std::fs::write(
        &records,
        "{\"id\":\"r\",\"context_token_ids\":[2,9],\"target_token_ids\":[7,8,9,10]}\n",
    )
    .unwrap();

    // Reference capture made beforehand (same server → must be identical).
    let reference = run_capture(
        &CaptureOptions {
            base_url: s.url.clone(),
            prompts: public.clone(),
            max_tokens: 6,
            output_dir: Some(tmp.path().join("ref")),
            show_progress: false,
            ..CaptureOptions::default()
        },
        &encoder,
    )
    .unwrap();
    assert_eq!(reference.records.len(), 4);

    let results = tmp.path().join("results");
    let base = VerifyOptions {
        base_url: s.url.clone(),
        public_prompts: public.clone(),
        private_prompts: Some(private_same.clone()),
        repeats: 2,
        num_prompts: 4,
        output_len: 16,
        warmup_requests: 2,
        ppl_records: records.clone(),
        ppl_cap: PplCap::Absolute(2.05),
        // Generous tolerances: the mock's timing is only roughly stable.
        tps_tolerance: 0.3,
        spread_tolerance: 0.5,
        reference_capture: Some(tmp.path().join("ref/decode_outputs.jsonl")),
        capture_max_tokens: 6,
        show_progress: false,
        ..VerifyOptions::default()
    };

    let dir_ok = run_dir(&results, "good").unwrap();
    let ok = run_verify(
        &VerifyOptions {
            output_dir: Some(dir_ok.clone()),
            ..base.clone()
        },
        Some(&encoder),
    )
    .unwrap();
    assert_eq!(ok.verdict, Verdict::Valid, "{}", ok.render());
    assert!((ok.ppl - 2.0).abs() < 1e-9, "every token at -ln 2 → PPL 2");
    assert_eq!(ok.public.tps_runs.len(), 2);
    assert_eq!(ok.identity.as_ref().unwrap().num_identical, 4);
    assert!(ok.reasons.is_empty() && ok.not_checked.is_empty());
    for f in [
        "verify.json",
        "ppl_summary.json",
        "decode_outputs.jsonl",
        "verify_runs/private-2/summary.json",
    ] {
        assert!(dir_ok.join(f).exists(), "{f}");
    }
    collect_environment(Some(&s.url), json!({"verify": true}))
        .write(&dir_ok)
        .unwrap();
    let env: Value = serde_json::from_str(
        &std::fs::read_to_string(dir_ok.join("run_environment.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(env["server_models"]["data"][0]["id"], "verify-model");

    // A private set that is 3x slower fails the ±tolerance rule; the cap fails too.
    let dir_bad = run_dir(&results, "bad").unwrap();
    let bad = run_verify(
        &VerifyOptions {
            private_prompts: Some(private_slow),
            ppl_cap: PplCap::reference(1.9), // 1.995 < 2.0
            reference_capture: None,
            output_dir: Some(dir_bad.clone()),
            ..base.clone()
        },
        None,
    )
    .unwrap();
    assert_eq!(bad.verdict, Verdict::Invalid);
    let failed: Vec<&str> = bad
        .checks
        .iter()
        .filter(|c| c.status == CheckStatus::Fail)
        .map(|c| c.name.as_str())
        .collect();
    assert!(
        failed.contains(&"private_vs_public_tps") && failed.contains(&"ppl_under_cap"),
        "{failed:?}"
    );
    assert!(bad.tps_gap < -0.5, "{}", bad.tps_gap);
    assert_eq!(bad.not_checked.len(), 1);
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(dir_bad.join("verify.json")).unwrap())
            .unwrap();
    assert_eq!(v["verdict"], "INVALID");
    assert!(v["reasons"].as_array().unwrap().len() >= 2);

    // Reference capture without an encoder is refused up front.
    assert!(run_verify(&base, None).is_err());

    let rep = run_report(&ReportOptions {
        results_root: results.clone(),
        markdown_out: Some(results.join("LEADERBOARD.md")),
        svg_out: Some(results.join("evolution.svg")),
    })
    .unwrap();
    assert_eq!(rep.entries.len(), 2);
    // Both runs' public halves are equally fast, so only check content and the TPS ordering.
    assert!(rep.entries[0].tps.unwrap() >= rep.entries[1].tps.unwrap());
    let verdict = |run: &str| {
        rep.entries
            .iter()
            .find(|e| e.run == run)
            .unwrap()
            .verdict
            .clone()
    };
    assert_eq!(verdict("good").as_deref(), Some("VALID"));
    assert_eq!(verdict("bad").as_deref(), Some("INVALID"));
    let good = rep.entries.iter().find(|e| e.run == "good").unwrap();
    assert!((good.tps.unwrap() - ok.public.median_tps).abs() < 1e-9);
    assert!((good.ppl.unwrap() - 2.0).abs() < 1e-9);
    assert!(rep.markdown.contains("| good |") && rep.svg.contains("<circle"));
}
