//! The Gemma 4 multi-token-prediction assistant (`Gemma4AssistantForCausalLM`, GEMMA4.md §4):
//! a 4-layer drafter with no K/V of its own. Each draft step reads the target's scaled
//! embedding of the newest token and the target's final-normed hidden state, attends to the
//! target's donor K/V (the last K/V-owning sliding and full layers), and predicts the next
//! token through a centroid-masked head.
//!
//! Attention window while drafting at position `P` with the target holding K/V for positions
//! `0..P`: full layers see all `P` keys; sliding layers see the last `W + 1` of them
//! (transformers' inclusive bidirectional window). This is exactly transformers' behaviour for
//! the first round after prefill; later rounds never see stale K/V of rejected drafts (see
//! docs/decisions.md).

use std::path::Path;

use hayai_core::config::HfConfig;
use hayai_core::safetensors::{DType, SafeTensors};
use serde_json::Value;

use crate::cpu::ops::{attend, gelu_tanh, rms_norm_rows, rope};
use crate::gemma4::Gemma4TextConfig;
use crate::load::hf::{eos_ids, HfTensors};
use crate::spec::{ModelSpec, RopeSpec};
use crate::weights::Matrix;
use crate::ModelError;

/// One assistant decoder layer (a Gemma 4 layer without K/V projections or PLE).
#[derive(Clone, Debug)]
pub struct AssistantLayer {
    pub sliding: bool,
    pub head_dim: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub intermediate: usize,
    pub rope: RopeSpec,
    pub attn_norm: Vec<f32>,
    pub q: Matrix,
    pub q_norm: Vec<f32>,
    pub o: Matrix,
    pub post_attn_norm: Vec<f32>,
    pub pre_ffn_norm: Vec<f32>,
    pub gate: Matrix,
    pub up: Matrix,
    pub down: Matrix,
    pub post_ffn_norm: Vec<f32>,
    pub layer_scalar: f32,
    inv_freq: Vec<f32>,
}

/// The output head of the drafter.
#[derive(Clone, Debug)]
pub enum DraftHead {
    /// Plain tied head over the whole vocabulary.
    Dense,
    /// Centroid-masked head: score `n_centroids` clusters, keep the `top_k` best, and score only
    /// their tokens (`ordering[c*per .. (c+1)*per]` belong to cluster `c`).
    Masked {
        centroids: Matrix,
        ordering: Vec<u32>,
        top_k: usize,
    },
}

#[derive(Clone, Debug)]
pub struct Assistant {
    /// Hidden size of the target it drafts for.
    pub backbone_hidden: usize,
    pub hidden: usize,
    pub vocab: usize,
    pub rms_eps: f32,
    pub sliding_window: usize,
    pub layers: Vec<AssistantLayer>,
    /// `[vocab, hidden]`: the (tied) output embedding.
    pub embed: Matrix,
    pub final_norm: Vec<f32>,
    /// `[hidden, 2 * backbone_hidden]`, applied to `[embedding, hidden state]`.
    pub pre_proj: Matrix,
    /// `[backbone_hidden, hidden]`.
    pub post_proj: Matrix,
    pub head: DraftHead,
    pub eos_token_ids: Vec<u32>,
}

/// Target K/V a draft step attends to: one cache-owning target layer, `[pos][kv_head][hd]`.
#[derive(Clone, Copy, Debug)]
pub struct KvView<'a> {
    pub k: &'a [f32],
    pub v: &'a [f32],
}

/// Result of one draft step.
#[derive(Clone, Debug)]
pub struct DraftStep {
    pub token: u32,
    /// `post_projection(final-normed state)`: the hidden input of the next draft step.
    pub hidden: Vec<f32>,
    /// Full-vocabulary logits when requested (masked entries hold `min(selected) - 1`, as
    /// transformers fills them).
    pub logits: Option<Vec<f32>>,
}

/// Which target layers serve as the assistant's K/V donors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Donors {
    pub sliding: usize,
    pub full: usize,
}

impl Assistant {
    /// Load from an HF directory (config.json + safetensors).
    pub fn load_hf_dir(dir: &Path) -> Result<Self, ModelError> {
        let cfg = HfConfig::load(dir)?;
        let st = SafeTensors::open(dir)?;
        Self::load_hf(&cfg, &st)
    }

    pub fn load_hf(cfg: &HfConfig, st: &SafeTensors) -> Result<Self, ModelError> {
        let raw = &cfg.raw;
        let mt = raw.get("model_type").and_then(Value::as_str).unwrap_or("");
        if mt != "gemma4_assistant" {
            return Err(ModelError::Unsupported(format!(
                "model_type `{mt}` is not a Gemma 4 assistant (expected gemma4_assistant)"
            )));
        }
        let text = raw
            .get("text_config")
            .filter(|t| t.is_object())
            .ok_or_else(|| ModelError::Config("assistant config.json has no text_config".into()))?;
        let mut tc = Gemma4TextConfig::parse(text)?;
        // transformers makes every assistant layer KV-shared when the config says 0.
        if tc.num_kv_shared_layers == 0 {
            tc.num_kv_shared_layers = tc.n_layers;
        }
        if tc.num_kv_shared_layers != tc.n_layers {
            return Err(ModelError::Config(
                "every Gemma 4 assistant layer must share the target's K/V".into(),
            ));
        }
        if tc.hidden_per_layer_input != 0 || tc.use_double_wide_mlp {
            return Err(ModelError::Config(
                "a Gemma 4 assistant has no per-layer embeddings and no double-wide MLP".into(),
            ));
        }
        let get = |k: &str| raw.get(k).and_then(Value::as_u64).map(|x| x as usize);
        let backbone = get("backbone_hidden_size").unwrap_or(1536);
        let ordered = raw
            .get("use_ordered_embeddings")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let h = tc.hidden;
        let ts = HfTensors {
            st,
            prefix: String::new(),
        };
        let mut layers = Vec::with_capacity(tc.n_layers);
        for i in 0..tc.n_layers {
            let p = |s: &str| format!("model.layers.{i}.{s}");
            let (hd, nh, im) = (tc.head_dims[i], tc.n_heads, tc.intermediate);
            let rope = if tc.sliding[i] {
                &tc.rope_sliding
            } else {
                &tc.rope_full
            }
            .spec(hd);
            let scalar = ts.vector(&p("layer_scalar"), 1)?[0];
            layers.push(AssistantLayer {
                sliding: tc.sliding[i],
                head_dim: hd,
                n_heads: nh,
                n_kv_heads: tc.kv_heads[i],
                intermediate: im,
                inv_freq: rope.inv_freq(hd),
                rope,
                attn_norm: ts.vector(&p("input_layernorm.weight"), h)?,
                q: ts.matrix(&p("self_attn.q_proj.weight"), nh * hd, h)?,
                q_norm: ts.vector(&p("self_attn.q_norm.weight"), hd)?,
                o: ts.matrix(&p("self_attn.o_proj.weight"), h, nh * hd)?,
                post_attn_norm: ts.vector(&p("post_attention_layernorm.weight"), h)?,
                pre_ffn_norm: ts.vector(&p("pre_feedforward_layernorm.weight"), h)?,
                gate: ts.matrix(&p("mlp.gate_proj.weight"), im, h)?,
                up: ts.matrix(&p("mlp.up_proj.weight"), im, h)?,
                down: ts.matrix(&p("mlp.down_proj.weight"), h, im)?,
                post_ffn_norm: ts.vector(&p("post_feedforward_layernorm.weight"), h)?,
                layer_scalar: scalar,
            });
        }
        let tied = raw
            .get("tie_word_embeddings")
            .and_then(Value::as_bool)
            .unwrap_or(true);
        let embed = if tied || !ts.has("lm_head.weight") {
            ts.matrix("model.embed_tokens.weight", tc.vocab, h)?
        } else {
            ts.matrix("lm_head.weight", tc.vocab, h)?
        };
        let head = if ordered {
            let c = get("num_centroids").unwrap_or(2048);
            let top_k = get("centroid_intermediate_top_k").unwrap_or(32);
            if c == 0 || tc.vocab % c != 0 || top_k == 0 || top_k > c {
                return Err(ModelError::Config(format!(
                    "assistant head: {c} centroids / top-k {top_k} do not fit a vocabulary of {}",
                    tc.vocab
                )));
            }
            DraftHead::Masked {
                centroids: ts.matrix("masked_embedding.centroids.weight", c, h)?,
                ordering: token_ordering(st, tc.vocab)?,
                top_k,
            }
        } else {
            DraftHead::Dense
        };
        let mut eos = eos_ids(raw);
        for t in eos_ids(text) {
            if !eos.contains(&t) {
                eos.push(t);
            }
        }
        Ok(Assistant {
            backbone_hidden: backbone,
            hidden: h,
            vocab: tc.vocab,
            rms_eps: tc.rms_eps,
            sliding_window: tc.sliding_window,
            layers,
            embed,
            final_norm: ts.vector("model.norm.weight", h)?,
            pre_proj: ts.matrix("pre_projection.weight", h, 2 * backbone)?,
            post_proj: ts.matrix("post_projection.weight", backbone, h)?,
            head,
            eos_token_ids: eos,
        })
    }

    /// Check that this assistant fits `target` and return the target layers whose K/V it
    /// reads: the last K/V-owning layer of each attention type.
    pub fn donors(&self, target: &ModelSpec) -> Result<Donors, ModelError> {
        if target.hidden != self.backbone_hidden {
            return Err(ModelError::Config(format!(
                "assistant expects a target of hidden size {}, got {}",
                self.backbone_hidden, target.hidden
            )));
        }
        if target.vocab != self.vocab {
            return Err(ModelError::Config(format!(
                "assistant vocabulary {} differs from the target's {}",
                self.vocab, target.vocab
            )));
        }
        let find = |sliding: bool| {
            (0..target.n_layers())
                .rev()
                .find(|&i| target.layers[i].owns_kv(i) && target.layers[i].sliding == sliding)
        };
        let (s, f) = (find(true), find(false));
        for (i, l) in self.layers.iter().enumerate() {
            let d = if l.sliding { s } else { f }.ok_or_else(|| {
                ModelError::Config(format!(
                    "assistant layer {i} needs a {} target layer with K/V",
                    if l.sliding { "sliding" } else { "full" }
                ))
            })?;
            let tl = &target.layers[d];
            if tl.head_dim != l.head_dim || tl.n_kv_heads != l.n_kv_heads {
                return Err(ModelError::Config(format!(
                    "assistant layer {i} (head dim {}, {} KV heads) does not match target layer {d} ({}, {})",
                    l.head_dim, l.n_kv_heads, tl.head_dim, tl.n_kv_heads
                )));
            }
        }
        Ok(Donors {
            sliding: s.unwrap_or(usize::MAX),
            full: f.unwrap_or(usize::MAX),
        })
    }

    /// One draft step at query position `pos`. `embedding` is the target's *scaled* embedding
    /// of the input token, `hidden_in` the target's final-normed hidden state (first step) or
    /// the previous step's [`DraftStep::hidden`]. `n_keys` target positions (`0..n_keys`) are
    /// visible in `sliding`/`full`.
    #[allow(clippy::too_many_arguments)]
    pub fn step(
        &self,
        embedding: &[f32],
        hidden_in: &[f32],
        pos: usize,
        sliding: KvView<'_>,
        full: KvView<'_>,
        n_keys: usize,
        want_logits: bool,
    ) -> Result<DraftStep, ModelError> {
        let (b, h, eps) = (self.backbone_hidden, self.hidden, self.rms_eps);
        if embedding.len() != b || hidden_in.len() != b {
            return Err(ModelError::Backend(format!(
                "draft step inputs must have {b} values (got {} and {})",
                embedding.len(),
                hidden_in.len()
            )));
        }
        if n_keys == 0 {
            return Err(ModelError::Backend(
                "draft step needs at least one target position".into(),
            ));
        }
        let mut cat = Vec::with_capacity(2 * b);
        cat.extend_from_slice(embedding);
        cat.extend_from_slice(hidden_in);
        let mut z = vec![0.0f32; h];
        self.pre_proj.matvec(&cat, &mut z);

        let mut a = vec![0.0f32; h];
        for (li, l) in self.layers.iter().enumerate() {
            let (hd, nh, nkv) = (l.head_dim, l.n_heads, l.n_kv_heads);
            let kv = if l.sliding { sliding } else { full };
            let need = n_keys * nkv * hd;
            if kv.k.len() < need || kv.v.len() < need {
                return Err(ModelError::Backend(format!(
                    "assistant layer {li}: target K/V holds fewer than {n_keys} positions"
                )));
            }
            a.copy_from_slice(&z);
            rms_norm_rows(&mut a, h, Some(&l.attn_norm), eps);
            let mut q = vec![0.0f32; nh * hd];
            l.q.matvec(&a, &mut q);
            rms_norm_rows(&mut q, hd, Some(&l.q_norm), eps);
            for head in q.chunks_exact_mut(hd) {
                rope(head, pos, &l.inv_freq);
            }
            let start = if l.sliding {
                n_keys.saturating_sub(self.sliding_window + 1)
            } else {
                0
            };
            let group = nh / nkv;
            let mut att = vec![0.0f32; nh * hd];
            for (head, out) in att.chunks_exact_mut(hd).enumerate() {
                // Gemma 4 attention: scale 1.0, no softcap.
                attend(
                    &q[head * hd..(head + 1) * hd],
                    kv.k,
                    kv.v,
                    nkv,
                    head / group,
                    start..n_keys,
                    1.0,
                    None,
                    out,
                );
            }
            let mut o = vec![0.0f32; h];
            l.o.matvec(&att, &mut o);
            rms_norm_rows(&mut o, h, Some(&l.post_attn_norm), eps);
            z.iter_mut().zip(&o).for_each(|(x, y)| *x += y);

            a.copy_from_slice(&z);
            rms_norm_rows(&mut a, h, Some(&l.pre_ffn_norm), eps);
            let mut g = vec![0.0f32; l.intermediate];
            let mut u = vec![0.0f32; l.intermediate];
            l.gate.matvec(&a, &mut g);
            l.up.matvec(&a, &mut u);
            g.iter_mut()
                .zip(&u)
                .for_each(|(gv, uv)| *gv = gelu_tanh(*gv) * uv);
            let mut d = vec![0.0f32; h];
            l.down.matvec(&g, &mut d);
            rms_norm_rows(&mut d, h, Some(&l.post_ffn_norm), eps);
            z.iter_mut().zip(&d).for_each(|(x, y)| *x += y);
            z.iter_mut().for_each(|x| *x *= l.layer_scalar);
        }
        rms_norm_rows(&mut z, h, Some(&self.final_norm), eps);
        let mut hidden = vec![0.0f32; b];
        self.post_proj.matvec(&z, &mut hidden);
        let (token, logits) = self.head_logits(&z, want_logits);
        Ok(DraftStep {
            token,
            hidden,
            logits,
        })
    }

    /// Greedy token of the head for final-normed state `y` (lowest id wins ties), and the full
    /// logits if asked.
    fn head_logits(&self, y: &[f32], want: bool) -> (u32, Option<Vec<f32>>) {
        match &self.head {
            DraftHead::Dense => {
                let mut logits = vec![0.0f32; self.vocab];
                self.embed.matvec(y, &mut logits);
                let tok = crate::argmax(&logits);
                (tok, want.then_some(logits))
            }
            DraftHead::Masked {
                centroids,
                ordering,
                top_k,
            } => {
                let c = centroids.rows;
                let per = self.vocab / c;
                let mut cs = vec![0.0f32; c];
                centroids.matvec(y, &mut cs);
                let mut idx: Vec<usize> = (0..c).collect();
                // Highest score first; equal scores by index (a total order keeps it deterministic).
                idx.sort_by(|&a, &b| cs[b].total_cmp(&cs[a]).then(a.cmp(&b)));
                let mut row = vec![0.0f32; self.hidden];
                let mut best = (f32::NEG_INFINITY, u32::MAX);
                let mut selected = Vec::with_capacity(top_k * per);
                for &ci in &idx[..*top_k] {
                    for &id in &ordering[ci * per..(ci + 1) * per] {
                        self.embed.row_into(id as usize, &mut row);
                        let s = crate::cpu::simd::dot(&row, y);
                        if s > best.0 || (s == best.0 && id < best.1) {
                            best = (s, id);
                        }
                        selected.push((id, s));
                    }
                }
                let logits = want.then(|| {
                    let fill = selected.iter().map(|x| x.1).fold(f32::INFINITY, f32::min) - 1.0;
                    let mut l = vec![fill; self.vocab];
                    selected.iter().for_each(|&(id, s)| l[id as usize] = s);
                    l
                });
                (best.1, logits)
            }
        }
    }
}

/// `masked_embedding.token_ordering`: integer ids, each below `vocab`.
fn token_ordering(st: &SafeTensors, vocab: usize) -> Result<Vec<u32>, ModelError> {
    let name = "masked_embedding.token_ordering";
    let t = st
        .get(name)
        .ok_or_else(|| ModelError::MissingTensor(name.into()))?;
    if t.shape.iter().product::<usize>() != vocab {
        return Err(ModelError::Shape {
            name: name.into(),
            got: t.shape.clone(),
            want: vec![vocab],
        });
    }
    let ids: Vec<i64> = match t.dtype {
        DType::I64 => t
            .data
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")))
            .collect(),
        DType::I32 => t
            .data
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes(b.try_into().expect("4 bytes")) as i64)
            .collect(),
        other => {
            return Err(ModelError::Config(format!(
                "{name} has dtype {other:?}, expected an integer type"
            )))
        }
    };
    ids.into_iter()
        .map(|v| {
            if v < 0 || v as usize >= vocab {
                Err(ModelError::Config(format!(
                    "{name} holds id {v} outside the vocabulary"
                )))
            } else {
                Ok(v as u32)
            }
        })
        .collect()
}
