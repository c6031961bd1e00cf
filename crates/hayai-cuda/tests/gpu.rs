//! GPU parity tests. Those that need a CUDA device are `#[ignore]`d, so a machine without one
//! (CI) reports them as not run; on a GPU machine run them with `cargo test -- --include-ignored`
//! (or `scripts/gpu-check.sh`), where a missing device is a failure.

use hayai_cuda::check::{graph_matches_eager, parity};
use hayai_cuda::synth::{random_model_bf16, small_spec};
use hayai_cuda::{CudaOptions, Quant};
use hayai_model::random::random_model;
use hayai_model::Arch;

/// Panics unless the binary has kernels and a CUDA device answers.
fn require_gpu() {
    assert!(
        hayai_cuda::build_info().fatbin_bytes > 0,
        "built without CUDA kernels (HAYAI_NO_CUDA=1)"
    );
    let g = hayai_cuda::probe().expect("no CUDA device");
    eprintln!(
        "GPU: {} (sm_{}{})",
        g.name, g.compute_capability.0, g.compute_capability.1
    );
}

fn opts(quant: Quant, persistent_gemv: bool) -> CudaOptions {
    CudaOptions {
        quant,
        persistent_gemv,
        ..Default::default()
    }
}

/// GPU vs CPU reference on `m`: logits within `max_rel_l2`, greedy tokens identical.
fn assert_parity(
    m: &hayai_model::Model,
    o: &CudaOptions,
    prompt_len: usize,
    steps: usize,
    max_rel_l2: f64,
) {
    let r = parity(m, o, &prompt(prompt_len, m.spec.vocab), steps).unwrap();
    eprintln!("{}", r.line());
    assert!(r.rel_l2 < max_rel_l2, "{}", r.line());
    assert!(r.greedy_identical(), "{}", r.line());
}

fn prompt(n: usize, vocab: usize) -> Vec<u32> {
    hayai_cuda::bench::bench_prompt(n, vocab)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn small_gemma4_bf16_matches_cpu() {
    require_gpu();
    let m = random_model(&small_spec(Arch::Gemma4), 11);
    // 300 steps: past the ring buffer's window + slack, so the wrap-around is exercised.
    for persistent in [true, false] {
        assert_parity(&m, &opts(Quant::Bf16, persistent), 24, 300, 1e-4);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn small_gemma4_int4_matches_cpu_int4() {
    require_gpu();
    let m = random_model_bf16(&small_spec(Arch::Gemma4), 12);
    for persistent in [true, false] {
        assert_parity(&m, &opts(Quant::Int4, persistent), 24, 300, 1e-4);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn small_gemma3_bf16_and_int4_match_cpu() {
    require_gpu();
    let m = random_model(&small_spec(Arch::Gemma3), 13);
    for q in [Quant::Bf16, Quant::Int4] {
        assert_parity(&m, &opts(q, true), 16, 280, 1e-4);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn graph_replay_equals_eager_launches() {
    require_gpu();
    let m = random_model(&small_spec(Arch::Gemma4), 14);
    for persistent in [true, false] {
        assert!(
            graph_matches_eager(&m, Quant::Int4, persistent, &prompt(12, m.spec.vocab)).unwrap()
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn bad_tokens_are_errors_not_panics() {
    require_gpu();
    let m = std::sync::Arc::new(random_model(&small_spec(Arch::Gemma4), 15));
    let mut r = hayai_cuda::load_runner(m, hayai_cuda::CudaOptions::default()).unwrap();
    assert!(r.greedy_step(1_000_000).is_err());
}

fn real_270m() -> hayai_model::Model {
    let path = hayai_core::cache::real_model_path();
    assert!(path.exists(), "real model missing at {}", path.display());
    hayai_model::load::load_model(&path).unwrap()
}

/// The real Gemma 3 270M's shapes fit the GPU kernels (no GPU needed).
#[test]
fn real_gemma3_270m_is_supported() {
    hayai_cuda::check_supported(&real_270m().spec).unwrap();
}

/// On a GPU: the real Gemma 3 270M's logits and 256 greedy tokens match the CPU reference.
#[test]
#[ignore = "needs a CUDA GPU"]
fn real_gemma3_270m_matches_cpu() {
    require_gpu();
    let m = real_270m();
    let p = [2u32, 818, 5279, 529, 7001, 563, 496, 236743];
    for q in [Quant::Bf16, Quant::Int4] {
        let r = parity(&m, &opts(q, false), &p, 256).unwrap();
        eprintln!("270M {}", r.line());
        assert!(r.rel_l2 < 1e-3, "{}", r.line());
        assert!(r.greedy_identical(), "{}", r.line());
    }
}
