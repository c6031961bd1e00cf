//! HTTP handlers and response shapes (OpenAI / vLLM conventions).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::{FromRequest, Path, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use hayai_engine::LogprobEntry;
use hayai_model::RunnerInfo;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::protocol::{prepare_chat, prepare_completion, Ctx, Prepared};
use crate::text::TextModel;
use crate::worker::{CancelGuard, Event, Finished, Queue};
use crate::ServerConfig;

/// Shared state of all handlers. Cloning is cheap.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

struct Inner {
    cfg: ServerConfig,
    info: RunnerInfo,
    text: Arc<dyn TextModel>,
    queue: Queue,
    metrics: Arc<Metrics>,
    next_id: AtomicU64,
    created: u64,
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl AppState {
    pub(crate) fn new(
        cfg: ServerConfig,
        info: RunnerInfo,
        text: Arc<dyn TextModel>,
        queue: Queue,
        metrics: Arc<Metrics>,
    ) -> Self {
        AppState {
            inner: Arc::new(Inner {
                cfg,
                info,
                text,
                queue,
                metrics,
                next_id: AtomicU64::new(0),
                created: unix_now(),
            }),
        }
    }

    pub fn config(&self) -> &ServerConfig {
        &self.inner.cfg
    }

    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// Requests waiting for the engine (not counting the one being generated).
    pub fn queue_depth(&self) -> usize {
        self.inner.metrics.queue_depth.load(Ordering::SeqCst)
    }

    /// Requests being generated right now (0 or 1).
    pub fn running(&self) -> usize {
        self.inner.metrics.running.load(Ordering::SeqCst)
    }

    fn ctx(&self) -> Ctx<'_> {
        Ctx {
            cfg: &self.inner.cfg,
            info: &self.inner.info,
            text: &self.inner.text,
        }
    }

    fn new_id(&self, prefix: &str) -> String {
        let n = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}-{:x}{n:06x}", self.inner.created)
    }
}

/// JSON body extractor whose failures are OpenAI-style errors (400 for malformed JSON instead
/// of axum's 422, 413 for bodies over the limit).
pub struct JsonBody(pub Value);

impl<S: Send + Sync> FromRequest<S> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(req, state).await.map_err(|r| {
            if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "invalid_request_error",
                    "payload_too_large",
                    "the request body is too large".into(),
                )
            } else {
                ApiError::bad_request(format!("cannot read the request body: {}", r.body_text()))
            }
        })?;
        serde_json::from_slice(&bytes)
            .map(JsonBody)
            .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))
    }
}

/// Counts every response by endpoint and status.
pub async fn count_requests(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let endpoint = match req.uri().path() {
        p
        @ ("/v1/models" | "/health" | "/metrics" | "/v1/chat/completions" | "/v1/completions") => {
            p.to_string()
        }
        _ => "other".to_string(),
    };
    let resp = next.run(req).await;
    st.inner
        .metrics
        .count_request(&endpoint, resp.status().as_u16());
    resp
}

fn model_card(st: &AppState) -> Value {
    let cfg = &st.inner.cfg;
    json!({
        "id": cfg.served_model_name,
        "object": "model",
        "created": st.inner.created,
        "owned_by": "hayai",
        "root": cfg.model_id,
        "parent": null,
        "max_model_len": st.inner.info.max_context,
    })
}

pub async fn models(State(st): State<AppState>) -> Json<Value> {
    Json(json!({ "object": "list", "data": [model_card(&st)] }))
}

/// `GET /v1/models/{model}` (the `openai` client's `models.retrieve`).
pub async fn model(State(st): State<AppState>, Path(name): Path<String>) -> Response {
    let cfg = &st.inner.cfg;
    if name == cfg.served_model_name || name == cfg.model_id {
        Json(model_card(&st)).into_response()
    } else {
        ApiError::model_not_found(&name).into_response()
    }
}

pub async fn version() -> Json<Value> {
    Json(json!({ "version": env!("CARGO_PKG_VERSION") }))
}

pub async fn health(State(st): State<AppState>) -> Json<Value> {
    Json(json!({
        "status": "ok",
        "backend": st.inner.info.backend,
        "queue_depth": st.queue_depth(),
        "running": st.running(),
    }))
}

pub async fn metrics(State(st): State<AppState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        st.inner.metrics.render(),
    )
        .into_response()
}

pub async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "not_found",
        "no such endpoint".into(),
    )
}

pub async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        "method_not_allowed",
        "method not allowed on this endpoint".into(),
    )
}

fn usage(prompt: usize, completion: usize) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    })
}

/// vLLM clamps non-finite logprobs so the JSON stays valid.
fn finite(x: f32) -> f64 {
    if x.is_finite() {
        x as f64
    } else {
        -9999.0
    }
}

/// vLLM's `prompt_logprobs` entry: `{"<id>": {"logprob", "rank", "decoded_token"}}` for the
/// top entries plus the actual token.
fn prompt_logprob_entry(text: &dyn TextModel, e: &LogprobEntry) -> Value {
    let mut m = Map::new();
    for (i, &(id, lp)) in e.top.iter().enumerate() {
        m.insert(
            id.to_string(),
            json!({"logprob": finite(lp), "rank": i + 1, "decoded_token": text.token_text(id)}),
        );
    }
    m.entry(e.token.to_string()).or_insert_with(|| {
        json!({
            "logprob": finite(e.logprob),
            "rank": e.rank,
            "decoded_token": text.token_text(e.token),
        })
    });
    Value::Object(m)
}

/// The legacy completions `logprobs` object over (optionally) the prompt and the generated
/// tokens.
fn completion_logprobs(
    text: &dyn TextModel,
    prompt: Option<(&[u32], &[Option<LogprobEntry>])>,
    gen: &[LogprobEntry],
    k: usize,
) -> Value {
    let mut tokens = Vec::new();
    let mut token_logprobs = Vec::new();
    let mut top_logprobs = Vec::new();
    let mut text_offset = Vec::new();
    let mut offset = 0usize;
    let mut push = |id: u32, e: Option<&LogprobEntry>| {
        let s = text.token_text(id);
        text_offset.push(offset);
        offset += s.chars().count();
        match e {
            None => {
                token_logprobs.push(Value::Null);
                top_logprobs.push(Value::Null);
            }
            Some(e) => {
                token_logprobs.push(json!(finite(e.logprob)));
                let mut m = Map::new();
                for &(tid, lp) in e.top.iter().take(k) {
                    m.insert(text.token_text(tid), json!(finite(lp)));
                }
                m.entry(s.clone()).or_insert(json!(finite(e.logprob)));
                top_logprobs.push(Value::Object(m));
            }
        }
        tokens.push(s);
    };
    if let Some((ids, lps)) = prompt {
        for (i, &id) in ids.iter().enumerate() {
            push(id, lps.get(i).and_then(|e| e.as_ref()));
        }
    }
    for e in gen {
        push(e.token, Some(e));
    }
    json!({
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top_logprobs,
        "text_offset": text_offset,
    })
}

/// The chat `logprobs` object: `{"content": [{token, logprob, bytes, top_logprobs}]}`.
fn chat_logprobs(text: &dyn TextModel, gen: &[LogprobEntry], k: usize) -> Value {
    let item = |id: u32, lp: f32| {
        let s = text.token_text(id);
        let bytes: Vec<u8> = s.as_bytes().to_vec();
        json!({"token": s, "logprob": finite(lp), "bytes": bytes})
    };
    let content: Vec<Value> = gen
        .iter()
        .map(|e| {
            let mut v = item(e.token, e.logprob);
            let top: Vec<Value> = e.top.iter().take(k).map(|&(id, lp)| item(id, lp)).collect();
            v["top_logprobs"] = Value::Array(top);
            v
        })
        .collect();
    json!({ "content": content })
}

/// Run request preparation (tokenizer, chat template) so that a bug there is a 500 for this
/// request rather than a dropped connection.
fn guarded(f: impl FnOnce() -> Result<Prepared, ApiError>) -> Result<Prepared, ApiError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .unwrap_or_else(|_| Err(ApiError::internal("request preparation failed")))
}

/// Wait for the job's final event (non-streaming requests).
async fn wait_done(mut rx: UnboundedReceiver<Event>) -> Result<Finished, ApiError> {
    while let Some(ev) = rx.recv().await {
        if let Event::Done(r) = ev {
            return r;
        }
    }
    Err(ApiError::internal(
        "the engine thread stopped before finishing the request",
    ))
}

fn submit(
    st: &AppState,
    p: &Prepared,
) -> Result<(UnboundedReceiver<Event>, CancelGuard), ApiError> {
    st.inner
        .queue
        .submit(p.gen.clone(), p.stop.clone(), p.stream)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Completion,
}

pub async fn completions(State(st): State<AppState>, JsonBody(body): JsonBody) -> Response {
    let p = match guarded(|| prepare_completion(&st.ctx(), &body)) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let (rx, guard) = match submit(&st, &p) {
        Ok(x) => x,
        Err(e) => return e.into_response(),
    };
    let id = st.new_id("cmpl");
    let echo_text = p.echo.then(|| st.inner.text.decode(&p.gen.prompt));
    if p.stream {
        return stream_response(st, Kind::Completion, id, p, echo_text, rx, guard);
    }
    let f = match wait_done(rx).await {
        Ok(f) => f,
        Err(e) => return e.into_response(),
    };
    drop(guard);
    let text = &*st.inner.text;
    let out = &f.output;
    let full_text = match &echo_text {
        Some(e) => format!("{e}{}", f.text),
        None => f.text.clone(),
    };
    let logprobs = match (p.logprobs, &out.logprobs) {
        (Some(k), Some(gen)) => {
            let prompt = if p.echo {
                out.prompt_logprobs
                    .as_deref()
                    .map(|lps| (p.gen.prompt.as_slice(), lps))
            } else {
                None
            };
            completion_logprobs(text, prompt, gen, k)
        }
        _ => Value::Null,
    };
    let mut choice = json!({
        "index": 0,
        "text": full_text,
        "logprobs": logprobs,
        "finish_reason": f.finish_reason,
        "stop_reason": null,
        "prompt_logprobs": null,
    });
    if let (Some(k), Some(lps)) = (p.prompt_logprobs, &out.prompt_logprobs) {
        let list: Vec<Value> = lps
            .iter()
            .map(|e| match e {
                None => Value::Null,
                Some(e) => {
                    // The engine may have computed more top entries (for echo); keep `k`.
                    let mut e = e.clone();
                    e.top.truncate(k);
                    prompt_logprob_entry(text, &e)
                }
            })
            .collect();
        choice["prompt_logprobs"] = Value::Array(list);
    }
    if p.return_token_ids {
        choice["token_ids"] = json!(out.tokens);
        choice["prompt_token_ids"] = json!(p.gen.prompt);
    }
    Json(json!({
        "id": id,
        "object": "text_completion",
        "created": unix_now(),
        "model": p.model,
        "choices": [choice],
        "usage": usage(p.gen.prompt.len(), out.tokens.len()),
    }))
    .into_response()
}

pub async fn chat_completions(State(st): State<AppState>, JsonBody(body): JsonBody) -> Response {
    let p = match guarded(|| prepare_chat(&st.ctx(), &body)) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let (rx, guard) = match submit(&st, &p) {
        Ok(x) => x,
        Err(e) => return e.into_response(),
    };
    let id = st.new_id("chatcmpl");
    if p.stream {
        return stream_response(st, Kind::Chat, id, p, None, rx, guard);
    }
    let f = match wait_done(rx).await {
        Ok(f) => f,
        Err(e) => return e.into_response(),
    };
    drop(guard);
    let out = &f.output;
    let logprobs = match (p.logprobs, &out.logprobs) {
        (Some(k), Some(gen)) => chat_logprobs(&*st.inner.text, gen, k),
        _ => Value::Null,
    };
    let mut choice = json!({
        "index": 0,
        "message": {"role": "assistant", "content": f.text},
        "logprobs": logprobs,
        "finish_reason": f.finish_reason,
        "stop_reason": null,
    });
    let mut resp = json!({
        "id": id,
        "object": "chat.completion",
        "created": unix_now(),
        "model": p.model,
        "choices": [],
        "usage": usage(p.gen.prompt.len(), out.tokens.len()),
    });
    if p.return_token_ids {
        choice["token_ids"] = json!(out.tokens);
        resp["prompt_token_ids"] = json!(p.gen.prompt);
    }
    resp["choices"] = Value::Array(vec![choice]);
    Json(resp).into_response()
}

/// State of one SSE response.
struct StreamState {
    kind: Kind,
    id: String,
    created: u64,
    model: String,
    prompt_len: usize,
    include_usage: bool,
    return_token_ids: bool,
    rx: UnboundedReceiver<Event>,
    pending: VecDeque<SseEvent>,
    done: bool,
    /// Dropping the stream (client gone) cancels the generation.
    _guard: CancelGuard,
}

impl StreamState {
    fn chunk(&self, choices: Value) -> SseEvent {
        let object = match self.kind {
            Kind::Chat => "chat.completion.chunk",
            Kind::Completion => "text_completion",
        };
        let v = json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        SseEvent::default().data(v.to_string())
    }

    fn text_chunk(&self, text: &str, ids: Option<&[u32]>, finish: Option<&str>) -> SseEvent {
        let mut c = match self.kind {
            Kind::Chat => {
                let delta = if finish.is_some() && text.is_empty() {
                    json!({})
                } else {
                    json!({ "content": text })
                };
                json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish})
            }
            Kind::Completion => {
                json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish})
            }
        };
        if let (true, Some(ids)) = (self.return_token_ids, ids) {
            c["token_ids"] = json!(ids);
        }
        self.chunk(json!([c]))
    }

    fn on_event(&mut self, ev: Option<Event>) {
        match ev {
            Some(Event::Delta { text, ids }) => {
                let e = self.text_chunk(&text, Some(&ids), None);
                self.pending.push_back(e);
            }
            Some(Event::Done(Ok(f))) => {
                let e = self.text_chunk("", Some(&[]), Some(f.finish_reason));
                self.pending.push_back(e);
                if self.include_usage {
                    let mut v = json!({
                        "id": self.id,
                        "object": if self.kind == Kind::Chat { "chat.completion.chunk" } else { "text_completion" },
                        "created": self.created,
                        "model": self.model,
                        "choices": [],
                    });
                    v["usage"] = usage(self.prompt_len, f.output.tokens.len());
                    self.pending
                        .push_back(SseEvent::default().data(v.to_string()));
                }
                self.finish();
            }
            Some(Event::Done(Err(e))) => {
                self.pending
                    .push_back(SseEvent::default().data(e.body().to_string()));
                self.finish();
            }
            None => {
                let e =
                    ApiError::internal("the engine thread stopped before finishing the request");
                self.pending
                    .push_back(SseEvent::default().data(e.body().to_string()));
                self.finish();
            }
        }
    }

    fn finish(&mut self) {
        self.pending.push_back(SseEvent::default().data("[DONE]"));
        self.done = true;
    }
}

fn stream_response(
    st: AppState,
    kind: Kind,
    id: String,
    p: Prepared,
    echo_text: Option<String>,
    rx: UnboundedReceiver<Event>,
    guard: CancelGuard,
) -> Response {
    let mut s = StreamState {
        kind,
        id,
        created: unix_now(),
        model: p.model.clone(),
        prompt_len: p.gen.prompt.len(),
        include_usage: p.include_usage,
        return_token_ids: p.return_token_ids,
        rx,
        pending: VecDeque::new(),
        done: false,
        _guard: guard,
    };
    match kind {
        Kind::Chat => {
            let c = json!([{
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": null,
                "finish_reason": null,
            }]);
            let e = s.chunk(c);
            s.pending.push_back(e);
        }
        Kind::Completion => {
            if let Some(t) = echo_text {
                let e = s.text_chunk(&t, None, None);
                s.pending.push_back(e);
            }
        }
    }
    drop(st);
    let stream = futures::stream::unfold(s, |mut s| async move {
        loop {
            if let Some(e) = s.pending.pop_front() {
                return Some((Ok::<_, Infallible>(e), s));
            }
            if s.done {
                return None;
            }
            let ev = s.rx.recv().await;
            s.on_event(ev);
        }
    });
    Sse::new(stream).into_response()
}
