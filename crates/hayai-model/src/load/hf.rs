//! Hugging Face model directories: `config.json` + safetensors (single or sharded).
//! Gemma 3 text is handled here; Gemma 4 has its own module ([`crate::gemma4`]).

use std::path::Path;

use hayai_core::config::HfConfig;
use hayai_core::safetensors::{DType, SafeTensors};
use serde_json::Value;

use crate::spec::{Arch, LayerSpec, ModelSpec, RopeSpec};
use crate::weights::{LayerWeights, Matrix, Model, ModelWeights};
use crate::ModelError;

pub fn load_hf_dir(dir: &Path) -> Result<Model, ModelError> {
    let cfg = HfConfig::load(dir)?;
    let model_type = cfg
        .raw
        .get("model_type")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let text_type = cfg
        .text_config()
        .get("model_type")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let st = SafeTensors::open(dir)?;
    if model_type.starts_with("gemma4") || text_type.starts_with("gemma4") {
        return crate::gemma4::load_hf(&cfg, &st);
    }
    match model_type.as_str() {
        "gemma3" | "gemma3_text" => load_gemma3(&cfg, &st),
        other => Err(ModelError::Unsupported(format!(
            "model_type `{other}` in {}/config.json (supported: gemma3, gemma3_text, gemma4, gemma4_text)",
            dir.display()
        ))),
    }
}

/// Typed access to a checkpoint's tensors under a name prefix, with shape checks. bf16 stays
/// bf16; other float types are converted to f32.
pub struct HfTensors<'a> {
    pub st: &'a SafeTensors,
    pub prefix: String,
}

impl<'a> HfTensors<'a> {
    /// Use the first prefix under which `probe` exists.
    pub fn with_prefix(
        st: &'a SafeTensors,
        candidates: &[&str],
        probe: &str,
    ) -> Result<Self, ModelError> {
        candidates
            .iter()
            .find(|p| st.contains(&format!("{p}{probe}")))
            .map(|p| HfTensors {
                st,
                prefix: p.to_string(),
            })
            .ok_or_else(|| {
                ModelError::MissingTensor(format!("{probe} (under any of {candidates:?})"))
            })
    }

    pub fn has(&self, name: &str) -> bool {
        self.st.contains(&format!("{}{name}", self.prefix))
    }

    fn get(
        &self,
        name: &str,
    ) -> Result<(String, hayai_core::safetensors::TensorView<'a>), ModelError> {
        let full = format!("{}{name}", self.prefix);
        let t = self
            .st
            .get(&full)
            .ok_or_else(|| ModelError::MissingTensor(full.clone()))?;
        Ok((full, t))
    }

    pub fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Matrix, ModelError> {
        let (full, t) = self.get(name)?;
        if t.shape != [rows, cols] {
            return Err(ModelError::Shape {
                name: full,
                got: t.shape.clone(),
                want: vec![rows, cols],
            });
        }
        Ok(if t.dtype == DType::BF16 {
            Matrix::from_bf16_bits(rows, cols, t.to_bf16_bits()?)
        } else {
            Matrix::from_f32(rows, cols, t.to_f32_vec()?)
        })
    }

    pub fn vector(&self, name: &str, n: usize) -> Result<Vec<f32>, ModelError> {
        let (full, t) = self.get(name)?;
        // A vector may carry unit dimensions (`layer_scalar` is stored as `[1]`).
        let non_unit = t.shape.iter().filter(|&&d| d != 1).count();
        if t.shape.iter().product::<usize>() != n || non_unit > 1 {
            return Err(ModelError::Shape {
                name: full,
                got: t.shape.clone(),
                want: vec![n],
            });
        }
        Ok(t.to_f32_vec()?)
    }
}

pub(crate) fn get_usize(v: &Value, key: &str) -> Result<usize, ModelError> {
    v.get(key)
        .and_then(Value::as_u64)
        .map(|x| x as usize)
        .ok_or_else(|| ModelError::Config(format!("config.json: missing integer `{key}`")))
}

pub(crate) fn get_f64_or(v: &Value, key: &str, default: f64) -> f64 {
    v.get(key).and_then(Value::as_f64).unwrap_or(default)
}

/// `eos_token_id` may be an int or a list.
pub(crate) fn eos_ids(v: &Value) -> Vec<u32> {
    match v.get("eos_token_id") {
        Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_u64)
            .map(|x| x as u32)
            .collect(),
        _ => Vec::new(),
    }
}

/// The checkpoint stores bf16 weights (HF then rounds scalar constants like the embedding
/// scale to bf16 too).
pub(crate) fn is_bf16(cfg: &HfConfig) -> bool {
    let t = cfg.text_config().raw();
    let dt = |v: &Value| {
        v.get("torch_dtype")
            .or_else(|| v.get("dtype"))
            .and_then(Value::as_str)
            .map(|s| s == "bfloat16")
    };
    dt(t).or_else(|| dt(&cfg.raw)).unwrap_or(false)
}

pub(crate) fn round_bf16(x: f32) -> f32 {
    half::bf16::from_f32(x).to_f32()
}

fn load_gemma3(cfg: &HfConfig, st: &SafeTensors) -> Result<Model, ModelError> {
    let t = cfg.text_config().raw();
    let hidden = get_usize(t, "hidden_size")?;
    let n_layers = get_usize(t, "num_hidden_layers")?;
    let n_heads = get_usize(t, "num_attention_heads")?;
    let n_kv = get_usize(t, "num_key_value_heads")?;
    let head_dim = t
        .get("head_dim")
        .and_then(Value::as_u64)
        .map(|x| x as usize)
        .unwrap_or(hidden / n_heads);
    let ff = get_usize(t, "intermediate_size")?;
    let vocab = get_usize(t, "vocab_size")?;
    let window = t
        .get("sliding_window")
        .and_then(Value::as_u64)
        .map(|x| x as usize)
        .unwrap_or(4096);
    let pattern = t
        .get("sliding_window_pattern")
        .and_then(Value::as_u64)
        .unwrap_or(6) as usize;
    let layer_types: Option<Vec<bool>> = t.get("layer_types").and_then(Value::as_array).map(|a| {
        a.iter()
            .map(|x| x.as_str() == Some("sliding_attention"))
            .collect()
    });
    let theta = get_f64_or(t, "rope_theta", 1_000_000.0);
    let theta_local = get_f64_or(t, "rope_local_base_freq", 10_000.0);
    let linear = t
        .get("rope_scaling")
        .filter(|r| {
            r.get("rope_type")
                .or_else(|| r.get("type"))
                .and_then(Value::as_str)
                == Some("linear")
        })
        .and_then(|r| r.get("factor"))
        .and_then(Value::as_f64)
        .unwrap_or(1.0);
    let qpas = get_f64_or(t, "query_pre_attn_scalar", head_dim as f64);
    let bf16 = is_bf16(cfg);
    let mut embed_scale = (hidden as f32).sqrt();
    if bf16 {
        embed_scale = round_bf16(embed_scale);
    }
    let layers = (0..n_layers)
        .map(|i| {
            let sliding = match &layer_types {
                Some(v) => v.get(i).copied().unwrap_or(true),
                None => (i + 1) % pattern != 0,
            };
            LayerSpec {
                sliding,
                head_dim,
                n_heads,
                n_kv_heads: n_kv,
                intermediate: ff,
                rope: RopeSpec {
                    theta: if sliding { theta_local } else { theta },
                    dim_base: head_dim,
                    rotary_pairs: head_dim / 2,
                    linear_factor: if sliding { 1.0 } else { linear },
                },
                kv_source: i,
            }
        })
        .collect();
    let mut eos = eos_ids(&cfg.raw);
    if eos.is_empty() {
        eos = eos_ids(t);
    }
    if eos.is_empty() {
        eos = vec![1];
    }
    if !eos.contains(&106) && vocab > 106 {
        eos.push(106); // <end_of_turn>
    }
    let spec = ModelSpec {
        arch: Arch::Gemma3,
        hidden,
        vocab,
        layers,
        rms_eps: get_f64_or(t, "rms_norm_eps", 1e-6) as f32,
        sliding_window: window,
        embed_scale,
        attn_scale: (qpas as f32).powf(-0.5),
        attn_softcap: t
            .get("attn_logit_softcapping")
            .and_then(Value::as_f64)
            .map(|x| x as f32),
        final_softcap: t
            .get("final_logit_softcapping")
            .and_then(Value::as_f64)
            .map(|x| x as f32),
        v_norm: false,
        layer_scalar: false,
        ple: None,
        tie_embeddings: true,
        max_context: t
            .get("max_position_embeddings")
            .and_then(Value::as_u64)
            .map(|x| x as usize)
            .unwrap_or(32768),
        bos_token_id: t.get("bos_token_id").and_then(Value::as_u64).unwrap_or(2) as u32,
        eos_token_ids: eos,
    };
    let ts = HfTensors::with_prefix(
        st,
        &[
            "model.",
            "model.language_model.",
            "language_model.model.",
            "",
        ],
        "embed_tokens.weight",
    )?;
    // Gemma 3 RMSNorm multiplies by (1 + w): fold it in.
    let norm = |name: &str, n: usize| -> Result<Vec<f32>, ModelError> {
        Ok(ts.vector(name, n)?.into_iter().map(|w| 1.0 + w).collect())
    };
    let (qd, kvd) = (n_heads * head_dim, n_kv * head_dim);
    let mut lw = Vec::with_capacity(n_layers);
    for i in 0..n_layers {
        let p = |s: &str| format!("layers.{i}.{s}.weight");
        lw.push(LayerWeights {
            attn_norm: norm(&p("input_layernorm"), hidden)?,
            q: ts.matrix(&p("self_attn.q_proj"), qd, hidden)?,
            k: Some(ts.matrix(&p("self_attn.k_proj"), kvd, hidden)?),
            v: Some(ts.matrix(&p("self_attn.v_proj"), kvd, hidden)?),
            q_norm: norm(&p("self_attn.q_norm"), head_dim)?,
            k_norm: Some(norm(&p("self_attn.k_norm"), head_dim)?),
            o: ts.matrix(&p("self_attn.o_proj"), hidden, qd)?,
            post_attn_norm: norm(&p("post_attention_layernorm"), hidden)?,
            pre_ffn_norm: norm(&p("pre_feedforward_layernorm"), hidden)?,
            gate: ts.matrix(&p("mlp.gate_proj"), ff, hidden)?,
            up: ts.matrix(&p("mlp.up_proj"), ff, hidden)?,
            down: ts.matrix(&p("mlp.down_proj"), hidden, ff)?,
            post_ffn_norm: norm(&p("post_feedforward_layernorm"), hidden)?,
            ple: None,
            layer_scalar: 1.0,
        });
    }
    let lm_head = if st.get("lm_head.weight").is_some()
        && cfg.raw.get("tie_word_embeddings").and_then(Value::as_bool) == Some(false)
    {
        let t = HfTensors {
            st,
            prefix: String::new(),
        };
        Some(t.matrix("lm_head.weight", vocab, hidden)?)
    } else {
        None
    };
    let mut spec = spec;
    spec.tie_embeddings = lm_head.is_none();
    let weights = ModelWeights {
        embed: ts.matrix("embed_tokens.weight", vocab, hidden)?,
        lm_head,
        final_norm: norm("norm.weight", hidden)?,
        ple: None,
        layers: lw,
    };
    Ok(Model { spec, weights })
}
