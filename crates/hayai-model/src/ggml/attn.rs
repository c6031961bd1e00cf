//! ggml's attention arithmetic without flash attention (x86, AVX-512 build): the two f16 dot
//! products (`tinyBLAS` for a batch of two or more tokens, `ggml_vec_dot_f16` for one), the
//! vectorized `exp` and the softmax row.

use super::quant::reduce16;

#[inline]
fn h(x: u16) -> f32 {
    super::quant::f16_to_f32(x)
}

/// `tinyBLAS<16, __m512, __m512, ggml_fp16_t, ggml_fp16_t, float>`: one accumulator of 16
/// lanes, element `i` into lane `i % 16` by FMA, then `_mm512_reduce_add_ps`. `k % 16 == 0`.
pub fn dot_f16_tinyblas(a: &[u16], b: &[u16]) -> f32 {
    debug_assert_eq!(a.len() % 16, 0);
    let mut acc = [0f32; 16];
    for (ca, cb) in a.chunks_exact(16).zip(b.chunks_exact(16)) {
        for l in 0..16 {
            acc[l] = h(ca[l]).mul_add(h(cb[l]), acc[l]);
        }
    }
    reduce16(&acc)
}

/// `ggml_vec_dot_f16` (AVX-512 without FP16 arithmetic): four 16-lane accumulators over
/// 64-element steps, reduced (0+2, 1+3, then 0+1, then across lanes) into a double; the tail
/// adds each f32 product into that double.
pub fn dot_f16_vec(a: &[u16], b: &[u16]) -> f32 {
    let n = a.len();
    let np = n & !63;
    let mut acc = [[0f32; 16]; 4];
    for i in (0..np).step_by(64) {
        for (j, accj) in acc.iter_mut().enumerate() {
            for l in 0..16 {
                let e = i + 16 * j + l;
                accj[l] = h(a[e]).mul_add(h(b[e]), accj[l]);
            }
        }
    }
    let mut x0 = [0f32; 16];
    for l in 0..16 {
        let s02 = acc[0][l] + acc[2][l];
        let s13 = acc[1][l] + acc[3][l];
        x0[l] = s02 + s13;
    }
    let mut sumf = reduce16(&x0) as f64;
    for e in np..n {
        sumf += (h(a[e]) * h(b[e])) as f64;
    }
    sumf as f32
}

/// `ggml_v_expf(__m512)` for one lane.
pub fn v_expf(x: f32) -> f32 {
    let c = f32::from_bits;
    let r = c(0x4b40_0000); // 0x1.8p23
    let z = x.mul_add(c(0x3fb8_aa3b), r);
    let n = z - r;
    let b = (-n).mul_add(c(0x35bf_be8e), (-n).mul_add(c(0x3f31_7200), x));
    let u = b * b;
    let j = c(0x3c07_2010)
        .mul_add(b, c(0x3d2b_9f17))
        .mul_add(u, c(0x3e2a_af33).mul_add(b, c(0x3eff_fedb)))
        .mul_add(u, c(0x3f7f_fff6).mul_add(b, 1.0));
    if n.abs() > 192.0 {
        // The blend for lanes out of range (NaN never reaches here from a softmax row).
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    // `_mm512_scalef_ps(j, n)`: j * 2^n with one rounding (n is integral here).
    ((j as f64) * 2f64.powi(n as i32)) as f32
}

/// One row of `ggml_compute_forward_soft_max_f32` with scale 1 and an additive mask (0 or
/// -inf): max, then `ggml_vec_soft_max_f32` (16 lanes of `v_expf`, each group's reduced sum
/// added into a double), then every value times `(float)(1/sum)`.
pub fn soft_max_row(x: &mut [f32], mask: &[f32]) {
    for (v, &m) in x.iter_mut().zip(mask) {
        *v += m;
    }
    let max = x.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let n = x.len();
    let mut sum = 0f64;
    let mut i = 0;
    while i + 15 < n {
        let mut val = [0f32; 16];
        for l in 0..16 {
            val[l] = v_expf(x[i + l] - max);
            x[i + l] = val[l];
        }
        sum += reduce16(&val) as f64;
        i += 16;
    }
    for v in &mut x[i..] {
        let e = (*v - max).exp();
        sum += e as f64;
        *v = e;
    }
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v_expf_is_close_to_exp_and_exact_at_zero() {
        assert_eq!(v_expf(0.0), 1.0);
        assert_eq!(v_expf(f32::NEG_INFINITY), 0.0);
        for i in 0..200 {
            let x = -20.0 + i as f32 * 0.1;
            let (got, want) = (v_expf(x), x.exp());
            assert!(((got - want) / want).abs() < 4e-7, "{x}: {got} vs {want}");
        }
    }

    #[test]
    fn softmax_rows_sum_to_one_and_masked_entries_are_zero() {
        let mut x: Vec<f32> = (0..40).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let mut mask = vec![0f32; 40];
        mask[5] = f32::NEG_INFINITY;
        soft_max_row(&mut x, &mask);
        assert_eq!(x[5], 0.0);
        let s: f32 = x.iter().sum();
        assert!((s - 1.0).abs() < 1e-5);
    }

    #[test]
    fn the_two_f16_dots_agree_closely_but_sum_in_different_orders() {
        let a: Vec<u16> = (0..256)
            .map(|i| half::f16::from_f32(((i * 37 % 101) as f32 - 50.0) * 0.013).to_bits())
            .collect();
        let b: Vec<u16> = (0..256)
            .map(|i| half::f16::from_f32(((i * 53 % 97) as f32 - 48.0) * 0.021).to_bits())
            .collect();
        let exact: f64 = a
            .iter()
            .zip(&b)
            .map(|(&x, &y)| h(x) as f64 * h(y) as f64)
            .sum();
        let t = dot_f16_tinyblas(&a, &b) as f64;
        let v = dot_f16_vec(&a, &b) as f64;
        assert!(
            (t - exact).abs() < 1e-4 && (v - exact).abs() < 1e-4,
            "{t} {v} {exact}"
        );
    }
}
