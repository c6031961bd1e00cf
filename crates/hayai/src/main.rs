//! `hayai`: the command-line interface. Thin: every command is a call into a library crate.

mod fetch;
mod local;
mod remote;
mod setup;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "hayai",
    version,
    about = "Fast, exact Gemma inference: engine, OpenAI-compatible server and benchmark harness"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Download (once) and verify the default real model, print its path.
    FetchModel(local::FetchArgs),
    /// Build facts and the GPU found at run time.
    Info(local::InfoArgs),
    /// Metadata and tensors of a model file or directory.
    Inspect(local::InspectArgs),
    /// Tokenize text read from stdin.
    Tokenize(local::TokenizeArgs),
    /// Tokenizer agreement on a records file: decode ids, re-encode, compare.
    TokenizerCheck(local::TokenizerCheckArgs),
    /// Generate from a prompt (text or token ids).
    Generate(local::GenerateArgs),
    /// Perplexity on challenge-format records, in-process or against an endpoint.
    Ppl(local::PplArgs),
    /// Write a deterministic random-weight checkpoint (HF layout).
    Synth(local::SynthArgs),
    /// Engine decode benchmark (no server): tok/s, bytes/token, bandwidth.
    BenchEngine(local::BenchEngineArgs),
    /// Serve the OpenAI-compatible HTTP API.
    Serve(remote::ServeArgs),
    /// Benchmark any OpenAI-compatible server (challenge semantics).
    Bench(remote::BenchArgs),
    /// Capture greedy decode outputs from a server for identity audits.
    Capture(remote::CaptureArgs),
    /// Compare two captures: GREEDY_IDENTICAL, DIVERGENT or INCOMPARABLE.
    Identity(remote::IdentityArgs),
    /// Reproducibility verdict: repeated benches on two prompt sets, PPL cap, identity.
    Verify(remote::VerifyArgs),
    /// Leaderboard table and score chart from results/.
    Report(remote::ReportArgs),
    /// The main job: start a server on the default model, bench it, score PPL, print a summary.
    Demo(setup::DemoArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::FetchModel(a) => local::fetch_model(a),
        Cmd::Info(a) => local::info(a),
        Cmd::Inspect(a) => local::inspect(a),
        Cmd::Tokenize(a) => local::tokenize(a),
        Cmd::TokenizerCheck(a) => local::tokenizer_check(a),
        Cmd::Generate(a) => local::generate(a),
        Cmd::Ppl(a) => local::ppl(a),
        Cmd::Synth(a) => local::synth(a),
        Cmd::BenchEngine(a) => local::bench_engine(a),
        Cmd::Serve(a) => remote::serve(a),
        Cmd::Bench(a) => remote::bench(a),
        Cmd::Capture(a) => remote::capture(a),
        Cmd::Identity(a) => remote::identity(a),
        Cmd::Verify(a) => remote::verify(a),
        Cmd::Report(a) => remote::report(a),
        Cmd::Demo(a) => setup::demo(a),
    };
    match res {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
