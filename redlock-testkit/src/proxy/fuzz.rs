//! The fuzzing fault: random per-chunk delays, dropped replies and reset requests,
//! drawn from a seed so that a failing schedule can be replayed.

use std::{fmt, time::Duration};

use super::rng::{Rng, mix};

/// The env var that fixes the seed of [`Fuzz::seed_from_env_or_random`].
pub const FUZZ_SEED_ENV: &str = "REDLOCK_FUZZ_SEED";

/// A reproducible random schedule of network faults, for [`NetFault::Fuzz`](crate::NetFault::Fuzz).
///
/// Each chunk a proxy reads (in practice one RESP command or reply, when the client
/// waits for each reply) is, in order of the draws:
/// - client → node: with probability [`p_reset_request`](Self::p_reset_request)
///   dropped, and the connection closed instead of forwarding it: the command never ran;
/// - node → client: with probability [`p_drop_reply`](Self::p_drop_reply) swallowed,
///   and the connection closed: the command ran, but the client never sees its reply
///   and sees its connection drop (the ambiguous failure that tempts a client to re-send);
/// - otherwise delayed by a uniformly random amount in `[0, max_delay]`, never
///   overtaking the chunk read before it in the same direction (byte order is kept).
///
/// A drop or a reset also happens in order: after the chunks read before it were delivered.
///
/// # Reproducibility
/// The draws of a connection depend only on the seed, the connection's rank among
/// those the proxy forwarded since it started (first, second, ...; connections closed
/// by a [`Reset`](crate::NetFault::Reset) or held by a
/// [`Blackhole`](crate::NetFault::Blackhole) do not count) and the direction. The same seed
/// replays the same decisions as long as the client opens its connections in the same
/// order and sends the same chunks; print the seed when a test fails.
///
/// # Default
/// [`Fuzz::new`]: no delay, nothing dropped, nothing reset.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fuzz {
    seed: u64,
    max_delay: Duration,
    /// Probabilities in parts per million: exact, so `Fuzz` is `Eq` and hashable.
    drop_reply: u32,
    reset_request: u32,
}

const MILLION: f64 = 1_000_000.0;

impl Fuzz {
    /// The schedule of `seed`: no delay, nothing dropped or reset until set.
    pub fn new(seed: u64) -> Fuzz {
        Fuzz { seed, max_delay: Duration::ZERO, drop_reply: 0, reset_request: 0 }
    }

    /// Delays each chunk by a random amount in `[0, max_delay]`.
    #[must_use]
    pub fn with_max_delay(mut self, max_delay: Duration) -> Fuzz {
        self.max_delay = max_delay;
        self
    }

    /// Swallows each reply chunk with probability `p`, then closes the connection.
    ///
    /// # Panics
    /// When `p` is not in `[0, 1]`.
    #[must_use]
    pub fn with_drop_reply(mut self, p: f64) -> Fuzz {
        self.drop_reply = per_million(p, "with_drop_reply");
        self
    }

    /// Drops each request chunk with probability `p` and closes the connection instead
    /// of forwarding it.
    ///
    /// # Panics
    /// When `p` is not in `[0, 1]`.
    #[must_use]
    pub fn with_reset_request(mut self, p: f64) -> Fuzz {
        self.reset_request = per_million(p, "with_reset_request");
        self
    }

    /// The same settings with a seed derived from this one and `stream`: for several
    /// proxies of one test (one per node, per client) whose schedules must differ but
    /// all follow from one printed seed.
    #[must_use]
    pub fn derive(self, stream: u64) -> Fuzz {
        Fuzz { seed: mix(self.seed ^ mix(stream)), ..self }
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The bound of each chunk's random delay.
    pub fn max_delay(&self) -> Duration {
        self.max_delay
    }

    /// The probability that a reply chunk is swallowed (then the connection closed).
    pub fn p_drop_reply(&self) -> f64 {
        f64::from(self.drop_reply) / MILLION
    }

    /// The probability that a request chunk is dropped (and the connection closed).
    pub fn p_reset_request(&self) -> f64 {
        f64::from(self.reset_request) / MILLION
    }

    /// A seed for a test: `$REDLOCK_FUZZ_SEED` if set (to replay a failure), else a
    /// random one. Print it in the test's failure messages.
    ///
    /// # Panics
    /// When `REDLOCK_FUZZ_SEED` is set but not a number: a replay must not silently
    /// run another schedule.
    pub fn seed_from_env_or_random() -> u64 {
        match std::env::var(FUZZ_SEED_ENV) {
            Ok(value) => value
                .trim()
                .parse()
                .unwrap_or_else(|_| panic!("{FUZZ_SEED_ENV}={value:?} is not a u64 seed")),
            Err(_) => Rng::new().next_u64(),
        }
    }

    /// The draws of one direction of the connection of rank `conn`.
    pub(crate) fn schedule(&self, conn: u64, direction: Direction) -> Schedule {
        let stream = conn.wrapping_mul(2) + direction as u64;
        Schedule { fuzz: *self, rng: Rng::seeded(mix(self.seed ^ mix(stream))) }
    }
}

impl fmt::Debug for Fuzz {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fuzz")
            .field("seed", &self.seed)
            .field("max_delay", &self.max_delay)
            .field("p_drop_reply", &self.p_drop_reply())
            .field("p_reset_request", &self.p_reset_request())
            .finish()
    }
}

fn per_million(p: f64, what: &str) -> u32 {
    assert!((0.0..=1.0).contains(&p), "Fuzz::{what}: {p} is not a probability in [0, 1]");
    // In range, so the product is in [0, 1e6] and the cast exact.
    (p * MILLION).round() as u32
}

/// Which way a chunk goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Direction {
    /// Client → node: commands.
    Request = 0,
    /// Node → client: replies.
    Reply = 1,
}

/// What becomes of one chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fate {
    /// Forwarded after this delay (and after the chunk before it).
    Forward(Duration),
    /// Not forwarded; the connection is closed after this delay (and the chunk before it).
    Close(Duration),
}

/// The draws of one direction of one connection under one [`Fuzz`].
#[derive(Debug, Clone)]
pub(crate) struct Schedule {
    fuzz: Fuzz,
    rng: Rng,
}

impl Schedule {
    /// The fuzz this schedule follows: a pump re-draws its schedule when the fault changes.
    pub(crate) fn fuzz(&self) -> &Fuzz {
        &self.fuzz
    }

    /// The fate of the next chunk going `direction`.
    pub(crate) fn next(&mut self, direction: Direction) -> Fate {
        let p = match direction {
            Direction::Request => self.fuzz.reset_request,
            Direction::Reply => self.fuzz.drop_reply,
        };
        // Always both draws, so that a fate never shifts the draws of the chunks after it.
        let close = self.rng.chance(p);
        let delay = self.rng.up_to(self.fuzz.max_delay);
        if close { Fate::Close(delay) } else { Fate::Forward(delay) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fates(fuzz: Fuzz, conn: u64, direction: Direction) -> Vec<Fate> {
        let mut schedule = fuzz.schedule(conn, direction);
        (0..50).map(|_| schedule.next(direction)).collect()
    }

    #[test]
    fn a_seed_replays_the_same_fates_and_streams_differ() {
        let fuzz = Fuzz::new(42)
            .with_max_delay(Duration::from_millis(30))
            .with_drop_reply(0.3)
            .with_reset_request(0.3);
        assert_eq!(fates(fuzz, 0, Direction::Reply), fates(fuzz, 0, Direction::Reply));
        assert_ne!(fates(fuzz, 0, Direction::Reply), fates(fuzz, 1, Direction::Reply));
        assert_ne!(fates(fuzz, 0, Direction::Reply), fates(fuzz, 0, Direction::Request));
        assert_ne!(
            fates(fuzz, 0, Direction::Reply),
            fates(
                Fuzz::new(43).with_max_delay(Duration::from_millis(30)).with_drop_reply(0.3),
                0,
                Direction::Reply
            )
        );
        assert_ne!(fuzz.derive(1).seed(), fuzz.derive(2).seed());
        assert_eq!(fuzz.derive(1).max_delay(), fuzz.max_delay());
    }

    #[test]
    fn probabilities_and_delays_hold_their_bounds() {
        let max = Duration::from_millis(30);
        let always = Fuzz::new(1).with_max_delay(max).with_drop_reply(1.0);
        assert!(
            fates(always, 0, Direction::Reply)
                .iter()
                .all(|f| matches!(f, Fate::Close(d) if *d <= max))
        );
        assert!(
            fates(always, 0, Direction::Request)
                .iter()
                .all(|f| matches!(f, Fate::Forward(d) if *d <= max))
        );
        assert_eq!(always.p_drop_reply(), 1.0);
        assert_eq!(always.p_reset_request(), 0.0);
        let none = Fuzz::new(1);
        assert!(
            fates(none, 3, Direction::Reply).iter().all(|f| *f == Fate::Forward(Duration::ZERO))
        );
    }

    #[test]
    #[should_panic(expected = "not a probability")]
    fn a_probability_above_one_is_refused() {
        let _ = Fuzz::new(1).with_drop_reply(1.5);
    }
}
