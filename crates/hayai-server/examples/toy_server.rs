//! Demo/test server: the real HTTP stack in front of the deterministic 64-token toy runner used
//! by the crate's tests (no model weights). For exercising clients such as the official
//! `openai` package: `cargo run -p hayai-server --example toy_server -- 127.0.0.1:8011`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::Arc;

use hayai_engine::Engine;
use hayai_server::ServerConfig;

fn main() -> anyhow::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:8011".to_string());
    let (host, port) = addr
        .rsplit_once(':')
        .ok_or_else(|| anyhow::anyhow!("expected HOST:PORT, got {addr:?}"))?;
    let cfg = ServerConfig {
        host: host.to_string(),
        port: port.parse()?,
        served_model_name: "toy".into(),
        model_id: "hayai/toy-64".into(),
        ..Default::default()
    };
    let (runner, _controls) = common::ToyRunner::new(256);
    hayai_server::run(
        Engine::new(Box::new(runner)),
        Arc::new(common::ToyText),
        cfg,
    )
}
