//! Activation quantization and the quantized dot products of llama.cpp's x86 CPU backend, in
//! scalar code with ggml's exact float order. Integer parts are exact whatever the order; what
//! is reproduced is which integers meet in which SIMD lane and the order of every float rounding.

#[cfg(test)]
use half::f16;

/// f16 bits to f32 and f32 to f16 bits with round to nearest even (`GGML_CPU_FP32_TO_FP16` is
/// F16C's `vcvtps2ph`, which rounds the same way).
pub use hayai_core::convert::{f16_to_f32, f32_to_f16};

pub const QK8_0: usize = 32;
pub const QK_K: usize = 256;

/// The horizontal sum of an `__m256` (`hsum_float_8` in quants, `hsum(__m256)` in tinyBLAS):
/// upper half onto the lower, then halves again.
#[inline]
pub fn hsum8(v: &[f32; 8]) -> f32 {
    let a = [v[4] + v[0], v[5] + v[1], v[6] + v[2], v[7] + v[3]];
    let b0 = a[0] + a[2];
    let b1 = a[1] + a[3];
    b0 + b1
}

/// GCC's `_mm512_reduce_add_ps`: 256-bit halves, then 128-bit halves, then lanes {0,1}+{2,3}.
#[inline]
pub fn reduce16(v: &[f32; 16]) -> f32 {
    let mut a = [0f32; 8];
    for i in 0..8 {
        a[i] = v[i + 8] + v[i];
    }
    let b = [a[4] + a[0], a[5] + a[1], a[6] + a[2], a[7] + a[3]];
    let c0 = b[0] + b[2];
    let c1 = b[1] + b[3];
    c0 + c1
}

/// One `block_q8_0` of activations: `d` as stored (f16 bits) and 32 signed values.
#[derive(Clone, Copy)]
pub struct BlockQ8_0 {
    pub d: u16,
    pub qs: [i8; QK8_0],
}

/// `quantize_row_q8_0` (x86 AVX2 branch): max |x| per block, `d = max/127` stored as f16, values
/// `round_half_even(x * (127/max))`.
pub fn quantize_row_q8_0(x: &[f32]) -> Vec<BlockQ8_0> {
    assert_eq!(x.len() % QK8_0, 0);
    x.chunks_exact(QK8_0)
        .map(|c| {
            let max = c.iter().fold(0f32, |m, &v| m.max(v.abs()));
            let d = max / 127.0;
            let id = if max != 0.0 { 127.0 / max } else { 0.0 };
            let mut qs = [0i8; QK8_0];
            for (q, &v) in qs.iter_mut().zip(c) {
                *q = (v * id).round_ties_even() as i8;
            }
            BlockQ8_0 {
                d: f32_to_f16(d),
                qs,
            }
        })
        .collect()
}

/// One `block_q8_K`: f32 scale, 256 values, sums of each 16.
#[derive(Clone, Copy)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; QK_K],
    pub bsums: [i16; QK_K / 16],
}

/// ggml's `nearest_int`: the 1.5*2^23 trick (round half to even).
#[inline]
pub fn nearest_int(v: f32) -> i32 {
    let val = v + 12582912.0;
    (val.to_bits() as i32 & 0x007f_ffff) - 0x0040_0000
}

/// `quantize_row_q8_K_ref` (what x86 uses): the signed value of largest magnitude sets
/// `iscale = -127/max`; `d = 1/iscale`.
pub fn quantize_row_q8_k(x: &[f32]) -> Vec<BlockQ8K> {
    assert_eq!(x.len() % QK_K, 0);
    x.chunks_exact(QK_K)
        .map(|c| {
            let (mut max, mut amax) = (0f32, 0f32);
            for &v in c {
                if v.abs() > amax {
                    amax = v.abs();
                    max = v;
                }
            }
            let mut b = BlockQ8K {
                d: 0.0,
                qs: [0; QK_K],
                bsums: [0; QK_K / 16],
            };
            if amax == 0.0 {
                return b;
            }
            let iscale = -127.0 / max;
            for (q, &v) in b.qs.iter_mut().zip(c) {
                *q = nearest_int(iscale * v).min(127) as i8;
            }
            for j in 0..QK_K / 16 {
                b.bsums[j] = b.qs[j * 16..(j + 1) * 16].iter().map(|&q| q as i16).sum();
            }
            b.d = 1.0 / iscale;
            b
        })
        .collect()
}

/// Weight blocks whose activations are Q8_0 (`vec_dot_type == Q8_0`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Q0Kind {
    Q5_0,
    Q8_0,
}

impl Q0Kind {
    pub fn block_bytes(self) -> usize {
        match self {
            Q0Kind::Q5_0 => 22,
            Q0Kind::Q8_0 => 34,
        }
    }

    /// The block's scale (f16 bits) and its 32 signed values in element order.
    #[inline]
    fn unpack(self, b: &[u8], out: &mut [i8; 32]) -> u16 {
        let d = u16::from_le_bytes([b[0], b[1]]);
        match self {
            Q0Kind::Q8_0 => {
                for (o, &v) in out.iter_mut().zip(&b[2..34]) {
                    *o = v as i8;
                }
            }
            Q0Kind::Q5_0 => {
                let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
                let qs = &b[6..22];
                for j in 0..16 {
                    let lo = (qs[j] & 0x0f) | ((((qh >> j) & 1) as u8) << 4);
                    let hi = (qs[j] >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
                    out[j] = lo as i8 - 16;
                    out[j + 16] = hi as i8 - 16;
                }
            }
        }
        d
    }
}

/// One output of a Q5_0/Q8_0 weight row against Q8_0 activations. Both ggml paths give this
/// value: `ggml_vec_dot_q{5,8}_0_q8_0` (one token) and `tinyBLAS_Q0_AVX` (a batch) keep eight
/// lanes of four consecutive products each, add `d_w*d_x * lane` with one FMA per block, and
/// finish with the same horizontal sum.
pub fn dot_q0(kind: Q0Kind, row: &[u8], x: &[BlockQ8_0]) -> f32 {
    let bb = kind.block_bytes();
    let mut acc = [0f32; 8];
    let mut w = [0i8; 32];
    for (ib, xb) in x.iter().enumerate() {
        let wd = kind.unpack(&row[ib * bb..(ib + 1) * bb], &mut w);
        let d = f16_to_f32(wd) * f16_to_f32(xb.d);
        for (l, a) in acc.iter_mut().enumerate() {
            let mut s = 0i32;
            for e in 4 * l..4 * l + 4 {
                s += w[e] as i32 * xb.qs[e] as i32;
            }
            *a = d.mul_add(s as f32, *a);
        }
    }
    hsum8(&acc)
}

/// One output of a Q6_K weight row against Q8_K activations: `ggml_vec_dot_q6_K_q8_K`'s AVX2
/// branch. Lane `n` of a super-block holds, for each 32-element chunk, `scale * sum(q*y)` over
/// the chunk's elements `4n..4n+4` (q unsigned 0..63), minus `32 * (bsum*scale)` of the scale
/// pair `2n, 2n+1`; then one FMA per super-block.
pub fn dot_q6k(row: &[u8], x: &[BlockQ8K]) -> f32 {
    const BB: usize = 210;
    let mut acc = [0f32; 8];
    for (i, y) in x.iter().enumerate() {
        let b = &row[i * BB..(i + 1) * BB];
        let (ql, qh, sc) = (&b[0..128], &b[128..192], &b[192..208]);
        let d = y.d * f16_to_f32(u16::from_le_bytes([b[208], b[209]]));
        // Unsigned 6-bit values in element order (ggml's layout: two 128-element halves).
        let mut q = [0i32; QK_K];
        for h in 0..2 {
            let (ql, qh) = (&ql[64 * h..64 * h + 64], &qh[32 * h..32 * h + 32]);
            for l in 0..32 {
                q[128 * h + l] = ((ql[l] & 0xf) | ((qh[l] & 3) << 4)) as i32;
                q[128 * h + l + 32] = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) as i32;
                q[128 * h + l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32;
                q[128 * h + l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32;
            }
        }
        let mut lanes = [0i32; 8];
        for chunk in 0..8 {
            for (n, lane) in lanes.iter_mut().enumerate() {
                for e in 32 * chunk + 4 * n..32 * chunk + 4 * n + 4 {
                    *lane += (sc[e / 16] as i8) as i32 * q[e] * y.qs[e] as i32;
                }
            }
        }
        for (n, lane) in lanes.iter_mut().enumerate() {
            let sub = y.bsums[2 * n] as i32 * (sc[2 * n] as i8) as i32
                + y.bsums[2 * n + 1] as i32 * (sc[2 * n + 1] as i8) as i32;
            *lane -= sub << 5;
            acc[n] = d.mul_add(*lane as f32, acc[n]);
        }
    }
    hsum8(&acc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reductions_follow_the_pairwise_halving_order() {
        // Values chosen so a left-to-right sum differs from the halving order.
        let v8 = [1e8f32, 1.0, -1e8, 1.0, 1.0, 1.0, 1.0, 1.0];
        // a = [1e8+1, 2, -1e8+1, 2]; b0 = (1e8+1) + (-1e8+1) = 0 (1e8+1 rounds to 1e8) ...
        let left_to_right = v8.iter().fold(0f32, |s, &x| s + x);
        assert_ne!(hsum8(&v8), left_to_right);
        assert_eq!(hsum8(&v8), 4.0 + 0.0);
        let mut v16 = [0f32; 16];
        v16[0] = 1.0;
        v16[8] = 2.0;
        v16[15] = 3.0;
        assert_eq!(reduce16(&v16), 6.0);
    }

    #[test]
    fn nearest_int_rounds_half_to_even() {
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(3.5), 4);
        assert_eq!(nearest_int(-2.5), -2);
        assert_eq!(nearest_int(-0.4), 0);
    }

    #[test]
    fn q8_0_quantization_scales_by_the_block_maximum() {
        let x: Vec<f32> = (0..32).map(|i| (i as f32 - 10.0) * 0.25).collect();
        let b = quantize_row_q8_0(&x)[0];
        assert_eq!(b.qs[31], 127);
        assert_eq!(f16_to_f32(b.d), f16::from_f32(5.25 / 127.0).to_f32());
        // A half-way product rounds to even: x = 0.5 * max/127 ... check the zero element.
        assert_eq!(b.qs[10], 0);
    }

    #[test]
    fn q6k_dot_matches_a_plain_dequantized_dot() {
        // One super-block with varied values.
        let mut blk = vec![0u8; 210];
        for (i, b) in blk.iter_mut().enumerate().take(192) {
            *b = (i as u8).wrapping_mul(37).wrapping_add(11);
        }
        for j in 0..16 {
            blk[192 + j] = (j as i8 - 8) as u8;
        }
        let d = f16::from_f32(0.01).to_bits().to_le_bytes();
        blk[208] = d[0];
        blk[209] = d[1];
        let x: Vec<f32> = (0..256)
            .map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.1)
            .collect();
        let y = quantize_row_q8_k(&x);
        let got = dot_q6k(&blk, &y);
        // Reference: dequantize both sides.
        let (ql, qh, sc) = (&blk[0..128], &blk[128..192], &blk[192..208]);
        let mut want = 0f64;
        for h in 0..2 {
            for l in 0..32 {
                let vals = [
                    (ql[64 * h + l] & 0xf) | ((qh[32 * h + l] & 3) << 4),
                    (ql[64 * h + l + 32] & 0xf) | (((qh[32 * h + l] >> 2) & 3) << 4),
                    (ql[64 * h + l] >> 4) | (((qh[32 * h + l] >> 4) & 3) << 4),
                    (ql[64 * h + l + 32] >> 4) | (((qh[32 * h + l] >> 6) & 3) << 4),
                ];
                for (k, &v) in vals.iter().enumerate() {
                    let e = 128 * h + l + 32 * k;
                    want += 0.01f64
                        * (sc[e / 16] as i8) as f64
                        * (v as f64 - 32.0)
                        * (y[0].qs[e] as f64 * y[0].d as f64);
                }
            }
        }
        assert!(
            (got as f64 - want).abs() < 1e-3 * want.abs().max(1.0),
            "{got} vs {want}"
        );
    }
}
