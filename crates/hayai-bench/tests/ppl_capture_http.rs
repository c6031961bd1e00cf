//! PPL and capture/identity against the in-test mock server.

mod common;

use std::path::Path;

use common::{models, sharegpt_file, MockResponse, MockServer};
use hayai_bench::capture::{load_capture, run_capture, CaptureOptions};
use hayai_bench::identity::{compare_capture_files, IdentityVerdict};
use hayai_bench::ppl::{run_ppl, PplOptions};
use hayai_bench::Error;
use serde_json::{json, Value};

/// The mock's "model": logprob of token t at any position is -t/10 (so it is hand-computable).
fn prompt_logprobs_for(prompt: &[u64]) -> Value {
    let mut v = vec![Value::Null];
    for &t in &prompt[1..] {
        // Top-1 entry plus the actual token, vLLM style.
        v.push(json!({ t.to_string(): {"logprob": -(t as f64) / 10.0, "rank": 3}, "1": {"logprob": -0.01, "rank": 1} }));
    }
    Value::Array(v)
}

fn ppl_server(corrupt: Option<&'static str>) -> MockServer {
    MockServer::start(move |req| match req.path.as_str() {
        "/v1/models" => models("ppl-model"),
        "/v1/completions" => {
            let prompt: Vec<u64> = req.body["prompt"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap())
                .collect();
            let mut plp = prompt_logprobs_for(&prompt);
            if corrupt == Some("short") && prompt.contains(&77) {
                plp.as_array_mut().unwrap().pop();
            }
            if corrupt == Some("status") && prompt.contains(&77) {
                return MockResponse::Json(
                    400,
                    json!({"error": {"message": "prompt too long", "type": "invalid_request_error"}}),
                );
            }
            if corrupt == Some("missing") && prompt.contains(&77) {
                plp[2] = json!({"1": {"logprob": -0.1}});
            }
            if corrupt == Some("notjson") && prompt.contains(&77) {
                return MockResponse::Raw(200, "{\"choices\": [".into());
            }
            MockResponse::Json(
                200,
                json!({"choices": [{"text": "x", "prompt_logprobs": plp, "prompt_token_ids": prompt, "token_ids": [5]}],
                                            "usage": {"prompt_tokens": prompt.len(), "completion_tokens": 1}}),
            )
        }
        _ => MockResponse::Json(404, json!({})),
    })
}

fn write_records(dir: &Path) -> std::path::PathBuf {
    let p = dir.join("records.jsonl");
    std::fs::write(
        &p,
        "{\"id\":\"r1\",\"context_token_ids\":[2,105,30],\"target_token_ids\":[10,20]}\n\
         {\"id\":\"r2\",\"context_token_ids\":[2,77],\"target_token_ids\":[5]}\n",
    )
    .unwrap();
    p
}

#[test]
fn ppl_matches_hand_computation() {
    let server = ppl_server(None);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let r = run_ppl(&PplOptions {
        base_url: format!("{}/v1", server.url),
        records: write_records(dir.path()),
        output_dir: Some(out.clone()),
        show_progress: false,
        ..PplOptions::default()
    })
    .unwrap();
    // r1 targets 10, 20 → NLL 1 + 2; r2 target 5 → 0.5. Context tokens are not scored.
    let expected = (3.5f64 / 3.0).exp();
    assert!(
        (r.summary.ppl - expected).abs() < 1e-12,
        "{}",
        r.summary.ppl
    );
    assert_eq!(r.summary.ppl_num_tokens, 3);
    assert_eq!(r.summary.num_records, 2);
    assert_eq!(r.summary.model, "ppl-model");
    let mean = ((3.0f64 / 2.0).exp() + 0.5f64.exp()) / 2.0;
    assert!((r.summary.mean_record_ppl - mean).abs() < 1e-12);
    assert!((r.records[0].nll - 3.0).abs() < 1e-12);

    // One sequential request per record, body exactly as the contract.
    let reqs = server.requests_to("/v1/completions");
    assert_eq!(reqs.len(), 2);
    assert_eq!(
        reqs[0].body,
        json!({"model": "ppl-model", "prompt": [2, 105, 30, 10, 20], "max_tokens": 1, "temperature": 0.0,
               "stream": false, "prompt_logprobs": 1, "add_special_tokens": false, "return_token_ids": true})
    );

    let s: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("ppl_summary.json")).unwrap())
            .unwrap();
    for k in [
        "ppl",
        "ppl_num_tokens",
        "mean_record_ppl",
        "num_records",
        "model",
        "base_url",
        "records_file",
    ] {
        assert!(s.get(k).is_some(), "missing {k}");
    }
    let lines: Vec<Value> = std::fs::read_to_string(out.join("ppl_records.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[1]["id"], "r2");
    assert_eq!(lines[1]["num_tokens"], 1);
}

#[test]
fn malformed_ppl_responses_abort_naming_the_record() {
    for (mode, want) in [
        ("short", "has 2 entries"),
        ("status", "prompt too long"),
        ("missing", "prompt_logprobs[2] lacks the actual token 5"),
        ("notjson", "not JSON"),
    ] {
        let server = ppl_server(Some(mode));
        let dir = tempfile::tempdir().unwrap();
        let e = run_ppl(&PplOptions {
            base_url: server.url.clone(),
            model: Some("m".into()),
            records: write_records(dir.path()),
            show_progress: false,
            ..PplOptions::default()
        })
        .unwrap_err();
        assert!(matches!(e, Error::PplResponse { .. }), "{mode}: {e}");
        let msg = e.to_string();
        assert!(msg.contains("r2") && msg.contains(want), "{mode}: {msg}");
    }
}

#[test]
fn malformed_record_file_aborts_before_any_request() {
    let server = ppl_server(None);
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.jsonl");
    std::fs::write(&p, "{\"id\":\"ok\",\"context_token_ids\":[2],\"target_token_ids\":[3]}\n{\"id\":\"bad\",\"context_token_ids\":[5],\"target_token_ids\":[3]}\n").unwrap();
    let e = run_ppl(&PplOptions {
        base_url: server.url.clone(),
        records: p,
        show_progress: false,
        ..PplOptions::default()
    })
    .unwrap_err();
    assert!(
        e.to_string().contains("bad") && e.to_string().contains("line 2"),
        "{e}"
    );
    assert!(server.requests_to("/v1/completions").is_empty());
}

/// Deterministic fake greedy decoder: output depends only on the prompt ids; `perturb` flips one
/// token for prompts containing the byte of 'Q'.
fn capture_server(perturb: bool) -> MockServer {
    MockServer::start(move |req| match req.path.as_str() {
        "/v1/models" => models("cap-model"),
        "/v1/completions" => {
            let b = &req.body;
            assert_eq!(b["add_special_tokens"], false);
            assert_eq!(b["return_token_ids"], true);
            assert_eq!(b["ignore_eos"], true);
            assert_eq!(b["temperature"], 0.0);
            let prompt: Vec<u64> = b["prompt"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap())
                .collect();
            let n = b["max_tokens"].as_u64().unwrap();
            let seed: u64 = prompt.iter().sum();
            let mut ids: Vec<u64> = (0..n).map(|i| (seed * 31 + i * 7) % 1000).collect();
            if perturb && prompt.contains(&(b'Q' as u64)) {
                ids[3] += 1;
            }
            MockResponse::Json(
                200,
                json!({"choices": [{"text": "", "token_ids": ids, "finish_reason": "length"}],
                                            "usage": {"prompt_tokens": prompt.len(), "completion_tokens": n}}),
            )
        }
        _ => MockResponse::Json(404, json!({})),
    })
}

fn encoder(text: &str) -> anyhow::Result<Vec<u32>> {
    // Stand-in for the chat template: BOS, turn marker, bytes, end marker.
    let mut ids = vec![2, 105];
    ids.extend(text.bytes().map(u32::from));
    ids.push(106);
    Ok(ids)
}

#[test]
fn capture_identity_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let prompts = sharegpt_file(
        dir.path(),
        &[
            ("p0", "alpha"),
            ("p1", "Question?"),
            ("p2", "gamma"),
            ("p3", "delta"),
            ("p4", "eps"),
        ],
    );
    let run = |server: &MockServer, name: &str, n: Option<usize>| {
        let out = dir.path().join(name);
        let r = run_capture(
            &CaptureOptions {
                base_url: server.url.clone(),
                prompts: prompts.clone(),
                num_prompts: n,
                max_tokens: 8,
                output_dir: Some(out.clone()),
                show_progress: false,
                ..CaptureOptions::default()
            },
            &encoder,
        )
        .unwrap();
        (r, out.join("decode_outputs.jsonl"))
    };
    let s1 = capture_server(false);
    let (r1, f1) = run(&s1, "a", None);
    assert_eq!(r1.records.len(), 5);
    assert_eq!(r1.summary.total_tokens, 40);
    // Seed-1 shuffle of 5 prompts, in the order the (CPython-compatible) generator gives.
    let order: Vec<String> = r1.records.iter().map(|r| r.id.clone()).collect();
    let want: Vec<String> = hayai_bench::rng::shuffled_indices(5, 1)
        .iter()
        .map(|i| format!("p{i}"))
        .collect();
    assert_eq!(order, want);
    let reqs = s1.requests_to("/v1/completions");
    assert_eq!(reqs[0].body["prompt"][0], 2);
    assert_eq!(reqs[0].body["max_tokens"], 8);
    let loaded = load_capture(&f1).unwrap();
    assert_eq!(loaded, r1.records);
    assert_eq!(
        loaded[0].sha256,
        hayai_bench::util::ids_sha256(&loaded[0].token_ids)
    );

    let (_, f2) = run(&capture_server(false), "b", None);
    let same = compare_capture_files(&f1, &f2).unwrap();
    assert_eq!(same.verdict, IdentityVerdict::GreedyIdentical);
    assert_eq!(same.num_identical, 5);

    let (_, f3) = run(&capture_server(true), "c", None);
    let diff = compare_capture_files(&f1, &f3).unwrap();
    assert_eq!(diff.verdict, IdentityVerdict::Divergent);
    assert_eq!(diff.divergent.len(), 1);
    let e = diff.earliest.unwrap();
    assert_eq!((e.id.as_str(), e.first_diff_index), ("p1", 3));

    let (_, f4) = run(&capture_server(false), "d", Some(3));
    assert_eq!(
        compare_capture_files(&f1, &f4).unwrap().verdict,
        IdentityVerdict::Incomparable
    );
}

#[test]
fn capture_fails_loudly() {
    let dir = tempfile::tempdir().unwrap();
    let prompts = sharegpt_file(dir.path(), &[("p0", "alpha")]);
    let server = MockServer::start(|req| match req.path.as_str() {
        "/v1/models" => models("m"),
        _ => MockResponse::Json(200, json!({"choices": [{"text": "no ids"}]})),
    });
    let opts = CaptureOptions {
        base_url: server.url.clone(),
        prompts,
        show_progress: false,
        ..CaptureOptions::default()
    };
    let e = run_capture(&opts, &encoder).unwrap_err().to_string();
    assert!(e.contains("p0") && e.contains("token_ids"), "{e}");
    let failing = |_: &str| -> anyhow::Result<Vec<u32>> { anyhow::bail!("no chat template") };
    let e = run_capture(&opts, &failing).unwrap_err().to_string();
    assert!(e.contains("p0") && e.contains("no chat template"), "{e}");
}
