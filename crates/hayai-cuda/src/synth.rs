//! Model shapes and random weights for GPU tests and the engine benchmark. Magnitudes follow
//! `hayai_model::random` (unit-variance projections, norms near 1) so activations stay O(1);
//! generation is parallel and stores bf16 so E4B-sized models are quick to make.

use half::bf16;
use hayai_model::random::{tiny_spec, SplitMix};
use hayai_model::spec::{Arch, LayerSpec, ModelSpec, PleSpec, RopeSpec};
use hayai_model::weights::{GlobalPle, LayerPle, LayerWeights, Matrix, Model, ModelWeights};
use rayon::prelude::*;

/// A toy spec with every feature of `arch` whose sizes fit the GPU kernels (head dims 128/256,
/// widths multiples of 128), a sliding window of 8 so the ring buffer wraps in short tests.
pub fn small_spec(arch: Arch) -> ModelSpec {
    let mut s = tiny_spec(arch);
    s.hidden = 256;
    s.vocab = 1000;
    s.embed_scale = 16.0;
    for l in s.layers.iter_mut() {
        let full4 = arch == Arch::Gemma4 && !l.sliding;
        l.head_dim = if full4 { 256 } else { 128 };
        l.intermediate = 384;
        l.rope.dim_base = l.head_dim;
        l.rope.rotary_pairs = if full4 {
            l.head_dim / 8
        } else {
            l.head_dim / 2
        };
    }
    if arch == Arch::Gemma3 {
        s.attn_scale = (128f32).powf(-0.5);
    }
    if let Some(p) = s.ple.as_mut() {
        p.dim = 128;
        p.vocab = s.vocab;
    }
    s
}

/// Gemma 4 E4B text decoder shapes (GEMMA4.md §1).
pub fn e4b_spec() -> ModelSpec {
    let n = 42;
    let first_shared = 24;
    let sliding = |i: usize| i % 6 != 5;
    let layers = (0..n)
        .map(|i| {
            let s = sliding(i);
            let hd = if s { 256 } else { 512 };
            let kv_source = if i < first_shared {
                i
            } else if s {
                22
            } else {
                23
            };
            LayerSpec {
                sliding: s,
                head_dim: hd,
                n_heads: 8,
                n_kv_heads: 2,
                intermediate: 10240,
                rope: RopeSpec {
                    theta: if s { 10_000.0 } else { 1_000_000.0 },
                    dim_base: hd,
                    rotary_pairs: if s { 128 } else { 64 },
                    linear_factor: 1.0,
                },
                kv_source,
            }
        })
        .collect();
    ModelSpec {
        arch: Arch::Gemma4,
        hidden: 2560,
        vocab: 262_144,
        layers,
        rms_eps: 1e-6,
        sliding_window: 512,
        embed_scale: bf16::from_f32(2560f32.sqrt()).to_f32(),
        attn_scale: 1.0,
        attn_softcap: None,
        final_softcap: Some(30.0),
        v_norm: true,
        layer_scalar: true,
        ple: Some(PleSpec {
            dim: 256,
            vocab: 262_144,
        }),
        tie_embeddings: true,
        max_context: 131_072,
        bos_token_id: 2,
        eos_token_ids: vec![1, 106],
    }
}

/// The real Gemma 3 270M's shapes (the main job's model; a test holds this to the spec read
/// from its GGUF): its decode speed measured where the 253-MB file is not at hand.
pub fn gemma3_270m_spec() -> ModelSpec {
    let layers = (0..18)
        .map(|i| {
            let s = i % 6 != 5;
            LayerSpec {
                sliding: s,
                head_dim: 256,
                n_heads: 4,
                n_kv_heads: 1,
                intermediate: 2048,
                rope: RopeSpec {
                    theta: if s { 10_000.0 } else { 1_000_000.0 },
                    dim_base: 256,
                    rotary_pairs: 128,
                    linear_factor: 1.0,
                },
                kv_source: i,
            }
        })
        .collect();
    ModelSpec {
        arch: Arch::Gemma3,
        hidden: 640,
        vocab: 262_144,
        layers,
        rms_eps: 1e-6,
        sliding_window: 512,
        embed_scale: 640f32.sqrt(),
        attn_scale: 256f32.powf(-0.5),
        attn_softcap: None,
        final_softcap: None,
        v_norm: false,
        layer_scalar: false,
        ple: None,
        tie_embeddings: true,
        max_context: 32_768,
        bos_token_id: 2,
        eos_token_ids: vec![1, 106],
    }
}

/// The names `spec_by_name` knows.
pub const SPEC_NAMES: &[&str] = &["e4b", "gemma3-270m", "small", "small-gemma3"];

/// Spec by name: `e4b`, `gemma3-270m`, `small` (Gemma 4 toy; also `small-gemma4`) or
/// `small-gemma3`.
pub fn spec_by_name(name: &str) -> Option<ModelSpec> {
    match name {
        "e4b" => Some(e4b_spec()),
        "gemma3-270m" => Some(gemma3_270m_spec()),
        "small" | "small-gemma4" => Some(small_spec(Arch::Gemma4)),
        "small-gemma3" => Some(small_spec(Arch::Gemma3)),
        _ => None,
    }
}

fn seed_of(base: u64, tag: u64) -> u64 {
    let mut r = SplitMix::new(base ^ tag.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    r.next_u64()
}

/// Uniform[-a, a] values as bf16, generated in parallel chunks with independent seeds.
fn bf16_uniform(n: usize, a: f32, seed: u64) -> Vec<u16> {
    const CH: usize = 1 << 16;
    let mut v = vec![0u16; n];
    v.par_chunks_mut(CH).enumerate().for_each(|(i, c)| {
        let mut r = SplitMix::new(seed_of(seed, i as u64));
        for x in c.iter_mut() {
            *x = bf16::from_f32(r.uniform() * a).to_bits();
        }
    });
    v
}

struct Gen {
    seed: u64,
    tag: u64,
}

impl Gen {
    fn next_seed(&mut self) -> u64 {
        self.tag += 1;
        seed_of(self.seed, self.tag)
    }
    fn mat(&mut self, rows: usize, cols: usize) -> Matrix {
        let a = (3.0 / cols as f32).sqrt();
        let s = self.next_seed();
        Matrix::from_bf16_bits(rows, cols, bf16_uniform(rows * cols, a, s))
    }
    fn scaled(&mut self, rows: usize, cols: usize, a: f32) -> Matrix {
        let s = self.next_seed();
        Matrix::from_bf16_bits(rows, cols, bf16_uniform(rows * cols, a, s))
    }
    fn norm(&mut self, n: usize) -> Vec<f32> {
        let mut r = SplitMix::new(self.next_seed());
        (0..n).map(|_| 1.0 + 0.2 * r.uniform()).collect()
    }
}

/// `m` with its output head (the tied embedding) replaced by values an int8 head holds exactly:
/// every block of 32 a row is q x d with integer q in [-127, 127] (one 127 a block, so the block's
/// scale is d) and d an f16 value, as a GGUF's Q8_0 stores them. With it, `LmHead::Int8` takes
/// the head (`quant::int8_exact`), so the int8 head's GPU paths can be checked on small models.
pub fn with_exact_int8_head(mut m: Model, seed: u64) -> Model {
    let (rows, cols) = (m.spec.vocab, m.spec.hidden);
    let mut r = SplitMix::new(seed);
    let mut v = vec![0.0f32; rows * cols];
    for (b, block) in v.chunks_mut(32).enumerate() {
        let d = half::f16::from_f32(0.002 + 0.004 * r.uniform().abs()).to_f32();
        for (i, x) in block.iter_mut().enumerate() {
            let q = if i == b % 32 {
                127.0
            } else {
                (r.uniform() * 127.0).round()
            };
            *x = q * d;
        }
    }
    m.weights.embed = Matrix::from_f32(rows, cols, v);
    m.weights.lm_head = None;
    m
}

/// The int8 output head's parity cases, as (what, model, options): small Gemma 4 and Gemma 3
/// models with an exact int8 head (bf16 weights otherwise; a vocabulary of 1,024, whole 16-row
/// cells for the streamed step), each through the launch plan (`gemv_q8`) and the streamed step
/// (int8 cells, graph and eager) with `LmHead::Int8`. Shared by the GPU test
/// `lm_head_int8_matches_cpu` and `gpu_check lm-head-int8`.
pub fn int8_head_cases() -> Vec<(String, std::sync::Arc<Model>, crate::CudaOptions)> {
    use crate::{CudaOptions, LmHead, Quant, StreamedStep};
    let mut out = Vec::new();
    for (arch, seed) in [(Arch::Gemma4, 21), (Arch::Gemma3, 22)] {
        let mut spec = small_spec(arch);
        spec.vocab = 1024;
        let m = std::sync::Arc::new(with_exact_int8_head(
            hayai_model::random::random_model(&spec, seed),
            seed,
        ));
        for (streamed_step, use_graph, form) in [
            (StreamedStep::Off, true, "launch plan"),
            (StreamedStep::On, true, "streamed, graph"),
            (StreamedStep::On, false, "streamed, eager"),
        ] {
            let o = CudaOptions {
                quant: Quant::Bf16,
                lm_head: LmHead::Int8,
                streamed_step,
                use_graph,
                ..Default::default()
            };
            out.push((format!("{arch:?}, {form}"), m.clone(), o));
        }
    }
    out
}

/// Random bf16 weights for `spec` (any size; parallel).
pub fn random_model_bf16(spec: &ModelSpec, seed: u64) -> Model {
    let mut g = Gen { seed, tag: 0 };
    let h = spec.hidden;
    let layers = spec
        .layers
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let own = l.owns_kv(i);
            let attn_norm = g.norm(h);
            let q = g.mat(l.q_dim(), h);
            let k = own.then(|| g.mat(l.kv_dim(), h));
            let v = own.then(|| g.mat(l.kv_dim(), h));
            let q_norm = g.norm(l.head_dim);
            let k_norm = own.then(|| g.norm(l.head_dim));
            let o = g.mat(h, l.q_dim());
            let post_attn_norm = g.norm(h);
            let pre_ffn_norm = g.norm(h);
            let gate = g.mat(l.intermediate, h);
            let up = g.mat(l.intermediate, h);
            let down = g.mat(h, l.intermediate);
            let post_ffn_norm = g.norm(h);
            let ple = spec.ple.as_ref().map(|p| LayerPle {
                gate: g.mat(p.dim, h),
                proj: g.mat(h, p.dim),
                post_norm: g.norm(h),
            });
            let layer_scalar = if spec.layer_scalar {
                let mut r = SplitMix::new(g.next_seed());
                0.8 + 0.4 * (r.uniform() * 0.5 + 0.5)
            } else {
                1.0
            };
            LayerWeights {
                attn_norm,
                q,
                k,
                v,
                q_norm,
                k_norm,
                o,
                post_attn_norm,
                pre_ffn_norm,
                gate,
                up,
                down,
                post_ffn_norm,
                ple,
                layer_scalar,
            }
        })
        .collect();
    let embed = g.scaled(spec.vocab, h, 3f32.sqrt() / spec.embed_scale);
    let ple = spec.ple.as_ref().map(|p| {
        let width = spec.n_layers() * p.dim;
        GlobalPle {
            table: g.scaled(p.vocab, width, 3f32.sqrt() / (p.dim as f32).sqrt()),
            model_proj: g.mat(width, h),
            proj_norm: g.norm(p.dim),
        }
    });
    let final_norm = g.norm(h);
    Model {
        spec: spec.clone(),
        weights: ModelWeights {
            embed,
            lm_head: None,
            final_norm,
            ple,
            layers,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_validate() {
        for name in ["e4b", "small", "small-gemma3"] {
            spec_by_name(name).unwrap().validate().unwrap();
        }
        let e = e4b_spec();
        assert_eq!(e.layers[24].kv_source, 22);
        assert_eq!(e.layers[41].kv_source, 23);
        assert_eq!(e.kv_layers().count(), 24);
        assert_eq!(e.embed_scale, 50.5);
    }

    #[test]
    fn random_model_is_deterministic_and_bounded() {
        let s = small_spec(Arch::Gemma4);
        let a = random_model_bf16(&s, 5);
        let b = random_model_bf16(&s, 5);
        assert_eq!(
            a.weights.layers[1].q.to_f32(),
            b.weights.layers[1].q.to_f32()
        );
        let lim = (3.0f32 / 256.0).sqrt() * 1.01;
        assert!(a.weights.layers[0]
            .q
            .to_f32()
            .iter()
            .all(|v| v.abs() <= lim));
    }

    /// The exact int8 head is what `int8_exact` takes, value for value, and the rest of the model
    /// is unchanged; a model's own random head is not exact.
    #[test]
    fn an_exact_int8_head_is_taken_as_int8() {
        for arch in [Arch::Gemma4, Arch::Gemma3] {
            let mut spec = small_spec(arch);
            spec.vocab = 1024;
            if let Some(p) = spec.ple.as_mut() {
                p.vocab = 1024;
            }
            let base = random_model_bf16(&spec, 3);
            assert!(crate::quant::int8_exact(base.weights.lm_head()).is_none());
            let m = with_exact_int8_head(random_model_bf16(&spec, 3), 9);
            let head = m.weights.lm_head();
            let q = crate::quant::int8_exact(head).expect("exact int8 blocks");
            assert_eq!(q.dequantize().to_f32(), head.to_f32());
            assert!(m.weights.lm_head.is_none(), "tied");
            assert_eq!(
                m.weights.layers[0].q.to_f32(),
                base.weights.layers[0].q.to_f32()
            );
        }
    }
}
