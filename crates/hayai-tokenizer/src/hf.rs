//! Building a [`Tokenizer`] from HF `tokenizer.json` (+ `tokenizer_config.json`), the format HF Gemma 3 / 4
//! checkpoints ship: a BPE model with merges and byte fallback behind a `" " → "▁"` normalizer.

use std::collections::HashMap;
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use crate::error::{Result, TokenizerError};
use crate::tokenizer::{parse_byte_token, MergeRule, TokenKind, Tokenizer, VocabSpec};

#[derive(Deserialize)]
struct TokenizerJson {
    #[serde(default)]
    added_tokens: Vec<AddedToken>,
    #[serde(default)]
    normalizer: Option<Value>,
    #[serde(default)]
    pre_tokenizer: Option<Value>,
    model: ModelJson,
}

#[derive(Deserialize)]
struct AddedToken {
    id: u32,
    content: String,
    #[serde(default)]
    special: bool,
}

#[derive(Deserialize)]
struct ModelJson {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    vocab: HashMap<String, u32>,
    #[serde(default)]
    merges: Vec<MergeEntry>,
    #[serde(default)]
    byte_fallback: bool,
    #[serde(default)]
    ignore_merges: bool,
    #[serde(default)]
    unk_token: Option<String>,
}

/// Older files store merges as `"a b"`, newer ones as `["a", "b"]`.
#[derive(Deserialize)]
#[serde(untagged)]
enum MergeEntry {
    Joined(String),
    Pair(String, String),
}

fn unsupported(msg: impl Into<String>) -> TokenizerError {
    TokenizerError::Unsupported(msg.into())
}

fn json_err(what: &str, source: serde_json::Error) -> TokenizerError {
    TokenizerError::Json {
        what: what.to_string(),
        source,
    }
}

pub(crate) fn read_file(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| TokenizerError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Returns whether the normalizer prepends `▁`. Only the normalizers Gemma uses are accepted; anything
/// else would silently change token ids, so it is an error.
fn check_normalizer(n: &Value) -> Result<bool> {
    if n.is_null() {
        return Err(unsupported(
            "tokenizer.json without a normalizer (expected Replace \" \" -> \"▁\")",
        ));
    }
    let mut replaces = false;
    let mut prepends = false;
    let items: Vec<&Value> = match n.get("type").and_then(Value::as_str) {
        Some("Sequence") => n
            .get("normalizers")
            .and_then(Value::as_array)
            .map(|a| a.iter().collect())
            .unwrap_or_default(),
        _ => vec![n],
    };
    for item in items {
        match item.get("type").and_then(Value::as_str) {
            Some("Replace") => {
                let pat = item.get("pattern").and_then(|p| p.get("String"));
                let content = item.get("content").and_then(Value::as_str);
                if pat.and_then(Value::as_str) != Some(" ") || content != Some("\u{2581}") {
                    return Err(unsupported(format!(
                        "normalizer Replace other than \" \" -> \"▁\": {item}"
                    )));
                }
                replaces = true;
            }
            Some("Prepend") if item.get("prepend").and_then(Value::as_str) == Some("\u{2581}") => {
                prepends = true;
            }
            other => {
                return Err(unsupported(format!("normalizer {other:?}: {item}")));
            }
        }
    }
    if !replaces {
        return Err(unsupported("normalizer does not replace \" \" with \"▁\""));
    }
    Ok(prepends)
}

fn token_string(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_string),
        _ => None,
    }
}

/// Settings read from `tokenizer_config.json`.
#[derive(Clone, Debug, Default)]
pub struct HfTokenizerConfig {
    pub add_bos_token: Option<bool>,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub unk_token: Option<String>,
    pub pad_token: Option<String>,
    pub chat_template: Option<String>,
}

impl HfTokenizerConfig {
    pub fn from_json(text: &str) -> Result<Self> {
        let v: Value =
            serde_json::from_str(text).map_err(|e| json_err("tokenizer_config.json", e))?;
        let s = |k: &str| v.get(k).and_then(token_string);
        // `chat_template` is a string, or a list of {name, template} where "default" is the chat one.
        let chat_template = match v.get("chat_template") {
            Some(Value::String(t)) => Some(t.clone()),
            Some(Value::Array(list)) => list
                .iter()
                .find(|e| e.get("name").and_then(Value::as_str) == Some("default"))
                .or_else(|| list.first())
                .and_then(|e| e.get("template"))
                .and_then(Value::as_str)
                .map(str::to_string),
            _ => None,
        };
        Ok(HfTokenizerConfig {
            add_bos_token: v.get("add_bos_token").and_then(Value::as_bool),
            bos_token: s("bos_token"),
            eos_token: s("eos_token"),
            unk_token: s("unk_token"),
            pad_token: s("pad_token"),
            chat_template,
        })
    }
}

impl Tokenizer {
    /// Build from the text of `tokenizer.json` and (optionally) `tokenizer_config.json`.
    pub fn from_hf_json(tokenizer_json: &str, config: Option<&HfTokenizerConfig>) -> Result<Self> {
        let tj: TokenizerJson =
            serde_json::from_str(tokenizer_json).map_err(|e| json_err("tokenizer.json", e))?;
        if let Some(kind) = tj.model.kind.as_deref() {
            if kind != "BPE" {
                return Err(unsupported(format!(
                    "tokenizer.json model type {kind:?} (expected BPE)"
                )));
            }
        }
        let mut add_space_prefix =
            check_normalizer(tj.normalizer.as_ref().unwrap_or(&Value::Null))?;
        match &tj.pre_tokenizer {
            None | Some(Value::Null) => {}
            Some(p)
                if p.get("type").and_then(Value::as_str) == Some("Metaspace")
                    && p.get("split").and_then(Value::as_bool) == Some(false) =>
            {
                if p.get("prepend_scheme").and_then(Value::as_str) != Some("never") {
                    add_space_prefix = true;
                }
            }
            Some(p) => return Err(unsupported(format!("pre_tokenizer {p}"))),
        }

        let size = tj
            .model
            .vocab
            .values()
            .chain(tj.added_tokens.iter().map(|a| &a.id))
            .map(|&id| id as usize + 1)
            .max()
            .unwrap_or(0);
        // Ids must be dense; checking before allocating keeps a stray huge id from exhausting memory.
        if size > tj.model.vocab.len() + tj.added_tokens.len() {
            return Err(TokenizerError::InvalidVocab(format!(
                "token ids are not contiguous (largest id {} for {} entries)",
                size - 1,
                tj.model.vocab.len() + tj.added_tokens.len()
            )));
        }
        let mut tokens: Vec<Option<String>> = vec![None; size];
        let mut kinds = vec![TokenKind::Normal; size];
        for (text, &id) in &tj.model.vocab {
            tokens[id as usize] = Some(text.clone());
            if tj.model.byte_fallback && parse_byte_token(text).is_some() {
                kinds[id as usize] = TokenKind::Byte;
            }
        }
        for a in &tj.added_tokens {
            if let Some(existing) = &tokens[a.id as usize] {
                if *existing != a.content {
                    return Err(TokenizerError::InvalidVocab(format!(
                        "added token {} {:?} conflicts with vocabulary entry {:?}",
                        a.id, a.content, existing
                    )));
                }
            }
            tokens[a.id as usize] = Some(a.content.clone());
            kinds[a.id as usize] = if a.special {
                TokenKind::Control
            } else {
                TokenKind::UserDefined
            };
        }
        let tokens = tokens
            .into_iter()
            .enumerate()
            .map(|(i, t)| {
                t.ok_or_else(|| TokenizerError::InvalidVocab(format!("no token with id {i}")))
            })
            .collect::<Result<Vec<_>>>()?;

        let merges = tj
            .model
            .merges
            .into_iter()
            .enumerate()
            .map(|(i, m)| match m {
                MergeEntry::Pair(a, b) => Ok((a, b)),
                MergeEntry::Joined(s) => match s.split_once(' ') {
                    Some((a, b)) => Ok((a.to_string(), b.to_string())),
                    None => Err(TokenizerError::InvalidVocab(format!(
                        "merge {i} {s:?} is not \"left right\""
                    ))),
                },
            })
            .collect::<Result<Vec<_>>>()?;

        let find = |name: Option<String>, fallback: &str| -> Option<u32> {
            let name = name.unwrap_or_else(|| fallback.to_string());
            tokens.iter().rposition(|t| *t == name).map(|i| i as u32)
        };
        let cfg = config.cloned().unwrap_or_default();
        let unk_id = find(
            cfg.unk_token.clone().or(tj.model.unk_token.clone()),
            "<unk>",
        );
        if let Some(u) = unk_id {
            if kinds[u as usize] == TokenKind::Normal {
                kinds[u as usize] = TokenKind::Unknown;
            }
        }
        Tokenizer::from_spec(VocabSpec {
            bos_id: find(cfg.bos_token.clone(), "<bos>"),
            eos_id: find(cfg.eos_token.clone(), "<eos>"),
            pad_id: find(cfg.pad_token.clone(), "<pad>"),
            unk_id,
            tokens,
            kinds,
            rule: MergeRule::Merges(merges),
            add_bos: cfg.add_bos_token.unwrap_or(true),
            add_space_prefix,
            ignore_merges: tj.model.ignore_merges,
        })
    }

    /// Load `tokenizer.json` and, when present beside it, `tokenizer_config.json` from a checkpoint
    /// directory.
    pub fn from_hf_dir(dir: &Path) -> Result<Self> {
        let tj = read_file(&dir.join("tokenizer.json"))?;
        let cfg_path = dir.join("tokenizer_config.json");
        let cfg = if cfg_path.exists() {
            Some(HfTokenizerConfig::from_json(&read_file(&cfg_path)?)?)
        } else {
            None
        };
        Self::from_hf_json(&tj, cfg.as_ref())
    }
}

/// The chat template of an HF checkpoint directory: `chat_template.jinja` if present, else
/// `tokenizer_config.json`'s `chat_template`.
pub fn hf_chat_template(dir: &Path) -> Result<Option<String>> {
    let jinja = dir.join("chat_template.jinja");
    if jinja.exists() {
        return read_file(&jinja).map(Some);
    }
    let cfg_path = dir.join("tokenizer_config.json");
    if cfg_path.exists() {
        return Ok(HfTokenizerConfig::from_json(&read_file(&cfg_path)?)?.chat_template);
    }
    Ok(None)
}
