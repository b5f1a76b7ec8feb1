//! The client: one entry point per lock kind.

use std::fmt;
use std::future::{Future, IntoFuture};
use std::sync::Arc;
use std::time::Duration;

use crate::engine::Core;
use crate::error::Result;
use crate::guard::Guard;
use crate::lease::{self, Lease};
use crate::quorum;
use crate::request::{
    Acquiring, LockRequest, MultiRequest, ReadRequest, ReentrantRequest, SemaphoreRequest,
    WriteRequest,
};

/// A client for distributed locks over N independent Redis masters.
///
/// Cheap to clone (an `Arc` inside) and `Send + Sync + 'static`: build one per process
/// and share it. Every node has one multiplexed connection, opened on first use and shared
/// by all clones and all locks.
///
/// One entry point per lock kind, each returning a request to await, with options as
/// methods (`.ttl(d)`, `.once()`, `.retry(policy)`, and `.fenced()` where it applies):
///
/// | call | guard | what |
/// | --- | --- | --- |
/// | [`lock`](Redlock::lock) / [`try_lock`](Redlock::try_lock) | [`Lock`](crate::Lock) | one owner at a time |
/// | [`reentrant`](Redlock::reentrant) | [`ReentrantLock`](crate::ReentrantLock) | re-acquirable by the same owner id |
/// | [`many`](Redlock::many) | [`MultiLock`](crate::MultiLock) | several resources, all or none |
/// | [`read`](Redlock::read) / [`write`](Redlock::write) | [`ReadLock`](crate::ReadLock) / [`WriteLock`](crate::WriteLock) | many readers or one writer |
/// | [`semaphore`](Redlock::semaphore) | [`Permit`](crate::Permit) | at most L holders at once |
/// | [`with_lock`](Redlock::with_lock) | [`Lease`] | any of the above, kept alive while work runs |
#[derive(Clone)]
pub struct Redlock {
    pub(crate) core: Arc<Core>,
}

impl fmt::Debug for Redlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redlock")
            .field("nodes", &self.core.nodes)
            .field("quorum", &self.quorum())
            .field("config", &self.core.config)
            .finish()
    }
}

impl Redlock {
    pub(crate) fn from_core(core: Core) -> Self {
        Self { core: Arc::new(core) }
    }

    /// How many nodes must agree: `N/2 + 1`.
    pub fn quorum(&self) -> usize {
        quorum::quorum(self.core.nodes.len())
    }

    /// How many nodes are configured.
    pub fn node_count(&self) -> usize {
        self.core.nodes.len()
    }

    /// The default lease, as sent to Redis (whole milliseconds).
    pub fn ttl(&self) -> Duration {
        self.core.config.ttl.duration()
    }

    /// Opens every node's connection now, all at once, each bounded by the
    /// [connect timeout](crate::RedlockBuilder::connect_timeout): a process that takes one
    /// lock and exits (a command-line tool, a cron job) or must lock soon after it starts
    /// pays the connects (TCP, TLS, AUTH, the script preload, the server check) here rather
    /// than in its first attempt. Optional: a request to a node with no connection waits for
    /// the connect first anyway (see the crate docs, "How a lock is taken"). Nodes already
    /// connected answer at once.
    ///
    /// ```no_run
    /// # async fn run(rl: redlock::Redlock) -> Result<(), redlock::Error> {
    /// for node in rl.connect().await? {
    ///     println!("{}: {}", node.node(), node.outcome()); // "ok", or why not
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`ErrorKind::Unavailable`](crate::ErrorKind::Unavailable) when fewer than a quorum
    /// of nodes could be connected to; [`Error::nodes`](crate::Error::nodes) says why each
    /// failed (timed out, unreachable, a certificate or login refused). On `Ok`, the
    /// reports say the same of each node, in the order of the nodes: a minority may still
    /// have failed.
    pub async fn connect(&self) -> Result<Vec<crate::NodeReport>> {
        self.core.connect().await
    }

    /// Locks `resource`, waiting per the [`Retry`](crate::Retry) policy; await the request.
    /// By default it waits for up to one TTL of the lock (10 s unless set), then answers
    /// [`ErrorKind::NotAcquired`](crate::ErrorKind::NotAcquired); `.once()` (or
    /// [`try_lock`](Redlock::try_lock)) makes a single attempt, `.retry(policy)` waits per
    /// another policy.
    ///
    /// ```no_run
    /// # async fn run(rl: redlock::Redlock) -> Result<(), redlock::Error> {
    /// use std::time::Duration;
    /// let lock = rl.lock("orders:42").await?;
    /// lock.release().await?;
    /// let lock = rl.lock("orders:42").ttl(Duration::from_secs(30)).fenced().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// Between attempts it waits for a release of the resource (published by every
    /// release, received over one pub/sub connection per node shared by all waiters) or
    /// for the policy's jittered pause, whichever comes first, so a handoff does not wait
    /// for a polling interval, and a lost notification or a lock left to expire costs at
    /// most one pause. Cancellation-safe: dropping the future releases whatever the
    /// attempt in progress may have set and unsubscribes.
    ///
    /// # Errors
    /// The last attempt's error when the policy gives up:
    /// [`ErrorKind::NotAcquired`](crate::ErrorKind::NotAcquired) when another owner holds
    /// it, [`ErrorKind::Unavailable`](crate::ErrorKind::Unavailable) when too few nodes
    /// answered, [`ErrorKind::Expired`](crate::ErrorKind::Expired) when acquiring took the
    /// whole lease; at once, [`ErrorKind::WrongType`](crate::ErrorKind::WrongType) when the
    /// key is not a lock of this kind, [`ErrorKind::Config`](crate::ErrorKind::Config) for
    /// an empty resource name or bad options. A failed attempt removes whatever it may
    /// have set.
    pub fn lock<'a>(&'a self, resource: &'a str) -> LockRequest<'a> {
        LockRequest::new(&self.core, resource, false)
    }

    /// One attempt to lock `resource`: [`lock`](Redlock::lock) with
    /// [`once()`](LockRequest::once).
    ///
    /// # Errors
    /// As [`lock`](Redlock::lock), after one attempt.
    pub fn try_lock<'a>(&'a self, resource: &'a str) -> LockRequest<'a> {
        LockRequest::new(&self.core, resource, true)
    }

    /// Takes a hold of `resource` for `owner` on a reentrant lock, waiting per the retry
    /// policy.
    ///
    /// `owner` names who holds the lock: a job or request id, chosen by the caller and the
    /// same for every hold that may nest (never a thread id: async tasks move between
    /// threads). It succeeds when the resource is free or held only by `owner`; every
    /// success is a separate [`ReentrantLock`](crate::ReentrantLock), and the lock stays
    /// held until the last of them is released or expires.
    ///
    /// # Errors
    /// As [`lock`](Redlock::lock); [`ErrorKind::WrongType`](crate::ErrorKind::WrongType)
    /// when the key is not a reentrant lock (a plain [`Lock`](crate::Lock)'s key included),
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) for an empty owner.
    pub fn reentrant<'a>(&'a self, resource: &'a str, owner: &'a str) -> ReentrantRequest<'a> {
        ReentrantRequest::new(&self.core, resource, owner)
    }

    /// Locks every resource in `resources` together, all of them or none, waiting per the
    /// retry policy.
    ///
    /// On each node, one script sets all the keys only if none is held; the set is granted
    /// when a quorum of nodes granted all of it. Taking several resources in one call,
    /// rather than one lock after another, avoids both partial sets and the deadlocks of
    /// two clients taking the same resources in different orders. Between attempts it is
    /// woken by releases of the first resource (the others are found by the pause).
    ///
    /// # Redis Cluster
    /// When every resource shares one hash tag (`{orders}:1`, `{orders}:2`; the prefix must
    /// not contain braces), all keys live in one slot and the same call works against a
    /// Redis Cluster node; without one, a cluster node answers `CROSSSLOT`, reported as a
    /// failed node.
    ///
    /// # Errors
    /// As [`lock`](Redlock::lock);
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) for an empty set, an empty name or a
    /// name given twice. Errors name the resources joined by `", "`.
    pub fn many<'a>(&'a self, resources: &'a [&'a str]) -> MultiRequest<'a> {
        MultiRequest::new(&self.core, resources)
    }

    /// Takes a read share of `resource`, waiting per the retry policy: any number of
    /// readers hold shares at once, each with its own token and validity; no writer holds
    /// the resource meanwhile, and none waits for it (writer preference).
    ///
    /// # Errors
    /// As [`lock`](Redlock::lock), with
    /// [`ErrorKind::NotAcquired`](crate::ErrorKind::NotAcquired) when a writer holds or
    /// waits for it and [`ErrorKind::WrongType`](crate::ErrorKind::WrongType) when the key
    /// is not a read-write lock.
    pub fn read<'a>(&'a self, resource: &'a str) -> ReadRequest<'a> {
        ReadRequest::new(&self.core, resource)
    }

    /// Takes `resource` for writing, waiting per the retry policy: no reader and no other
    /// writer holds it meanwhile.
    ///
    /// With [`WriterPriority::Preferred`](crate::WriterPriority::Preferred) (the default),
    /// a writer that waits records an intent on the nodes that refused it, which blocks new
    /// readers until it is granted or gives up; a single attempt
    /// ([`once()`](WriteRequest::once)) records none. Cancellation-safe: dropping the future
    /// releases whatever the attempt in progress may have set and withdraws the intent.
    ///
    /// # Errors
    /// As [`read`](Redlock::read), with
    /// [`ErrorKind::NotAcquired`](crate::ErrorKind::NotAcquired) when readers or another
    /// writer hold it.
    pub fn write<'a>(&'a self, resource: &'a str) -> WriteRequest<'a> {
        WriteRequest::new(&self.core, resource)
    }

    /// Takes one of `permits` permits of `resource` (a counting lock, or semaphore: at most
    /// `permits` holders at once), waiting per the retry policy.
    ///
    /// The resource has `permits` slots, each a plain lock of its own over the quorum; an
    /// attempt tries them one round each, from a random slot on, until one is granted
    /// ([`Permit::slot`](crate::Permit::slot) says which). Between attempts it is woken by
    /// the release of any slot. The layout on the nodes, and why a count per node would
    /// not be safe, are in [`crate::guide::semaphore`].
    ///
    /// ```no_run
    /// # async fn run(rl: redlock::Redlock) -> Result<(), redlock::Error> {
    /// // At most two nightly exports hit the warehouse at once.
    /// let permit = rl.semaphore("warehouse-export", 2).await?;
    /// println!("export on slot {}", permit.slot());
    /// permit.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// Every client of one resource must use the same `permits`: while a permit is held,
    /// the nodes refuse a request with another count (and for a lease after the last
    /// permit was taken, since the count expires with it), so two counts never mix.
    ///
    /// # Errors
    /// As [`lock`](Redlock::lock), with
    /// [`ErrorKind::NotAcquired`](crate::ErrorKind::NotAcquired) when every slot is held;
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) for `permits == 0`, an empty name,
    /// or when the nodes hold permits of the resource granted with another count.
    pub fn semaphore<'a>(&'a self, resource: &'a str, permits: u32) -> SemaphoreRequest<'a> {
        SemaphoreRequest::new(&self.core, resource, permits)
    }

    /// Shuts the client down, for a clean exit: takes no new locks (acquisitions fail with
    /// [`ErrorKind::Shutdown`](crate::ErrorKind::Shutdown)), releases every auto-extended
    /// lock still alive (their leases end), stops the release notifications and the waits
    /// of `lock()` calls, and waits up to `within` for the acquisitions under way and the
    /// releases still in flight in the background (those of locks dropped without
    /// `release()` among them). An acquisition decided after the shutdown began (its
    /// round, or its fencing round) is taken back and answers `Shutdown`; one decided
    /// before is the caller's lock, to release as usual.
    ///
    /// Call it before `main` returns: a process that exits while a release is in flight
    /// leaves that key on its nodes for the rest of its lease. Clones share the shutdown.
    ///
    /// ```no_run
    /// # async fn run(rl: redlock::Redlock) -> Result<(), redlock::Error> {
    /// use std::time::Duration;
    /// let report = rl.shutdown(Duration::from_secs(2)).await?;
    /// if !report.is_clean() {
    ///     eprintln!("{report}"); // names the nodes whose keys stay until their lease ends
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// `Ok` as long as the releases still in flight at the deadline or failed during the
    /// shutdown are on no more nodes than a quorum can spare (each was then confirmed on a
    /// quorum), with a [`ShutdownReport`](crate::ShutdownReport) naming those nodes (a node
    /// down, a reset) and what it covers: their keys stay there until their leases end,
    /// keeping no one out.
    ///
    /// # Errors
    /// [`ErrorKind::Shutdown`](crate::ErrorKind::Shutdown) when releases were not
    /// confirmed on more nodes than a quorum can spare (a hold may then still be held on
    /// a quorum until its lease ends); [`Error::nodes`](crate::Error::nodes) says which
    /// and why. Also when an acquisition was still under way at the deadline (its future
    /// not polled, its runtime blocked): the message says how many.
    pub async fn shutdown(&self, within: Duration) -> Result<crate::ShutdownReport> {
        let deadline = std::time::Instant::now() + within;
        self.core.shutdown(deadline).await
    }

    /// Takes a lock (`request`: a resource name, for a plain lock with the defaults, or any
    /// request such as `rl.write("doc").ttl(d)`), runs `work` while the lock is extended in
    /// the background, and releases it when `work` returns.
    ///
    /// `work` gets a [`Lease`] to watch: when [`Lease::lost`] completes, the lock is gone
    /// and the work should stop (`tokio::select!` on it).
    ///
    /// ```no_run
    /// # async fn run(rl: redlock::Redlock) -> Result<(), redlock::Error> {
    /// let report = rl
    ///     .with_lock("nightly-report", |lease| async move {
    ///         tokio::select! {
    ///             report = build_report() => Some(report),
    ///             err = lease.lost() => {
    ///                 eprintln!("lock lost, stopping: {err}");
    ///                 None
    ///             }
    ///         }
    ///     })
    ///     .await?;
    /// # Ok(())
    /// # }
    /// # async fn build_report() -> String { String::new() }
    /// ```
    ///
    /// # Errors
    /// The request's own error when the lock was not obtained. Otherwise `Ok` with the
    /// work's output only when the lock was held from the grant until `work` returned
    /// (checked by the clock when it returns, so a process paused past its lease sees it);
    /// else the loss, an [`Error`](crate::Error) of kind
    /// [`ErrorKind::NotHeld`](crate::ErrorKind::NotHeld), and the output is dropped since
    /// it was produced without the lock's protection. A release that then reaches too few
    /// nodes is logged, not returned (the keys expire with their lease); a release that
    /// finds the lock gone from too many nodes is returned, unless the lease ran out while
    /// the release was on its way (the keys expired after the work ended: logged).
    pub fn with_lock<'a, R, F, Fut, T>(
        &'a self,
        request: R,
        work: F,
    ) -> impl Future<Output = Result<T>> + 'a
    where
        R: IntoRequest + 'a,
        F: FnOnce(Lease) -> Fut + 'a,
        Fut: Future<Output = T> + 'a,
        T: 'a,
    {
        // Turned into its future before the async block, which then holds nothing generic
        // over the request's lifetime: that keeps the future `Send` (rustc cannot prove it
        // through a higher-ranked bound held across an await).
        let acquiring = request.into_request(self);
        let tasks = &self.core.tasks;
        async move { lease::run_with(acquiring.await?, tasks, work).await }
    }
}

/// What [`Redlock::with_lock`] takes: a resource name (a plain lock with the client's
/// defaults) or any lock request.
pub trait IntoRequest: crate::guard::sealed::Sealed {
    /// The guard the request gives.
    type Guard: Guard;
    #[doc(hidden)]
    fn into_request<'a>(self, rl: &'a Redlock) -> Acquiring<'a, Self::Guard>
    where
        Self: 'a;
}

impl crate::guard::sealed::Sealed for &str {}

impl IntoRequest for &str {
    type Guard = crate::Lock;
    fn into_request<'a>(self, rl: &'a Redlock) -> Acquiring<'a, Self::Guard>
    where
        Self: 'a,
    {
        rl.lock(self).into_future()
    }
}

macro_rules! into_request {
    ($($request:ident => $guard:ty),*) => {$(
        impl crate::guard::sealed::Sealed for $request<'_> {}

        impl IntoRequest for $request<'_> {
            type Guard = $guard;
            fn into_request<'a>(self, _: &'a Redlock) -> Acquiring<'a, Self::Guard>
            where
                Self: 'a,
            {
                self.into_future()
            }
        }
    )*};
}

into_request! {
    LockRequest => crate::Lock,
    ReentrantRequest => crate::ReentrantLock,
    MultiRequest => crate::MultiLock,
    ReadRequest => crate::ReadLock,
    WriteRequest => crate::WriteLock,
    SemaphoreRequest => crate::Permit
}
