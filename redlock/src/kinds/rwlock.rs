//! The read-write lock: many readers or one writer per resource, over the quorum.
//!
//! # Layout on each node
//! One hash per lock (the resource's key), so every script touches a single key and runs on
//! a Redis Cluster node as well as on a standalone master. Every field's value is its own
//! expiry, in the node's milliseconds (`redis.call('TIME')` inside the script: Redis 7.0
//! has no per-field TTL):
//!
//! - `r:<token>`: one reader's share. Every [`ReadLock`] has its own token and expiry: a
//!   crashed reader's share runs out on its own, and a reader releases and extends only its
//!   own field (the single-node design this replaces let one reader delete another's).
//! - `w:<token>`: the writer's grant.
//! - `i:<id>`: a waiting writer's intent (see below), with a short expiry.
//!
//! Every script (`rw_*.lua`) first checks that the key is such a hash (a plain
//! [`Lock`](crate::Lock)'s string, or a hash with other fields, such as a
//! [`ReentrantLock`](crate::ReentrantLock)'s, answers `WRONGTYPE` before anything is
//! written: [`ErrorKind::WrongType`](crate::ErrorKind::WrongType)), then drops the fields
//! whose expiry has passed, then acts. After any change the key's `PEXPIREAT` is the latest
//! expiry among its live fields, so the key never goes before any share; no script
//! shortens a field (extend only raises it), so a share is never cut short by another's
//! renewal, and a failed extension leaves the old validity backed where it landed.
//!
//! - Read (`rw_read_acquire.lua`): refused while a writer field or an intent is live,
//!   else sets our share.
//! - Write (`rw_write_acquire.lua`): refused while any share or another writer is live,
//!   else sets our grant and removes our own intent.
//! - Release (`rw_release.lua`): removes our own field (and, for a writer that was
//!   granted, its intent where it lingers); when no share and no writer remain, publishes on
//!   the key's release channel, so waiters of [`Redlock::read`] and [`Redlock::write`]
//!   wake up at once. A reader's release while other readers remain wakes nobody: nobody
//!   could proceed.
//! - Extend (`rw_extend.lua`): raises our own field's expiry if it is still live there;
//!   never sets it again where it is gone (expired, lost in a restart): such a node no
//!   longer counts.
//!
//! Tokens are per attempt, as for the plain lock, so release and extend go to every node:
//! where our field is absent they change nothing and answer "absent".
//!
//! # Quorum and validity
//! Each grant (share or write) is a Redlock acquisition of its own over all nodes: decided
//! at the quorum, every request bounded by the node timeout, validity `ttl - elapsed -
//! drift` from the round's start, a failed attempt released on every node where it may
//! have landed (never overtaking its own acquisition in flight). A writer is granted only
//! where no live share exists, and a reader only where no live writer exists; since two
//! quorums always share a node, a write grant and a read share (or two write grants) are
//! never valid at once. A share that expired, or a node that failed, does not free the
//! writer early: the writer still needs a quorum of nodes that have no live share, and
//! each valid share is live on a quorum.
//!
//! # Writer preference
//! A writer that waits ([`Redlock::write`]) and is refused records an intent `i:<id>` on
//! each node that refused it, with a lifetime covering the pause to its next attempt
//! (`2 x (retry delay + jitter) + 4 x node timeout`, at least 50 ms). A live intent refuses
//! NEW readers (existing shares stay, and can be extended), so a stream of readers cannot
//! starve the writer: the shares drain, and the last release wakes the writer. The intent
//! is renewed by each refused attempt, removed by the granted one, and withdrawn when the
//! writer gives up (or its future is dropped); a writer that crashes leaves it to expire.
//! [`Redlock::try_write`] records no intent (a single attempt does not wait), and
//! [`WriterPriority::None`] turns the preference off for a waiting writer. Writers among
//! themselves are not ordered.
//!
//! # Limits
//! - No upgrade or downgrade: a task that holds a share and waits to write waits for its
//!   own share to expire.
//! - No reentrancy: each acquisition is a new share or grant.
//! - Do not use one resource both as a read-write lock and as a reentrant lock: both are
//!   hashes, and only fields named like ours (`r:`, `w:`, `i:` with a number as value)
//!   are told apart.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redis::Value;

use super::{Held, Label, Protocol};
use crate::builder::check_ttl;
use crate::error::{Error, NodeOutcome, Result};
use crate::fanout;
use crate::lease::{Keeper, Lease, Renewable};
use crate::node::Node;
use crate::notify;
use crate::protocol::{script_outcome, unexpected, vote};
use crate::redlock::{Inner, Redlock};
use crate::script;
use crate::token;

/// The shortest intent lifetime, whatever the retry policy.
const MIN_INTENT: Duration = Duration::from_millis(50);

/// Whether a waiting writer blocks new readers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WriterPriority {
    /// The default: a refused writer records an intent that refuses new readers until it
    /// is granted or gives up, so a steady stream of readers cannot starve it.
    #[default]
    Preferred,
    /// The writer waits like any other client: readers keep coming while it waits, and
    /// under a steady read load it may never get in.
    None,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Read,
    Write,
}

impl Mode {
    fn kind(self) -> &'static str {
        match self {
            Self::Read => "read lock",
            Self::Write => "write lock",
        }
    }
}

/// A waiting writer's intent: its field and lifetime, the same for all its attempts.
#[derive(Clone, Debug)]
struct Intent {
    field: Arc<str>,
    ms: u64,
}

/// The per-node protocol of one share or one write grant.
pub(crate) struct Share {
    key: Arc<str>,
    mode: Mode,
    token: Arc<str>,
    /// `r:<token>` or `w:<token>`.
    field: Arc<str>,
    channel: Arc<str>,
    intent: Option<Intent>,
    /// Set once the grant is handed out: from then on the release also withdraws the
    /// intent where it lingers (the nodes that refused us). A failed attempt's clean-up
    /// keeps it: the writer still waits.
    granted: AtomicBool,
}

impl Protocol for Share {
    /// A token names one acquisition, so release and extend may go to every node.
    const PER_HOLD: bool = false;

    async fn acquire(&self, node: Arc<Node>, ttl_ms: u64) -> NodeOutcome {
        let ttl = ttl_ms.to_string();
        let keys = [&*self.key];
        let reply = match (&self.mode, &self.intent) {
            (Mode::Read, _) => {
                let args: [&[u8]; 2] = [self.field.as_bytes(), ttl.as_bytes()];
                node.eval(&script::RW_READ_ACQUIRE, &keys, &args).await
            }
            (Mode::Write, intent) => {
                let (field, ms) = match intent {
                    Some(intent) => (intent.field.as_bytes(), intent.ms.to_string()),
                    None => (&b""[..], "0".to_owned()),
                };
                let args: [&[u8]; 4] =
                    [self.field.as_bytes(), ttl.as_bytes(), field, ms.as_bytes()];
                node.eval(&script::RW_WRITE_ACQUIRE, &keys, &args).await
            }
        };
        match reply {
            Ok(Value::Int(1)) => vote(&node),
            // -1: a writer holds it (or, for a writer, readers do); -2: a writer waits.
            Ok(Value::Int(-1 | -2)) => NodeOutcome::Held,
            Ok(other) => unexpected(&other),
            Err(failure) => failure.into_outcome(),
        }
    }

    async fn release(&self, node: Arc<Node>) -> NodeOutcome {
        let intent = match &self.intent {
            Some(intent) if self.granted.load(Ordering::Acquire) => intent.field.as_bytes(),
            _ => b"",
        };
        let args: [&[u8]; 3] = [self.field.as_bytes(), self.channel.as_bytes(), intent];
        script_outcome(node.eval(&script::RW_RELEASE, &[&self.key], &args).await)
    }

    async fn extend(&self, node: Arc<Node>, ttl_ms: u64) -> NodeOutcome {
        let ttl = ttl_ms.to_string();
        let args: [&[u8]; 2] = [self.field.as_bytes(), ttl.as_bytes()];
        match script_outcome(node.eval(&script::RW_EXTEND, &[&self.key], &args).await) {
            NodeOutcome::Ok => vote(&node),
            other => other,
        }
    }
}

/// A validated request: the resource, its key and channel, and the lease.
struct Request<'a> {
    resource: &'a str,
    key: Arc<str>,
    channel: Arc<str>,
    ttl_ms: u64,
}

impl<'a> Request<'a> {
    fn new(rl: &Redlock, resource: &'a str, ttl: Duration) -> Result<Self> {
        let ttl_ms = check_ttl(ttl, rl.inner().config.drift_factor)?;
        let key = rl.inner().key(resource)?;
        let channel = notify::channel(&key);
        Ok(Self { resource, key, channel, ttl_ms })
    }

    /// One acquisition attempt of a share or a write grant, under a fresh token.
    async fn attempt(&self, rl: &Redlock, mode: Mode, intent: Option<&Intent>) -> Result<Guard> {
        let token = token::generate();
        let prefix = match mode {
            Mode::Read => "r:",
            Mode::Write => "w:",
        };
        let proto = Arc::new(Share {
            key: self.key.clone(),
            mode,
            field: format!("{prefix}{token}").into(),
            token: token.into(),
            channel: self.channel.clone(),
            intent: intent.cloned(),
            granted: AtomicBool::new(false),
        });
        let label = Label { kind: mode.kind(), resource: self.resource };
        let held = super::attempt(rl.inner(), proto, self.ttl_ms, label).await?;
        held.proto().granted.store(true, Ordering::Release);
        Ok(Guard {
            held,
            resource_len: self.resource.len(),
            ttl: Duration::from_millis(self.ttl_ms),
        })
    }
}

/// Withdraws a waiting writer's intent from every node once it gives up (or its future is
/// dropped), in the background; an intent the withdrawal misses expires on its own.
struct Withdraw {
    inner: Arc<Inner>,
    key: Arc<str>,
    channel: Arc<str>,
    intent: Intent,
    armed: bool,
}

impl Drop for Withdraw {
    fn drop(&mut self) {
        if !self.armed || tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        let timeout = self.inner.config.node_timeout;
        let requests = self.inner.nodes.iter().map(|node| {
            let (node, key) = (node.clone(), self.key.clone());
            let (channel, intent) = (self.channel.clone(), self.intent.field.clone());
            fanout::bounded(timeout, async move {
                let args: [&[u8]; 3] = [b"", channel.as_bytes(), intent.as_bytes()];
                script_outcome(node.eval(&script::RW_RELEASE, &[&key], &args).await)
            })
        });
        fanout::in_background(requests.collect::<Vec<_>>());
    }
}

impl Redlock {
    /// One attempt to take a read share of `resource`, for the default TTL.
    ///
    /// Succeeds when no writer holds the resource and none waits for it (writer
    /// preference): any number of readers hold shares at once, each with its own token and
    /// validity. Fails like [`try_lock`](Redlock::try_lock): [`ErrorKind::NotAcquired`]
    /// when a writer holds or waits for it, [`ErrorKind::Unavailable`],
    /// [`ErrorKind::Expired`], [`ErrorKind::WrongType`] when the key is not a read-write
    /// lock (a plain [`Lock`](crate::Lock)'s key included), [`ErrorKind::Config`] for an
    /// empty resource name. A failed attempt removes whatever it may have set.
    ///
    /// [`ErrorKind::NotAcquired`]: crate::ErrorKind::NotAcquired
    /// [`ErrorKind::Unavailable`]: crate::ErrorKind::Unavailable
    /// [`ErrorKind::Expired`]: crate::ErrorKind::Expired
    /// [`ErrorKind::WrongType`]: crate::ErrorKind::WrongType
    /// [`ErrorKind::Config`]: crate::ErrorKind::Config
    pub async fn try_read(&self, resource: &str) -> Result<ReadLock> {
        self.try_read_for(resource, self.ttl()).await
    }

    /// One attempt to take a read share of `resource`, for `ttl`.
    pub async fn try_read_for(&self, resource: &str, ttl: Duration) -> Result<ReadLock> {
        let request = Request::new(self, resource, ttl)?;
        Ok(ReadLock { guard: request.attempt(self, Mode::Read, None).await? })
    }

    /// Takes a read share of `resource` for the default TTL, retrying per the
    /// [`Retry`](crate::Retry) policy, like [`lock`](Redlock::lock): cancellation-safe, and
    /// woken between attempts when the writer releases.
    pub async fn read(&self, resource: &str) -> Result<ReadLock> {
        self.read_for(resource, self.ttl()).await
    }

    /// Takes a read share of `resource` for `ttl`, retrying per the
    /// [`Retry`](crate::Retry) policy.
    pub async fn read_for(&self, resource: &str, ttl: Duration) -> Result<ReadLock> {
        let request = Request::new(self, resource, ttl)?;
        let guard = self.retrying(&request.key, || request.attempt(self, Mode::Read, None)).await?;
        Ok(ReadLock { guard })
    }

    /// One attempt to take `resource` for writing, for the default TTL.
    ///
    /// Succeeds when no reader and no other writer holds it. A single attempt records no
    /// writer intent (see [`write`](Redlock::write)). Fails like
    /// [`try_read`](Redlock::try_read), with [`ErrorKind::NotAcquired`] when readers or
    /// another writer hold it.
    ///
    /// [`ErrorKind::NotAcquired`]: crate::ErrorKind::NotAcquired
    pub async fn try_write(&self, resource: &str) -> Result<WriteLock> {
        self.try_write_for(resource, self.ttl()).await
    }

    /// One attempt to take `resource` for writing, for `ttl`.
    pub async fn try_write_for(&self, resource: &str, ttl: Duration) -> Result<WriteLock> {
        let request = Request::new(self, resource, ttl)?;
        Ok(WriteLock { guard: request.attempt(self, Mode::Write, None).await? })
    }

    /// Takes `resource` for writing for the default TTL, retrying per the
    /// [`Retry`](crate::Retry) policy, with writer preference
    /// ([`WriterPriority::Preferred`]): once refused, it blocks new readers until it is
    /// granted or gives up, and it is woken when the last share or the other writer goes.
    pub async fn write(&self, resource: &str) -> Result<WriteLock> {
        self.write_with(resource, self.ttl(), WriterPriority::Preferred).await
    }

    /// Takes `resource` for writing for `ttl`, with writer preference.
    pub async fn write_for(&self, resource: &str, ttl: Duration) -> Result<WriteLock> {
        self.write_with(resource, ttl, WriterPriority::Preferred).await
    }

    /// Takes `resource` for writing for `ttl`, retrying per the [`Retry`](crate::Retry)
    /// policy, with the given [`WriterPriority`]. Cancellation-safe: dropping the future
    /// releases whatever the attempt in progress may have set and withdraws the intent in
    /// the background.
    pub async fn write_with(
        &self,
        resource: &str,
        ttl: Duration,
        priority: WriterPriority,
    ) -> Result<WriteLock> {
        let request = Request::new(self, resource, ttl)?;
        let intent = (priority == WriterPriority::Preferred).then(|| Intent {
            field: format!("i:{}", token::generate()).into(),
            ms: self.intent_ms(),
        });
        let mut withdraw = intent.clone().map(|intent| Withdraw {
            inner: self.inner().clone(),
            key: request.key.clone(),
            channel: request.channel.clone(),
            intent,
            armed: true,
        });
        let guard = self
            .retrying(&request.key, || request.attempt(self, Mode::Write, intent.as_ref()))
            .await?;
        // Granted: the release withdraws the intent where it lingers.
        if let Some(withdraw) = &mut withdraw {
            withdraw.armed = false;
        }
        Ok(WriteLock { guard })
    }

    /// How long a refused writer's intent lives: past its next attempt.
    fn intent_ms(&self) -> u64 {
        let config = &self.inner().config;
        let pause = config.retry.delay().saturating_add(config.retry.jitter());
        let gap = pause.saturating_mul(2).saturating_add(config.node_timeout.saturating_mul(4));
        // Bounded like a lease, so that the node's expiry arithmetic stays exact.
        let ms = gap.clamp(MIN_INTENT, crate::quorum::MAX_TTL).as_millis();
        u64::try_from(ms).unwrap_or(u64::MAX)
    }
}

/// What a share and a write grant have in common.
struct Guard {
    held: Held<Share>,
    resource_len: usize,
    ttl: Duration,
}

impl Guard {
    fn resource(&self) -> &str {
        let key = &*self.held.proto().key;
        &key[key.len() - self.resource_len..]
    }

    fn label(&self) -> (&'static str, String) {
        (self.held.proto().mode.kind(), self.resource().to_owned())
    }

    async fn extend(&mut self, ttl: Duration) -> Result<()> {
        let (kind, resource) = self.label();
        self.held.extend(ttl, Label { kind, resource: &resource }).await?;
        // `extend` accepted the lease, so it is whole milliseconds within range.
        self.ttl = Duration::from_millis(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX));
        Ok(())
    }

    async fn release(self) -> Result<()> {
        let (kind, resource) = self.label();
        self.held.release(Label { kind, resource: &resource }).await
    }
}

/// The methods a [`ReadLock`] and a [`WriteLock`] share.
macro_rules! guard_methods {
    ($guard:ident, $auto:ident, $what:literal) => {
        impl fmt::Debug for $guard {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($guard))
                    .field("resource", &self.resource())
                    .field("token", &self.token())
                    .field("validity", &self.validity())
                    .finish()
            }
        }

        impl $guard {
            /// The resource name, as passed to the lock call.
            pub fn resource(&self) -> &str {
                self.guard.resource()
            }

            /// The Redis key (the resource name behind the configured prefix): one hash
            /// per lock, holding every share and the writer.
            pub fn key(&self) -> &str {
                &self.guard.held.proto().key
            }

            #[doc = concat!("The random token of this ", $what, ": its field in the hash is `")]
            #[doc = concat!(stringify!($guard), "::field()`.")]
            pub fn token(&self) -> &str {
                &self.guard.held.proto().token
            }

            #[doc = concat!("The hash field of this ", $what, " (`r:<token>` or `w:<token>`),")]
            /// whose value is its expiry in the node's milliseconds.
            pub fn field(&self) -> &str {
                &self.guard.held.proto().field
            }

            /// What remains of the lease, counting down; [`Duration::ZERO`] once it is
            /// over. Timed from this acquisition's own round: other shares neither
            /// lengthen nor shorten it.
            pub fn validity(&self) -> Duration {
                self.guard.held.validity()
            }

            /// The instant at which the validity ends.
            pub fn deadline(&self) -> Instant {
                self.guard.held.deadline()
            }

            /// Whether the validity has not run out yet.
            pub fn is_valid(&self) -> bool {
                self.guard.held.is_valid()
            }

            /// The lease of the last grant or extension, as sent to Redis.
            pub fn ttl(&self) -> Duration {
                self.guard.ttl
            }

            #[doc = concat!("Renews this ", $what, " to `ttl` from now on every node where it")]
            /// is still live (never shortening it there, never setting it again where it
            /// is gone, never touching another's field).
            ///
            /// Behaves as [`Lock::extend`](crate::Lock::extend): a quorum is needed, only
            /// while still valid; the new validity is timed from the start of this call; a
            /// failed extension deletes nothing and keeps the current validity.
            pub async fn extend(&mut self, ttl: Duration) -> Result<()> {
                self.guard.extend(ttl).await
            }

            #[doc = concat!("Releases this ", $what, " on every node, never touching another")]
            /// reader's share or writer's grant; when the lock becomes free, waiters are
            /// woken. Results as [`Lock::release`](crate::Lock::release).
            pub async fn release(self) -> Result<()> {
                self.guard.release().await
            }

            #[doc = concat!("Keeps this ", $what, " alive in the background (about every third")]
            /// of its lease) until it is released or lost, with a lost-lock signal, as
            /// [`Lock::auto_extend`](crate::Lock::auto_extend) does.
            pub fn auto_extend(self) -> $auto {
                $auto { keeper: Keeper::start(self, None) }
            }

            #[doc = concat!("Like [`auto_extend`](", stringify!($guard), "::auto_extend), but")]
            /// stops extending once held for `max_hold` (counted from this call).
            pub fn auto_extend_capped(self, max_hold: Duration) -> $auto {
                $auto { keeper: Keeper::start(self, Some(max_hold)) }
            }
        }

        impl Renewable for $guard {
            fn resource(&self) -> &str {
                $guard::resource(self)
            }

            fn token(&self) -> &str {
                $guard::token(self)
            }

            fn deadline(&self) -> Instant {
                $guard::deadline(self)
            }

            fn ttl(&self) -> Duration {
                $guard::ttl(self)
            }

            async fn extend(&mut self, ttl: Duration) -> Result<()> {
                $guard::extend(self, ttl).await
            }

            async fn release(self) -> Result<()> {
                $guard::release(self).await
            }
        }

        #[doc = concat!("A [`", stringify!($guard), "`] that keeps itself alive: extended in")]
        /// the background about every third of its lease while it is held, with a
        /// lost-lock signal ([`lost()`](Lease::lost)). Behaves as
        /// [`AutoLock`](crate::AutoLock).
        ///
        /// Call `release()` when done. Dropping it stops the extension and releases in the
        /// background.
        #[must_use = "dropping it stops its extension and releases in the background"]
        pub struct $auto {
            keeper: Keeper<$guard>,
        }

        impl fmt::Debug for $auto {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($auto))
                    .field("lease", self.keeper.lease())
                    .finish_non_exhaustive()
            }
        }

        impl $auto {
            /// A handle on the lease for the tasks doing the work.
            pub fn lease(&self) -> Lease {
                self.keeper.lease().clone()
            }

            /// What remains of the current lease.
            pub fn validity(&self) -> Duration {
                self.keeper.lease().validity()
            }

            /// Completes when the lock is lost; see [`Lease::lost`].
            pub async fn lost(&self) -> Error {
                self.keeper.lease().lost().await
            }

            /// Stops the extension (waiting for one in flight) and releases. Fails with the
            /// loss if it was lost at any point, else with the release's own error.
            pub async fn release(self) -> Result<()> {
                self.keeper.release().await
            }
        }
    };
}

/// One reader's share of a read-write lock, held on a quorum of nodes, valid until
/// [`validity()`](ReadLock::validity) reaches zero.
///
/// Other readers may hold shares at the same time; no writer holds the resource while this
/// share is valid. Call [`release()`](ReadLock::release) when done; dropped without it, the
/// share is released in the background on the Tokio runtime (never blocking in `Drop`),
/// and dropped outside a runtime it is left to expire. `Send + 'static`.
#[must_use = "dropping a ReadLock releases its share at once, in the background"]
pub struct ReadLock {
    guard: Guard,
}

/// The write side of a read-write lock, held on a quorum of nodes, valid until
/// [`validity()`](WriteLock::validity) reaches zero: no reader and no other writer holds
/// the resource meanwhile.
///
/// Call [`release()`](WriteLock::release) when done; dropped without it, it is released in
/// the background on the Tokio runtime (never blocking in `Drop`), and dropped outside a
/// runtime it is left to expire. `Send + 'static`.
#[must_use = "dropping a WriteLock releases it at once, in the background"]
pub struct WriteLock {
    guard: Guard,
}

guard_methods!(ReadLock, AutoReadLock, "share");
guard_methods!(WriteLock, AutoWriteLock, "write grant");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_and_write_locks_can_move_across_tasks() {
        fn send_static<T: Send + 'static>() {}
        send_static::<ReadLock>();
        send_static::<WriteLock>();
        send_static::<AutoReadLock>();
        send_static::<AutoWriteLock>();
    }
}
