//! Gemma 4 config.json → ModelSpec: layer map, KV donors, head dims in both spellings, RoPE,
//! and clear errors for configs the decoder cannot run.

use hayai_core::safetensors::DType;
use hayai_model::gemma4::{text_config, Gemma4TextConfig, STOP_TOKENS};
use hayai_model::synth::{preset_config, SynthDtype};
use hayai_model::ModelError;
use serde_json::{json, Value};

fn text(preset: &str) -> Value {
    text_config(&preset_config(preset, SynthDtype::Bf16).unwrap()).clone()
}

#[test]
fn e4b_layer_map_matches_the_reference() {
    let tc = Gemma4TextConfig::parse(&text("e4b")).unwrap();
    let spec = tc.to_spec(DType::BF16).unwrap();
    assert_eq!(spec.n_layers(), 42);
    let full: Vec<usize> = (0..42).filter(|&i| !spec.layers[i].sliding).collect();
    assert_eq!(full, [5, 11, 17, 23, 29, 35, 41]);
    for (i, l) in spec.layers.iter().enumerate() {
        let want = if i < 24 {
            i
        } else if l.sliding {
            22
        } else {
            23
        };
        assert_eq!(l.kv_source, want, "layer {i}");
        assert_eq!(l.head_dim, if l.sliding { 256 } else { 512 });
        assert_eq!((l.n_heads, l.n_kv_heads, l.intermediate), (8, 2, 10240));
        if l.sliding {
            assert_eq!(
                (l.rope.theta, l.rope.dim_base, l.rope.rotary_pairs),
                (10_000.0, 256, 128)
            );
        } else {
            // Proportional RoPE: 64 rotating pairs, exponents over the full 512.
            assert_eq!(
                (l.rope.theta, l.rope.dim_base, l.rope.rotary_pairs),
                (1_000_000.0, 512, 64)
            );
        }
    }
    assert_eq!(spec.kv_layers().count(), 24);
    assert_eq!(spec.embed_scale, 50.5);
    assert_eq!(spec.attn_scale, 1.0);
    assert_eq!(spec.final_softcap, Some(30.0));
    assert_eq!(spec.sliding_window, 512);
    assert_eq!(spec.ple.as_ref().map(|p| p.dim), Some(256));
    assert!(spec.v_norm && spec.layer_scalar && spec.tie_embeddings);
    for t in STOP_TOKENS {
        assert!(spec.eos_token_ids.contains(&t));
    }
    assert_eq!(tc.donor_layers().unwrap(), (22, 23));
}

#[test]
fn e2b_double_wide_mlp_and_donors() {
    let spec = Gemma4TextConfig::parse(&text("e2b"))
        .unwrap()
        .to_spec(DType::BF16)
        .unwrap();
    assert_eq!(spec.n_layers(), 35);
    for (i, l) in spec.layers.iter().enumerate() {
        assert_eq!(
            l.intermediate,
            if i >= 15 { 12288 } else { 6144 },
            "layer {i}"
        );
        if i >= 15 {
            assert_eq!(l.kv_source, if l.sliding { 13 } else { 14 });
        }
        assert_eq!(l.n_kv_heads, 1);
    }
    assert_eq!(spec.embed_scale, 39.25);
}

#[test]
fn both_head_dim_spellings_agree() {
    let mut a = text("e4b");
    let obj = a.as_object_mut().unwrap();
    obj.remove("global_head_dim");
    let per_layer: serde_json::Map<String, Value> = [5, 11, 17, 23, 29, 35, 41]
        .iter()
        .map(|i| (i.to_string(), json!({"head_dim": 512})))
        .collect();
    obj.insert("per_layer_config".into(), Value::Object(per_layer));
    let b = text("e4b");
    assert_eq!(
        Gemma4TextConfig::parse(&a).unwrap(),
        Gemma4TextConfig::parse(&b).unwrap()
    );
    // Neither spelling: transformers' default of 512.
    let mut c = text("e4b");
    c.as_object_mut().unwrap().remove("global_head_dim");
    assert_eq!(Gemma4TextConfig::parse(&c).unwrap().head_dims[5], 512);
}

#[test]
fn defaults_follow_transformers() {
    // Minimal config: 5:1 layer pattern with a forced full last layer, default RoPE.
    let t = json!({"hidden_size": 64, "num_hidden_layers": 8, "intermediate_size": 128,
                   "vocab_size": 300, "num_attention_heads": 4, "num_key_value_heads": 2,
                   "head_dim": 16, "global_head_dim": 32, "hidden_size_per_layer_input": 0});
    let tc = Gemma4TextConfig::parse(&t).unwrap();
    let s: Vec<bool> = tc.sliding.clone();
    assert_eq!(s, [true, true, true, true, true, false, true, false]);
    let spec = tc.to_spec(DType::F32).unwrap();
    assert_eq!(spec.embed_scale, 8.0);
    assert!(spec.ple.is_none());
    assert_eq!(spec.layers[5].rope.rotary_pairs, 4);
    assert_eq!(spec.sliding_window, 512);
    assert_eq!(spec.final_softcap, None);
}

fn err(t: Value) -> ModelError {
    Gemma4TextConfig::parse(&t)
        .and_then(|c| c.to_spec(DType::F32))
        .unwrap_err()
}

#[test]
fn rejects_what_it_cannot_run() {
    let base = text("tiny");
    let with = |k: &str, v: Value| {
        let mut t = base.clone();
        t.as_object_mut().unwrap().insert(k.into(), v);
        t
    };
    assert!(matches!(
        err(with("attention_k_eq_v", json!(true))),
        ModelError::Unsupported(_)
    ));
    assert!(matches!(
        err(with("enable_moe_block", json!(true))),
        ModelError::Unsupported(_)
    ));
    assert!(matches!(
        err(with(
            "rope_parameters",
            json!({"full_attention": {"rope_type": "yarn"}})
        )),
        ModelError::Unsupported(_)
    ));
    assert!(matches!(
        err(with("hidden_size", json!("big"))),
        ModelError::Config(_)
    ));
    assert!(matches!(
        err(with("layer_types", json!(["sliding_attention"]))),
        ModelError::Config(_)
    ));
    assert!(matches!(
        err(with("num_kv_shared_layers", json!(99))),
        ModelError::Config(_)
    ));
    // Every layer shared: no donor in a target model.
    assert!(matches!(
        err(with("num_kv_shared_layers", json!(6))),
        ModelError::Config(_)
    ));
    // Shared full layer but all earlier layers are sliding.
    let t = with(
        "layer_types",
        json!([
            "sliding_attention",
            "sliding_attention",
            "sliding_attention",
            "sliding_attention",
            "sliding_attention",
            "full_attention"
        ]),
    );
    let mut t = t;
    t.as_object_mut()
        .unwrap()
        .insert("num_kv_shared_layers".into(), json!(1));
    let e = err(t);
    assert!(
        e.to_string().contains("no earlier layer of its type"),
        "{e}"
    );
    let mut t = base.clone();
    t.as_object_mut().unwrap().remove("hidden_size");
    assert!(err(t).to_string().contains("hidden_size"));
}
