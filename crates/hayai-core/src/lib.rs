//! File formats: GGUF, safetensors, HF config.json; dequantization.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum FormatError {
    #[error("{0}")]
    Invalid(String),
}
