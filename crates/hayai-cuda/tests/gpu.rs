//! GPU parity tests. They need a CUDA device; without one (CI) each test says so and passes.

use hayai_cuda::check::{graph_matches_eager, parity};
use hayai_cuda::synth::{random_model_bf16, small_spec};
use hayai_cuda::{CudaOptions, Quant};
use hayai_model::random::random_model;
use hayai_model::Arch;

fn gpu() -> bool {
    if hayai_cuda::build_info().fatbin_bytes == 0 {
        eprintln!("skipped: built without CUDA kernels");
        return false;
    }
    match hayai_cuda::probe() {
        Some(g) => {
            eprintln!(
                "GPU: {} (sm_{}{})",
                g.name, g.compute_capability.0, g.compute_capability.1
            );
            true
        }
        None => {
            eprintln!("skipped: no CUDA device");
            false
        }
    }
}

fn opts(quant: Quant, persistent_gemv: bool) -> CudaOptions {
    CudaOptions {
        quant,
        persistent_gemv,
        ..Default::default()
    }
}

fn prompt(n: usize, vocab: usize) -> Vec<u32> {
    hayai_cuda::bench::bench_prompt(n, vocab)
}

#[test]
fn small_gemma4_bf16_matches_cpu() {
    if !gpu() {
        return;
    }
    let m = random_model(&small_spec(Arch::Gemma4), 11);
    // 300 steps: past the ring buffer's window + slack, so the wrap-around is exercised.
    for persistent in [true, false] {
        let o = opts(Quant::Bf16, persistent);
        let r = parity(&m, &o, &prompt(24, m.spec.vocab), 300).unwrap();
        eprintln!("{}", r.line());
        assert!(r.rel_l2 < 1e-4, "{}", r.line());
        assert!(r.greedy_identical(), "{}", r.line());
    }
}

#[test]
fn small_gemma4_int4_matches_cpu_int4() {
    if !gpu() {
        return;
    }
    let m = random_model_bf16(&small_spec(Arch::Gemma4), 12);
    for persistent in [true, false] {
        let o = opts(Quant::Int4, persistent);
        let r = parity(&m, &o, &prompt(24, m.spec.vocab), 300).unwrap();
        eprintln!("{}", r.line());
        assert!(r.rel_l2 < 1e-4, "{}", r.line());
        assert!(r.greedy_identical(), "{}", r.line());
    }
}

#[test]
fn small_gemma3_bf16_and_int4_match_cpu() {
    if !gpu() {
        return;
    }
    let m = random_model(&small_spec(Arch::Gemma3), 13);
    for q in [Quant::Bf16, Quant::Int4] {
        let r = parity(&m, &opts(q, true), &prompt(16, m.spec.vocab), 280).unwrap();
        eprintln!("{}", r.line());
        assert!(r.rel_l2 < 1e-4, "{}", r.line());
        assert!(r.greedy_identical(), "{}", r.line());
    }
}

#[test]
fn graph_replay_equals_eager_launches() {
    if !gpu() {
        return;
    }
    let m = random_model(&small_spec(Arch::Gemma4), 14);
    for persistent in [true, false] {
        assert!(
            graph_matches_eager(&m, Quant::Int4, persistent, &prompt(12, m.spec.vocab)).unwrap()
        );
    }
}

#[test]
fn bad_tokens_are_errors_not_panics() {
    if !gpu() {
        return;
    }
    let m = std::sync::Arc::new(random_model(&small_spec(Arch::Gemma4), 15));
    let mut r = hayai_cuda::load_runner(m, hayai_cuda::CudaOptions::default()).unwrap();
    assert!(r.greedy_step(1_000_000).is_err());
}

/// The real Gemma 3 270M (when cached locally): its shapes fit the GPU kernels, and with a GPU
/// its logits and greedy tokens match the CPU reference.
#[test]
fn real_gemma3_270m() {
    let path = std::path::Path::new("/root/.cache/hayai/models/gemma-3-270m-q4_k_m.gguf");
    let path = std::env::var_os("HAYAI_GEMMA3_270M")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| path.to_path_buf());
    if !path.exists() {
        eprintln!("skipped: {} not present", path.display());
        return;
    }
    let m = hayai_model::load::load_model(&path).unwrap();
    hayai_cuda::check_supported(&m.spec).unwrap();
    if !gpu() {
        return;
    }
    let p = [2u32, 818, 5279, 529, 7001, 563, 496, 236743];
    for q in [Quant::Bf16, Quant::Int4] {
        let r = parity(&m, &opts(q, false), &p, 256).unwrap();
        eprintln!("270M {}", r.line());
        assert!(r.rel_l2 < 1e-3, "{}", r.line());
        assert!(r.greedy_identical(), "{}", r.line());
    }
}
