//! Bit-exact scalar emulation of llama.cpp's CPU "CPU_REPACK" path for a Q4_K weight
//! (`block_q4_Kx8`, `tensor_traits<block_q4_K, 8, 8, GGML_TYPE_Q8_K>` in ggml-cpu/repack.cpp) as
//! compiled on x86-64 with AVX-512 F/BW/DQ/VL/VNNI, FMA and F16C (GCC, -O3 -march=native).
//!
//! Path taken by ggml (`forward_mul_mat` / `forward_mul_mat_one_chunk`):
//! * activations, rows `t < n - n % 4` in groups of 4: `ggml_quantize_mat_q8_K_4x8` (x86 AVX2
//!   version); the remaining `n % 4` rows (all rows when `n < 4`): `quantize_row_q8_K`, which on x86
//!   is `quantize_row_q8_K_ref` (ggml-base, compiled without -march, so no FMA contraction);
//! * if `n > 3`: `ggml_gemm_q4_K_8x8_q8_K` on the first `n - n % 4` rows, then
//!   `ggml_gemv_q4_K_8x8_q8_K` on each remaining row. Threads only split the weight columns
//!   (multiples of 8), and every code path (AVX-512 16-column, AVX2 8-column) computes the same
//!   float sequence per output, so the thread count does not change any result.
//!
//! Float arithmetic per output (weight row `r`, token `t`), with `ds = f16(d)`, `dm = f16(dmin)` of
//! the weight super-block `b` and `da` the Q8_K scale of the activation super-block:
//! * gemm: for each super-block, for each pair of sub-blocks `sb` (0..4):
//!   `acc = fma(f32(isum_sb), ds*da, acc)`, `acc_min = fma(f32(imin_sb), dm*da, acc_min)`;
//! * gemv: the same, but once per super-block with the integer sums over all 8 sub-blocks;
//! * result `acc - acc_min`.
//!
//! Integer parts (`isum = sum_j scale_j * sum(q4*q8)`, `imin = sum_j min_j * bsum_j`) are exact.

use half::f16;

use super::quant::{quantize_row_q8_k, QK_K};

const BLOCK_BYTES: usize = 144;

/// One quantized activation super-block (the content of a `block_q8_K`, or of one row of a
/// `block_q8_Kx4`, de-interleaved).
struct Q8Block {
    d: f32,
    qs: [i8; QK_K],
    /// sums of the 32 quants of each sub-block (what the kernels obtain from `bsums` via
    /// `_mm_hadd_epi16` of the 16-element sums; exact).
    bsum32: [i32; 8],
}

impl Q8Block {
    fn finish(d: f32, qs: [i8; QK_K]) -> Self {
        let mut bsum32 = [0i32; 8];
        for (j, s) in bsum32.iter_mut().enumerate() {
            *s = qs[j * 32..j * 32 + 32].iter().map(|&q| q as i32).sum();
        }
        Q8Block { d, qs, bsum32 }
    }
}

// quantize_row_q8_K_ref (ggml-quants.c), used by quantize_row_q8_K on x86.
fn quantize_q8k_ref(x: &[f32]) -> Q8Block {
    let b = &quantize_row_q8_k(x)[0];
    Q8Block::finish(b.d, b.qs)
}

// ggml_quantize_mat_q8_K_4x8 (arch/x86/repack.cpp, __AVX2__ branch), one row of the 4.
fn quantize_q8k_4x8_row(x: &[f32]) -> Q8Block {
    // maxAbs over all 256 values; `mask`: some lane holding the global max has a *positive*
    // element equal to it (the `_CMP_EQ_OQ` masks track maxAbs == v, signed).
    let mut max_abs = 0f32;
    for &v in x {
        max_abs = max_abs.max(v.abs());
    }
    let has_pos = x.contains(&max_abs);
    let iscale = if max_abs != 0.0 {
        if has_pos {
            -127.0f32 / max_abs
        } else {
            127.0f32 / max_abs
        }
    } else {
        0.0
    };
    let d = if max_abs != 0.0 { 1.0f32 / iscale } else { 0.0 };
    let mut qs = [0i8; QK_K];
    for (q, &v) in qs.iter_mut().zip(x) {
        // _mm256_mul_ps, _mm256_round_ps(_MM_ROUND_NEAREST), cvtps_epi32, saturating packs
        let r = (v * iscale).round_ties_even() as i32;
        *q = r.clamp(-128, 127) as i8;
    }
    Q8Block::finish(d, qs)
}

/// One weight super-block (block_q4_K), decoded; lossless w.r.t. `make_block_q4_Kx8`.
struct Q4Block {
    d: f32,
    dmin: f32,
    sc: [i32; 8],
    mn: [i32; 8],
    /// nibbles in element order: sub-block 2j = low nibbles of qs[32j..32j+32],
    /// sub-block 2j+1 = high nibbles of the same bytes.
    q: [u8; QK_K],
}

// get_scale_min_k4 (the kmask1/2/3 decoding of the kernels gives the same 6-bit values).
fn decode_q4k(blk: &[u8]) -> Q4Block {
    let d = f16::from_bits(u16::from_le_bytes([blk[0], blk[1]])).to_f32();
    let dmin = f16::from_bits(u16::from_le_bytes([blk[2], blk[3]])).to_f32();
    let s = &blk[4..16];
    let qs = &blk[16..144];
    let mut sc = [0i32; 8];
    let mut mn = [0i32; 8];
    for j in 0..8 {
        let (a, m) = if j < 4 {
            (s[j] & 63, s[j + 4] & 63)
        } else {
            (
                (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4),
                (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
            )
        };
        sc[j] = a as i32;
        mn[j] = m as i32;
    }
    let mut q = [0u8; QK_K];
    for j in 0..4 {
        for l in 0..32 {
            let b = qs[32 * j + l];
            q[64 * j + l] = b & 0xF;
            q[64 * j + 32 + l] = b >> 4;
        }
    }
    Q4Block { d, dmin, sc, mn, q }
}

/// `out[t*rows + r] = sum_i W[r, i] * x[t, i]` exactly as llama.cpp's CPU backend computes it for
/// a Q4_K weight held in the CPU_REPACK buffer (block_q4_Kx8 + Q8_K activations).
/// `w`: raw GGUF Q4_K bytes (rows × k/256 blocks of 144 bytes); `x`: n × k; `out`: n × rows.
pub fn q4k_repacked_matmul(w: &[u8], rows: usize, k: usize, x: &[f32], n: usize, out: &mut [f32]) {
    assert!(k.is_multiple_of(QK_K), "k must be a multiple of 256");
    assert!(
        rows.is_multiple_of(8),
        "CPU_REPACK Q4_K needs rows % 8 == 0"
    );
    let nb = k / QK_K;
    assert!(w.len() >= rows * nb * BLOCK_BYTES);
    assert!(x.len() >= n * k);
    assert!(out.len() >= n * rows);
    if n == 0 {
        return;
    }

    // forward_mul_mat: rows in full groups of 4 -> ggml_quantize_mat_q8_K_4x8, the rest ->
    // quantize_row_q8_K. forward_mul_mat_one_chunk: gemm iff nrows > 3 on those grouped rows.
    let n_gemm = n - n % 4;
    let acts: Vec<Vec<Q8Block>> = (0..n)
        .map(|t| {
            (0..nb)
                .map(|b| {
                    let xs = &x[t * k + b * QK_K..t * k + (b + 1) * QK_K];
                    if t < n_gemm {
                        quantize_q8k_4x8_row(xs)
                    } else {
                        quantize_q8k_ref(xs)
                    }
                })
                .collect()
        })
        .collect();

    let mut wrow: Vec<Q4Block> = Vec::with_capacity(nb);
    for r in 0..rows {
        wrow.clear();
        for b in 0..nb {
            let off = (r * nb + b) * BLOCK_BYTES;
            wrow.push(decode_q4k(&w[off..off + BLOCK_BYTES]));
        }
        for (t, act) in acts.iter().enumerate() {
            let mut acc = 0f32;
            let mut acc_min = 0f32;
            for (wb, ab) in wrow.iter().zip(act) {
                // per-sub-block integer dot products (maddubs/madd chains: exact)
                let mut dot = [0i32; 8];
                for (j, dj) in dot.iter_mut().enumerate() {
                    let qw = &wb.q[j * 32..j * 32 + 32];
                    let qa = &ab.qs[j * 32..j * 32 + 32];
                    *dj = qw.iter().zip(qa).map(|(&a, &b)| a as i32 * b as i32).sum();
                }
                if t < n_gemm {
                    // ggml_gemm_q4_K_8x8_q8_K: one FMA per pair of sub-blocks
                    let s_d = wb.d * ab.d; // _mm512_mul_ps(col_scale_f32, row_scale)
                    let s_m = wb.dmin * ab.d; // _mm512_mul_ps(col_dmin_f32, row_scale)
                    for sb in 0..4 {
                        let (j0, j1) = (2 * sb, 2 * sb + 1);
                        let isum = wb.sc[j0] * dot[j0] + wb.sc[j1] * dot[j1];
                        let imin = wb.mn[j0] * ab.bsum32[j0] + wb.mn[j1] * ab.bsum32[j1];
                        acc = (isum as f32).mul_add(s_d, acc);
                        acc_min = (imin as f32).mul_add(s_m, acc_min);
                    }
                } else {
                    // ggml_gemv_q4_K_8x8_q8_K: one FMA per super-block
                    let mut isum = 0i32;
                    let mut imin = 0i32;
                    for j in 0..8 {
                        isum += wb.sc[j] * dot[j];
                        imin += wb.mn[j] * ab.bsum32[j];
                    }
                    acc = (isum as f32).mul_add(wb.d * ab.d, acc);
                    acc_min = (imin as f32).mul_add(wb.dmin * ab.d, acc_min);
                }
            }
            // _mm512_sub_ps / _mm256_sub_ps(acc_rows, acc_min_rows)
            out[t * rows + r] = acc - acc_min;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self) -> u32 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (self.0 >> 33) as u32
        }
        fn unit(&mut self) -> f32 {
            (self.next() as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
        }
    }

    fn dequant_row(w: &[u8], r: usize, k: usize) -> Vec<f64> {
        let nb = k / QK_K;
        let mut v = Vec::with_capacity(k);
        for b in 0..nb {
            let off = (r * nb + b) * BLOCK_BYTES;
            let blk = decode_q4k(&w[off..off + BLOCK_BYTES]);
            for i in 0..QK_K {
                let j = i / 32;
                v.push(
                    blk.d as f64 * blk.sc[j] as f64 * blk.q[i] as f64
                        - blk.dmin as f64 * blk.mn[j] as f64,
                );
            }
        }
        v
    }

    #[test]
    fn close_to_dequantized_product() {
        let (rows, k) = (16usize, 512usize);
        let nb = k / QK_K;
        let mut rng = Lcg(12345);
        let mut w = vec![0u8; rows * nb * BLOCK_BYTES];
        for blk in w.chunks_mut(BLOCK_BYTES) {
            blk[0..2].copy_from_slice(
                &f16::from_f32(0.002 + 0.001 * rng.unit().abs())
                    .to_bits()
                    .to_le_bytes(),
            );
            blk[2..4].copy_from_slice(
                &f16::from_f32(0.001 + 0.001 * rng.unit().abs())
                    .to_bits()
                    .to_le_bytes(),
            );
            for b in blk[4..].iter_mut() {
                *b = rng.next() as u8;
            }
        }
        for &n in &[1usize, 3, 4, 6, 9] {
            let x: Vec<f32> = (0..n * k).map(|_| rng.unit()).collect();
            let mut out = vec![0f32; n * rows];
            q4k_repacked_matmul(&w, rows, k, &x, n, &mut out);
            for r in 0..rows {
                let wr = dequant_row(&w, r, k);
                let w2: f64 = wr.iter().map(|v| v * v).sum::<f64>();
                for t in 0..n {
                    let xt = &x[t * k..(t + 1) * k];
                    let exact: f64 = (0..k).map(|i| wr[i] * xt[i] as f64).sum();
                    let x2: f64 = xt.iter().map(|&v| v as f64 * v as f64).sum();
                    let got = out[t * rows + r] as f64;
                    // 8-bit activation quantization error, relative to the Cauchy-Schwarz scale
                    let scale = (w2 * x2).sqrt();
                    assert!(
                        (got - exact).abs() <= 1e-2 * scale,
                        "n={n} t={t} r={r}: got {got}, exact {exact}"
                    );
                }
            }
        }
    }
}
