//! hayai's OpenAI-compatible HTTP server (axum + tokio).
//!
//! One engine thread owns the [`Engine`] and serves requests from a bounded FIFO queue, one at a
//! time; a full queue answers 503. A client that disconnects cancels its generation (or its
//! queued job). Errors are OpenAI-style JSON (`{"error": {"message", "type", "param", "code"}}`).
//!
//! Entry points: [`run`] (blocking, builds the runtime), [`serve`] (async, binds
//! `host:port`), [`serve_with`] (async, any listener and shutdown signal) and
//! [`build`] + [`router`] for tests.

pub mod error;
mod handlers;
pub mod metrics;
pub mod protocol;
pub mod text;
mod tokenizer_adapter;
mod worker;

use std::future::Future;
use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::Context as _;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use hayai_engine::Engine;

pub use error::{ApiError, ServerError};
pub use handlers::AppState;
pub use metrics::Metrics;
pub use text::{ChatMessage, TextModel};
pub use tokenizer_adapter::HayaiText;

/// Server settings. [`ServerConfig::default`] gives the documented defaults.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub host: String,
    /// Default 8000.
    pub port: u16,
    /// The name clients use in `model` and see in `/v1/models`.
    pub served_model_name: String,
    /// The model path or hub id, shown as `root` in `/v1/models`; also accepted as `model`.
    pub model_id: String,
    /// Requests that may wait behind the one being generated; more are answered 503.
    pub queue_capacity: usize,
    /// Cap on the default `max_tokens` when a request omits it. Without it chat requests get the
    /// remaining context and completions 16 tokens (OpenAI's legacy default).
    pub max_tokens_default: Option<usize>,
    /// Largest accepted request body; larger ones are answered 413.
    pub max_body_bytes: usize,
    /// Largest `logprobs` / `top_logprobs` / `prompt_logprobs` accepted.
    pub max_logprobs: usize,
    /// Sampling defaults for fields a request omits (OpenAI's: temperature 1, top_p 1, no
    /// top-k).
    pub default_temperature: f32,
    pub default_top_p: f32,
    pub default_top_k: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            host: "0.0.0.0".into(),
            port: 8000,
            served_model_name: "hayai".into(),
            model_id: "hayai".into(),
            queue_capacity: 64,
            max_tokens_default: None,
            max_body_bytes: 16 << 20,
            max_logprobs: 20,
            default_temperature: 1.0,
            default_top_p: 1.0,
            default_top_k: 0,
        }
    }
}

impl ServerConfig {
    /// Defaults overridden by `HOST`, `PORT`, `MODEL_ID` and `SERVED_MODEL_NAME` (the
    /// benchmark's environment contract). `SERVED_MODEL_NAME` defaults to `MODEL_ID`.
    pub fn from_env() -> Result<Self, ServerError> {
        let mut c = ServerConfig::default();
        if let Ok(h) = std::env::var("HOST") {
            c.host = h;
        }
        if let Ok(p) = std::env::var("PORT") {
            c.port = p.parse().map_err(|_| {
                ServerError::Config(format!("PORT must be a port number, got {p:?}"))
            })?;
        }
        if let Ok(m) = std::env::var("MODEL_ID") {
            c.model_id = m.clone();
            c.served_model_name = m;
        }
        if let Ok(s) = std::env::var("SERVED_MODEL_NAME") {
            c.served_model_name = s;
        }
        Ok(c)
    }

    fn check(&self) -> Result<(), ServerError> {
        if self.queue_capacity == 0 {
            return Err(ServerError::Config(
                "queue_capacity must be at least 1".into(),
            ));
        }
        if self.served_model_name.is_empty() {
            return Err(ServerError::Config("served_model_name is empty".into()));
        }
        Ok(())
    }
}

/// The engine thread started by [`build`]. It stops once every [`AppState`] clone (and so every
/// router) is dropped; [`EngineThread::join`] waits for that.
pub struct EngineThread {
    handle: JoinHandle<()>,
}

impl EngineThread {
    pub fn join(self) {
        // A panic here was already reported per request; nothing more to do with it.
        let _ = self.handle.join();
    }
}

/// Start the engine thread and build the handlers' state.
pub fn build(
    engine: Engine,
    text: Arc<dyn TextModel>,
    cfg: ServerConfig,
) -> Result<(AppState, EngineThread), ServerError> {
    cfg.check()?;
    let info = engine.info().clone();
    let metrics = Arc::new(Metrics::default());
    let (queue, handle) = worker::spawn(engine, text.clone(), metrics.clone(), cfg.queue_capacity)?;
    let state = AppState::new(cfg, info, text, queue, metrics);
    Ok((state, EngineThread { handle }))
}

/// All endpoints.
pub fn router(state: AppState) -> Router {
    let limit = state.config().max_body_bytes;
    Router::new()
        .route("/v1/models", get(handlers::models))
        .route("/v1/models/{*model}", get(handlers::model))
        .route("/version", get(handlers::version))
        .route("/health", get(handlers::health))
        .route("/metrics", get(handlers::metrics))
        .route("/v1/completions", post(handlers::completions))
        .route("/v1/chat/completions", post(handlers::chat_completions))
        .fallback(handlers::not_found)
        .method_not_allowed_fallback(handlers::method_not_allowed)
        .layer(DefaultBodyLimit::max(limit))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            handlers::count_requests,
        ))
        .with_state(state)
}

/// Serve on `listener` until `shutdown` completes, then wait for the engine thread to finish
/// its current request.
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    engine: Engine,
    text: Arc<dyn TextModel>,
    cfg: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let (state, thread) = build(engine, text, cfg)?;
    let app = router(state);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
        .context("HTTP server failed")?;
    tokio::task::spawn_blocking(move || thread.join())
        .await
        .context("joining the engine thread")?;
    Ok(())
}

/// Bind `cfg.host:cfg.port` and serve until Ctrl-C or SIGTERM.
pub async fn serve(
    engine: Engine,
    text: Arc<dyn TextModel>,
    cfg: ServerConfig,
) -> anyhow::Result<()> {
    let addr = format!("{}:{}", cfg.host, cfg.port);
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|source| ServerError::Bind {
            addr: addr.clone(),
            source,
        })?;
    eprintln!(
        "hayai: serving `{}` on http://{addr} (OpenAI-compatible API under /v1)",
        cfg.served_model_name
    );
    serve_with(listener, engine, text, cfg, shutdown_signal()).await
}

/// Blocking form of [`serve`]: builds a multi-threaded tokio runtime and runs it.
pub fn run(engine: Engine, text: Arc<dyn TextModel>, cfg: ServerConfig) -> anyhow::Result<()> {
    // The HTTP side is light; a few workers leave the cores to the engine thread.
    let workers = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .clamp(1, 4);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .context("building the tokio runtime")?;
    rt.block_on(serve(engine, text, cfg))
}

/// Completes on Ctrl-C or (on Unix) SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            // No signal handling available: never trigger from here.
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    eprintln!("hayai: shutting down");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_from_env_and_checks() {
        // The only test in this binary that touches these variables.
        std::env::set_var("HOST", "127.0.0.1");
        std::env::set_var("PORT", "8123");
        std::env::set_var("MODEL_ID", "google/gemma-3-270m-it");
        std::env::remove_var("SERVED_MODEL_NAME");
        let c = ServerConfig::from_env().unwrap();
        assert_eq!((c.host.as_str(), c.port), ("127.0.0.1", 8123));
        assert_eq!(c.model_id, "google/gemma-3-270m-it");
        assert_eq!(c.served_model_name, "google/gemma-3-270m-it");
        std::env::set_var("SERVED_MODEL_NAME", "gemma");
        assert_eq!(ServerConfig::from_env().unwrap().served_model_name, "gemma");
        std::env::set_var("PORT", "eighty");
        assert!(ServerConfig::from_env().is_err());
        for v in ["HOST", "PORT", "MODEL_ID", "SERVED_MODEL_NAME"] {
            std::env::remove_var(v);
        }
        let bad = ServerConfig {
            queue_capacity: 0,
            ..Default::default()
        };
        assert!(bad.check().is_err());
        assert!(ServerConfig::default().check().is_ok());
    }
}
