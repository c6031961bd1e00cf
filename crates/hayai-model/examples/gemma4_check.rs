//! Full-size Gemma 4 check helper (used by scripts/gemma4_fullsize_check.py):
//!
//!   gemma4_check synth PRESET SEED OUT_DIR [f32|bf16]
//!   gemma4_check logits MODEL_DIR TOKENS_CSV OUT.safetensors
//!
//! `logits` runs the CPU reference on the tokens in one prefill and writes the logits of every
//! position (`[n, vocab]`, f32) plus a timing line on stdout.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use hayai_core::safetensors::{write_safetensors, DType};
use hayai_model::cpu::CpuRunner;
use hayai_model::gemma4::load_hf_dir;
use hayai_model::synth::{synth, SynthDtype};
use hayai_model::{Rows, Runner};

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("synth") if args.len() >= 4 => {
            let dtype: SynthDtype = args.get(4).map(String::as_str).unwrap_or("bf16").parse()?;
            let t = Instant::now();
            let s = synth(&args[1], args[2].parse()?, Path::new(&args[3]), dtype)?;
            println!(
                "{{\"synth\": \"{}\", \"tensors\": {}, \"params\": {}, \"bytes\": {}, \"seconds\": {:.1}}}",
                s.preset,
                s.n_tensors,
                s.n_params,
                s.bytes,
                t.elapsed().as_secs_f64()
            );
        }
        Some("logits") if args.len() == 4 => {
            let t = Instant::now();
            let model = Arc::new(load_hf_dir(Path::new(&args[1]))?);
            let load_s = t.elapsed().as_secs_f64();
            let tokens: Vec<u32> = args[2]
                .split(',')
                .map(|x| x.trim().parse())
                .collect::<Result<_, _>>()?;
            let vocab = model.spec.vocab;
            let mut runner = CpuRunner::new(model)?;
            let mut logits = Vec::with_capacity(tokens.len() * vocab);
            let t = Instant::now();
            runner.forward(&tokens, Rows::All, &mut |_, l| logits.extend_from_slice(l))?;
            let fwd_s = t.elapsed().as_secs_f64();
            let bytes: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
            write_safetensors(
                Path::new(&args[3]),
                &[(
                    "logits".to_string(),
                    DType::F32,
                    vec![tokens.len(), vocab],
                    &bytes[..],
                )],
                None,
            )?;
            println!(
                "{{\"positions\": {}, \"load_seconds\": {load_s:.1}, \"forward_seconds\": {fwd_s:.1}}}",
                tokens.len()
            );
        }
        _ => {
            return Err("usage: gemma4_check synth PRESET SEED OUT [f32|bf16] | logits MODEL_DIR TOKENS_CSV OUT.safetensors".into())
        }
    }
    Ok(())
}
