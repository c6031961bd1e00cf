//! The crate's single error type.

use std::path::PathBuf;

use thiserror::Error;

/// Everything that can go wrong while reading or writing a model file.
///
/// Each variant carries enough context (file, key, tensor, byte offset) to
/// diagnose a bad file without a debugger.
#[derive(Debug, Error)]
pub enum FormatError {
    /// Free-form error for cases that fit no other variant.
    #[error("{0}")]
    Invalid(String),

    #[error("{}: I/O error: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// Malformed or hostile GGUF content. `offset` is the byte position in
    /// the file where the problem was detected.
    #[error("GGUF {origin}: at byte {offset}: {msg}")]
    Gguf {
        origin: String,
        offset: u64,
        msg: String,
    },

    /// Malformed safetensors content.
    #[error("safetensors {origin}: {msg}")]
    Safetensors { origin: String, msg: String },

    /// Malformed or unreadable JSON (config.json, index files, headers).
    #[error("{origin}: invalid JSON: {source}")]
    Json {
        origin: String,
        #[source]
        source: serde_json::Error,
    },

    /// A required metadata/config key is absent.
    #[error("{origin}: missing key `{key}`")]
    MissingKey { origin: String, key: String },

    /// A metadata/config key exists but has an unusable type or value.
    #[error("{origin}: key `{key}`: expected {expected}, found {found}")]
    WrongType {
        origin: String,
        key: String,
        expected: String,
        found: String,
    },

    /// A tensor was requested by name but is not in the file.
    #[error("{origin}: tensor `{name}` not found")]
    TensorNotFound { origin: String, name: String },

    /// A tensor's type cannot be handled by the requested operation.
    #[error("tensor type {ty} is not supported by {op}")]
    Unsupported { ty: String, op: String },

    /// Inconsistent sizes handed to a conversion routine.
    #[error("{op} ({ty}): {msg}")]
    Size { op: String, ty: String, msg: String },
}

impl FormatError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        FormatError::Io {
            path: path.into(),
            source,
        }
    }
}
