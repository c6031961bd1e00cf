//! Greedy speculative decoding with a drafter (Gemma 4's MTP assistant).
//!
//! Each round: the drafter proposes up to `k` tokens after the newest token `t` (not yet run
//! through the target); the target runs once on `[t, d1..dk]` and yields its own greedy choice
//! `g_j` after each prefix; the longest prefix with `d_{j+1} == g_j` is accepted, then the
//! target's `g_m` follows. Rejected positions are rolled back with [`Runner::truncate`]. The
//! output is exactly plain greedy decoding of the target (the target decides every token),
//! provided its batched and single-token forwards agree — which the tests check.
//!
//! The loop is backend-neutral: a backend provides a [`SpecTarget`] (its runner plus a way to
//! draft from the target's state); [`CpuMtp`] is the CPU reference pairing.

use std::sync::Arc;

use hayai_model::assistant::{Assistant, Donors, KvView};
use hayai_model::cpu::CpuRunner;
use hayai_model::{argmax, ModelError, Rows, Runner};

/// A target model that can also draft continuations from its own current state.
pub trait SpecTarget {
    fn runner(&mut self) -> &mut dyn Runner;

    /// Propose up to `k` tokens following `token`, which is not yet in the target's cache.
    /// `row` indexes the tokens fed by the target's last `forward` call: the one whose logits
    /// produced `token` (its hidden state seeds the drafter). Drafting stops after a token in
    /// `stops`.
    fn draft(
        &mut self,
        token: u32,
        row: usize,
        k: usize,
        stops: &[u32],
    ) -> Result<Vec<u32>, ModelError>;
}

#[derive(Clone, Debug)]
pub struct SpecConfig {
    /// Draft tokens per round (>= 1).
    pub draft_len: usize,
    /// Tokens to generate at most (>= 1).
    pub max_tokens: usize,
    /// Generation ends after any of these (it is included in the output).
    pub stop_tokens: Vec<u32>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpecOutput {
    pub tokens: Vec<u32>,
    /// Ended on a stop token (otherwise on `max_tokens`).
    pub stopped: bool,
    /// Verify passes of the target (prefill excluded).
    pub rounds: usize,
    pub drafted: usize,
    pub accepted: usize,
}

impl SpecOutput {
    /// Mean tokens produced per target verify pass.
    pub fn tokens_per_round(&self) -> f64 {
        if self.rounds == 0 {
            0.0
        } else {
            (self.accepted + self.rounds) as f64 / self.rounds as f64
        }
    }
}

/// Greedy generation from `prompt` with speculative verification. `on_token` sees each token
/// as soon as it is final; returning `false` stops generation after it.
pub fn generate_greedy(
    target: &mut dyn SpecTarget,
    prompt: &[u32],
    cfg: &SpecConfig,
    on_token: &mut dyn FnMut(u32) -> bool,
) -> Result<SpecOutput, ModelError> {
    if prompt.is_empty() {
        return Err(ModelError::Backend("the prompt is empty".into()));
    }
    if cfg.draft_len == 0 || cfg.max_tokens == 0 {
        return Err(ModelError::Backend(
            "draft_len and max_tokens must be at least 1".into(),
        ));
    }
    let max_context = target.runner().info().max_context;
    let runner = target.runner();
    runner.truncate(0);
    let mut next = 0u32;
    runner.forward(prompt, Rows::Last, &mut |_, logits| next = argmax(logits))?;
    let mut row = prompt.len() - 1;
    let mut out = SpecOutput::default();

    // Record a final token; `true` when generation must end.
    let emit = |out: &mut SpecOutput, t: u32, on_token: &mut dyn FnMut(u32) -> bool| -> bool {
        out.tokens.push(t);
        let go_on = on_token(t);
        if cfg.stop_tokens.contains(&t) {
            out.stopped = true;
            return true;
        }
        !go_on || out.tokens.len() >= cfg.max_tokens
    };

    loop {
        if emit(&mut out, next, on_token) {
            return Ok(out);
        }
        let base = target.runner().len();
        // `next` plus the drafts must fit the context; drafts past max_tokens are useless.
        let room = max_context.saturating_sub(base + 1);
        let k = cfg
            .draft_len
            .min(cfg.max_tokens - out.tokens.len())
            .min(room);
        let drafts = if k > 0 {
            let mut d = target.draft(next, row, k, &cfg.stop_tokens)?;
            d.truncate(k);
            d
        } else {
            Vec::new()
        };
        let mut feed = Vec::with_capacity(1 + drafts.len());
        feed.push(next);
        feed.extend_from_slice(&drafts);
        let mut preds = vec![0u32; feed.len()];
        target
            .runner()
            .forward(&feed, Rows::All, &mut |i, logits| preds[i] = argmax(logits))?;
        out.rounds += 1;
        out.drafted += drafts.len();
        let m = drafts
            .iter()
            .zip(&preds)
            .take_while(|(d, p)| d == p)
            .count();
        out.accepted += m;
        for &d in &drafts[..m] {
            if emit(&mut out, d, on_token) {
                return Ok(out);
            }
        }
        target.runner().truncate(base + 1 + m);
        row = m;
        next = preds[m];
    }
}

/// The CPU reference target with its MTP assistant.
pub struct CpuMtp {
    pub runner: CpuRunner,
    pub assistant: Arc<Assistant>,
    donors: Donors,
}

impl CpuMtp {
    pub fn new(runner: CpuRunner, assistant: Arc<Assistant>) -> Result<Self, ModelError> {
        let donors = assistant.donors(&runner.model().spec)?;
        Ok(CpuMtp {
            runner,
            assistant,
            donors,
        })
    }
}

fn kv(runner: &CpuRunner, layer: usize) -> Result<KvView<'_>, ModelError> {
    runner
        .kv_cache(layer)
        .map(|(k, v)| KvView { k, v })
        .ok_or_else(|| ModelError::Backend(format!("target layer {layer} holds no K/V")))
}

impl SpecTarget for CpuMtp {
    fn runner(&mut self) -> &mut dyn Runner {
        &mut self.runner
    }

    fn draft(
        &mut self,
        token: u32,
        row: usize,
        k: usize,
        stops: &[u32],
    ) -> Result<Vec<u32>, ModelError> {
        let r = &self.runner;
        let hsz = r.model().spec.hidden;
        let hs = r.hidden_states();
        if (row + 1) * hsz > hs.len() {
            return Err(ModelError::Backend(format!(
                "no hidden state for row {row} of the last forward"
            )));
        }
        // The draft query sits at the position of `token`; the target holds K/V for all
        // positions before it.
        let pos = r.len();
        let mut hidden = hs[row * hsz..(row + 1) * hsz].to_vec();
        // A donor type no assistant layer uses is absent (`Donors` marks it usize::MAX).
        let view = |layer: usize| {
            if layer == usize::MAX {
                Ok(KvView { k: &[], v: &[] })
            } else {
                kv(r, layer)
            }
        };
        let (sliding, full) = (view(self.donors.sliding)?, view(self.donors.full)?);
        let mut tok = token;
        let mut drafts = Vec::with_capacity(k);
        for _ in 0..k {
            let e = r.embed(&[tok]);
            let step = self
                .assistant
                .step(&e, &hidden, pos, sliding, full, pos, false)?;
            tok = step.token;
            hidden = step.hidden;
            drafts.push(tok);
            if stops.contains(&tok) {
                break;
            }
        }
        Ok(drafts)
    }
}
