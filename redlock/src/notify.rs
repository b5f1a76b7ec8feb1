//! Waking waiters when a lock is released, instead of making them poll.
//!
//! Every release publishes on the key's release channel (see `scripts/release.lua`). A
//! client keeps at most one pub/sub connection per node, opened when the first waiter
//! appears and shared by all of them; a channel is subscribed while at least one waiter
//! watches it. Notifications can be lost (a node down, a connection being re-opened, an
//! expiry instead of a release), so waiters always keep a polling fallback.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use redis::Client;
use tokio::sync::{mpsc, watch};

use crate::node::Node;

/// The channel a release of `key` is published on.
pub(crate) fn channel(key: &str) -> Arc<str> {
    format!("redlock:released:{key}").into()
}

/// The release notifications of one client.
pub(crate) struct Releases {
    nodes: Vec<(Client, Duration)>,
    registry: Arc<Mutex<Registry>>,
    /// One command queue per node's subscriber task, started with the first waiter. The
    /// tasks end when these senders are dropped, with the client.
    subscribers: OnceLock<Vec<mpsc::UnboundedSender<Command>>>,
}

#[derive(Default)]
struct Registry {
    channels: HashMap<Arc<str>, Watched>,
}

struct Watched {
    waiters: usize,
    releases: watch::Sender<u64>,
}

#[derive(Debug)]
enum Command {
    Subscribe(Arc<str>),
    Unsubscribe(Arc<str>),
}

impl Releases {
    pub(crate) fn new(nodes: &[Arc<Node>]) -> Self {
        Self {
            nodes: nodes
                .iter()
                .map(|node| (node.client().clone(), node.connect_timeout()))
                .collect(),
            registry: Arc::default(),
            subscribers: OnceLock::new(),
        }
    }

    /// Starts watching the releases of `key`. Must be called on a Tokio runtime.
    pub(crate) fn watch(&self, key: &str) -> ReleaseWatch {
        let subscribers = self.subscribers.get_or_init(|| {
            self.nodes
                .iter()
                .map(|(client, timeout)| {
                    let (commands, queue) = mpsc::unbounded_channel();
                    tokio::spawn(subscriber(
                        client.clone(),
                        *timeout,
                        self.registry.clone(),
                        queue,
                    ));
                    commands
                })
                .collect()
        });
        let channel = channel(key);
        let mut registry = lock(&self.registry);
        let watched = registry.channels.entry(channel.clone()).or_insert_with(|| {
            // Sent under the registry lock, so that the subscriber tasks see subscribe and
            // unsubscribe commands in the order the registry changed.
            send_all(subscribers, || Command::Subscribe(channel.clone()));
            Watched { waiters: 0, releases: watch::Sender::new(0) }
        });
        watched.waiters += 1;
        ReleaseWatch {
            releases: watched.releases.subscribe(),
            channel,
            registry: self.registry.clone(),
            subscribers: subscribers.clone(),
        }
    }
}

/// A waiter's interest in one key's releases; dropping it unsubscribes when it was the
/// last one.
pub(crate) struct ReleaseWatch {
    channel: Arc<str>,
    releases: watch::Receiver<u64>,
    registry: Arc<Mutex<Registry>>,
    subscribers: Vec<mpsc::UnboundedSender<Command>>,
}

impl ReleaseWatch {
    /// Forgets the releases seen so far: call it before an attempt, so that a release
    /// during the attempt wakes the wait that follows it.
    pub(crate) fn mark_seen(&mut self) {
        self.releases.borrow_and_update();
    }

    /// Completes at the next release published after [`mark_seen`](Self::mark_seen).
    pub(crate) async fn released(&mut self) {
        if self.releases.changed().await.is_err() {
            // Not reached while this watch is registered; never a busy loop if it were.
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for ReleaseWatch {
    fn drop(&mut self) {
        let mut registry = lock(&self.registry);
        if let Some(watched) = registry.channels.get_mut(&self.channel) {
            watched.waiters -= 1;
            if watched.waiters == 0 {
                registry.channels.remove(&self.channel);
                send_all(&self.subscribers, || Command::Unsubscribe(self.channel.clone()));
            }
        }
    }
}

fn send_all(subscribers: &[mpsc::UnboundedSender<Command>], command: impl Fn() -> Command) {
    for subscriber in subscribers {
        // A closed queue means its task is gone with the client: nothing to tell it.
        let _ = subscriber.send(command());
    }
}

fn lock(registry: &Mutex<Registry>) -> MutexGuard<'_, Registry> {
    registry.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Keeps one node's pub/sub connection, re-opening it after failures, until the client
/// is gone.
async fn subscriber(
    client: Client,
    timeout: Duration,
    registry: Arc<Mutex<Registry>>,
    mut commands: mpsc::UnboundedReceiver<Command>,
) {
    let mut backoff = Duration::from_millis(50);
    loop {
        match serve(&client, timeout, &registry, &mut commands).await {
            Served::ClientGone => return,
            Served::ConnectionLost => {}
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
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

enum Served {
    ClientGone,
    ConnectionLost,
}

async fn serve(
    client: &Client,
    timeout: Duration,
    registry: &Mutex<Registry>,
    commands: &mut mpsc::UnboundedReceiver<Command>,
) -> Served {
    let Ok(Ok(pubsub)) = tokio::time::timeout(timeout, client.get_async_pubsub()).await else {
        return Served::ConnectionLost;
    };
    let (mut sink, mut stream) = pubsub.split();
    let watched: Vec<Arc<str>> = lock(registry).channels.keys().cloned().collect();
    for channel in &watched {
        if !matches!(tokio::time::timeout(timeout, sink.subscribe(&**channel)).await, Ok(Ok(()))) {
            return Served::ConnectionLost;
        }
    }
    loop {
        tokio::select! {
            command = commands.recv() => {
                let done = match command {
                    None => return Served::ClientGone,
                    Some(Command::Subscribe(channel)) => {
                        tokio::time::timeout(timeout, sink.subscribe(&*channel)).await
                    }
                    Some(Command::Unsubscribe(channel)) => {
                        tokio::time::timeout(timeout, sink.unsubscribe(&*channel)).await
                    }
                };
                if !matches!(done, Ok(Ok(()))) {
                    return Served::ConnectionLost;
                }
            }
            message = stream.next() => {
                let Some(message) = message else { return Served::ConnectionLost };
                if let Some(watched) = lock(registry).channels.get(message.get_channel_name()) {
                    watched.releases.send_modify(|count| *count = count.wrapping_add(1));
                }
            }
        }
    }
}
