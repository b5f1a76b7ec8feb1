//! Waking waiters when a lock is released, instead of making them poll.
//!
//! Every release publishes on the key's release channel on each node where it removed the
//! last hold (see `lua/release.lua`). A client keeps at most one pub/sub connection per
//! node, on its own thread (so that it survives whichever runtime a waiter ran on), opened
//! when the first waiter appears and shared by all of them; a channel is subscribed while
//! at least one waiter watches it.
//!
//! A release counts once a quorum of nodes published it (the quorum-th highest
//! per-node count of publications went up): before that, an attempt could not win. Of
//! this client's waiters on the key, only the first in line is woken: several woken
//! at once would split the nodes' votes. Notifications can be lost (a node down, a
//! connection being re-opened, an expiry instead of a release), so waiters always keep a
//! polling fallback.
//!
//! While a hold of this client that excludes every other is valid on a key, its waiters'
//! timers pass without an attempt (see `wait`): an attempt could only fail, and the
//! hold's release is published like any other. The hold stops counting when its release
//! starts, when a release of the key not the client's own is published on a quorum (a
//! forced release), when the client finds it gone (an extension or a check), when the
//! client is granted a share it would exclude, and at shutdown. A hold lost without
//! notice (nodes restarted empty, an eviction) keeps them out until its validity ends, as
//! the holder itself believes it holds the lock until then.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use futures::StreamExt;
use redis::{Client, RedisWrite, ToRedisArgs};
use tokio::sync::{Notify, mpsc};

use crate::engine::protocol::{Keys, Protocol};
use crate::node::Node;
use crate::quorum;
use crate::tasks::Tasks;

/// The channel a release of `key` is published on.
pub(crate) fn channel(key: &str) -> Arc<str> {
    ReleaseChannel(key).to_string().into()
}

/// The name of the channel a release of the key is published on, for writing it where it
/// goes (a script's argument) without a string of its own.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReleaseChannel<'a>(pub(crate) &'a str);

impl ReleaseChannel<'_> {
    const PREFIX: &'static str = "redlock:released:";

    /// The name's length in bytes.
    pub(crate) fn size(&self) -> usize {
        Self::PREFIX.len() + self.0.len()
    }
}

impl fmt::Display for ReleaseChannel<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(Self::PREFIX)?;
        f.write_str(self.0)
    }
}

impl ToRedisArgs for ReleaseChannel<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        out.write_arg_fmt(self);
    }
}

/// The shortest and longest pause before a subscriber reconnects.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(50), Duration::from_secs(2));

/// The release notifications of one client.
pub(crate) struct Releases {
    nodes: Vec<(Client, Duration)>,
    registry: Arc<Mutex<Registry>>,
    /// How many channels are watched: lets a lock's grant and release skip the registry
    /// when no one waits.
    watched: Arc<AtomicUsize>,
    /// One command queue per node's subscriber task, started with the first waiter. The
    /// tasks end when these senders are dropped: with the client, or at its shutdown.
    subscribers: Mutex<Subscribers>,
}

#[derive(Default)]
enum Subscribers {
    #[default]
    NotStarted,
    Running(Vec<mpsc::UnboundedSender<Subscription>>),
    Stopped,
}

struct Registry {
    quorum: usize,
    channels: HashMap<Arc<str>, Channel>,
}

/// One watched channel: publications per node, releases seen, and this client's waiters.
struct Channel {
    counts: Vec<u64>,
    releases: u64,
    /// Until when a hold of this client excludes every other on the key (its validity),
    /// if one was granted or extended while this channel was watched and not released.
    held: Option<Instant>,
    /// Until when the next release counted on a quorum is likely this client's own, whose
    /// hold no longer counts already: it leaves alone a hold granted since (the next
    /// waiter's), where another release (a forced one) ends the hold it finds.
    releasing: Option<Instant>,
    waiters: VecDeque<Arc<Waiter>>,
}

struct Waiter {
    woken: AtomicBool,
    notify: Notify,
    /// What its attempts ask for.
    request: Request,
    attempts: Mutex<Attempts>,
}

/// What a waiter's attempts ask the nodes for, as far as another waiter's attempts could
/// do it in their place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Request {
    /// The kind, as errors name it: kinds answer differently on one key.
    kind: &'static str,
    /// Every key of the hold.
    keys: Keys,
    /// Whether the hold excludes every other.
    exclusive: bool,
    /// Whether each attempt also records an intent that holds others back while the
    /// waiter waits (a writer with the default priority).
    intent: bool,
}

impl Request {
    /// The request of `proto`'s attempts.
    pub(crate) fn of<P: Protocol>(proto: &P) -> Self {
        Self {
            kind: proto.kind(),
            keys: proto.keys().clone(),
            exclusive: proto.is_exclusive(),
            intent: proto.records_intent(),
        }
    }

    /// The request of attempts that may take any of several holds whose releases are all
    /// published on `key`'s channel (a counting lock's slots), none excluding the others.
    pub(crate) fn shared(kind: &'static str, key: Arc<str>) -> Self {
        Self { kind, keys: smallvec::smallvec![key], exclusive: false, intent: false }
    }

    /// Every key of the hold.
    pub(crate) fn keys(&self) -> &Keys {
        &self.keys
    }

    /// Whether the hold excludes every other.
    pub(crate) fn is_exclusive(&self) -> bool {
        self.exclusive
    }

    /// Whether attempts of this request may stand in for `other`'s: only when they are the
    /// same request, of a hold that excludes every other. An attempt of another kind, on
    /// other keys, or without the intent `other`'s would record, leaves undone what
    /// `other`'s would do (a writer that records no intent standing in for one that does
    /// would let readers starve both).
    fn stands_in_for(&self, other: &Self) -> bool {
        self.exclusive && self == other
    }
}

/// A waiter's attempts, as the waiters behind it see them.
struct Attempts {
    /// When the last one started (or the waiter joined the line).
    started: Instant,
    /// How long the last finished one took.
    took: Duration,
    /// Whether it found the keys held by others on every node that answered.
    held: bool,
}

impl Waiter {
    fn wake(&self) {
        self.woken.store(true, Ordering::Release);
        self.notify.notify_one();
    }
}

#[derive(Debug)]
enum Subscription {
    Subscribe(Arc<str>),
    Unsubscribe(Arc<str>),
}

impl Channel {
    fn new(nodes: usize) -> Self {
        Self {
            counts: vec![0; nodes],
            releases: 0,
            held: None,
            releasing: None,
            waiters: VecDeque::new(),
        }
    }

    /// A release counted on a quorum: unless it is likely this client's own (whose hold
    /// no longer counts already, and a hold granted since is the next waiter's), whatever
    /// this client held there is gone (forced out).
    fn counted_release(&mut self) {
        if self.releasing.take().is_none_or(|until| Instant::now() > until) {
            self.held = None;
        }
    }

    /// Counts a publication from node `node`; `true` when it completes a release on a quorum.
    fn published(&mut self, node: usize, quorum: usize) -> bool {
        if let Some(count) = self.counts.get_mut(node) {
            *count = count.wrapping_add(1);
        }
        let mut counts = self.counts.clone();
        counts.sort_unstable_by(|a, b| b.cmp(a));
        let released = counts.get(quorum.saturating_sub(1)).copied().unwrap_or(0);
        if released > self.releases {
            self.releases = released;
            return true;
        }
        false
    }
}

impl Releases {
    pub(crate) fn new(nodes: &[Arc<Node>]) -> Self {
        Self {
            nodes: nodes
                .iter()
                .map(|node| (node.client().clone(), node.connect_timeout()))
                .collect(),
            registry: Arc::new(Mutex::new(Registry {
                quorum: quorum::quorum(nodes.len()),
                channels: HashMap::new(),
            })),
            watched: Arc::new(AtomicUsize::new(0)),
            subscribers: Mutex::default(),
        }
    }

    /// Stops the subscribers for good (a shutdown): waiters fall back to polling.
    pub(crate) fn stop(&self) {
        *self.subscribers.lock().unwrap_or_else(PoisonError::into_inner) = Subscribers::Stopped;
    }

    /// Whether some waiter of this client is in line for `key`.
    pub(crate) fn has_waiters(&self, key: &str) -> bool {
        let mut found = false;
        self.with_channel(key, |_| found = true);
        found
    }

    /// Records that this client's hold that excluded every other on `key` is being
    /// released, its release published within `within`: its waiters' timers try again.
    pub(crate) fn releasing(&self, key: &str, within: Duration) {
        self.with_channel(key, |watched| {
            watched.held = None;
            watched.releasing = Some(Instant::now() + within);
        });
    }

    /// Records that this client's hold that excluded every other on `key` is gone, or
    /// that the client holds a share of `key` that such a hold would exclude: its
    /// waiters' timers try again.
    pub(crate) fn released(&self, key: &str) {
        self.with_channel(key, |watched| watched.held = None);
    }

    /// Records that a hold of this client that excludes every other on `key` is valid
    /// until `until` (granted or extended), if some waiter of this client watches `key`.
    pub(crate) fn hold(&self, key: &str, until: Instant) {
        self.with_channel(key, |watched| watched.held = Some(until));
    }

    /// Runs `change` on `key`'s channel if it is watched; the common case, where no one
    /// waits, neither locks nor builds the channel's name.
    fn with_channel(&self, key: &str, change: impl FnOnce(&mut Channel)) {
        if self.watched.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut registry = lock(&self.registry);
        if let Some(watched) = registry.channels.get_mut(&*channel(key)) {
            change(watched);
        }
    }

    /// Starts watching the releases of the first key of `request`, what the waiter's
    /// attempts ask for; the subscribers start on the client's own thread with the first
    /// watch.
    pub(crate) fn watch(&self, request: &Request, tasks: &Tasks) -> ReleaseWatch {
        let subscribers = {
            let mut subscribers = self.subscribers.lock().unwrap_or_else(PoisonError::into_inner);
            if matches!(*subscribers, Subscribers::NotStarted) {
                *subscribers = Subscribers::Running(self.start(tasks));
            }
            match &*subscribers {
                Subscribers::Running(senders) => senders.clone(),
                // Shut down: no notifications, waiters poll.
                _ => Vec::new(),
            }
        };
        let subscribers = &subscribers;
        let channel = channel(request.keys.first().map_or("", |key| &**key));
        let waiter = Arc::new(Waiter {
            woken: AtomicBool::new(false),
            notify: Notify::new(),
            request: request.clone(),
            attempts: Mutex::new(Attempts {
                started: Instant::now(),
                took: Duration::ZERO,
                held: false,
            }),
        });
        let mut registry = lock(&self.registry);
        let nodes = self.nodes.len();
        let watched = registry.channels.entry(channel.clone()).or_insert_with(|| {
            // Sent under the registry lock, so that the subscriber tasks see subscribe and
            // unsubscribe commands in the order the registry changed.
            send_all(subscribers, || Subscription::Subscribe(channel.clone()));
            self.watched.fetch_add(1, Ordering::AcqRel);
            Channel::new(nodes)
        });
        watched.waiters.push_back(waiter.clone());
        ReleaseWatch {
            channel,
            waiter,
            registry: self.registry.clone(),
            watched: self.watched.clone(),
            subscribers: subscribers.clone(),
        }
    }
}

impl Releases {
    fn start(&self, tasks: &Tasks) -> Vec<mpsc::UnboundedSender<Subscription>> {
        self.nodes
            .iter()
            .enumerate()
            .map(|(i, (client, timeout))| {
                let (commands, queue) = mpsc::unbounded_channel();
                let registry = self.registry.clone();
                let _ = tasks.spawn_own(subscriber(i, client.clone(), *timeout, registry, queue));
                commands
            })
            .collect()
    }
}

/// A waiter's interest in one key's releases; dropping it leaves the line (handing a
/// wake-up it did not use to the next waiter) and unsubscribes after the last one.
pub(crate) struct ReleaseWatch {
    channel: Arc<str>,
    waiter: Arc<Waiter>,
    registry: Arc<Mutex<Registry>>,
    watched: Arc<AtomicUsize>,
    subscribers: Vec<mpsc::UnboundedSender<Subscription>>,
}

impl ReleaseWatch {
    /// Completes at the first release (on a quorum) this waiter is woken for since it last
    /// completed: one that happened during an attempt is not lost.
    pub(crate) async fn released(&self) {
        loop {
            let notified = self.waiter.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.waiter.woken.swap(false, Ordering::AcqRel) {
                return;
            }
            notified.await;
        }
    }

    /// Records that this waiter starts an attempt.
    pub(crate) fn attempting(&self) {
        lock(&self.waiter.attempts).started = Instant::now();
    }

    /// Records how this waiter's attempt went: it took `took`, and `held` if it found the
    /// keys held by others (no node said yes).
    pub(crate) fn attempted(&self, took: Duration, held: bool) {
        let mut attempts = lock(&self.waiter.attempts);
        attempts.took = took;
        attempts.held = held;
    }

    /// Records that this waiter got the lock: a wake-up it has not used yet came from a
    /// release before its grant, and would only cost the next waiter a failed attempt.
    pub(crate) fn granted(&self) {
        self.waiter.woken.store(false, Ordering::Release);
    }

    /// Whether this waiter's tick may pass without an attempt, which could only fail: a
    /// hold of this client that excludes every other is valid on the key (its release
    /// wakes the first waiter) and this waiter's attempts record no intent, or the first
    /// of this client's waiters in line stands in for this one: it is another one, its
    /// attempts are the same request (see
    /// [`Request::stands_in_for`]), its last attempt found the keys held, and it started
    /// one since `since` (this one's attempt could then only fail where the first one's
    /// did, and would do nothing the first one's did not). Returns how long the attempt it
    /// stands for took: none for the hold, the first waiter's last one otherwise.
    pub(crate) fn stand_in(&self, since: Instant) -> Option<Duration> {
        let registry = lock(&self.registry);
        let watched = registry.channels.get(&self.channel)?;
        // Its failed attempts renew the intent that holds readers back at the hold's
        // release: they are not for nothing.
        if !self.waiter.request.intent
            && watched.held.is_some_and(|until| crate::clock::now() < until)
        {
            return Some(Duration::ZERO);
        }
        let front = watched.waiters.front()?;
        if Arc::ptr_eq(front, &self.waiter) || !front.request.stands_in_for(&self.waiter.request) {
            return None;
        }
        let attempts = lock(&front.attempts);
        (attempts.held && attempts.started > since).then_some(attempts.took)
    }
}

impl Drop for ReleaseWatch {
    fn drop(&mut self) {
        let mut registry = lock(&self.registry);
        let Some(watched) = registry.channels.get_mut(&self.channel) else { return };
        watched.waiters.retain(|waiter| !Arc::ptr_eq(waiter, &self.waiter));
        if self.waiter.woken.load(Ordering::Acquire)
            && let Some(next) = watched.waiters.front()
        {
            next.wake();
        }
        if watched.waiters.is_empty() {
            registry.channels.remove(&self.channel);
            self.watched.fetch_sub(1, Ordering::AcqRel);
            send_all(&self.subscribers, || Subscription::Unsubscribe(self.channel.clone()));
        }
    }
}

fn send_all(
    subscribers: &[mpsc::UnboundedSender<Subscription>],
    command: impl Fn() -> Subscription,
) {
    for subscriber in subscribers {
        // A closed queue means its task is gone with the client: nothing to tell it.
        let _ = subscriber.send(command());
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Keeps node `node`'s pub/sub connection, re-opening it after failures, until the client
/// is gone.
async fn subscriber(
    node: usize,
    client: Client,
    timeout: Duration,
    registry: Arc<Mutex<Registry>>,
    mut commands: mpsc::UnboundedReceiver<Subscription>,
) {
    let mut backoff = BACKOFF.0;
    loop {
        match serve(node, &client, timeout, &registry, &mut commands).await {
            Served::ClientGone => return,
            // Connected and subscribed before it broke: the node is back, retry soon.
            Served::Lost { was_up: true } => backoff = BACKOFF.0,
            Served::Lost { was_up: false } => {}
        }
        // While disconnected, queued commands are moot: the registry is re-read on connect.
        let pause = tokio::time::sleep(backoff);
        tokio::pin!(pause);
        loop {
            tokio::select! {
                () = &mut pause => break,
                command = commands.recv() => if command.is_none() { return },
            }
        }
        backoff = (backoff * 2).min(BACKOFF.1);
    }
}

enum Served {
    ClientGone,
    Lost { was_up: bool },
}

async fn serve(
    node: usize,
    client: &Client,
    timeout: Duration,
    registry: &Mutex<Registry>,
    commands: &mut mpsc::UnboundedReceiver<Subscription>,
) -> Served {
    let down = Served::Lost { was_up: false };
    let Ok(Ok(pubsub)) = tokio::time::timeout(timeout, client.get_async_pubsub()).await else {
        return down;
    };
    let (mut sink, mut stream) = pubsub.split();
    let watched: Vec<Arc<str>> = lock(registry).channels.keys().cloned().collect();
    for channel in &watched {
        if !matches!(tokio::time::timeout(timeout, sink.subscribe(&**channel)).await, Ok(Ok(()))) {
            return down;
        }
    }
    let lost = Served::Lost { was_up: true };
    loop {
        tokio::select! {
            command = commands.recv() => {
                let done = match command {
                    None => return Served::ClientGone,
                    Some(Subscription::Subscribe(channel)) => {
                        tokio::time::timeout(timeout, sink.subscribe(&*channel)).await
                    }
                    Some(Subscription::Unsubscribe(channel)) => {
                        tokio::time::timeout(timeout, sink.unsubscribe(&*channel)).await
                    }
                };
                if !matches!(done, Ok(Ok(()))) {
                    return lost;
                }
            }
            message = stream.next() => {
                let Some(message) = message else { return lost };
                let mut registry = lock(registry);
                let quorum = registry.quorum;
                if let Some(watched) = registry.channels.get_mut(message.get_channel_name())
                    && watched.published(node, quorum)
                {
                    watched.counted_release();
                    if let Some(first) = watched.waiters.front() {
                        first.wake();
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_release_not_this_clients_own_ends_the_hold_it_finds() {
        let in_a_while = Instant::now() + Duration::from_secs(60);
        let mut channel = Channel::new(3);
        // This client's release, then the next waiter's grant before the publications.
        channel.releasing = Some(in_a_while);
        channel.held = Some(in_a_while);
        channel.counted_release();
        assert_eq!(channel.held, Some(in_a_while), "the next holder's hold still counts");
        // A forced release of that hold.
        channel.counted_release();
        assert_eq!(channel.held, None);
        // This client's release whose publications never came: a later one is not its.
        channel.releasing = Some(Instant::now() - Duration::from_millis(1));
        channel.held = Some(in_a_while);
        channel.counted_release();
        assert_eq!(channel.held, None);
    }

    #[test]
    fn a_waiter_stands_in_only_for_the_same_exclusive_request() {
        let request = |kind, keys: &[&str], exclusive, intent| Request {
            kind,
            keys: keys.iter().map(|&key| Arc::from(key)).collect(),
            exclusive,
            intent,
        };
        let preferred = request("write lock", &["doc"], true, true);
        assert!(preferred.stands_in_for(&preferred.clone()), "another preferred writer");
        let plain = request("lock", &["doc"], true, false);
        assert!(plain.stands_in_for(&plain.clone()), "another plain lock");
        let unprioritised = request("write lock", &["doc"], true, false);
        assert!(!unprioritised.stands_in_for(&preferred), "records no intent for it");
        assert!(!preferred.stands_in_for(&unprioritised), "records an intent it would not");
        assert!(!plain.stands_in_for(&unprioritised), "another kind");
        let multi = request("multi-resource lock", &["doc", "other"], true, false);
        assert!(!plain.stands_in_for(&multi), "another kind, fewer keys");
        let more_keys = request("lock", &["doc", "other"], true, false);
        assert!(!plain.stands_in_for(&more_keys), "fewer keys");
        assert!(!more_keys.stands_in_for(&plain), "more keys");
        let reader = request("read lock", &["doc"], false, false);
        assert!(!reader.stands_in_for(&reader.clone()), "a share excludes no one");
    }

    #[test]
    fn a_release_counts_once_a_quorum_of_nodes_published_it() {
        let mut channel = Channel::new(5);
        assert!(!channel.published(0, 3));
        assert!(!channel.published(3, 3));
        assert!(channel.published(1, 3), "the third node completes the release");
        assert!(!channel.published(2, 3), "stragglers of the same release");
        assert!(!channel.published(4, 3));
        assert!(!channel.published(0, 3));
        assert!(!channel.published(1, 3));
        assert!(channel.published(4, 3), "the next release, on another quorum");
    }
}
