//! In-memory random models for tests and kernel checks (no files involved). Magnitudes are
//! chosen so activations stay O(1): projections scaled by 1/sqrt(fan_in), norms near 1.

use crate::spec::{Arch, LayerSpec, ModelSpec, PleSpec, RopeSpec};
use crate::weights::{GlobalPle, LayerPle, LayerWeights, Matrix, Model, ModelWeights};

/// Small deterministic generator (splitmix64) so tests need no extra crates.
pub struct SplitMix(u64);

impl SplitMix {
    pub fn new(seed: u64) -> Self {
        SplitMix(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

fn mat(rng: &mut SplitMix, rows: usize, cols: usize) -> Matrix {
    // Uniform[-a, a] has variance a^2/3; a = sqrt(3/cols) gives unit-variance outputs.
    let a = (3.0 / cols as f32).sqrt();
    Matrix::from_f32(
        rows,
        cols,
        (0..rows * cols).map(|_| rng.uniform() * a).collect(),
    )
}

fn norm(rng: &mut SplitMix, n: usize) -> Vec<f32> {
    (0..n).map(|_| 1.0 + 0.2 * rng.uniform()).collect()
}

/// A spec exercising every Gemma 4 feature at toy size (or a Gemma 3 shape when `arch` says).
pub fn tiny_spec(arch: Arch) -> ModelSpec {
    let gemma4 = arch == Arch::Gemma4;
    let n_layers = 6;
    let first_shared = if gemma4 { 4 } else { n_layers };
    let sliding = |i: usize| i % 3 != 2;
    let layers = (0..n_layers)
        .map(|i| {
            let s = sliding(i);
            let head_dim = if gemma4 && !s { 32 } else { 16 };
            let kv_source = if i < first_shared {
                i
            } else {
                (0..first_shared).rev().find(|&j| sliding(j) == s).unwrap()
            };
            LayerSpec {
                sliding: s,
                head_dim,
                n_heads: 4,
                n_kv_heads: 2,
                intermediate: 96,
                rope: RopeSpec {
                    theta: if s { 10_000.0 } else { 1_000_000.0 },
                    dim_base: head_dim,
                    rotary_pairs: if gemma4 && !s {
                        head_dim / 8
                    } else {
                        head_dim / 2
                    },
                    linear_factor: 1.0,
                },
                kv_source,
            }
        })
        .collect();
    ModelSpec {
        arch,
        hidden: 64,
        vocab: 300,
        layers,
        rms_eps: 1e-6,
        sliding_window: 8,
        embed_scale: 8.0,
        attn_scale: if gemma4 { 1.0 } else { 0.25 },
        attn_softcap: None,
        final_softcap: if gemma4 { Some(30.0) } else { None },
        v_norm: gemma4,
        layer_scalar: gemma4,
        ple: gemma4.then_some(PleSpec { dim: 8, vocab: 300 }),
        tie_embeddings: true,
        max_context: 4096,
        bos_token_id: 2,
        eos_token_ids: vec![1],
    }
}

/// Random weights for `spec`.
pub fn random_model(spec: &ModelSpec, seed: u64) -> Model {
    let mut rng = SplitMix::new(seed);
    let h = spec.hidden;
    let layers = spec
        .layers
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let own = l.owns_kv(i);
            LayerWeights {
                attn_norm: norm(&mut rng, h),
                q: mat(&mut rng, l.q_dim(), h),
                k: own.then(|| mat(&mut rng, l.kv_dim(), h)),
                v: own.then(|| mat(&mut rng, l.kv_dim(), h)),
                q_norm: norm(&mut rng, l.head_dim),
                k_norm: own.then(|| norm(&mut rng, l.head_dim)),
                o: mat(&mut rng, h, l.q_dim()),
                post_attn_norm: norm(&mut rng, h),
                pre_ffn_norm: norm(&mut rng, h),
                gate: mat(&mut rng, l.intermediate, h),
                up: mat(&mut rng, l.intermediate, h),
                down: mat(&mut rng, h, l.intermediate),
                post_ffn_norm: norm(&mut rng, h),
                ple: spec.ple.as_ref().map(|p| LayerPle {
                    gate: mat(&mut rng, p.dim, h),
                    proj: mat(&mut rng, h, p.dim),
                    post_norm: norm(&mut rng, h),
                }),
                layer_scalar: if spec.layer_scalar {
                    0.8 + 0.4 * (rng.uniform() * 0.5 + 0.5)
                } else {
                    1.0
                },
            }
        })
        .collect();
    // Embedding entries of variance 1/embed_scale^2, so scaled embeddings have unit variance.
    let a = 3f32.sqrt() / spec.embed_scale;
    let embed = Matrix::from_f32(
        spec.vocab,
        h,
        (0..spec.vocab * h).map(|_| rng.uniform() * a).collect(),
    );
    let ple = spec.ple.as_ref().map(|p| {
        let width = spec.n_layers() * p.dim;
        GlobalPle {
            table: mat(&mut rng, p.vocab, width),
            model_proj: mat(&mut rng, width, h),
            proj_norm: norm(&mut rng, p.dim),
        }
    });
    Model {
        spec: spec.clone(),
        weights: ModelWeights {
            embed,
            lm_head: None,
            final_norm: norm(&mut rng, h),
            ple,
            layers,
        },
    }
}
