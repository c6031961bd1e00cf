//! Elementwise and per-row operations of the reference forward, in f32.

/// `out = x * (mean(x^2) + eps)^-0.5 * w` (the weight is the effective multiplier; pass
/// `None` for a weightless norm). The mean is accumulated in f64.
pub fn rms_norm(x: &[f32], w: Option<&[f32]>, eps: f32, out: &mut [f32]) {
    let r = rms_scale(x, eps);
    match w {
        Some(w) => {
            for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
                *o = v * r * g;
            }
        }
        None => {
            for (o, &v) in out.iter_mut().zip(x) {
                *o = v * r;
            }
        }
    }
}

/// The RMS norm's factor `(mean(x^2) + eps)^-0.5`, the mean accumulated in f64.
pub fn rms_scale(x: &[f32], eps: f32) -> f32 {
    let ms = x.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>() / x.len() as f64;
    1.0 / ((ms as f32) + eps).sqrt()
}

/// In-place RMSNorm of each `dim`-wide slice of `x`.
pub fn rms_norm_rows(x: &mut [f32], dim: usize, w: Option<&[f32]>, eps: f32) {
    let mut tmp = vec![0.0f32; dim];
    for row in x.chunks_exact_mut(dim) {
        rms_norm(row, w, eps, &mut tmp);
        row.copy_from_slice(&tmp);
    }
}

/// GELU, tanh approximation (`gelu_pytorch_tanh`).
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    const C: f32 = 0.797_884_6; // sqrt(2/pi)
    0.5 * x * (1.0 + (C * (x + 0.044715 * x * x * x)).tanh())
}

/// `cap * tanh(x / cap)`.
#[inline]
pub fn softcap(x: f32, cap: f32) -> f32 {
    cap * (x / cap).tanh()
}

/// Rotate-half RoPE of one head in place: pairs `(i, i + d/2)` rotate by `pos * inv_freq[i]`.
pub fn rope(x: &mut [f32], pos: usize, inv_freq: &[f32]) {
    let half = x.len() / 2;
    for (i, &f) in inv_freq.iter().enumerate().take(half) {
        if f == 0.0 {
            continue;
        }
        let a = pos as f32 * f;
        let (s, c) = a.sin_cos();
        let (x0, x1) = (x[i], x[i + half]);
        x[i] = x0 * c - x1 * s;
        x[i + half] = x1 * c + x0 * s;
    }
}

/// Softmax-weighted attention of one query head over `keys`/`values` rows selected by
/// `range` (positions in the cache), K/V stored `[pos][kv_heads][head_dim]`.
#[allow(clippy::too_many_arguments)]
pub fn attend(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    kv_heads: usize,
    kv_head: usize,
    range: std::ops::Range<usize>,
    scale: f32,
    softcap_at: Option<f32>,
    out: &mut [f32],
) {
    let d = q.len();
    let stride = kv_heads * d;
    let mut scores: Vec<f32> = range
        .clone()
        .map(|j| {
            let k = &k_cache[j * stride + kv_head * d..j * stride + kv_head * d + d];
            let s = super::simd::dot(q, k) * scale;
            match softcap_at {
                Some(c) => softcap(s, c),
                None => s,
            }
        })
        .collect();
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f64;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        sum += *s as f64;
    }
    let inv = (1.0 / sum) as f32;
    out.iter_mut().for_each(|o| *o = 0.0);
    for (s, j) in scores.iter().zip(range) {
        let p = s * inv;
        let v = &v_cache[j * stride + kv_head * d..j * stride + kv_head * d + d];
        for (o, &vv) in out.iter_mut().zip(v) {
            *o = p.mul_add(vv, *o);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_unit_rms() {
        let x = [3.0f32, -4.0, 0.0, 0.0];
        let mut y = [0.0; 4];
        rms_norm(&x, None, 0.0, &mut y);
        let rms = (y.iter().map(|v| v * v).sum::<f32>() / 4.0).sqrt();
        assert!((rms - 1.0).abs() < 1e-6);
        rms_norm(&x, Some(&[2.0, 2.0, 2.0, 2.0]), 0.0, &mut y);
        assert!((y[0] - 2.0 * 3.0 / 2.5).abs() < 1e-6);
    }

    #[test]
    fn rope_rotates_pairs_and_keeps_norm() {
        let mut x = [1.0f32, 0.0, 0.0, 0.0];
        rope(&mut x, 1, &[std::f32::consts::FRAC_PI_2, 0.0]);
        assert!(x[0].abs() < 1e-6 && (x[2] - 1.0).abs() < 1e-6);
        let mut y = [0.3f32, -1.2, 0.7, 2.0];
        let n0: f32 = y.iter().map(|v| v * v).sum();
        rope(&mut y, 17, &[0.1, 0.01]);
        let n1: f32 = y.iter().map(|v| v * v).sum();
        assert!((n0 - n1).abs() < 1e-5);
    }

    #[test]
    fn attention_over_one_key_returns_its_value() {
        let q = [1.0f32, 0.0];
        let k = [0.5f32, 0.5];
        let v = [7.0f32, -3.0];
        let mut o = [0.0f32; 2];
        attend(&q, &k, &v, 1, 0, 0..1, 1.0, None, &mut o);
        assert_eq!(o, [7.0, -3.0]);
    }
}
