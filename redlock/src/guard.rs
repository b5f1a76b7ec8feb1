//! The one surface every lock guard has, generated in one place.

use std::future::Future;
use std::time::{Duration, Instant};

use crate::error::Result;

/// What every lock guard can do: [`Lock`](crate::Lock), [`ReentrantLock`](crate::ReentrantLock),
/// [`MultiLock`](crate::MultiLock), [`ReadLock`](crate::ReadLock),
/// [`WriteLock`](crate::WriteLock) and [`Permit`](crate::Permit). Each also has these as
/// inherent methods, so the trait is needed only for code generic over the kinds (as [`AutoLock`](crate::AutoLock) is).
///
/// Sealed: only this crate's guards implement it.
pub trait Guard:
    Send + Sync + std::fmt::Debug + sealed::Sealed + sealed::Internal + 'static
{
    /// The resource name, as passed to the lock call (a multi-resource lock's names joined
    /// by `", "`).
    fn resource(&self) -> &str;
    /// The token: the random value that identifies this hold on the nodes (not the
    /// fencing token).
    fn token(&self) -> &str;
    /// The instant at which the validity ends, on [`Instant`]'s clock as of this call; see
    /// [`Lock::deadline`](crate::Lock::deadline).
    fn deadline(&self) -> Instant;
    /// What remains of the lease, counting down; [`Duration::ZERO`] once it is over.
    fn validity(&self) -> Duration;
    /// The TTL of the last grant or extension, as sent to Redis.
    fn ttl(&self) -> Duration;
    /// Renews the lease to `ttl` from now; see [`Lock::extend`](crate::Lock::extend).
    fn extend(&mut self, ttl: Duration) -> impl Future<Output = Result<()>> + Send;
    /// Releases the hold; see [`Lock::release`](crate::Lock::release).
    fn release(self) -> impl Future<Output = Result<()>> + Send
    where
        Self: Sized;
    /// Keeps the hold for `hold` from now and lets go of it without releasing it; see
    /// [`Lock::keep_for`](crate::Lock::keep_for).
    fn keep_for(self, hold: Duration) -> impl Future<Output = Result<()>> + Send
    where
        Self: Sized;
    #[doc(hidden)]
    fn start_auto_extend(self, max_hold: Option<Duration>) -> crate::AutoLock<Self>
    where
        Self: Sized;
}

pub(crate) mod sealed {
    /// Keeps [`Guard`](super::Guard) implemented by this crate's guards only.
    pub trait Sealed {}

    /// What of a guard only this crate may call.
    pub trait Internal {
        /// The deadline on the lease clock (see `clock`), which
        /// [`Guard::deadline`](super::Guard::deadline) converts for the user.
        fn lease_deadline(&self) -> std::time::Instant;
        /// The fencing token, for the kinds that can be fenced (which say so in public).
        fn fence(&self) -> Option<u64>;
    }
}

/// Defines a guard type over a [`Claim`](crate::engine::Claim) of protocol `$proto`, with the
/// whole guard surface; `key` adds `key()` for kinds with one key.
macro_rules! guard {
    ($(#[$meta:meta])* $name:ident($proto:ty), $what:literal $(, $key:ident)?) => {
        $(#[$meta])*
        #[must_use = concat!("dropping a ", stringify!($name), " releases it at once, in the background")]
        pub struct $name {
            claim: $crate::engine::Claim<$proto>,
        }

        impl ::std::fmt::Debug for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.debug_struct(stringify!($name))
                    .field("resource", &self.resource())
                    .field("token", &self.token())
                    .field("validity", &self.validity())
                    .field("fencing_token", &self.claim.fence())
                    .finish()
            }
        }

        impl $crate::guard::sealed::Sealed for $name {}

        impl $crate::guard::sealed::Internal for $name {
            fn lease_deadline(&self) -> ::std::time::Instant {
                self.claim.deadline()
            }

            fn fence(&self) -> Option<u64> {
                self.claim.fence()
            }
        }

        impl $name {
            pub(crate) fn from_claim(claim: $crate::engine::Claim<$proto>) -> Self {
                Self { claim }
            }

            /// The resource name, as passed to the lock call.
            pub fn resource(&self) -> &str {
                self.claim.resource()
            }

            $(guard!(@$key);)?

            #[doc = concat!("The random token that identifies this ", $what, " on the nodes.")]
            pub fn token(&self) -> &str {
                $crate::engine::Protocol::token(self.claim.proto())
            }

            #[doc = concat!("What remains of this ", $what, "'s lease, counting down; ")]
            /// [`Duration::ZERO`](std::time::Duration::ZERO) once it is over. Timed from its
            /// own acquisition (or last extension): other holds neither lengthen nor
            /// shorten it.
            ///
            /// This is the only safe measure of ownership: work that must not overlap another
            /// holder's has to finish (or be fenced) before it reaches zero.
            pub fn validity(&self) -> ::std::time::Duration {
                self.claim.validity()
            }

            /// The instant at which the validity ends, on [`Instant`](std::time::Instant)'s
            /// clock as of this call: compare it with `Instant::now()` soon after. Where the
            /// validity counts the time the machine spends suspended (Linux, Android: see
            /// the crate's "What is guaranteed"), a suspend moves it earlier.
            pub fn deadline(&self) -> ::std::time::Instant {
                $crate::clock::on_std(self.claim.deadline())
            }

            /// Whether the validity has not run out yet, by this client's clock, without
            /// asking the nodes ([`Lease::is_valid`](crate::Lease::is_valid) is the same
            /// check; `check_held()` asks the nodes).
            pub fn is_valid(&self) -> bool {
                self.claim.is_valid()
            }

            /// The TTL of the last grant or extension, as sent to Redis.
            pub fn ttl(&self) -> ::std::time::Duration {
                self.claim.ttl()
            }

            #[doc = concat!("Asks the nodes whether a quorum still has this ", $what, " (a round")]
            /// trip to every node; [`is_valid()`](Self::is_valid) is the local check):
            /// `Ok(true)` if so, `Ok(false)` if too many no longer do.
            ///
            /// Advisory only: the answer is stale once it arrives, and a key can outlive its
            /// lease on a node whose clock runs slow. Only `validity()` is safe to act on;
            /// use this to detect a lock lost early (a node restarted empty, a key deleted
            /// by hand), not to decide that a lock is still safe to use.
            ///
            /// # Errors
            /// [`ErrorKind::Unavailable`](crate::ErrorKind::Unavailable) when too few nodes
            /// answered.
            pub async fn check_held(&self) -> $crate::Result<bool> {
                self.claim.check_held().await
            }

            #[doc = concat!("Renews this ", $what, "'s lease to `ttl` from now on every node")]
            /// where it is still held; never touches another owner's hold.
            ///
            /// Succeeds only with a quorum, while still valid; the new validity is
            /// `ttl - elapsed - drift`, timed from the start of this call. An extension
            /// that reached too few nodes deletes nothing and leaves the current validity
            /// as it was. One that finds the hold gone from too many nodes, or that
            /// outlasts the validity, ends the hold: its validity is over, what is left of
            /// it on the nodes (including keys the extension renewed) is
            /// released in the background, and from then on `extend()`, `check_held()` and
            /// `release()` answer `NotHeld` (`false`) without asking the nodes. (A node that
            /// resets connections for longer than the release's re-sends, about 0.26 s, keeps
            /// what the extension renewed there for that lease: a known limit.)
            ///
            /// # Errors
            /// [`ErrorKind::NotHeld`](crate::ErrorKind::NotHeld) when the validity is over
            /// (before or during the call) or the hold is gone from too many nodes;
            /// [`ErrorKind::Unavailable`](crate::ErrorKind::Unavailable) when too few nodes
            /// answered; [`ErrorKind::Expired`](crate::ErrorKind::Expired) when the round used
            /// up the new lease; [`ErrorKind::Config`](crate::ErrorKind::Config) for a `ttl`
            /// out of range.
            pub async fn extend(&mut self, ttl: ::std::time::Duration) -> $crate::Result<()> {
                self.claim.extend(ttl).await
            }

            #[doc = concat!("Releases this ", $what, " on every node where it is still held,")]
            /// never touching another owner's hold, and wakes the waiters when the lock
            /// becomes free.
            ///
            /// Returns once a quorum confirmed (nodes still to answer get the release in the
            /// background). Dropping the guard instead releases in the background.
            ///
            /// # Errors
            /// [`ErrorKind::NotHeld`](crate::ErrorKind::NotHeld) when the lease had run out
            /// (locally, or on too many nodes) before the release, so the critical section
            /// may have overlapped another holder's (a release re-sent after its connection
            /// broke that finds the key absent cannot tell this from its first send's
            /// removal, and says `Ok`: a known limit, see the crate's "Limits worth
            /// knowing");
            /// [`ErrorKind::Unavailable`](crate::ErrorKind::Unavailable) when too few nodes
            /// answered. Keys that remain expire with their lease either way.
            pub async fn release(self) -> $crate::Result<()> {
                self.claim.release().await
            }

            #[doc = concat!("Keeps this ", $what, " on the nodes for `hold` from now, then lets go")]
            /// of it without releasing it: what this hold keeps out stays out until `hold`
            /// has passed (the nodes' keys expire then), even this client's own requests
            /// (for a read share: writers; for the other kinds: everyone). The recipe for
            /// work that must run once per schedule (shown below with the plain lock): take
            /// the lock (the default wait pulls machines started together out of a split
            /// vote), do the work, and on success keep the lock until the end of the
            /// schedule's window, so that a machine that starts late (or retries, or waited)
            /// in the same window is refused instead of running the work again; on failure,
            /// release it so that another machine may try: one still waiting gets it (by
            /// default a waiter waits up to one TTL of the lock), a later one takes it at
            /// its own start. So the work runs at most once per window when it succeeds,
            /// and is tried again within the window only by machines still waiting or
            /// starting after the failure. (The `redlock` command's `run --once-per` does
            /// this; its manual says how it cuts time into windows.)
            ///
            /// It is one extension to `hold` (see `extend()`), and then the guard is gone
            /// whatever the extension's outcome: nothing is released, since a release
            /// would let the work run again. `Ok` means the extension reached a quorum: the
            /// lock is held for `hold` (less the drift allowance) from this call. An `Err`
            /// says it did not: the hold then ends when its current validity does (or at
            /// once, for `NotHeld`), although nodes that took the extension keep their key
            /// for `hold`.
            ///
            /// ```no_run
            /// # async fn nightly(rl: redlock::Redlock) -> redlock::Result<()> {
            /// # let run_the_draw = || async { Ok::<(), std::io::Error>(()) };
            /// use std::time::Duration;
            /// let lock = match rl.lock("nightly-draw").await {
            ///     Ok(lock) => lock,
            ///     // Another machine runs it, or ran it in this window already.
            ///     Err(err) if err.kind() == redlock::ErrorKind::NotAcquired => return Ok(()),
            ///     Err(err) => return Err(err),
            /// };
            /// match run_the_draw().await {
            ///     // Held until an hour before tomorrow's run: a late start today is refused.
            ///     Ok(()) => lock.keep_for(Duration::from_secs(23 * 3600)).await,
            ///     Err(_) => lock.release().await,
            /// }
            /// # }
            /// ```
            ///
            /// # Errors
            /// As `extend()`: [`ErrorKind::Unavailable`](crate::ErrorKind::Unavailable) when
            /// too few nodes answered, [`ErrorKind::NotHeld`](crate::ErrorKind::NotHeld)
            /// when the hold was over or gone, [`ErrorKind::Expired`](crate::ErrorKind::Expired)
            /// when the round used up `hold`, [`ErrorKind::Config`](crate::ErrorKind::Config)
            /// for a `hold` out of range (nothing is sent then).
            pub async fn keep_for(self, hold: ::std::time::Duration) -> $crate::Result<()> {
                self.claim.keep(hold).await
            }

            #[doc = concat!("Keeps this ", $what, " alive in the background (about every third")]
            /// of its TTL) until it is released or lost, with a lost-lock signal
            /// ([`Lease::lost`](crate::Lease::lost)).
            pub fn auto_extend(self) -> $crate::AutoLock<Self> {
                $crate::Guard::start_auto_extend(self, None)
            }

            /// Like `auto_extend()`, but stops extending once held for `max_hold` (counted
            /// from this call): work that overruns it loses the lock.
            pub fn auto_extend_capped(self, max_hold: ::std::time::Duration) -> $crate::AutoLock<Self> {
                $crate::Guard::start_auto_extend(self, Some(max_hold))
            }
        }

        impl $crate::Guard for $name {
            fn resource(&self) -> &str {
                $name::resource(self)
            }

            fn token(&self) -> &str {
                $name::token(self)
            }

            fn deadline(&self) -> ::std::time::Instant {
                $name::deadline(self)
            }

            fn validity(&self) -> ::std::time::Duration {
                $name::validity(self)
            }

            fn ttl(&self) -> ::std::time::Duration {
                $name::ttl(self)
            }

            async fn extend(&mut self, ttl: ::std::time::Duration) -> $crate::Result<()> {
                $name::extend(self, ttl).await
            }

            async fn release(self) -> $crate::Result<()> {
                $name::release(self).await
            }

            async fn keep_for(self, hold: ::std::time::Duration) -> $crate::Result<()> {
                $name::keep_for(self, hold).await
            }

            fn start_auto_extend(self, max_hold: Option<::std::time::Duration>) -> $crate::AutoLock<Self> {
                let tasks = self.claim.core().tasks.clone();
                $crate::lease::AutoLock::start(self, &tasks, max_hold)
            }
        }
    };
    (@key) => {
        /// The Redis key (the resource name behind the configured prefix).
        pub fn key(&self) -> &str {
            &$crate::engine::Protocol::keys(self.claim.proto())[0]
        }
    };
}

pub(crate) use guard;
