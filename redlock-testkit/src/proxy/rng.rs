//! The proxy's random numbers: SplitMix64, seedable so that a fuzz schedule replays.
//!
//! Delays and drops need no cryptographic quality, only a fixed sequence per seed and
//! no extra dependency.

use std::{collections::hash_map::RandomState, hash::BuildHasher, time::Duration};

/// A SplitMix64 generator: any seed, zero included, gives a good sequence.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    /// A randomly seeded generator (per process and per instance), for latency jitter.
    pub(crate) fn new() -> Rng {
        Rng(RandomState::new().hash_one(0u8))
    }

    /// The generator for `seed`: the same seed, the same sequence.
    pub(crate) fn seeded(seed: u64) -> Rng {
        Rng(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0)
    }

    /// Uniform in `[0, max]`.
    pub(crate) fn up_to(&mut self, max: Duration) -> Duration {
        if max.is_zero() {
            return Duration::ZERO;
        }
        // The top 53 bits as a fraction in [0, 1).
        max.mul_f64((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64)
    }

    /// True with probability `per_million` / 1 000 000.
    pub(crate) fn chance(&mut self, per_million: u32) -> bool {
        self.next_u64() % 1_000_000 < u64::from(per_million)
    }
}

/// SplitMix64's output function: spreads nearby inputs (seeds, indexes) far apart.
pub(crate) fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_in_bounds_and_varies() {
        let mut rng = Rng::new();
        let max = Duration::from_millis(10);
        let draws: Vec<_> = (0..1000).map(|_| rng.up_to(max)).collect();
        assert!(draws.iter().all(|d| *d <= max));
        assert!(draws.iter().any(|d| *d < max / 4) && draws.iter().any(|d| *d > max * 3 / 4));
        assert_eq!(rng.up_to(Duration::ZERO), Duration::ZERO);
    }

    #[test]
    fn a_seed_replays_its_sequence_and_chances_hold_their_bounds() {
        let draws = |seed| {
            let mut rng = Rng::seeded(seed);
            (0..100).map(|_| rng.next_u64()).collect::<Vec<_>>()
        };
        assert_eq!(draws(0), draws(0));
        assert_ne!(draws(0), draws(1));
        let mut rng = Rng::seeded(7);
        assert!((0..1000).all(|_| rng.chance(1_000_000)));
        assert!((0..1000).all(|_| !rng.chance(0)));
        let hits = (0..10_000).filter(|_| rng.chance(500_000)).count();
        assert!((4_000..6_000).contains(&hits), "{hits}");
    }
}
