//! Serve a GGUF model with the CPU reference runner (slow; for end-to-end checks of the server
//! against a real tokenizer and model): `gguf_cpu_server MODEL.gguf [HOST:PORT]`.

use std::path::Path;
use std::sync::Arc;

use hayai_engine::Engine;
use hayai_model::cpu::CpuRunner;
use hayai_server::{HayaiText, ServerConfig};
use hayai_tokenizer::Tokenizer;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .ok_or_else(|| anyhow::anyhow!("usage: gguf_cpu_server MODEL.gguf [HOST:PORT]"))?;
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:8012".into());
    let (host, port) = addr
        .rsplit_once(':')
        .ok_or_else(|| anyhow::anyhow!("expected HOST:PORT, got {addr:?}"))?;
    let model = hayai_model::load::load_model(Path::new(&path))?;
    let runner = CpuRunner::new(Arc::new(model))?;
    let tok = Arc::new(Tokenizer::from_gguf_path(Path::new(&path))?);
    let text = HayaiText::for_model(tok, None)?;
    let cfg = ServerConfig {
        host: host.into(),
        port: port.parse()?,
        served_model_name: "gemma-3-270m".into(),
        model_id: path.clone(),
        ..Default::default()
    };
    hayai_server::run(Engine::new(Box::new(runner)), Arc::new(text), cfg)
}
