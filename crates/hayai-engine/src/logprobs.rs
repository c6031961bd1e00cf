//! Log-softmax statistics of one logits row.

/// `(token id, logprob)` pairs, best first.
pub type TopLogprobs = Vec<(u32, f32)>;

#[derive(Clone, Debug, PartialEq)]
pub struct LogprobEntry {
    /// The token this entry is about (the actual prompt token, or the generated one).
    pub token: u32,
    pub logprob: f32,
    /// 1-based rank of `token` among all logits (ties ranked by lower id first).
    pub rank: usize,
    pub top: TopLogprobs,
}

impl LogprobEntry {
    /// Log-softmax of `logits` evaluated at `token`, plus the `top_k` best entries.
    /// Computed in f64 so the result does not depend on summation order at f32 precision.
    pub fn from_logits(logits: &[f32], token: u32, top_k: usize) -> Self {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let sum: f64 = logits.iter().map(|&x| ((x as f64) - max).exp()).sum();
        let lse = max + sum.ln();
        let t = token as usize;
        let x = logits[t];
        let rank = 1 + logits
            .iter()
            .enumerate()
            .filter(|&(i, &v)| v > x || (v == x && i < t))
            .count();
        let mut top: TopLogprobs = Vec::new();
        if top_k > 0 {
            let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
            let k = top_k.min(idx.len());
            let cmp = |a: &u32, b: &u32| {
                logits[*b as usize]
                    .partial_cmp(&logits[*a as usize])
                    .unwrap_or(std::cmp::Ordering::Equal)
                    .then(a.cmp(b))
            };
            idx.select_nth_unstable_by(k - 1, cmp);
            idx.truncate(k);
            idx.sort_by(cmp);
            top = idx
                .into_iter()
                .map(|i| (i, ((logits[i as usize] as f64) - lse) as f32))
                .collect();
        }
        LogprobEntry {
            token,
            logprob: ((x as f64) - lse) as f32,
            rank,
            top,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprob_matches_softmax() {
        let logits = [1.0f32, 2.0, 3.0, 0.5];
        let e = LogprobEntry::from_logits(&logits, 1, 2);
        let z: f64 = logits.iter().map(|&x| (x as f64).exp()).sum();
        assert!((e.logprob as f64 - (2.0f64.exp() / z).ln()).abs() < 1e-6);
        assert_eq!(e.rank, 2);
        assert_eq!(e.top.iter().map(|p| p.0).collect::<Vec<_>>(), vec![2, 1]);
        let total: f64 = logits
            .iter()
            .enumerate()
            .map(|(i, _)| (LogprobEntry::from_logits(&logits, i as u32, 0).logprob as f64).exp())
            .sum();
        assert!((total - 1.0).abs() < 1e-6);
    }
}
