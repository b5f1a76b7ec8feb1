//! One direction of one proxied connection: read chunks, apply the fault, write them
//! out when due.
//!
//! A pump waits for bytes at most until its next chunk is due, reads, and keeps the chunks it read in a queue, each
//! with the instant it is due; it writes them out when due. So latency delays every
//! chunk without limiting throughput to one chunk per delay, and the byte order of
//! each direction is kept: a chunk is never due before the one read before it.

use std::{
    collections::VecDeque,
    io::{self, Read, Write},
    net::TcpStream,
    os::fd::AsFd,
    sync::atomic::Ordering,
    thread,
    time::{Duration, Instant},
};

use nix::poll::{PollFd, PollFlags, ppoll};
use nix::sys::time::TimeSpec;

use super::{
    Conn, NetFault, Shared, TICK,
    fuzz::{Direction, Fate, Fuzz, Schedule},
    rng::Rng,
};

const BUFFER_SIZE: usize = 16 * 1024;

/// What is due at an instant.
enum Item {
    /// Bytes to write.
    Bytes(Vec<u8>),
    /// The connection is to be closed (a fuzzed drop or reset): nothing after it is sent.
    Close,
}

/// What the fault says about a chunk just read.
enum Admit {
    /// Write it after this delay.
    Forward(Duration),
    /// Lose it (a blackhole, a reset).
    Lose,
    /// Lose it and close the connection after this delay.
    Close(Duration),
}

/// The random draws of one pump: jitter, and the fuzz schedule of this connection and
/// direction, drawn again when the fuzz changes.
struct Draws {
    direction: Direction,
    rank: u64,
    jitter: Rng,
    fuzz: Option<Schedule>,
}

impl Draws {
    fn fuzz(&mut self, fuzz: &Fuzz) -> Fate {
        let (rank, direction) = (self.rank, self.direction);
        let schedule = match &mut self.fuzz {
            Some(schedule) if schedule.fuzz() == fuzz => schedule,
            stale => stale.insert(fuzz.schedule(rank, direction)),
        };
        schedule.next(direction)
    }
}

/// Whether a chunk just read may be forwarded, and after which delay.
fn admit(shared: &Shared, conn: &Conn, draws: &mut Draws) -> Admit {
    let fault = shared.fault();
    match *fault {
        NetFault::None => Admit::Forward(Duration::ZERO),
        NetFault::Latency { fixed, jitter } => Admit::Forward(fixed + draws.jitter.up_to(jitter)),
        NetFault::Fuzz(fuzz) => match draws.fuzz(&fuzz) {
            Fate::Forward(delay) => Admit::Forward(delay),
            Fate::Close(delay) => Admit::Close(delay),
        },
        NetFault::Blackhole => {
            conn.lost_bytes.store(true, Ordering::SeqCst);
            Admit::Lose
        }
        NetFault::Reset => Admit::Lose,
    }
}

/// Whether a due chunk may be written: a blackhole also loses delayed ones.
fn release(shared: &Shared, conn: &Conn) -> bool {
    let fault = shared.fault();
    match *fault {
        NetFault::None | NetFault::Latency { .. } | NetFault::Fuzz(_) => true,
        NetFault::Blackhole => {
            conn.lost_bytes.store(true, Ordering::SeqCst);
            false
        }
        NetFault::Reset => false,
    }
}

/// Whether `from` has something to read (bytes, its end, an error) within `wait`, waited
/// for with a timer's precision. `true` too when the wait itself fails: the read then
/// says what is wrong.
fn readable_within(from: &TcpStream, wait: Duration) -> bool {
    let mut fds = [PollFd::new(from.as_fd(), PollFlags::POLLIN)];
    !matches!(ppoll(&mut fds, Some(TimeSpec::from_duration(wait)), None), Ok(0))
}

/// Forwards `from` to `to` until either side closes or the connection is closed.
pub(super) fn pump(
    mut from: TcpStream,
    mut to: &TcpStream,
    direction: Direction,
    conn: &Conn,
    shared: &Shared,
) {
    let mut draws = Draws { direction, rank: conn.rank, jitter: Rng::new(), fuzz: None };
    let mut queue: VecDeque<(Instant, Item)> = VecDeque::new();
    let mut buf = vec![0; BUFFER_SIZE];
    let mut last_due = Instant::now();
    let mut eof = false;
    // Only a backstop for the wait before each read: the kernel rounds a read timeout up to
    // its scheduler's tick (4 ms at 250 Hz), which would stretch a latency of a millisecond
    // several times over.
    if from.set_read_timeout(Some(TICK)).is_err() {
        conn.close();
        return;
    }
    while !conn.is_closed() && !shared.stopping.load(Ordering::SeqCst) {
        let now = Instant::now();
        while queue.front().is_some_and(|(due, _)| *due <= now) {
            let Some((_, item)) = queue.pop_front() else { break };
            let Item::Bytes(chunk) = item else {
                conn.close();
                return;
            };
            if release(shared, conn) && to.write_all(&chunk).is_err() {
                conn.close();
                return;
            }
        }
        let wait = queue.front().map_or(TICK, |(due, _)| due.saturating_duration_since(now));
        let wait = wait.min(TICK);
        if eof {
            // The source ended: deliver what is still delayed, then close.
            if queue.is_empty() {
                conn.close();
                return;
            }
            thread::sleep(wait);
            continue;
        }
        if !readable_within(&from, wait) {
            continue;
        }
        match from.read(&mut buf) {
            Ok(0) => eof = true,
            Ok(n) => {
                let held = match (direction, shared.hold().as_ref()) {
                    (Direction::Request, Some(hold)) => hold.delay_of(&buf[..n]),
                    _ => Duration::ZERO,
                };
                let (delay, item) = match admit(shared, conn, &mut draws) {
                    Admit::Forward(delay) => (delay, Item::Bytes(buf[..n].to_vec())),
                    Admit::Close(delay) => (delay, Item::Close),
                    Admit::Lose => continue,
                };
                let due = (Instant::now() + delay + held).max(last_due);
                last_due = due;
                queue.push_back((due, item));
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
