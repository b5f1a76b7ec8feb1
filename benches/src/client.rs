//! The implementations under comparison, behind one interface.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use rand::Rng;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Value};
use redlock::{Redlock, Retry};

/// One of the implementations under comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Impl {
    /// This workspace's `redlock`.
    Ours,
    /// The raw commands, no library.
    Floor,
    /// The `rslock` crate.
    Rslock,
    /// The `redlock` 2.x crate (redlock-rs), sync.
    RedlockRs,
    /// Ours, a fenced lock (two more rounds after the grant).
    OursFenced,
    /// Ours, a reentrant hold.
    OursReentrant,
    /// Ours, a multi-resource lock of two resources.
    OursMulti,
    /// Ours, a read share of a read-write lock.
    OursRead,
    /// Ours, the write side of a read-write lock.
    OursWrite,
    /// Ours, a permit of a counting lock of [`SEMAPHORE_PERMITS`] permits.
    OursSemaphore,
}

/// The permits of the counting lock benchmarked: uncontended, an attempt takes the first
/// slot it tries, so the count changes nothing but the keys.
pub const SEMAPHORE_PERMITS: u32 = 2;

impl Impl {
    /// Every implementation, the floor first.
    pub const ALL: [Impl; 4] = [Impl::Floor, Impl::Ours, Impl::Rslock, Impl::RedlockRs];

    /// Our plain lock and every other kind of ours, the plain lock first.
    pub const KINDS: [Impl; 7] = [
        Impl::Ours,
        Impl::OursFenced,
        Impl::OursReentrant,
        Impl::OursMulti,
        Impl::OursRead,
        Impl::OursWrite,
        Impl::OursSemaphore,
    ];

    /// The name used in tables and benchmark ids.
    pub fn name(self) -> &'static str {
        match self {
            Impl::Ours => "ours",
            Impl::Floor => "floor",
            Impl::Rslock => "rslock",
            Impl::RedlockRs => "redlock-rs",
            Impl::OursFenced => "ours/fenced",
            Impl::OursReentrant => "ours/reentrant",
            Impl::OursMulti => "ours/multi(2)",
            Impl::OursRead => "ours/read",
            Impl::OursWrite => "ours/write",
            Impl::OursSemaphore => "ours/semaphore(2)",
        }
    }

    /// Parses [`Impl::name`].
    pub fn from_name(name: &str) -> Option<Impl> {
        Impl::ALL.into_iter().chain(Impl::KINDS).find(|i| i.name() == name)
    }
}

impl fmt::Display for Impl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What every implementation is configured with, as far as it can be.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// The lease.
    pub ttl: Duration,
    /// Per node, per request (ours and the floor; the peers have no such setting).
    pub node_timeout: Duration,
    /// The blocking `lock()` waits a random pause in `[0, retry_jitter)` between attempts.
    pub retry_jitter: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(10),
            node_timeout: Duration::from_millis(50),
            retry_jitter: Duration::from_millis(10),
        }
    }
}

/// A client of one implementation, connected to a set of nodes. Cheap to clone.
#[derive(Clone)]
pub enum Client {
    /// `try` is one attempt, `wait` retries until it gets the lock; `kind` is which kind
    /// of lock ([`Impl::Ours`] or one of the other [`Impl::KINDS`]).
    Ours { try_rl: Redlock, wait_rl: Redlock, kind: Impl },
    /// The raw floor.
    Floor(Arc<Floor>),
    /// `try_mgr` makes one attempt, `wait_mgr` is used with `acquire_no_guard`.
    Rslock { try_mgr: rslock::LockManager, wait_mgr: rslock::LockManager, ttl: Duration },
    /// Sync: every call runs in `spawn_blocking`.
    RedlockRs { try_rl: Arc<redlock_rs::RedLock>, wait_rl: Arc<redlock_rs::RedLock>, ttl_ms: usize },
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Client").field(&self.kind()).finish()
    }
}

impl Client {
    /// Creates a client of `imp` for `urls` and opens its connections (one lock+release of
    /// a warm-up key). Fails when the nodes cannot be reached.
    pub async fn connect(imp: Impl, urls: &[String], settings: Settings) -> Result<Self, String> {
        let client = Self::new(imp, urls, settings).await?;
        client.lock_release(&format!("bench:warm:{imp}")).await?;
        Ok(client)
    }

    /// Creates a client without touching the nodes (except the floor, which opens its
    /// connections and loads its script).
    pub async fn new(imp: Impl, urls: &[String], settings: Settings) -> Result<Self, String> {
        Ok(match imp {
            Impl::Ours
            | Impl::OursFenced
            | Impl::OursReentrant
            | Impl::OursMulti
            | Impl::OursRead
            | Impl::OursWrite
            | Impl::OursSemaphore => {
                let builder = Redlock::builder()
                    .nodes(urls.iter().cloned())
                    .ttl(settings.ttl)
                    .node_timeout(settings.node_timeout);
                let try_rl = builder.clone().retry(Retry::never()).build().map_err(err)?;
                let wait_rl = builder
                    .retry(
                        Retry::new()
                            .with_unbounded_attempts()
                            .with_delay(Duration::ZERO)
                            .with_jitter(settings.retry_jitter)
                            .with_max_wait(Duration::from_secs(30)),
                    )
                    .build()
                    .map_err(err)?;
                Client::Ours { try_rl, wait_rl, kind: imp }
            }
            Impl::Floor => Client::Floor(Arc::new(Floor::connect(urls, settings).await?)),
            Impl::Rslock => {
                let mut try_mgr = rslock::LockManager::new(urls.to_vec());
                try_mgr.set_retry(1, settings.retry_jitter);
                let mut wait_mgr = try_mgr.clone();
                wait_mgr.set_retry(3, settings.retry_jitter);
                Client::Rslock { try_mgr, wait_mgr, ttl: settings.ttl }
            }
            Impl::RedlockRs => {
                let jitter_ms = settings.retry_jitter.as_millis().max(1) as u32;
                let mut try_rl = redlock_rs::RedLock::new(urls.to_vec());
                try_rl.set_retry(1, jitter_ms);
                let mut wait_rl = try_rl.clone();
                wait_rl.set_retry(3, jitter_ms);
                Client::RedlockRs {
                    try_rl: Arc::new(try_rl),
                    wait_rl: Arc::new(wait_rl),
                    ttl_ms: settings.ttl.as_millis() as usize,
                }
            }
        })
    }

    /// Which implementation this is.
    pub fn kind(&self) -> Impl {
        match self {
            Client::Ours { kind, .. } => *kind,
            Client::Floor(_) => Impl::Floor,
            Client::Rslock { .. } => Impl::Rslock,
            Client::RedlockRs { .. } => Impl::RedlockRs,
        }
    }

    /// One attempt to lock `key`, then its release. `Err` when the lock was not granted
    /// (or the release failed, where the implementation says so).
    pub async fn lock_release(&self, key: &str) -> Result<(), String> {
        match self {
            Client::Ours { try_rl, kind, .. } => ours_lock_release(try_rl, *kind, key).await,
            Client::Floor(floor) => floor.lock_release(key).await,
            Client::Rslock { try_mgr, ttl, .. } => {
                let lock = try_mgr.lock(key.as_bytes(), *ttl).await.map_err(err)?;
                try_mgr.unlock(&lock).await;
                Ok(())
            }
            Client::RedlockRs { try_rl, ttl_ms, .. } => {
                let (rl, key, ttl_ms) = (try_rl.clone(), key.to_owned(), *ttl_ms);
                tokio::task::spawn_blocking(move || {
                    let lock = rl.lock(key.as_bytes(), ttl_ms).map_err(err)?;
                    let lock = lock.ok_or_else(|| "not acquired".to_owned())?;
                    rl.unlock(&lock);
                    Ok(())
                })
                .await
                .map_err(err)?
            }
        }
    }

    /// Waits until `key` is locked (the implementation's own blocking lock), then releases.
    pub async fn lock_wait_release(&self, key: &str) -> Result<(), String> {
        match self {
            Client::Ours { wait_rl, .. } => {
                wait_rl.lock(key).await.map_err(err)?.release().await.map_err(err)
            }
            Client::Floor(floor) => loop {
                match floor.lock_release(key).await {
                    Ok(()) => return Ok(()),
                    Err(_) => tokio::time::sleep(floor.pause()).await,
                }
            },
            Client::Rslock { wait_mgr, ttl, .. } => {
                let lock = wait_mgr.acquire_no_guard(key.as_bytes(), *ttl).await.map_err(err)?;
                wait_mgr.unlock(&lock).await;
                Ok(())
            }
            Client::RedlockRs { wait_rl, ttl_ms, .. } => {
                let (rl, key, ttl_ms) = (wait_rl.clone(), key.to_owned(), *ttl_ms);
                tokio::task::spawn_blocking(move || {
                    loop {
                        if let Some(lock) = rl.lock(key.as_bytes(), ttl_ms).map_err(err)? {
                            rl.unlock(&lock);
                            return Ok(());
                        }
                    }
                })
                .await
                .map_err(err)?
            }
        }
    }
}

/// Handoff timing for tasks taking turns on one key: the gap between the moment a holder
/// starts releasing and the moment the next holder has the lock.
#[derive(Clone, Debug, Default)]
pub struct Turns(Arc<std::sync::Mutex<TurnState>>);

#[derive(Debug, Default)]
struct TurnState {
    released_at: Option<std::time::Instant>,
    gaps: Vec<std::time::Duration>,
}

impl Turns {
    fn state(&self) -> std::sync::MutexGuard<'_, TurnState> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn granted(&self) {
        let mut state = self.state();
        if let Some(released_at) = state.released_at.take() {
            state.gaps.push(released_at.elapsed());
        }
    }

    fn releasing(&self) {
        self.state().released_at = Some(std::time::Instant::now());
    }

    /// The gaps measured so far.
    pub fn gaps(&self) -> Vec<std::time::Duration> {
        self.state().gaps.clone()
    }

    /// How many gaps were measured so far.
    pub fn len(&self) -> usize {
        self.state().gaps.len()
    }

    /// Whether no gap was measured yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Client {
    /// Waits for `key` with the implementation's blocking lock, holds it for `hold`, and
    /// releases it, recording the handoff in `turns`. `None` for implementations without a
    /// blocking lock worth measuring here (the floor has none; redlock-rs polls in a
    /// blocking loop).
    pub async fn take_turn(
        &self,
        key: &str,
        hold: std::time::Duration,
        turns: &Turns,
    ) -> Option<Result<(), String>> {
        match self {
            Client::Ours { wait_rl, .. } => Some(
                async {
                    let lock = wait_rl.lock(key).await.map_err(err)?;
                    turns.granted();
                    tokio::time::sleep(hold).await;
                    turns.releasing();
                    lock.release().await.map_err(err)
                }
                .await,
            ),
            Client::Rslock { wait_mgr, ttl, .. } => Some(
                async {
                    let lock =
                        wait_mgr.acquire_no_guard(key.as_bytes(), *ttl).await.map_err(err)?;
                    turns.granted();
                    tokio::time::sleep(hold).await;
                    turns.releasing();
                    wait_mgr.unlock(&lock).await;
                    Ok(())
                }
                .await,
            ),
            Client::Floor(_) | Client::RedlockRs { .. } => None,
        }
    }
}

/// One attempt of our lock of `kind` on `key` (and `key` + `:2` for the multi kind), then
/// its release.
async fn ours_lock_release(rl: &Redlock, kind: Impl, key: &str) -> Result<(), String> {
    match kind {
        Impl::OursFenced => rl.try_lock(key).fenced().await.map_err(err)?.release().await,
        Impl::OursReentrant => {
            rl.reentrant(key, "bench").once().await.map_err(err)?.release().await
        }
        Impl::OursMulti => {
            let second = format!("{key}:2");
            rl.many(&[key, &second]).once().await.map_err(err)?.release().await
        }
        Impl::OursRead => rl.read(key).once().await.map_err(err)?.release().await,
        Impl::OursWrite => rl.write(key).once().await.map_err(err)?.release().await,
        Impl::OursSemaphore => {
            rl.semaphore(key, SEMAPHORE_PERMITS).once().await.map_err(err)?.release().await
        }
        _ => rl.try_lock(key).await.map_err(err)?.release().await,
    }
    .map_err(err)
}

fn err(e: impl fmt::Display) -> String {
    e.to_string()
}

const FLOOR_RELEASE: &str = r#"if redis.call("GET", KEYS[1]) == ARGV[1] then
  return redis.call("DEL", KEYS[1])
end
return 0"#;

/// The floor: the Redlock commands over raw multiplexed connections.
pub struct Floor {
    connections: Vec<MultiplexedConnection>,
    sha: String,
    ttl_ms: u64,
    timeout: Duration,
    jitter: Duration,
}

impl fmt::Debug for Floor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Floor").field("nodes", &self.connections.len()).finish_non_exhaustive()
    }
}

impl Floor {
    /// Opens one multiplexed connection per node (no response timeout: each request is
    /// bounded by the node timeout instead) and loads the release script on every node
    /// that answers. Nodes that cannot be reached now count as failed on every request.
    async fn connect(urls: &[String], settings: Settings) -> Result<Self, String> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(1)))
            .set_response_timeout(None);
        let mut connections = Vec::new();
        for url in urls {
            let client = redis::Client::open(url.as_str()).map_err(err)?;
            match client.get_multiplexed_async_connection_with_config(&config).await {
                Ok(mut connection) => {
                    let load = redis::cmd("SCRIPT").arg("LOAD").arg(FLOOR_RELEASE).to_owned();
                    let _ = tokio::time::timeout(
                        settings.node_timeout,
                        connection.send_packed_command(&load),
                    )
                    .await;
                    connections.push(connection);
                }
                Err(e) => return Err(format!("floor: cannot connect to {url}: {e}")),
            }
        }
        Ok(Self {
            connections,
            sha: redis::Script::new(FLOOR_RELEASE).get_hash().to_owned(),
            ttl_ms: settings.ttl.as_millis() as u64,
            timeout: settings.node_timeout,
            jitter: settings.retry_jitter,
        })
    }

    fn pause(&self) -> Duration {
        self.jitter.mul_f64(rand::rng().random::<f64>())
    }

    /// `SET key token NX PX ttl` on every node in parallel, then the compare-and-delete
    /// script on every node in parallel; `Ok` when a quorum said `OK` to the `SET`.
    pub async fn lock_release(&self, key: &str) -> Result<(), String> {
        let token: [u8; 20] = rand::random();
        let mut set = redis::cmd("SET");
        set.arg(key).arg(&token[..]).arg("NX").arg("PX").arg(self.ttl_ms);
        let granted = self
            .on_every_node(&set)
            .await
            .iter()
            .filter(|r| matches!(r, Some(Value::Okay)))
            .count();
        let mut release = redis::cmd("EVALSHA");
        release.arg(&self.sha).arg(1).arg(key).arg(&token[..]);
        self.on_every_node(&release).await;
        if granted > self.connections.len() / 2 { Ok(()) } else { Err("not acquired".to_owned()) }
    }

    async fn on_every_node(&self, cmd: &redis::Cmd) -> Vec<Option<Value>> {
        join_all(self.connections.iter().map(|connection| {
            let mut connection = connection.clone();
            async move {
                match tokio::time::timeout(self.timeout, connection.send_packed_command(cmd)).await
                {
                    Ok(Ok(value)) => Some(value),
                    _ => None,
                }
            }
        }))
        .await
    }
}
