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

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use hayai_model::gemma4::load_hf_dir;
    use hayai_model::synth::{synth, SynthDtype};

    use super::*;

    fn fixtures() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../hayai-model/tests/fixtures/gemma4")
    }

    fn plain_greedy(runner: &mut CpuRunner, prompt: &[u32], n: usize, stops: &[u32]) -> Vec<u32> {
        runner.truncate(0);
        let mut next = 0;
        runner
            .forward(prompt, Rows::Last, &mut |_, l| next = argmax(l))
            .unwrap();
        let mut out = Vec::new();
        loop {
            out.push(next);
            if out.len() >= n || stops.contains(&next) {
                return out;
            }
            next = runner.greedy_step(next).unwrap();
        }
    }

    /// Speculative output equals plain greedy for several draft lengths and prompts.
    fn check_identity(target: &Path, assistant: &Path, stops: &[u32]) -> (usize, usize) {
        let model = Arc::new(load_hf_dir(target).unwrap());
        let asst = Arc::new(Assistant::load_hf_dir(assistant).unwrap());
        let mut plain = CpuRunner::new(model.clone()).unwrap();
        let mut spec = CpuMtp::new(CpuRunner::new(model.clone()).unwrap(), asst).unwrap();
        let (mut drafted, mut accepted) = (0, 0);
        let vocab = model.spec.vocab as u32;
        for (pi, plen) in [1usize, 5, 23].into_iter().enumerate() {
            let prompt: Vec<u32> = (0..plen as u32)
                .map(|i| (i * 131 + 7 * pi as u32 + 3) % vocab)
                .collect();
            let want = plain_greedy(&mut plain, &prompt, 40, stops);
            for k in [1usize, 2, 4, 7] {
                let cfg = SpecConfig {
                    draft_len: k,
                    max_tokens: 40,
                    stop_tokens: stops.to_vec(),
                };
                let mut streamed = Vec::new();
                let out = generate_greedy(&mut spec, &prompt, &cfg, &mut |t| {
                    streamed.push(t);
                    true
                })
                .unwrap();
                assert_eq!(out.tokens, want, "prompt {pi}, k = {k}");
                assert_eq!(streamed, want);
                assert_eq!(out.stopped, stops.contains(want.last().unwrap()));
                assert!(out.accepted <= out.drafted);
                drafted += out.drafted;
                accepted += out.accepted;
            }
        }
        (drafted, accepted)
    }

    #[test]
    fn speculative_equals_greedy_on_transformers_fixture() {
        let f = fixtures();
        let (d, a) = check_identity(&f.join("causal"), &f.join("assistant"), &[]);
        assert!(d > 0);
        eprintln!("fixture: accepted {a} of {d} drafts");
    }

    #[test]
    fn speculative_equals_greedy_on_synthetic_models() {
        for dtype in [SynthDtype::F32, SynthDtype::Bf16] {
            let dir = tempfile::tempdir().unwrap();
            let (t, a) = (dir.path().join("t"), dir.path().join("a"));
            synth("tiny", 3, &t, dtype).unwrap();
            synth("tiny-assistant", 3, &a, dtype).unwrap();
            let (d, acc) = check_identity(&t, &a, &[]);
            eprintln!("synth {dtype:?}: accepted {acc} of {d} drafts");
            // Stop tokens end both decoders at the same place.
            check_identity(&t, &a, &[1, 106, 50, 7, 300]);
        }
    }

    #[test]
    fn rejects_a_mismatched_assistant() {
        let dir = tempfile::tempdir().unwrap();
        synth("small-assistant", 1, dir.path(), SynthDtype::Bf16).unwrap();
        let asst = Arc::new(Assistant::load_hf_dir(dir.path()).unwrap());
        let model = Arc::new(load_hf_dir(&fixtures().join("causal")).unwrap());
        let err = CpuMtp::new(CpuRunner::new(model).unwrap(), asst)
            .err()
            .unwrap();
        assert!(err.to_string().contains("hidden size"), "{err}");
    }

    /// A drafter that knows the true greedy continuation and corrupts some of it, to drive
    /// full, partial and zero acceptance, stops inside accepted drafts and `max_tokens`
    /// boundaries through the loop.
    struct Oracle {
        runner: CpuRunner,
        stream: Vec<u32>,
        vocab: u32,
    }

    impl SpecTarget for Oracle {
        fn runner(&mut self) -> &mut dyn Runner {
            &mut self.runner
        }
        fn draft(
            &mut self,
            token: u32,
            _row: usize,
            k: usize,
            stops: &[u32],
        ) -> Result<Vec<u32>, ModelError> {
            let at = self.runner.len();
            assert_eq!(self.stream[at], token, "drafting from the wrong position");
            let mut out = Vec::new();
            for j in 1..=k {
                let Some(&t) = self.stream.get(at + j) else {
                    break;
                };
                let t = if (at + j) % 5 == 3 {
                    (t + 1) % self.vocab
                } else {
                    t
                };
                out.push(t);
                if stops.contains(&t) {
                    break;
                }
            }
            Ok(out)
        }
    }

    #[test]
    fn acceptance_bookkeeping_with_an_oracle_drafter() {
        let model = Arc::new(load_hf_dir(&fixtures().join("conditional")).unwrap());
        let mut plain = CpuRunner::new(model.clone()).unwrap();
        let prompt: Vec<u32> = vec![2, 40, 41, 300, 7, 9];
        let want = plain_greedy(&mut plain, &prompt, 60, &[]);
        let mut stream = prompt.clone();
        stream.extend_from_slice(&want);
        let mut o = Oracle {
            runner: CpuRunner::new(model).unwrap(),
            stream,
            vocab: 512,
        };
        for k in [1usize, 3, 4, 8] {
            for max in [1usize, 7, 60] {
                let cfg = SpecConfig {
                    draft_len: k,
                    max_tokens: max,
                    stop_tokens: vec![],
                };
                let out = generate_greedy(&mut o, &prompt, &cfg, &mut |_| true).unwrap();
                assert_eq!(out.tokens, want[..max], "k = {k}, max = {max}");
                if max == 60 {
                    assert!(out.accepted > out.drafted / 3, "{out:?}");
                    assert!(out.tokens_per_round() > 1.5);
                }
            }
            // A stop token inside an accepted run of drafts ends generation there.
            let stop = want[20];
            let end = want.iter().position(|&t| t == stop).unwrap();
            let cfg = SpecConfig {
                draft_len: k,
                max_tokens: 60,
                stop_tokens: vec![stop],
            };
            let out = generate_greedy(&mut o, &prompt, &cfg, &mut |_| true).unwrap();
            assert_eq!(out.tokens, want[..=end]);
            assert!(out.stopped);
            // The callback can end generation early.
            let mut seen = 0;
            let out = generate_greedy(&mut o, &prompt, &cfg, &mut |_| {
                seen += 1;
                seen < 3
            })
            .unwrap();
            assert_eq!(out.tokens, want[..3.min(end + 1)]);
        }
    }
}
