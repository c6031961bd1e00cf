//! Temperature / top-k / top-p sampling with a seeded generator, reproducible for a fixed seed.

#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy (argmax).
    pub temperature: f32,
    /// 0 disables top-k.
    pub top_k: usize,
    /// 1.0 disables nucleus sampling.
    pub top_p: f32,
    /// A fixed seed makes sampled output reproducible; `None` draws one from the clock.
    pub seed: Option<u64>,
}

impl SamplingParams {
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: None,
        }
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == 1
    }

    pub fn validate(&self) -> Result<(), String> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(format!(
                "temperature must be a finite number >= 0, got {}",
                self.temperature
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        Ok(())
    }
}

/// xoshiro256** seeded through splitmix64: small, fast, and stable across platforms.
#[derive(Clone, Debug)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Rng {
            s: [next(), next(), next(), next()],
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
    scratch: Vec<(u32, f32)>,
}

impl Sampler {
    pub fn new(params: &SamplingParams) -> Self {
        let seed = params.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0)
        });
        Sampler {
            params: params.clone(),
            rng: Rng::new(seed),
            scratch: Vec::new(),
        }
    }

    /// Draw one token from `logits` (which may be overwritten).
    pub fn sample(&mut self, logits: &mut [f32]) -> u32 {
        if self.params.is_greedy() {
            return hayai_model::argmax(logits);
        }
        let inv_t = 1.0 / self.params.temperature;
        let c = &mut self.scratch;
        c.clear();
        c.extend(
            logits
                .iter()
                .enumerate()
                .filter(|(_, v)| v.is_finite())
                .map(|(i, &v)| (i as u32, v * inv_t)),
        );
        if c.is_empty() {
            return hayai_model::argmax(logits);
        }
        let by_desc = |a: &(u32, f32), b: &(u32, f32)| {
            b.1.partial_cmp(&a.1)
                .unwrap_or(std::cmp::Ordering::Equal)
                .then(a.0.cmp(&b.0))
        };
        let k = if self.params.top_k > 0 {
            self.params.top_k.min(c.len())
        } else {
            c.len()
        };
        if k < c.len() {
            c.select_nth_unstable_by(k - 1, by_desc);
            c.truncate(k);
        }
        c.sort_by(by_desc);
        let max = c[0].1;
        let mut probs: Vec<f64> = c.iter().map(|&(_, v)| ((v - max) as f64).exp()).collect();
        let total: f64 = probs.iter().sum();
        for p in probs.iter_mut() {
            *p /= total;
        }
        // Nucleus: the smallest prefix whose mass reaches top_p.
        let mut keep = probs.len();
        if self.params.top_p < 1.0 {
            let mut acc = 0.0;
            for (i, p) in probs.iter().enumerate() {
                acc += p;
                if acc >= self.params.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
        }
        let mass: f64 = probs[..keep].iter().sum();
        let mut u = self.rng.next_f64() * mass;
        for i in 0..keep {
            u -= probs[i];
            if u < 0.0 {
                return c[i].0;
            }
        }
        c[keep - 1].0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(t: f32, k: usize, p: f32, seed: u64) -> SamplingParams {
        SamplingParams {
            temperature: t,
            top_k: k,
            top_p: p,
            seed: Some(seed),
        }
    }

    #[test]
    fn same_seed_same_draws() {
        let logits: Vec<f32> = (0..100).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        let draw = |seed| {
            let mut s = Sampler::new(&params(0.8, 0, 0.95, seed));
            (0..50)
                .map(|_| s.sample(&mut logits.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
    }

    #[test]
    fn top_k_one_is_argmax_and_top_k_limits_support() {
        let logits = vec![0.1f32, 3.0, 2.9, -1.0];
        let mut s = Sampler::new(&params(1.0, 1, 1.0, 1));
        assert_eq!(s.sample(&mut logits.clone()), 1);
        let mut s = Sampler::new(&params(5.0, 2, 1.0, 3));
        for _ in 0..200 {
            let t = s.sample(&mut logits.clone());
            assert!(t == 1 || t == 2, "token {t} outside top-2");
        }
    }

    #[test]
    fn top_p_keeps_the_nucleus() {
        // One token holds ~88% of the mass; top_p 0.5 must always pick it.
        let logits = vec![4.0f32, 2.0, 1.0, 0.0];
        let mut s = Sampler::new(&params(1.0, 0, 0.5, 9));
        for _ in 0..200 {
            assert_eq!(s.sample(&mut logits.clone()), 0);
        }
    }

    #[test]
    fn distribution_follows_softmax() {
        let logits = vec![0.0f32, (2.0f32).ln()];
        let mut s = Sampler::new(&params(1.0, 0, 1.0, 42));
        let n = 20000;
        let ones = (0..n)
            .filter(|_| s.sample(&mut logits.clone()) == 1)
            .count();
        let frac = ones as f64 / n as f64;
        assert!((frac - 2.0 / 3.0).abs() < 0.02, "frac {frac}");
    }

    #[test]
    fn validation_rejects_bad_values() {
        assert!(params(-1.0, 0, 1.0, 0).validate().is_err());
        assert!(params(f32::NAN, 0, 1.0, 0).validate().is_err());
        assert!(params(1.0, 0, 0.0, 0).validate().is_err());
        assert!(params(1.0, 0, 1.5, 0).validate().is_err());
        assert!(params(0.7, 40, 0.9, 0).validate().is_ok());
    }
}
