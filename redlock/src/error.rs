//! What went wrong, in terms a caller can act on.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// A specialised `Result` for lock operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The outcome a caller branches on.
///
/// Details (per-node outcomes, counts, elapsed time) are on [`Error`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The configuration or an argument is invalid; retrying cannot help.
    Config,
    /// Another owner holds the resource on enough nodes that no quorum was possible.
    NotAcquired,
    /// Too few nodes were reachable or answered within the node timeout.
    Unavailable,
    /// A quorum agreed, but the time it took (plus the drift allowance) used up the whole
    /// lease, so the lock was refused rather than granted already expired.
    Expired,
    /// The lock is no longer held: its validity is over, or the nodes no longer hold its
    /// token (it expired there, or another owner took it).
    NotHeld,
    /// The key exists on a node with a data type other than a string: it is not a lock, and
    /// the library refuses to touch it.
    WrongType,
    /// The client was shut down ([`Redlock::shutdown`](crate::Redlock::shutdown)): it takes
    /// no new locks, or it could not clean every node in time.
    Shutdown,
}

impl ErrorKind {
    /// Whether a later attempt may succeed without any change by the caller.
    pub fn is_retryable(self) -> bool {
        matches!(self, Self::NotAcquired | Self::Unavailable | Self::Expired)
    }

    /// A stable snake_case name, for logs and metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Config => "config",
            Self::NotAcquired => "not_acquired",
            Self::Unavailable => "unavailable",
            Self::Expired => "expired",
            Self::NotHeld => "not_held",
            Self::WrongType => "wrong_type",
            Self::Shutdown => "shutdown",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Self::Config => "invalid configuration",
            Self::NotAcquired => "held by another owner",
            Self::Unavailable => "too few nodes answered",
            Self::Expired => "validity used up during acquisition",
            Self::NotHeld => "lock no longer held",
            Self::WrongType => "key holds another data type",
            Self::Shutdown => "the client is shut down",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())
    }
}

/// What one node said during one round.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NodeOutcome {
    /// The node did what was asked: granted, extended or released our key.
    Ok,
    /// The node holds the key for another owner.
    Held,
    /// Our key is not on the node (expired, released, or lost in a restart).
    Absent,
    /// The key holds another data type.
    WrongType,
    /// The node did not answer within the node timeout, or within the connect timeout
    /// while a connection to it was being opened.
    TimedOut,
    /// No connection to the node could be used (refused, reset, closed).
    Unreachable(Arc<str>),
    /// The node answered with an error or with a reply this library does not expect.
    Failed(Arc<str>),
    /// The node did what was asked, but it is in restart quarantine
    /// ([`RedlockBuilder::restart_quarantine`](crate::RedlockBuilder::restart_quarantine)):
    /// its yes does not count toward the quorum.
    Quarantined,
    /// The round was decided before this node answered.
    Pending,
}

impl NodeOutcome {
    /// Whether the node was faulty (rather than answering about the key).
    pub fn is_fault(&self) -> bool {
        matches!(self, Self::TimedOut | Self::Unreachable(_) | Self::Failed(_))
    }
}

impl fmt::Display for NodeOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ok => f.write_str("ok"),
            Self::Held => f.write_str("held by another owner"),
            Self::Absent => f.write_str("key absent"),
            Self::WrongType => f.write_str("wrong type"),
            Self::TimedOut => f.write_str("timed out"),
            Self::Unreachable(why) => write!(f, "unreachable: {why}"),
            Self::Failed(why) => write!(f, "failed: {why}"),
            Self::Quarantined => f.write_str("in restart quarantine"),
            Self::Pending => f.write_str("no answer before the round was decided"),
        }
    }
}

/// One node's outcome, with the node it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeReport {
    node: Arc<str>,
    outcome: NodeOutcome,
}

impl NodeReport {
    pub(crate) fn new(node: Arc<str>, outcome: NodeOutcome) -> Self {
        Self { node, outcome }
    }

    /// The node's address (`host:port/db`, never a password).
    pub fn node(&self) -> &str {
        &self.node
    }

    /// What the node said.
    pub fn outcome(&self) -> &NodeOutcome {
        &self.outcome
    }
}

/// How one round over the nodes went: every node's outcome and the time it took.
#[derive(Clone, Debug)]
pub(crate) struct RoundReport {
    pub(crate) nodes: Vec<NodeReport>,
    pub(crate) quorum: usize,
    pub(crate) elapsed: Duration,
}

impl RoundReport {
    fn count(&self, pred: impl Fn(&NodeOutcome) -> bool) -> usize {
        self.nodes.iter().filter(|r| pred(&r.outcome)).count()
    }
}

/// The error type of every fallible operation.
///
/// Branch on [`kind()`](Error::kind); the accessors give the details, and `Display` says
/// all of it in one line.
#[derive(Clone)]
pub struct Error {
    inner: Box<Inner>,
}

#[derive(Clone, Debug)]
struct Inner {
    kind: ErrorKind,
    message: String,
    resource: Option<String>,
    round: Option<RoundReport>,
}

impl Error {
    pub(crate) fn config(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Config, message.into(), None, None)
    }

    pub(crate) fn round(
        kind: ErrorKind,
        message: impl Into<String>,
        resource: &str,
        round: RoundReport,
    ) -> Self {
        Self::new(kind, message.into(), Some(resource.to_owned()), Some(round))
    }

    /// An error about the client as a whole, with every node's outcome.
    pub(crate) fn client(kind: ErrorKind, message: impl Into<String>, round: RoundReport) -> Self {
        Self::new(kind, message.into(), None, Some(round))
    }

    pub(crate) fn local(kind: ErrorKind, message: impl Into<String>, resource: &str) -> Self {
        Self::new(kind, message.into(), Some(resource.to_owned()), None)
    }

    fn new(
        kind: ErrorKind,
        message: String,
        resource: Option<String>,
        round: Option<RoundReport>,
    ) -> Self {
        Self { inner: Box::new(Inner { kind, message, resource, round }) }
    }

    /// What happened.
    pub fn kind(&self) -> ErrorKind {
        self.inner.kind
    }

    /// Shorthand for `self.kind().is_retryable()`.
    pub fn is_retryable(&self) -> bool {
        self.inner.kind.is_retryable()
    }

    /// The resource the operation was about, if any.
    pub fn resource(&self) -> Option<&str> {
        self.inner.resource.as_deref()
    }

    /// Every node's outcome in the round that failed, in the order the nodes were
    /// configured; empty when the error came before any node was asked.
    pub fn nodes(&self) -> &[NodeReport] {
        self.inner.round.as_ref().map_or(&[], |r| &r.nodes)
    }

    /// How many nodes said yes (granted, extended or released).
    pub fn granted(&self) -> usize {
        self.count(|o| matches!(o, NodeOutcome::Ok))
    }

    /// How many nodes hold the key for another owner.
    pub fn held_by_others(&self) -> usize {
        self.count(|o| matches!(o, NodeOutcome::Held))
    }

    /// How many nodes did not have our key.
    pub fn absent(&self) -> usize {
        self.count(|o| matches!(o, NodeOutcome::Absent))
    }

    /// How many nodes timed out, were unreachable or answered with an error.
    pub fn faulty(&self) -> usize {
        self.count(NodeOutcome::is_fault)
    }

    /// How many nodes had not answered when the round was decided.
    pub fn pending(&self) -> usize {
        self.count(|o| matches!(o, NodeOutcome::Pending))
    }

    /// The number of nodes that had to agree, if a round took place.
    pub fn quorum(&self) -> Option<usize> {
        self.inner.round.as_ref().map(|r| r.quorum)
    }

    /// How long the failed round took, if a round took place.
    pub fn elapsed(&self) -> Option<Duration> {
        self.inner.round.as_ref().map(|r| r.elapsed)
    }

    fn count(&self, pred: impl Fn(&NodeOutcome) -> bool) -> usize {
        self.inner.round.as_ref().map_or(0, |r| r.count(pred))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = &*self.inner;
        if let Some(resource) = &inner.resource {
            write!(f, "`{resource}`: ")?;
        }
        write!(f, "{}", inner.kind)?;
        if !inner.message.is_empty() {
            write!(f, ": {}", inner.message)?;
        }
        let Some(round) = &inner.round else {
            return Ok(());
        };
        write!(f, " (ok {} of {}, quorum {}", self.granted(), round.nodes.len(), round.quorum)?;
        let counts = [
            ("held by another owner", self.held_by_others()),
            ("key absent", self.absent()),
            ("wrong type", round.count(|o| *o == NodeOutcome::WrongType)),
            ("timed out", round.count(|o| *o == NodeOutcome::TimedOut)),
            ("unreachable", round.count(|o| matches!(o, NodeOutcome::Unreachable(_)))),
            ("failed", round.count(|o| matches!(o, NodeOutcome::Failed(_)))),
            ("in restart quarantine", round.count(|o| *o == NodeOutcome::Quarantined)),
            ("not waited for", self.pending()),
        ];
        for (label, count) in counts.into_iter().filter(|&(_, count)| count > 0) {
            write!(f, "; {label} {count}")?;
        }
        write!(f, "; after {:?})", round.elapsed)?;
        // What the failing nodes said, once per distinct reason: the reason is what an
        // operator acts on (a refused certificate, a missing ACL permission).
        let mut reasons: Vec<(String, Vec<&str>)> = Vec::new();
        for report in round.nodes.iter() {
            if !matches!(report.outcome, NodeOutcome::Unreachable(_) | NodeOutcome::Failed(_)) {
                continue;
            }
            let reason = report.outcome.to_string();
            match reasons.iter_mut().find(|(seen, _)| *seen == reason) {
                Some((_, nodes)) => nodes.push(&report.node),
                None => reasons.push((reason, vec![&report.node])),
            }
        }
        for (reason, nodes) in reasons {
            write!(f, " [{}: {reason}]", nodes.join(", "))?;
        }
        Ok(())
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = &*self.inner;
        let mut d = f.debug_struct("Error");
        d.field("kind", &inner.kind).field("message", &inner.message);
        if let Some(resource) = &inner.resource {
            d.field("resource", resource);
        }
        if let Some(round) = &inner.round {
            d.field("quorum", &round.quorum)
                .field("elapsed", &round.elapsed)
                .field("nodes", &round.nodes);
        }
        d.finish()
    }
}

impl std::error::Error for Error {}
