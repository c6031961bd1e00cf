//! Self-consistency of the CPU reference: batched prefill, chunking and token-by-token decode
//! must agree, truncation must roll back exactly, and bad input must be rejected.

use std::sync::Arc;

use hayai_model::cpu::{CpuRunner, MatmulInputs};
use hayai_model::random::{random_model, tiny_spec};
use hayai_model::{Arch, ModelError, Rows, Runner};

fn logits_all(r: &mut CpuRunner, toks: &[u32]) -> Vec<Vec<f32>> {
    let mut out = Vec::new();
    r.forward(toks, Rows::All, &mut |i, l| {
        assert_eq!(i, out.len());
        out.push(l.to_vec());
    })
    .unwrap();
    out
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn check_arch(arch: Arch) {
    let model = Arc::new(random_model(&tiny_spec(arch), 7));
    // Longer than the sliding window (8) and than one internal chunk (128).
    let toks: Vec<u32> = (0..150u32).map(|i| (i * 37 + 5) % 300).collect();
    let mut batched = CpuRunner::new(model.clone()).unwrap();
    let all = logits_all(&mut batched, &toks);
    assert_eq!(all.len(), toks.len());
    assert!(all.iter().flatten().all(|v| v.is_finite()));

    let mut stepwise = CpuRunner::new(model.clone()).unwrap();
    for (i, &t) in toks.iter().enumerate() {
        let row = logits_all(&mut stepwise, &[t]).remove(0);
        let d = max_diff(&row, &all[i]);
        assert!(d < 1e-3, "{arch:?} position {i}: max diff {d}");
    }
    assert_eq!(stepwise.len(), toks.len());

    // Roll back to 100 and re-feed: the same logits again.
    stepwise.truncate(100);
    let again = logits_all(&mut stepwise, &toks[100..]);
    for (i, row) in again.iter().enumerate() {
        assert!(max_diff(row, &all[100 + i]) < 1e-3);
    }

    // Logits differ between positions (the model is not degenerate).
    assert!(max_diff(&all[0], &all[1]) > 1e-2);

    // Greedy step equals argmax of the full logits.
    let mut g = CpuRunner::new(model).unwrap();
    g.forward(&toks[..10], Rows::Last, &mut |_, _| {}).unwrap();
    let tok = g.greedy_step(toks[10]).unwrap();
    assert_eq!(tok, hayai_model::argmax(&all[10]));
}

#[test]
fn gemma3_prefill_equals_decode() {
    check_arch(Arch::Gemma3);
}

#[test]
fn gemma4_prefill_equals_decode() {
    check_arch(Arch::Gemma4);
}

#[test]
fn rejects_out_of_range_tokens_and_context_overflow() {
    let mut spec = tiny_spec(Arch::Gemma3);
    spec.max_context = 4;
    let mut r = CpuRunner::new(Arc::new(random_model(&spec, 1))).unwrap();
    let e = r.forward(&[300], Rows::Last, &mut |_, _| {}).unwrap_err();
    assert!(matches!(e, ModelError::TokenOutOfRange { id: 300, .. }));
    let e = r
        .forward(&[1, 2, 3, 4, 5], Rows::Last, &mut |_, _| {})
        .unwrap_err();
    assert!(matches!(e, ModelError::ContextOverflow { .. }));
    assert_eq!(r.len(), 0);
}

#[test]
fn sliding_window_limits_what_a_position_sees() {
    // Changing a token more than `window` positions back must not change a sliding-only
    // model's logits; in a model with a full layer it must.
    let mut spec = tiny_spec(Arch::Gemma3);
    for l in spec.layers.iter_mut() {
        l.sliding = true;
    }
    let a: Vec<u32> = (0..40u32).map(|i| (i * 11 + 1) % 300).collect();
    let mut b = a.clone();
    b[0] = (b[0] + 1) % 300;
    // With one layer the statement is exact (deeper stacks widen the receptive field).
    spec.layers.truncate(1);
    let model1 = Arc::new(random_model(&spec, 3));
    let la = logits_all(&mut CpuRunner::new(model1.clone()).unwrap(), &a);
    let lb = logits_all(&mut CpuRunner::new(model1).unwrap(), &b);
    assert!(max_diff(&la[7], &lb[7]) > 0.0, "position 7 sees position 0");
    assert_eq!(
        max_diff(&la[8], &lb[8]),
        0.0,
        "position 8 must not see position 0"
    );
}

/// The rounded-input modes (CPU twins of the GPU's tensor-core prefill) really round: bf16
/// moves the logits by a small amount, the bf16 pair by far less; each is deterministic and
/// chunk-independent, and switching back to f32 restores the reference bit for bit.
#[test]
fn matmul_input_rounding_modes() {
    for arch in [Arch::Gemma3, Arch::Gemma4] {
        let model = Arc::new(random_model(&tiny_spec(arch), 11));
        let toks: Vec<u32> = (0..40u32).map(|i| (i * 53 + 3) % 300).collect();
        let exact = logits_all(&mut CpuRunner::new(model.clone()).unwrap(), &toks);
        let rel = |x: &[Vec<f32>]| {
            let (mut num, mut den) = (0f64, 0f64);
            for (a, b) in x.iter().flatten().zip(exact.iter().flatten()) {
                num += ((a - b) as f64).powi(2);
                den += (*b as f64).powi(2);
            }
            (num / den).sqrt()
        };
        let mut r = CpuRunner::new(model.clone()).unwrap();
        let mut rels = Vec::new();
        for mode in [MatmulInputs::Bf16, MatmulInputs::Bf16Pair] {
            r.set_matmul_inputs(mode);
            r.truncate(0);
            let rounded = logits_all(&mut r, &toks);
            rels.push(rel(&rounded));
            // Chunk-independent: the same tokens in two pieces.
            r.truncate(0);
            let mut two = logits_all(&mut r, &toks[..17]);
            two.extend(logits_all(&mut r, &toks[17..]));
            assert_eq!(two, rounded, "{arch:?} {mode:?}");
        }
        assert!(
            rels[0] > 1e-5 && rels[0] < 0.5,
            "{arch:?}: bf16 rel L2 {}",
            rels[0]
        );
        assert!(
            rels[1] > 0.0 && rels[1] < rels[0] / 20.0,
            "{arch:?}: {rels:?}"
        );

        r.set_matmul_inputs(MatmulInputs::F32);
        r.truncate(0);
        assert_eq!(logits_all(&mut r, &toks), exact, "{arch:?}");
    }
}
