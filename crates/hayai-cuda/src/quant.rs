//! Weight formats of the GPU backend and their exact CPU twins.
//!
//! * bf16: every value rounded to nearest-even bf16.
//! * int4: group 128 along the input dimension, symmetric, one bf16 scale per group
//!   (`scale = bf16(amax / 7)`, `q = clamp(round(w / scale), -8, 7)`, value `q * scale`), packed in
//!   the GEMV layout documented in `kernels/gemv.cu`.
//!
//! [`quantize_model_int4`] and [`round_model_bf16`] give the CPU reference the very weights the
//! GPU uses, so the two backends can be compared exactly.

use half::bf16;
use hayai_model::weights::Storage;
use hayai_model::{Matrix, Model};
use rayon::prelude::*;

/// Columns per int4 group.
pub const GROUP: usize = 128;

/// An int4 matrix in the GPU's packed layout.
#[derive(Clone, Debug)]
pub struct Int4Matrix {
    pub rows: usize,
    pub cols: usize,
    /// `rows * cols / 2` bytes.
    pub packed: Vec<u8>,
    /// bf16 bits, `[rows][cols / 128]`.
    pub scales: Vec<u16>,
}

/// Whether a matrix of `cols` columns can be stored as int4 (else it stays bf16).
pub fn int4_eligible(cols: usize) -> bool {
    cols > 0 && cols % GROUP == 0
}

/// Byte offset (within a row) and nibble shift of column `c` in the packed layout: group `g`
/// holds 64 bytes, lane `l` of the row's quad owns 16 of them, nibble `k` of its 32-bit word `u`
/// is column `16 * (2u + k / 4) + 4l + k % 4`.
#[inline]
pub fn int4_position(c: usize) -> (usize, u32) {
    let g = c / GROUP;
    let r = c % GROUP;
    let m = r / 16; // 0..8
    let l = (r % 16) / 4;
    let e = r % 4;
    let u = m / 2;
    let k = 4 * (m % 2) + e;
    (g * 64 + l * 16 + u * 4 + k / 2, 4 * (k as u32 % 2))
}

/// One group: the value of largest magnitude maps to -8, so all 16 levels are used (the
/// scale is negative when that value is positive; the kernels multiply by the scale's sign as
/// stored). Measured on the real 270M against max|x| / 7 (15 levels): Apache-2.0 PPL 21.10
/// instead of 27.45 (docs/performance.md, `examples/int4_quality.rs`).
fn quantize_group(vals: &[f32]) -> (u16, Vec<i8>) {
    let big = vals
        .iter()
        .fold(0.0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
    let scale = bf16::from_f32(big / -8.0);
    let s = scale.to_f32();
    let q = vals
        .iter()
        .map(|&v| {
            if s == 0.0 || !s.is_finite() {
                0
            } else {
                (v / s).round().clamp(-8.0, 7.0) as i8
            }
        })
        .collect();
    (scale.to_bits(), q)
}

/// RTN int4 quantization of `m` (which must have `cols % 128 == 0`).
pub fn quantize_int4(m: &Matrix) -> Int4Matrix {
    assert!(int4_eligible(m.cols), "int4 needs cols % 128 == 0");
    let (rows, cols) = (m.rows, m.cols);
    let groups = cols / GROUP;
    let mut packed = vec![0u8; rows * cols / 2];
    let mut scales = vec![0u16; rows * groups];
    packed
        .par_chunks_mut(cols / 2)
        .zip(scales.par_chunks_mut(groups))
        .enumerate()
        .for_each(|(r, (prow, srow))| {
            let row = m.row(r);
            for g in 0..groups {
                let (s, q) = quantize_group(&row[g * GROUP..(g + 1) * GROUP]);
                srow[g] = s;
                for (i, &qi) in q.iter().enumerate() {
                    let (byte, shift) = int4_position(g * GROUP + i);
                    prow[byte] |= (((qi + 8) as u8) & 0xF) << shift;
                }
            }
        });
    Int4Matrix {
        rows,
        cols,
        packed,
        scales,
    }
}

impl Int4Matrix {
    /// Quantized value (-8..7) at `(r, c)`.
    pub fn q(&self, r: usize, c: usize) -> i8 {
        let (byte, shift) = int4_position(c);
        ((self.packed[r * self.cols / 2 + byte] >> shift) & 0xF) as i8 - 8
    }

    /// The exact values the GPU multiplies with (`q * scale`, exact in f32).
    pub fn dequantize(&self) -> Matrix {
        let groups = self.cols / GROUP;
        let mut data = vec![0.0f32; self.rows * self.cols];
        data.par_chunks_mut(self.cols)
            .enumerate()
            .for_each(|(r, out)| {
                for (c, o) in out.iter_mut().enumerate() {
                    let s = bf16::from_bits(self.scales[r * groups + c / GROUP]).to_f32();
                    *o = self.q(r, c) as f32 * s;
                }
            });
        Matrix::from_f32(self.rows, self.cols, data)
    }

    pub fn n_bytes(&self) -> usize {
        self.packed.len() + self.scales.len() * 2
    }
}

/// Columns per int8 block ([`Int8Matrix`], GGML's Q8_0).
pub const INT8_BLOCK: usize = 32;

/// An int8 matrix with one f16 scale per 32 columns (GGML's Q8_0 blocks, row-major): the value
/// at `(r, c)` is `q[r][c] * scale[r][c / 32]`, exact in f32 (an int8 times an f16 needs 18
/// bits).
#[derive(Clone, Debug)]
pub struct Int8Matrix {
    pub rows: usize,
    pub cols: usize,
    /// `[rows][cols]`.
    pub q: Vec<i8>,
    /// f16 bits, `[rows][cols / 32]`.
    pub scales: Vec<u16>,
}

impl Int8Matrix {
    /// The exact values (`q * scale` in f32).
    pub fn dequantize(&self) -> Matrix {
        let blocks = self.cols / INT8_BLOCK;
        let mut data = vec![0.0f32; self.rows * self.cols];
        data.par_chunks_mut(self.cols)
            .enumerate()
            .for_each(|(r, out)| {
                for (c, o) in out.iter_mut().enumerate() {
                    let d = half::f16::from_bits(self.scales[r * blocks + c / INT8_BLOCK]).to_f32();
                    *o = self.q[r * self.cols + c] as f32 * d;
                }
            });
        Matrix::from_f32(self.rows, self.cols, data)
    }

    pub fn n_bytes(&self) -> usize {
        self.q.len() + self.scales.len() * 2
    }
}

/// `m` as int8 blocks of 32 columns with f16 scales, if every value already is one exactly:
/// each block's `q * d` with `d = max|v| / 127` an f16 and `|q| <= 127` (what a GGUF file's Q8_0
/// tensor dequantizes to: its blocks' largest value is `+-127 d`). `None` where any block is not
/// (a matrix from bf16 or f32 weights, or `cols % 32 != 0`): such a matrix has no exact int8 form.
pub fn int8_exact(m: &Matrix) -> Option<Int8Matrix> {
    if m.cols == 0 || m.cols % INT8_BLOCK != 0 {
        return None;
    }
    let (rows, cols) = (m.rows, m.cols);
    let blocks = cols / INT8_BLOCK;
    // Most heads are not (a bf16 or f32 checkpoint's): the first row says so before the
    // allocation (E4B's head as int8 is 671 MB).
    let (mut q0, mut s0) = ([0i8; INT8_BLOCK], 0u16);
    if rows > 0
        && !m
            .row(0)
            .chunks(INT8_BLOCK)
            .all(|v| int8_block(v, &mut q0, &mut s0))
    {
        return None;
    }
    let mut q = vec![0i8; rows * cols];
    let mut scales = vec![0u16; rows * blocks];
    let exact = q
        .par_chunks_mut(cols)
        .zip(scales.par_chunks_mut(blocks))
        .enumerate()
        .all(|(r, (qrow, srow))| {
            let row = m.row(r);
            row.chunks(INT8_BLOCK)
                .zip(qrow.chunks_mut(INT8_BLOCK))
                .zip(srow.iter_mut())
                .all(|((v, qb), s)| int8_block(v, qb, s))
        });
    exact.then_some(Int8Matrix {
        rows,
        cols,
        q,
        scales,
    })
}

/// One block of [`int8_exact`]: its q and f16 scale bits, false unless `v` is exactly `q * d`.
fn int8_block(v: &[f32], q: &mut [i8], scale: &mut u16) -> bool {
    let amax = v.iter().fold(0.0f32, |m, &x| m.max(x.abs()));
    if amax == 0.0 {
        q.fill(0);
        *scale = 0;
        return v.iter().all(|&x| x == 0.0);
    }
    let d = amax / 127.0;
    let h = half::f16::from_f32(d);
    if !amax.is_finite() || h.to_f32() != d {
        return false;
    }
    *scale = h.to_bits();
    v.iter().zip(q.iter_mut()).all(|(&x, qi)| {
        let r = (x / d).round();
        *qi = r as i8;
        r.abs() <= 127.0 && r * d == x
    })
}

/// The model as the bf16 GPU plan with the int8 output head `head` (the model's own, from
/// [`int8_exact`]) sees it: [`round_model_bf16`], with the output projection untied from the
/// embedding and kept at its exact values.
pub fn round_model_bf16_int8_head(model: &Model, head: &Int8Matrix) -> Model {
    let mut m = round_model_bf16(model);
    m.weights.lm_head = Some(head.dequantize());
    m
}

/// bf16 bits of every value of `m` (round to nearest even).
pub fn to_bf16_bits(m: &Matrix) -> Vec<u16> {
    match &m.data {
        Storage::Bf16(v) => v.clone(),
        Storage::F32(v) => v.par_iter().map(|&x| bf16::from_f32(x).to_bits()).collect(),
    }
}

/// `m` rounded to bf16 (nearest even), kept as f32.
pub fn bf16_matrix(m: &Matrix) -> Matrix {
    Matrix::from_bf16_bits(m.rows, m.cols, to_bf16_bits(m))
}

/// The model as the bf16 GPU plan sees it: every matrix rounded to bf16.
pub fn round_model_bf16(model: &Model) -> Model {
    let mut m = model.clone();
    let round = |x: &mut Matrix| {
        if !x.is_bf16() {
            *x = bf16_matrix(x);
        }
    };
    round(&mut m.weights.embed);
    if let Some(p) = m.weights.ple.as_mut() {
        round(&mut p.table);
    }
    m.weights.for_each_linear_mut(|_, x| round(x));
    m
}

/// The model as the int4 GPU plan sees it: projections (the output head included, untied from
/// the embedding) replaced by their dequantized int4 values where `cols % 128 == 0`, bf16
/// elsewhere; embedding and PLE tables (gathers, not streamed) rounded to bf16.
pub fn quantize_model_int4(model: &Model) -> Model {
    quantize_model_with(model, |x| quantize_int4(x).dequantize())
}

/// `model` with its output projection untied from the embedding, the embedding and PLE table
/// rounded to bf16, and every int4-eligible projection (`cols % 128 == 0`) replaced by `f` of it
/// (the others rounded to bf16): [`quantize_model_int4`] with `f` = the GPU's int4 format, or
/// another format to compare (`examples/int4_quality.rs`).
pub fn quantize_model_with(model: &Model, f: impl Fn(&Matrix) -> Matrix) -> Model {
    let mut m = model.clone();
    let head = if m.weights.lm_head.is_none() {
        Some(m.weights.embed.clone())
    } else {
        None
    };
    if let Some(h) = head {
        m.weights.lm_head = Some(h);
    }
    m.weights.embed = bf16_matrix(&m.weights.embed);
    if let Some(p) = m.weights.ple.as_mut() {
        p.table = bf16_matrix(&p.table);
    }
    m.weights.for_each_linear_mut(|_, x| {
        *x = if int4_eligible(x.cols) {
            f(x)
        } else {
            bf16_matrix(x)
        };
    });
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A matrix whose blocks are exact int8 x f16 (as a Q8_0 tensor dequantizes), from `seed`.
    fn q8_matrix(rows: usize, cols: usize, seed: u64) -> (Vec<i8>, Vec<f32>, Matrix) {
        let mut r = hayai_model::random::SplitMix::new(seed);
        let blocks = cols / INT8_BLOCK;
        let ds: Vec<f32> = (0..rows * blocks)
            .map(|_| half::f16::from_f32(0.001 + 0.01 * r.uniform().abs()).to_f32())
            .collect();
        let mut q: Vec<i8> = (0..rows * cols)
            .map(|_| (r.uniform() * 126.0).round() as i8)
            .collect();
        // Every block's largest |q| is 127, as Q8_0's rounding makes it.
        for b in 0..rows * blocks {
            q[b * INT8_BLOCK + (b % INT8_BLOCK)] = if b % 2 == 0 { 127 } else { -127 };
        }
        let v = (0..rows * cols)
            .map(|i| q[i] as f32 * ds[(i / cols) * blocks + (i % cols) / INT8_BLOCK])
            .collect();
        (q, ds, Matrix::from_f32(rows, cols, v))
    }

    #[test]
    fn int8_exact_recovers_q8_blocks_and_refuses_other_weights() {
        let (q, ds, m) = q8_matrix(5, 96, 3);
        let e = int8_exact(&m).expect("exact int8 blocks");
        assert_eq!(e.q, q);
        let d: Vec<f32> = e
            .scales
            .iter()
            .map(|&b| half::f16::from_bits(b).to_f32())
            .collect();
        assert_eq!(d, ds);
        assert_eq!(e.dequantize().to_f32(), m.to_f32());
        assert_eq!(e.n_bytes(), 5 * 96 + 5 * 3 * 2);
        // A zero block is exact (scale 0).
        let mut v = m.to_f32();
        v[..32].fill(0.0);
        let z = int8_exact(&Matrix::from_f32(5, 96, v.clone())).expect("zero block");
        assert_eq!(z.scales[0], 0);
        assert_eq!(z.dequantize().to_f32(), v);
        // One value off the grid, random bf16 weights, a width that is no multiple of 32: none.
        v[40] = v[40] * 1.000_001 + 1e-7;
        assert!(int8_exact(&Matrix::from_f32(5, 96, v)).is_none());
        assert!(int8_exact(&bf16_matrix(&rand_matrix(4, 64, 9))).is_none());
        assert!(int8_exact(&Matrix::from_f32(1, 48, vec![0.0; 48])).is_none());
    }

    /// `gemv_q8`'s indexing (kernels/gemv.cu), modelled: lane l of a row's quad, unit g of 64
    /// columns: the 16 bytes at g * 64 + 16 l, x at the same columns, the scale at block
    /// 2 g + l / 2 of the row; the lanes' sums added as the two shuffles add them. Every
    /// row's result against the plain product of the exact values.
    #[test]
    fn gemv_q8_indexing_reproduces_each_rows_dot_product() {
        let (rows, cols) = (7, 320);
        let (_, _, m) = q8_matrix(rows, cols, 11);
        let e = int8_exact(&m).unwrap();
        let mut r = hayai_model::random::SplitMix::new(12);
        let x: Vec<f32> = (0..cols).map(|_| r.uniform()).collect();
        let w = m.to_f32();
        let blocks = cols / INT8_BLOCK;
        for row in 0..rows {
            let mut lanes = [0.0f32; 4];
            for (l, acc) in lanes.iter_mut().enumerate() {
                for g in 0..cols / 64 {
                    let c0 = g * 64 + 16 * l;
                    let bytes = &e.q[row * cols + c0..row * cols + c0 + 16];
                    // dot_chunk_int8: two chains over the 16 columns.
                    let (mut s0, mut s1) = (0.0f32, 0.0f32);
                    for (i, &q) in bytes.iter().enumerate() {
                        let t = q as f32 * x[c0 + i];
                        if i % 2 == 0 {
                            s0 += t
                        } else {
                            s1 += t
                        }
                    }
                    let d = half::f16::from_bits(e.scales[row * blocks + 2 * g + l / 2]).to_f32();
                    *acc += (s0 + s1) * d;
                }
            }
            let got = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
            let want: f64 = (0..cols)
                .map(|c| w[row * cols + c] as f64 * x[c] as f64)
                .sum();
            assert!(
                (got as f64 - want).abs() <= 1e-5 * (1.0 + want.abs()),
                "row {row}: {got} against {want}"
            );
        }
    }

    #[test]
    fn the_int8_head_twin_unties_the_head_and_keeps_it_exact() {
        let spec = hayai_model::random::tiny_spec(hayai_model::spec::Arch::Gemma3);
        let mut model = hayai_model::random::random_model(&spec, 1);
        assert!(int8_exact(model.weights.lm_head()).is_none());
        let (_, _, head) = q8_matrix(spec.vocab, spec.hidden, 5);
        model.weights.embed = head.clone();
        model.weights.lm_head = None;
        let blocks = int8_exact(model.weights.lm_head()).expect("exact head");
        let twin = round_model_bf16_int8_head(&model, &blocks);
        assert_eq!(twin.weights.lm_head().to_f32(), head.to_f32());
        // The embedding (a gather) is the bf16 one, as the GPU reads it.
        assert_eq!(twin.weights.embed.to_f32(), bf16_matrix(&head).to_f32());
    }

    fn rand_matrix(rows: usize, cols: usize, seed: u64) -> Matrix {
        let mut r = hayai_model::random::SplitMix::new(seed);
        Matrix::from_f32(rows, cols, (0..rows * cols).map(|_| r.uniform()).collect())
    }

    #[test]
    fn positions_are_a_permutation() {
        let mut seen = vec![false; 128 * 2];
        for c in 0..256 {
            let (b, s) = int4_position(c);
            let slot = b * 2 + (s / 4) as usize;
            assert!(!seen[slot], "column {c} collides");
            seen[slot] = true;
        }
        assert!(seen.iter().all(|&x| x));
    }

    #[test]
    fn int4_round_trip_error_is_bounded_by_a_step() {
        let m = rand_matrix(5, 384, 7);
        let q = quantize_int4(&m);
        let d = q.dequantize().to_f32();
        let orig = m.to_f32();
        for r in 0..5 {
            for g in 0..3 {
                let s = bf16::from_bits(q.scales[r * 3 + g]).to_f32();
                for c in g * 128..(g + 1) * 128 {
                    let (x, e) = (
                        orig[r * 384 + c],
                        (d[r * 384 + c] - orig[r * 384 + c]).abs(),
                    );
                    // Half a step, except a value of the opposite sign to the group's largest and
                    // as large in magnitude (+8 steps, clamped to 7): one step. The bf16 rounding
                    // of the scale may add a little.
                    let bound = if (x / s).abs() > 7.5 {
                        s.abs()
                    } else {
                        0.5 * s.abs()
                    };
                    assert!(e <= bound + s.abs() / 32.0, "r{r} c{c}: err {e} step {s}");
                }
            }
        }
    }

    #[test]
    fn zero_group_quantizes_to_zero() {
        let m = Matrix::from_f32(1, 128, vec![0.0; 128]);
        let q = quantize_int4(&m);
        assert!(q.dequantize().to_f32().iter().all(|&v| v == 0.0));
    }

    #[test]
    fn int4_model_unties_head_and_keeps_embedding_bf16() {
        let spec = crate::synth::small_spec(hayai_model::Arch::Gemma4);
        let model = hayai_model::random::random_model(&spec, 1);
        let q = quantize_model_int4(&model);
        assert!(q.weights.lm_head.is_some());
        assert!(q.weights.embed.is_bf16());
        let e0 = model.weights.embed.row(3);
        let e1 = q.weights.embed.row(3);
        for (a, b) in e0.iter().zip(&e1) {
            assert_eq!(bf16::from_f32(*a).to_f32(), *b);
        }
    }
}

#[cfg(test)]
mod scale_tests {
    use super::*;

    #[test]
    fn the_largest_magnitude_maps_to_minus_eight() {
        let mut v = vec![0.0f32; 128];
        v[3] = 0.8;
        v[7] = -0.4;
        let m = Matrix::from_f32(1, 128, v.clone());
        let q = quantize_int4(&m);
        assert_eq!(q.q(0, 3), -8);
        assert_eq!(q.q(0, 7), 4);
        assert_eq!(q.q(0, 0), 0);
        let d = q.dequantize().to_f32();
        assert!((d[3] - 0.8).abs() < 1e-3 && (d[7] + 0.4).abs() < 1e-3);
        // A negative extreme gives a positive scale.
        v[3] = -0.8;
        let q = quantize_int4(&Matrix::from_f32(1, 128, v));
        assert_eq!(q.q(0, 3), -8);
        assert!(bf16::from_bits(q.scales[0]).to_f32() > 0.0);
    }
}

/// A model of `gemv_a8`'s data layout (kernels/gemv.cu): the int8 activation words the
/// prologue writes and the DP4A dot each weight lane computes must add up to the plain integer
/// dot product of the group — checked here without a GPU.
#[cfg(test)]
mod act8_layout_tests {
    use super::*;

    fn dp4a(a: u32, b: u32, c: i32) -> i32 {
        (0..4).fold(c, |acc, i| {
            acc + ((a >> (8 * i)) as u8 as i8 as i32) * ((b >> (8 * i)) as u8 as i8 as i32)
        })
    }

    #[test]
    fn dp4a_words_reproduce_the_integer_dot_product() {
        let cols = 256;
        let mut r = hayai_model::random::SplitMix::new(3);
        let m = Matrix::from_f32(2, cols, (0..2 * cols).map(|_| r.uniform()).collect());
        let q = quantize_int4(&m);
        let xq: Vec<i32> = (0..cols)
            .map(|i| ((i * 37 + 11) % 255) as i32 - 127)
            .collect();
        for g in 0..cols / 128 {
            // The prologue: warp lane `lane` owns columns 4 lane .. 4 lane + 3 of the group.
            let mut words = [0u32; 32];
            let mut xsum = [0i32; 4];
            for lane in 0..32 {
                let (u, half, l) = (lane >> 3, (lane >> 2) & 1, lane & 3);
                for i in 0..4 {
                    let v = xq[g * 128 + 4 * lane + i];
                    let k = 4 * half + i;
                    let word = (l * 4 + u) * 2 + (k & 1);
                    words[word] |= ((v as i8 as u8) as u32) << (8 * (k >> 1));
                    xsum[l] += v;
                }
            }
            for row in 0..2 {
                let packed = &q.packed[row * cols / 2..(row + 1) * cols / 2];
                let mut total = 0i32;
                for l in 0..4 {
                    let b = &packed[g * 64 + l * 16..g * 64 + l * 16 + 16];
                    let mut d = 0i32;
                    for u in 0..4 {
                        let w = u32::from_le_bytes([
                            b[4 * u],
                            b[4 * u + 1],
                            b[4 * u + 2],
                            b[4 * u + 3],
                        ]);
                        d = dp4a(w & 0x0F0F_0F0F, words[(l * 4 + u) * 2], d);
                        d = dp4a((w >> 4) & 0x0F0F_0F0F, words[(l * 4 + u) * 2 + 1], d);
                    }
                    total += d - 8 * xsum[l];
                }
                let want: i32 = (0..128)
                    .map(|c| q.q(row, g * 128 + c) as i32 * xq[g * 128 + c])
                    .sum();
                assert_eq!(total, want, "row {row} group {g}");
            }
        }
    }
}

/// The fragment order of `gemv_mma` (kernels/gemv_mma.cu), checked without a GPU: the A operand
/// built from each lane's nibble words, the B operand from x, multiplied as mma.m16n8k16 defines
/// it (lane 4 g + c holds A rows g, g + 8 and k pairs 2c, 2c + 8; B k pairs 2c, 2c + 8 of
/// column g), must give each row's plain dot product.
#[cfg(test)]
mod mma_layout_tests {
    use super::*;

    /// bf16 pair of (nibble - 8) for the nibbles at bits 0 and 16 of `w` (gmma_pair).
    fn pair(w: u32) -> [i32; 2] {
        [(w & 15) as i32 - 8, ((w >> 16) & 15) as i32 - 8]
    }

    fn col(u: usize, k: usize, c: usize) -> usize {
        32 * u + 16 * (k >> 2) + 4 * c + (k & 3)
    }

    #[test]
    fn mma_fragments_reproduce_each_rows_dot_product() {
        let (rows, cols) = (16, 256);
        let mut r = hayai_model::random::SplitMix::new(5);
        let m = Matrix::from_f32(rows, cols, (0..rows * cols).map(|_| r.uniform()).collect());
        let q = quantize_int4(&m);
        let x: Vec<i64> = (0..cols).map(|i| ((i * 53 + 7) % 97) as i64 - 48).collect();
        let word = |row: usize, g: usize, c: usize, u: usize| {
            let b = &q.packed[row * cols / 2 + g * 64 + c * 16 + 4 * u..][..4];
            u32::from_le_bytes([b[0], b[1], b[2], b[3]])
        };
        for g in 0..cols / 128 {
            let mut d = [0i64; 16];
            for s in 0..8 {
                let (u, sh, k0) = (s / 2, 8 * (s % 2), 2 * (s % 2));
                // a[lane][reg][half], b[lane][reg][half] (column 0 only: lanes with g = 0).
                let a = |lane: usize, reg: usize| {
                    let (lg, c) = (lane / 4, lane % 4);
                    let row = if reg % 2 == 0 { lg } else { lg + 8 };
                    let shift = if reg < 2 { sh } else { sh + 4 };
                    pair(word(row, g, c, u) >> shift)
                };
                let b = |c: usize, reg: usize| {
                    let ks = if reg == 0 {
                        [k0, k0 + 4]
                    } else {
                        [k0 + 1, k0 + 5]
                    };
                    ks.map(|k| x[g * 128 + col(u, k, c)])
                };
                for (mrow, dm) in d.iter_mut().enumerate() {
                    for vk in 0..16 {
                        let c = (vk % 8) / 2;
                        let lane = 4 * (mrow % 8) + c;
                        let areg = (mrow >= 8) as usize + 2 * (vk >= 8) as usize;
                        let breg = (vk >= 8) as usize;
                        *dm += a(lane, areg)[vk % 2] as i64 * b(c, breg)[vk % 2];
                    }
                }
            }
            for (row, &got) in d.iter().enumerate() {
                let want: i64 = (0..128)
                    .map(|c| q.q(row, g * 128 + c) as i64 * x[g * 128 + c])
                    .sum();
                assert_eq!(got, want, "row {row} group {g}");
            }
        }
    }

    /// `gemv_mma_a8`'s order (mma.m16n8k32, u8 A x s8 B): lane 4 g + c holds A rows g (a0, a2)
    /// and g + 8 (a1, a3) at k slots 4c..4c+3 (a0, a1) and 16+4c.. (a2, a3), B slots 4c..4c+3
    /// (b0) and 16+4c.. (b1) of column g. Step u takes word u of the lane's chunk: a0 / a1 its
    /// low nibbles of rows g / g + 8, a2 / a3 the high ones; b0 / b1 the int8 x at the columns
    /// of nibbles 0, 2, 4, 6 / 1, 3, 5, 7. Minus 8 x sum: each row's exact dot product.
    #[test]
    fn int8_mma_fragments_reproduce_each_rows_dot_product() {
        let (rows, cols) = (16, 256);
        let mut r = hayai_model::random::SplitMix::new(9);
        let m = Matrix::from_f32(rows, cols, (0..rows * cols).map(|_| r.uniform()).collect());
        let q = quantize_int4(&m);
        let x: Vec<i64> = (0..cols)
            .map(|i| ((i * 37 + 11) % 255) as i64 - 127)
            .collect();
        let word = |row: usize, g: usize, c: usize, u: usize| {
            let b = &q.packed[row * cols / 2 + g * 64 + c * 16 + 4 * u..][..4];
            u32::from_le_bytes([b[0], b[1], b[2], b[3]])
        };
        let bytes = |w: u32| [0, 1, 2, 3].map(|i| ((w >> (8 * i)) & 0xFF) as i64);
        for g in 0..cols / 128 {
            let xsum: i64 = (0..128).map(|c| x[g * 128 + c]).sum();
            let mut d = [0i64; 16];
            for u in 0..4 {
                // a(lane, reg): four u8 of register reg; b(c, reg): four s8 of lane (0, c).
                let a = |lane: usize, reg: usize| {
                    let (lg, c) = (lane / 4, lane % 4);
                    let row = if reg % 2 == 0 { lg } else { lg + 8 };
                    let w = word(row, g, c, u);
                    bytes(if reg < 2 {
                        w & 0x0F0F_0F0F
                    } else {
                        (w >> 4) & 0x0F0F_0F0F
                    })
                };
                let b = |c: usize, reg: usize| {
                    [0, 1, 2, 3].map(|j| x[g * 128 + col(u, 2 * j + reg, c)])
                };
                for (mrow, dm) in d.iter_mut().enumerate() {
                    for k in 0..32 {
                        let (hi, c, i) = (k / 16, (k % 16) / 4, k % 4);
                        let lane = 4 * (mrow % 8) + c;
                        let areg = (mrow >= 8) as usize + 2 * hi;
                        *dm += a(lane, areg)[i] * b(c, hi)[i];
                    }
                }
            }
            for (row, &got) in d.iter().enumerate() {
                let want: i64 = (0..128)
                    .map(|c| q.q(row, g * 128 + c) as i64 * x[g * 128 + c])
                    .sum();
                assert_eq!(got - 8 * xsum, want, "row {row} group {g}");
            }
        }
    }
}
