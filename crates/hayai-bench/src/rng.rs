//! Seeded shuffling that matches CPython's `random.seed(seed); random.shuffle(xs)` exactly.
//!
//! Reference harnesses (SGLang's bench_serving, the gemma-challenge capture) are Python and shuffle
//! with the `random` module; using the same generator means a given seed selects the same prompts
//! and order here as there. The generator is MT19937 seeded with `init_by_array` over the seed's
//! 32-bit words (what CPython does for an integer seed), `getrandbits(k)` takes the top `k` bits of
//! one 32-bit output, `randbelow(n)` rejects draws of `bit_length(n)` bits that are `>= n`, and
//! `shuffle` is the backwards Fisher-Yates `for i in (1..n).rev() { swap(i, randbelow(i + 1)) }`.

const N: usize = 624;
const M: usize = 397;

/// CPython-compatible Mersenne Twister.
#[derive(Clone)]
pub struct PyRandom {
    mt: Box<[u32; N]>,
    idx: usize,
}

impl PyRandom {
    /// Equivalent of `random.seed(seed)` for a non-negative integer seed.
    pub fn new(seed: u64) -> Self {
        let mut key: Vec<u32> = Vec::new();
        let mut s = seed;
        while s > 0 {
            key.push(s as u32);
            s >>= 32;
        }
        if key.is_empty() {
            key.push(0);
        }
        let mut r = PyRandom {
            mt: Box::new([0; N]),
            idx: N,
        };
        r.init_genrand(19_650_218);
        let mut i = 1usize;
        let mut j = 0usize;
        let mut k = N.max(key.len());
        while k > 0 {
            let prev = r.mt[i - 1] ^ (r.mt[i - 1] >> 30);
            r.mt[i] = (r.mt[i] ^ prev.wrapping_mul(1_664_525))
                .wrapping_add(key[j])
                .wrapping_add(j as u32);
            i += 1;
            j += 1;
            if i >= N {
                r.mt[0] = r.mt[N - 1];
                i = 1;
            }
            if j >= key.len() {
                j = 0;
            }
            k -= 1;
        }
        k = N - 1;
        while k > 0 {
            let prev = r.mt[i - 1] ^ (r.mt[i - 1] >> 30);
            r.mt[i] = (r.mt[i] ^ prev.wrapping_mul(1_566_083_941)).wrapping_sub(i as u32);
            i += 1;
            if i >= N {
                r.mt[0] = r.mt[N - 1];
                i = 1;
            }
            k -= 1;
        }
        r.mt[0] = 0x8000_0000;
        r
    }

    fn init_genrand(&mut self, s: u32) {
        self.mt[0] = s;
        for i in 1..N {
            let prev = self.mt[i - 1] ^ (self.mt[i - 1] >> 30);
            self.mt[i] = 1_812_433_253u32.wrapping_mul(prev).wrapping_add(i as u32);
        }
        self.idx = N;
    }

    /// One 32-bit output (`genrand_uint32`).
    pub fn next_u32(&mut self) -> u32 {
        if self.idx >= N {
            for kk in 0..N {
                let y = (self.mt[kk] & 0x8000_0000) | (self.mt[(kk + 1) % N] & 0x7fff_ffff);
                let mut v = self.mt[(kk + M) % N] ^ (y >> 1);
                if y & 1 != 0 {
                    v ^= 0x9908_b0df;
                }
                self.mt[kk] = v;
            }
            self.idx = 0;
        }
        let mut y = self.mt[self.idx];
        self.idx += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^= y >> 18;
        y
    }

    /// `random.getrandbits(k)` for `1 <= k <= 32`.
    fn getrandbits(&mut self, k: u32) -> u32 {
        debug_assert!((1..=32).contains(&k));
        self.next_u32() >> (32 - k)
    }

    /// `random._randbelow(n)`: uniform in `0..n`. `n` must be in `1..=u32::MAX`.
    pub fn randbelow(&mut self, n: u32) -> u32 {
        assert!(n > 0, "randbelow(0)");
        let k = 32 - n.leading_zeros();
        loop {
            let r = self.getrandbits(k);
            if r < n {
                return r;
            }
        }
    }

    /// `random.shuffle(xs)`.
    pub fn shuffle<T>(&mut self, xs: &mut [T]) {
        for i in (1..xs.len()).rev() {
            let j = self.randbelow((i + 1) as u32) as usize;
            xs.swap(i, j);
        }
    }
}

/// The permutation `random.seed(seed); random.shuffle(list(range(n)))` produces.
pub fn shuffled_indices(n: usize, seed: u64) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..n).collect();
    PyRandom::new(seed).shuffle(&mut idx);
    idx
}

#[cfg(test)]
mod tests {
    use super::*;

    // Expected values are CPython 3 outputs for the same calls.
    #[test]
    fn matches_cpython_getrandbits() {
        let mut r = PyRandom::new(1);
        assert_eq!(
            [r.next_u32(), r.next_u32(), r.next_u32()],
            [577_090_037, 2_444_712_010, 3_639_700_191]
        );
    }

    #[test]
    fn matches_cpython_shuffle() {
        assert_eq!(shuffled_indices(10, 1), vec![6, 8, 9, 7, 5, 3, 0, 4, 1, 2]);
        assert_eq!(
            shuffled_indices(128, 1)[..12].to_vec(),
            vec![14, 46, 71, 36, 95, 113, 84, 17, 4, 51, 99, 76]
        );
        assert_eq!(shuffled_indices(5, 7), vec![4, 0, 3, 1, 2]);
    }

    #[test]
    fn shuffle_is_a_permutation() {
        let mut v = shuffled_indices(1000, 42);
        v.sort_unstable();
        assert_eq!(v, (0..1000).collect::<Vec<_>>());
    }
}
