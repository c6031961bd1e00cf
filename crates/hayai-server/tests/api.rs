//! Endpoint tests against the deterministic toy runner, through the real router.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use common::*;
use hayai_engine::Engine;
use hayai_server::{build, router, AppState, ServerConfig, TextModel};
use serde_json::{json, Value};
use tower::ServiceExt;

struct Toy {
    app: Router,
    state: AppState,
    controls: Arc<Controls>,
}

const CTX: usize = 256;

fn toy_with(f: impl FnOnce(&mut ServerConfig)) -> Toy {
    let (runner, controls) = ToyRunner::new(CTX);
    let engine = Engine::new(Box::new(runner));
    let mut cfg = ServerConfig {
        served_model_name: "toy".into(),
        model_id: "/models/toy".into(),
        ..Default::default()
    };
    f(&mut cfg);
    let (state, _thread) = build(engine, Arc::new(ToyText), cfg).unwrap();
    Toy {
        app: router(state.clone()),
        state,
        controls,
    }
}

fn toy() -> Toy {
    toy_with(|_| {})
}

async fn send(app: &Router, req: Request<Body>) -> (StatusCode, Vec<u8>) {
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    (status, body.to_vec())
}

async fn post_raw(app: &Router, path: &str, body: impl Into<Body>) -> (StatusCode, Value) {
    let req = Request::post(path)
        .header("content-type", "application/json")
        .body(body.into())
        .unwrap();
    let (status, body) = send(app, req).await;
    let v = serde_json::from_slice(&body).unwrap_or_else(|_| {
        panic!(
            "non-JSON body ({status}): {}",
            String::from_utf8_lossy(&body)
        )
    });
    (status, v)
}

async fn post(app: &Router, path: &str, body: Value) -> (StatusCode, Value) {
    post_raw(app, path, body.to_string()).await
}

async fn get(app: &Router, path: &str) -> (StatusCode, String) {
    let (s, b) = send(app, Request::get(path).body(Body::empty()).unwrap()).await;
    (s, String::from_utf8(b).unwrap())
}

/// POST a streaming request and return the `data:` payloads, checking SSE framing.
async fn sse(app: &Router, path: &str, body: Value) -> Vec<String> {
    let req = Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let (status, body) = send(app, req).await;
    let text = String::from_utf8(body).unwrap();
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(text.ends_with("\n\n"), "events end with a blank line");
    let mut out = Vec::new();
    for event in text.split("\n\n").filter(|e| !e.is_empty()) {
        assert!(event.starts_with("data: "), "bad SSE event {event:?}");
        assert!(!event[6..].contains('\n'), "one data line per event");
        out.push(event[6..].to_string());
    }
    assert_eq!(out.last().map(String::as_str), Some("[DONE]"));
    out
}

fn assert_error(status: StatusCode, v: &Value, want: StatusCode) {
    assert_eq!(status, want, "{v}");
    let e = &v["error"];
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    assert!(e["type"].is_string(), "{v}");
    assert!(e.get("param").is_some(), "{v}");
    assert!(e["code"].is_string(), "{v}");
}

async fn wait_until(what: &str, f: impl Fn() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "timed out waiting: {what}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn encode(text: &str, bos: bool) -> Vec<u32> {
    ToyText.encode(text, bos).unwrap()
}

fn decode(ids: &[u32]) -> String {
    ToyText.decode(ids)
}

/// A one-character prompt (after BOS) whose greedy continuation satisfies `pred`.
fn find_prompt(n: usize, pred: impl Fn(&[u32]) -> bool) -> String {
    for c in ALPHABET.chars().filter(|c| c.is_ascii_alphabetic()) {
        for d in ALPHABET.chars().filter(|c| c.is_ascii_alphabetic()) {
            let p = format!("{c}{d}");
            if pred(&greedy(&encode(&p, true), n, &[EOS, TURN])) {
                return p;
            }
        }
    }
    panic!("no prompt found");
}

#[tokio::test]
async fn models_health_and_metrics() {
    let t = toy();
    let (s, body) = get(&t.app, "/v1/models").await;
    assert_eq!(s, StatusCode::OK);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], "toy");
    assert_eq!(v["data"][0]["object"], "model");
    assert_eq!(v["data"][0]["owned_by"], "hayai");
    assert_eq!(v["data"][0]["root"], "/models/toy");
    assert_eq!(v["data"][0]["max_model_len"], CTX);

    // models.retrieve, by served name or by id (which may contain slashes).
    for name in ["toy", "models/toy"] {
        let (s, body) = get(&t.app, &format!("/v1/models/{name}")).await;
        let v: Value = serde_json::from_str(&body).unwrap();
        if name == "toy" {
            assert_eq!(s, StatusCode::OK);
            assert_eq!(v["id"], "toy");
        } else {
            assert_error(s, &v, StatusCode::NOT_FOUND);
        }
    }
    let (s, body) = get(&t.app, "/v1/models//models/toy").await;
    assert_eq!(s, StatusCode::OK, "{body}");
    let (s, body) = get(&t.app, "/version").await;
    assert_eq!(s, StatusCode::OK);
    assert!(body.contains("version"));

    let (s, body) = get(&t.app, "/health").await;
    assert_eq!(s, StatusCode::OK);
    assert!(body.contains("\"ok\""));

    let (s, _) = post(
        &t.app,
        "/v1/completions",
        json!({"model": "toy", "prompt": "ab", "max_tokens": 5, "temperature": 0, "ignore_eos": true}),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    let (s, _) = post(
        &t.app,
        "/v1/completions",
        json!({"model": "nope", "prompt": "a"}),
    )
    .await;
    assert_eq!(s, StatusCode::NOT_FOUND);

    let (s, m) = get(&t.app, "/metrics").await;
    assert_eq!(s, StatusCode::OK);
    for needle in [
        "hayai_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 1\n",
        "hayai_requests_total{endpoint=\"/v1/completions\",status=\"404\"} 1\n",
        "hayai_requests_total{endpoint=\"/v1/models\",status=\"200\"} 1\n",
        "hayai_prompt_tokens_total 3\n",
        "hayai_generation_tokens_total 5\n",
        "hayai_queue_depth 0\n",
        "hayai_requests_running 0\n",
        "hayai_time_to_first_token_seconds_count 1\n",
        "hayai_inter_token_latency_seconds_count 4\n",
        "hayai_e2e_request_latency_seconds_count 1\n",
        "# TYPE hayai_recent_tokens_per_second gauge\n",
    ] {
        assert!(m.contains(needle), "missing {needle:?} in\n{m}");
    }
}

#[tokio::test]
async fn completion_text_prompt_is_greedy_decoding() {
    let t = toy();
    let prompt = encode("hello", true);
    let want = greedy(&prompt, 12, &[EOS, TURN]);
    let (s, v) = post(
        &t.app,
        "/v1/completions",
        json!({"model": "toy", "prompt": "hello", "max_tokens": 12, "temperature": 0.0,
               "return_token_ids": true}),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["model"], "toy");
    assert!(v["id"].as_str().unwrap().starts_with("cmpl-"));
    let c = &v["choices"][0];
    assert_eq!(c["index"], 0);
    assert_eq!(c["token_ids"], json!(want));
    assert_eq!(c["prompt_token_ids"], json!(prompt));
    assert_eq!(c["text"], decode(&want));
    let finish = if want.len() < 12 { "stop" } else { "length" };
    assert_eq!(c["finish_reason"], finish);
    assert_eq!(v["usage"]["prompt_tokens"], prompt.len());
    assert_eq!(v["usage"]["completion_tokens"], want.len());
    assert_eq!(v["usage"]["total_tokens"], prompt.len() + want.len());
}

#[tokio::test]
async fn completion_prompt_forms_and_add_special_tokens() {
    let t = toy();
    let ids = encode("abc", true);
    let mut outs = Vec::new();
    for prompt in [json!("abc"), json!(ids), json!([ids]), json!(["abc"])] {
        let (s, v) = post(
            &t.app,
            "/v1/completions",
            json!({"prompt": prompt, "max_tokens": 6, "temperature": 0, "ignore_eos": true,
                   "return_token_ids": true}),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{v}");
        assert_eq!(v["choices"][0]["prompt_token_ids"], json!(ids), "{prompt}");
        outs.push(v["choices"][0]["token_ids"].clone());
    }
    assert!(outs.iter().all(|o| *o == outs[0]));
    assert_eq!(outs[0], json!(greedy(&ids, 6, &[])));

    // Text without special tokens: no BOS. Id prompts never get one added.
    let (_, v) = post(
        &t.app,
        "/v1/completions",
        json!({"prompt": "abc", "max_tokens": 1, "add_special_tokens": false, "return_token_ids": true}),
    )
    .await;
    assert_eq!(
        v["choices"][0]["prompt_token_ids"],
        json!(encode("abc", false))
    );
    let (_, v) = post(
        &t.app,
        "/v1/completions",
        json!({"prompt": [10, 11], "max_tokens": 1, "add_special_tokens": true, "return_token_ids": true}),
    )
    .await;
    assert_eq!(v["choices"][0]["prompt_token_ids"], json!([10, 11]));
}

#[tokio::test]
async fn prompt_logprobs_follow_the_vllm_shape() {
    let t = toy();
    let prompt: Vec<u32> = encode("the quick fox", true);
    let (s, v) = post(
        &t.app,
        "/v1/completions",
        json!({"model": "toy", "prompt": prompt, "max_tokens": 1, "temperature": 0.0,
               "stream": false, "prompt_logprobs": 1, "add_special_tokens": false,
               "return_token_ids": true}),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let pl = v["choices"][0]["prompt_logprobs"].as_array().unwrap();
    assert_eq!(pl.len(), prompt.len());
    assert!(pl[0].is_null());
    for i in 1..prompt.len() {
        let entry = pl[i].as_object().unwrap();
        let actual = &entry[&prompt[i].to_string()];
        let want = logprob(prompt[i - 1], i - 1, prompt[i]);
        let got = actual["logprob"].as_f64().unwrap();
        assert!((got - want).abs() < 1e-5, "pos {i}: {got} vs {want}");
        assert_eq!(actual["decoded_token"], ToyText.token_text(prompt[i]));
        assert!(actual["rank"].as_u64().unwrap() >= 1);
        // The top-1 entry is the model's prediction, with rank 1.
        let top = next_token(prompt[i - 1], i - 1);
        assert_eq!(entry[&top.to_string()]["rank"], 1);
        assert!(entry.len() <= 2);
    }
    // The prompt logprobs do not change the generated token.
    assert_eq!(v["choices"][0]["token_ids"], json!(greedy(&prompt, 1, &[])));
}

#[tokio::test]
async fn legacy_logprobs_and_echo() {
    let t = toy();
    let prompt = encode("abc", true);
    let want = greedy(&prompt, 4, &[]);
    let (s, v) = post(
        &t.app,
        "/v1/completions",
        json!({"prompt": "abc", "max_tokens": 4, "temperature": 0, "ignore_eos": true, "logprobs": 2}),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 4);
    assert_eq!(lp["tokens"][0], ToyText.token_text(want[0]));
    let want_lp = logprob(*prompt.last().unwrap(), prompt.len() - 1, want[0]);
    assert!((lp["token_logprobs"][0].as_f64().unwrap() - want_lp).abs() < 1e-5);
    assert_eq!(lp["top_logprobs"][0].as_object().unwrap().len(), 2);
    assert_eq!(lp["text_offset"], json!([0, 1, 2, 3]));

    // Echo prepends the prompt text; with logprobs the prompt tokens are listed first.
    let (s, v) = post(
        &t.app,
        "/v1/completions",
        json!({"prompt": "abc", "max_tokens": 4, "temperature": 0, "ignore_eos": true,
               "echo": true, "logprobs": 1}),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let c = &v["choices"][0];
    assert_eq!(c["text"], format!("abc{}", decode(&want)));
    let lp = &c["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), prompt.len() + 4);
    assert!(lp["token_logprobs"][0].is_null());
    assert!(lp["top_logprobs"][0].is_null());
    assert!(lp["token_logprobs"][1].is_number());
    assert_eq!(lp["tokens"][0], "<bos>");
    // Echo alone does not add prompt_logprobs to the response.
    assert!(c["prompt_logprobs"].is_null());
}

#[tokio::test]
async fn stop_strings_cut_the_text() {
    let t = toy();
    let prompt = "hello";
    let ids = encode(prompt, true);
    let full = greedy(&ids, 30, &[]);
    let full_text = decode(&full);
    // A stop string from the middle of the continuation.
    let stop = full_text[4..6].to_string();
    let cut = full_text.find(&stop).unwrap();
    for stream in [false, true] {
        let body = json!({"prompt": prompt, "max_tokens": 30, "temperature": 0, "ignore_eos": true,
                          "stop": [stop.clone(), "\u{1F600}"], "stream": stream,
                          "return_token_ids": true});
        let (text, finish, token_ids) = if stream {
            let events = sse(&t.app, "/v1/completions", body).await;
            let mut text = String::new();
            let mut finish = Value::Null;
            let mut ids = Vec::new();
            for e in &events[..events.len() - 1] {
                let v: Value = serde_json::from_str(e).unwrap();
                assert_eq!(v["object"], "text_completion");
                text.push_str(v["choices"][0]["text"].as_str().unwrap());
                ids.extend(
                    v["choices"][0]["token_ids"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|x| x.as_u64().unwrap() as u32),
                );
                if !v["choices"][0]["finish_reason"].is_null() {
                    finish = v["choices"][0]["finish_reason"].clone();
                }
            }
            (text, finish, ids)
        } else {
            let (s, v) = post(&t.app, "/v1/completions", body).await;
            assert_eq!(s, StatusCode::OK);
            let ids: Vec<u32> =
                serde_json::from_value(v["choices"][0]["token_ids"].clone()).unwrap();
            (
                v["choices"][0]["text"].as_str().unwrap().to_string(),
                v["choices"][0]["finish_reason"].clone(),
                ids,
            )
        };
        assert_eq!(text, full_text[..cut], "stream={stream}");
        assert_eq!(finish, "stop");
        // Generation ended at the token that completed the stop string.
        assert!(decode(&token_ids).contains(&stop));
        assert!(!decode(&token_ids[..token_ids.len() - 1]).contains(&stop));
    }
}

#[tokio::test]
async fn stop_token_ids_and_ignore_eos() {
    let t = toy();
    // A prompt whose greedy continuation reaches EOS ("!" then EOS) within 40 tokens.
    let p = find_prompt(40, |g| g.last() == Some(&EOS) && g.len() > 2);
    let ids = encode(&p, true);
    let with_eos = greedy(&ids, 40, &[EOS]);
    let (_, v) = post(
        &t.app,
        "/v1/completions",
        json!({"prompt": p, "max_tokens": 40, "temperature": 0, "return_token_ids": true}),
    )
    .await;
    assert_eq!(v["choices"][0]["token_ids"], json!(with_eos));
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    // EOS is counted but not shown.
    assert_eq!(v["usage"]["completion_tokens"], with_eos.len());
    assert!(v["choices"][0]["text"].as_str().unwrap().ends_with('!'));

    let (_, v) = post(
        &t.app,
        "/v1/completions",
        json!({"prompt": p, "max_tokens": 40, "temperature": 0, "ignore_eos": true,
               "return_token_ids": true}),
    )
    .await;
    assert_eq!(v["choices"][0]["token_ids"], json!(greedy(&ids, 40, &[])));
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 40);

    let stop_id = with_eos[1];
    let (_, v) = post(
        &t.app,
        "/v1/completions",
        json!({"prompt": p, "max_tokens": 40, "temperature": 0, "ignore_eos": true,
               "stop_token_ids": [stop_id], "return_token_ids": true}),
    )
    .await;
    assert_eq!(
        v["choices"][0]["token_ids"],
        json!(greedy(&ids, 40, &[stop_id]))
    );
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
}

#[tokio::test]
async fn chat_completion_applies_the_template() {
    let t = toy();
    let messages = json!([
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]}
    ]);
    let rendered = "<bos><turn>system:be brief\n<turn>user:hi there\n<turn>assistant:";
    let ids = encode(rendered, false);
    let want = greedy(&ids, 20, &[EOS, TURN]);
    let (s, v) = post(
        &t.app,
        "/v1/chat/completions",
        json!({"model": "/models/toy", "messages": messages, "max_completion_tokens": 20,
               "temperature": 0, "seed": 1}),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "/models/toy");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    let c = &v["choices"][0];
    assert_eq!(c["message"]["role"], "assistant");
    assert_eq!(c["message"]["content"], decode(&want));
    assert_eq!(v["usage"]["prompt_tokens"], ids.len());
    assert_eq!(v["usage"]["completion_tokens"], want.len());

    // The same through streaming, with a usage chunk.
    let events = sse(
        &t.app,
        "/v1/chat/completions",
        json!({"model": "toy", "messages": messages, "max_tokens": 20, "temperature": 0,
               "stream": true, "stream_options": {"include_usage": true}}),
    )
    .await;
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let mut content = String::new();
    let mut finishes = Vec::new();
    for c in &chunks[..chunks.len() - 1] {
        assert_eq!(c["object"], "chat.completion.chunk");
        let ch = &c["choices"][0];
        if let Some(s) = ch["delta"]["content"].as_str() {
            content.push_str(s);
        }
        if !ch["finish_reason"].is_null() {
            finishes.push(ch["finish_reason"].clone());
        }
    }
    assert_eq!(content, decode(&want));
    assert_eq!(finishes, vec![c["finish_reason"].clone()]);
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], want.len());
    assert_eq!(usage["usage"]["prompt_tokens"], ids.len());
}

#[tokio::test]
async fn chat_logprobs() {
    let t = toy();
    let (s, v) = post(
        &t.app,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "hey"}], "max_tokens": 3,
               "temperature": 0, "ignore_eos": true, "logprobs": true, "top_logprobs": 3}),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 3);
    for item in content {
        assert!(item["logprob"].as_f64().unwrap() <= 0.0);
        assert_eq!(item["top_logprobs"].as_array().unwrap().len(), 3);
        assert_eq!(item["token"], item["top_logprobs"][0]["token"]);
        assert!(item["bytes"].is_array());
    }
}

#[tokio::test]
async fn streaming_text_is_complete_utf8() {
    let t = toy();
    // A continuation that contains "é" (two byte tokens).
    let p = find_prompt(30, |g| g.windows(2).any(|w| w == [BYTE_C3, BYTE_A9]));
    let ids = encode(&p, true);
    let want = greedy(&ids, 30, &[EOS, TURN]);
    assert!(decode(&want).contains('é'));
    let events = sse(
        &t.app,
        "/v1/completions",
        json!({"prompt": p, "max_tokens": 30, "temperature": 0, "stream": true, "echo": true,
               "return_token_ids": true}),
    )
    .await;
    let mut text = String::new();
    let mut ids_seen = Vec::new();
    for e in &events[..events.len() - 1] {
        let v: Value = serde_json::from_str(e).unwrap();
        let piece = v["choices"][0]["text"].as_str().unwrap();
        assert!(!piece.contains('\u{FFFD}'), "partial character streamed");
        text.push_str(piece);
        if let Some(a) = v["choices"][0]["token_ids"].as_array() {
            ids_seen.extend(a.iter().map(|x| x.as_u64().unwrap() as u32));
        }
    }
    assert_eq!(text, format!("{p}{}", decode(&want)));
    assert_eq!(ids_seen, want);
}

#[tokio::test]
async fn seeded_sampling_is_reproducible() {
    let t = toy();
    let body = json!({"prompt": "abc", "max_tokens": 20, "temperature": 1.5, "top_p": 0.9,
                      "top_k": -1, "seed": 7, "ignore_eos": true, "return_token_ids": true});
    let (_, a) = post(&t.app, "/v1/completions", body.clone()).await;
    let (_, b) = post(&t.app, "/v1/completions", body).await;
    assert_eq!(a["choices"][0]["token_ids"], b["choices"][0]["token_ids"]);
    assert_eq!(a["usage"]["completion_tokens"], 20);
    for seed in [json!(-1), json!(u64::MAX)] {
        let (s, _) = post(
            &t.app,
            "/v1/completions",
            json!({"prompt": "a", "max_tokens": 2, "seed": seed}),
        )
        .await;
        assert_eq!(s, StatusCode::OK);
    }
    let (s, _) = post(
        &t.app,
        "/v1/completions",
        json!({"prompt": "a", "max_tokens": 2, "seed": 1.5}),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn request_errors_are_openai_json() {
    let t = toy_with(|c| c.max_body_bytes = 4096);
    let app = &t.app;
    let cases: Vec<(&str, Value, StatusCode, Option<&str>)> = vec![
        (
            "/v1/completions",
            json!({"model": "other", "prompt": "a"}),
            StatusCode::NOT_FOUND,
            Some("model_not_found"),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "other", "messages": [{"role": "user", "content": "a"}]}),
            StatusCode::NOT_FOUND,
            Some("model_not_found"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "max_tokens": "x"}),
            StatusCode::BAD_REQUEST,
            None,
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "max_tokens": 0}),
            StatusCode::BAD_REQUEST,
            None,
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "max_tokens": -3}),
            StatusCode::BAD_REQUEST,
            None,
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "max_tokens": 1_000_000_000_000i64}),
            StatusCode::BAD_REQUEST,
            None,
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "max_tokens": 1e40}),
            StatusCode::BAD_REQUEST,
            None,
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "max_tokens": CTX - 1}),
            StatusCode::BAD_REQUEST,
            None,
        ),
        (
            "/v1/completions",
            json!({"prompt": [2, 64], "max_tokens": 1}),
            StatusCode::BAD_REQUEST,
            None,
        ),
        (
            "/v1/completions",
            json!({"prompt": [2, -1], "max_tokens": 1}),
            StatusCode::BAD_REQUEST,
            None,
        ),
        (
            "/v1/completions",
            json!({"prompt": [2, 1.5], "max_tokens": 1}),
            StatusCode::BAD_REQUEST,
            None,
        ),
        (
            "/v1/completions",
            json!({"prompt": vec![5; CTX], "max_tokens": 1}),
            StatusCode::BAD_REQUEST,
            None,
        ),
        (
            "/v1/completions",
            json!({"prompt": [], "max_tokens": 1}),
            StatusCode::BAD_REQUEST,
            None,
        ),
        (
            "/v1/completions",
            json!({"prompt": ["a", "b"], "max_tokens": 1}),
            StatusCode::BAD_REQUEST,
            None,
        ),
        (
            "/v1/completions",
            json!({"prompt": "a\u{1F600}", "max_tokens": 1}),
            StatusCode::BAD_REQUEST,
            None,
        ),
        (
            "/v1/completions",
            json!({"max_tokens": 1}),
            StatusCode::BAD_REQUEST,
            None,
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "n": 2}),
            StatusCode::BAD_REQUEST,
            Some("unsupported_parameter"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "best_of": 3}),
            StatusCode::BAD_REQUEST,
            Some("unsupported_parameter"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "stream": true, "prompt_logprobs": 1}),
            StatusCode::BAD_REQUEST,
            Some("unsupported_parameter"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "prompt_logprobs": 1000}),
            StatusCode::BAD_REQUEST,
            None,
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "temperature": -1}),
            StatusCode::BAD_REQUEST,
            None,
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "top_p": 0}),
            StatusCode::BAD_REQUEST,
            None,
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "top_k": -5}),
            StatusCode::BAD_REQUEST,
            None,
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "stop_token_ids": [99]}),
            StatusCode::BAD_REQUEST,
            None,
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "stop": 5}),
            StatusCode::BAD_REQUEST,
            None,
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "presence_penalty": 0.5}),
            StatusCode::BAD_REQUEST,
            Some("unsupported_parameter"),
        ),
        (
            "/v1/completions",
            json!([1, 2]),
            StatusCode::BAD_REQUEST,
            None,
        ),
        (
            "/v1/chat/completions",
            json!({"messages": []}),
            StatusCode::BAD_REQUEST,
            None,
        ),
        (
            "/v1/chat/completions",
            json!({"messages": "hi"}),
            StatusCode::BAD_REQUEST,
            None,
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "robot", "content": "a"}]}),
            StatusCode::BAD_REQUEST,
            None,
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
            StatusCode::BAD_REQUEST,
            None,
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "a"}], "n": 2}),
            StatusCode::BAD_REQUEST,
            None,
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "a"}], "max_completion_tokens": 0}),
            StatusCode::BAD_REQUEST,
            None,
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "a"}], "stream": true, "logprobs": true}),
            StatusCode::BAD_REQUEST,
            None,
        ),
    ];
    for (path, body, status, code) in cases {
        let (s, v) = post(app, path, body.clone()).await;
        assert_error(s, &v, status);
        if let Some(code) = code {
            assert_eq!(v["error"]["code"], code, "{body}");
        }
    }
    // Wrong types name the field.
    let (_, v) = post(
        app,
        "/v1/completions",
        json!({"prompt": "a", "temperature": "hot"}),
    )
    .await;
    assert_eq!(v["error"]["param"], "temperature");

    for raw in ["{", "not json", "", "{\"prompt\": \"a\",}"] {
        let (s, v) = post_raw(app, "/v1/completions", raw).await;
        assert_error(s, &v, StatusCode::BAD_REQUEST);
    }
    let big = json!({"prompt": "a".repeat(10_000)}).to_string();
    let (s, v) = post_raw(app, "/v1/completions", big).await;
    assert_error(s, &v, StatusCode::PAYLOAD_TOO_LARGE);

    let (s, b) = get(app, "/v1/nothing").await;
    assert_error(s, &serde_json::from_str(&b).unwrap(), StatusCode::NOT_FOUND);
    let (s, b) = get(app, "/v1/completions").await;
    assert_error(
        s,
        &serde_json::from_str(&b).unwrap(),
        StatusCode::METHOD_NOT_ALLOWED,
    );

    // None of that disturbed the engine.
    let (s, v) = post(app, "/v1/completions", json!({"prompt": "ab", "max_tokens": 3, "temperature": 0, "ignore_eos": true, "return_token_ids": true})).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        v["choices"][0]["token_ids"],
        json!(greedy(&encode("ab", true), 3, &[]))
    );
}

fn completion_req(prompt: &str, max_tokens: usize) -> Request<Body> {
    Request::post("/v1/completions")
        .header("content-type", "application/json")
        .body(Body::from(
            json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                   "ignore_eos": true, "return_token_ids": true})
            .to_string(),
        ))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_are_served_in_fifo_order() {
    let t = toy();
    // Four at once, as the benchmark's warm-up does: all succeed with the right output.
    let prompts = ["ab", "cd", "ef", "gh"];
    let futs = prompts.iter().map(|p| send(&t.app, completion_req(p, 32)));
    let results = futures::future::join_all(futs).await;
    for (p, (s, body)) in prompts.iter().zip(results) {
        assert_eq!(s, StatusCode::OK);
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            v["choices"][0]["token_ids"],
            json!(greedy(&encode(p, true), 32, &[]))
        );
    }

    // Order: hold the engine on the first request, queue three more, release.
    t.controls.prompts.lock().unwrap().clear();
    t.controls.pause();
    let mut handles = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        let app = t.app.clone();
        let req = completion_req(p, 8);
        handles.push(tokio::spawn(async move { send(&app, req).await }));
        if i == 0 {
            wait_until("first running", || t.state.running() == 1).await;
        } else {
            wait_until("queued", || t.state.queue_depth() == i).await;
        }
    }
    t.controls.resume();
    for h in handles {
        assert_eq!(h.await.unwrap().0, StatusCode::OK);
    }
    let seen = t.controls.prompts.lock().unwrap().clone();
    let want: Vec<Vec<u32>> = prompts.iter().map(|p| encode(p, true)).collect();
    assert_eq!(seen, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_queue_answers_503() {
    let t = toy_with(|c| c.queue_capacity = 1);
    t.controls.pause();
    let a = {
        let app = t.app.clone();
        tokio::spawn(async move { send(&app, completion_req("ab", 4)).await })
    };
    wait_until("a running", || t.state.running() == 1).await;
    let b = {
        let app = t.app.clone();
        tokio::spawn(async move { send(&app, completion_req("cd", 4)).await })
    };
    wait_until("b queued", || t.state.queue_depth() == 1).await;
    let (s, body) = send(&t.app, completion_req("ef", 4)).await;
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_error(s, &v, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(v["error"]["code"], "server_overloaded");
    t.controls.resume();
    assert_eq!(a.await.unwrap().0, StatusCode::OK);
    assert_eq!(b.await.unwrap().0, StatusCode::OK);
    let (s, _) = send(&t.app, completion_req("ef", 4)).await;
    assert_eq!(s, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_stream_cancels_generation() {
    use futures::StreamExt;
    let t = toy();
    t.controls.step_delay_us.store(2_000, Ordering::SeqCst);
    let req = Request::post("/v1/completions")
        .header("content-type", "application/json")
        .body(Body::from(
            json!({"prompt": "ab", "max_tokens": 200, "temperature": 0, "ignore_eos": true,
                   "stream": true})
            .to_string(),
        ))
        .unwrap();
    let resp = t.app.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body().into_data_stream();
    for _ in 0..3 {
        body.next().await.unwrap().unwrap();
    }
    drop(body);
    wait_until("generation stopped", || t.state.running() == 0).await;
    let generated = t.controls.decode_tokens.load(Ordering::SeqCst);
    assert!(
        generated < 100,
        "generation went on after the disconnect: {generated}"
    );
    assert!(t.state.metrics().cancelled.load(Ordering::SeqCst) >= 1);

    // The engine is fine afterwards.
    t.controls.step_delay_us.store(0, Ordering::SeqCst);
    let (s, body) = send(&t.app, completion_req("ab", 10)).await;
    assert_eq!(s, StatusCode::OK);
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        v["choices"][0]["token_ids"],
        json!(greedy(&encode("ab", true), 10, &[]))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_queued_request_is_skipped() {
    let t = toy();
    t.controls.prompts.lock().unwrap().clear();
    t.controls.pause();
    let a = {
        let app = t.app.clone();
        tokio::spawn(async move { send(&app, completion_req("ab", 4)).await })
    };
    wait_until("a running", || t.state.running() == 1).await;
    let b = {
        let app = t.app.clone();
        tokio::spawn(async move { send(&app, completion_req("cd", 4)).await })
    };
    wait_until("b queued", || t.state.queue_depth() == 1).await;
    b.abort();
    let _ = b.await;
    t.controls.resume();
    assert_eq!(a.await.unwrap().0, StatusCode::OK);
    wait_until("queue drained", || t.state.queue_depth() == 0).await;
    let (s, _) = send(&t.app, completion_req("ef", 4)).await;
    assert_eq!(s, StatusCode::OK);
    let seen = t.controls.prompts.lock().unwrap().clone();
    assert_eq!(seen, vec![encode("ab", true), encode("ef", true)]);
}

#[tokio::test]
async fn engine_panic_is_a_500_and_the_server_keeps_serving() {
    let t = toy();
    t.controls.panic_next.store(true, Ordering::SeqCst);
    let (s, body) = send(&t.app, completion_req("ab", 4)).await;
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_error(s, &v, StatusCode::INTERNAL_SERVER_ERROR);
    let (s, body) = send(&t.app, completion_req("ab", 4)).await;
    assert_eq!(s, StatusCode::OK);
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        v["choices"][0]["token_ids"],
        json!(greedy(&encode("ab", true), 4, &[]))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_socket_disconnect_cancels_a_non_streaming_request() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (runner, controls) = ToyRunner::new(CTX);
    let cfg = ServerConfig {
        served_model_name: "toy".into(),
        ..Default::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(hayai_server::serve_with(
        listener,
        Engine::new(Box::new(runner)),
        Arc::new(ToyText),
        cfg,
        async {
            let _ = stop_rx.await;
        },
    ));
    controls.step_delay_us.store(2_000, Ordering::SeqCst);
    let body = json!({"prompt": "ab", "max_tokens": 250, "temperature": 0, "ignore_eos": true})
        .to_string();
    let raw = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    sock.write_all(raw.as_bytes()).await.unwrap();
    wait_until("decoding", || {
        controls.decode_tokens.load(Ordering::SeqCst) > 3
    })
    .await;
    drop(sock);
    let t0 = Instant::now();
    let mut last = usize::MAX;
    // Generation must stop well before 250 tokens (500 ms at 2 ms a token).
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let n = controls.decode_tokens.load(Ordering::SeqCst);
        if n == last {
            break;
        }
        last = n;
        assert!(t0.elapsed() < Duration::from_secs(5));
    }
    assert!(
        last < 200,
        "generation continued after the disconnect: {last}"
    );

    // A fresh request on the same server works.
    controls.step_delay_us.store(0, Ordering::SeqCst);
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    let body =
        json!({"prompt": "ab", "max_tokens": 3, "temperature": 0, "ignore_eos": true}).to_string();
    let raw = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    sock.write_all(raw.as_bytes()).await.unwrap();
    let mut resp = String::new();
    sock.read_to_string(&mut resp).await.unwrap();
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    assert!(resp.contains(&format!(
        "\"text\":\"{}\"",
        decode(&greedy(&encode("ab", true), 3, &[]))
    )));

    stop_tx.send(()).unwrap();
    server.await.unwrap().unwrap();
}

#[tokio::test]
async fn max_tokens_defaults() {
    let messages = json!([{"role": "user", "content": "hi"}]);
    let prompt_len = encode("<bos><turn>user:hi\n<turn>assistant:", false).len();
    // Chat: the remaining context.
    let t = toy();
    let (s, v) = post(
        &t.app,
        "/v1/chat/completions",
        json!({"messages": messages, "ignore_eos": true, "temperature": 0}),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], CTX - prompt_len);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    // Completions: 16, as OpenAI's legacy API.
    let (_, v) = post(
        &t.app,
        "/v1/completions",
        json!({"prompt": "ab", "ignore_eos": true}),
    )
    .await;
    assert_eq!(v["usage"]["completion_tokens"], 16);
    // A configured cap applies to both.
    let t = toy_with(|c| c.max_tokens_default = Some(10));
    let (_, v) = post(
        &t.app,
        "/v1/chat/completions",
        json!({"messages": messages, "ignore_eos": true}),
    )
    .await;
    assert_eq!(v["usage"]["completion_tokens"], 10);
    let (_, v) = post(
        &t.app,
        "/v1/completions",
        json!({"prompt": "ab", "ignore_eos": true}),
    )
    .await;
    assert_eq!(v["usage"]["completion_tokens"], 10);
}
