//! Gemma 4 text decoder (E2B/E4B and relatives) from Hugging Face checkpoints.
//!
//! Both checkpoint layouts are accepted: `Gemma4ForConditionalGeneration` (config with a
//! `text_config`, tensors under `model.language_model.`; vision/audio tensors are ignored) and
//! `Gemma4ForCausalLM` (flat config, tensors under `model.`). The full-attention head size is
//! read from either spelling transformers uses: `global_head_dim`, or the sparse
//! `per_layer_config` overrides that transformers 5.x writes. Semantics follow transformers'
//! `modeling_gemma4.py` (see docs/decisions.md, "Gemma 4").

use hayai_core::config::HfConfig;
use hayai_core::safetensors::{DType, SafeTensors};
use hayai_core::{GgufFile, MetaArray, MetaValue};
use serde_json::{json, Value};

use crate::load::hf::{eos_ids, HfTensors};
use crate::spec::{Arch, LayerSpec, ModelSpec, PleSpec, RopeSpec};
use crate::weights::{GlobalPle, LayerPle, LayerWeights, Matrix, Model, ModelWeights};
use crate::ModelError;

/// Token ids that end a Gemma 4 turn: `<eos>`, `<turn|>`, `<|tool_response>`.
pub const STOP_TOKENS: [u32; 3] = [1, 106, 50];
/// `<|turn>` and `<turn|>`.
pub const TURN_START: u32 = 105;
pub const TURN_END: u32 = 106;

/// Tensor-name prefixes of the text decoder, most specific first.
pub const PREFIXES: [&str; 4] = [
    "model.language_model.",
    "model.",
    "language_model.model.",
    "",
];

/// One rotary configuration of a layer type (`rope_parameters[layer_type]`).
#[derive(Clone, Debug, PartialEq)]
pub struct RopeParams {
    pub rope_type: String,
    pub theta: f64,
    pub partial_rotary_factor: f64,
    pub factor: f64,
}

impl RopeParams {
    fn parse(
        v: Option<&Value>,
        default_type: &str,
        default_theta: f64,
        default_prf: f64,
    ) -> Result<Self, ModelError> {
        let get = |k: &str| v.and_then(|v| v.get(k));
        let rope_type = get("rope_type")
            .or_else(|| get("type"))
            .and_then(Value::as_str)
            .unwrap_or(default_type)
            .to_string();
        let p = RopeParams {
            theta: get("rope_theta")
                .and_then(Value::as_f64)
                .unwrap_or(default_theta),
            partial_rotary_factor: get("partial_rotary_factor")
                .and_then(Value::as_f64)
                .unwrap_or(default_prf),
            factor: get("factor").and_then(Value::as_f64).unwrap_or(1.0),
            rope_type,
        };
        if !matches!(p.rope_type.as_str(), "default" | "proportional" | "linear") {
            return Err(ModelError::Unsupported(format!(
                "rope_type `{}` (supported: default, proportional, linear)",
                p.rope_type
            )));
        }
        if !(p.theta > 0.0 && p.factor > 0.0) {
            return Err(ModelError::Config(
                "rope_theta and factor must be positive".into(),
            ));
        }
        if !(0.0..=1.0).contains(&p.partial_rotary_factor) {
            return Err(ModelError::Config(
                "partial_rotary_factor must lie in [0, 1]".into(),
            ));
        }
        Ok(p)
    }

    /// The rotary spec for a head of `head_dim`. transformers' Gemma 4 "default" rotates every
    /// pair (it ignores `partial_rotary_factor`); "proportional" rotates the first
    /// `int(prf * head_dim // 2)` pairs with exponents over the full head dim.
    pub fn spec(&self, head_dim: usize) -> RopeSpec {
        let rotary_pairs = match self.rope_type.as_str() {
            "proportional" => {
                ((self.partial_rotary_factor * head_dim as f64) / 2.0).floor() as usize
            }
            _ => head_dim / 2,
        };
        RopeSpec {
            theta: self.theta,
            dim_base: head_dim,
            rotary_pairs: rotary_pairs.min(head_dim / 2),
            linear_factor: self.factor,
        }
    }
}

/// The fields of a Gemma 4 `text_config` the decoder needs, with transformers' defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct Gemma4TextConfig {
    pub hidden: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub vocab: usize,
    pub vocab_per_layer_input: usize,
    /// PLE width per layer; 0 disables per-layer embeddings.
    pub hidden_per_layer_input: usize,
    pub intermediate: usize,
    pub use_double_wide_mlp: bool,
    pub num_kv_shared_layers: usize,
    pub sliding_window: usize,
    pub rms_eps: f32,
    pub final_softcap: Option<f32>,
    pub max_position_embeddings: usize,
    pub bos_token_id: u32,
    pub eos_token_ids: Vec<u32>,
    pub tie_word_embeddings: bool,
    /// `true` for sliding-window layers.
    pub sliding: Vec<bool>,
    /// Head dim of each layer after `global_head_dim` / `per_layer_config` are applied.
    pub head_dims: Vec<usize>,
    /// KV heads of each layer after overrides.
    pub kv_heads: Vec<usize>,
    pub rope_sliding: RopeParams,
    pub rope_full: RopeParams,
}

fn req_usize(v: &Value, key: &str) -> Result<usize, ModelError> {
    match v.get(key) {
        Some(x) => x.as_u64().map(|x| x as usize).ok_or_else(|| {
            ModelError::Config(format!(
                "config.json: `{key}` must be a non-negative integer"
            ))
        }),
        None => Err(ModelError::Config(format!("config.json: missing `{key}`"))),
    }
}

fn opt_usize(v: &Value, key: &str, default: usize) -> Result<usize, ModelError> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(_) => req_usize(v, key),
    }
}

fn opt_bool(v: &Value, key: &str, default: bool) -> bool {
    v.get(key).and_then(Value::as_bool).unwrap_or(default)
}

impl Gemma4TextConfig {
    /// Parse a Gemma 4 text config (the `text_config` object of a multimodal config, or a
    /// flat `gemma4_text` config).
    pub fn parse(t: &Value) -> Result<Self, ModelError> {
        if !t.is_object() {
            return Err(ModelError::Config(
                "config.json: text config is not an object".into(),
            ));
        }
        if opt_bool(t, "attention_k_eq_v", false) {
            return Err(ModelError::Unsupported(
                "Gemma 4 with attention_k_eq_v (31B / 26B-A4B) is not supported".into(),
            ));
        }
        if opt_bool(t, "enable_moe_block", false) {
            return Err(ModelError::Unsupported(
                "Gemma 4 MoE blocks are not supported".into(),
            ));
        }
        if t.get("use_bidirectional_attention").and_then(Value::as_str) == Some("all") {
            return Err(ModelError::Unsupported(
                "use_bidirectional_attention = \"all\" is not supported".into(),
            ));
        }
        if t.get("attention_bias").and_then(Value::as_bool) == Some(true) {
            return Err(ModelError::Unsupported(
                "attention_bias = true is not supported".into(),
            ));
        }
        if let Some(act) = t.get("hidden_activation").and_then(Value::as_str) {
            if act != "gelu_pytorch_tanh" {
                return Err(ModelError::Unsupported(format!(
                    "hidden_activation `{act}`"
                )));
            }
        }
        let hidden = req_usize(t, "hidden_size")?;
        let n_layers = req_usize(t, "num_hidden_layers")?;
        let n_heads = opt_usize(t, "num_attention_heads", 8)?;
        let n_kv = opt_usize(t, "num_key_value_heads", 4)?;
        let head_dim = opt_usize(t, "head_dim", 256)?;
        let vocab = opt_usize(t, "vocab_size", 262_144)?;
        if hidden == 0 || n_layers == 0 || n_heads == 0 || n_kv == 0 || head_dim == 0 || vocab == 0
        {
            return Err(ModelError::Config(
                "config.json: sizes (hidden, layers, heads, head_dim, vocab) must be non-zero"
                    .into(),
            ));
        }

        // Layer types: explicit list, else transformers' 5:1 default; the last layer is full.
        let mut sliding: Vec<bool> = match t.get("layer_types") {
            Some(Value::Array(a)) => a
                .iter()
                .map(|x| match x.as_str() {
                    Some("sliding_attention") => Ok(true),
                    Some("full_attention") => Ok(false),
                    other => Err(ModelError::Config(format!(
                        "config.json: unknown layer type {other:?}"
                    ))),
                })
                .collect::<Result<_, _>>()?,
            None | Some(Value::Null) => (0..n_layers).map(|i| (i + 1) % 6 != 0).collect(),
            Some(_) => {
                return Err(ModelError::Config(
                    "config.json: layer_types must be a list".into(),
                ))
            }
        };
        if sliding.len() != n_layers {
            return Err(ModelError::Config(format!(
                "config.json: {} layer_types for {n_layers} layers",
                sliding.len()
            )));
        }
        *sliding.last_mut().unwrap() = false;

        // Full-attention head size: `per_layer_config` overrides (transformers 5.x) or
        // `global_head_dim` (default 512, as transformers assumes when neither is given).
        let head_dims: Vec<usize>;
        let mut kv_heads = vec![n_kv; n_layers];
        match t.get("per_layer_config") {
            Some(Value::Object(map)) => {
                let mut dims = vec![head_dim; n_layers];
                for (key, ov) in map {
                    let targets: Vec<usize> = match key.as_str() {
                        "sliding_attention" => (0..n_layers).filter(|&i| sliding[i]).collect(),
                        "full_attention" => (0..n_layers).filter(|&i| !sliding[i]).collect(),
                        k => match k.parse::<usize>() {
                            Ok(i) if i < n_layers => vec![i],
                            _ => {
                                return Err(ModelError::Config(format!(
                                    "config.json: per_layer_config key `{k}` is not a layer index"
                                )))
                            }
                        },
                    };
                    let ov = ov.as_object().ok_or_else(|| {
                        ModelError::Config(format!(
                            "config.json: per_layer_config[{key}] is not an object"
                        ))
                    })?;
                    for (field, val) in ov {
                        let n = val.as_u64().map(|x| x as usize).filter(|&x| x > 0).ok_or_else(|| {
                            ModelError::Config(format!(
                                "config.json: per_layer_config[{key}].{field} must be a positive integer"
                            ))
                        })?;
                        for &i in &targets {
                            match field.as_str() {
                                "head_dim" => dims[i] = n,
                                "num_key_value_heads" => kv_heads[i] = n,
                                other => {
                                    return Err(ModelError::Unsupported(format!(
                                        "per_layer_config override `{other}`"
                                    )))
                                }
                            }
                        }
                    }
                }
                head_dims = dims;
            }
            None | Some(Value::Null) => {
                let global = opt_usize(t, "global_head_dim", 512)?;
                head_dims = sliding
                    .iter()
                    .map(|&s| if s { head_dim } else { global })
                    .collect();
            }
            Some(_) => {
                return Err(ModelError::Config(
                    "config.json: per_layer_config must be an object".into(),
                ))
            }
        }

        let rope = t.get("rope_parameters");
        let rope_sliding = RopeParams::parse(
            rope.and_then(|r| r.get("sliding_attention")),
            "default",
            10_000.0,
            1.0,
        )?;
        let rope_full = RopeParams::parse(
            rope.and_then(|r| r.get("full_attention")),
            "proportional",
            1_000_000.0,
            0.25,
        )?;

        let num_kv_shared_layers = opt_usize(t, "num_kv_shared_layers", 0)?;
        if num_kv_shared_layers > n_layers {
            return Err(ModelError::Config(format!(
                "config.json: num_kv_shared_layers {num_kv_shared_layers} exceeds {n_layers} layers"
            )));
        }
        let sliding_window = opt_usize(t, "sliding_window", 512)?;
        if sliding_window == 0 {
            return Err(ModelError::Config(
                "config.json: sliding_window must be positive".into(),
            ));
        }
        let final_softcap = match t.get("final_logit_softcapping") {
            None | Some(Value::Null) => None,
            Some(v) => Some(v.as_f64().filter(|&c| c > 0.0).ok_or_else(|| {
                ModelError::Config("config.json: final_logit_softcapping must be positive".into())
            })? as f32),
        };
        let mut eos_token_ids = eos_ids(t);
        if t.get("eos_token_id").is_none() {
            eos_token_ids = vec![1];
        }
        Ok(Gemma4TextConfig {
            hidden,
            n_layers,
            n_heads,
            vocab,
            vocab_per_layer_input: opt_usize(t, "vocab_size_per_layer_input", 262_144)?,
            hidden_per_layer_input: opt_usize(t, "hidden_size_per_layer_input", 256)?,
            intermediate: req_usize(t, "intermediate_size")?,
            use_double_wide_mlp: opt_bool(t, "use_double_wide_mlp", false),
            num_kv_shared_layers,
            sliding_window,
            rms_eps: t
                .get("rms_norm_eps")
                .and_then(Value::as_f64)
                .unwrap_or(1e-6) as f32,
            final_softcap,
            max_position_embeddings: opt_usize(t, "max_position_embeddings", 131_072)?,
            bos_token_id: opt_usize(t, "bos_token_id", 2)? as u32,
            eos_token_ids,
            tie_word_embeddings: opt_bool(t, "tie_word_embeddings", true),
            sliding,
            head_dims,
            kv_heads,
            rope_sliding,
            rope_full,
        })
    }

    /// First layer that reads another layer's K/V (`n_layers` when none does).
    pub fn first_kv_shared(&self) -> usize {
        self.n_layers - self.num_kv_shared_layers
    }

    /// The layer whose K/V each layer attends to: itself before the first shared layer, else
    /// the last earlier non-shared layer of the same type (transformers' `store_full_length_kv`).
    pub fn kv_sources(&self) -> Result<Vec<usize>, ModelError> {
        let first = self.first_kv_shared();
        (0..self.n_layers)
            .map(|i| {
                if i < first {
                    return Ok(i);
                }
                (0..first)
                    .rev()
                    .find(|&j| self.sliding[j] == self.sliding[i])
                    .ok_or_else(|| {
                        ModelError::Config(format!(
                            "layer {i} shares K/V but no earlier layer of its type computes any"
                        ))
                    })
            })
            .collect()
    }

    /// The K/V donor of each attention type for an assistant: the last K/V-owning layer of
    /// that type, as `(sliding, full)`.
    pub fn donor_layers(&self) -> Result<(usize, usize), ModelError> {
        let first = self.first_kv_shared();
        let find = |s: bool| {
            (0..first)
                .rev()
                .find(|&j| self.sliding[j] == s)
                .ok_or_else(|| {
                    ModelError::Config(format!(
                        "no K/V-owning {} layer to share with an assistant",
                        if s { "sliding" } else { "full" }
                    ))
                })
        };
        Ok((find(true)?, find(false)?))
    }

    /// Layer specs with the given K/V sources.
    pub fn layer_specs(&self, kv_sources: &[usize]) -> Vec<LayerSpec> {
        let first = self.first_kv_shared();
        (0..self.n_layers)
            .map(|i| {
                let s = self.sliding[i];
                let hd = self.head_dims[i];
                // transformers doubles the MLP only on KV-shared layers (and never when every
                // layer is shared).
                let wide = self.use_double_wide_mlp && i >= first && first > 0;
                LayerSpec {
                    sliding: s,
                    head_dim: hd,
                    n_heads: self.n_heads,
                    n_kv_heads: self.kv_heads[i],
                    intermediate: self.intermediate * if wide { 2 } else { 1 },
                    rope: if s {
                        &self.rope_sliding
                    } else {
                        &self.rope_full
                    }
                    .spec(hd),
                    kv_source: kv_sources[i],
                }
            })
            .collect()
    }

    /// The model spec. `embed_scale` is `sqrt(hidden)` rounded to the embedding weight's
    /// dtype, as transformers computes it (`embed_scale.to(weight.dtype)`).
    pub fn to_spec(&self, embed_dtype: DType) -> Result<ModelSpec, ModelError> {
        let sources = self.kv_sources()?;
        let ple = if self.hidden_per_layer_input > 0 {
            if self.vocab_per_layer_input < self.vocab {
                return Err(ModelError::Unsupported(format!(
                    "per-layer-embedding vocabulary ({}) smaller than the vocabulary ({})",
                    self.vocab_per_layer_input, self.vocab
                )));
            }
            Some(PleSpec {
                dim: self.hidden_per_layer_input,
                vocab: self.vocab_per_layer_input,
            })
        } else {
            None
        };
        let mut eos = self.eos_token_ids.clone();
        for t in STOP_TOKENS {
            if !eos.contains(&t) {
                eos.push(t);
            }
        }
        eos.retain(|&t| (t as usize) < self.vocab);
        let spec = ModelSpec {
            arch: Arch::Gemma4,
            hidden: self.hidden,
            vocab: self.vocab,
            layers: self.layer_specs(&sources),
            rms_eps: self.rms_eps,
            sliding_window: self.sliding_window,
            embed_scale: embed_scale(self.hidden, embed_dtype),
            attn_scale: 1.0,
            attn_softcap: None,
            final_softcap: self.final_softcap,
            v_norm: true,
            layer_scalar: true,
            ple,
            tie_embeddings: self.tie_word_embeddings,
            max_context: self.max_position_embeddings,
            bos_token_id: self.bos_token_id,
            eos_token_ids: eos,
        };
        spec.validate().map_err(ModelError::Config)?;
        Ok(spec)
    }
}

/// `sqrt(hidden)` as an f32 (what `torch.tensor(float)` holds), then cast to the weight
/// dtype the way transformers' scaled embedding does.
pub fn embed_scale(hidden: usize, dtype: DType) -> f32 {
    let s = (hidden as f64).sqrt() as f32;
    match dtype {
        DType::BF16 => half::bf16::from_f32(s).to_f32(),
        DType::F16 => half::f16::from_f32(s).to_f32(),
        _ => s,
    }
}

/// The text config inside a (possibly multimodal) Gemma 4 config.
pub fn text_config(raw: &Value) -> &Value {
    match raw.get("text_config") {
        Some(t) if t.is_object() => t,
        _ => raw,
    }
}

/// Whether a parsed config.json describes a Gemma 4 text decoder.
pub fn is_gemma4(raw: &Value) -> bool {
    let mt = |v: &Value| {
        v.get("model_type")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let (top, text) = (mt(raw), mt(text_config(raw)));
    matches!(top.as_str(), "gemma4" | "gemma4_text") || text == "gemma4_text"
}

/// Stop ids of a config: its `eos_token_id` (top level and text config) plus Gemma 4's turn
/// stops.
pub fn config_eos(raw: &Value) -> Vec<u32> {
    let mut eos = eos_ids(raw);
    for t in eos_ids(text_config(raw)) {
        if !eos.contains(&t) {
            eos.push(t);
        }
    }
    eos
}

/// Load a Gemma 4 text decoder from an HF directory (config.json + safetensors, single or
/// sharded).
pub fn load_hf_dir(dir: &std::path::Path) -> Result<Model, ModelError> {
    let cfg = HfConfig::load(dir)?;
    let st = SafeTensors::open(dir)?;
    let model = load_hf(&cfg, &st)?;
    model.spec.validate().map_err(ModelError::Config)?;
    Ok(model)
}

/// Load a Gemma 4 text decoder from an opened HF checkpoint.
pub fn load_hf(cfg: &HfConfig, st: &SafeTensors) -> Result<Model, ModelError> {
    let raw = &cfg.raw;
    if raw.get("model_type").and_then(Value::as_str) == Some("gemma4_assistant") {
        return Err(ModelError::Unsupported(
            "this is a Gemma 4 assistant (drafter) checkpoint; load it with the assistant loader"
                .into(),
        ));
    }
    let mut tc = Gemma4TextConfig::parse(text_config(raw))?;
    // The multimodal wrapper carries the stop ids and the tie flag at the top level.
    if raw.get("text_config").is_some() {
        for t in config_eos(raw) {
            if !tc.eos_token_ids.contains(&t) {
                tc.eos_token_ids.push(t);
            }
        }
        if let Some(tie) = raw.get("tie_word_embeddings").and_then(Value::as_bool) {
            tc.tie_word_embeddings = tie;
        }
    }
    let ts = HfTensors::with_prefix(st, &PREFIXES, "embed_tokens.weight")?;
    let embed_dtype = st
        .get(&format!("{}embed_tokens.weight", ts.prefix))
        .map(|t| t.dtype)
        .ok_or_else(|| ModelError::MissingTensor("embed_tokens.weight".into()))?;
    let spec = tc.to_spec(embed_dtype)?;
    let weights = load_weights(&tc, &spec, &ts)?;
    Ok(Model { spec, weights })
}

/// Map the checkpoint's tensors onto [`ModelWeights`], checking every shape. K/V tensors
/// present on KV-shared layers are ignored (transformers drops them too).
pub fn load_weights(
    tc: &Gemma4TextConfig,
    spec: &ModelSpec,
    ts: &HfTensors,
) -> Result<ModelWeights, ModelError> {
    let h = spec.hidden;
    let mut layers = Vec::with_capacity(spec.n_layers());
    for (i, l) in spec.layers.iter().enumerate() {
        let p = |s: &str| format!("layers.{i}.{s}");
        let (qd, kvd, hd, im) = (l.q_dim(), l.kv_dim(), l.head_dim, l.intermediate);
        let own = l.owns_kv(i);
        let ple = match &spec.ple {
            Some(ps) => Some(LayerPle {
                gate: ts.matrix(&p("per_layer_input_gate.weight"), ps.dim, h)?,
                proj: ts.matrix(&p("per_layer_projection.weight"), h, ps.dim)?,
                post_norm: ts.vector(&p("post_per_layer_input_norm.weight"), h)?,
            }),
            None => None,
        };
        let scalar = ts.vector(&p("layer_scalar"), 1)?[0];
        if !scalar.is_finite() {
            return Err(ModelError::Config(format!(
                "layer {i}: layer_scalar is not finite"
            )));
        }
        layers.push(LayerWeights {
            attn_norm: ts.vector(&p("input_layernorm.weight"), h)?,
            q: ts.matrix(&p("self_attn.q_proj.weight"), qd, h)?,
            k: if own {
                Some(ts.matrix(&p("self_attn.k_proj.weight"), kvd, h)?)
            } else {
                None
            },
            v: if own {
                Some(ts.matrix(&p("self_attn.v_proj.weight"), kvd, h)?)
            } else {
                None
            },
            q_norm: ts.vector(&p("self_attn.q_norm.weight"), hd)?,
            k_norm: if own {
                Some(ts.vector(&p("self_attn.k_norm.weight"), hd)?)
            } else {
                None
            },
            o: ts.matrix(&p("self_attn.o_proj.weight"), h, qd)?,
            post_attn_norm: ts.vector(&p("post_attention_layernorm.weight"), h)?,
            pre_ffn_norm: ts.vector(&p("pre_feedforward_layernorm.weight"), h)?,
            gate: ts.matrix(&p("mlp.gate_proj.weight"), im, h)?,
            up: ts.matrix(&p("mlp.up_proj.weight"), im, h)?,
            down: ts.matrix(&p("mlp.down_proj.weight"), h, im)?,
            post_ffn_norm: ts.vector(&p("post_feedforward_layernorm.weight"), h)?,
            ple,
            layer_scalar: scalar,
        });
    }
    let ple = match &spec.ple {
        Some(ps) => {
            let width = spec.n_layers() * ps.dim;
            Some(GlobalPle {
                table: ts.matrix("embed_tokens_per_layer.weight", ps.vocab, width)?,
                model_proj: ts.matrix("per_layer_model_projection.weight", width, h)?,
                proj_norm: ts.vector("per_layer_projection_norm.weight", ps.dim)?,
            })
        }
        None => None,
    };
    let lm_head = if tc.tie_word_embeddings {
        None
    } else {
        let root = HfTensors {
            st: ts.st,
            prefix: String::new(),
        };
        Some(root.matrix("lm_head.weight", spec.vocab, h)?)
    };
    Ok(ModelWeights {
        embed: ts.matrix("embed_tokens.weight", spec.vocab, h)?,
        lm_head,
        final_norm: ts.vector("norm.weight", h)?,
        ple,
        layers,
    })
}

/// Per-layer integer metadata that llama.cpp writes either as one value or as an array.
fn gguf_per_layer(
    f: &GgufFile,
    key: &str,
    n: usize,
    default: Option<usize>,
) -> Result<Vec<usize>, ModelError> {
    match f.get(key) {
        Some(MetaValue::Array(a)) => {
            let v = a
                .to_i64_vec()
                .ok_or_else(|| ModelError::Config(format!("GGUF `{key}`: expected integers")))?;
            if v.len() != n || v.iter().any(|&x| x <= 0) {
                return Err(ModelError::Config(format!(
                    "GGUF `{key}`: expected {n} positive values"
                )));
            }
            Ok(v.into_iter().map(|x| x as usize).collect())
        }
        Some(m) => {
            let x = m.as_u64().filter(|&x| x > 0).ok_or_else(|| {
                ModelError::Config(format!("GGUF `{key}`: expected a positive integer"))
            })?;
            Ok(vec![x as usize; n])
        }
        None => default
            .map(|d| vec![d; n])
            .ok_or_else(|| ModelError::Config(format!("GGUF: missing `{key}`"))),
    }
}

fn gguf_f32(f: &GgufFile, name: &str, shape: &[usize]) -> Result<Vec<f32>, ModelError> {
    if f.tensor(name).is_none() {
        return Err(ModelError::MissingTensor(name.to_string()));
    }
    let (got, data) = f.tensor_f32(name)?;
    let numel = |s: &[usize]| s.iter().product::<usize>();
    let ok = if shape.len() == 1 {
        numel(&got) == shape[0]
    } else {
        got == shape
    };
    if !ok {
        return Err(ModelError::Shape {
            name: name.to_string(),
            got,
            want: shape.to_vec(),
        });
    }
    Ok(data)
}

fn gguf_matrix(f: &GgufFile, name: &str, rows: usize, cols: usize) -> Result<Matrix, ModelError> {
    Ok(Matrix::from_f32(
        rows,
        cols,
        gguf_f32(f, name, &[rows, cols])?,
    ))
}

/// Load a Gemma 4 text decoder from a GGUF in llama.cpp's `gemma4` layout (`blk.N.*` tensors,
/// `gemma4.*` metadata; norms stored as plain multipliers, proportional RoPE expressed as a
/// `rope_freqs` factor tensor). Quantized tensors are dequantized to f32.
pub fn load_gguf(f: &GgufFile) -> Result<Model, ModelError> {
    let arch = f.architecture().unwrap_or("");
    if arch != "gemma4" {
        return Err(ModelError::Unsupported(format!(
            "GGUF architecture `{arch}` is not gemma4"
        )));
    }
    let key = |k: &str| format!("gemma4.{k}");
    let req = |k: &str| -> Result<usize, ModelError> { Ok(f.require_u64(&key(k))? as usize) };
    let n = req("block_count")?;
    let hidden = req("embedding_length")?;
    let heads = gguf_per_layer(f, &key("attention.head_count"), n, None)?;
    let kv_heads = gguf_per_layer(f, &key("attention.head_count_kv"), n, Some(heads[0]))?;
    let ff = gguf_per_layer(f, &key("feed_forward_length"), n, None)?;
    let hd_full = f
        .get_u64(&key("attention.key_length"))
        .map(|x| x as usize)
        .unwrap_or(hidden / heads[0]);
    let hd_swa = f
        .get_u64(&key("attention.key_length_swa"))
        .map(|x| x as usize)
        .unwrap_or(hd_full);
    let sliding: Vec<bool> = match f.get(&key("attention.sliding_window_pattern")) {
        Some(MetaValue::Array(MetaArray::Bool(v))) if v.len() == n => v.clone(),
        Some(m) if m.as_u64().is_some() => {
            let p = m.as_u64().unwrap().max(1) as usize;
            (0..n).map(|i| (i + 1) % p != 0).collect()
        }
        None => (0..n).map(|i| (i + 1) % 6 != 0).collect(),
        Some(_) => {
            return Err(ModelError::Config(
                "GGUF `gemma4.attention.sliding_window_pattern`: expected one bool per layer"
                    .into(),
            ))
        }
    };
    let vocab = f
        .tensor("token_embd.weight")
        .and_then(|t| t.shape().first().copied())
        .ok_or_else(|| ModelError::MissingTensor("token_embd.weight".into()))?;
    let ple_dim = f
        .get_u64(&key("embedding_length_per_layer_input"))
        .unwrap_or(0) as usize;
    let theta_full = f.get_f64(&key("rope.freq_base")).unwrap_or(1_000_000.0);
    let theta_swa = f.get_f64(&key("rope.freq_base_swa")).unwrap_or(10_000.0);
    let n_rot_full = f
        .get_u64(&key("rope.dimension_count"))
        .map(|x| x as usize)
        .unwrap_or(hd_full);
    let n_rot_swa = f
        .get_u64(&key("rope.dimension_count_swa"))
        .map(|x| x as usize)
        .unwrap_or(hd_swa);
    // ggml's NeoX rotation pairs (i, i + n_rot/2); ours pairs (i, i + head_dim/2). They agree
    // when every dim is covered, which is how Gemma 4 is converted.
    if n_rot_full != hd_full || n_rot_swa != hd_swa {
        return Err(ModelError::Unsupported(format!(
            "GGUF rope dimension counts {n_rot_full}/{n_rot_swa} differ from head dims {hd_full}/{hd_swa}"
        )));
    }
    // Proportional RoPE: factor 1 on rotating pairs, a huge factor (frequency ~0) elsewhere.
    let full_pairs = match f.tensor("rope_freqs.weight") {
        Some(_) => {
            let v = gguf_f32(f, "rope_freqs.weight", &[hd_full / 2])?;
            let k = v.iter().take_while(|&&x| x == 1.0).count();
            if v[k..].iter().any(|&x| x < 1e20) {
                return Err(ModelError::Unsupported(
                    "GGUF rope_freqs other than 1 (rotate) / huge (pass through)".into(),
                ));
            }
            k
        }
        None => hd_full / 2,
    };
    // The tokenizer's EOS; `to_spec` adds Gemma 4's turn stops.
    let eos = f.get_u64("tokenizer.ggml.eos_token_id").unwrap_or(1);
    let t = json!({
        "hidden_size": hidden,
        "num_hidden_layers": n,
        "num_attention_heads": heads[0],
        "num_key_value_heads": kv_heads[0],
        "head_dim": hd_swa,
        "global_head_dim": hd_full,
        "vocab_size": vocab,
        "vocab_size_per_layer_input": vocab,
        "hidden_size_per_layer_input": ple_dim,
        "intermediate_size": ff[0],
        "num_kv_shared_layers": f.get_u64(&key("attention.shared_kv_layers")).unwrap_or(0),
        "sliding_window": f.get_u64(&key("attention.sliding_window")).unwrap_or(512),
        "rms_norm_eps": f.get_f64(&key("attention.layer_norm_rms_epsilon")).unwrap_or(1e-6),
        "final_logit_softcapping": f.get_f64(&key("final_logit_softcapping")),
        "max_position_embeddings": f.get_u64(&key("context_length")).unwrap_or(131_072),
        "bos_token_id": f.get_u64("tokenizer.ggml.bos_token_id").unwrap_or(2),
        "eos_token_id": eos,
        "layer_types": sliding.iter().map(|&s| if s { "sliding_attention" } else { "full_attention" }).collect::<Vec<_>>(),
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": theta_swa},
            "full_attention": {"rope_type": "default", "rope_theta": theta_full}
        },
        "tie_word_embeddings": f.tensor("output.weight").is_none(),
    });
    let mut tc = Gemma4TextConfig::parse(&t)?;
    tc.kv_heads = kv_heads.clone();
    // The released checkpoints are bf16 and transformers rounds the embedding scale to the
    // weight dtype; llama.cpp's unrounded sqrt(hidden) is 0.2 % off for E4B.
    let mut spec = tc.to_spec(DType::BF16)?;
    for (i, l) in spec.layers.iter_mut().enumerate() {
        l.n_heads = heads[i];
        l.intermediate = ff[i];
        if !l.sliding {
            l.rope.rotary_pairs = full_pairs;
        }
    }
    spec.validate().map_err(ModelError::Config)?;

    let h = hidden;
    let mut layers = Vec::with_capacity(n);
    for (i, l) in spec.layers.iter().enumerate() {
        let p = |s: &str| format!("blk.{i}.{s}.weight");
        let (qd, kvd, hd, im) = (l.q_dim(), l.kv_dim(), l.head_dim, l.intermediate);
        let own = l.owns_kv(i);
        if own && f.tensor(&p("attn_v")).is_none() {
            return Err(ModelError::Unsupported(format!(
                "blk.{i} has no attn_v (K = V attention) which is not supported"
            )));
        }
        let scalar = if f.tensor(&p("layer_output_scale")).is_some() {
            gguf_f32(f, &p("layer_output_scale"), &[1])?[0]
        } else {
            1.0
        };
        let ple = match &spec.ple {
            Some(ps) => Some(LayerPle {
                gate: gguf_matrix(f, &p("inp_gate"), ps.dim, h)?,
                proj: gguf_matrix(f, &p("proj"), h, ps.dim)?,
                post_norm: gguf_f32(f, &p("post_norm"), &[h])?,
            }),
            None => None,
        };
        layers.push(LayerWeights {
            attn_norm: gguf_f32(f, &p("attn_norm"), &[h])?,
            q: gguf_matrix(f, &p("attn_q"), qd, h)?,
            k: if own {
                Some(gguf_matrix(f, &p("attn_k"), kvd, h)?)
            } else {
                None
            },
            v: if own {
                Some(gguf_matrix(f, &p("attn_v"), kvd, h)?)
            } else {
                None
            },
            q_norm: gguf_f32(f, &p("attn_q_norm"), &[hd])?,
            k_norm: if own {
                Some(gguf_f32(f, &p("attn_k_norm"), &[hd])?)
            } else {
                None
            },
            o: gguf_matrix(f, &p("attn_output"), h, qd)?,
            post_attn_norm: gguf_f32(f, &p("post_attention_norm"), &[h])?,
            pre_ffn_norm: gguf_f32(f, &p("ffn_norm"), &[h])?,
            gate: gguf_matrix(f, &p("ffn_gate"), im, h)?,
            up: gguf_matrix(f, &p("ffn_up"), im, h)?,
            down: gguf_matrix(f, &p("ffn_down"), h, im)?,
            post_ffn_norm: gguf_f32(f, &p("post_ffw_norm"), &[h])?,
            ple,
            layer_scalar: scalar,
        });
    }
    let ple = match &spec.ple {
        Some(ps) => {
            let width = n * ps.dim;
            Some(GlobalPle {
                table: gguf_matrix(f, "per_layer_token_embd.weight", ps.vocab, width)?,
                model_proj: gguf_matrix(f, "per_layer_model_proj.weight", width, h)?,
                proj_norm: gguf_f32(f, "per_layer_proj_norm.weight", &[ps.dim])?,
            })
        }
        None => None,
    };
    let lm_head = if spec.tie_embeddings {
        None
    } else {
        Some(gguf_matrix(f, "output.weight", vocab, h)?)
    };
    let weights = ModelWeights {
        embed: gguf_matrix(f, "token_embd.weight", vocab, h)?,
        lm_head,
        final_norm: gguf_f32(f, "output_norm.weight", &[h])?,
        ple,
        layers,
    };
    Ok(Model { spec, weights })
}
