//! Gemma 3 from GGUF (llama.cpp's layout: `blk.N.*` tensors, `gemma3.*` metadata). The
//! converter already folded Gemma's `1 + w` into the norm weights, so they load as is.

use std::path::Path;

use hayai_core::dequant::tensor_f32;
use hayai_core::GgufFile;

use super::expect_shape;
use crate::spec::{Arch, LayerSpec, ModelSpec, RopeSpec};
use crate::weights::{LayerWeights, Matrix, Model, ModelWeights};
use crate::ModelError;

pub fn load_gguf(path: &Path) -> Result<Model, ModelError> {
    let file = GgufFile::open(path)?;
    let arch = file
        .architecture()
        .ok_or_else(|| ModelError::Config("GGUF has no general.architecture".into()))?
        .to_string();
    match arch.as_str() {
        "gemma3" => load_gemma3(&file),
        "gemma4" => crate::gemma4::load_gguf(&file),
        other => Err(ModelError::Unsupported(format!(
            "GGUF architecture `{other}` (supported: gemma3, gemma4)"
        ))),
    }
}

fn req_u(f: &GgufFile, key: &str) -> Result<usize, ModelError> {
    Ok(f.require_u64(key)? as usize)
}

/// Token ids of the named tokens that exist in the GGUF vocabulary.
pub(crate) fn find_tokens(f: &GgufFile, names: &[&str]) -> Vec<u32> {
    let Some(tokens) = f.get_str_array("tokenizer.ggml.tokens") else {
        return Vec::new();
    };
    names
        .iter()
        .filter_map(|n| tokens.iter().position(|t| t == n).map(|i| i as u32))
        .collect()
}

fn matrix(f: &GgufFile, name: &str, rows: usize, cols: usize) -> Result<Matrix, ModelError> {
    let (shape, data) = load_f32(f, name)?;
    expect_shape(name, &shape, &[rows, cols])?;
    Ok(Matrix::from_f32(rows, cols, data))
}

fn vector(f: &GgufFile, name: &str, n: usize) -> Result<Vec<f32>, ModelError> {
    let (shape, data) = load_f32(f, name)?;
    expect_shape(name, &shape, &[n])?;
    Ok(data)
}

fn load_f32(f: &GgufFile, name: &str) -> Result<(Vec<usize>, Vec<f32>), ModelError> {
    if f.tensor(name).is_none() {
        return Err(ModelError::MissingTensor(name.to_string()));
    }
    Ok(tensor_f32(f, name)?)
}

/// Gemma 3's hyperparameters from `gemma3.*` metadata (shared with the ggml-exact forward).
pub(crate) struct Gemma3Meta {
    pub hidden: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv: usize,
    pub ff: usize,
    pub head_dim: usize,
    pub eps: f32,
    /// `attention.sliding_window`, if the file gives one.
    pub window: Option<usize>,
    pub theta_global: f64,
    /// Sliding layers' RoPE base (`rope.freq_base_swa`, else llama.cpp's 10,000).
    pub theta_local: f64,
    /// Linear RoPE scaling factor of the global layers (1 without scaling).
    pub linear: f64,
}

pub(crate) fn gemma3_meta(f: &GgufFile) -> Result<Gemma3Meta, ModelError> {
    let a = "gemma3";
    let hidden = req_u(f, &format!("{a}.embedding_length"))?;
    let n_heads = req_u(f, &format!("{a}.attention.head_count"))?;
    Ok(Gemma3Meta {
        hidden,
        n_layers: req_u(f, &format!("{a}.block_count"))?,
        n_heads,
        n_kv: req_u(f, &format!("{a}.attention.head_count_kv"))?,
        ff: req_u(f, &format!("{a}.feed_forward_length"))?,
        head_dim: f
            .get_u64(&format!("{a}.attention.key_length"))
            .map(|v| v as usize)
            .unwrap_or(hidden / n_heads.max(1)),
        eps: f.require_f32(&format!("{a}.attention.layer_norm_rms_epsilon"))?,
        window: f
            .get_u64(&format!("{a}.attention.sliding_window"))
            .map(|v| v as usize),
        theta_global: f
            .get_f64(&format!("{a}.rope.freq_base"))
            .unwrap_or(1_000_000.0),
        theta_local: f
            .get_f64(&format!("{a}.rope.freq_base_swa"))
            .unwrap_or(10_000.0),
        linear: match f.get_str(&format!("{a}.rope.scaling.type")) {
            Some("linear") => f
                .get_f64(&format!("{a}.rope.scaling.factor"))
                .unwrap_or(1.0),
            _ => 1.0,
        },
    })
}

fn load_gemma3(f: &GgufFile) -> Result<Model, ModelError> {
    let a = "gemma3";
    let Gemma3Meta {
        hidden,
        n_layers,
        n_heads,
        n_kv,
        ff,
        head_dim,
        eps,
        window,
        theta_global,
        theta_local,
        linear,
    } = gemma3_meta(f)?;
    let window = window.unwrap_or(4096);
    let ctx = f
        .get_u64(&format!("{a}.context_length"))
        .map(|v| v as usize)
        .unwrap_or(8192);
    let embd = f
        .tensor("token_embd.weight")
        .ok_or_else(|| ModelError::MissingTensor("token_embd.weight".into()))?;
    let vocab = embd.shape()[0];

    // Gemma 3: every sixth layer is global, the rest sliding (local RoPE base 10k).
    let layers: Vec<LayerSpec> = (0..n_layers)
        .map(|i| {
            let sliding = i % 6 != 5;
            LayerSpec {
                sliding,
                head_dim,
                n_heads,
                n_kv_heads: n_kv,
                intermediate: ff,
                rope: RopeSpec {
                    theta: if sliding { theta_local } else { theta_global },
                    dim_base: head_dim,
                    rotary_pairs: head_dim / 2,
                    linear_factor: if sliding { 1.0 } else { linear },
                },
                kv_source: i,
            }
        })
        .collect();
    let mut eos = vec![f.get_u32("tokenizer.ggml.eos_token_id").unwrap_or(1)];
    for t in find_tokens(f, &["<end_of_turn>"]) {
        if !eos.contains(&t) {
            eos.push(t);
        }
    }
    let spec = ModelSpec {
        arch: Arch::Gemma3,
        hidden,
        vocab,
        layers,
        rms_eps: eps,
        sliding_window: window,
        // llama.cpp scales by sqrt(n_embd) in f32.
        embed_scale: (hidden as f32).sqrt(),
        attn_scale: 1.0 / (head_dim as f32).sqrt(),
        attn_softcap: f.get_f32(&format!("{a}.attn_logit_softcapping")),
        final_softcap: f.get_f32(&format!("{a}.final_logit_softcapping")),
        v_norm: false,
        layer_scalar: false,
        ple: None,
        tie_embeddings: f.tensor("output.weight").is_none(),
        max_context: ctx,
        bos_token_id: f.get_u32("tokenizer.ggml.bos_token_id").unwrap_or(2),
        eos_token_ids: eos,
    };

    let qd = n_heads * head_dim;
    let kvd = n_kv * head_dim;
    let mut lw = Vec::with_capacity(n_layers);
    for i in 0..n_layers {
        let p = |s: &str| format!("blk.{i}.{s}.weight");
        lw.push(LayerWeights {
            attn_norm: vector(f, &p("attn_norm"), hidden)?,
            q: matrix(f, &p("attn_q"), qd, hidden)?,
            k: Some(matrix(f, &p("attn_k"), kvd, hidden)?),
            v: Some(matrix(f, &p("attn_v"), kvd, hidden)?),
            q_norm: vector(f, &p("attn_q_norm"), head_dim)?,
            k_norm: Some(vector(f, &p("attn_k_norm"), head_dim)?),
            o: matrix(f, &p("attn_output"), hidden, qd)?,
            post_attn_norm: vector(f, &p("post_attention_norm"), hidden)?,
            pre_ffn_norm: vector(f, &p("ffn_norm"), hidden)?,
            gate: matrix(f, &p("ffn_gate"), ff, hidden)?,
            up: matrix(f, &p("ffn_up"), ff, hidden)?,
            down: matrix(f, &p("ffn_down"), hidden, ff)?,
            post_ffn_norm: vector(f, &p("post_ffw_norm"), hidden)?,
            ple: None,
            layer_scalar: 1.0,
        });
    }
    let weights = ModelWeights {
        embed: matrix(f, "token_embd.weight", vocab, hidden)?,
        lm_head: if spec.tie_embeddings {
            None
        } else {
            Some(matrix(f, "output.weight", vocab, hidden)?)
        },
        final_norm: vector(f, "output_norm.weight", hidden)?,
        ple: None,
        layers: lw,
    };
    Ok(Model { spec, weights })
}
