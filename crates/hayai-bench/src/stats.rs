//! Summary statistics with NumPy semantics (`np.percentile` default "linear" interpolation), which is
//! what SGLang's bench_serving uses for its latency percentiles.

/// Mean of `xs`, `None` when empty.
pub fn mean(xs: &[f64]) -> Option<f64> {
    if xs.is_empty() {
        None
    } else {
        Some(xs.iter().sum::<f64>() / xs.len() as f64)
    }
}

/// Percentile `p` in `[0, 100]` with linear interpolation between closest ranks; `None` when empty.
pub fn percentile(xs: &[f64], p: f64) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    Some(percentile_sorted(&v, p))
}

fn percentile_sorted(v: &[f64], p: f64) -> f64 {
    let p = p.clamp(0.0, 100.0);
    let rank = p / 100.0 * (v.len() - 1) as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    v[lo] + (v[hi] - v[lo]) * (rank - lo as f64)
}

/// Median (50th percentile).
pub fn median(xs: &[f64]) -> Option<f64> {
    percentile(xs, 50.0)
}

/// Population standard deviation (`np.std` default), `None` when empty.
pub fn std_dev(xs: &[f64]) -> Option<f64> {
    let m = mean(xs)?;
    Some((xs.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / xs.len() as f64).sqrt())
}

/// The mean / median / std / p90 / p99 block reported for each latency metric.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct Distribution {
    pub mean: Option<f64>,
    pub median: Option<f64>,
    pub std: Option<f64>,
    pub p90: Option<f64>,
    pub p99: Option<f64>,
    pub min: Option<f64>,
    pub max: Option<f64>,
}

impl Distribution {
    /// Summarise `xs` (all fields `None` when empty).
    pub fn of(xs: &[f64]) -> Self {
        if xs.is_empty() {
            return Self::default();
        }
        let mut v = xs.to_vec();
        v.sort_by(|a, b| a.total_cmp(b));
        Distribution {
            mean: mean(&v),
            median: Some(percentile_sorted(&v, 50.0)),
            std: std_dev(&v),
            p90: Some(percentile_sorted(&v, 90.0)),
            p99: Some(percentile_sorted(&v, 99.0)),
            min: v.first().copied(),
            max: v.last().copied(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn percentiles_match_numpy_linear() {
        // np.percentile([1,2,3,4], [50, 99, 90, 0, 100]) = [2.5, 3.97, 3.7, 1, 4]
        let xs = [4.0, 1.0, 3.0, 2.0];
        assert!(close(percentile(&xs, 50.0).unwrap(), 2.5));
        assert!(close(percentile(&xs, 99.0).unwrap(), 3.97));
        assert!(close(percentile(&xs, 90.0).unwrap(), 3.7));
        assert!(close(percentile(&xs, 0.0).unwrap(), 1.0));
        assert!(close(percentile(&xs, 100.0).unwrap(), 4.0));
        // np.percentile(range(1, 101), 99) = 99.01
        let hundred: Vec<f64> = (1..=100).map(f64::from).collect();
        assert!(close(percentile(&hundred, 99.0).unwrap(), 99.01));
        assert!(close(median(&[5.0]).unwrap(), 5.0));
        assert!(close(median(&[1.0, 10.0, 2.0]).unwrap(), 2.0));
    }

    #[test]
    fn empty_inputs_give_none() {
        assert_eq!(mean(&[]), None);
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(Distribution::of(&[]), Distribution::default());
    }

    #[test]
    fn distribution_fields() {
        let d = Distribution::of(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
        assert!(close(d.mean.unwrap(), 5.0));
        assert!(close(d.std.unwrap(), 2.0));
        assert!(close(d.median.unwrap(), 4.5));
        assert_eq!(d.min, Some(2.0));
        assert_eq!(d.max, Some(9.0));
    }
}
