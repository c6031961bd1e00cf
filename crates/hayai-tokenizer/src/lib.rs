//! hayai-tokenizer: the Gemma tokenizer (SentencePiece-style BPE with byte fallback) loaded from GGUF
//! metadata or HF `tokenizer.json`, streaming detokenization, chat-template rendering, and a
//! decode/re-encode agreement report.

pub mod chat;
mod error;
mod fxhash;
mod gguf;
mod hf;
mod roundtrip;
mod tokenizer;

pub use chat::{ChatFamily, ChatMessage, ChatTemplate};
pub use error::{Result, TokenizerError};
pub use gguf::{gguf_chat_template, GGUF_CHAT_TEMPLATE_KEY};
pub use hf::{hf_chat_template, HfTokenizerConfig};
pub use roundtrip::{
    load_ppl_records, parse_ppl_records, roundtrip_report, PplRecord, RoundTripMismatch,
    RoundTripReport, TokenSequence,
};
pub use tokenizer::{
    EncodeOptions, MergeRule, StreamDecoder, TokenKind, Tokenizer, VocabSpec, SPACE_MARK,
};
