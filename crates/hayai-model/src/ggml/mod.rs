//! A Gemma 3 forward on a GGUF file's own quantized tensors that reproduces llama.cpp's CPU
//! backend bit for bit (the version vendored by llama-cpp-python 0.3.36, x86-64 with AVX-512,
//! flash attention off — how the reference outputs in data/reference were made).
//!
//! The f32 reference ([`crate::cpu`]) is the model; this is one engine's arithmetic: activations
//! quantized to 8 bits the way ggml quantizes them for each weight type, ggml's summation order
//! in every dot product (which differs between a batch of tokens and a single token), K/V, query
//! and attention probabilities rounded to f16, ggml's vectorized `exp`, the f16 GELU table, RoPE
//! angles accumulated by repeated multiplication, and the FMAs GCC contracts. It exists to
//! compare against llama.cpp token for token (greedy ids past near-ties) and to judge results
//! that claim llama.cpp's numbers. `scripts/llama_cpp_trace.cpp` dumps llama.cpp's intermediate
//! tensors; `hayai ggml-trace-compare` checks this forward against such a dump op by op.

// Index loops mirror ggml's C loops (lanes, blocks, heads) on purpose.
#![allow(clippy::needless_range_loop)]

mod attn;
mod q4k_repack;
mod q6k_tiled;
mod quant;

use std::path::Path;

use hayai_core::{GgmlType, GgufFile, GgufTensorInfo};
use rayon::prelude::*;

use crate::runner::{check_feed, Rows, Runner, RunnerInfo};
use crate::ModelError;

use quant::{f16_to_f32, f32_to_f16, Q0Kind};

/// A weight matrix as stored in the file: `rows` outputs of `cols` inputs.
struct Weight {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    offset: usize,
    len: usize,
}

struct LayerW {
    attn_norm: Vec<f32>,
    q: Weight,
    k: Weight,
    v: Weight,
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
    o: Weight,
    post_attn_norm: Vec<f32>,
    ffn_norm: Vec<f32>,
    gate: Weight,
    up: Weight,
    down: Weight,
    post_ffn_norm: Vec<f32>,
    sliding: bool,
}

/// Intermediate tensors of one forward call, by llama.cpp's node names (`attn_norm-0`, ...),
/// for [`GgmlGemma3::forward_traced`].
pub type Trace = Vec<(String, Vec<f32>)>;

pub struct GgmlGemma3 {
    file: GgufFile,
    hidden: usize,
    n_heads: usize,
    head_dim: usize,
    eps: f32,
    window: usize,
    theta_global: f32,
    theta_local: f32,
    freq_scale_global: f32,
    embd: Weight,
    output_norm: Vec<f32>,
    layers: Vec<LayerW>,
    /// Per layer: f16 K and V, `[position][head_dim]` (one KV head).
    k_cache: Vec<Vec<u16>>,
    v_cache: Vec<Vec<u16>>,
    len: usize,
    info: RunnerInfo,
}

fn weight(f: &GgufFile, name: &str) -> Result<Weight, ModelError> {
    let t: &GgufTensorInfo = f
        .tensor(name)
        .ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
    let data = f.tensor_data(t)?;
    let start = data.as_ptr() as usize - f.as_bytes().as_ptr() as usize;
    Ok(Weight {
        ty: t.ggml_type,
        rows: t.n_rows(),
        cols: t.row_len(),
        offset: start,
        len: data.len(),
    })
}

fn vector(f: &GgufFile, name: &str) -> Result<Vec<f32>, ModelError> {
    Ok(f.tensor_f32(name)?.1)
}

impl GgmlGemma3 {
    pub fn open(path: &Path) -> Result<Self, ModelError> {
        let f = GgufFile::open(path)?;
        if f.architecture() != Some("gemma3") {
            return Err(ModelError::Unsupported(format!(
                "the ggml-exact forward runs Gemma 3 GGUF files; this one is `{}`",
                f.architecture().unwrap_or("?")
            )));
        }
        let m = crate::load::gguf::gemma3_meta(&f)?;
        let (hidden, n_layers, n_heads, head_dim, eps) =
            (m.hidden, m.n_layers, m.n_heads, m.head_dim, m.eps);
        if m.n_kv != 1 {
            return Err(ModelError::Unsupported(
                "the ggml-exact forward handles one KV head (Gemma 3 270M and 1B)".into(),
            ));
        }
        let window = m.window.unwrap_or(usize::MAX);
        // llama.cpp holds these as f32.
        let (theta_global, theta_local) = (m.theta_global as f32, m.theta_local as f32);
        let freq_scale_global = 1.0f32 / m.linear as f32;
        let mut layers = Vec::with_capacity(n_layers);
        for i in 0..n_layers {
            let p = |s: &str| format!("blk.{i}.{s}.weight");
            layers.push(LayerW {
                attn_norm: vector(&f, &p("attn_norm"))?,
                q: weight(&f, &p("attn_q"))?,
                k: weight(&f, &p("attn_k"))?,
                v: weight(&f, &p("attn_v"))?,
                q_norm: vector(&f, &p("attn_q_norm"))?,
                k_norm: vector(&f, &p("attn_k_norm"))?,
                o: weight(&f, &p("attn_output"))?,
                post_attn_norm: vector(&f, &p("post_attention_norm"))?,
                ffn_norm: vector(&f, &p("ffn_norm"))?,
                gate: weight(&f, &p("ffn_gate"))?,
                up: weight(&f, &p("ffn_up"))?,
                down: weight(&f, &p("ffn_down"))?,
                post_ffn_norm: vector(&f, &p("post_ffw_norm"))?,
                // llama.cpp's Gemma 3 pattern: every sixth layer is global.
                sliding: i % 6 != 5,
            });
        }
        if f.tensor("output.weight").is_some() {
            return Err(ModelError::Unsupported(
                "the ggml-exact forward expects tied embeddings".into(),
            ));
        }
        let embd = weight(&f, "token_embd.weight")?;
        if embd.ty != GgmlType::Q8_0 {
            return Err(ModelError::Unsupported(format!(
                "token_embd of type {:?} (the ggml-exact forward handles Q8_0)",
                embd.ty
            )));
        }
        for (i, l) in layers.iter().enumerate() {
            for w in [&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down] {
                if !matches!(
                    w.ty,
                    GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::Q4_K | GgmlType::Q6_K
                ) {
                    return Err(ModelError::Unsupported(format!(
                        "layer {i}: weight type {:?} (the ggml-exact forward handles Q5_0, Q8_0, Q4_K, Q6_K)",
                        w.ty
                    )));
                }
            }
            if [&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down]
                .iter()
                .any(|w| w.ty == GgmlType::Q4_K && !w.rows.is_multiple_of(8))
            {
                return Err(ModelError::Unsupported(format!(
                    "layer {i}: a Q4_K weight whose row count is not a multiple of 8 (llama.cpp does not repack it; that path is not reproduced)"
                )));
            }
            if l.q.rows != n_heads * head_dim || l.k.rows != head_dim || l.v.rows != head_dim {
                return Err(ModelError::Config(format!(
                    "layer {i}: unexpected q/k/v shapes"
                )));
            }
        }
        let mut eos = vec![f.get_u32("tokenizer.ggml.eos_token_id").unwrap_or(1)];
        if let Some(tokens) = f.get_str_array("tokenizer.ggml.tokens") {
            if let Some(t) = tokens.iter().position(|t| *t == "<end_of_turn>") {
                if !eos.contains(&(t as u32)) {
                    eos.push(t as u32);
                }
            }
        }
        let max_context = f
            .get_u64("gemma3.context_length")
            .map(|v| v as usize)
            .unwrap_or(8192);
        let info = RunnerInfo {
            vocab_size: embd.rows,
            max_context,
            eos_token_ids: eos,
            backend: "cpu (ggml-exact)".into(),
        };
        Ok(GgmlGemma3 {
            output_norm: vector(&f, "output_norm.weight")?,
            k_cache: vec![Vec::new(); n_layers],
            v_cache: vec![Vec::new(); n_layers],
            file: f,
            hidden,
            n_heads,
            head_dim,
            eps,
            window,
            theta_global,
            theta_local,
            freq_scale_global,
            embd,
            layers,
            len: 0,
            info,
        })
    }

    fn bytes(&self, w: &Weight) -> &[u8] {
        &self.file.as_bytes()[w.offset..w.offset + w.len]
    }

    /// `ggml_mul_mat(w, x)` for `n` rows of activations: the kernel ggml picks for this weight
    /// type and batch size. Output `[n][w.rows]`.
    fn mul_mat(&self, w: &Weight, x: &[f32], n: usize) -> Vec<f32> {
        let data = self.bytes(w);
        let (rows, k) = (w.rows, w.cols);
        let mut out = vec![0f32; n * rows];
        match w.ty {
            GgmlType::Q5_0 | GgmlType::Q8_0 => {
                let kind = if w.ty == GgmlType::Q5_0 {
                    Q0Kind::Q5_0
                } else {
                    Q0Kind::Q8_0
                };
                let rb = k / quant::QK8_0 * kind.block_bytes();
                for t in 0..n {
                    let xq = quant::quantize_row_q8_0(&x[t * k..(t + 1) * k]);
                    out[t * rows..(t + 1) * rows]
                        .par_iter_mut()
                        .enumerate()
                        .for_each(|(r, o)| {
                            *o = quant::dot_q0(kind, &data[r * rb..(r + 1) * rb], &xq)
                        });
                }
            }
            // Repacked at load into 8-row interleaved blocks when the row count allows it.
            GgmlType::Q4_K if rows % 8 == 0 => {
                q4k_repack::q4k_repacked_matmul(data, rows, k, x, n, &mut out)
            }
            GgmlType::Q6_K if n >= 8 => q6k_tiled::q6k_tiled_matmul(data, rows, k, x, n, &mut out),
            GgmlType::Q6_K => {
                let rb = k / quant::QK_K * 210;
                for t in 0..n {
                    let xq = quant::quantize_row_q8_k(&x[t * k..(t + 1) * k]);
                    out[t * rows..(t + 1) * rows]
                        .par_iter_mut()
                        .enumerate()
                        .for_each(|(r, o)| *o = quant::dot_q6k(&data[r * rb..(r + 1) * rb], &xq));
                }
            }
            ty => unreachable!("weight type {ty:?} rejected at load"),
        }
        out
    }

    /// `ggml_rms_norm` fused with the weight multiply, per row of `w.len()` values: the squares
    /// summed in double, `scale = 1/sqrtf(mean + eps)` in float, `(x*scale)*w`.
    fn rms_norm(&self, x: &[f32], w: &[f32]) -> Vec<f32> {
        let n = w.len();
        let mut y = vec![0f32; x.len()];
        for (xr, yr) in x.chunks_exact(n).zip(y.chunks_exact_mut(n)) {
            let mut sum = 0f64;
            for &v in xr {
                sum += (v * v) as f64;
            }
            let mean = (sum / n as f64) as f32;
            let scale = 1.0 / (mean + self.eps).sqrt();
            for i in 0..n {
                yr[i] = xr[i] * scale * w[i];
            }
        }
        y
    }

    /// `ggml_rope_cache_init` for one position: `(cos, sin)` of each pair, the angle being the
    /// position times `theta_scale` multiplied in once per pair in f32.
    fn rope_cache(&self, pos: usize, base: f32, freq_scale: f32) -> Vec<(f32, f32)> {
        let theta_scale = base.powf(-2.0 / self.head_dim as f32);
        let mut theta = pos as f32;
        (0..self.head_dim / 2)
            .map(|_| {
                let t = freq_scale * theta;
                theta *= theta_scale;
                (t.cos(), t.sin())
            })
            .collect()
    }

    fn embed(&self, tokens: &[u32]) -> Vec<f32> {
        let h = self.hidden;
        let rb = h / 32 * 34;
        let data = self.bytes(&self.embd);
        let scale = (h as f32).sqrt();
        let mut x = vec![0f32; tokens.len() * h];
        for (t, &id) in tokens.iter().enumerate() {
            let row = &data[id as usize * rb..(id as usize + 1) * rb];
            for (b, blk) in row.chunks_exact(34).enumerate() {
                let d = f16_to_f32(u16::from_le_bytes([blk[0], blk[1]]));
                for j in 0..32 {
                    x[t * h + b * 32 + j] = (blk[2 + j] as i8) as f32 * d * scale;
                }
            }
        }
        x
    }

    /// Feed `tokens` as one llama.cpp batch; return the logits of the selected rows and, when
    /// `trace` is given, the intermediate tensors under llama.cpp's node names.
    fn run(
        &mut self,
        tokens: &[u32],
        rows: Rows,
        mut trace: Option<&mut Trace>,
    ) -> Result<Vec<f32>, ModelError> {
        check_feed(&self.info, self.len, tokens)?;
        let n = tokens.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        let (h, hd, nh) = (self.hidden, self.head_dim, self.n_heads);
        let p0 = self.len;
        let total = p0 + n;
        // llama.cpp pads the attended cells to a multiple of 256; empty cells hold zeros and are
        // masked, but they set the summation layout.
        let n_kv = total.div_ceil(256).max(1) * 256;
        macro_rules! rec {
            ($name:expr, $v:expr) => {
                if let Some(t) = trace.as_deref_mut() {
                    t.push(($name.into(), $v.to_vec()));
                }
            };
        }
        // Moved out for the call so the caches can be written while a layer is borrowed.
        let layers = std::mem::take(&mut self.layers);
        let mut x = self.embed(tokens);
        rec!("inp_scaled", &x);
        let n_layers = layers.len();
        let mut n_rows = n;
        for il in 0..n_layers {
            let l = &layers[il];
            let cur = self.rms_norm(&x, &l.attn_norm);
            rec!(format!("attn_norm-{il}"), &cur);
            let mut q = self.mul_mat(&l.q, &cur, n);
            let mut k = self.mul_mat(&l.k, &cur, n);
            let v = self.mul_mat(&l.v, &cur, n);
            rec!(format!("Vcur-{il}"), &v);
            q = self.rms_norm(&q, &l.q_norm);
            rec!(format!("Qcur_normed-{il}"), &q);
            k = self.rms_norm(&k, &l.k_norm);
            rec!(format!("Kcur_normed-{il}"), &k);
            let (base, fs) = if l.sliding {
                (self.theta_local, 1.0)
            } else {
                (self.theta_global, self.freq_scale_global)
            };
            for t in 0..n {
                let cache = self.rope_cache(p0 + t, base, fs);
                for head in q[t * nh * hd..(t + 1) * nh * hd].chunks_exact_mut(hd) {
                    rotate_pairs(head, &cache);
                }
                rotate_pairs(&mut k[t * hd..(t + 1) * hd], &cache);
            }
            rec!(format!("Qcur-{il}"), &q);
            rec!(format!("Kcur-{il}"), &k);
            let attn_scale = 1.0 / (hd as f32).sqrt();
            for v in q.iter_mut() {
                *v *= attn_scale;
            }
            // K/V into the f16 cache (`ggml_set_rows`).
            let (kc, vc) = (&mut self.k_cache[il], &mut self.v_cache[il]);
            kc.truncate(p0 * hd);
            vc.truncate(p0 * hd);
            kc.extend(k.iter().map(|&v| f32_to_f16(v)));
            vc.extend(v.iter().map(|&v| f32_to_f16(v)));
            let (kc, vc) = (&self.k_cache[il], &self.v_cache[il]);
            // V transposed with zero cells up to n_kv, as ggml's V cache is laid out.
            let mut vt = vec![0u16; hd * n_kv];
            for j in 0..total {
                for d in 0..hd {
                    vt[d * n_kv + j] = vc[j * hd + d];
                }
            }
            let window = if l.sliding { self.window } else { usize::MAX };
            // Per head: the raw scores `[t][n_kv]` and the output `[t][hd]`.
            let heads: Vec<(Vec<f32>, Vec<f32>)> = (0..nh)
                .into_par_iter()
                .map(|hh| {
                    let mut kq = vec![0f32; n * n_kv];
                    let mut out = vec![0f32; n * hd];
                    for t in 0..n {
                        let pos = p0 + t;
                        let q16: Vec<u16> = q[t * nh * hd + hh * hd..][..hd]
                            .iter()
                            .map(|&v| f32_to_f16(v))
                            .collect();
                        let s = &mut kq[t * n_kv..(t + 1) * n_kv];
                        let mut mask = vec![0f32; n_kv];
                        // Empty cells (j >= total) hold zero keys: their score is +0 in either
                        // order, and they are masked.
                        for j in 0..total {
                            let krow = &kc[j * hd..(j + 1) * hd];
                            s[j] = if n >= 2 {
                                attn::dot_f16_tinyblas(krow, &q16)
                            } else {
                                attn::dot_f16_vec(krow, &q16)
                            };
                        }
                        for (j, m) in mask.iter_mut().enumerate() {
                            if j > pos || pos - j >= window {
                                *m = f32::NEG_INFINITY;
                            }
                        }
                        let mut p = s.to_vec();
                        attn::soft_max_row(&mut p, &mask);
                        let p16: Vec<u16> = p.iter().map(|&v| f32_to_f16(v)).collect();
                        for d in 0..hd {
                            let vrow = &vt[d * n_kv..(d + 1) * n_kv];
                            out[t * hd + d] = if n >= 2 {
                                attn::dot_f16_tinyblas(vrow, &p16)
                            } else {
                                attn::dot_f16_vec(vrow, &p16)
                            };
                        }
                    }
                    (kq, out)
                })
                .collect();
            let mut kqv = vec![0f32; n * nh * hd];
            for (hh, (_, out)) in heads.iter().enumerate() {
                for t in 0..n {
                    kqv[t * nh * hd + hh * hd..][..hd].copy_from_slice(&out[t * hd..(t + 1) * hd]);
                }
            }
            if let Some(t) = trace.as_deref_mut() {
                t.push((
                    format!("kq-{il}"),
                    heads
                        .iter()
                        .flat_map(|(kq, _)| kq.iter().copied())
                        .collect(),
                ));
            }
            rec!(format!("kqv_out-{il}"), &kqv);
            let mut o = self.mul_mat(&l.o, &kqv, n);
            // The last layer keeps only the rows whose logits are wanted (`inp_out_ids`).
            if il == n_layers - 1 && rows == Rows::Last && n > 1 {
                o = o[(n - 1) * h..].to_vec();
                x = x[(n - 1) * h..].to_vec();
                n_rows = 1;
            }
            let o = self.rms_norm(&o, &l.post_attn_norm);
            rec!(format!("attn_post_norm-{il}"), &o);
            let sa: Vec<f32> = o.iter().zip(&x).map(|(a, b)| a + b).collect();
            rec!(format!("sa_out-{il}"), &sa);
            let cur = self.rms_norm(&sa, &l.ffn_norm);
            rec!(format!("ffn_norm-{il}"), &cur);
            let gate = self.mul_mat(&l.gate, &cur, n_rows);
            let up = self.mul_mat(&l.up, &cur, n_rows);
            rec!(format!("ffn_gate-{il}"), &gate);
            rec!(format!("ffn_up-{il}"), &up);
            let g: Vec<f32> = gate.iter().zip(&up).map(|(&a, &b)| geglu(a, b)).collect();
            rec!(format!("ffn_geglu-{il}"), &g);
            let d = self.mul_mat(&l.down, &g, n_rows);
            rec!(format!("ffn_out-{il}"), &d);
            let d = self.rms_norm(&d, &l.post_ffn_norm);
            rec!(format!("ffn_post_norm-{il}"), &d);
            x = d.iter().zip(&sa).map(|(a, b)| a + b).collect();
            rec!(format!("l_out-{il}"), &x);
        }
        let xn = self.rms_norm(&x, &self.output_norm);
        rec!("result_norm", &xn);
        let logits = self.mul_mat(&self.embd, &xn, n_rows);
        self.layers = layers;
        self.len = total;
        Ok(logits)
    }

    /// One forward call like [`Runner::forward`] that also returns the intermediate tensors.
    pub fn forward_traced(
        &mut self,
        tokens: &[u32],
        rows: Rows,
    ) -> Result<(Vec<f32>, Trace), ModelError> {
        let mut t = Trace::new();
        let logits = self.run(tokens, rows, Some(&mut t))?;
        Ok((logits, t))
    }
}

/// NEOX `rotate_pairs`: pairs `(i, i + hd/2)`; GCC fuses the `x0` products into FMAs.
fn rotate_pairs(x: &mut [f32], cache: &[(f32, f32)]) {
    let half = x.len() / 2;
    for (i, &(c, s)) in cache.iter().enumerate() {
        let (x0, x1) = (x[i], x[i + half]);
        x[i] = x0.mul_add(c, -(x1 * s));
        x[i + half] = x0.mul_add(s, x1 * c);
    }
}

/// `ggml_vec_geglu_f32` with the f16 GELU table: `gelu(gate)` looked up by the f16 value of
/// `gate`, times `up`.
fn geglu(gate: f32, up: f32) -> f32 {
    if gate <= -10.0 {
        0.0
    } else if gate >= 10.0 {
        gate * up
    } else {
        gelu_table(f32_to_f16(gate)) * up
    }
}

/// `ggml_table_gelu_f16[i]`: `ggml_gelu_f32` of the f16 value (with GCC's FMA contraction of
/// `1 + a*x*x`), rounded to f16.
fn gelu_table(bits: u16) -> f32 {
    const A: f32 = 0.044715;
    // SQRT_2_OVER_PI as the f32 it rounds to.
    let s = f32::from_bits(0x3f4c_422a);
    let x = f16_to_f32(bits);
    let inner = (A * x).mul_add(x, 1.0);
    let g = (0.5 * x) * (1.0 + ((s * x) * inner).tanh());
    f16_to_f32(f32_to_f16(g))
}

impl Runner for GgmlGemma3 {
    fn info(&self) -> &RunnerInfo {
        &self.info
    }

    fn len(&self) -> usize {
        self.len
    }

    fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    fn forward(
        &mut self,
        tokens: &[u32],
        rows: Rows,
        sink: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<(), ModelError> {
        let n = tokens.len();
        let logits = self.run(tokens, rows, None)?;
        let v = self.info.vocab_size;
        match rows {
            Rows::Last if n > 0 => sink(n - 1, &logits[logits.len() - v..]),
            Rows::Last => {}
            Rows::All => {
                for (i, row) in logits.chunks_exact(v).enumerate() {
                    sink(i, row);
                }
            }
        }
        Ok(())
    }
}
