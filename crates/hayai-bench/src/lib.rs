//! hayai-bench: the client-side challenge harness. It scores any OpenAI-compatible server (hayai,
//! vLLM, llama.cpp's server) the same way, following `design/HARNESS.md`:
//!
//! * [`bench`](mod@bench) — throughput (TPS) with SGLang bench_serving semantics (§1);
//! * [`ppl`] — the perplexity guardrail over `prompt_logprobs` (§2), plus the shared record parser
//!   and aggregation used by the in-process perplexity mode;
//! * [`capture`] / [`identity`] — greedy-identity captures and their comparison (§3.1);
//! * [`verify`] — reproducibility verdict (public vs private prompts, run spread, PPL cap, identity);
//! * [`registry`] / [`report`] — `results/<run>/` layout, run environment, leaderboard and chart.
//!
//! Everything is blocking (ureq + threads). Each stage has an options struct, a `run_*` function and
//! a result struct with `render`/`print`/`write` helpers; the CLI decides exit codes.

pub mod bench;
pub mod capture;
pub mod dataset;
pub mod error;
pub mod http;
pub mod identity;
pub mod ppl;
pub mod registry;
pub mod report;
pub mod rng;
pub mod stats;
pub mod util;
pub mod verify;

pub use bench::{run_bench, BenchOptions, BenchResult, BenchSummary, Endpoint, RequestRecord};
pub use dataset::{DatasetSpec, Prompt};
pub use error::{Error, Result};
