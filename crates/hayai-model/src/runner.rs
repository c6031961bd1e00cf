//! The backend-neutral interface every forward implementation (CPU reference, CUDA) provides.
//!
//! A runner owns one sequence's KV state. Tokens are fed at explicit positions so the engine can
//! roll back (speculative decoding, a new request sharing nothing) with [`Runner::truncate`].

use crate::ModelError;

/// Which logit rows a forward call hands to its sink.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rows {
    /// Only the row of the last token fed (the usual prefill/decode case).
    Last,
    /// One row per token fed, in order (perplexity, prompt logprobs, speculative verify).
    All,
}

/// Static facts about the loaded model that the engine needs.
#[derive(Clone, Debug)]
pub struct RunnerInfo {
    /// Number of logits per row.
    pub vocab_size: usize,
    /// Longest sequence (prompt + generated) the runner accepts.
    pub max_context: usize,
    /// Token ids that end generation unless the request ignores EOS.
    pub eos_token_ids: Vec<u32>,
    /// Short description of the backend ("cpu", "cuda:NVIDIA H200", ...).
    pub backend: String,
}

pub trait Runner: Send {
    fn info(&self) -> &RunnerInfo;

    /// Number of positions currently held in the KV cache.
    fn len(&self) -> usize;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drop every cached position `>= len` (`truncate(0)` starts a new sequence).
    fn truncate(&mut self, len: usize);

    /// Feed `tokens` at positions `self.len() ..`, appending them to the cache, and call
    /// `sink(i, logits)` for the selected rows (`i` indexes `tokens`). The logits slice is only
    /// valid during the call; rows arrive in increasing `i`.
    fn forward(
        &mut self,
        tokens: &[u32],
        rows: Rows,
        sink: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<(), ModelError>;

    /// Feed one token and return the argmax of its logits. Backends override this with a path
    /// that keeps the logits on the device; the result must equal `argmax(forward(..))`
    /// (lowest index wins ties).
    fn greedy_step(&mut self, token: u32) -> Result<u32, ModelError> {
        let mut best = 0u32;
        self.forward(&[token], Rows::Last, &mut |_, logits| {
            best = argmax(logits);
        })?;
        Ok(best)
    }

    /// Greedy decode from `token`: feed it, then each argmax in turn, for at most `max` steps.
    /// `on_token` sees every argmax in order and returns whether to feed it (false: stop
    /// there). Returns how many argmaxes it saw. Afterwards the cache holds what
    /// `greedy_step` in a loop leaves: `token` and every argmax seen but the last (a refused
    /// one, or the `max`-th, is not fed). A backend may compute one step ahead of `on_token`
    /// (cache rows past `len()`, discarded).
    fn greedy_decode(
        &mut self,
        token: u32,
        max: usize,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<usize, ModelError> {
        let mut t = token;
        let mut n = 0;
        while n < max {
            t = self.greedy_step(t)?;
            n += 1;
            if !on_token(t) {
                break;
            }
        }
        Ok(n)
    }
}

/// The checks every runner makes before feeding `tokens` after `cached` positions: ids inside
/// the vocabulary, and the total within the context limit.
pub fn check_feed(info: &RunnerInfo, cached: usize, tokens: &[u32]) -> Result<(), ModelError> {
    let vocab = info.vocab_size;
    if let Some(&id) = tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(ModelError::TokenOutOfRange { id, vocab });
    }
    let total = cached + tokens.len();
    if total > info.max_context {
        return Err(ModelError::ContextOverflow {
            len: total,
            max: info.max_context,
        });
    }
    Ok(())
}

/// Index of the largest value; the lowest index wins ties; NaN never wins.
pub fn argmax(xs: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in xs.iter().enumerate() {
        if v > best_v {
            best_v = v;
            best = i;
        }
    }
    best as u32
}
