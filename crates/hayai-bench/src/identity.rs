//! Greedy-identity comparison of two captures (HARNESS.md §3.1).
//!
//! * `INCOMPARABLE`: the captures do not cover the same prompt ids, or a prompt id was sent as
//!   different templated token ids (different prompt sets / templates).
//! * `DIVERGENT`: some record's generated ids differ; the first differing index is reported (a
//!   length difference diverges at the shorter length).
//! * `GREEDY_IDENTICAL`: every record's ids are equal, length included.
//!
//! Suggested exit codes (see [`IdentityResult::exit_code`]): 0 identical, 1 divergent,
//! 2 incomparable.

use std::collections::HashMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::capture::{load_capture, CaptureRecord};
use crate::error::Result;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum IdentityVerdict {
    GreedyIdentical,
    Divergent,
    Incomparable,
}

impl IdentityVerdict {
    pub fn as_str(self) -> &'static str {
        match self {
            IdentityVerdict::GreedyIdentical => "GREEDY_IDENTICAL",
            IdentityVerdict::Divergent => "DIVERGENT",
            IdentityVerdict::Incomparable => "INCOMPARABLE",
        }
    }
}

/// Where one record's outputs first differ.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Divergence {
    pub id: String,
    pub first_diff_index: usize,
    pub len_a: usize,
    pub len_b: usize,
    /// The ids at `first_diff_index` (`None` past the end of a shorter output).
    pub token_a: Option<u32>,
    pub token_b: Option<u32>,
}

/// Result of [`compare_captures`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdentityResult {
    pub verdict: IdentityVerdict,
    pub num_records_a: usize,
    pub num_records_b: usize,
    /// Records present in both with the same prompt ids.
    pub num_compared: usize,
    pub num_identical: usize,
    /// Divergent records, in capture A's order.
    pub divergent: Vec<Divergence>,
    /// The divergence with the smallest index (ties: first in A's order).
    pub earliest: Option<Divergence>,
    pub only_in_a: Vec<String>,
    pub only_in_b: Vec<String>,
    /// Ids present in both whose templated prompt ids differ.
    pub prompt_mismatch: Vec<String>,
}

impl IdentityResult {
    /// 0 identical, 1 divergent, 2 incomparable.
    pub fn exit_code(&self) -> i32 {
        match self.verdict {
            IdentityVerdict::GreedyIdentical => 0,
            IdentityVerdict::Divergent => 1,
            IdentityVerdict::Incomparable => 2,
        }
    }

    pub fn render(&self) -> String {
        let mut o = format!(
            "{}: {} of {} compared records identical (A has {}, B has {})\n",
            self.verdict.as_str(),
            self.num_identical,
            self.num_compared,
            self.num_records_a,
            self.num_records_b
        );
        let list = |v: &[String]| {
            let mut s = v.iter().take(10).cloned().collect::<Vec<_>>().join(", ");
            if v.len() > 10 {
                s.push_str(&format!(", ... ({} total)", v.len()));
            }
            s
        };
        if !self.only_in_a.is_empty() {
            o.push_str(&format!("only in A: {}\n", list(&self.only_in_a)));
        }
        if !self.only_in_b.is_empty() {
            o.push_str(&format!("only in B: {}\n", list(&self.only_in_b)));
        }
        if !self.prompt_mismatch.is_empty() {
            o.push_str(&format!(
                "prompt ids differ: {}\n",
                list(&self.prompt_mismatch)
            ));
        }
        if let Some(e) = &self.earliest {
            o.push_str(&format!(
                "earliest divergence: {} at index {} (A={:?}, B={:?}; lengths {} vs {})\n",
                e.id, e.first_diff_index, e.token_a, e.token_b, e.len_a, e.len_b
            ));
        }
        for d in self.divergent.iter().take(20) {
            o.push_str(&format!(
                "  {}: first difference at {} (lengths {} vs {})\n",
                d.id, d.first_diff_index, d.len_a, d.len_b
            ));
        }
        if self.divergent.len() > 20 {
            o.push_str(&format!(
                "  ... {} divergent records in total\n",
                self.divergent.len()
            ));
        }
        o
    }

    pub fn print(&self) {
        print!("{}", self.render());
    }
}

/// First index where `a` and `b` differ, or `None` when identical (length included).
pub fn first_difference(a: &[u32], b: &[u32]) -> Option<usize> {
    match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(i) => Some(i),
        None if a.len() != b.len() => Some(a.len().min(b.len())),
        None => None,
    }
}

/// Compare two captures record by record (matched by id).
pub fn compare_captures(a: &[CaptureRecord], b: &[CaptureRecord]) -> IdentityResult {
    let b_by_id: HashMap<&str, &CaptureRecord> = b.iter().map(|r| (r.id.as_str(), r)).collect();
    let a_ids: HashMap<&str, ()> = a.iter().map(|r| (r.id.as_str(), ())).collect();
    let only_in_b: Vec<String> = b
        .iter()
        .filter(|r| !a_ids.contains_key(r.id.as_str()))
        .map(|r| r.id.clone())
        .collect();
    let mut only_in_a = Vec::new();
    let mut prompt_mismatch = Vec::new();
    let mut divergent = Vec::new();
    let mut num_compared = 0;
    for ra in a {
        let Some(rb) = b_by_id.get(ra.id.as_str()) else {
            only_in_a.push(ra.id.clone());
            continue;
        };
        if ra.prompt_token_ids_sha256 != rb.prompt_token_ids_sha256
            || ra.num_prompt_tokens != rb.num_prompt_tokens
        {
            prompt_mismatch.push(ra.id.clone());
            continue;
        }
        num_compared += 1;
        if let Some(i) = first_difference(&ra.token_ids, &rb.token_ids) {
            divergent.push(Divergence {
                id: ra.id.clone(),
                first_diff_index: i,
                len_a: ra.token_ids.len(),
                len_b: rb.token_ids.len(),
                token_a: ra.token_ids.get(i).copied(),
                token_b: rb.token_ids.get(i).copied(),
            });
        }
    }
    let earliest = divergent.iter().min_by_key(|d| d.first_diff_index).cloned();
    let verdict = if !only_in_a.is_empty() || !only_in_b.is_empty() || !prompt_mismatch.is_empty() {
        IdentityVerdict::Incomparable
    } else if !divergent.is_empty() {
        IdentityVerdict::Divergent
    } else {
        IdentityVerdict::GreedyIdentical
    };
    IdentityResult {
        verdict,
        num_records_a: a.len(),
        num_records_b: b.len(),
        num_compared,
        num_identical: num_compared - divergent.len(),
        divergent,
        earliest,
        only_in_a,
        only_in_b,
        prompt_mismatch,
    }
}

/// Load two `decode_outputs.jsonl` files and compare them.
pub fn compare_capture_files(a: &Path, b: &Path) -> Result<IdentityResult> {
    Ok(compare_captures(&load_capture(a)?, &load_capture(b)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::ids_sha256;

    fn rec(id: &str, prompt: &[u32], ids: &[u32]) -> CaptureRecord {
        CaptureRecord {
            id: id.into(),
            prompt_sha256: "x".into(),
            prompt_token_ids_sha256: ids_sha256(prompt),
            num_prompt_tokens: prompt.len(),
            token_ids: ids.to_vec(),
            num_tokens: ids.len(),
            sha256: ids_sha256(ids),
            finish_reason: None,
        }
    }

    #[test]
    fn first_difference_cases() {
        assert_eq!(first_difference(&[1, 2, 3], &[1, 2, 3]), None);
        assert_eq!(first_difference(&[1, 2, 3], &[1, 9, 3]), Some(1));
        assert_eq!(first_difference(&[1, 2], &[1, 2, 3]), Some(2));
        assert_eq!(first_difference(&[], &[]), None);
        assert_eq!(first_difference(&[4], &[]), Some(0));
    }

    #[test]
    fn identical_regardless_of_order() {
        let a = vec![rec("p1", &[2, 5], &[7, 8]), rec("p2", &[2, 6], &[9])];
        let b = vec![a[1].clone(), a[0].clone()];
        let r = compare_captures(&a, &b);
        assert_eq!(r.verdict, IdentityVerdict::GreedyIdentical);
        assert_eq!((r.num_compared, r.num_identical), (2, 2));
        assert_eq!(r.exit_code(), 0);
        assert!(r.render().starts_with("GREEDY_IDENTICAL"));
    }

    #[test]
    fn divergence_reports_earliest_index_and_lengths() {
        let a = vec![
            rec("p1", &[2], &[1, 2, 3, 4]),
            rec("p2", &[3], &[1, 2, 3]),
            rec("p3", &[4], &[5, 5]),
        ];
        let b = vec![
            rec("p1", &[2], &[1, 2, 3, 9]),
            rec("p2", &[3], &[1, 7, 3]),
            rec("p3", &[4], &[5, 5, 5]), // longer: diverges at 2
        ];
        let r = compare_captures(&a, &b);
        assert_eq!(r.verdict, IdentityVerdict::Divergent);
        assert_eq!(r.exit_code(), 1);
        let idx: Vec<(&str, usize)> = r
            .divergent
            .iter()
            .map(|d| (d.id.as_str(), d.first_diff_index))
            .collect();
        assert_eq!(idx, [("p1", 3), ("p2", 1), ("p3", 2)]);
        let e = r.earliest.as_ref().unwrap();
        assert_eq!(
            (e.id.as_str(), e.token_a, e.token_b),
            ("p2", Some(2), Some(7))
        );
        assert_eq!(
            (r.divergent[2].token_a, r.divergent[2].token_b),
            (None, Some(5))
        );
        assert!(r.render().contains("earliest divergence: p2 at index 1"));
    }

    #[test]
    fn different_prompt_sets_are_incomparable() {
        let a = vec![rec("p1", &[2], &[1]), rec("p2", &[3], &[1])];
        let b = vec![rec("p1", &[2], &[1]), rec("p3", &[3], &[1])];
        let r = compare_captures(&a, &b);
        assert_eq!(r.verdict, IdentityVerdict::Incomparable);
        assert_eq!(
            (r.only_in_a.clone(), r.only_in_b.clone()),
            (vec!["p2".to_string()], vec!["p3".to_string()])
        );
        assert_eq!(r.exit_code(), 2);
        // Same ids but different templated prompt ids (e.g. another chat template).
        let c = vec![rec("p1", &[2, 1], &[1]), rec("p2", &[3], &[1])];
        let r = compare_captures(&a, &c);
        assert_eq!(r.verdict, IdentityVerdict::Incomparable);
        assert_eq!(r.prompt_mismatch, vec!["p1".to_string()]);
        // Even with divergent outputs, incomparable wins.
        let d = vec![rec("p1", &[2], &[9])];
        assert_eq!(
            compare_captures(&a, &d).verdict,
            IdentityVerdict::Incomparable
        );
    }
}
