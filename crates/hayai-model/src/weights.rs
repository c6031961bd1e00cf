//! Weights of a Gemma text decoder as the CPU reference holds them: row-major matrices
//! (`[out, in]`, as HF `nn.Linear` and GGUF store them), f32 or bf16, plus f32 norm vectors.
//! Norm vectors are stored as the effective multiplier (Gemma 3's `1 + w` is folded in at load).

use half::bf16;
use rayon::prelude::*;

use crate::cpu::simd;

#[derive(Clone, Debug)]
pub enum Storage {
    F32(Vec<f32>),
    /// Raw bf16 bit patterns.
    Bf16(Vec<u16>),
}

#[derive(Clone, Debug)]
pub struct Matrix {
    pub rows: usize,
    pub cols: usize,
    pub data: Storage,
}

impl Matrix {
    pub fn from_f32(rows: usize, cols: usize, data: Vec<f32>) -> Self {
        assert_eq!(data.len(), rows * cols, "matrix data length");
        Matrix {
            rows,
            cols,
            data: Storage::F32(data),
        }
    }

    pub fn from_bf16_bits(rows: usize, cols: usize, data: Vec<u16>) -> Self {
        assert_eq!(data.len(), rows * cols, "matrix data length");
        Matrix {
            rows,
            cols,
            data: Storage::Bf16(data),
        }
    }

    pub fn is_bf16(&self) -> bool {
        matches!(self.data, Storage::Bf16(_))
    }

    /// Bytes the weights occupy.
    pub fn n_bytes(&self) -> usize {
        match &self.data {
            Storage::F32(v) => v.len() * 4,
            Storage::Bf16(v) => v.len() * 2,
        }
    }

    /// Copy row `r` into `out` as f32.
    pub fn row_into(&self, r: usize, out: &mut [f32]) {
        let c = self.cols;
        match &self.data {
            Storage::F32(v) => out.copy_from_slice(&v[r * c..(r + 1) * c]),
            Storage::Bf16(v) => {
                for (o, &b) in out.iter_mut().zip(&v[r * c..(r + 1) * c]) {
                    *o = bf16::from_bits(b).to_f32();
                }
            }
        }
    }

    pub fn row(&self, r: usize) -> Vec<f32> {
        let mut out = vec![0.0; self.cols];
        self.row_into(r, &mut out);
        out
    }

    /// All values as f32 (a copy).
    pub fn to_f32(&self) -> Vec<f32> {
        match &self.data {
            Storage::F32(v) => v.clone(),
            Storage::Bf16(v) => v.iter().map(|&b| bf16::from_bits(b).to_f32()).collect(),
        }
    }

    fn dot_row(&self, r: usize, x: &[f32]) -> f32 {
        let c = self.cols;
        match &self.data {
            Storage::F32(v) => simd::dot(&v[r * c..(r + 1) * c], x),
            Storage::Bf16(v) => simd::dot_bf16(&v[r * c..(r + 1) * c], x),
        }
    }

    /// `y = W x` for `n` inputs at once: `xs` is `n × cols`, `ys` is `n × rows` (row-major).
    /// Each output is one fixed-order dot product, so results do not depend on thread count.
    pub fn matmul(&self, xs: &[f32], ys: &mut [f32]) {
        let (r, c) = (self.rows, self.cols);
        let n = xs.len() / c;
        assert_eq!(xs.len(), n * c, "matmul input shape");
        assert_eq!(ys.len(), n * r, "matmul output shape");
        if n == 1 {
            // Parallel over output rows in chunks large enough to amortize scheduling.
            ys.par_chunks_mut(256).enumerate().for_each(|(ci, chunk)| {
                for (j, y) in chunk.iter_mut().enumerate() {
                    *y = self.dot_row(ci * 256 + j, xs);
                }
            });
            return;
        }
        // Several inputs: blocks of output rows in parallel; inside a block, 3×4 register
        // tiles (3 weight rows × 4 inputs) so each loaded vector feeds several FMA chains.
        const RB: usize = 48;
        let mut out_t = vec![0.0f32; r * n]; // rows × n, transposed
        out_t
            .par_chunks_mut(RB * n)
            .enumerate()
            .for_each(|(bi, block)| {
                let r0 = bi * RB;
                let rows_here = block.len() / n;
                // bf16 rows are widened once per block.
                let widened: Vec<f32>;
                let wrows: &[f32] = match &self.data {
                    Storage::F32(v) => &v[r0 * c..(r0 + rows_here) * c],
                    Storage::Bf16(v) => {
                        widened = v[r0 * c..(r0 + rows_here) * c]
                            .iter()
                            .map(|&b| bf16::from_bits(b).to_f32())
                            .collect();
                        &widened
                    }
                };
                let wr = |j: usize| &wrows[j * c..(j + 1) * c];
                let xr = |t: usize| &xs[t * c..(t + 1) * c];
                let (full_j, full_t) = (rows_here / 3 * 3, n / 4 * 4);
                for j in (0..full_j).step_by(3) {
                    for t in (0..full_t).step_by(4) {
                        let tile = simd::tile_3x4(
                            [wr(j), wr(j + 1), wr(j + 2)],
                            [xr(t), xr(t + 1), xr(t + 2), xr(t + 3)],
                            c,
                        );
                        for (i, row) in tile.iter().enumerate() {
                            block[(j + i) * n + t..(j + i) * n + t + 4].copy_from_slice(row);
                        }
                    }
                    for t in full_t..n {
                        for i in 0..3 {
                            block[(j + i) * n + t] = simd::dot(wr(j + i), xr(t));
                        }
                    }
                }
                for j in full_j..rows_here {
                    for t in 0..n {
                        block[j * n + t] = simd::dot(wr(j), xr(t));
                    }
                }
            });
        for t in 0..n {
            for j in 0..r {
                ys[t * r + j] = out_t[j * n + t];
            }
        }
    }

    pub fn matvec(&self, x: &[f32], y: &mut [f32]) {
        self.matmul(x, y)
    }
}

/// Per-layer-embedding weights of one layer (Gemma 4).
#[derive(Clone, Debug)]
pub struct LayerPle {
    /// `per_layer_input_gate`: `[ple_dim, hidden]`.
    pub gate: Matrix,
    /// `per_layer_projection`: `[hidden, ple_dim]`.
    pub proj: Matrix,
    /// `post_per_layer_input_norm`: `[hidden]`.
    pub post_norm: Vec<f32>,
}

#[derive(Clone, Debug)]
pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    pub q: Matrix,
    /// `None` on KV-shared layers.
    pub k: Option<Matrix>,
    pub v: Option<Matrix>,
    pub q_norm: Vec<f32>,
    pub k_norm: Option<Vec<f32>>,
    pub o: Matrix,
    pub post_attn_norm: Vec<f32>,
    pub pre_ffn_norm: Vec<f32>,
    pub gate: Matrix,
    pub up: Matrix,
    pub down: Matrix,
    pub post_ffn_norm: Vec<f32>,
    pub ple: Option<LayerPle>,
    /// 1.0 where the architecture has none.
    pub layer_scalar: f32,
}

/// Model-level per-layer-embedding weights (Gemma 4).
#[derive(Clone, Debug)]
pub struct GlobalPle {
    /// `embed_tokens_per_layer`: `[vocab, n_layers * ple_dim]`, layer-major within a row.
    pub table: Matrix,
    /// `per_layer_model_projection`: `[n_layers * ple_dim, hidden]`.
    pub model_proj: Matrix,
    /// `per_layer_projection_norm`: `[ple_dim]`.
    pub proj_norm: Vec<f32>,
}

#[derive(Clone, Debug)]
pub struct ModelWeights {
    /// `[vocab, hidden]`, unscaled.
    pub embed: Matrix,
    /// Separate output head; `None` when tied to `embed`.
    pub lm_head: Option<Matrix>,
    pub final_norm: Vec<f32>,
    pub ple: Option<GlobalPle>,
    pub layers: Vec<LayerWeights>,
}

impl ModelWeights {
    pub fn lm_head(&self) -> &Matrix {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// Apply `f` to every projection matrix (used to re-quantize a model in place).
    pub fn for_each_linear_mut(&mut self, mut f: impl FnMut(&str, &mut Matrix)) {
        for (i, l) in self.layers.iter_mut().enumerate() {
            f(&format!("layers.{i}.q"), &mut l.q);
            if let Some(k) = l.k.as_mut() {
                f(&format!("layers.{i}.k"), k);
            }
            if let Some(v) = l.v.as_mut() {
                f(&format!("layers.{i}.v"), v);
            }
            f(&format!("layers.{i}.o"), &mut l.o);
            f(&format!("layers.{i}.gate"), &mut l.gate);
            f(&format!("layers.{i}.up"), &mut l.up);
            f(&format!("layers.{i}.down"), &mut l.down);
            if let Some(p) = l.ple.as_mut() {
                f(&format!("layers.{i}.ple_gate"), &mut p.gate);
                f(&format!("layers.{i}.ple_proj"), &mut p.proj);
            }
        }
        if let Some(p) = self.ple.as_mut() {
            f("ple_model_proj", &mut p.model_proj);
        }
        if let Some(h) = self.lm_head.as_mut() {
            f("lm_head", h);
        }
    }
}

/// A loaded model: its architecture and its weights.
#[derive(Clone, Debug)]
pub struct Model {
    pub spec: crate::spec::ModelSpec,
    pub weights: ModelWeights,
}
