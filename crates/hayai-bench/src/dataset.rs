//! Prompt sets: ShareGPT JSON files and seeded random-word prompts.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{Error, Result};
use crate::rng::PyRandom;
use crate::util::read_to_string;

/// One prompt: the text sent as the single user turn (chat) or as the raw prompt (completions).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Prompt {
    /// The record's `id`, or `prompt-<index>` when the file has none.
    pub id: String,
    pub text: String,
}

/// Where prompts come from.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DatasetSpec {
    /// A ShareGPT-format JSON array `[{id?, conversations: [{from: "human", value}, ...]}, ...]`.
    ShareGpt(PathBuf),
    /// Seeded random-word prompts (see [`random_prompts`]).
    Random {
        /// Words per prompt.
        input_words: usize,
    },
}

impl DatasetSpec {
    /// Default words per random prompt (the public prompts average roughly this many tokens).
    pub const DEFAULT_RANDOM_WORDS: usize = 256;

    /// `"random"` selects random prompts; anything else is a ShareGPT file path.
    pub fn parse(s: &str) -> Self {
        if s == "random" {
            DatasetSpec::Random {
                input_words: Self::DEFAULT_RANDOM_WORDS,
            }
        } else {
            DatasetSpec::ShareGpt(PathBuf::from(s))
        }
    }

    /// Human-readable name recorded in summaries.
    pub fn describe(&self) -> String {
        match self {
            DatasetSpec::ShareGpt(p) => p.display().to_string(),
            DatasetSpec::Random { input_words } => format!("random:{input_words}-words"),
        }
    }
}

/// Load every prompt of a ShareGPT file, in file order. The prompt is the first turn whose `from` is
/// `human` or `user` (SGLang takes the first turn). A record without one is an error, not skipped.
pub fn load_sharegpt(path: &Path) -> Result<Vec<Prompt>> {
    let text = read_to_string(path)?;
    parse_sharegpt(&text).map_err(|msg| Error::Dataset {
        path: path.to_path_buf(),
        msg,
    })
}

/// Parse ShareGPT JSON text (see [`load_sharegpt`]).
pub fn parse_sharegpt(text: &str) -> std::result::Result<Vec<Prompt>, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let arr = v.as_array().ok_or("top level must be a JSON array")?;
    if arr.is_empty() {
        return Err("no records".into());
    }
    let mut out = Vec::with_capacity(arr.len());
    for (i, rec) in arr.iter().enumerate() {
        let id = match rec.get("id") {
            None | Some(Value::Null) => format!("prompt-{i}"),
            Some(Value::String(s)) => s.clone(),
            Some(Value::Number(n)) => n.to_string(),
            Some(other) => return Err(format!("record {i}: id must be a string, got {other}")),
        };
        let convs = rec
            .get("conversations")
            .and_then(Value::as_array)
            .ok_or_else(|| format!("record {i} ({id}): missing `conversations` array"))?;
        let first_user = convs
            .iter()
            .find(|t| {
                matches!(
                    t.get("from").and_then(Value::as_str),
                    Some("human" | "user")
                )
            })
            .ok_or_else(|| format!("record {i} ({id}): no human turn"))?;
        let text = first_user
            .get("value")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("record {i} ({id}): human turn has no string `value`"))?;
        if text.is_empty() {
            return Err(format!("record {i} ({id}): empty prompt"));
        }
        out.push(Prompt {
            id,
            text: text.to_string(),
        });
    }
    Ok(out)
}

/// Seed-based selection: with `shuffle`, the prompts are reordered exactly as
/// `random.seed(seed); random.shuffle(prompts)` would in Python (see [`crate::rng`]); then the first
/// `num_prompts` are kept (all of them when the set is smaller).
pub fn select(
    mut prompts: Vec<Prompt>,
    num_prompts: usize,
    seed: u64,
    shuffle: bool,
) -> Vec<Prompt> {
    if shuffle {
        PyRandom::new(seed).shuffle(&mut prompts);
    }
    prompts.truncate(num_prompts);
    prompts
}

/// Common English words used to build random prompts. Words (not token ids) keep random prompts
/// portable across servers and tokenizers; the exact token count comes from `usage.prompt_tokens`.
const WORDS: &[&str] = &[
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "he",
    "this",
    "are",
    "or",
    "his",
    "from",
    "at",
    "which",
    "but",
    "have",
    "an",
    "had",
    "they",
    "you",
    "were",
    "their",
    "one",
    "all",
    "we",
    "can",
    "her",
    "has",
    "there",
    "been",
    "if",
    "more",
    "when",
    "will",
    "would",
    "who",
    "so",
    "no",
    "time",
    "people",
    "water",
    "system",
    "number",
    "energy",
    "question",
    "answer",
    "value",
    "model",
    "light",
    "force",
    "mass",
    "field",
    "cell",
    "protein",
    "reaction",
    "market",
    "price",
    "law",
    "court",
    "state",
    "theory",
    "result",
    "method",
    "data",
    "process",
    "function",
    "group",
    "point",
    "line",
    "square",
    "circle",
    "triangle",
    "prime",
    "integer",
    "sum",
    "product",
    "angle",
    "rate",
    "temperature",
    "pressure",
    "volume",
    "electron",
    "atom",
    "molecule",
    "acid",
    "gene",
    "history",
    "city",
    "river",
    "mountain",
    "language",
    "music",
    "science",
    "student",
    "teacher",
    "patient",
    "doctor",
    "company",
    "government",
    "policy",
    "economy",
    "country",
    "war",
    "peace",
    "first",
    "second",
    "third",
    "large",
    "small",
    "new",
    "old",
    "high",
    "low",
    "long",
    "short",
    "true",
    "false",
    "between",
    "under",
    "over",
    "after",
    "before",
    "during",
    "because",
    "therefore",
    "however",
    "example",
    "consider",
    "compute",
    "determine",
    "explain",
    "find",
    "given",
    "assume",
    "suppose",
    "show",
    "prove",
    "which",
    "following",
    "best",
    "most",
    "least",
];

/// `count` prompts of `words` words each, drawn uniformly from a fixed word list with a
/// CPython-compatible generator seeded by `seed` (so the set is reproducible). Ids are `random-<i>`.
pub fn random_prompts(count: usize, words: usize, seed: u64) -> Vec<Prompt> {
    let mut rng = PyRandom::new(seed);
    (0..count)
        .map(|i| {
            let text = (0..words.max(1))
                .map(|_| WORDS[rng.randbelow(WORDS.len() as u32) as usize])
                .collect::<Vec<_>>()
                .join(" ");
            Prompt {
                id: format!("random-{i}"),
                text,
            }
        })
        .collect()
}

/// Load the prompts a [`DatasetSpec`] names and apply [`select`] (random sets are generated with
/// exactly `num_prompts` entries).
pub fn load(
    spec: &DatasetSpec,
    num_prompts: usize,
    seed: u64,
    shuffle: bool,
) -> Result<Vec<Prompt>> {
    if num_prompts == 0 {
        return Err(Error::Options("num_prompts must be at least 1".into()));
    }
    match spec {
        DatasetSpec::ShareGpt(path) => Ok(select(load_sharegpt(path)?, num_prompts, seed, shuffle)),
        DatasetSpec::Random { input_words } => Ok(random_prompts(num_prompts, *input_words, seed)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sharegpt_and_rejects_malformed() {
        let ok = r#"[{"id":"a","conversations":[{"from":"human","value":"hi"},{"from":"gpt","value":"x"}]},
                     {"conversations":[{"from":"system","value":"s"},{"from":"user","value":"yo"}]}]"#;
        let p = parse_sharegpt(ok).unwrap();
        assert_eq!(
            p[0],
            Prompt {
                id: "a".into(),
                text: "hi".into()
            }
        );
        assert_eq!(
            p[1],
            Prompt {
                id: "prompt-1".into(),
                text: "yo".into()
            }
        );
        assert!(parse_sharegpt("{}").unwrap_err().contains("array"));
        assert!(parse_sharegpt("[]").unwrap_err().contains("no records"));
        assert!(parse_sharegpt(r#"[{"id":"z"}]"#).unwrap_err().contains("z"));
        assert!(
            parse_sharegpt(r#"[{"conversations":[{"from":"gpt","value":"x"}]}]"#)
                .unwrap_err()
                .contains("no human turn")
        );
        assert!(parse_sharegpt(r#"[{"conversations":[{"from":"human","value":""}]}]"#).is_err());
    }

    #[test]
    fn selection_is_seeded_and_truncates() {
        let prompts: Vec<Prompt> = (0..10)
            .map(|i| Prompt {
                id: i.to_string(),
                text: "t".into(),
            })
            .collect();
        let s = select(prompts.clone(), 3, 1, true);
        // Python: random.seed(1); random.shuffle(list(range(10))) -> [6, 8, 9, 7, ...]
        let ids: Vec<&str> = s.iter().map(|p| p.id.as_str()).collect();
        assert_eq!(ids, ["6", "8", "9"]);
        assert_eq!(select(prompts.clone(), 50, 1, false), prompts);
    }

    #[test]
    fn random_prompts_are_reproducible() {
        let a = random_prompts(3, 20, 1);
        assert_eq!(a, random_prompts(3, 20, 1));
        assert_ne!(a, random_prompts(3, 20, 2));
        assert_eq!(a[0].text.split(' ').count(), 20);
        assert_eq!(a[2].id, "random-2");
    }

    #[test]
    fn public_prompt_file_loads() {
        let path = Path::new("/work/shared/data/eval_prompts_sharegpt.json");
        if path.exists() {
            let p = load_sharegpt(path).unwrap();
            assert_eq!(p.len(), 128);
        }
    }
}
