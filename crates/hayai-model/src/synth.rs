//! Deterministic random-weight Gemma 4 checkpoints in the Hugging Face layout (config.json,
//! generation_config.json, model.safetensors), for tests and speed benchmarks where the real
//! weights are not available.
//!
//! Every value is a pure function of `(seed, tensor name, element index)`, so output does not
//! depend on thread count. Magnitudes keep activations O(1) and give peaked, non-flat output
//! distributions: projections scale with 1/sqrt(fan_in), q/k norms keep attention scores near
//! unit-order (Gemma 4 uses no 1/sqrt(d) scaling), and the final norm sets logit spread.
//! Tensors are generated and written one block at a time, so full-size (E4B, ~16 GB in bf16)
//! checkpoints never need to fit in memory.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::str::FromStr;

use rayon::prelude::*;
use serde_json::{json, Value};

use crate::ModelError;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SynthDtype {
    F32,
    Bf16,
}

impl SynthDtype {
    fn st_name(self) -> &'static str {
        match self {
            SynthDtype::F32 => "F32",
            SynthDtype::Bf16 => "BF16",
        }
    }
    fn torch_name(self) -> &'static str {
        match self {
            SynthDtype::F32 => "float32",
            SynthDtype::Bf16 => "bfloat16",
        }
    }
    fn size(self) -> usize {
        match self {
            SynthDtype::F32 => 4,
            SynthDtype::Bf16 => 2,
        }
    }
}

impl FromStr for SynthDtype {
    type Err = ModelError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" | "fp32" => Ok(SynthDtype::F32),
            "bf16" | "bfloat16" => Ok(SynthDtype::Bf16),
            other => Err(ModelError::Config(format!(
                "unknown dtype `{other}` (expected f32 or bf16)"
            ))),
        }
    }
}

/// What [`synth`] wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SynthSummary {
    pub preset: String,
    pub n_tensors: usize,
    /// Number of stored values (all tensors).
    pub n_params: u64,
    pub bytes: u64,
}

/// Names accepted by [`synth`]. `*-assistant` presets are MTP drafters for the preset of the
/// same stem (`tiny-assistant` pairs with `tiny`).
pub fn presets() -> &'static [&'static str] {
    &[
        "tiny",
        "tiny-assistant",
        "small",
        "small-assistant",
        "e2b",
        "e2b-assistant",
        "e4b",
        "e4b-assistant",
    ]
}

/// Shapes of a target preset.
struct TargetShape {
    vocab: usize,
    hidden: usize,
    ple_dim: usize,
    intermediate: usize,
    double_wide: bool,
    layers: usize,
    /// A full-attention layer every `period` layers (the last of each period).
    period: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    global_head_dim: usize,
    kv_shared: usize,
    window: usize,
    max_pos: usize,
}

struct AssistantShape {
    hidden: usize,
    intermediate: usize,
    heads: usize,
    centroids: usize,
    top_k: usize,
}

fn target_shape(stem: &str) -> Option<TargetShape> {
    Some(match stem {
        "tiny" => TargetShape {
            vocab: 512,
            hidden: 64,
            ple_dim: 8,
            intermediate: 128,
            double_wide: false,
            layers: 6,
            period: 3,
            heads: 4,
            kv_heads: 2,
            head_dim: 16,
            global_head_dim: 32,
            kv_shared: 2,
            window: 16,
            max_pos: 4096,
        },
        // The real vocabulary (usable with the Gemma 4 tokenizer) at a small width.
        "small" => TargetShape {
            vocab: 262_144,
            hidden: 256,
            ple_dim: 16,
            intermediate: 1024,
            double_wide: false,
            layers: 12,
            period: 6,
            heads: 4,
            kv_heads: 2,
            head_dim: 64,
            global_head_dim: 128,
            kv_shared: 4,
            window: 512,
            max_pos: 131_072,
        },
        "e2b" => TargetShape {
            vocab: 262_144,
            hidden: 1536,
            ple_dim: 256,
            intermediate: 6144,
            double_wide: true,
            layers: 35,
            period: 5,
            heads: 8,
            kv_heads: 1,
            head_dim: 256,
            global_head_dim: 512,
            kv_shared: 20,
            window: 512,
            max_pos: 131_072,
        },
        "e4b" => TargetShape {
            vocab: 262_144,
            hidden: 2560,
            ple_dim: 256,
            intermediate: 10240,
            double_wide: false,
            layers: 42,
            period: 6,
            heads: 8,
            kv_heads: 2,
            head_dim: 256,
            global_head_dim: 512,
            kv_shared: 18,
            window: 512,
            max_pos: 131_072,
        },
        _ => return None,
    })
}

fn assistant_shape(stem: &str) -> AssistantShape {
    match stem {
        "tiny" => AssistantShape {
            hidden: 32,
            intermediate: 64,
            heads: 4,
            centroids: 16,
            top_k: 4,
        },
        "small" => AssistantShape {
            hidden: 64,
            intermediate: 256,
            heads: 4,
            centroids: 512,
            top_k: 8,
        },
        // E2B/E4B drafters (GEMMA4.md §4.1).
        _ => AssistantShape {
            hidden: 256,
            intermediate: 2048,
            heads: 4,
            centroids: 2048,
            top_k: 32,
        },
    }
}

fn layer_types(n: usize, period: usize) -> Vec<&'static str> {
    (0..n)
        .map(|i| {
            if (i + 1) % period == 0 || i + 1 == n {
                "full_attention"
            } else {
                "sliding_attention"
            }
        })
        .collect()
}

fn rope_parameters() -> Value {
    json!({
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0}
    })
}

/// How one tensor's values are drawn.
#[derive(Clone, Copy, Debug)]
enum Init {
    /// Uniform with this standard deviation, centred on 0.
    Std(f32),
    Uniform(f32, f32),
    /// A random permutation of `0..n` stored as int64.
    Permutation,
}

struct TensorPlan {
    name: String,
    shape: Vec<usize>,
    init: Init,
}

impl TensorPlan {
    fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

fn lin(name: String, out: usize, inp: usize) -> TensorPlan {
    TensorPlan {
        name,
        shape: vec![out, inp],
        init: Init::Std(1.0 / (inp as f32).sqrt()),
    }
}

fn norm(name: String, n: usize) -> TensorPlan {
    TensorPlan {
        name,
        shape: vec![n],
        init: Init::Uniform(0.5, 1.5),
    }
}

/// q/k norm weights: with attention scale 1.0 a score is a sum of `hd` products of normed
/// entries, so weights of ~(1/sqrt(hd))^0.5 keep score std near 1.
fn qk_norm(name: String, hd: usize) -> TensorPlan {
    let c = (1.0 / (hd as f32).sqrt()).sqrt();
    TensorPlan {
        name,
        shape: vec![hd],
        init: Init::Uniform(0.8 * c, 1.2 * c),
    }
}

/// Final norm: its weight is the logit standard deviation (tied head, unit-rms embeddings).
/// `embed_rms` is the rms of the (tied) embedding rows times sqrt(hidden); the weight is scaled
/// so logits keep a standard deviation of 2.5..4.5 whatever the embedding size.
fn final_norm(name: String, n: usize, embed_rms: f32) -> TensorPlan {
    TensorPlan {
        name,
        shape: vec![n],
        init: Init::Uniform(2.5 / embed_rms, 4.5 / embed_rms),
    }
}

/// RMS of a target's scaled token embedding. With a tied head, the input token's own direction
/// surviving in the residual stream gives its logit a bonus of about
/// `sqrt(hidden) * (embedding share of the stream)`; a random model with unit-rms embeddings
/// would mostly predict its input token again. 4/sqrt(hidden) keeps that bonus near one logit
/// standard deviation (checked against transformers: no echoing, stable under bf16).
fn embed_rms(hidden: usize) -> f32 {
    4.0 / (hidden as f32).sqrt()
}

/// `layer_scalar` near 1 and small branch norms (below) keep the residual stream
/// accumulating across layers as in trained models; with strong branches and a shrinking
/// residual a 42-layer random model is chaotic (bf16 rounding flips most greedy tokens).
fn scalar(name: String) -> TensorPlan {
    TensorPlan {
        name,
        shape: vec![1],
        init: Init::Uniform(0.9, 1.0),
    }
}

/// Norm applied to a branch output before it joins the residual stream. Its scale is set so
/// the 3 branches of all `layers` together outweigh the (unit-rms) token embedding about
/// twofold: enough that the model does not merely echo its input token, small enough that
/// deep models stay stable (0.1..0.3 at 42 layers).
fn branch_norm(name: String, n: usize, layers: usize) -> TensorPlan {
    let c = 2.0 / (3.0 * layers as f32).sqrt();
    TensorPlan {
        name,
        shape: vec![n],
        init: Init::Uniform(0.5 * c, 1.5 * c),
    }
}

fn target_config(s: &TargetShape, dtype: SynthDtype) -> Value {
    json!({
        "architectures": ["Gemma4ForConditionalGeneration"],
        "model_type": "gemma4",
        "dtype": dtype.torch_name(),
        "tie_word_embeddings": true,
        "eos_token_id": [1, 106],
        "vision_config": null,
        "audio_config": null,
        "text_config": {
            "model_type": "gemma4_text",
            "vocab_size": s.vocab,
            "vocab_size_per_layer_input": s.vocab,
            "hidden_size": s.hidden,
            "hidden_size_per_layer_input": s.ple_dim,
            "intermediate_size": s.intermediate,
            "use_double_wide_mlp": s.double_wide,
            "num_hidden_layers": s.layers,
            "layer_types": layer_types(s.layers, s.period),
            "num_attention_heads": s.heads,
            "num_key_value_heads": s.kv_heads,
            "head_dim": s.head_dim,
            "global_head_dim": s.global_head_dim,
            "num_kv_shared_layers": s.kv_shared,
            "sliding_window": s.window,
            "final_logit_softcapping": 30.0,
            "rms_norm_eps": 1e-6,
            "rope_parameters": rope_parameters(),
            "max_position_embeddings": s.max_pos,
            "hidden_activation": "gelu_pytorch_tanh",
            "attention_bias": false,
            "attention_k_eq_v": false,
            "enable_moe_block": false,
            "tie_word_embeddings": true,
            "bos_token_id": 2,
            "eos_token_id": 1,
            "pad_token_id": 0,
            "dtype": dtype.torch_name()
        }
    })
}

fn target_tensors(s: &TargetShape) -> Vec<TensorPlan> {
    let p = "model.language_model.";
    let h = s.hidden;
    let first_shared = s.layers - s.kv_shared;
    let types = layer_types(s.layers, s.period);
    let mut t = vec![
        TensorPlan {
            name: format!("{p}embed_tokens.weight"),
            shape: vec![s.vocab, h],
            init: Init::Std(embed_rms(h) / (h as f32).sqrt()),
        },
        TensorPlan {
            name: format!("{p}embed_tokens_per_layer.weight"),
            shape: vec![s.vocab, s.layers * s.ple_dim],
            init: Init::Std(1.0 / (s.ple_dim as f32).sqrt()),
        },
        lin(
            format!("{p}per_layer_model_projection.weight"),
            s.layers * s.ple_dim,
            h,
        ),
        norm(format!("{p}per_layer_projection_norm.weight"), s.ple_dim),
        final_norm(format!("{p}norm.weight"), h, embed_rms(h)),
    ];
    for (i, ty) in types.iter().enumerate() {
        let l = |n: &str| format!("{p}layers.{i}.{n}");
        let hd = if *ty == "full_attention" {
            s.global_head_dim
        } else {
            s.head_dim
        };
        let im = if s.double_wide && i >= first_shared && first_shared > 0 {
            2 * s.intermediate
        } else {
            s.intermediate
        };
        t.push(norm(l("input_layernorm.weight"), h));
        t.push(lin(l("self_attn.q_proj.weight"), s.heads * hd, h));
        t.push(qk_norm(l("self_attn.q_norm.weight"), hd));
        if i < first_shared {
            t.push(lin(l("self_attn.k_proj.weight"), s.kv_heads * hd, h));
            t.push(lin(l("self_attn.v_proj.weight"), s.kv_heads * hd, h));
            t.push(qk_norm(l("self_attn.k_norm.weight"), hd));
        }
        t.push(lin(l("self_attn.o_proj.weight"), h, s.heads * hd));
        t.push(branch_norm(
            l("post_attention_layernorm.weight"),
            h,
            s.layers,
        ));
        t.push(norm(l("pre_feedforward_layernorm.weight"), h));
        t.push(lin(l("mlp.gate_proj.weight"), im, h));
        t.push(lin(l("mlp.up_proj.weight"), im, h));
        t.push(lin(l("mlp.down_proj.weight"), h, im));
        t.push(branch_norm(
            l("post_feedforward_layernorm.weight"),
            h,
            s.layers,
        ));
        t.push(lin(l("per_layer_input_gate.weight"), s.ple_dim, h));
        t.push(lin(l("per_layer_projection.weight"), h, s.ple_dim));
        t.push(branch_norm(
            l("post_per_layer_input_norm.weight"),
            h,
            s.layers,
        ));
        t.push(scalar(l("layer_scalar")));
    }
    t
}

fn assistant_config(s: &TargetShape, a: &AssistantShape, dtype: SynthDtype) -> Value {
    json!({
        "architectures": ["Gemma4AssistantForCausalLM"],
        "model_type": "gemma4_assistant",
        "dtype": dtype.torch_name(),
        "backbone_hidden_size": s.hidden,
        "use_ordered_embeddings": true,
        "num_centroids": a.centroids,
        "centroid_intermediate_top_k": a.top_k,
        "tie_word_embeddings": true,
        "eos_token_id": [1, 106],
        "text_config": {
            "model_type": "gemma4_text",
            "vocab_size": s.vocab,
            "vocab_size_per_layer_input": 0,
            "hidden_size": a.hidden,
            "hidden_size_per_layer_input": 0,
            "intermediate_size": a.intermediate,
            "num_hidden_layers": 4,
            "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
            "num_attention_heads": a.heads,
            "num_key_value_heads": s.kv_heads,
            "head_dim": s.head_dim,
            "global_head_dim": s.global_head_dim,
            "num_kv_shared_layers": 4,
            "sliding_window": s.window,
            "final_logit_softcapping": null,
            "rms_norm_eps": 1e-6,
            "rope_parameters": rope_parameters(),
            "max_position_embeddings": s.max_pos,
            "hidden_activation": "gelu_pytorch_tanh",
            "tie_word_embeddings": true,
            "bos_token_id": 2,
            "eos_token_id": 1,
            "pad_token_id": 0,
            "dtype": dtype.torch_name()
        }
    })
}

fn assistant_tensors(s: &TargetShape, a: &AssistantShape) -> Vec<TensorPlan> {
    let h = a.hidden;
    let mut t = vec![
        TensorPlan {
            name: "model.embed_tokens.weight".into(),
            shape: vec![s.vocab, h],
            init: Init::Std(1.0 / (h as f32).sqrt()),
        },
        final_norm("model.norm.weight".into(), h, 1.0),
        lin("pre_projection.weight".into(), h, 2 * s.hidden),
        lin("post_projection.weight".into(), s.hidden, h),
        lin("masked_embedding.centroids.weight".into(), a.centroids, h),
        TensorPlan {
            name: "masked_embedding.token_ordering".into(),
            shape: vec![s.vocab],
            init: Init::Permutation,
        },
    ];
    for i in 0..4 {
        let l = |n: &str| format!("model.layers.{i}.{n}");
        let hd = if i == 3 {
            s.global_head_dim
        } else {
            s.head_dim
        };
        t.push(norm(l("input_layernorm.weight"), h));
        t.push(lin(l("self_attn.q_proj.weight"), a.heads * hd, h));
        t.push(qk_norm(l("self_attn.q_norm.weight"), hd));
        t.push(lin(l("self_attn.o_proj.weight"), h, a.heads * hd));
        t.push(branch_norm(l("post_attention_layernorm.weight"), h, 4));
        t.push(norm(l("pre_feedforward_layernorm.weight"), h));
        t.push(lin(l("mlp.gate_proj.weight"), a.intermediate, h));
        t.push(lin(l("mlp.up_proj.weight"), a.intermediate, h));
        t.push(lin(l("mlp.down_proj.weight"), h, a.intermediate));
        t.push(branch_norm(l("post_feedforward_layernorm.weight"), h, 4));
        t.push(scalar(l("layer_scalar")));
    }
    t
}

/// splitmix64 finalizer: a strong 64-bit mix.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// FNV-1a of a tensor name, to derive its stream.
fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Uniform in [0, 1) for element `i` of the stream `key` (counter-based: any order, any
/// thread gives the same value).
#[inline]
fn unit(key: u64, i: u64) -> f32 {
    (mix(key ^ mix(i)) >> 40) as f32 / (1u64 << 24) as f32
}

fn fill(init: Init, key: u64, start: u64, out: &mut [f32]) {
    const BLOCK: usize = 1 << 14;
    out.par_chunks_mut(BLOCK)
        .enumerate()
        .for_each(|(bi, chunk)| {
            let base = start + (bi * BLOCK) as u64;
            for (j, o) in chunk.iter_mut().enumerate() {
                let u = unit(key, base + j as u64);
                *o = match init {
                    // Uniform on [-a, a] has std a/sqrt(3).
                    Init::Std(std) => (2.0 * u - 1.0) * std * 3f32.sqrt(),
                    Init::Uniform(lo, hi) => lo + (hi - lo) * u,
                    Init::Permutation => unreachable!("permutations are not filled"),
                };
            }
        });
}

fn permutation(key: u64, n: usize) -> Vec<i64> {
    let mut p: Vec<i64> = (0..n as i64).collect();
    for i in (1..n).rev() {
        let j = (mix(key ^ mix(i as u64)) % (i as u64 + 1)) as usize;
        p.swap(i, j);
    }
    p
}

fn io_err(path: &Path, source: std::io::Error) -> ModelError {
    ModelError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Stream `plans` into a single safetensors file.
fn write_safetensors(
    path: &Path,
    plans: &[TensorPlan],
    seed: u64,
    dtype: SynthDtype,
) -> Result<u64, ModelError> {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut offset = 0u64;
    let mut sizes = Vec::with_capacity(plans.len());
    for t in plans {
        let (dt, esize) = match t.init {
            Init::Permutation => ("I64", 8),
            _ => (dtype.st_name(), dtype.size()),
        };
        let n = (t.numel() * esize) as u64;
        header.insert(
            t.name.clone(),
            json!({"dtype": dt, "shape": t.shape, "data_offsets": [offset, offset + n]}),
        );
        sizes.push(n);
        offset += n;
    }
    let mut hbytes = serde_json::to_vec(&Value::Object(header)).expect("header serializes");
    while !hbytes.len().is_multiple_of(8) {
        hbytes.push(b' ');
    }
    let file = File::create(path).map_err(|e| io_err(path, e))?;
    let mut w = BufWriter::with_capacity(1 << 22, file);
    w.write_all(&(hbytes.len() as u64).to_le_bytes())
        .and_then(|_| w.write_all(&hbytes))
        .map_err(|e| io_err(path, e))?;
    const CHUNK: usize = 1 << 24;
    let mut vals = vec![0.0f32; 0];
    let mut bytes: Vec<u8> = Vec::new();
    for t in plans {
        let key = mix(seed ^ mix(name_hash(&t.name)));
        if let Init::Permutation = t.init {
            let p = permutation(key, t.numel());
            bytes.clear();
            p.iter()
                .for_each(|v| bytes.extend_from_slice(&v.to_le_bytes()));
            w.write_all(&bytes).map_err(|e| io_err(path, e))?;
            continue;
        }
        let n = t.numel();
        let mut start = 0usize;
        while start < n {
            let len = CHUNK.min(n - start);
            vals.resize(len, 0.0);
            fill(t.init, key, start as u64, &mut vals);
            bytes.resize(len * dtype.size(), 0);
            match dtype {
                SynthDtype::F32 => bytes
                    .par_chunks_mut(4)
                    .zip(vals.par_iter())
                    .for_each(|(b, v)| b.copy_from_slice(&v.to_le_bytes())),
                SynthDtype::Bf16 => {
                    bytes
                        .par_chunks_mut(2)
                        .zip(vals.par_iter())
                        .for_each(|(b, v)| {
                            b.copy_from_slice(&half::bf16::from_f32(*v).to_bits().to_le_bytes())
                        })
                }
            }
            w.write_all(&bytes).map_err(|e| io_err(path, e))?;
            start += len;
        }
    }
    w.flush().map_err(|e| io_err(path, e))?;
    Ok(8 + hbytes.len() as u64 + offset)
}

fn write_json(path: &Path, v: &Value) -> Result<(), ModelError> {
    let s = serde_json::to_string_pretty(v).expect("json serializes");
    std::fs::write(path, s + "\n").map_err(|e| io_err(path, e))
}

fn plan(preset: &str, dtype: SynthDtype) -> Result<(bool, Value, Vec<TensorPlan>), ModelError> {
    let (stem, assistant) = match preset.strip_suffix("-assistant") {
        Some(s) => (s, true),
        None => (preset, false),
    };
    let shape = target_shape(stem).ok_or_else(|| {
        ModelError::Config(format!(
            "unknown synth preset `{preset}` (available: {})",
            presets().join(", ")
        ))
    })?;
    Ok(if assistant {
        let a = assistant_shape(stem);
        (
            true,
            assistant_config(&shape, &a, dtype),
            assistant_tensors(&shape, &a),
        )
    } else {
        (false, target_config(&shape, dtype), target_tensors(&shape))
    })
}

/// The config.json a preset writes (no weights are generated).
pub fn preset_config(preset: &str, dtype: SynthDtype) -> Result<Value, ModelError> {
    Ok(plan(preset, dtype)?.1)
}

/// Write preset `preset` with weights from `seed` into directory `out` (created if missing).
pub fn synth(
    preset: &str,
    seed: u64,
    out: &Path,
    dtype: SynthDtype,
) -> Result<SynthSummary, ModelError> {
    let (assistant, config, plans) = plan(preset, dtype)?;
    std::fs::create_dir_all(out).map_err(|e| io_err(out, e))?;
    write_json(&out.join("config.json"), &config)?;
    write_json(
        &out.join("generation_config.json"),
        &json!({"bos_token_id": 2, "eos_token_id": [1, 106, 50], "pad_token_id": 0}),
    )?;
    // Distinct streams for a target and its assistant under the same seed.
    let seed = if assistant {
        mix(seed ^ 0xA55A_A55A)
    } else {
        seed
    };
    let bytes = write_safetensors(&out.join("model.safetensors"), &plans, seed, dtype)?;
    Ok(SynthSummary {
        preset: preset.to_string(),
        n_tensors: plans.len(),
        n_params: plans.iter().map(|t| t.numel() as u64).sum(),
        bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutation_is_a_permutation() {
        let mut p = permutation(42, 1000);
        p.sort();
        assert_eq!(p, (0..1000).collect::<Vec<i64>>());
    }

    #[test]
    fn fill_is_independent_of_block_boundaries() {
        let mut a = vec![0.0f32; 50_000];
        fill(Init::Std(1.0), 7, 0, &mut a);
        let mut b = vec![0.0f32; 20_000];
        fill(Init::Std(1.0), 7, 30_000, &mut b);
        assert_eq!(&a[30_000..], &b[..]);
        let mean = a.iter().sum::<f32>() / a.len() as f32;
        let var = a.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / a.len() as f32;
        assert!(
            mean.abs() < 0.02 && (var - 1.0).abs() < 0.03,
            "mean {mean} var {var}"
        );
    }

    #[test]
    fn e4b_param_count_matches_the_reference() {
        // GEMMA4.md §5: ~7.46 B text parameters with the PLE table.
        let plans = target_tensors(&target_shape("e4b").unwrap());
        let n: u64 = plans.iter().map(|t| t.numel() as u64).sum();
        assert!((7.40e9..7.50e9).contains(&(n as f64)), "{n}");
        let a = assistant_tensors(&target_shape("e4b").unwrap(), &assistant_shape("e4b"));
        let n: u64 = a.iter().map(|t| t.numel() as u64).sum();
        // ~78.5 M (HF card) including the 262144-entry ordering buffer.
        assert!((78.0e6..79.5e6).contains(&(n as f64)), "{n}");
    }
}
