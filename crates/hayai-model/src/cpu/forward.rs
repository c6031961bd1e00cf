//! The reference forward pass of a Gemma text decoder (Gemma 3 and Gemma 4) on the CPU.
//!
//! Straightforward f32 code organised exactly like the model (GEMMA4.md §3): token batches are
//! processed layer by layer, K/V appended to per-layer caches, then the final norm and head.

use std::borrow::Cow;
use std::sync::Arc;

use rayon::prelude::*;

use super::ops::{attend, gelu_tanh, rms_norm_rows, rope, softcap};
use crate::runner::{Rows, Runner, RunnerInfo};
use crate::weights::Model;
use crate::ModelError;
use half::bf16;

/// Tokens processed together in one pass through the layers (bounds activation memory).
const CHUNK: usize = 128;

/// K/V of one cache-owning layer, `[pos][kv_head][head_dim]`, full length (the reference keeps
/// every position; sliding layers mask by window instead of using a ring).
#[derive(Clone, Debug, Default)]
struct KvCache {
    k: Vec<f32>,
    v: Vec<f32>,
}

pub struct CpuRunner {
    model: Arc<Model>,
    info: RunnerInfo,
    kv: Vec<Option<KvCache>>,
    len: usize,
    inv_freq: Vec<Vec<f32>>,
    /// Final-normed hidden states of the tokens fed by the last `forward` call.
    hidden: Vec<f32>,
    /// How the input of every matrix product is rounded (see [`MatmulInputs`]).
    inputs: MatmulInputs,
}

/// Rounding of matrix-product inputs: the CPU twins of the GPU prefill's tensor-core GEMMs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MatmulInputs {
    /// f32 as computed (the reference).
    #[default]
    F32,
    /// Rounded to bf16, nearest even (the GPU's default batched prefill).
    Bf16,
    /// bf16(v) + bf16(v - bf16(v)): the GPU's precise prefill, which multiplies both parts.
    Bf16Pair,
    /// int8 with one scale per `group` consecutive columns of a row (symmetric, scale =
    /// max |x| / 127, round to nearest): what the GPU's int8-activation GEMVs multiply
    /// (`--int8-activations`: DP4A or the integer tensor cores), and the twin they are checked
    /// against.
    Int8 { group: usize },
    /// As `Int8`, with every input first moved one unit in the last place, up or down by a hash
    /// of its index and `seed` (one pattern of nudges per seed): how far last-bit differences
    /// before the rounding (a GPU's summation order) move the model through int8 rounding flips.
    /// For checks only.
    Int8Nudged { group: usize, seed: u64 },
}

impl MatmulInputs {
    fn apply(self, v: f32) -> f32 {
        let hi = bf16::from_f32(v).to_f32();
        match self {
            MatmulInputs::F32 | MatmulInputs::Int8 { .. } | MatmulInputs::Int8Nudged { .. } => v,
            MatmulInputs::Bf16 => hi,
            MatmulInputs::Bf16Pair => hi + bf16::from_f32(v - hi).to_f32(),
        }
    }
}

/// One group of int8-quantized values, dequantized in place.
fn int8_group(g: &mut [f32]) {
    let m = g.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    if m == 0.0 || !m.is_finite() {
        return;
    }
    let scale = m / 127.0;
    let inv = 127.0 / m;
    for v in g {
        *v = (*v * inv).round().clamp(-127.0, 127.0) * scale;
    }
}

/// Rows of `cols` values, each `group` of a row int8-quantized and dequantized in place.
fn int8_rows(mut xs: Vec<f32>, cols: usize, group: usize) -> Vec<f32> {
    xs.par_chunks_mut(cols.max(1)).for_each(|row| {
        row.chunks_mut(group.max(1)).for_each(int8_group);
    });
    xs
}

/// `v` moved one unit in the last place, away from or towards zero by a hash of `i` and `seed`
/// (zero and non-finite values unchanged).
pub fn nudge(v: f32, i: usize, seed: u64) -> f32 {
    if v == 0.0 || !v.is_finite() {
        return v;
    }
    let h = ((i as u64) ^ seed.wrapping_mul(0xD6E8_FEB8_6659_FD93))
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        >> 63;
    f32::from_bits(if h == 1 {
        v.to_bits() + 1
    } else {
        v.to_bits() - 1
    })
}

/// `xs` (rows of `cols` values) rounded as `inputs` says (borrowed unchanged for f32), for one
/// or more products.
fn rounded(xs: &[f32], cols: usize, inputs: MatmulInputs) -> Cow<'_, [f32]> {
    match inputs {
        MatmulInputs::F32 => Cow::Borrowed(xs),
        MatmulInputs::Int8 { group } => Cow::Owned(int8_rows(xs.to_vec(), cols, group)),
        MatmulInputs::Int8Nudged { group, seed } => {
            let nudged = xs
                .iter()
                .enumerate()
                .map(|(i, &v)| nudge(v, i, seed))
                .collect();
            Cow::Owned(int8_rows(nudged, cols, group))
        }
        _ => Cow::Owned(xs.par_iter().map(|&v| inputs.apply(v)).collect()),
    }
}

impl CpuRunner {
    pub fn new(model: Arc<Model>) -> Result<Self, ModelError> {
        let spec = &model.spec;
        spec.validate().map_err(ModelError::Config)?;
        let kv = (0..spec.n_layers())
            .map(|i| spec.layers[i].owns_kv(i).then(KvCache::default))
            .collect();
        let inv_freq = spec
            .layers
            .iter()
            .map(|l| l.rope.inv_freq(l.head_dim))
            .collect();
        let info = RunnerInfo {
            vocab_size: spec.vocab,
            max_context: spec.max_context,
            eos_token_ids: spec.eos_token_ids.clone(),
            backend: "cpu".into(),
        };
        Ok(CpuRunner {
            model,
            info,
            kv,
            len: 0,
            inv_freq,
            hidden: Vec::new(),
            inputs: MatmulInputs::F32,
        })
    }

    /// Round the input of every matrix product before multiplying ([`MatmulInputs`]): with the
    /// weights as the GPU holds them, this makes the reference the CPU twin of a GPU prefill
    /// whose GEMMs take bf16 activations on tensor cores. The default is the plain f32 reference.
    pub fn set_matmul_inputs(&mut self, inputs: MatmulInputs) {
        self.inputs = inputs;
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// K and V of cache-owning `layer` for positions `0..len()`, `[pos][kv_head][head_dim]`.
    /// `None` for layers that read a donor's cache.
    pub fn kv_cache(&self, layer: usize) -> Option<(&[f32], &[f32])> {
        self.kv[layer].as_ref().map(|c| (&c.k[..], &c.v[..]))
    }

    /// Final-normed hidden states (`n × hidden`) of the tokens fed by the last `forward` call:
    /// what the MTP assistant consumes.
    pub fn hidden_states(&self) -> &[f32] {
        &self.hidden
    }

    /// Scaled token embeddings of `tokens` (`n × hidden`).
    pub fn embed(&self, tokens: &[u32]) -> Vec<f32> {
        let spec = &self.model.spec;
        let h = spec.hidden;
        let mut x = vec![0.0f32; tokens.len() * h];
        for (t, &tok) in tokens.iter().enumerate() {
            let row = &mut x[t * h..(t + 1) * h];
            self.model.weights.embed.row_into(tok as usize, row);
            row.iter_mut().for_each(|v| *v *= spec.embed_scale);
        }
        x
    }

    /// Per-layer inputs (GEMMA4.md §3.2): `n × n_layers × ple_dim`.
    pub fn per_layer_inputs(&self, tokens: &[u32], x0: &[f32]) -> Option<Vec<f32>> {
        let spec = &self.model.spec;
        let (ps, pw) = (spec.ple.as_ref()?, self.model.weights.ple.as_ref()?);
        let (n, nl, d) = (tokens.len(), spec.n_layers(), ps.dim);
        let width = nl * d;
        let mut ctx = vec![0.0f32; n * width];
        pw.model_proj
            .matmul(&rounded(x0, pw.model_proj.cols, self.inputs), &mut ctx);
        let proj_scale = (spec.hidden as f32).powf(-0.5);
        ctx.iter_mut().for_each(|v| *v *= proj_scale);
        rms_norm_rows(&mut ctx, d, Some(&pw.proj_norm), spec.rms_eps);
        let tok_scale = (d as f32).sqrt();
        let mix = std::f32::consts::FRAC_1_SQRT_2;
        let mut row = vec![0.0f32; width];
        for (t, &tok) in tokens.iter().enumerate() {
            pw.table.row_into(tok as usize, &mut row);
            for (c, &e) in ctx[t * width..(t + 1) * width].iter_mut().zip(&row) {
                *c = (*c + e * tok_scale) * mix;
            }
        }
        Some(ctx)
    }

    /// Run one chunk through all layers; returns final-normed hidden states `n × hidden`.
    fn run_chunk(&mut self, tokens: &[u32]) -> Vec<f32> {
        let model = Arc::clone(&self.model);
        let (spec, w) = (&model.spec, &model.weights);
        let (n, h, eps) = (tokens.len(), spec.hidden, spec.rms_eps);
        let pos0 = self.len;
        let mut x = self.embed(tokens);
        let ple = self.per_layer_inputs(tokens, &x);

        let round = self.inputs;
        let mut a = vec![0.0f32; n * h];
        for (li, (ls, lw)) in spec.layers.iter().zip(&w.layers).enumerate() {
            let (hd, nh, nkv) = (ls.head_dim, ls.n_heads, ls.n_kv_heads);
            // Attention block.
            a.copy_from_slice(&x);
            rms_norm_rows(&mut a, h, Some(&lw.attn_norm), eps);
            let mut q = vec![0.0f32; n * nh * hd];
            // One rounded copy of the normed input serves q, k and v.
            let ar = rounded(&a, h, round);
            lw.q.matmul(&ar, &mut q);
            rms_norm_rows(&mut q, hd, Some(&lw.q_norm), eps);
            let inv_freq = &self.inv_freq[li];
            for (t, qt) in q.chunks_exact_mut(nh * hd).enumerate() {
                for head in qt.chunks_exact_mut(hd) {
                    rope(head, pos0 + t, inv_freq);
                }
            }
            if ls.owns_kv(li) {
                let (wk, wv) = (lw.k.as_ref().unwrap(), lw.v.as_ref().unwrap());
                let mut k = vec![0.0f32; n * nkv * hd];
                let mut v = vec![0.0f32; n * nkv * hd];
                wk.matmul(&ar, &mut k);
                wv.matmul(&ar, &mut v);
                rms_norm_rows(&mut k, hd, lw.k_norm.as_deref(), eps);
                if spec.v_norm {
                    rms_norm_rows(&mut v, hd, None, eps);
                }
                for (t, kt) in k.chunks_exact_mut(nkv * hd).enumerate() {
                    for head in kt.chunks_exact_mut(hd) {
                        rope(head, pos0 + t, inv_freq);
                    }
                }
                let cache = self.kv[li].as_mut().unwrap();
                cache.k.truncate(pos0 * nkv * hd);
                cache.v.truncate(pos0 * nkv * hd);
                cache.k.extend_from_slice(&k);
                cache.v.extend_from_slice(&v);
            }
            let cache = self.kv[ls.kv_source].as_ref().unwrap();
            let group = nh / nkv;
            let window = spec.sliding_window;
            let mut attn = vec![0.0f32; n * nh * hd];
            attn.par_chunks_mut(hd).enumerate().for_each(|(idx, out)| {
                let (t, head) = (idx / nh, idx % nh);
                let p = pos0 + t;
                let start = if ls.sliding {
                    (p + 1).saturating_sub(window)
                } else {
                    0
                };
                let qh = &q[idx * hd..(idx + 1) * hd];
                attend(
                    qh,
                    &cache.k,
                    &cache.v,
                    nkv,
                    head / group,
                    start..p + 1,
                    spec.attn_scale,
                    spec.attn_softcap,
                    out,
                );
            });
            let mut o = vec![0.0f32; n * h];
            lw.o.matmul(&rounded(&attn, lw.o.cols, round), &mut o);
            rms_norm_rows(&mut o, h, Some(&lw.post_attn_norm), eps);
            x.iter_mut().zip(&o).for_each(|(xv, ov)| *xv += ov);

            // Feed-forward block (GeGLU).
            a.copy_from_slice(&x);
            rms_norm_rows(&mut a, h, Some(&lw.pre_ffn_norm), eps);
            let im = ls.intermediate;
            let mut g = vec![0.0f32; n * im];
            let mut u = vec![0.0f32; n * im];
            let ar = rounded(&a, h, round);
            lw.gate.matmul(&ar, &mut g);
            lw.up.matmul(&ar, &mut u);
            g.par_iter_mut()
                .zip(&u)
                .for_each(|(gv, uv)| *gv = gelu_tanh(*gv) * uv);
            let mut d = vec![0.0f32; n * h];
            lw.down.matmul(&rounded(&g, im, round), &mut d);
            rms_norm_rows(&mut d, h, Some(&lw.post_ffn_norm), eps);
            x.iter_mut().zip(&d).for_each(|(xv, dv)| *xv += dv);

            // Per-layer input (Gemma 4).
            if let (Some(lp), Some(ple), Some(ps)) = (&lw.ple, &ple, &spec.ple) {
                let pd = ps.dim;
                let width = spec.n_layers() * pd;
                let mut gg = vec![0.0f32; n * pd];
                lp.gate.matmul(&rounded(&x, h, round), &mut gg);
                for t in 0..n {
                    let pin = &ple[t * width + li * pd..t * width + (li + 1) * pd];
                    for (gv, &pv) in gg[t * pd..(t + 1) * pd].iter_mut().zip(pin) {
                        *gv = gelu_tanh(*gv) * pv;
                    }
                }
                let mut pr = vec![0.0f32; n * h];
                lp.proj.matmul(&rounded(&gg, pd, round), &mut pr);
                rms_norm_rows(&mut pr, h, Some(&lp.post_norm), eps);
                x.iter_mut().zip(&pr).for_each(|(xv, pv)| *xv += pv);
            }
            if lw.layer_scalar != 1.0 {
                x.iter_mut().for_each(|v| *v *= lw.layer_scalar);
            }
        }
        rms_norm_rows(&mut x, h, Some(&w.final_norm), eps);
        self.len = pos0 + n;
        x
    }

    /// Logits of hidden rows `hs` (`m × hidden`) into `out` (`m × vocab`), softcapped.
    fn logits(&self, hs: &[f32], out: &mut [f32]) {
        let spec = &self.model.spec;
        self.model
            .weights
            .lm_head()
            .matmul(&rounded(hs, spec.hidden, self.inputs), out);
        if let Some(c) = spec.final_softcap {
            out.par_iter_mut().for_each(|v| *v = softcap(*v, c));
        }
    }
}

impl Runner for CpuRunner {
    fn info(&self) -> &RunnerInfo {
        &self.info
    }

    fn len(&self) -> usize {
        self.len
    }

    fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
        let spec = &self.model.spec;
        for (i, c) in self.kv.iter_mut().enumerate() {
            if let Some(c) = c {
                let w = spec.layers[i].kv_dim();
                c.k.truncate(self.len * w);
                c.v.truncate(self.len * w);
            }
        }
    }

    fn forward(
        &mut self,
        tokens: &[u32],
        rows: Rows,
        sink: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<(), ModelError> {
        if tokens.is_empty() {
            return Ok(());
        }
        crate::runner::check_feed(&self.info, self.len, tokens)?;
        let (h, vocab) = (self.model.spec.hidden, self.model.spec.vocab);
        let mut all_hidden = Vec::with_capacity(tokens.len() * h);
        let mut logits = Vec::new();
        for (ci, chunk) in tokens.chunks(CHUNK).enumerate() {
            let hs = self.run_chunk(chunk);
            let base = ci * CHUNK;
            match rows {
                Rows::All => {
                    logits.resize(chunk.len() * vocab, 0.0);
                    self.logits(&hs, &mut logits);
                    for (t, row) in logits.chunks_exact(vocab).enumerate() {
                        sink(base + t, row);
                    }
                }
                Rows::Last if base + chunk.len() == tokens.len() => {
                    logits.resize(vocab, 0.0);
                    self.logits(&hs[(chunk.len() - 1) * h..], &mut logits);
                    sink(tokens.len() - 1, &logits);
                }
                Rows::Last => {}
            }
            all_hidden.extend_from_slice(&hs);
        }
        self.hidden = all_hidden;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int8_inputs_round_each_group_of_each_row_to_its_own_scale() {
        // Two rows of 6 columns, groups of 4: row groups are [0..4), [4..6) per row.
        let xs = vec![
            1.0, -0.5, 0.25, 0.1, 100.0, 0.3, //
            0.0, 0.0, 0.0, 0.0, -2.0, 1.0,
        ];
        let r = rounded(&xs, 6, MatmulInputs::Int8 { group: 4 });
        // Each value within half a step of its group's scale (max |x| / 127).
        let scales = [1.0 / 127.0, 100.0 / 127.0, 0.0, 2.0 / 127.0];
        for (i, (&a, &b)) in xs.iter().zip(r.iter()).enumerate() {
            let (row, col) = (i / 6, i % 6);
            let s = scales[row * 2 + col / 4];
            assert!((a - b).abs() <= s * 0.5 + 1e-7, "{i}: {a} -> {b}");
        }
        // The largest value of a group comes back to f32 rounding; an all-zero group stays zero.
        assert!((r[0] - 1.0).abs() <= 1e-6);
        assert!((r[4] - 100.0).abs() <= 1e-4);
        assert!(r[6..10].iter().all(|&v| v == 0.0));
        // 0.3 next to 100 in a group of two: quantized to 0 (step 0.79).
        assert_eq!(r[5], 0.0);
        // F32 borrows unchanged.
        assert!(matches!(
            rounded(&xs, 6, MatmulInputs::F32),
            Cow::Borrowed(_)
        ));
    }

    #[test]
    fn nudged_int8_moves_inputs_one_ulp_before_rounding() {
        let xs: Vec<f32> = (0..64).map(|i| (i as f32 - 20.0) * 0.37).collect();
        let mut up = 0;
        for (i, &v) in xs.iter().enumerate() {
            let n = nudge(v, i, 0);
            if v == 0.0 {
                assert_eq!(n, 0.0);
                continue;
            }
            let d = n.to_bits() as i64 - v.to_bits() as i64;
            assert_eq!(d.abs(), 1, "{i}: {v} -> {n}");
            up += (n.abs() > v.abs()) as usize;
        }
        assert!(up > 10 && up < 53, "both directions occur: {up} of 63 up");
        // Another seed is another pattern: each input still one ulp away, other directions.
        let differ = xs
            .iter()
            .enumerate()
            .filter(|&(i, &v)| v != 0.0 && nudge(v, i, 1) != nudge(v, i, 0))
            .count();
        assert!(
            differ > 10 && differ < 53,
            "{differ} of 63 directions differ"
        );
        assert!(xs
            .iter()
            .enumerate()
            .all(|(i, &v)| (nudge(v, i, 7).to_bits() as i64 - v.to_bits() as i64).abs() <= 1));
        // Exactly at a rounding boundary (x * 127 / max = 0.5), the nudge decides the rounding:
        // index 0 moves down, so 0.5 rounds to 0 instead of 1; elsewhere the two agree (to the
        // ulp by which the group's scale moves too).
        assert!(nudge(0.5, 0, 0) < 0.5);
        let xs = [0.5f32, 127.0, 3.0, 4.0];
        let a = rounded(&xs, 4, MatmulInputs::Int8 { group: 4 });
        let b = rounded(&xs, 4, MatmulInputs::Int8Nudged { group: 4, seed: 0 });
        assert_eq!((a[0], b[0]), (1.0, 0.0));
        for i in 1..4 {
            assert!(
                (a[i] - b[i]).abs() <= 1e-6 * a[i].abs(),
                "{i}: {} vs {}",
                a[i],
                b[i]
            );
        }
    }
}
