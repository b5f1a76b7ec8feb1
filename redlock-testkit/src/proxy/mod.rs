//! A TCP proxy in front of one node, to inject network faults.
//!
//! Plain std threads, not tokio: the proxy must keep working whatever runtime
//! the test uses, also a current-thread one or one that the test blocks.
//!
//! Threads: one accept thread, and two pump threads per connection (one per
//! direction, see `pump`).

mod fuzz;
mod pump;
mod rng;

use std::{
    fmt, io,
    net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream},
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

pub use fuzz::{FUZZ_SEED_ENV, Fuzz};

use crate::error::{Error, Result};
use fuzz::Direction;

/// Longest a pump blocks in a read, so it notices shutdown and due chunks.
const TICK: Duration = Duration::from_millis(10);
/// Connecting to the node: loopback answers at once, even when the node is
/// paused (the kernel completes the handshake), so this only bounds oddities.
const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// How long `Drop` waits for the threads before leaving them detached.
const DROP_JOIN_TIMEOUT: Duration = Duration::from_secs(1);

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
    /// Random delays, dropped replies and reset requests, drawn from a seed so that
    /// a failing schedule replays; see [`Fuzz`].
    Fuzz(Fuzz),
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
            accepted: AtomicU64::new(0),
            conns: Mutex::new(Vec::new()),
            parked: Mutex::new(Vec::new()),
            threads: Mutex::new(Vec::new()),
            hold: Mutex::new(None),
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
            NetFault::None | NetFault::Latency { .. } | NetFault::Fuzz(_) => {
                self.shared.close_where(|conn| conn.lost_bytes.load(Ordering::SeqCst));
            }
        }
        if fault != NetFault::Blackhole {
            self.shared.close_parked();
        }
    }

    /// Delays each request chunk that contains `needle` (for example a script's SHA, to
    /// hold back one step of a protocol and not the others) by `delay`, on top of the
    /// fault. Replies are not matched. As with a latency, the byte order is kept: what the
    /// client sends after a held chunk waits behind it. Replaces an earlier hold.
    ///
    /// A request split over two reads is matched only if one of them holds the whole
    /// needle; commands of a few hundred bytes arrive whole on loopback.
    pub fn hold_requests_containing(&self, needle: &[u8], delay: Duration) {
        self.hold_requests_containing_any(&[needle], delay);
    }

    /// [`hold_requests_containing`](Self::hold_requests_containing) for chunks that
    /// contain any of `needles` (a script's SHA and the native command that does its work
    /// on servers that have one).
    pub fn hold_requests_containing_any<N: AsRef<[u8]>>(&self, needles: &[N], delay: Duration) {
        let needles = needles.iter().map(|needle| needle.as_ref().to_vec()).collect();
        *self.shared.hold() = Some(Hold { needles, delay });
    }

    /// Ends [`hold_requests_containing`](Self::hold_requests_containing) for chunks read
    /// from now on.
    pub fn release_holds(&self) {
        *self.shared.hold() = None;
    }

    /// The current fault.
    pub fn fault(&self) -> NetFault {
        *self.shared.fault()
    }

    /// Closes every connection now, as [`NetFault::Reset`] does, and goes on accepting new
    /// ones under the current fault: a reset once, with no moment in which a client's
    /// reconnect is refused too (as between `set_fault(NetFault::Reset)` and `heal()`).
    pub fn reset_connections(&self) {
        let _fault = self.shared.fault();
        self.shared.close_where(|_| true);
    }

    /// Back to [`NetFault::None`].
    pub fn heal(&self) {
        self.set_fault(NetFault::None);
    }

    /// How many connections the proxy has accepted since it started, whatever became of
    /// them: to count a client's connects (a refused TLS handshake included).
    pub fn accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::SeqCst)
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
    /// How many connections were forwarded: the rank of the next one, for fuzz schedules.
    accepted: AtomicU64,
    /// Connections being forwarded. Lock order: `fault` before this.
    conns: Mutex<Vec<Arc<Conn>>>,
    /// Connections accepted during a blackhole: held open, never read.
    parked: Mutex<Vec<TcpStream>>,
    /// Connection threads, for `Drop` to join.
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Request chunks to delay by their content.
    hold: Mutex<Option<Hold>>,
}

/// See [`Proxy::hold_requests_containing`].
struct Hold {
    needles: Vec<Vec<u8>>,
    delay: Duration,
}

impl Hold {
    /// The extra delay of a request chunk.
    fn delay_of(&self, chunk: &[u8]) -> Duration {
        let found = self.needles.iter().any(|needle| {
            !needle.is_empty() && chunk.windows(needle.len()).any(|w| w == needle.as_slice())
        });
        if found { self.delay } else { Duration::ZERO }
    }
}

impl Shared {
    fn fault(&self) -> MutexGuard<'_, NetFault> {
        // A poisoned lock only means a panic elsewhere; the value is still valid.
        self.fault.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn conns(&self) -> MutexGuard<'_, Vec<Arc<Conn>>> {
        self.conns.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn hold(&self) -> MutexGuard<'_, Option<Hold>> {
        self.hold.lock().unwrap_or_else(PoisonError::into_inner)
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
}

/// One client connection and its connection to the node.
struct Conn {
    /// Its rank among the connections the proxy forwarded (0 for the first).
    rank: u64,
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
            NetFault::None | NetFault::Latency { .. } | NetFault::Fuzz(_) => {
                let conn_shared = Arc::clone(shared);
                let name = format!("proxy-{}-conn", shared.upstream.port());
                let rank = shared.accepted.fetch_add(1, Ordering::SeqCst);
                // If no thread can be spawned the client is dropped: closed.
                let _ = shared.spawn(name, move || connect(client, rank, &conn_shared));
            }
        }
    }
}

/// Connects to the node, then pumps client → node here and node → client in
/// a second thread.
fn connect(client: TcpStream, rank: u64, shared: &Arc<Shared>) {
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
        rank,
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
        move || pump::pump(upstream_read, &conn.client, Direction::Reply, &conn, &shared)
    };
    if shared.spawn(format!("proxy-{}-pump", shared.upstream.port()), back).is_err() {
        conn.close();
        return;
    }
    pump::pump(client_read, &conn.upstream, Direction::Request, &conn, shared);
    // Ended: closed connections leave the list, or their sockets would stay open for the
    // proxy's whole life (thousands of connections in a fuzz run).
    conn.close();
    shared.conns().retain(|conn| !conn.is_closed());
}
