//! Waking waiters when a lock is released, instead of making them poll.
//!
//! Every release publishes on the key's release channel on each node where it removed the
//! last hold (see `lua/release.lua`), or, a plain key's release of a hold still valid on a
//! quorum sent as the server's `DELIFEQ`, on every node it reaches (`crate::native`). A client keeps at most one pub/sub connection per
//! node, on its own thread (so that it survives whichever runtime a waiter ran on), opened
//! when the first waiter appears and shared by all of them; a channel is subscribed while
//! at least one waiter watches it.
//!
//! A release counts once a quorum of nodes published it (the same message, which names the
//! hold released): before that, an attempt could not win. So the clean-up of a failed
//! attempt, whose hold is on fewer than a quorum of nodes, wakes no one (the key is still
//! held on a quorum, or split among waiters a release woke, which try again on their own:
//! see `wait::split_again`), however many of them land on one node and then another, and
//! releases of holds on different quorums each count. Each node that publishes the release
//! after its quorum wakes the first waiter again: a node that published without removing
//! the key (`DELIFEQ`, where another owner's key was) may complete the quorum before a node
//! that still had it, and the attempt it woke is refused there. Of this client's waiters on the key,
//! only the first in line is woken: several woken at once would split the nodes' votes
//! (this client's own releases of an exclusive hold hand on to its next waiter directly:
//! see `queue`). A waiter for several keys (a multi-resource lock) watches every key's
//! channel and is woken by a release of any of them; since another of its keys may still
//! be held, it does not stand for the waiters behind it: the first waiter for that key
//! alone is woken with it (but no other waiter for several keys: see `Channel::wake_from`).
//! A waiter subscribes after its first refusal, so a
//! release can come before its subscription: once the channel is subscribed on a quorum of
//! nodes (again, after connections were lost), the first waiter is woken as if by a
//! release, and attempts again; and again each time one more node confirms it, since a
//! release published on another quorum of nodes reached fewer than a quorum of
//! subscriptions. Notifications can still be lost (a node down, an expiry instead of a
//! release), so waiters always keep a polling fallback.

use crate::timing;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use redis::Client;
use tokio::sync::{Notify, mpsc};

use crate::channel::channel;
use crate::node::Node;
use crate::quorum;
use crate::tasks::Tasks;

/// The release notifications of one client.
pub(crate) struct Releases {
    nodes: Vec<(Client, Duration)>,
    registry: Arc<Mutex<Registry>>,
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

/// One watched channel: the holds whose releases were heard lately, the nodes where it is
/// subscribed, and this client's waiters.
struct Channel {
    heard: VecDeque<Heard>,
    subscribed: Vec<bool>,
    waiters: VecDeque<Arc<Waiter>>,
}

/// The nodes that published the release of one hold (the message names it).
struct Heard {
    message: Vec<u8>,
    nodes: Vec<bool>,
}

struct Waiter {
    woken: AtomicBool,
    notify: Notify,
    /// Watches several channels (a hold of several keys): woken by a release of one key,
    /// it may still find another held, so it stands for no waiter behind it.
    several: bool,
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
        Self { heard: VecDeque::new(), subscribed: vec![false; nodes], waiters: VecDeque::new() }
    }

    /// Wakes, from the `from`-th waiter on (the first in line, for 0), the first one that
    /// watches this channel alone, and the first one before it that watches several: a
    /// waiter for several keys may find another of them held, and must not hold back the
    /// one behind it for this key alone. Not every waiter for several keys before it: with
    /// many of them sharing this key (and each its own other key), every release would
    /// wake them all, each an attempt on every node, where one of them gets the key.
    fn wake_from(&self, from: usize) {
        let mut several = false;
        for waiter in self.waiters.iter().skip(from) {
            if !waiter.several {
                waiter.wake();
                break;
            }
            if !several {
                waiter.wake();
                several = true;
            }
        }
    }

    /// Whether the waiter at `at` is one that [`Channel::wake_from`] wakes from the first:
    /// a waiter for several keys if it is first, one for this key alone if only waiters for
    /// several are before it.
    fn woken_first(&self, at: usize) -> bool {
        let Some(waiter) = self.waiters.get(at) else { return false };
        if waiter.several {
            return at == 0;
        }
        self.waiters.iter().take(at).all(|w| w.several)
    }

    /// Moves `waiter`, one for several keys, behind the others for several keys: woken
    /// first, it found another of its keys held, and would otherwise take every release
    /// of this one from them.
    fn step_back(&mut self, waiter: &Arc<Waiter>) {
        let Some(at) = self.waiters.iter().position(|w| Arc::ptr_eq(w, waiter)) else { return };
        let last = self.waiters.iter().rposition(|w| w.several).unwrap_or(at);
        if last > at
            && let Some(moved) = self.waiters.remove(at)
        {
            self.waiters.insert(last, moved);
        }
    }

    /// Records that node `node` confirmed the subscription; `true` when at least a quorum of
    /// nodes are subscribed with it: a release before that may have gone unseen. Not only
    /// at the quorum: a release published on another quorum of nodes (a hold that missed
    /// some of the first ones) was heard on fewer than a quorum of them, so each node that
    /// confirms later may complete what that release needed.
    fn subscribed(&mut self, node: usize, quorum: usize) -> bool {
        let Some(flag) = self.subscribed.get_mut(node) else { return false };
        if std::mem::replace(flag, true) {
            return false;
        }
        self.subscribed.iter().filter(|&&on| on).count() >= quorum
    }

    /// Records that node `node`'s subscription is gone (its connection broke).
    fn unsubscribed(&mut self, node: usize) {
        if let Some(flag) = self.subscribed.get_mut(node) {
            *flag = false;
        }
    }

    /// Counts a publication of `message` from node `node`; `true` when it completes a
    /// release on a quorum (a quorum of nodes published the same message), or adds a node
    /// to one (that node may have been the one an attempt woke at the quorum met). A node that
    /// publishes a message again starts a new release of it (a message that names no one
    /// hold: a forced release's, another client version's).
    fn published(&mut self, node: usize, message: &[u8], quorum: usize) -> bool {
        let nodes = self.subscribed.len();
        if node >= nodes {
            return false;
        }
        let at = match self.heard.iter().position(|heard| heard.message == message) {
            Some(at) => at,
            None => {
                if self.heard.len() >= timing::RELEASES_HEARD {
                    self.heard.pop_front();
                }
                let nodes = vec![false; nodes];
                self.heard.push_back(Heard { message: message.to_vec(), nodes });
                self.heard.len() - 1
            }
        };
        let Some(heard) = self.heard.get_mut(at) else { return false };
        if std::mem::replace(&mut heard.nodes[node], true) {
            heard.nodes.iter_mut().for_each(|published| *published = false);
            heard.nodes[node] = true;
        }
        heard.nodes.iter().filter(|&&published| published).count() >= quorum
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
            subscribers: Mutex::default(),
        }
    }

    /// Stops the subscribers for good (a shutdown): waiters fall back to polling.
    pub(crate) fn stop(&self) {
        *self.subscribers.lock().unwrap_or_else(PoisonError::into_inner) = Subscribers::Stopped;
    }

    /// Starts watching the releases of `keys` (each key's channel, shared with this
    /// client's other waiters on it); the subscribers start on the client's own thread
    /// with the first watch.
    pub(crate) fn watch<'k>(
        &self,
        keys: impl IntoIterator<Item = &'k str>,
        tasks: &Tasks,
    ) -> ReleaseWatch {
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
        let mut channels: Vec<Arc<str>> = keys.into_iter().map(channel).collect();
        channels.sort_unstable();
        channels.dedup();
        let several = channels.len() > 1;
        let waiter =
            Arc::new(Waiter { woken: AtomicBool::new(false), notify: Notify::new(), several });
        let mut registry = lock(&self.registry);
        let nodes = self.nodes.len();
        for channel in &channels {
            let watched = registry.channels.entry(channel.clone()).or_insert_with(|| {
                // Sent under the registry lock, so that the subscriber tasks see subscribe
                // and unsubscribe commands in the order the registry changed.
                send_all(subscribers, || Subscription::Subscribe(channel.clone()));
                Channel::new(nodes)
            });
            watched.waiters.push_back(waiter.clone());
        }
        drop(registry);
        ReleaseWatch {
            channels,
            waiter,
            registry: self.registry.clone(),
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

/// A waiter's interest in the releases of its keys; dropping it leaves each channel's line
/// (handing a wake-up it did not use to the next waiter) and unsubscribes after the last
/// one.
pub(crate) struct ReleaseWatch {
    channels: Vec<Arc<str>>,
    waiter: Arc<Waiter>,
    registry: Arc<Mutex<Registry>>,
    subscribers: Vec<mpsc::UnboundedSender<Subscription>>,
}

impl ReleaseWatch {
    /// Completes at the first release (on a quorum) of any of its keys this waiter is woken
    /// for since it last completed: one that happened during an attempt is not lost.
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

    /// Records that this waiter, one for several keys, was refused after a wake-up: it steps
    /// back behind the other waiters for several keys of each of its keys, so that the next
    /// release wakes another of them (see [`Channel::step_back`]).
    pub(crate) fn refused_after_wake(&self) {
        if !self.waiter.several {
            return;
        }
        let mut registry = lock(&self.registry);
        for channel in &self.channels {
            if let Some(watched) = registry.channels.get_mut(channel) {
                watched.step_back(&self.waiter);
            }
        }
    }

    /// Records that this waiter got the lock: a wake-up it has not used yet came from a
    /// release before its grant, and would only cost the next waiter a failed attempt.
    pub(crate) fn granted(&self) {
        self.waiter.woken.store(false, Ordering::Release);
    }
}

impl Drop for ReleaseWatch {
    fn drop(&mut self) {
        let mut registry = lock(&self.registry);
        let unused = self.waiter.woken.load(Ordering::Acquire);
        for channel in &self.channels {
            let Some(watched) = registry.channels.get_mut(channel) else { continue };
            let Some(at) = watched.waiters.iter().position(|w| Arc::ptr_eq(w, &self.waiter)) else {
                continue;
            };
            let woken_here = unused && watched.woken_first(at);
            watched.waiters.remove(at);
            if woken_here {
                watched.wake_from(at);
            }
            if watched.waiters.is_empty() {
                registry.channels.remove(channel);
                send_all(&self.subscribers, || Subscription::Unsubscribe(channel.clone()));
            }
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
    let mut backoff = Backoff::default();
    loop {
        let served = serve(node, &client, timeout, &registry, &mut commands).await;
        // Whatever this connection subscribed is gone with it.
        for watched in lock(&registry).channels.values_mut() {
            watched.unsubscribed(node);
        }
        let pause = match served {
            Served::ClientGone => return,
            Served::Lost { was_up } => backoff.after(was_up),
        };
        // While disconnected, queued commands are moot: the registry is re-read on connect.
        let pause = tokio::time::sleep(pause);
        tokio::pin!(pause);
        loop {
            tokio::select! {
                () = &mut pause => break,
                command = commands.recv() => if command.is_none() { return },
            }
        }
    }
}

/// The pauses before a subscriber reconnects: from the shortest of
/// [`timing::SUBSCRIBE_BACKOFF`], doubling up to its longest while the node stays down.
#[derive(Debug)]
struct Backoff(Duration);

impl Default for Backoff {
    fn default() -> Self {
        Self(timing::SUBSCRIBE_BACKOFF.0)
    }
}

impl Backoff {
    /// The pause after a connection was lost; `was_up` when it had connected and
    /// subscribed before it broke: the node is back, so the next try is soon.
    fn after(&mut self, was_up: bool) -> Duration {
        if was_up {
            *self = Self::default();
        }
        let pause = self.0;
        self.0 = (pause * 2).min(timing::SUBSCRIBE_BACKOFF.1);
        pause
    }
}

/// Records that node `node` confirmed its subscription to `channel`, and wakes the first
/// waiter when at least a quorum of nodes are subscribed with it: a release published
/// before them may not have been heard on a quorum.
fn confirmed(registry: &Mutex<Registry>, node: usize, channel: &str) {
    let mut registry = lock(registry);
    let quorum = registry.quorum;
    if let Some(watched) = registry.channels.get_mut(channel)
        && watched.subscribed(node, quorum)
    {
        watched.wake_from(0);
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
        confirmed(registry, node, channel);
    }
    let lost = Served::Lost { was_up: true };
    loop {
        tokio::select! {
            command = commands.recv() => {
                let done = match command {
                    None => return Served::ClientGone,
                    Some(Subscription::Subscribe(channel)) => {
                        let done = tokio::time::timeout(timeout, sink.subscribe(&*channel)).await;
                        if matches!(done, Ok(Ok(()))) {
                            confirmed(registry, node, &channel);
                        }
                        done
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
                    && watched.published(node, message.get_payload_bytes(), quorum)
                {
                    watched.wake_from(0);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_counts_once_a_quorum_of_nodes_published_it() {
        let mut channel = Channel::new(5);
        assert!(!channel.published(0, b"a", 3));
        assert!(!channel.published(3, b"a", 3));
        assert!(channel.published(1, b"a", 3), "the third node completes the release");
        assert!(channel.published(2, b"a", 3), "each node after the quorum wakes again");
        assert!(channel.published(4, b"a", 3));
        assert!(!channel.published(0, b"b", 3));
        assert!(!channel.published(1, b"b", 3));
        assert!(channel.published(4, b"b", 3), "the next release, on another quorum");
        assert!(!channel.published(9, b"c", 3), "a node outside the channel");
    }

    #[test]
    fn clean_ups_short_of_a_quorum_never_count_as_a_release_wherever_they_land() {
        let mut channel = Channel::new(3);
        // Failed attempts clean up one node each, first node 2 many times, then node 0.
        for k in 0..20u8 {
            assert!(!channel.published(2, &[k], 2));
        }
        assert!(!channel.published(0, b"late", 2));
        assert!(!channel.published(0, b"later", 2));
        // A hold on nodes 0 and 1 is released, then one on nodes 1 and 2: two releases.
        assert!(!channel.published(0, b"x", 2));
        assert!(channel.published(1, b"x", 2));
        assert!(!channel.published(1, b"y", 2));
        assert!(channel.published(2, b"y", 2));
        // The same message from a node again: a new release of it (a forced release's).
        assert!(!channel.published(0, b"1", 2));
        assert!(channel.published(1, b"1", 2));
        assert!(!channel.published(0, b"1", 2));
        assert!(channel.published(2, b"1", 2));
    }

    /// A waiter, for several keys or for one.
    fn waiter(several: bool) -> Arc<Waiter> {
        Arc::new(Waiter { woken: AtomicBool::new(false), notify: Notify::new(), several })
    }

    #[test]
    fn a_release_wakes_the_first_waiter_for_its_key_alone_and_one_for_several_keys_before_it() {
        let woken = |channel: &Channel| -> Vec<bool> {
            channel.waiters.iter().map(|w| w.woken.swap(false, Ordering::AcqRel)).collect()
        };
        let mut channel = Channel::new(3);
        channel.waiters.extend([waiter(false), waiter(true), waiter(false)]);
        channel.wake_from(0);
        assert_eq!(woken(&channel), [true, false, false], "the first, for this key alone");
        channel.waiters.push_front(waiter(true));
        channel.waiters.push_front(waiter(true));
        channel.wake_from(0);
        assert_eq!(
            woken(&channel),
            [true, false, true, false, false],
            "one waiter for several keys, which may find another held, and the first for this one"
        );
        let first = (0..5).map(|at| channel.woken_first(at)).collect::<Vec<_>>();
        assert_eq!(first, [true, false, true, false, false]);
        channel.wake_from(3);
        assert_eq!(woken(&channel), [false, false, false, true, true], "handed on from the 4th");
        let mut several = Channel::new(3);
        several.waiters.extend([waiter(true), waiter(true), waiter(true)]);
        several.wake_from(0);
        assert_eq!(woken(&several), [true, false, false], "one release, one of them");
        let mut behind = Channel::new(3);
        behind.waiters.extend([waiter(false), waiter(true)]);
        behind.wake_from(0);
        assert_eq!(woken(&behind), [true, false], "behind the first for this key alone");
        assert!(!behind.woken_first(1));
    }

    #[test]
    fn a_waiter_for_several_keys_refused_after_a_wake_up_steps_back_behind_the_others() {
        let (first, second, alone, third) =
            (waiter(true), waiter(true), waiter(false), waiter(true));
        let mut channel = Channel::new(3);
        channel.waiters.extend([first.clone(), second.clone(), alone.clone(), third.clone()]);
        channel.step_back(&first);
        let order: Vec<_> = channel.waiters.iter().cloned().collect();
        assert!(Arc::ptr_eq(&order[0], &second));
        assert!(Arc::ptr_eq(&order[1], &alone));
        assert!(Arc::ptr_eq(&order[2], &third));
        assert!(Arc::ptr_eq(&order[3], &first), "behind the last waiter for several keys");
        channel.wake_from(0);
        assert!(second.woken.load(Ordering::Acquire), "the next release wakes another");
    }

    #[test]
    fn subscribers_reconnect_after_a_pause_doubling_from_50_ms_to_2_s() {
        let mut backoff = Backoff::default();
        let pauses: Vec<u64> =
            (0..8).map(|_| u64::try_from(backoff.after(false).as_millis()).unwrap()).collect();
        assert_eq!(pauses, [50, 100, 200, 400, 800, 1600, 2000, 2000]);
        assert_eq!(backoff.after(true), Duration::from_millis(50), "a node back: soon");
        assert_eq!(backoff.after(false), Duration::from_millis(100));
    }

    #[test]
    fn a_channel_is_subscribed_enough_at_a_quorum_of_nodes_and_with_each_node_after() {
        let mut channel = Channel::new(3);
        assert!(!channel.subscribed(0, 2));
        assert!(!channel.subscribed(0, 2), "the same node again");
        assert!(channel.subscribed(2, 2), "the second node completes a quorum");
        assert!(channel.subscribed(1, 2), "beyond the quorum: a release on nodes 1-2 was unheard");
        assert!(!channel.subscribed(1, 2), "the same node again");
        channel.unsubscribed(1);
        channel.unsubscribed(2);
        assert!(channel.subscribed(2, 2), "a quorum again after a connection broke");
        assert!(!channel.subscribed(7, 2), "a node outside the channel");
    }
}
