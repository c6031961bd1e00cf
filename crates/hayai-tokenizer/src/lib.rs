//! hayai-tokenizer: the Gemma tokenizer (SentencePiece-style BPE with byte fallback) loaded from GGUF
//! metadata or HF `tokenizer.json`, streaming detokenization, and chat-template rendering.

mod error;
mod hf;
mod tokenizer;

pub use error::{Result, TokenizerError};
pub use tokenizer::{
    EncodeOptions, MergeRule, StreamDecoder, TokenKind, Tokenizer, VocabSpec, SPACE_MARK,
};
