//! Bit-exact scalar emulation of llama.cpp's CPU `ggml_compute_forward_mul_mat` for
//! src0 = Q6_K weights, src1 = f32 activations with n >= 8 rows, on an x86-64 build with
//! AVX512F/VL/DQ/VNNI (GCC 12, -O3 -march=native).
//!
//! Path taken by ggml (ggml/src/ggml-cpu):
//!   ggml-cpu.c  ggml_compute_forward_mul_mat -> ggml_compute_forward_mul_mat_tiled (tiled/tiled.cpp)
//!     ggml_tiled_supported: Q6_K, src0->extra == NULL (Q6_K is never repacked on x86), GGML_CPU_TILED_MM unset
//!     ggml_tiled_min_batch: src1->ne[1] >= 8
//!   -> tiled_matmul_dispatch<block_q6_K, SUBBLK=16, HAS_MIN=false, BIAS=32, ACTBIAS=true>
//!   -> ggml_compute_forward_mul_mat_tiled_driver: f32 activations -> Q8_K via quantize_row_q8_K
//!      (arch/x86/quants.c, which just calls quantize_row_q8_K_ref in ggml-quants.c; ggml-base is
//!      compiled WITHOUT -march=native, so no FMA contraction there)
//!   -> tiled_run_microtile -> tiled_run_micro_vnni_8x16<16,false,32,NK> (tiled/tiled-kernel.cpp,
//!      `#if __AVX512VNNI__ && __AVX512VL__ && __AVX512DQ__` branch wins over the AVX2 one).
//!
//! Arithmetic per (weight row r, token t), 256-element block b (K order b = 0,1,2,...):
//!   S_b   = sum_{s<16} scale_s * ( sum_{e in subblock s} q6_e * q8_e  -  32 * bsum_s )   (exact i32)
//!   res_b = (S_b as f32) * d_w(b)                    (vcvtdq2ps, vmulps)
//!   acc   = fma(res_b, d_x(b), acc), acc starts at +0 (vfmadd213ps: GCC contracted the
//!                                                     _mm512_add_ps(buf, _mm512_mul_ps(res, d1)))
//! Thread count / chunking / narrow-vs-standard tile path only change which (r, t) pairs are
//! computed where, never this per-output arithmetic (checked: 1..4 threads give identical bits).

use half::f16;

use super::quant::{quantize_row_q8_k, BlockQ8K, QK_K};

/// bytes per block_q6_K: ql[128], qh[64], scales[16] (i8), d (f16)
const Q6K_BLOCK_BYTES: usize = 210;

/// One Q6_K block unpacked as in tiled.cpp `tiled_unpack_src0(const block_q6_K *...)`:
/// 6-bit unsigned codes 0..63 in natural element order, 16 int8 scales, d widened to f32.
struct Q6Unpacked {
    q: [u8; QK_K],
    scales: [i32; 16],
    d: f32,
}

// tiled.cpp tiled_unpack_src0(block_q6_K): per 128-half, lanes
// [ql lo(0:32)|qh>>0] [ql[32:64] lo|qh>>2] [ql hi(0:32)|qh>>4] [ql[32:64] hi|qh>>6]
fn unpack_q6k(blk: &[u8]) -> Q6Unpacked {
    let ql = &blk[0..128];
    let qh = &blk[128..192];
    let sc = &blk[192..208];
    let d = f16::from_bits(u16::from_le_bytes([blk[208], blk[209]])).to_f32();
    let mut q = [0u8; QK_K];
    for half in 0..2 {
        let out = &mut q[128 * half..128 * half + 128];
        let ql = &ql[64 * half..64 * half + 64];
        let qh = &qh[32 * half..32 * half + 32];
        for l in 0..32 {
            out[l] = (ql[l] & 0xF) | ((qh[l] & 3) << 4);
            out[l + 32] = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
            out[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
            out[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
        }
    }
    let mut scales = [0i32; 16];
    for s in 0..16 {
        scales[s] = sc[s] as i8 as i32;
    }
    Q6Unpacked { q, scales, d }
}

// tiled-kernel.cpp tiled_run_micro_vnni_8x16<16,false,32,NK>, integer part for one (row, token, slab):
//   acc16 = dpbusd(u8 weight codes, i8 activation codes) over the 16-element subblock (exact),
//   rawi = acc16 - 32*bsums; s1_acc += rawi * scales[s]   (vpsubd / vpmulld / vpaddd, exact i32)
#[inline]
fn block_int_dot(wb: &Q6Unpacked, xb: &BlockQ8K) -> i32 {
    let mut s1: i32 = 0;
    for s in 0..16 {
        let mut raw: i32 = 0;
        for e in 16 * s..16 * s + 16 {
            raw += wb.q[e] as i32 * xb.qs[e] as i32;
        }
        let rawi = raw - 32 * xb.bsums[s] as i32;
        s1 = s1.wrapping_add(rawi.wrapping_mul(wb.scales[s]));
    }
    s1
}

/// Q6_K [rows x k] weights (raw GGUF bytes) times f32 activations x [n x k] (row-major),
/// out[t*rows + r] = sum_k W[r,k] * x[t,k], bit-exact with llama.cpp's tiled CPU path
/// (n >= 8; for n < 8 ggml uses the vec_dot path instead, which this does NOT emulate).
pub fn q6k_tiled_matmul(w: &[u8], rows: usize, k: usize, x: &[f32], n: usize, out: &mut [f32]) {
    assert!(k.is_multiple_of(QK_K), "k must be a multiple of 256");
    let nb = k / QK_K;
    assert!(w.len() >= rows * nb * Q6K_BLOCK_BYTES);
    assert!(x.len() >= n * k);
    assert!(out.len() >= n * rows);

    // driver: from_float(src1 row) -> wdata (block-wise, so the per-thread split is irrelevant)
    let xq: Vec<Vec<BlockQ8K>> = (0..n)
        .map(|t| quantize_row_q8_k(&x[t * k..(t + 1) * k]))
        .collect();

    for r in 0..rows {
        let wrow = &w[r * nb * Q6K_BLOCK_BYTES..(r + 1) * nb * Q6K_BLOCK_BYTES];
        let wblocks: Vec<Q6Unpacked> = wrow.chunks_exact(Q6K_BLOCK_BYTES).map(unpack_q6k).collect();
        for t in 0..n {
            // one_chunk: ws->acc zeroed once per macrotile (memset -> +0.0)
            let mut acc = 0.0f32;
            // K blocks visited in increasing order in both the standard (ib loop) and narrow
            // (k0 / slab loops) paths
            for b in 0..nb {
                let xb = &xq[t][b];
                let s1 = block_int_dot(&wblocks[b], xb);
                // epilogue: f1 = _mm512_cvtepi32_ps(s1_acc); result = f1 * d0 (vmulps)
                let result = (s1 as f32) * wblocks[b].d;
                // buf += result * d1  -> compiled as vfmadd213ps (fused, one rounding)
                acc = result.mul_add(xb.d, acc);
            }
            // tiled_store_window: plain copy
            out[t * rows + r] = acc;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn unif(&mut self) -> f32 {
            (self.next() >> 40) as f32 / (1u64 << 24) as f32
        }
        fn sym(&mut self) -> f32 {
            self.unif() * 2.0 - 1.0
        }
    }

    // plain reference dequantization (ggml-quants.c dequantize_row_q6_K)
    fn dequant_q6k(blk: &[u8]) -> Vec<f64> {
        let ql = &blk[0..128];
        let qh = &blk[128..192];
        let sc = &blk[192..208];
        let d = f16::from_bits(u16::from_le_bytes([blk[208], blk[209]])).to_f32() as f64;
        let mut y = vec![0f64; 256];
        for h in 0..2 {
            for l in 0..32 {
                let is = l / 16;
                let q1 = ((ql[64 * h + l] & 0xF) | ((qh[32 * h + l] & 3) << 4)) as i32 - 32;
                let q2 =
                    ((ql[64 * h + l + 32] & 0xF) | (((qh[32 * h + l] >> 2) & 3) << 4)) as i32 - 32;
                let q3 = ((ql[64 * h + l] >> 4) | (((qh[32 * h + l] >> 4) & 3) << 4)) as i32 - 32;
                let q4 =
                    ((ql[64 * h + l + 32] >> 4) | (((qh[32 * h + l] >> 6) & 3) << 4)) as i32 - 32;
                let s = |i: usize| sc[8 * h + i] as i8 as f64;
                y[128 * h + l] = d * s(is) * q1 as f64;
                y[128 * h + l + 32] = d * s(is + 2) * q2 as f64;
                y[128 * h + l + 64] = d * s(is + 4) * q3 as f64;
                y[128 * h + l + 96] = d * s(is + 6) * q4 as f64;
            }
        }
        y
    }

    fn random_q6k(rng: &mut Rng, rows: usize, k: usize) -> Vec<u8> {
        let mut w = Vec::with_capacity(rows * k / 256 * Q6K_BLOCK_BYTES);
        for _ in 0..rows * k / 256 {
            for _ in 0..192 {
                w.push(rng.next() as u8);
            }
            for _ in 0..16 {
                w.push((rng.next() % 255) as u8); // i8 scales, avoid -128
            }
            let d = f16::from_f32(0.001 + 0.002 * rng.unif());
            w.extend_from_slice(&d.to_bits().to_le_bytes());
        }
        w
    }

    #[test]
    fn close_to_dequantized_f64_dot() {
        let mut rng = Rng(0x1234_5678_9abc_def1);
        let (rows, k, n) = (32, 512, 9);
        let w = random_q6k(&mut rng, rows, k);
        let x: Vec<f32> = (0..n * k).map(|_| rng.sym()).collect();
        let mut out = vec![0f32; n * rows];
        q6k_tiled_matmul(&w, rows, k, &x, n, &mut out);
        for r in 0..rows {
            let wd: Vec<f64> = w[r * 2 * 210..(r + 1) * 2 * 210]
                .chunks_exact(210)
                .flat_map(dequant_q6k)
                .collect();
            for t in 0..n {
                let refv: f64 = (0..k).map(|i| wd[i] * x[t * k + i] as f64).sum();
                let norm: f64 = (0..k).map(|i| (wd[i] * x[t * k + i] as f64).abs()).sum();
                let got = out[t * rows + r] as f64;
                // q8 activation rounding error is ~1/254 of max|x| per element -> bound relative to the L1 norm
                assert!(
                    (got - refv).abs() <= 1e-2 * norm.max(1e-6),
                    "r={r} t={t} got={got} ref={refv} norm={norm}"
                );
            }
        }
    }

    #[test]
    fn q8k_quantize_basic() {
        let mut x = vec![0f32; 256];
        x[3] = -2.0;
        x[10] = 1.0;
        let q = quantize_row_q8_k(&x);
        // iscale = -127 / max = -127 / -2 = 63.5
        assert_eq!(q[0].qs[3], -127);
        assert_eq!(q[0].qs[10], 64); // 63.5 rounds half to even
        assert_eq!(q[0].d, 1.0f32 / 63.5f32);
        assert_eq!(q[0].bsums[0], -127 + 64);
        let z = quantize_row_q8_k(&[0f32; 256]);
        assert_eq!(z[0].d, 0.0);
    }
}
