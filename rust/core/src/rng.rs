//! Counter-based randomness: every draw is a pure function of a key and a counter.
//!
//! Nothing here carries hidden state across samples, so a loader never has to save an RNG:
//! the draw for output position `p` is `hash(seed, p)`, the crop of sample `i` in epoch `e`,
//! view `v` is derived from `hash(seed, e, i, v)`.

/// SplitMix64 finaliser: a bijective 64-bit mixer with full avalanche.
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Hash an ordered tuple of words into one key. Order matters: `(a, b) != (b, a)`.
#[inline]
pub fn hash_words(words: &[u64]) -> u64 {
    // Golden-ratio increments keep zero-valued words from collapsing onto each other.
    let mut h = 0x6a09_e667_f3bc_c909_u64;
    for &w in words {
        h = mix64(h.wrapping_add(0x9e37_79b9_7f4a_7c15) ^ mix64(w));
    }
    h
}

/// Domain tags keep streams drawn for different purposes independent of each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
pub enum Purpose {
    ShardOrder = 1,
    BufferPick = 2,
    Crop = 3,
    TimeMask = 4,
    FreqMask = 5,
}

/// A stream of draws `hash(key, 0), hash(key, 1), ...`; cheap to create, never saved.
#[derive(Clone, Debug)]
pub struct Stream {
    key: u64,
    counter: u64,
}

impl Stream {
    pub fn new(words: &[u64]) -> Self {
        Self { key: hash_words(words), counter: 0 }
    }

    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        let out = mix64(self.key ^ mix64(self.counter.wrapping_add(0x9e37_79b9_7f4a_7c15)));
        self.counter += 1;
        out
    }

    /// Uniform integer in `[0, n)` (Lemire's multiply-shift; the bias is < n / 2^64, negligible).
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "Stream::below(0)");
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Uniform integer in `[lo, hi]` inclusive.
    #[inline]
    pub fn range_inclusive(&mut self, lo: u64, hi: u64) -> u64 {
        assert!(lo <= hi);
        lo + self.below(hi - lo + 1)
    }

    /// Uniform float in `[0, 1)` with 53 random bits.
    #[inline]
    pub fn unit_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// Fisher-Yates permutation of `0..n` from a counter-based stream.
pub fn permutation(n: usize, words: &[u64]) -> Vec<usize> {
    let mut perm: Vec<usize> = (0..n).collect();
    let mut s = Stream::new(words);
    for i in (1..n).rev() {
        let j = s.below(i as u64 + 1) as usize;
        perm.swap(i, j);
    }
    perm
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_pure_functions_of_their_key() {
        let a: Vec<u64> = { let mut s = Stream::new(&[1, 2, 3]); (0..5).map(|_| s.next_u64()).collect() };
        let b: Vec<u64> = { let mut s = Stream::new(&[1, 2, 3]); (0..5).map(|_| s.next_u64()).collect() };
        let c: Vec<u64> = { let mut s = Stream::new(&[1, 3, 2]); (0..5).map(|_| s.next_u64()).collect() };
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn below_is_roughly_uniform() {
        let mut s = Stream::new(&[7]);
        let mut counts = [0u32; 10];
        for _ in 0..100_000 {
            counts[s.below(10) as usize] += 1;
        }
        // Each bucket expects 10_000; 5 sigma is about 475.
        for c in counts {
            assert!((9_500..10_500).contains(&c), "{counts:?}");
        }
    }

    #[test]
    fn permutation_is_a_permutation_and_depends_on_key() {
        let p = permutation(100, &[42, 0]);
        let mut sorted = p.clone();
        sorted.sort();
        assert_eq!(sorted, (0..100).collect::<Vec<_>>());
        assert_ne!(p, permutation(100, &[42, 1]));
        assert_eq!(p, permutation(100, &[42, 0]));
    }
}
