//! Generation on top of a [`hayai_model::Runner`]: the decode loop, sampling, stop rules and
//! log-probabilities. One [`Engine`] serves one sequence at a time; the server owns it on one
//! thread and queues requests in front of it.

pub mod logprobs;
pub mod sampling;
pub mod speculative;

use std::time::{Duration, Instant};

use hayai_model::{argmax, ModelError, Rows, Runner, RunnerInfo};
use thiserror::Error;

pub use logprobs::{LogprobEntry, TopLogprobs};
pub use sampling::{Sampler, SamplingParams};

#[derive(Debug, Error)]
pub enum EngineError {
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error(transparent)]
    Model(#[from] ModelError),
}

/// One generation request, already tokenized.
#[derive(Clone, Debug)]
pub struct GenRequest {
    pub prompt: Vec<u32>,
    /// Number of tokens to generate at most (>= 1).
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Extra token ids that end generation (in addition to the model's EOS set).
    pub stop_token_ids: Vec<u32>,
    /// Ignore the model's EOS set (extra `stop_token_ids` still apply).
    pub ignore_eos: bool,
    /// Per prompt position (from the second), the logprob of the actual token plus this many
    /// top entries.
    pub prompt_logprobs: Option<usize>,
    /// Per generated token, its logprob plus this many top entries.
    pub logprobs: Option<usize>,
}

impl GenRequest {
    pub fn greedy(prompt: Vec<u32>, max_tokens: usize) -> Self {
        GenRequest {
            prompt,
            max_tokens,
            sampling: SamplingParams::greedy(),
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            prompt_logprobs: None,
            logprobs: None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// `max_tokens` reached.
    Length,
    /// An EOS or stop token was generated (it is included in `tokens`).
    Stop,
    /// The caller's token callback asked to stop (stop string, disconnect).
    Cancelled,
}

impl FinishReason {
    pub fn as_openai(&self) -> &'static str {
        match self {
            FinishReason::Length => "length",
            FinishReason::Stop | FinishReason::Cancelled => "stop",
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct Timings {
    pub prefill: Duration,
    pub decode: Duration,
    /// Time from the call to the first generated token.
    pub ttft: Duration,
}

#[derive(Clone, Debug)]
pub struct GenOutput {
    pub tokens: Vec<u32>,
    pub finish: FinishReason,
    /// One entry per prompt token; entry 0 is `None` (nothing predicts the first token).
    pub prompt_logprobs: Option<Vec<Option<LogprobEntry>>>,
    /// One entry per generated token.
    pub logprobs: Option<Vec<LogprobEntry>>,
    pub timings: Timings,
}

/// What the token callback tells the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Stop,
}

pub struct Engine {
    runner: Box<dyn Runner>,
}

impl Engine {
    pub fn new(runner: Box<dyn Runner>) -> Self {
        Engine { runner }
    }

    pub fn info(&self) -> &RunnerInfo {
        self.runner.info()
    }

    pub fn runner_mut(&mut self) -> &mut dyn Runner {
        self.runner.as_mut()
    }

    /// Check a request against the model without running anything.
    pub fn validate(&self, req: &GenRequest) -> Result<(), EngineError> {
        let info = self.runner.info();
        if req.prompt.is_empty() {
            return Err(EngineError::InvalidRequest("the prompt is empty".into()));
        }
        if req.max_tokens == 0 {
            return Err(EngineError::InvalidRequest(
                "max_tokens must be at least 1".into(),
            ));
        }
        if let Some(&bad) = req.prompt.iter().find(|&&t| t as usize >= info.vocab_size) {
            return Err(EngineError::InvalidRequest(format!(
                "prompt token id {bad} is out of range (vocabulary has {} entries)",
                info.vocab_size
            )));
        }
        let total = req.prompt.len() + req.max_tokens;
        if total > info.max_context {
            return Err(EngineError::InvalidRequest(format!(
                "prompt ({} tokens) plus max_tokens ({}) exceeds the context limit of {}",
                req.prompt.len(),
                req.max_tokens,
                info.max_context
            )));
        }
        req.sampling
            .validate()
            .map_err(EngineError::InvalidRequest)?;
        Ok(())
    }

    /// Run one request. `on_token` sees each generated token as soon as it exists; returning
    /// [`Flow::Stop`] ends generation (the token it saw is kept).
    pub fn generate(
        &mut self,
        req: &GenRequest,
        on_token: &mut dyn FnMut(u32) -> Flow,
    ) -> Result<GenOutput, EngineError> {
        self.validate(req)?;
        let start = Instant::now();
        let info = self.runner.info().clone();
        let mut stops: Vec<u32> = req.stop_token_ids.clone();
        if !req.ignore_eos {
            stops.extend_from_slice(&info.eos_token_ids);
        }
        let mut sampler = Sampler::new(&req.sampling);
        let greedy = req.sampling.is_greedy();

        self.runner.truncate(0);

        // Prefill: the last row gives the first generated token's distribution.
        let mut prompt_lp: Option<Vec<Option<LogprobEntry>>> =
            req.prompt_logprobs.map(|_| vec![None]);
        let mut last_logits: Vec<f32> = Vec::new();
        let rows = if req.prompt_logprobs.is_some() {
            Rows::All
        } else {
            Rows::Last
        };
        let n_prompt = req.prompt.len();
        {
            let prompt = &req.prompt;
            let top = req.prompt_logprobs.unwrap_or(0);
            let lp = &mut prompt_lp;
            let last = &mut last_logits;
            self.runner.forward(prompt, rows, &mut |i, logits| {
                if let Some(v) = lp.as_mut() {
                    if i + 1 < n_prompt {
                        v.push(Some(LogprobEntry::from_logits(logits, prompt[i + 1], top)));
                    }
                }
                if i + 1 == n_prompt {
                    last.clear();
                    last.extend_from_slice(logits);
                }
            })?;
        }
        let prefill = start.elapsed();

        let mut tokens = Vec::with_capacity(req.max_tokens);
        let mut gen_lp: Option<Vec<LogprobEntry>> = req.logprobs.map(|_| Vec::new());
        let mut finish = FinishReason::Length;
        let mut ttft = Duration::ZERO;
        let decode_start = Instant::now();

        let mut next = if greedy {
            argmax(&last_logits)
        } else {
            sampler.sample(&mut last_logits)
        };
        // Keep token t: false where generation ends with it (a stop id, a cancel, max_tokens).
        let mut take = |t: u32| -> bool {
            tokens.push(t);
            if tokens.len() == 1 {
                ttft = start.elapsed();
            }
            let flow = on_token(t);
            if stops.contains(&t) {
                finish = FinishReason::Stop;
                return false;
            }
            if flow == Flow::Stop {
                finish = FinishReason::Cancelled;
                return false;
            }
            tokens.len() < req.max_tokens
        };
        if greedy && gen_lp.is_none() {
            // The runner's own greedy loop (the CUDA runner keeps a step ahead of `take`); the
            // same tokens and cache as the loop below.
            if take(next) {
                self.runner
                    .greedy_decode(next, req.max_tokens.saturating_sub(1), &mut take)?;
            }
        } else {
            loop {
                if let Some(v) = gen_lp.as_mut() {
                    v.push(LogprobEntry::from_logits(
                        &last_logits,
                        next,
                        req.logprobs.unwrap_or(0),
                    ));
                }
                if !take(next) {
                    break;
                }
                let last = &mut last_logits;
                self.runner.forward(&[next], Rows::Last, &mut |_, logits| {
                    last.clear();
                    last.extend_from_slice(logits);
                })?;
                next = if greedy {
                    argmax(&last_logits)
                } else {
                    sampler.sample(&mut last_logits)
                };
            }
        }
        Ok(GenOutput {
            tokens,
            finish,
            prompt_logprobs: prompt_lp,
            logprobs: gen_lp,
            timings: Timings {
                prefill,
                decode: decode_start.elapsed(),
                ttft,
            },
        })
    }
}
