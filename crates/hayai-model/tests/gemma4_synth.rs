//! `synth` checkpoints: deterministic, loadable by the Gemma 4 loader (and by transformers, see
//! scripts/gemma4_fullsize_check.py), with O(1) activations and peaked, non-echoing outputs.

use std::sync::Arc;

use hayai_model::assistant::Assistant;
use hayai_model::cpu::CpuRunner;
use hayai_model::gemma4::load_hf_dir;
use hayai_model::synth::{presets, synth, SynthDtype};
use hayai_model::{argmax, Rows, Runner};

fn bytes(dir: &std::path::Path) -> Vec<u8> {
    std::fs::read(dir.join("model.safetensors")).unwrap()
}

#[test]
fn same_seed_same_bytes_other_seed_other_bytes() {
    let d = tempfile::tempdir().unwrap();
    let (a, b, c) = (d.path().join("a"), d.path().join("b"), d.path().join("c"));
    synth("tiny", 5, &a, SynthDtype::Bf16).unwrap();
    synth("tiny", 5, &b, SynthDtype::Bf16).unwrap();
    synth("tiny", 6, &c, SynthDtype::Bf16).unwrap();
    assert_eq!(bytes(&a), bytes(&b));
    assert_ne!(bytes(&a), bytes(&c));
    assert_eq!(
        std::fs::read(a.join("config.json")).unwrap(),
        std::fs::read(c.join("config.json")).unwrap()
    );
}

#[test]
fn unknown_preset_is_an_error() {
    let d = tempfile::tempdir().unwrap();
    let e = synth("e9b", 1, d.path(), SynthDtype::F32).unwrap_err();
    assert!(e.to_string().contains("e4b"), "{e}");
    assert!(presets().contains(&"e4b-assistant"));
    assert!("fp8".parse::<SynthDtype>().is_err());
}

fn entropy(logits: &[f32]) -> f64 {
    let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let z: f64 = logits.iter().map(|&v| (v as f64 - m).exp()).sum();
    logits
        .iter()
        .map(|&v| {
            let p = (v as f64 - m).exp() / z;
            if p > 0.0 {
                -p * p.ln()
            } else {
                0.0
            }
        })
        .sum()
}

#[test]
fn tiny_model_has_sensible_outputs() {
    for dtype in [SynthDtype::F32, SynthDtype::Bf16] {
        let d = tempfile::tempdir().unwrap();
        let s = synth("tiny", 9, d.path(), dtype).unwrap();
        assert_eq!(s.n_tensors, 101);
        let model = Arc::new(load_hf_dir(d.path()).unwrap());
        assert_eq!(model.weights.embed.is_bf16(), dtype == SynthDtype::Bf16);
        assert_eq!(model.spec.embed_scale, 8.0);
        let vocab = model.spec.vocab;
        let toks: Vec<u32> = (0..64u32).map(|i| (i * 97 + 2) % vocab as u32).collect();
        let mut r = CpuRunner::new(model).unwrap();
        let (mut ent, mut echo, mut n) = (0.0, 0, 0);
        let mut hidden_rms = 0.0f64;
        r.forward(&toks, Rows::All, &mut |i, l| {
            assert!(l.iter().all(|v| v.is_finite()));
            ent += entropy(l);
            echo += (argmax(l) == toks[i]) as usize;
            n += 1;
        })
        .unwrap();
        let hs = r.hidden_states();
        hidden_rms +=
            (hs.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>() / hs.len() as f64).sqrt();
        let mean_ent = ent / n as f64;
        let flat = (vocab as f64).ln();
        // Peaked (well below uniform) but not one-hot, and not just echoing the input.
        assert!(
            mean_ent > 0.5 && mean_ent < flat - 1.0,
            "{dtype:?}: entropy {mean_ent} of max {flat}"
        );
        assert!(
            echo < n / 4,
            "{dtype:?}: predicts its input token {echo}/{n} times"
        );
        assert!(hidden_rms > 0.1 && hidden_rms < 1e3, "{hidden_rms}");
    }
}

#[test]
fn assistant_preset_pairs_with_its_target() {
    let d = tempfile::tempdir().unwrap();
    synth("tiny", 1, &d.path().join("t"), SynthDtype::F32).unwrap();
    synth("tiny-assistant", 1, &d.path().join("a"), SynthDtype::F32).unwrap();
    let model = load_hf_dir(&d.path().join("t")).unwrap();
    let a = Assistant::load_hf_dir(&d.path().join("a")).unwrap();
    let donors = a.donors(&model.spec).unwrap();
    // tiny: 6 layers S,S,F,S,S,F with the last 2 sharing; donors are layers 3 and 2.
    assert_eq!((donors.sliding, donors.full), (3, 2));
    assert_eq!(a.layers.len(), 4);
}

#[test]
fn masked_head_agrees_with_the_dense_head_on_its_clusters() {
    use hayai_model::assistant::{DraftHead, KvView};
    let d = tempfile::tempdir().unwrap();
    synth("tiny", 2, &d.path().join("t"), SynthDtype::F32).unwrap();
    synth("tiny-assistant", 2, &d.path().join("a"), SynthDtype::F32).unwrap();
    let model = Arc::new(load_hf_dir(&d.path().join("t")).unwrap());
    let masked = Assistant::load_hf_dir(&d.path().join("a")).unwrap();
    let mut dense = masked.clone();
    dense.head = DraftHead::Dense;
    let donors = masked.donors(&model.spec).unwrap();
    let mut r = CpuRunner::new(model.clone()).unwrap();
    let toks: Vec<u32> = (0..30u32).map(|i| (i * 37 + 5) % 512).collect();
    r.forward(&toks, Rows::Last, &mut |_, _| {}).unwrap();
    let h = model.spec.hidden;
    let hidden = &r.hidden_states()[29 * h..30 * h];
    let (sk, sv) = r.kv_cache(donors.sliding).unwrap();
    let (fk, fv) = r.kv_cache(donors.full).unwrap();
    let e = r.embed(&[7]);
    let run = |a: &Assistant| {
        a.step(
            &e,
            hidden,
            30,
            KvView { k: sk, v: sv },
            KvView { k: fk, v: fv },
            30,
            true,
        )
        .unwrap()
    };
    let (m, dn) = (run(&masked), run(&dense));
    assert_eq!(m.hidden, dn.hidden);
    let (ml, dl) = (m.logits.unwrap(), dn.logits.unwrap());
    let fill = ml.iter().copied().fold(f32::INFINITY, f32::min);
    let selected: Vec<usize> = (0..ml.len()).filter(|&i| ml[i] > fill).collect();
    // top-4 of 16 clusters of 32 tokens.
    assert_eq!(selected.len(), 4 * 32);
    for &i in &selected {
        assert!((ml[i] - dl[i]).abs() < 1e-5);
    }
    let best = selected
        .iter()
        .copied()
        .max_by(|&a, &b| dl[a].total_cmp(&dl[b]))
        .unwrap();
    assert_eq!(m.token as usize, best);
    assert_eq!(dn.token, argmax(&dl));
}
