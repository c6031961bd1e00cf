//! Gemma 4 from GGUF in llama.cpp's layout: the transformers fixtures are converted the way
//! llama.cpp's converter names and describes them (tensor names, `gemma4.*` metadata,
//! `rope_freqs` for proportional RoPE, per-layer FFN widths), and the GGUF model must give
//! transformers' logits and greedy tokens.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use hayai_core::safetensors::SafeTensors;
use hayai_core::{GgmlType, GgufFile, GgufWriter, MetaArray, MetaValue};
use hayai_model::cpu::CpuRunner;
use hayai_model::gemma4::{load_gguf, load_hf_dir};
use hayai_model::{argmax, Rows, Runner};
use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/gemma4")
        .join(name)
}

/// HF tensor name (without the decoder prefix) → llama.cpp name.
fn gguf_name(hf: &str) -> Option<String> {
    let global = [
        ("embed_tokens.weight", "token_embd.weight"),
        (
            "embed_tokens_per_layer.weight",
            "per_layer_token_embd.weight",
        ),
        (
            "per_layer_model_projection.weight",
            "per_layer_model_proj.weight",
        ),
        (
            "per_layer_projection_norm.weight",
            "per_layer_proj_norm.weight",
        ),
        ("norm.weight", "output_norm.weight"),
    ];
    if let Some((_, g)) = global.iter().find(|(h, _)| *h == hf) {
        return Some(g.to_string());
    }
    let rest = hf.strip_prefix("layers.")?;
    let (i, name) = rest.split_once('.')?;
    let map = [
        ("input_layernorm.weight", "attn_norm.weight"),
        ("self_attn.q_proj.weight", "attn_q.weight"),
        ("self_attn.k_proj.weight", "attn_k.weight"),
        ("self_attn.v_proj.weight", "attn_v.weight"),
        ("self_attn.o_proj.weight", "attn_output.weight"),
        ("self_attn.q_norm.weight", "attn_q_norm.weight"),
        ("self_attn.k_norm.weight", "attn_k_norm.weight"),
        (
            "post_attention_layernorm.weight",
            "post_attention_norm.weight",
        ),
        ("pre_feedforward_layernorm.weight", "ffn_norm.weight"),
        ("mlp.gate_proj.weight", "ffn_gate.weight"),
        ("mlp.up_proj.weight", "ffn_up.weight"),
        ("mlp.down_proj.weight", "ffn_down.weight"),
        ("post_feedforward_layernorm.weight", "post_ffw_norm.weight"),
        ("per_layer_input_gate.weight", "inp_gate.weight"),
        ("per_layer_projection.weight", "proj.weight"),
        ("post_per_layer_input_norm.weight", "post_norm.weight"),
        ("layer_scalar", "layer_output_scale.weight"),
    ];
    map.iter()
        .find(|(h, _)| *h == name)
        .map(|(_, g)| format!("blk.{i}.{g}"))
}

fn u32v(x: usize) -> MetaValue {
    MetaValue::U32(x as u32)
}

/// Convert an HF fixture directory to GGUF bytes.
fn convert(dir: &Path) -> Vec<u8> {
    let raw: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let t = raw.get("text_config").unwrap_or(&raw).clone();
    let n = t["num_hidden_layers"].as_u64().unwrap() as usize;
    let hidden = t["hidden_size"].as_u64().unwrap() as usize;
    let sliding: Vec<bool> = t["layer_types"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x == "sliding_attention")
        .collect();
    let hd_swa = t["head_dim"].as_u64().unwrap() as usize;
    let hd_full = t
        .get("global_head_dim")
        .and_then(Value::as_u64)
        .or_else(|| {
            let full = sliding.iter().position(|s| !s).unwrap();
            t["per_layer_config"][full.to_string()]["head_dim"].as_u64()
        })
        .unwrap() as usize;
    let shared = t["num_kv_shared_layers"].as_u64().unwrap() as usize;
    let ff = t["intermediate_size"].as_u64().unwrap() as usize;
    let ff_meta = if t["use_double_wide_mlp"].as_bool() == Some(true) {
        MetaValue::Array(MetaArray::U32(
            (0..n)
                .map(|i| if i >= n - shared { 2 * ff } else { ff } as u32)
                .collect(),
        ))
    } else {
        u32v(ff)
    };
    let prf = t["rope_parameters"]["full_attention"]["partial_rotary_factor"]
        .as_f64()
        .unwrap();
    let n_rot = (hd_full as f64 * prf / 2.0) as usize;
    let freqs: Vec<f32> = (0..hd_full / 2)
        .map(|i| if i < n_rot { 1.0 } else { 1e30 })
        .collect();
    let k = |s: &str| format!("gemma4.{s}");
    let mut w = GgufWriter::new()
        .meta("general.architecture", MetaValue::String("gemma4".into()))
        .meta(&k("block_count"), u32v(n))
        .meta(&k("embedding_length"), u32v(hidden))
        .meta(&k("context_length"), u32v(4096))
        .meta(&k("feed_forward_length"), ff_meta)
        .meta(
            &k("attention.head_count"),
            u32v(t["num_attention_heads"].as_u64().unwrap() as usize),
        )
        .meta(
            &k("attention.head_count_kv"),
            u32v(t["num_key_value_heads"].as_u64().unwrap() as usize),
        )
        .meta(&k("attention.key_length"), u32v(hd_full))
        .meta(&k("attention.value_length"), u32v(hd_full))
        .meta(&k("attention.key_length_swa"), u32v(hd_swa))
        .meta(&k("attention.value_length_swa"), u32v(hd_swa))
        .meta(
            &k("attention.sliding_window"),
            u32v(t["sliding_window"].as_u64().unwrap() as usize),
        )
        .meta(
            &k("attention.sliding_window_pattern"),
            MetaValue::Array(MetaArray::Bool(sliding.clone())),
        )
        .meta(&k("attention.shared_kv_layers"), u32v(shared))
        .meta(
            &k("embedding_length_per_layer_input"),
            u32v(t["hidden_size_per_layer_input"].as_u64().unwrap() as usize),
        )
        .meta(&k("attention.layer_norm_rms_epsilon"), MetaValue::F32(1e-6))
        .meta(&k("rope.freq_base"), MetaValue::F32(1e6))
        .meta(&k("rope.freq_base_swa"), MetaValue::F32(1e4))
        .meta(&k("rope.dimension_count"), u32v(hd_full))
        .meta(&k("rope.dimension_count_swa"), u32v(hd_swa))
        .meta(
            &k("final_logit_softcapping"),
            MetaValue::F32(t["final_logit_softcapping"].as_f64().unwrap() as f32),
        )
        .meta("tokenizer.ggml.bos_token_id", u32v(2))
        .meta("tokenizer.ggml.eos_token_id", u32v(1))
        .tensor(
            "rope_freqs.weight",
            &[freqs.len() as u64],
            GgmlType::F32,
            freqs.iter().flat_map(|v| v.to_le_bytes()).collect(),
        );
    let st = SafeTensors::open(dir).unwrap();
    let prefix = if raw.get("text_config").is_some() {
        "model.language_model."
    } else {
        "model."
    };
    let mut names: Vec<&str> = st.names().collect();
    names.sort();
    for name in names {
        let Some(hf) = name.strip_prefix(prefix) else {
            continue;
        };
        let Some(g) = gguf_name(hf) else { continue };
        let view = st.get(name).unwrap();
        let data: Vec<u8> = view
            .to_f32_vec()
            .unwrap()
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let dims: Vec<u64> = view.shape.iter().rev().map(|&d| d as u64).collect();
        w = w.tensor(&g, &dims, GgmlType::F32, data);
    }
    w.to_bytes().unwrap()
}

fn logits(model: Arc<hayai_model::Model>, toks: &[u32]) -> Vec<f32> {
    let mut r = CpuRunner::new(model).unwrap();
    let mut out = Vec::new();
    r.forward(toks, Rows::All, &mut |_, l| out.extend_from_slice(l))
        .unwrap();
    out
}

fn check(name: &str) {
    let dir = fixture(name);
    let bytes = convert(&dir);
    // The same file through the generic loader the CLI and server use.
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("model.gguf");
    std::fs::write(&path, &bytes).unwrap();
    let via_cli_loader = hayai_model::load::load_model(&path).unwrap();
    let gguf = GgufFile::from_bytes(bytes).unwrap();
    let from_gguf = Arc::new(load_gguf(&gguf).unwrap());
    assert_eq!(via_cli_loader.spec, from_gguf.spec);
    let from_hf = Arc::new(load_hf_dir(&dir).unwrap());
    assert_eq!(
        from_gguf.spec.layers, from_hf.spec.layers,
        "{name}: layer specs differ"
    );
    assert_eq!(from_gguf.spec.embed_scale, from_hf.spec.embed_scale);
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let rec: Vec<u32> = reference["records"][0]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect();
    let want = SafeTensors::open(&dir.join("reference.safetensors"))
        .unwrap()
        .get("logits_record0")
        .unwrap()
        .to_f32_vec()
        .unwrap();
    let got = logits(from_gguf.clone(), &rec);
    let d = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    eprintln!("{name} via GGUF: max |logit diff| vs transformers {d:.3e}");
    assert!(d < 2e-3, "{name}: {d}");
    let vocab = from_gguf.spec.vocab;
    for (i, row) in got.chunks(vocab).enumerate() {
        assert_eq!(argmax(row), argmax(&want[i * vocab..(i + 1) * vocab]));
    }
}

#[test]
fn causal_fixture_through_gguf_matches_transformers() {
    check("causal");
}

#[test]
fn conditional_fixture_through_gguf_matches_transformers() {
    // Per-layer FFN widths (double-wide MLP) and k/v tensors left on shared layers.
    check("conditional");
}

#[test]
fn rejects_other_architectures() {
    let bytes = GgufWriter::new()
        .meta("general.architecture", MetaValue::String("gemma3".into()))
        .to_bytes()
        .unwrap();
    let f = GgufFile::from_bytes(bytes).unwrap();
    assert!(load_gguf(&f).is_err());
}
