//! Gemma 3 from an HF directory: a random model written in the HF layout (norms stored as
//! `w - 1`, both prefixes) loads back to the same forward.

use std::sync::Arc;

use hayai_core::safetensors::{write_safetensors, DType};
use hayai_model::cpu::CpuRunner;
use hayai_model::load::load_model;
use hayai_model::random::{random_model, tiny_spec};
use hayai_model::{Arch, Matrix, Model, Rows, Runner};
use serde_json::json;

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn write_hf(model: &Model, dir: &std::path::Path, prefix: &str, bf16: bool) {
    let s = &model.spec;
    let mut tensors: Vec<(String, DType, Vec<usize>, Vec<u8>)> = Vec::new();
    let mut mat = |name: String, m: &Matrix| {
        let v = m.to_f32();
        if bf16 {
            let b: Vec<u8> = v
                .iter()
                .flat_map(|x| half::bf16::from_f32(*x).to_bits().to_le_bytes())
                .collect();
            tensors.push((name, DType::BF16, vec![m.rows, m.cols], b));
        } else {
            tensors.push((name, DType::F32, vec![m.rows, m.cols], f32_bytes(&v)));
        }
    };
    let w = &model.weights;
    mat(format!("{prefix}embed_tokens.weight"), &w.embed);
    for (i, l) in w.layers.iter().enumerate() {
        let p = format!("{prefix}layers.{i}.");
        mat(format!("{p}self_attn.q_proj.weight"), &l.q);
        mat(format!("{p}self_attn.k_proj.weight"), l.k.as_ref().unwrap());
        mat(format!("{p}self_attn.v_proj.weight"), l.v.as_ref().unwrap());
        mat(format!("{p}self_attn.o_proj.weight"), &l.o);
        mat(format!("{p}mlp.gate_proj.weight"), &l.gate);
        mat(format!("{p}mlp.up_proj.weight"), &l.up);
        mat(format!("{p}mlp.down_proj.weight"), &l.down);
    }
    let mut norms: Vec<(String, Vec<f32>)> =
        vec![(format!("{prefix}norm.weight"), w.final_norm.clone())];
    for (i, l) in w.layers.iter().enumerate() {
        let p = format!("{prefix}layers.{i}.");
        norms.push((format!("{p}input_layernorm.weight"), l.attn_norm.clone()));
        norms.push((format!("{p}self_attn.q_norm.weight"), l.q_norm.clone()));
        norms.push((
            format!("{p}self_attn.k_norm.weight"),
            l.k_norm.clone().unwrap(),
        ));
        norms.push((
            format!("{p}post_attention_layernorm.weight"),
            l.post_attn_norm.clone(),
        ));
        norms.push((
            format!("{p}pre_feedforward_layernorm.weight"),
            l.pre_ffn_norm.clone(),
        ));
        norms.push((
            format!("{p}post_feedforward_layernorm.weight"),
            l.post_ffn_norm.clone(),
        ));
    }
    for (name, v) in norms {
        // HF Gemma 3 stores the offset from 1.
        let stored: Vec<f32> = v.iter().map(|x| x - 1.0).collect();
        tensors.push((name, DType::F32, vec![v.len()], f32_bytes(&stored)));
    }
    let refs: Vec<(String, DType, Vec<usize>, &[u8])> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.clone(), *d, s.clone(), &b[..]))
        .collect();
    write_safetensors(&dir.join("model.safetensors"), &refs, None).unwrap();
    let layer_types: Vec<&str> = s
        .layers
        .iter()
        .map(|l| {
            if l.sliding {
                "sliding_attention"
            } else {
                "full_attention"
            }
        })
        .collect();
    let cfg = json!({
        "model_type": "gemma3_text",
        "hidden_size": s.hidden,
        "num_hidden_layers": s.n_layers(),
        "num_attention_heads": s.layers[0].n_heads,
        "num_key_value_heads": s.layers[0].n_kv_heads,
        "head_dim": s.layers[0].head_dim,
        "intermediate_size": s.layers[0].intermediate,
        "vocab_size": s.vocab,
        "sliding_window": s.sliding_window,
        "layer_types": layer_types,
        "rope_theta": 1_000_000.0,
        "rope_local_base_freq": 10_000.0,
        "query_pre_attn_scalar": 16,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 4096,
        "torch_dtype": if bf16 { "bfloat16" } else { "float32" },
        "eos_token_id": [1, 106],
        "bos_token_id": 2,
    });
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
}

fn logits(model: Arc<Model>, toks: &[u32]) -> Vec<Vec<f32>> {
    let mut r = CpuRunner::new(model).unwrap();
    let mut out = Vec::new();
    r.forward(toks, Rows::All, &mut |_, l| out.push(l.to_vec()))
        .unwrap();
    out
}

#[test]
fn hf_gemma3_round_trip() {
    let mut spec = tiny_spec(Arch::Gemma3);
    spec.embed_scale = (spec.hidden as f32).sqrt();
    spec.eos_token_ids = vec![1, 106];
    let model = random_model(&spec, 11);
    let toks: Vec<u32> = (0..20u32).map(|i| (i * 13 + 4) % 300).collect();
    let want = logits(Arc::new(model.clone()), &toks);
    for prefix in ["model.", "model.language_model."] {
        let dir = tempfile::tempdir().unwrap();
        write_hf(&model, dir.path(), prefix, false);
        let loaded = load_model(dir.path()).unwrap();
        assert_eq!(loaded.spec.attn_scale, 0.25);
        assert_eq!(loaded.spec.eos_token_ids, vec![1, 106]);
        assert_eq!(loaded.spec.layers, model.spec.layers);
        let got = logits(Arc::new(loaded), &toks);
        for (a, b) in got.iter().zip(&want) {
            let d = a
                .iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f32::max);
            assert!(d < 1e-4, "{prefix}: logits differ by {d}");
        }
    }
    // bf16 weights stay bf16 and the embedding scale is rounded to bf16.
    let dir = tempfile::tempdir().unwrap();
    write_hf(&model, dir.path(), "model.", true);
    let loaded = load_model(dir.path()).unwrap();
    assert!(loaded.weights.layers[0].q.is_bf16());
    assert_eq!(loaded.spec.embed_scale, half::bf16::from_f32(8.0).to_f32());
}

#[test]
fn bad_directories_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let e = load_model(dir.path()).unwrap_err().to_string();
    assert!(e.contains("config.json"), "{e}");
    std::fs::write(dir.path().join("config.json"), r#"{"model_type": "llama"}"#).unwrap();
    let e = load_model(dir.path()).unwrap_err().to_string();
    assert!(e.contains("llama") || e.contains("safetensors"), "{e}");
    let e = load_model(std::path::Path::new("/nonexistent/model.gguf"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("/nonexistent/model.gguf"), "{e}");
}
