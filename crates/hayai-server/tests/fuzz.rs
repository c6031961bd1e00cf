//! Property tests of the request layer: arbitrary bodies never panic and never produce anything
//! but a success or a client error; accepted requests always pass the engine's own validation.

mod common;

use std::sync::Arc;

use axum::body::Body;
use axum::http::Request;
use common::*;
use hayai_engine::Engine;
use hayai_model::RunnerInfo;
use hayai_server::protocol::{prepare_chat, prepare_completion, Ctx};
use hayai_server::{build, router, ServerConfig, TextModel};
use proptest::prelude::*;
use serde_json::{Map, Value};
use tower::ServiceExt;

const KEYS: &[&str] = &[
    "model",
    "prompt",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "n",
    "best_of",
    "stream",
    "stream_options",
    "echo",
    "logprobs",
    "top_logprobs",
    "prompt_logprobs",
    "add_special_tokens",
    "return_token_ids",
    "presence_penalty",
    "logit_bias",
    "response_format",
    "role",
    "content",
    "type",
    "text",
    "include_usage",
];

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        (-3i64..70).prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-2.0f64..3.0).prop_map(Value::from),
        "[a-zA-Z .!é<>_/\u{1F600}]{0,10}".prop_map(Value::from),
        prop_oneof![
            Just("toy"),
            Just("/models/toy"),
            Just("user"),
            Just("text"),
            Just("<bos>")
        ]
        .prop_map(Value::from),
    ]
}

fn json() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((prop::sample::select(KEYS), inner), 0..6).prop_map(|kv| {
                Value::Object(kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
            }),
        ]
    })
}

/// Objects made of the fields the endpoints read, with arbitrary values.
fn body() -> impl Strategy<Value = Value> {
    prop::collection::vec((prop::sample::select(KEYS), json()), 0..10).prop_map(|kv| {
        let mut m = Map::new();
        for (k, v) in kv {
            m.insert(k.to_string(), v);
        }
        Value::Object(m)
    })
}

/// Mostly well-formed requests with edge values, so the accepting paths are exercised too.
fn near_valid() -> impl Strategy<Value = Value> {
    let prompt = prop_oneof![
        "[a-z !é]{0,20}".prop_map(Value::from),
        prop::collection::vec(0u32..70, 0..20).prop_map(|v| serde_json::json!(v)),
    ];
    (
        prompt,
        prop::option::of(-2i64..140),
        prop::option::of(-0.5f64..2.0),
        prop::option::of(prop_oneof![Just(-1i64), 0i64..5]),
        prop::option::of("[a-z]{0,3}"),
        any::<bool>(),
        prop::option::of(0i64..25),
        prop::option::of(0i64..3),
        any::<bool>(),
    )
        .prop_map(|(prompt, max, temp, top_k, stop, stream, lp, plp, echo)| {
            serde_json::json!({
                "model": "toy", "prompt": prompt, "max_tokens": max, "temperature": temp,
                "top_k": top_k, "stop": stop, "stream": stream, "logprobs": lp,
                "prompt_logprobs": plp, "echo": echo, "ignore_eos": true, "seed": 1,
                "messages": [{"role": "user", "content": "hi"}],
            })
        })
}

fn info() -> RunnerInfo {
    RunnerInfo {
        vocab_size: VOCAB,
        max_context: 128,
        eos_token_ids: vec![EOS],
        backend: "toy".into(),
    }
}

fn cfg() -> ServerConfig {
    ServerConfig {
        served_model_name: "toy".into(),
        model_id: "/models/toy".into(),
        ..Default::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    #[test]
    fn parsers_never_panic_and_accept_only_valid_requests(b in prop_oneof![body(), json(), near_valid()]) {
        let cfg = cfg();
        let info = info();
        let text: Arc<dyn TextModel> = Arc::new(ToyText);
        let ctx = Ctx { cfg: &cfg, info: &info, text: &text };
        let (runner, _) = ToyRunner::new(info.max_context);
        let engine = Engine::new(Box::new(runner));
        for r in [prepare_completion(&ctx, &b), prepare_chat(&ctx, &b)] {
            match r {
                Ok(p) => {
                    prop_assert!(engine.validate(&p.gen).is_ok(), "{b}");
                    prop_assert!(p.gen.max_tokens >= 1);
                }
                Err(e) => {
                    prop_assert!(e.status.is_client_error(), "{b}: {e}");
                    prop_assert!(!e.message.is_empty());
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn http_bodies_get_2xx_or_4xx(
        b in prop_oneof![
            body().prop_map(|v| v.to_string().into_bytes()),
            json().prop_map(|v| v.to_string().into_bytes()),
            near_valid().prop_map(|v| v.to_string().into_bytes()),
            prop::collection::vec(any::<u8>(), 0..64),
        ],
        chat in any::<bool>(),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let (runner, _) = ToyRunner::new(128);
        let (state, _t) = build(Engine::new(Box::new(runner)), Arc::new(ToyText), cfg()).unwrap();
        let app = router(state);
        let path = if chat { "/v1/chat/completions" } else { "/v1/completions" };
        let (status, bytes) = rt.block_on(async {
            let req = Request::post(path)
                .header("content-type", "application/json")
                .body(Body::from(b.clone()))
                .unwrap();
            let resp = app.oneshot(req).await.unwrap();
            let status = resp.status();
            (status, axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap())
        });
        prop_assert!(status.is_success() || status.is_client_error(), "{status}");
        if status.is_client_error() {
            let v: Value = serde_json::from_slice(&bytes).unwrap();
            prop_assert!(v["error"]["message"].is_string());
        } else if !bytes.starts_with(b"data: ") {
            let v: Value = serde_json::from_slice(&bytes).unwrap();
            prop_assert!(v["usage"]["completion_tokens"].as_u64().unwrap() >= 1);
        } else {
            prop_assert!(bytes.ends_with(b"data: [DONE]\n\n"));
        }
    }
}
