//! A TCP proxy in front of one node, to inject network faults.
//!
//! Plain std threads, not tokio: the proxy must keep working whatever runtime
//! the test uses, also a current-thread one or one that the test blocks.
//!
//! Threads: one accept thread, and two pump threads per connection (one per
//! direction). A pump reads with a short timeout and keeps the chunks it read
//! in a queue, each with the instant it is due; it writes them out when due.
//! So latency delays every chunk without limiting throughput to one chunk per
//! delay, and the byte order of each direction is kept.

use std::{
    collections::{VecDeque, hash_map::RandomState},
    fmt,
    hash::BuildHasher,
    io::{self, Read, Write},
    net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream},
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use crate::error::{Error, Result};

/// Longest a pump blocks in a read, so it notices shutdown and due chunks.
const TICK: Duration = Duration::from_millis(10);
/// Connecting to the node: loopback answers at once, even when the node is
/// paused (the kernel completes the handshake), so this only bounds oddities.
const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// How long `Drop` waits for the threads before leaving them detached.
const DROP_JOIN_TIMEOUT: Duration = Duration::from_secs(1);
const BUFFER_SIZE: usize = 16 * 1024;

/// A network fault that a [`Proxy`] applies to its traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum NetFault {
    /// Forwards everything at once.
    #[default]
    None,
    /// Every chunk forwarded, in both directions, is delayed by `fixed` plus a
    /// uniformly random part up to `jitter`. A round trip is thus delayed
    /// about twice. The byte order of each direction is kept: a chunk is
    /// never released before the one read before it.
    Latency {
        /// The delay every chunk gets.
        fixed: Duration,
        /// The bound of the random extra delay.
        jitter: Duration,
    },
    /// A partition: connections stay open (new ones are accepted), but nothing
    /// is forwarded either way and nothing is answered. Bytes sent meanwhile
    /// are lost, as packets are, also those delayed by an earlier latency.
    ///
    /// When the blackhole ends, connections that lost bytes, and those opened
    /// during it, are closed: their client waits for answers that will never
    /// come, so it must reconnect. Connections that stayed idle go on working.
    Blackhole,
    /// Existing connections are closed at once, new ones are accepted then
    /// closed at once: the client sees its connection reset or ended.
    Reset,
}

/// A TCP proxy on a free `127.0.0.1` port, forwarding to a node's port, with
/// a [`NetFault`] that can change at any time.
///
/// Dropping it stops accepting (the port is closed) and closes every connection.
pub struct Proxy {
    port: u16,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl Proxy {
    /// Starts a proxy to `127.0.0.1:upstream_port` on a free port.
    ///
    /// The upstream does not need to be up: while it is down, connections to
    /// the proxy are accepted then closed, as if refused.
    pub fn start(upstream_port: u16) -> Result<Proxy> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .map_err(|e| Error::spawn("could not bind the proxy's port", e))?;
        let port = listener
            .local_addr()
            .map_err(|e| Error::spawn("could not read the proxy's port", e))?
            .port();
        let shared = Arc::new(Shared {
            upstream: SocketAddr::from((Ipv4Addr::LOCALHOST, upstream_port)),
            fault: Mutex::new(NetFault::None),
            stopping: AtomicBool::new(false),
            conns: Mutex::new(Vec::new()),
            parked: Mutex::new(Vec::new()),
            threads: Mutex::new(Vec::new()),
        });
        let accept = {
            let shared = Arc::clone(&shared);
            thread::Builder::new()
                .name(format!("proxy-{port}-accept"))
                .spawn(move || accept_loop(&listener, &shared))
                .map_err(|e| Error::spawn("could not spawn the proxy's accept thread", e))?
        };
        Ok(Proxy { port, shared, accept: Some(accept) })
    }

    /// The proxy's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT`, the proxy's port: what clients should use.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The port the proxy forwards to.
    pub fn upstream_port(&self) -> u16 {
        self.shared.upstream.port()
    }

    /// Applies `fault` to existing and new connections. Takes effect before
    /// this returns: connections to close (on `Reset`, or those a blackhole
    /// broke) are closed, and chunks read from now on follow the new fault.
    /// Chunks already delayed by a latency keep their due time.
    pub fn set_fault(&self, fault: NetFault) {
        // Under the fault lock: pumps mark a connection as having lost bytes
        // under it too, so no such connection survives a heal unnoticed.
        let mut current = self.shared.fault();
        *current = fault;
        match fault {
            NetFault::Reset => self.shared.close_where(|_| true),
            NetFault::Blackhole => {}
            NetFault::None | NetFault::Latency { .. } => {
                self.shared.close_where(|conn| conn.lost_bytes.load(Ordering::SeqCst));
            }
        }
        if fault != NetFault::Blackhole {
            self.shared.close_parked();
        }
    }

    /// The current fault.
    pub fn fault(&self) -> NetFault {
        *self.shared.fault()
    }

    /// Back to [`NetFault::None`].
    pub fn heal(&self) {
        self.set_fault(NetFault::None);
    }

    /// How many connections are being forwarded now (not counting those
    /// opened during a blackhole): to check that clients reconnected.
    pub fn connections(&self) -> usize {
        let mut conns = self.shared.conns();
        conns.retain(|conn| !conn.is_closed());
        conns.len()
    }
}

impl fmt::Debug for Proxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Proxy")
            .field("port", &self.port)
            .field("upstream_port", &self.upstream_port())
            .field("fault", &self.fault())
            .finish_non_exhaustive()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        // The accept thread blocks in accept(): a connection wakes it up, and
        // it sees `stopping`. If this fails, the thread is left detached.
        let _ = TcpStream::connect_timeout(
            &SocketAddr::from((Ipv4Addr::LOCALHOST, self.port)),
            UPSTREAM_CONNECT_TIMEOUT,
        );
        {
            let _fault = self.shared.fault();
            self.shared.close_where(|_| true);
            self.shared.close_parked();
        }
        let mut threads = std::mem::take(&mut *self.shared.threads());
        threads.extend(self.accept.take());
        // Every thread notices within a tick; never hang a test's teardown
        // on one that doesn't: after the timeout the rest are detached.
        let deadline = Instant::now() + DROP_JOIN_TIMEOUT;
        while threads.iter().any(|t| !t.is_finished()) && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(1));
        }
        for thread in threads.into_iter().filter(JoinHandle::is_finished) {
            let _ = thread.join();
        }
    }
}

/// What the proxy's threads share.
struct Shared {
    upstream: SocketAddr,
    fault: Mutex<NetFault>,
    stopping: AtomicBool,
    /// Connections being forwarded. Lock order: `fault` before this.
    conns: Mutex<Vec<Arc<Conn>>>,
    /// Connections accepted during a blackhole: held open, never read.
    parked: Mutex<Vec<TcpStream>>,
    /// Connection threads, for `Drop` to join.
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Shared {
    fn fault(&self) -> MutexGuard<'_, NetFault> {
        // A poisoned lock only means a panic elsewhere; the value is still valid.
        self.fault.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn conns(&self) -> MutexGuard<'_, Vec<Arc<Conn>>> {
        self.conns.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn threads(&self) -> MutexGuard<'_, Vec<JoinHandle<()>>> {
        self.threads.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn close_where(&self, pred: impl Fn(&Conn) -> bool) {
        self.conns().retain(|conn| {
            if pred(conn) {
                conn.close();
            }
            !conn.is_closed()
        });
    }

    fn close_parked(&self) {
        for stream in self.parked.lock().unwrap_or_else(PoisonError::into_inner).drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }

    fn spawn(&self, name: String, f: impl FnOnce() + Send + 'static) -> io::Result<()> {
        let handle = thread::Builder::new().name(name).spawn(f)?;
        let mut threads = self.threads();
        // Finished threads are dropped here so a long test doesn't accumulate them.
        threads.retain(|t| !t.is_finished());
        threads.push(handle);
        Ok(())
    }

    /// Whether a chunk just read may be forwarded, and after which delay.
    fn admit(&self, conn: &Conn, rng: &mut Rng) -> Option<Duration> {
        let fault = self.fault();
        match *fault {
            NetFault::None => Some(Duration::ZERO),
            NetFault::Latency { fixed, jitter } => Some(fixed + rng.up_to(jitter)),
            NetFault::Blackhole => {
                conn.lost_bytes.store(true, Ordering::SeqCst);
                None
            }
            NetFault::Reset => None,
        }
    }

    /// Whether a due chunk may be written: a blackhole also loses delayed ones.
    fn release(&self, conn: &Conn) -> bool {
        let fault = self.fault();
        match *fault {
            NetFault::None | NetFault::Latency { .. } => true,
            NetFault::Blackhole => {
                conn.lost_bytes.store(true, Ordering::SeqCst);
                false
            }
            NetFault::Reset => false,
        }
    }
}

/// One client connection and its connection to the node.
struct Conn {
    client: TcpStream,
    upstream: TcpStream,
    /// A blackhole dropped bytes of this connection: close it when it ends.
    lost_bytes: AtomicBool,
    closed: AtomicBool,
}

impl Conn {
    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        // Shutdown also wakes up a pump blocked on either socket.
        let _ = self.client.shutdown(Shutdown::Both);
        let _ = self.upstream.shutdown(Shutdown::Both);
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    for stream in listener.incoming() {
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = stream else {
            // E.g. out of file descriptors: don't spin.
            thread::sleep(TICK);
            continue;
        };
        // Under the fault lock, as `set_fault` closes connections under it.
        let fault = shared.fault();
        match *fault {
            NetFault::Reset => drop(client),
            NetFault::Blackhole => {
                shared.parked.lock().unwrap_or_else(PoisonError::into_inner).push(client);
            }
            NetFault::None | NetFault::Latency { .. } => {
                let conn_shared = Arc::clone(shared);
                let name = format!("proxy-{}-conn", shared.upstream.port());
                // If no thread can be spawned the client is dropped: closed.
                let _ = shared.spawn(name, move || connect(client, &conn_shared));
            }
        }
    }
}

/// Connects to the node, then pumps client → node here and node → client in
/// a second thread.
fn connect(client: TcpStream, shared: &Arc<Shared>) {
    let Ok(upstream) = TcpStream::connect_timeout(&shared.upstream, UPSTREAM_CONNECT_TIMEOUT)
    else {
        return; // The node is down: the client sees its connection closed.
    };
    // Nagle would hold back small writes (a RESP reply) for tens of milliseconds.
    let setup = [client.set_nodelay(true), upstream.set_nodelay(true)];
    let (Ok(client_read), Ok(upstream_read)) = (client.try_clone(), upstream.try_clone()) else {
        return;
    };
    if setup.iter().any(Result::is_err) {
        return;
    }
    let conn = Arc::new(Conn {
        client,
        upstream,
        lost_bytes: AtomicBool::new(false),
        closed: AtomicBool::new(false),
    });
    {
        // Under the fault lock, as `set_fault` closes connections under it.
        let fault = shared.fault();
        if *fault == NetFault::Reset || shared.stopping.load(Ordering::SeqCst) {
            conn.close();
            return;
        }
        shared.conns().push(Arc::clone(&conn));
    }
    let back = {
        let (shared, conn) = (Arc::clone(shared), Arc::clone(&conn));
        move || pump(upstream_read, &conn.client, &conn, &shared)
    };
    if shared.spawn(format!("proxy-{}-pump", shared.upstream.port()), back).is_err() {
        conn.close();
        return;
    }
    pump(client_read, &conn.upstream, &conn, shared);
}

/// Forwards `from` to `to` until either side closes or the connection is closed.
fn pump(mut from: TcpStream, mut to: &TcpStream, conn: &Conn, shared: &Shared) {
    let mut rng = Rng::new();
    let mut queue: VecDeque<(Instant, Vec<u8>)> = VecDeque::new();
    let mut buf = vec![0; BUFFER_SIZE];
    let mut last_due = Instant::now();
    let mut read_timeout = None;
    let mut eof = false;
    while !conn.is_closed() && !shared.stopping.load(Ordering::SeqCst) {
        let now = Instant::now();
        while queue.front().is_some_and(|(due, _)| *due <= now) {
            let Some((_, chunk)) = queue.pop_front() else { break };
            if shared.release(conn) && to.write_all(&chunk).is_err() {
                conn.close();
                return;
            }
        }
        let wait = queue.front().map_or(TICK, |(due, _)| due.saturating_duration_since(now));
        // A zero read timeout is an error; a millisecond is precise enough.
        let wait = wait.clamp(Duration::from_millis(1), TICK);
        if eof {
            // The source ended: deliver what is still delayed, then close.
            if queue.is_empty() {
                conn.close();
                return;
            }
            thread::sleep(wait);
            continue;
        }
        if read_timeout != Some(wait) {
            if from.set_read_timeout(Some(wait)).is_err() {
                conn.close();
                return;
            }
            read_timeout = Some(wait);
        }
        match from.read(&mut buf) {
            Ok(0) => eof = true,
            Ok(n) => {
                if let Some(delay) = shared.admit(conn, &mut rng) {
                    let due = (Instant::now() + delay).max(last_due);
                    last_due = due;
                    queue.push_back((due, buf[..n].to_vec()));
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) => {}
            Err(_) => {
                conn.close();
                return;
            }
        }
    }
}

/// Xorshift64: jitter needs no quality, only no extra dependency.
struct Rng(u64);

impl Rng {
    fn new() -> Rng {
        // RandomState is randomly seeded per process and per instance; `| 1`: never zero.
        Rng(RandomState::new().hash_one(0u8) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in `[0, max]`.
    fn up_to(&mut self, max: Duration) -> Duration {
        if max.is_zero() {
            return Duration::ZERO;
        }
        // The top 53 bits as a fraction in [0, 1).
        max.mul_f64((self.next() >> 11) as f64 / (1u64 << 53) as f64)
    }
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
}
