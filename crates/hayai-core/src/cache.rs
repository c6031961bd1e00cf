//! Where hayai keeps downloaded models: `$HAYAI_HOME`, else `~/.cache/hayai`.

use std::path::PathBuf;

/// File name of the default real model (Gemma 3 270M, Q4_K_M).
pub const DEFAULT_MODEL_FILE: &str = "gemma-3-270m-q4_k_m.gguf";

pub fn cache_dir() -> PathBuf {
    if let Some(h) = std::env::var_os("HAYAI_HOME") {
        return PathBuf::from(h);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| ".".into());
    home.join(".cache").join("hayai")
}

/// Where the default model is cached once fetched.
pub fn default_model_path() -> PathBuf {
    cache_dir().join("models").join(DEFAULT_MODEL_FILE)
}

/// The real model the test suites use: `$HAYAI_MODEL_GGUF`, else the cached default model.
pub fn real_model_path() -> PathBuf {
    std::env::var_os("HAYAI_MODEL_GGUF")
        .map(PathBuf::from)
        .unwrap_or_else(default_model_path)
}
