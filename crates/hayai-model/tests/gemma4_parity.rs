//! Parity of the Gemma 4 CPU reference with transformers 5.17 (fp32) on the random-weight
//! fixtures built by `scripts/gemma4_fixtures.py`: perplexity within 0.5 %, identical greedy
//! tokens, close logits, and identical MTP-assistant drafts.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use hayai_core::safetensors::SafeTensors;
use hayai_model::assistant::{Assistant, KvView};
use hayai_model::cpu::CpuRunner;
use hayai_model::gemma4::load_hf_dir;
use hayai_model::{argmax, Model, Rows, Runner};
use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/gemma4")
        .join(name)
}

fn reference(name: &str) -> (Value, SafeTensors) {
    let dir = fixture(name);
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let st = SafeTensors::open(&dir.join("reference.safetensors")).unwrap();
    (json, st)
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn log_softmax_at(logits: &[f32], t: u32) -> f64 {
    let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let z: f64 = logits.iter().map(|&v| (v as f64 - m).exp()).sum();
    logits[t as usize] as f64 - m - z.ln()
}

fn load(name: &str) -> Arc<Model> {
    Arc::new(load_hf_dir(&fixture(name)).unwrap_or_else(|e| panic!("loading {name}: {e}")))
}

/// PPL, greedy tokens and logits of one fixture against transformers.
fn check_target(name: &str) {
    let model = load(name);
    let (r, st) = reference(name);
    let records: Vec<Vec<u32>> = r["records"].as_array().unwrap().iter().map(ids).collect();

    // Perplexity over every record.
    let mut nll = 0.0f64;
    let mut count = 0usize;
    let mut runner = CpuRunner::new(model.clone()).unwrap();
    let mut logits0 = Vec::new();
    for (ri, rec) in records.iter().enumerate() {
        runner.truncate(0);
        runner
            .forward(rec, Rows::All, &mut |i, l| {
                if ri == 0 {
                    logits0.extend_from_slice(l);
                }
                if i + 1 < rec.len() {
                    nll -= log_softmax_at(l, rec[i + 1]);
                    count += 1;
                }
            })
            .unwrap();
    }
    let ppl = (nll / count as f64).exp();
    let ref_ppl = r["ppl"].as_f64().unwrap();
    let rel = (ppl / ref_ppl - 1.0).abs();
    eprintln!("{name}: ppl ours {ppl:.6} transformers {ref_ppl:.6} (rel diff {rel:.2e})");
    assert_eq!(count as u64, r["n_predicted"].as_u64().unwrap());
    assert!(rel < 0.005, "{name}: PPL {ppl} vs transformers {ref_ppl}");

    // Logits of record 0 at every position.
    let want = st.get("logits_record0").unwrap().to_f32_vec().unwrap();
    let d = max_diff(&logits0, &want);
    eprintln!(
        "{name}: max |logit diff| over {} positions: {d:.3e}",
        records[0].len()
    );
    assert!(d < 2e-3, "{name}: logits differ by {d}");

    // Greedy decoding, crossing the sliding window several times.
    let prompt = ids(&r["greedy_prompt"]);
    let want = ids(&r["greedy_tokens"]);
    let mut g = CpuRunner::new(model).unwrap();
    let mut next = 0;
    g.forward(&prompt, Rows::Last, &mut |_, l| next = argmax(l))
        .unwrap();
    let mut got = Vec::new();
    for _ in 0..want.len() {
        got.push(next);
        next = g.greedy_step(next).unwrap();
    }
    assert_eq!(got, want, "{name}: greedy tokens differ from transformers");
}

#[test]
fn causal_layout_matches_transformers() {
    check_target("causal");
}

#[test]
fn conditional_layout_matches_transformers() {
    check_target("conditional");
}

#[test]
fn fixture_specs_resolve_every_feature() {
    // CausalLM layout, head dims from per_layer_config.
    let m = load("causal");
    let s = &m.spec;
    assert_eq!(s.n_layers(), 7);
    let hd: Vec<usize> = s.layers.iter().map(|l| l.head_dim).collect();
    assert_eq!(hd, [16, 16, 32, 16, 16, 32, 32]);
    let src: Vec<usize> = s.layers.iter().map(|l| l.kv_source).collect();
    assert_eq!(src, [0, 1, 2, 3, 3, 2, 2]);
    assert_eq!(s.layers[2].rope.rotary_pairs, 4);
    assert_eq!(s.layers[2].rope.dim_base, 32);
    assert_eq!(s.layers[0].rope.rotary_pairs, 8);
    assert_eq!(s.final_softcap, Some(10.0));
    assert_eq!(s.sliding_window, 8);
    // fp32 checkpoint: the embedding scale stays unrounded (sqrt(64) is exact anyway).
    assert_eq!(s.embed_scale, 8.0);
    assert!(m.weights.layers.iter().all(|l| l.layer_scalar != 1.0));
    assert!(m.weights.layers[4].k.is_none() && m.weights.layers[3].k.is_some());

    // ConditionalGeneration layout, `global_head_dim` spelling, double-wide MLP on shared
    // layers, and k/v tensors on shared layers present in the file but unused.
    let m = load("conditional");
    let s = &m.spec;
    let hd: Vec<usize> = s.layers.iter().map(|l| l.head_dim).collect();
    assert_eq!(hd, [32, 32, 32, 64, 32, 64]);
    let src: Vec<usize> = s.layers.iter().map(|l| l.kv_source).collect();
    assert_eq!(src, [0, 1, 2, 3, 2, 3]);
    let im: Vec<usize> = s.layers.iter().map(|l| l.intermediate).collect();
    assert_eq!(im, [96, 96, 96, 96, 192, 192]);
    assert!(m.weights.layers[4].k.is_none() && m.weights.layers[5].v.is_none());
    assert!(
        s.eos_token_ids.contains(&1)
            && s.eos_token_ids.contains(&106)
            && s.eos_token_ids.contains(&50)
    );
}

#[test]
fn assistant_drafts_match_transformers() {
    let target = load("causal");
    let asst = Assistant::load_hf_dir(&fixture("assistant")).unwrap();
    let donors = asst.donors(&target.spec).unwrap();
    assert_eq!((donors.sliding, donors.full), (3, 2));
    let (r, st) = reference("causal");
    for (i, case) in r["drafts"].as_array().unwrap().iter().enumerate() {
        let prompt = ids(&case["prompt"]);
        let mut runner = CpuRunner::new(target.clone()).unwrap();
        let mut first = 0;
        runner
            .forward(&prompt, Rows::Last, &mut |_, l| first = argmax(l))
            .unwrap();
        assert_eq!(first as u64, case["first_token"].as_u64().unwrap());
        let h = target.spec.hidden;
        let n = prompt.len();
        let mut hidden = runner.hidden_states()[(n - 1) * h..n * h].to_vec();
        let (sk, sv) = runner.kv_cache(donors.sliding).unwrap();
        let (fk, fv) = runner.kv_cache(donors.full).unwrap();
        let want_logits = st
            .get(&format!("draft_logits_{i}"))
            .unwrap()
            .to_f32_vec()
            .unwrap();
        let want = ids(&case["draft_tokens"]);
        let vocab = target.spec.vocab;
        let mut tok = first;
        let mut got = Vec::new();
        for (j, _) in want.iter().enumerate() {
            let e = runner.embed(&[tok]);
            let step = asst
                .step(
                    &e,
                    &hidden,
                    n,
                    KvView { k: sk, v: sv },
                    KvView { k: fk, v: fv },
                    n,
                    true,
                )
                .unwrap();
            let d = max_diff(
                step.logits.as_ref().unwrap(),
                &want_logits[j * vocab..(j + 1) * vocab],
            );
            eprintln!(
                "draft case {i} step {j}: token {} max |logit diff| {d:.3e}",
                step.token
            );
            assert!(d < 1e-3, "draft case {i} step {j}: logits differ by {d}");
            got.push(step.token);
            tok = step.token;
            hidden = step.hidden;
        }
        assert_eq!(got, want, "draft case {i}: tokens differ from transformers");
    }
}

#[test]
fn embedding_scale_follows_the_weight_dtype() {
    use hayai_core::safetensors::DType;
    use hayai_model::gemma4::embed_scale;
    assert_eq!(embed_scale(2560, DType::BF16), 50.5);
    assert_eq!(embed_scale(2560, DType::F32), 2560f64.sqrt() as f32);
    assert_eq!(embed_scale(1536, DType::BF16), 39.25);
}
