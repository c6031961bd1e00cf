use thiserror::Error;

#[derive(Debug, Error)]
pub enum ModelError {
    #[error("format error: {0}")]
    Format(#[from] hayai_core::FormatError),
    #[error("unsupported model: {0}")]
    Unsupported(String),
    #[error("missing tensor `{0}`")]
    MissingTensor(String),
    #[error("tensor `{name}` has shape {got:?}, expected {want:?}")]
    Shape {
        name: String,
        got: Vec<usize>,
        want: Vec<usize>,
    },
    #[error("invalid config: {0}")]
    Config(String),
    #[error("token id {id} is out of range (vocabulary has {vocab} entries)")]
    TokenOutOfRange { id: u32, vocab: usize },
    #[error("sequence of {len} tokens exceeds the context limit of {max}")]
    ContextOverflow { len: usize, max: usize },
    #[error("backend error: {0}")]
    Backend(String),
    #[error("i/o error on {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}
