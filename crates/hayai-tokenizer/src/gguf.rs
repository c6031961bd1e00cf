//! Building a [`Tokenizer`] from GGUF `tokenizer.ggml.*` metadata.

use std::path::Path;

use hayai_core::gguf::GgufFile;

use crate::error::{Result, TokenizerError};
use crate::tokenizer::{MergeRule, TokenKind, Tokenizer, VocabSpec};

/// GGUF key of the model's own chat template.
pub const GGUF_CHAT_TEMPLATE_KEY: &str = "tokenizer.chat_template";

fn gerr(msg: impl Into<String>) -> TokenizerError {
    TokenizerError::Gguf(msg.into())
}

/// Split a GGUF merge entry `"left right"`. The separator search starts after the first character so
/// that a left piece beginning with a space still splits as llama.cpp does.
fn split_merge(entry: &str) -> Option<(&str, &str)> {
    let first = entry.chars().next()?.len_utf8();
    let pos = entry[first..].find(' ')? + first;
    Some((&entry[..pos], &entry[pos + 1..]))
}

impl Tokenizer {
    /// Build from an opened GGUF file. Supports `tokenizer.ggml.model` = `"llama"` (SentencePiece
    /// scores, e.g. Gemma 3) and `"gemma4"` (ranked merges in `tokenizer.ggml.merges`).
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        let model = file
            .get_str("tokenizer.ggml.model")
            .ok_or_else(|| gerr("missing tokenizer.ggml.model"))?;
        let tokens: Vec<String> = file
            .get_array("tokenizer.ggml.tokens")
            .and_then(|a| a.as_strings())
            .ok_or_else(|| gerr("missing or non-string tokenizer.ggml.tokens"))?
            .to_vec();
        let n = tokens.len();
        let kinds = match file.get_array("tokenizer.ggml.token_type") {
            None => vec![TokenKind::Normal; n],
            Some(a) => {
                let codes = a
                    .to_i64_vec()
                    .ok_or_else(|| gerr("tokenizer.ggml.token_type is not an integer array"))?;
                if codes.len() != n {
                    return Err(gerr(format!(
                        "{} tokens but {} token types",
                        n,
                        codes.len()
                    )));
                }
                codes
                    .into_iter()
                    .map(|c| TokenKind::from_gguf(i32::try_from(c).unwrap_or(-1)))
                    .collect::<Result<Vec<_>>>()?
            }
        };
        let (rule, space_prefix_default) = match model {
            "llama" => {
                let scores = file
                    .get_array("tokenizer.ggml.scores")
                    .and_then(|a| a.to_f32_vec())
                    .ok_or_else(|| {
                        gerr("tokenizer model \"llama\" needs a float tokenizer.ggml.scores array")
                    })?;
                // llama.cpp's SentencePiece default is to add the dummy prefix.
                (MergeRule::Scores(scores), true)
            }
            "gemma4" => {
                let merges = file
                    .get_array("tokenizer.ggml.merges")
                    .and_then(|a| a.as_strings())
                    .ok_or_else(|| {
                        gerr(
                            "tokenizer model \"gemma4\" needs a string tokenizer.ggml.merges array",
                        )
                    })?;
                let pairs = merges
                    .iter()
                    .enumerate()
                    .map(|(i, m)| {
                        split_merge(m)
                            .map(|(a, b)| (a.to_string(), b.to_string()))
                            .ok_or_else(|| gerr(format!("merge {i} {m:?} is not \"left right\"")))
                    })
                    .collect::<Result<Vec<_>>>()?;
                (MergeRule::Merges(pairs), false)
            }
            other => {
                return Err(TokenizerError::Unsupported(format!(
                    "GGUF tokenizer model {other:?} (supported: \"llama\", \"gemma4\")"
                )))
            }
        };
        let id = |key: &str| -> Result<Option<u32>> {
            match file.get(key) {
                None => Ok(None),
                Some(v) => v
                    .as_u32()
                    .map(Some)
                    .ok_or_else(|| gerr(format!("{key} is not a u32"))),
            }
        };
        let flag = |key: &str, default: bool| -> Result<bool> {
            match file.get(key) {
                None => Ok(default),
                Some(v) => v
                    .as_bool()
                    .ok_or_else(|| gerr(format!("{key} is not a bool"))),
            }
        };
        Tokenizer::from_spec(VocabSpec {
            tokens,
            kinds,
            rule,
            bos_id: id("tokenizer.ggml.bos_token_id")?,
            eos_id: id("tokenizer.ggml.eos_token_id")?,
            unk_id: id("tokenizer.ggml.unknown_token_id")?,
            pad_id: id("tokenizer.ggml.padding_token_id")?,
            add_bos: flag("tokenizer.ggml.add_bos_token", true)?,
            add_space_prefix: flag("tokenizer.ggml.add_space_prefix", space_prefix_default)?,
            ignore_merges: false,
        })
    }

    /// Open a GGUF file and build its tokenizer.
    pub fn from_gguf_path(path: &Path) -> Result<Self> {
        let file = GgufFile::open(path).map_err(|e| gerr(e.to_string()))?;
        Self::from_gguf(&file)
    }
}

impl Tokenizer {
    /// A GGUF file, or an HF checkpoint directory holding `tokenizer.json`.
    pub fn from_model_path(path: &Path) -> Result<Self> {
        if path.is_dir() {
            Self::from_hf_dir(path)
        } else {
            Self::from_gguf_path(path)
        }
    }
}

/// The chat template stored in a GGUF file, if any.
pub fn gguf_chat_template(file: &GgufFile) -> Option<String> {
    file.get_str(GGUF_CHAT_TEMPLATE_KEY).map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::split_merge;

    #[test]
    fn merge_entries_split_at_first_inner_space() {
        assert_eq!(split_merge("▁t he"), Some(("▁t", "he")));
        assert_eq!(split_merge("▁ a"), Some(("▁", "a")));
        assert_eq!(split_merge("  x"), Some((" ", "x")));
        assert_eq!(split_merge("ab"), None);
        assert_eq!(split_merge(""), None);
    }
}
