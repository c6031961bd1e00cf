//! The synthetic shapes that stand for a real model on the GPU machine are that model's.

use hayai_model::load::load_model;

/// `synth:gemma3-270m` is the real Gemma 3 270M's spec, as read from its GGUF (downloaded by
/// the test command before tests run; a missing file is a failure).
#[test]
fn gemma3_270m_synth_spec_is_the_real_models() {
    let p = hayai_core::cache::real_model_path();
    assert!(p.exists(), "real model missing at {}", p.display());
    let real = load_model(&p).expect("load model").spec;
    let synth = hayai_cuda::synth::spec_by_name("gemma3-270m").unwrap();
    assert_eq!(synth, real);
}
