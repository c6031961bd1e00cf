//! Dot products, vectorized where the CPU allows. One fixed summation order per build and CPU
//! (eight independent lanes, combined pairwise) so results are reproducible run to run.

#[inline(always)]
fn dot_lanes(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f32; 8];
    let chunks = n / 8;
    for i in 0..chunks {
        let (x, y) = (&a[i * 8..i * 8 + 8], &b[i * 8..i * 8 + 8]);
        for l in 0..8 {
            acc[l] = x[l].mul_add(y[l], acc[l]);
        }
    }
    let mut tail = 0.0f32;
    for i in chunks * 8..n {
        tail = a[i].mul_add(b[i], tail);
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

#[inline(always)]
fn dot_bf16_lanes(a: &[u16], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f32; 8];
    let chunks = n / 8;
    for i in 0..chunks {
        let (x, y) = (&a[i * 8..i * 8 + 8], &b[i * 8..i * 8 + 8]);
        for l in 0..8 {
            let w = f32::from_bits((x[l] as u32) << 16);
            acc[l] = w.mul_add(y[l], acc[l]);
        }
    }
    let mut tail = 0.0f32;
    for i in chunks * 8..n {
        tail = f32::from_bits((a[i] as u32) << 16).mul_add(b[i], tail);
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
        super::dot_lanes(a, b)
    }
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_bf16(a: &[u16], b: &[f32]) -> f32 {
        super::dot_bf16_lanes(a, b)
    }
    pub fn has_avx2() -> bool {
        use std::sync::OnceLock;
        static HAS: OnceLock<bool> = OnceLock::new();
        *HAS.get_or_init(|| is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"))
    }
}

/// `sum(a[i] * b[i])` over the shorter length.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if x86::has_avx2() {
        // SAFETY: the CPU supports the features the function was compiled for.
        return unsafe { x86::dot(a, b) };
    }
    dot_lanes(a, b)
}

/// Dot product of bf16 bit patterns with f32 values.
pub fn dot_bf16(a: &[u16], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if x86::has_avx2() {
        // SAFETY: as above.
        return unsafe { x86::dot_bf16(a, b) };
    }
    dot_bf16_lanes(a, b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_matches_f64_reference() {
        for n in [0usize, 1, 7, 8, 9, 63, 640, 1001] {
            let a: Vec<f32> = (0..n)
                .map(|i| ((i * 7919) % 97) as f32 / 13.0 - 3.0)
                .collect();
            let b: Vec<f32> = (0..n)
                .map(|i| ((i * 104729) % 89) as f32 / 11.0 - 4.0)
                .collect();
            let want: f64 = a.iter().zip(&b).map(|(&x, &y)| x as f64 * y as f64).sum();
            let got = dot(&a, &b) as f64;
            assert!(
                (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                "n={n}: {got} vs {want}"
            );
            let a16: Vec<u16> = a
                .iter()
                .map(|&x| half::bf16::from_f32(x).to_bits())
                .collect();
            let want16: f64 = a16
                .iter()
                .zip(&b)
                .map(|(&x, &y)| half::bf16::from_bits(x).to_f32() as f64 * y as f64)
                .sum();
            let got16 = dot_bf16(&a16, &b) as f64;
            assert!((got16 - want16).abs() <= 1e-4 * (1.0 + want16.abs()));
        }
    }
}

/// `out[i][j] = dot(w[i], x[j])` for 3 weight rows and 4 inputs of length `n` (a register
/// tile: each loaded weight and input vector feeds several independent FMA chains).
pub fn tile_3x4(w: [&[f32]; 3], x: [&[f32]; 4], n: usize) -> [[f32; 4]; 3] {
    #[cfg(target_arch = "x86_64")]
    if x86::has_avx2() {
        // SAFETY: the CPU supports AVX2 and FMA; slices are at least `n` long (checked).
        assert!(w.iter().all(|r| r.len() >= n) && x.iter().all(|r| r.len() >= n));
        return unsafe { tile_avx2(w, x, n) };
    }
    let mut out = [[0.0f32; 4]; 3];
    for i in 0..3 {
        for j in 0..4 {
            out[i][j] = dot_lanes(&w[i][..n], &x[j][..n]);
        }
    }
    out
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2(w: [&[f32]; 3], x: [&[f32]; 4], n: usize) -> [[f32; 4]; 3] {
    use std::arch::x86_64::*;
    let mut acc = [[_mm256_setzero_ps(); 4]; 3];
    let chunks = n / 8;
    for c in 0..chunks {
        let o = c * 8;
        let w0 = _mm256_loadu_ps(w[0].as_ptr().add(o));
        let w1 = _mm256_loadu_ps(w[1].as_ptr().add(o));
        let w2 = _mm256_loadu_ps(w[2].as_ptr().add(o));
        for j in 0..4 {
            let xj = _mm256_loadu_ps(x[j].as_ptr().add(o));
            acc[0][j] = _mm256_fmadd_ps(w0, xj, acc[0][j]);
            acc[1][j] = _mm256_fmadd_ps(w1, xj, acc[1][j]);
            acc[2][j] = _mm256_fmadd_ps(w2, xj, acc[2][j]);
        }
    }
    let mut out = [[0.0f32; 4]; 3];
    for i in 0..3 {
        for j in 0..4 {
            let mut lanes = [0.0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), acc[i][j]);
            let mut s = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5]))
                + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
            for k in chunks * 8..n {
                s = w[i][k].mul_add(x[j][k], s);
            }
            out[i][j] = s;
        }
    }
    out
}

#[cfg(test)]
mod tile_tests {
    use super::*;

    #[test]
    fn tile_matches_dot() {
        for n in [5usize, 8, 64, 641] {
            let rows: Vec<Vec<f32>> = (0..7)
                .map(|r| {
                    (0..n)
                        .map(|i| ((i * 31 + r * 7) % 23) as f32 / 7.0 - 1.5)
                        .collect()
                })
                .collect();
            let t = tile_3x4(
                [&rows[0], &rows[1], &rows[2]],
                [&rows[3], &rows[4], &rows[5], &rows[6]],
                n,
            );
            for i in 0..3 {
                for j in 0..4 {
                    let want = dot(&rows[i], &rows[3 + j]);
                    assert!((t[i][j] - want).abs() <= 1e-4 * (1.0 + want.abs()));
                }
            }
        }
    }
}
