//! The scenarios, as data.

use std::time::Duration;

use redlock_testkit::Fault;

/// What a scenario must show.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Locks are granted over the run, and exclusion holds.
    Available,
    /// No lock is granted while the fault lasts, and exclusion holds.
    Unavailable,
    /// The known weakness outside the model: exclusion breaks, and the suite must see it.
    Violation,
    /// A holder outlives its lease (a pause): its late write is reported as stale; the
    /// history check cannot see it, and only fencing stops the write.
    StaleWrite,
}

/// Which lock kind the clients take: every kind keeps exclusion under the same faults.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// `try_lock`: plain locks.
    Plain,
    /// `try_lock(..).fenced()`: writes go through the fenced helper, which rejects any
    /// write whose token is older than the last one written.
    Fenced,
    /// `reentrant(.., owner)`: each client is its own owner and re-enters once per hold.
    Reentrant,
    /// `many(..)`: two resources at once, taken in opposite orders by odd and even clients.
    Multi,
    /// `read` / `write`: two clients read (shares overlap), two write (exclusive).
    ReadWrite,
    /// `semaphore(.., PERMITS)`: eight clients wait for one of two permits; at most two
    /// hold at once, one per slot, and every client gets in.
    Semaphore,
}

/// The permits of the counting lock, in the chaos scenarios and the fuzzer's schedules:
/// fewer than the clients that contend for them.
pub const PERMITS: u32 = 2;

impl Kind {
    /// A short stable name, for tables.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Plain => "plain",
            Kind::Fenced => "fenced",
            Kind::Reentrant => "reentrant",
            Kind::Multi => "multi",
            Kind::ReadWrite => "read-write",
            Kind::Semaphore => "semaphore",
        }
    }

    /// How many clients contend: four, or eight waiting for the counting lock's permits.
    pub fn clients(self) -> usize {
        match self {
            Kind::Semaphore => 8,
            _ => 4,
        }
    }
}

/// One scenario: a fault on some nodes, and how the clients are configured.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// A short name for tables.
    pub name: &'static str,
    /// The fault, injected a quarter into the run and healed at three quarters
    /// (restarts are instantaneous); `None` for no fault.
    pub fault: Option<Fault>,
    /// The nodes (of five) the fault hits.
    pub nodes: &'static [usize],
    /// Whether the fault lasts the whole run rather than the middle half.
    pub whole_run: bool,
    /// The lease of every lock.
    pub ttl: Duration,
    /// The node timeout of every client.
    pub node_timeout: Duration,
    /// The restart quarantine of every client.
    pub quarantine: Duration,
    /// Whether nodes run with `appendfsync always`.
    pub persistent: bool,
    /// How long a critical section holds the lock between its read and its write.
    pub section: Duration,
    /// Whether client 0 stalls past its lease in its first critical section.
    pub stall: bool,
    /// The lock kind the clients take.
    pub kind: Kind,
    /// What the scenario must show.
    pub expect: Expect,
}

impl Scenario {
    fn base(
        name: &'static str,
        fault: Option<Fault>,
        nodes: &'static [usize],
        expect: Expect,
    ) -> Self {
        Self {
            name,
            fault,
            nodes,
            whole_run: false,
            ttl: Duration::from_millis(1000),
            node_timeout: Duration::from_millis(50),
            quarantine: Duration::ZERO,
            persistent: false,
            section: Duration::from_millis(2),
            stall: false,
            kind: Kind::Plain,
            expect,
        }
    }

    /// Whether clients take fencing tokens.
    pub fn fenced(&self) -> bool {
        self.kind == Kind::Fenced
    }

    /// A short description of the fault and its nodes.
    pub fn fault_label(&self) -> String {
        match self.fault {
            None => "none".to_owned(),
            Some(fault) => format!("{} on {:?}", fault.name(), self.nodes),
        }
    }
}

/// Every scenario, in table order.
pub fn matrix() -> Vec<Scenario> {
    use Expect::*;
    let latency =
        Fault::Latency { fixed: Duration::from_millis(5), jitter: Duration::from_millis(10) };
    let mut all = vec![Scenario::base("baseline", None, &[], Available)];
    // Every process and network fault on a minority: available, no violation.
    for (fault, tag) in [
        (Fault::Kill, "kill"),
        (Fault::Pause, "pause"),
        (Fault::RestartPersisted, "restart-persisted"),
        (latency, "latency"),
        (Fault::Blackhole, "blackhole"),
        (Fault::Reset, "reset"),
    ] {
        let mut one =
            Scenario::base(leak(format!("minority-1-{tag}")), Some(fault), &[2], Available);
        let mut two =
            Scenario::base(leak(format!("minority-2-{tag}")), Some(fault), &[0, 3], Available);
        if fault == Fault::RestartPersisted {
            one.persistent = true;
            two.persistent = true;
        }
        all.push(one);
        all.push(two);
    }
    // A majority down: unavailable, never a violation.
    for (fault, tag) in
        [(Fault::Kill, "kill"), (Fault::Pause, "pause"), (Fault::Blackhole, "blackhole")]
    {
        all.push(Scenario::base(
            leak(format!("majority-{tag}")),
            Some(fault),
            &[0, 2, 4],
            Unavailable,
        ));
    }
    // The known weakness: a majority restarted empty while a lock is held.
    // Long sections, so that the three restarts (tens of milliseconds each) complete while
    // the holder still holds the lock on the two nodes left.
    let weakness = Scenario {
        ttl: Duration::from_secs(2),
        section: Duration::from_millis(600),
        ..Scenario::base("restart-empty-majority", Some(Fault::RestartEmpty), &[0, 1, 2], Violation)
    };
    all.push(weakness.clone());
    all.push(Scenario {
        name: "restart-empty-majority+quarantine",
        quarantine: weakness.ttl,
        expect: Available,
        ..weakness
    });
    // Latency that eats the whole lease: refused, never granted already expired.
    all.push(Scenario {
        whole_run: true,
        ttl: Duration::from_millis(250),
        node_timeout: Duration::from_secs(1),
        ..Scenario::base(
            "latency-eats-lease",
            Some(Fault::Latency { fixed: Duration::from_millis(150), jitter: Duration::ZERO }),
            &[0, 1, 2, 3, 4],
            Unavailable,
        )
    });
    // A holder paused past its lease: only fencing catches its late write.
    let stalled = Scenario {
        ttl: Duration::from_millis(300),
        stall: true,
        ..Scenario::base("stalled-client", None, &[], StaleWrite)
    };
    all.push(stalled.clone());
    all.push(Scenario { name: "stalled-client+fencing", kind: Kind::Fenced, ..stalled });
    all.extend(other_kinds(latency));
    all
}

/// The faults that matter most, for every kind built on the plain lock (the counting lock's
/// slots are plain locks too): a minority killed,
/// paused, partitioned, reset or slowed (available, exclusive), and a majority killed
/// (unavailable, exclusive).
fn other_kinds(latency: Fault) -> Vec<Scenario> {
    let mut all = Vec::new();
    for kind in [Kind::Fenced, Kind::Reentrant, Kind::Multi, Kind::ReadWrite, Kind::Semaphore] {
        let of_kind = |name: String, fault, nodes, expect| Scenario {
            kind,
            ..Scenario::base(leak(format!("{}/{name}", kind.name())), fault, nodes, expect)
        };
        all.push(of_kind("baseline".into(), None, &[], Expect::Available));
        for fault in [Fault::Kill, Fault::Pause, Fault::Blackhole, Fault::Reset, latency] {
            let name = format!("minority-2-{}", fault.name());
            all.push(of_kind(name, Some(fault), &[0, 3], Expect::Available));
        }
        all.push(of_kind(
            "majority-kill".into(),
            Some(Fault::Kill),
            &[0, 2, 4],
            Expect::Unavailable,
        ));
    }
    all
}

fn leak(name: String) -> &'static str {
    // Scenario names live for the whole program; there are a few dozen of them.
    Box::leak(name.into_boxed_str())
}
