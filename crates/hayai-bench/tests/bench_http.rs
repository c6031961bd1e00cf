//! Bench against the in-test mock server: request shape, concurrent warm-up, token counting from
//! `usage`, duration/TPS math, failures, streaming metrics.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{models, sharegpt_file, MockResponse, MockServer};
use hayai_bench::{run_bench, BenchOptions, DatasetSpec, Endpoint, Error};
use serde_json::{json, Value};

/// Tracks the maximum number of requests in flight.
#[derive(Default)]
struct InFlight {
    now: AtomicUsize,
    max: AtomicUsize,
}

impl InFlight {
    fn enter(&self) {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(n, Ordering::SeqCst);
    }
    fn leave(&self) {
        self.now.fetch_sub(1, Ordering::SeqCst);
    }
}

fn content(req: &Value) -> String {
    req["messages"][0]["content"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

fn opts(url: &str, dataset: DatasetSpec) -> BenchOptions {
    BenchOptions {
        base_url: url.to_string(),
        dataset,
        show_progress: false,
        ..BenchOptions::default()
    }
}

const PROMPTS: &[(&str, &str)] = &[
    ("a", "one"),
    ("b", "three"),
    ("c", "fifteen"),
    ("d", "x"),
    ("e", "twenty-two"),
];

#[test]
fn bench_summary_math_and_concurrent_warmup() {
    let warm = Arc::new(InFlight::default());
    let timed = Arc::new(InFlight::default());
    let (w, t) = (warm.clone(), timed.clone());
    let server = MockServer::start(move |req| match req.path.as_str() {
        "/v1/models" => models("mock-model"),
        "/v1/chat/completions" => {
            let max_tokens = req.body["max_tokens"].as_u64().unwrap();
            let prompt_len = content(&req.body).len() as u64;
            let tracker = if max_tokens == 32 { &w } else { &t };
            tracker.enter();
            std::thread::sleep(Duration::from_millis(if max_tokens == 32 {
                200
            } else {
                30
            }));
            tracker.leave();
            // The prompt "x" answers one token short, as a server that stopped at EOS would.
            let out = if content(&req.body) == "x" {
                max_tokens - 1
            } else {
                max_tokens
            };
            MockResponse::Json(
                200,
                json!({"choices": [{"message": {"role": "assistant", "content": "..."}, "finish_reason": "length"}],
                       "usage": {"prompt_tokens": prompt_len, "completion_tokens": out, "total_tokens": prompt_len + out}}),
            )
        }
        _ => MockResponse::Json(404, json!({"error": {"message": "no route"}})),
    });
    let dir = tempfile::tempdir().unwrap();
    let file = sharegpt_file(dir.path(), PROMPTS);
    let out_dir = dir.path().join("run");
    let mut o = opts(&server.url, DatasetSpec::ShareGpt(file));
    o.output_len = 64;
    o.num_prompts = 100; // more than the file holds: all 5 are used
    o.output_dir = Some(out_dir.clone());
    let r = run_bench(&o).unwrap();
    let s = &r.summary;

    // All four warm-ups were in flight together.
    assert_eq!(warm.max.load(Ordering::SeqCst), 4);
    assert_eq!(timed.max.load(Ordering::SeqCst), 1, "max_concurrency=1");
    let chat = server.requests_to("/v1/chat/completions");
    assert_eq!(chat.len(), 4 + 5);
    let warm_reqs: Vec<_> = chat.iter().filter(|r| r.body["max_tokens"] == 32).collect();
    assert_eq!(warm_reqs.len(), 4);
    // Timed requests only start after every warm-up finished.
    let first_timed = chat.iter().find(|r| r.body["max_tokens"] == 64).unwrap();
    for w in &warm_reqs {
        assert!(first_timed.received_at >= w.received_at + Duration::from_millis(190));
    }
    // Request shape.
    let b = &first_timed.body;
    assert_eq!(b["model"], "mock-model");
    assert_eq!(b["temperature"], 0.0);
    assert_eq!(b["ignore_eos"], true);
    assert_eq!(b["stream"], false);
    assert_eq!(b["messages"].as_array().unwrap().len(), 1);
    assert_eq!(b["messages"][0]["role"], "user");

    // Token accounting comes from usage.
    assert_eq!(s.completed, 5);
    assert_eq!(s.failed, 0);
    assert_eq!(s.total_output_tokens, 5 * 64 - 1);
    assert_eq!(s.short_outputs, 1);
    let input: u64 = PROMPTS.iter().map(|(_, t)| t.len() as u64).sum();
    assert_eq!(s.total_input_tokens, input);
    // Duration covers 5 sequential 30 ms requests and excludes the 200 ms warm-up.
    assert!(
        s.duration_s >= 0.15 && s.duration_s < 1.0,
        "{}",
        s.duration_s
    );
    assert!((s.tps - s.total_output_tokens as f64 / s.duration_s).abs() < 1e-6);
    assert_eq!(s.tps, s.output_throughput);
    assert!((s.total_tps - (input + 5 * 64 - 1) as f64 / s.duration_s).abs() < 1e-6);
    assert!((s.request_throughput_req_s - 5.0 / s.duration_s).abs() < 1e-9);
    let lat = s.mean_e2e_latency_ms.unwrap();
    assert!((30.0..500.0).contains(&lat), "{lat}");
    assert!(s.p99_e2e_latency_ms.unwrap() >= s.median_e2e_latency_ms.unwrap());
    assert_eq!(s.model, "mock-model");
    assert_eq!(s.num_prompts, 5);

    // Files.
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("summary.json")).unwrap())
            .unwrap();
    assert_eq!(summary["completed"], 5);
    assert_eq!(summary["total_output_tokens"], 5 * 64 - 1);
    assert!(summary["tps"].as_f64().unwrap() > 0.0);
    let lines = std::fs::read_to_string(out_dir.join("benchmark.jsonl")).unwrap();
    let recs: Vec<Value> = lines
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(recs.len(), 5);
    assert!(recs
        .iter()
        .all(|r| r["completion_tokens"].as_u64().unwrap() >= 63));
    assert!(r.render().contains("Output token throughput"));
}

#[test]
fn failed_requests_are_counted_not_fatal() {
    let server = MockServer::start(|req| match req.path.as_str() {
        "/v1/models" => models("m"),
        _ if content(&req.body) == "three" && req.body["max_tokens"] != 32 => MockResponse::Json(
            503,
            json!({"error": {"message": "overloaded", "type": "server_error"}}),
        ),
        _ => MockResponse::Json(
            200,
            json!({"choices": [{"message": {"content": ""}}],
                                             "usage": {"prompt_tokens": 3, "completion_tokens": 8}}),
        ),
    });
    let dir = tempfile::tempdir().unwrap();
    let mut o = opts(
        &server.url,
        DatasetSpec::ShareGpt(sharegpt_file(dir.path(), PROMPTS)),
    );
    o.output_len = 8;
    let r = run_bench(&o).unwrap();
    assert_eq!(
        (r.summary.completed, r.summary.failed, r.failed()),
        (4, 1, 1)
    );
    assert_eq!(r.summary.total_output_tokens, 32);
    let bad: Vec<_> = r.requests.iter().filter(|x| x.error.is_some()).collect();
    assert_eq!(bad.len(), 1);
    assert_eq!(bad[0].id, "b");
    assert!(bad[0].error.as_ref().unwrap().contains("503"));
    assert!(bad[0].error.as_ref().unwrap().contains("overloaded"));
}

#[test]
fn missing_usage_aborts_the_run() {
    let server = MockServer::start(|req| match req.path.as_str() {
        "/v1/models" => models("m"),
        _ if req.body["max_tokens"] == 32 => MockResponse::Json(
            200,
            json!({"choices": [{"message": {"content": "x"}}], "usage": {"prompt_tokens": 1, "completion_tokens": 32}}),
        ),
        _ => MockResponse::Json(
            200,
            json!({"choices": [{"message": {"content": "x"}}], "usage": {"prompt_tokens": 1}}),
        ),
    });
    let dir = tempfile::tempdir().unwrap();
    let o = opts(
        &server.url,
        DatasetSpec::ShareGpt(sharegpt_file(dir.path(), PROMPTS)),
    );
    let e = run_bench(&o).unwrap_err();
    assert!(matches!(e, Error::Protocol(_)), "{e}");
    assert!(e.to_string().contains("usage.completion_tokens"), "{e}");
}

#[test]
fn warmup_failure_aborts_before_timing() {
    let server = MockServer::start(|req| match req.path.as_str() {
        "/v1/models" => models("m"),
        _ => MockResponse::Json(429, json!({"error": {"message": "busy"}})),
    });
    let dir = tempfile::tempdir().unwrap();
    let o = opts(
        &server.url,
        DatasetSpec::ShareGpt(sharegpt_file(dir.path(), PROMPTS)),
    );
    let e = run_bench(&o).unwrap_err();
    assert!(matches!(e, Error::Warmup(_)), "{e}");
    // Only the 4 warm-ups were sent.
    assert_eq!(server.requests_to("/v1/chat/completions").len(), 4);
}

#[test]
fn max_concurrency_uses_that_many_workers() {
    let inflight = Arc::new(InFlight::default());
    let f = inflight.clone();
    let server = MockServer::start(move |req| match req.path.as_str() {
        "/v1/models" => models("m"),
        _ => {
            if req.body["max_tokens"] != 32 {
                f.enter();
                std::thread::sleep(Duration::from_millis(100));
                f.leave();
            }
            MockResponse::Json(
                200,
                json!({"choices": [{"text": "x"}],
                                           "usage": {"prompt_tokens": 2, "completion_tokens": 16}}),
            )
        }
    });
    let mut o = opts(&server.url, DatasetSpec::Random { input_words: 10 });
    o.endpoint = Endpoint::Completions;
    o.num_prompts = 6;
    o.max_concurrency = 3;
    o.warmup_requests = 0;
    o.output_len = 16;
    let r = run_bench(&o).unwrap();
    assert_eq!(inflight.max.load(Ordering::SeqCst), 3);
    assert_eq!(r.summary.completed, 6);
    // Two waves of 100 ms rather than six.
    assert!(r.summary.duration_s < 0.45, "{}", r.summary.duration_s);
    let reqs = server.requests_to("/v1/completions");
    assert_eq!(reqs.len(), 6);
    // Random prompts: 10 words sent as raw completion text, reproducible from the seed.
    let p0 = reqs
        .iter()
        .map(|r| r.body["prompt"].as_str().unwrap().to_string())
        .collect::<Vec<_>>();
    assert!(p0.iter().all(|p| p.split(' ').count() == 10));
    let expected = hayai_bench::dataset::random_prompts(6, 10, 1);
    for p in &p0 {
        assert!(expected.iter().any(|e| &e.text == p));
    }
}

#[test]
fn streaming_reports_ttft_itl_tpot() {
    let server = MockServer::start(|req| match req.path.as_str() {
        "/v1/models" => models("m"),
        _ => {
            assert_eq!(req.body["stream"], true);
            assert_eq!(req.body["stream_options"]["include_usage"], true);
            let ms = Duration::from_millis;
            let chunk = |c: &str| {
                json!({"choices": [{"delta": {"content": c}, "finish_reason": null}]}).to_string()
            };
            MockResponse::Sse(vec![
                (
                    ms(0),
                    json!({"choices": [{"delta": {"role": "assistant"}}]}).to_string(),
                ),
                (ms(60), chunk("a")),
                (ms(40), chunk("b")),
                (ms(40), chunk("c")),
                (
                    ms(0),
                    json!({"choices": [{"delta": {}, "finish_reason": "length"}]}).to_string(),
                ),
                (
                    ms(0),
                    json!({"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 3}})
                        .to_string(),
                ),
                (ms(0), "[DONE]".to_string()),
            ])
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let mut o = opts(
        &server.url,
        DatasetSpec::ShareGpt(sharegpt_file(dir.path(), &PROMPTS[..2])),
    );
    o.stream = true;
    o.warmup_requests = 1;
    o.output_len = 3;
    let r = run_bench(&o).unwrap();
    let s = &r.summary;
    assert_eq!(
        (s.completed, s.total_output_tokens, s.short_outputs),
        (2, 6, 0)
    );
    let ttft = s.mean_ttft_ms.unwrap();
    assert!((55.0..200.0).contains(&ttft), "ttft {ttft}");
    let itl = s.median_itl_ms.unwrap();
    assert!((35.0..150.0).contains(&itl), "itl {itl}");
    assert_eq!(r.requests[0].itl_ms.as_ref().unwrap().len(), 2);
    // TPOT = (latency - ttft) / (tokens - 1) ≈ 80 ms / 2.
    let tpot = s.mean_tpot_ms.unwrap();
    assert!((35.0..150.0).contains(&tpot), "tpot {tpot}");
    assert_eq!(r.requests[0].finish_reason.as_deref(), Some("length"));
}

#[test]
fn streaming_without_usage_aborts() {
    let server = MockServer::start(|req| match req.path.as_str() {
        "/v1/models" => models("m"),
        _ => MockResponse::Sse(vec![
            (
                Duration::ZERO,
                json!({"choices": [{"delta": {"content": "a"}}]}).to_string(),
            ),
            (Duration::ZERO, "[DONE]".to_string()),
        ]),
    });
    let mut o = opts(&server.url, DatasetSpec::Random { input_words: 3 });
    o.stream = true;
    o.num_prompts = 2;
    o.warmup_requests = 0;
    let e = run_bench(&o).unwrap_err();
    assert!(e.to_string().contains("usage"), "{e}");
}

#[test]
fn stream_error_event_is_a_failed_request() {
    let server = MockServer::start(|req| match req.path.as_str() {
        "/v1/models" => models("m"),
        _ => {
            let content = req.body["messages"][0]["content"].as_str().unwrap_or("");
            if content == "one" && req.body["max_tokens"] != 32 {
                return MockResponse::Sse(vec![
                    (
                        Duration::ZERO,
                        json!({"choices": [{"delta": {"content": "a"}}]}).to_string(),
                    ),
                    (
                        Duration::ZERO,
                        json!({"error": {"message": "engine fault"}}).to_string(),
                    ),
                ]);
            }
            MockResponse::Sse(vec![
                (
                    Duration::ZERO,
                    json!({"choices": [{"delta": {"content": "a"}}]}).to_string(),
                ),
                (
                    Duration::ZERO,
                    json!({"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 1}})
                        .to_string(),
                ),
                (Duration::ZERO, "[DONE]".to_string()),
            ])
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let mut o = opts(
        &server.url,
        DatasetSpec::ShareGpt(sharegpt_file(dir.path(), &PROMPTS[..3])),
    );
    o.stream = true;
    o.output_len = 1;
    let r = run_bench(&o).unwrap();
    assert_eq!((r.summary.completed, r.summary.failed), (2, 1));
    let bad = r.requests.iter().find(|x| x.error.is_some()).unwrap();
    assert_eq!(bad.id, "a");
    assert!(bad.error.as_ref().unwrap().contains("engine fault"));
}

#[test]
fn waits_for_the_server_to_list_a_model() {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let server = MockServer::start(move |req| match req.path.as_str() {
        "/v1/models" => {
            // Loading: 503 twice, then an empty list, then ready.
            match c.fetch_add(1, Ordering::SeqCst) {
                0 | 1 => MockResponse::Json(503, json!({"error": {"message": "loading"}})),
                2 => MockResponse::Json(200, json!({"data": []})),
                _ => models("late-model"),
            }
        }
        _ => MockResponse::Json(
            200,
            json!({"choices": [{"message": {"content": ""}}],
                                             "usage": {"prompt_tokens": 1, "completion_tokens": 4}}),
        ),
    });
    let mut o = opts(&server.url, DatasetSpec::Random { input_words: 4 });
    o.num_prompts = 2;
    o.output_len = 4;
    o.wait_ready = Some(Duration::from_secs(10));
    let r = run_bench(&o).unwrap();
    assert_eq!(r.summary.model, "late-model");
    assert_eq!(calls.load(Ordering::SeqCst), 4);

    // Nothing listening: the error says so after the wait.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut o = opts(
        &format!("http://127.0.0.1:{port}"),
        DatasetSpec::Random { input_words: 4 },
    );
    o.wait_ready = Some(Duration::from_millis(600));
    let t = std::time::Instant::now();
    let e = run_bench(&o).unwrap_err().to_string();
    assert!(e.contains("not ready after"), "{e}");
    assert!(t.elapsed() >= Duration::from_millis(500));
}
