//! Decode → re-encode agreement over token-id records (the perplexity records' format), used to show
//! how faithfully text round-trips through this tokenizer.

use std::borrow::Cow;
use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Result, TokenizerError};
use crate::hf::read_file;
use crate::tokenizer::Tokenizer;

/// One perplexity record: `{id, context_token_ids, target_token_ids}`.
#[derive(Clone, Debug, Deserialize)]
pub struct PplRecord {
    pub id: String,
    pub context_token_ids: Vec<u32>,
    pub target_token_ids: Vec<u32>,
}

impl PplRecord {
    /// Context followed by target: the record's whole token sequence.
    pub fn all_ids(&self) -> Vec<u32> {
        let mut v = self.context_token_ids.clone();
        v.extend_from_slice(&self.target_token_ids);
        v
    }
}

/// A token sequence to round-trip: a [`PplRecord`] (context + target), or a plain id list.
pub trait TokenSequence {
    /// A label for mismatch reports.
    fn label(&self, index: usize) -> String;
    fn token_ids(&self) -> Cow<'_, [u32]>;
}

impl TokenSequence for PplRecord {
    fn label(&self, _index: usize) -> String {
        self.id.clone()
    }
    fn token_ids(&self) -> Cow<'_, [u32]> {
        Cow::Owned(self.all_ids())
    }
}

impl TokenSequence for Vec<u32> {
    fn label(&self, index: usize) -> String {
        format!("#{index}")
    }
    fn token_ids(&self) -> Cow<'_, [u32]> {
        Cow::Borrowed(self)
    }
}

impl TokenSequence for &[u32] {
    fn label(&self, index: usize) -> String {
        format!("#{index}")
    }
    fn token_ids(&self) -> Cow<'_, [u32]> {
        Cow::Borrowed(self)
    }
}

/// Parse JSONL records; a malformed line is an error naming its line number.
pub fn parse_ppl_records(text: &str) -> Result<Vec<PplRecord>> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l)
                .map_err(|e| TokenizerError::InvalidRecord(format!("line {}: {e}", i + 1)))
        })
        .collect()
}

pub fn load_ppl_records(path: &Path) -> Result<Vec<PplRecord>> {
    parse_ppl_records(&read_file(path)?)
}

/// Where one record's re-encoding first departs from the original ids.
#[derive(Clone, Debug, Serialize)]
pub struct RoundTripMismatch {
    pub id: String,
    /// Index of the first differing token.
    pub position: usize,
    /// Up to 4 original ids from `position`.
    pub expected: Vec<u32>,
    /// Up to 4 re-encoded ids from `position`.
    pub got: Vec<u32>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct RoundTripReport {
    pub records: usize,
    /// Records whose re-encoding equals the original ids exactly.
    pub records_exact: usize,
    pub tokens: usize,
    /// Tokens belonging to exactly round-tripping records.
    pub tokens_in_exact_records: usize,
    /// Sum over records of the common prefix length of original and re-encoded ids.
    pub tokens_common_prefix: usize,
    /// Records whose re-encoded ids decode back to exactly the same text.
    pub records_text_stable: usize,
    pub mismatches: Vec<RoundTripMismatch>,
}

impl fmt::Display for RoundTripReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pct = |a: usize, b: usize| 100.0 * a as f64 / b.max(1) as f64;
        writeln!(
            f,
            "round trip: {}/{} records exact ({:.2}%), {}/{} tokens in exact records ({:.2}%), {}/{} tokens in common prefixes ({:.2}%), {}/{} records text-stable",
            self.records_exact,
            self.records,
            pct(self.records_exact, self.records),
            self.tokens_in_exact_records,
            self.tokens,
            pct(self.tokens_in_exact_records, self.tokens),
            self.tokens_common_prefix,
            self.tokens,
            pct(self.tokens_common_prefix, self.tokens),
            self.records_text_stable,
            self.records,
        )?;
        for m in &self.mismatches {
            writeln!(
                f,
                "  {}: first difference at token {}: expected {:?}, re-encoded {:?}",
                m.id, m.position, m.expected, m.got
            )?;
        }
        Ok(())
    }
}

/// Decode each sequence (special tokens kept as text), re-encode without adding BOS (special-token
/// strings parse back into special tokens), and compare. Out-of-range ids are an error.
pub fn roundtrip_report<S: TokenSequence>(
    tok: &Tokenizer,
    records: &[S],
) -> Result<RoundTripReport> {
    let mut r = RoundTripReport::default();
    for (index, rec) in records.iter().enumerate() {
        let ids = rec.token_ids();
        let ids: &[u32] = &ids;
        let text = tok.decode(ids, false)?;
        let again = tok.encode(&text, false);
        r.records += 1;
        r.tokens += ids.len();
        let prefix = ids.iter().zip(&again).take_while(|(a, b)| a == b).count();
        r.tokens_common_prefix += prefix;
        if again == ids {
            r.records_exact += 1;
            r.tokens_in_exact_records += ids.len();
        } else {
            r.mismatches.push(RoundTripMismatch {
                id: rec.label(index),
                position: prefix,
                expected: ids[prefix..].iter().take(4).copied().collect(),
                got: again[prefix.min(again.len())..]
                    .iter()
                    .take(4)
                    .copied()
                    .collect(),
            });
        }
        if tok.decode(&again, false)? == text {
            r.records_text_stable += 1;
        }
    }
    Ok(r)
}
