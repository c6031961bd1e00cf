//! hayai-tokenizer
