//! The crate's error type. Every harness stage fails loudly: a malformed input or response is an
//! error naming the offending record, never a silently skipped item.

use std::path::PathBuf;

/// Errors produced by the harness.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading or writing a file failed.
    #[error("I/O error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A JSON document could not be parsed or serialised.
    #[error("JSON error in {what}: {source}")]
    Json {
        what: String,
        #[source]
        source: serde_json::Error,
    },
    /// A prompt data set is malformed.
    #[error("invalid dataset {path}: {msg}")]
    Dataset { path: PathBuf, msg: String },
    /// The request could not be completed at the transport level (connect, timeout, read).
    #[error("HTTP request to {url} failed: {msg}")]
    Http { url: String, msg: String },
    /// The server answered with a non-success status.
    #[error("server returned HTTP {status} for {url}: {body}")]
    Status {
        url: String,
        status: u16,
        body: String,
    },
    /// The server answered 2xx but the body breaks the OpenAI-compatible contract.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The concurrent warm-up failed, so the timed run was not started.
    #[error("warm-up failed: {0}")]
    Warmup(String),
    /// A perplexity record is malformed.
    #[error("invalid PPL record {id} (line {line}): {msg}")]
    PplRecord {
        line: usize,
        id: String,
        msg: String,
    },
    /// The response for a perplexity record is unusable.
    #[error("PPL request for record {id} failed: {msg}")]
    PplResponse { id: String, msg: String },
    /// Applying the chat template / tokenising a prompt for a capture failed.
    #[error("encoding prompt {id} failed: {msg}")]
    Encode { id: String, msg: String },
    /// A capture file is malformed.
    #[error("invalid capture {path}: {msg}")]
    Capture { path: PathBuf, msg: String },
    /// A results directory holds a malformed file.
    #[error("invalid results file {path}: {msg}")]
    Results { path: PathBuf, msg: String },
    /// Options are inconsistent or out of range.
    #[error("invalid option: {0}")]
    Options(String),
}

/// Crate result alias.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}
