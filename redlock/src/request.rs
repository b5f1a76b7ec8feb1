//! The acquisition surface: one request value per lock kind, options as methods, awaited
//! directly (`IntoFuture`): `rl.lock("orders:42").ttl(d).fenced().await`.

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::config::Config;
use crate::engine::{self, Core, Plan};
use crate::error::{Error, ErrorKind, Result};
use crate::kinds::multi::{Multi, MultiLock, Set};
use crate::kinds::plain::{Lock, Plain};
use crate::kinds::reentrant::{Reentrant, ReentrantLock};
use crate::kinds::rwlock::{Intent, Mode, ReadLock, Share, WriteLock, WriterPriority};
use crate::kinds::semaphore::{Permit, Permits};
use crate::retry::Retry;

/// The future of a request.
pub type Acquiring<'a, G> = Pin<Box<dyn Future<Output = Result<G>> + Send + 'a>>;

/// The options every request has.
#[derive(Clone, Debug, Default)]
struct Options {
    ttl: Option<Duration>,
    wait: Wait,
    fenced: bool,
}

#[derive(Clone, Debug, Default)]
enum Wait {
    /// The client's retry policy.
    #[default]
    Policy,
    /// A single attempt.
    Once,
    /// This request's own policy.
    Retry(Retry),
}

impl Options {
    fn plan(&self, config: &Config) -> Result<Plan> {
        let ttl = config.ttl(self.ttl)?;
        let retry = match &self.wait {
            Wait::Policy => Some(config.retry),
            Wait::Once => None,
            Wait::Retry(retry) => {
                retry.validate().map_err(Error::config)?;
                Some(*retry)
            }
        };
        let retry = retry.map(|retry| retry.until_ttl(ttl.duration()));
        Ok(Plan { ttl, retry, fenced: self.fenced })
    }
}

/// The options every request type has, generated once.
macro_rules! options {
    ($name:ident) => {
        impl $name<'_> {
            /// The TTL of this lock, instead of the client's default
            /// ([`RedlockBuilder::ttl`](crate::RedlockBuilder::ttl)). Checked when awaited:
            /// at least 1 ms and longer than its drift allowance.
            pub fn ttl(mut self, ttl: Duration) -> Self {
                self.options.ttl = Some(ttl);
                self
            }

            /// A single attempt instead of waiting per the retry policy: fails at once with
            /// [`ErrorKind::NotAcquired`](crate::ErrorKind::NotAcquired) when the lock is
            /// held.
            pub fn once(mut self) -> Self {
                self.options.wait = Wait::Once;
                self
            }

            /// Waits per `retry` instead of the client's policy
            /// ([`RedlockBuilder::retry`](crate::RedlockBuilder::retry)).
            pub fn retry(mut self, retry: Retry) -> Self {
                self.options.wait = Wait::Retry(retry);
                self
            }
        }
    };
}

/// A request for a [`Lock`]: [`Redlock::lock`](crate::Redlock::lock) (waits per the retry
/// policy) or [`Redlock::try_lock`](crate::Redlock::try_lock) (one attempt). Await it.
#[derive(Debug)]
#[must_use = "a lock request does nothing until it is awaited"]
pub struct LockRequest<'a> {
    core: &'a Arc<Core>,
    resource: &'a str,
    options: Options,
}

/// A request for a [`ReentrantLock`]: [`Redlock::reentrant`](crate::Redlock::reentrant).
#[derive(Debug)]
#[must_use = "a lock request does nothing until it is awaited"]
pub struct ReentrantRequest<'a> {
    core: &'a Arc<Core>,
    resource: &'a str,
    owner: &'a str,
    options: Options,
}

/// A request for a [`MultiLock`]: [`Redlock::many`](crate::Redlock::many).
#[derive(Debug)]
#[must_use = "a lock request does nothing until it is awaited"]
pub struct MultiRequest<'a> {
    core: &'a Arc<Core>,
    resources: &'a [&'a str],
    options: Options,
}

/// A request for a [`ReadLock`]: [`Redlock::read`](crate::Redlock::read).
#[derive(Debug)]
#[must_use = "a lock request does nothing until it is awaited"]
pub struct ReadRequest<'a> {
    core: &'a Arc<Core>,
    resource: &'a str,
    options: Options,
}

/// A request for a [`WriteLock`]: [`Redlock::write`](crate::Redlock::write).
#[derive(Debug)]
#[must_use = "a lock request does nothing until it is awaited"]
pub struct WriteRequest<'a> {
    core: &'a Arc<Core>,
    resource: &'a str,
    priority: WriterPriority,
    options: Options,
}

/// A request for a [`Permit`] of a counting lock:
/// [`Redlock::semaphore`](crate::Redlock::semaphore). Await it.
#[derive(Debug)]
#[must_use = "a lock request does nothing until it is awaited"]
pub struct SemaphoreRequest<'a> {
    core: &'a Arc<Core>,
    resource: &'a str,
    permits: u32,
    options: Options,
}

options!(LockRequest);
options!(ReentrantRequest);
options!(MultiRequest);
options!(ReadRequest);
options!(WriteRequest);
options!(SemaphoreRequest);

impl<'a> LockRequest<'a> {
    pub(crate) fn new(core: &'a Arc<Core>, resource: &'a str, once: bool) -> Self {
        let wait = if once { Wait::Once } else { Wait::Policy };
        Self { core, resource, options: Options { wait, ..Options::default() } }
    }

    /// Also takes a fencing token ([`Lock::fencing_token`]), larger than that of any
    /// earlier grant of the resource, fixed on a quorum before the lock is handed out (two
    /// more round trips). See [`crate::guide::fencing`].
    pub fn fenced(mut self) -> Self {
        self.options.fenced = true;
        self
    }
}

impl<'a> ReentrantRequest<'a> {
    pub(crate) fn new(core: &'a Arc<Core>, resource: &'a str, owner: &'a str) -> Self {
        Self { core, resource, owner, options: Options::default() }
    }
}

impl<'a> MultiRequest<'a> {
    pub(crate) fn new(core: &'a Arc<Core>, resources: &'a [&'a str]) -> Self {
        Self { core, resources, options: Options::default() }
    }
}

impl<'a> ReadRequest<'a> {
    pub(crate) fn new(core: &'a Arc<Core>, resource: &'a str) -> Self {
        Self { core, resource, options: Options::default() }
    }
}

impl<'a> WriteRequest<'a> {
    pub(crate) fn new(core: &'a Arc<Core>, resource: &'a str) -> Self {
        Self { core, resource, priority: WriterPriority::Preferred, options: Options::default() }
    }

    /// Whether a waiting writer blocks new readers ([`WriterPriority::Preferred`], the
    /// default) or not.
    pub fn priority(mut self, priority: WriterPriority) -> Self {
        self.priority = priority;
        self
    }

    /// Also takes a fencing token, as [`LockRequest::fenced`] does.
    pub fn fenced(mut self) -> Self {
        self.options.fenced = true;
        self
    }
}

impl<'a> SemaphoreRequest<'a> {
    pub(crate) fn new(core: &'a Arc<Core>, resource: &'a str, permits: u32) -> Self {
        Self { core, resource, permits, options: Options::default() }
    }

    /// Also takes a fencing token ([`Permit::fencing_token`]) for the permit's slot: larger
    /// than that of any earlier grant of the same slot, not of the resource (L holders are
    /// valid at once, so one order over all of them would fence out the other holders).
    /// A store that keeps the highest token per `(resource, slot)` rejects the writes of a
    /// permit whose lease ran out once its slot's next holder wrote. See
    /// [`crate::guide::semaphore`].
    pub fn fenced(mut self) -> Self {
        self.options.fenced = true;
        self
    }
}

impl<'a> IntoFuture for LockRequest<'a> {
    type Output = Result<Lock>;
    type IntoFuture = Acquiring<'a, Lock>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let (core, config) = (self.core, &self.core.config);
            let (resource, key) = config.name_and_key(self.resource)?;
            let plan = self.options.plan(config)?;
            let new = || Plain::new(key.clone(), label_of(core));
            let claim = engine::obtain(core, &plan, resource, new, None).await?;
            Ok(Lock::from_claim(claim))
        })
    }
}

impl<'a> IntoFuture for ReentrantRequest<'a> {
    type Output = Result<ReentrantLock>;
    type IntoFuture = Acquiring<'a, ReentrantLock>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let (core, config) = (self.core, &self.core.config);
            let (resource, key) = config.name_and_key(self.resource)?;
            let owner = Reentrant::check_owner(self.owner)?;
            let plan = self.options.plan(config)?;
            let new = || Reentrant::new(key.clone(), owner.clone(), label_of(core));
            let claim = engine::obtain(core, &plan, resource, new, None).await?;
            Ok(ReentrantLock::from_claim(claim))
        })
    }
}

impl<'a> IntoFuture for MultiRequest<'a> {
    type Output = Result<MultiLock>;
    type IntoFuture = Acquiring<'a, MultiLock>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let (core, config) = (self.core, &self.core.config);
            let set = Set::new(config, self.resources)?;
            let plan = self.options.plan(config)?;
            let label = set.label().clone();
            let claim = engine::obtain(
                core,
                &plan,
                label,
                || Multi::new(set.clone(), label_of(core)),
                None,
            )
            .await?;
            Ok(MultiLock::from_claim(claim))
        })
    }
}

impl<'a> IntoFuture for ReadRequest<'a> {
    type Output = Result<ReadLock>;
    type IntoFuture = Acquiring<'a, ReadLock>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let (core, config) = (self.core, &self.core.config);
            let (resource, key) = config.name_and_key(self.resource)?;
            let plan = self.options.plan(config)?;
            let new = || Share::new(key.clone(), Mode::Read, None, label_of(core));
            let claim = engine::obtain(core, &plan, resource, new, None).await?;
            Ok(ReadLock::from_claim(claim))
        })
    }
}

impl<'a> IntoFuture for WriteRequest<'a> {
    type Output = Result<WriteLock>;
    type IntoFuture = Acquiring<'a, WriteLock>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let (core, config) = (self.core, &self.core.config);
            let (resource, key) = config.name_and_key(self.resource)?;
            let plan = self.options.plan(config)?;
            // Only a writer that waits records an intent: a single attempt never blocks
            // readers.
            let intent = match (&plan.retry, self.priority) {
                (Some(retry), WriterPriority::Preferred) => {
                    Some(Intent::new(config, retry, core.nodes.len()))
                }
                _ => None,
            };
            let withdrawal = intent.as_ref().map(|intent| intent.withdrawal(&key));
            let new = || Share::new(key.clone(), Mode::Write, intent.clone(), label_of(core));
            let claim = engine::obtain(core, &plan, resource, new, withdrawal).await?;
            Ok(WriteLock::from_claim(claim))
        })
    }
}

impl<'a> IntoFuture for SemaphoreRequest<'a> {
    type Output = Result<Permit>;
    type IntoFuture = Acquiring<'a, Permit>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let core = self.core;
            let permits = Permits::new(&core.config, self.resource, self.permits)?;
            let plan = self.options.plan(&core.config)?;
            let attempt = || try_slots(core, &plan, &permits);
            let result =
                engine::obtain_any(core, &plan, "permit", permits.count_key().clone(), attempt)
                    .await;
            match (result, permits.mismatch()) {
                (Ok(claim), _) => Ok(Permit::from_claim(claim)),
                // Refused for good by nodes that record another count.
                (Err(err), Some(other)) if err.kind() == ErrorKind::WrongType => {
                    Err(Error::config(format!(
                        "`{}` is a counting lock of {other} permits on the nodes (while any is \
                         held), not {}: every client must use the same count",
                        permits.resource(),
                        permits.permits()
                    )))
                }
                (Err(err), _) => Err(err),
            }
        })
    }
}

/// One attempt at a counting lock: one round per slot, from a random one on, until one is
/// granted. Another outcome than contention ends it at once: nodes down or slow for one
/// slot are so for all. Refused, it reports the slot round that got the most votes (a
/// split vote the wait retries quickly, if any).
async fn try_slots(
    core: &Arc<Core>,
    plan: &Plan,
    permits: &Permits,
) -> Result<engine::Claim<crate::kinds::semaphore::PermitHold>> {
    let count = permits.permits();
    let start = rand::random_range(0..count);
    let mut refused: Option<Error> = None;
    for i in 0..count {
        // `start + i` modulo `count`, without overflow.
        let slot = if i < count - start { start + i } else { i - (count - start) };
        let hold = permits.hold(slot, label_of(core));
        let attempt =
            engine::Claim::acquire(core, hold, plan.ttl, permits.resource().clone(), plan.fenced);
        match attempt.await {
            Ok(claim) => return Ok(claim),
            Err(err) if err.kind() == ErrorKind::NotAcquired => {
                if refused.as_ref().is_none_or(|best| err.granted() > best.granted()) {
                    refused = Some(err);
                }
            }
            Err(err) => return Err(err),
        }
    }
    Err(refused.unwrap_or_else(|| Error::config("a counting lock needs at least one permit")))
}

/// The client's owner label, for the tokens of its holds.
fn label_of(core: &crate::engine::Core) -> Option<&str> {
    core.config.owner_label.as_deref()
}
