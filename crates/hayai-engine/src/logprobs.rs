//! Log-softmax statistics of one logits row.

use rayon::prelude::*;

/// `(token id, logprob)` pairs, best first.
pub type TopLogprobs = Vec<(u32, f32)>;

/// Rows are processed in fixed chunks of this many logits, in parallel; partial sums are added in
/// chunk order, so results do not depend on the thread count.
const CHUNK: usize = 1 << 14;

#[derive(Clone, Debug, PartialEq)]
pub struct LogprobEntry {
    /// The token this entry is about (the actual prompt token, or the generated one).
    pub token: u32,
    pub logprob: f32,
    /// 1-based rank of `token` among all logits (ties ranked by lower id first).
    pub rank: usize,
    pub top: TopLogprobs,
}

/// Higher logit first, then lower id (a total order, NaN treated as equal to everything).
fn better_first(logits: &[f32], a: u32, b: u32) -> std::cmp::Ordering {
    logits[b as usize]
        .partial_cmp(&logits[a as usize])
        .unwrap_or(std::cmp::Ordering::Equal)
        .then(a.cmp(&b))
}

/// The `k` best ids among `ids`, best first.
fn best_k(logits: &[f32], mut ids: Vec<u32>, k: usize) -> Vec<u32> {
    let k = k.min(ids.len());
    if k == 0 {
        return Vec::new();
    }
    let cmp = |a: &u32, b: &u32| better_first(logits, *a, *b);
    ids.select_nth_unstable_by(k - 1, cmp);
    ids.truncate(k);
    ids.sort_by(cmp);
    ids
}

impl LogprobEntry {
    /// Log-softmax of `logits` evaluated at `token`, plus the `top_k` best entries.
    /// Computed in f64 so the result does not depend on summation order at f32 precision; a
    /// 262,144-wide row is split into fixed chunks processed in parallel.
    pub fn from_logits(logits: &[f32], token: u32, top_k: usize) -> Self {
        let t = token as usize;
        let x = logits[t];
        let max = logits
            .par_chunks(CHUNK)
            .map(|c| c.iter().copied().fold(f32::NEG_INFINITY, f32::max))
            .reduce(|| f32::NEG_INFINITY, f32::max) as f64;
        // Per chunk: sum of exp(v - max), logits ranked before `token`, the chunk's best ids.
        let parts: Vec<(f64, usize, Vec<u32>)> = logits
            .par_chunks(CHUNK)
            .enumerate()
            .map(|(ci, c)| {
                let base = ci * CHUNK;
                let mut sum = 0f64;
                let mut before = 0usize;
                for (j, &v) in c.iter().enumerate() {
                    sum += ((v as f64) - max).exp();
                    before += (v > x || (v == x && base + j < t)) as usize;
                }
                let top = if top_k > 0 {
                    best_k(
                        logits,
                        (base as u32..(base + c.len()) as u32).collect(),
                        top_k,
                    )
                } else {
                    Vec::new()
                };
                (sum, before, top)
            })
            .collect();
        let sum: f64 = parts.iter().map(|p| p.0).sum();
        let lse = max + sum.ln();
        let rank = 1 + parts.iter().map(|p| p.1).sum::<usize>();
        let top = best_k(logits, parts.into_iter().flat_map(|p| p.2).collect(), top_k)
            .into_iter()
            .map(|i| (i, ((logits[i as usize] as f64) - lse) as f32))
            .collect();
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

    /// Rows wider than one chunk (the real vocabulary is 16 chunks) agree with a plain
    /// sequential computation: logprob to f64 rounding, rank and top-k exactly (ties by id).
    #[test]
    fn chunked_row_matches_sequential() {
        let n = 3 * CHUNK + 1234;
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let logits: Vec<f32> = (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                // Coarse values: many exact ties across chunks.
                ((s >> 40) % 2000) as f32 / 64.0 - 10.0
            })
            .collect();
        for &token in &[
            0u32,
            17,
            CHUNK as u32,
            (2 * CHUNK + 5) as u32,
            (n - 1) as u32,
        ] {
            let e = LogprobEntry::from_logits(&logits, token, 5);
            let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
            let lse = max
                + logits
                    .iter()
                    .map(|&v| (v as f64 - max).exp())
                    .sum::<f64>()
                    .ln();
            let x = logits[token as usize];
            assert!((e.logprob as f64 - (x as f64 - lse)).abs() < 1e-6);
            let rank = 1 + logits
                .iter()
                .enumerate()
                .filter(|&(i, &v)| v > x || (v == x && i < token as usize))
                .count();
            assert_eq!(e.rank, rank);
            let mut ids: Vec<u32> = (0..n as u32).collect();
            ids.sort_by(|a, b| better_first(&logits, *a, *b));
            assert_eq!(
                e.top.iter().map(|p| p.0).collect::<Vec<_>>(),
                ids[..5].to_vec()
            );
        }
    }
}
