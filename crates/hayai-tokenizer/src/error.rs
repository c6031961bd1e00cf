use std::path::PathBuf;

/// Every failure of this crate. Nothing here panics on bad input; it returns one of these.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("invalid vocabulary: {0}")]
    InvalidVocab(String),
    #[error("unsupported tokenizer: {0}")]
    Unsupported(String),
    #[error("token id {id} is out of range (vocabulary size {vocab_size})")]
    IdOutOfRange { id: u32, vocab_size: usize },
    #[error("I/O error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid JSON in {what}: {source}")]
    Json {
        what: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("GGUF tokenizer metadata: {0}")]
    Gguf(String),
    #[error("chat template error: {0}")]
    Template(String),
    #[error("chat template raised an exception: {0}")]
    TemplateException(String),
    #[error("unsupported chat role `{0}` (expected system, user, assistant or model)")]
    UnsupportedRole(String),
    #[error("invalid record: {0}")]
    InvalidRecord(String),
}

pub type Result<T> = std::result::Result<T, TokenizerError>;
