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
    /// Not acquired for contention: enough nodes answered that no quorum was possible, and
    /// they refused for other holds (another owner holds it, a split vote, or, for a
    /// reader, a waiting writer). The message says which;
    /// [`Error::is_split_vote`] and [`Error::writers_waiting`] tell them apart.
    NotAcquired,
    /// Too few nodes were reachable or answered within the node timeout.
    Unavailable,
    /// A quorum agreed, but the time it took (plus the drift allowance) used up the whole
    /// lease, so the lock was refused rather than granted already expired.
    Expired,
    /// The lock is no longer held: its validity is over, or the nodes no longer hold its
    /// token (it expired there, or another owner took it).
    NotHeld,
    /// The key exists on a node with a data type other than the kind asked for uses (a
    /// string for the plain, multi and counting locks, a hash for the reentrant and
    /// read-write locks), or a hash with another kind's fields: it is not a lock of this
    /// kind, and the library refuses to touch it.
    WrongType,
    /// The client was shut down ([`Redlock::shutdown`](crate::Redlock::shutdown)): it takes
    /// no new locks, or its releases were unconfirmed on more nodes than a quorum can spare
    /// at the shutdown's deadline.
    Shutdown,
    /// So many nodes refused this client itself that no quorum is possible without them: a
    /// login refused (a wrong or missing password, an unknown or disabled user, a password
    /// sent to a node that has none), a TLS certificate refused by the handshake, or a
    /// command the ACL user may not run. Each node's [`NodeOutcome::Denied`] says which,
    /// and what to change. Retrying cannot help until the configuration or the server
    /// changes, so a waiting request returns it at once.
    Denied,
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
            Self::Denied => "denied",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Self::Config => "invalid configuration",
            Self::NotAcquired => "not acquired",
            Self::Unavailable => "too few nodes answered",
            Self::Expired => "validity used up during acquisition",
            Self::NotHeld => "lock no longer held",
            Self::WrongType => "key holds another data type",
            Self::Shutdown => "the client is shut down",
            Self::Denied => "the nodes refused this client's login, certificate or permissions",
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
    /// No one holds the key on the node, but a writer waits for it there: a new reader is
    /// held back (writer preference).
    WriterWaiting,
    /// Our key is not on the node (expired, released, or lost in a restart).
    Absent,
    /// The key holds another data type.
    WrongType,
    /// The node did not answer within the node timeout, or within the connect timeout
    /// while a connection to it was being opened.
    TimedOut,
    /// No connection to the node could be used (refused, reset, closed).
    Unreachable(Arc<str>),
    /// The node refused this client itself: its login (`WRONGPASS`, `NOAUTH`, a password
    /// the node does not have), its TLS certificate, or a command its ACL user may not run
    /// (`NOPERM`). The text names the cause and what to change, never a password.
    Denied(Arc<str>),
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
        matches!(self, Self::TimedOut | Self::Unreachable(_) | Self::Denied(_) | Self::Failed(_))
    }
}

impl fmt::Display for NodeOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ok => f.write_str("ok"),
            Self::Held => f.write_str("held by another owner"),
            Self::WriterWaiting => f.write_str("a writer waits"),
            Self::Absent => f.write_str("key absent"),
            Self::WrongType => f.write_str("wrong type"),
            Self::TimedOut => f.write_str("timed out"),
            Self::Unreachable(why) => write!(f, "unreachable: {why}"),
            Self::Denied(why) => write!(f, "denied: {why}"),
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
    holder: Option<Arc<str>>,
}

impl NodeReport {
    pub(crate) fn new(node: Arc<str>, outcome: NodeOutcome) -> Self {
        Self { node, outcome, holder: None }
    }

    /// The node's address (`host:port/db`, never a password).
    pub fn node(&self) -> &str {
        &self.node
    }

    /// What the node said.
    pub fn outcome(&self) -> &NodeOutcome {
        &self.outcome
    }

    /// Who holds the key on the node, where it said [`NodeOutcome::Held`] and its reply
    /// named the holder (a plain lock's token); `None` otherwise.
    pub fn holder(&self) -> Option<&str> {
        self.holder.as_deref()
    }
}

/// What a [`shutdown`](crate::Redlock::shutdown) could not confirm: the nodes where a
/// release or clean-up this client sent was still in flight at the deadline, or failed
/// during the shutdown. Their keys stay there until their leases end. A shutdown is `Ok`
/// only while these are no more nodes than a quorum can spare: every such release then
/// removed its hold from a quorum, so those keys keep no other client out.
///
/// It covers what the client sent: not the guards the caller still holds, nor releases
/// that failed before the shutdown began (their errors and warnings were given then), nor
/// those of background work that had not started by the deadline (a deadline of zero may
/// end before the auto-extended locks are released).
///
/// `Display` says it in one line, for a log.
#[derive(Clone, Debug)]
pub struct ShutdownReport {
    round: RoundReport,
}

impl ShutdownReport {
    pub(crate) fn new(round: RoundReport) -> Self {
        Self { round }
    }

    /// Every node's outcome, in the order the nodes were configured: [`NodeOutcome::Ok`]
    /// where every release was confirmed, otherwise the last fault a release met there
    /// (`TimedOut` when it was sent and not answered by the deadline).
    pub fn nodes(&self) -> &[NodeReport] {
        &self.round.nodes
    }

    /// The nodes where a release was not confirmed.
    pub fn unconfirmed(&self) -> impl Iterator<Item = &NodeReport> {
        self.round.nodes.iter().filter(|node| node.outcome != NodeOutcome::Ok)
    }

    /// Whether every release was confirmed on every node.
    pub fn is_clean(&self) -> bool {
        self.unconfirmed().next().is_none()
    }

    /// The number of nodes a quorum has.
    pub fn quorum(&self) -> usize {
        self.round.quorum
    }

    pub(crate) fn into_round(self) -> RoundReport {
        self.round
    }
}

impl fmt::Display for ShutdownReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_clean() {
            return f.write_str("every release confirmed on every node");
        }
        let nodes: Vec<String> =
            self.unconfirmed().map(|node| format!("{} ({})", node.node, node.outcome)).collect();
        write!(
            f,
            "releases not confirmed on {}: their keys there stay until their leases end; \
             each release was confirmed on a quorum",
            nodes.join(", ")
        )
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
    /// Records who holds the key on node `i`.
    pub(crate) fn note_holder(&mut self, i: usize, holder: Arc<str>) {
        if let Some(report) = self.nodes.get_mut(i) {
            report.holder = Some(holder);
        }
    }

    fn count(&self, pred: impl Fn(&NodeOutcome) -> bool) -> usize {
        self.nodes.iter().filter(|r| pred(&r.outcome)).count()
    }
}

/// Why an acquisition was refused for contention, read from the nodes' answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Enough nodes hold it for others (or could, among those that did not answer) that
    /// another owner may hold it on a quorum.
    Held,
    /// No other owner can hold it on a quorum: the votes were split.
    SplitVote,
    /// No one holds it on a quorum, and a writer waits for it: readers are held back.
    WriterWaiting,
}

impl Refusal {
    /// The reason behind a contention refusal with these per-node answers.
    pub(crate) fn of(nodes: &[NodeReport], quorum: usize) -> Self {
        let count =
            |pred: fn(&NodeOutcome) -> bool| nodes.iter().filter(|r| pred(&r.outcome)).count();
        let waiting = count(|o| matches!(o, NodeOutcome::WriterWaiting));
        // A node that did not say what it holds may hold it for any other owner, and so
        // may one that said "held" without naming the holder.
        let unknown = count(|o| o.is_fault() || matches!(o, NodeOutcome::Pending))
            + nodes.iter().filter(|r| r.outcome == NodeOutcome::Held && r.holder.is_none()).count();
        // The most nodes any one named holder has.
        let mut named: Vec<(&str, usize)> = Vec::new();
        for holder in
            nodes.iter().filter(|r| r.outcome == NodeOutcome::Held).filter_map(|r| r.holder())
        {
            match named.iter_mut().find(|(h, _)| *h == holder) {
                Some((_, count)) => *count += 1,
                None => named.push((holder, 1)),
            }
        }
        let most = named.iter().map(|&(_, count)| count).max().unwrap_or(0);
        if most + unknown >= quorum {
            Self::Held
        } else if waiting > 0 {
            Self::WriterWaiting
        } else {
            Self::SplitVote
        }
    }

    /// What a refusal's message says.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Self::Held => "held by another owner",
            Self::SplitVote => {
                "a split vote: no other owner holds it on a quorum, the contenders' votes were divided"
            }
            Self::WriterWaiting => {
                "a writer waits for it: writer preference holds new readers back (no writer holds it on a quorum; readers may)"
            }
        }
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

    /// A refused acquisition: `kind` with what the nodes' answers say of it (for contention,
    /// whether another owner holds it, the votes split, or a writer waits).
    pub(crate) fn refused(kind: ErrorKind, resource: &str, round: RoundReport) -> Self {
        let message = match kind {
            ErrorKind::NotAcquired => Refusal::of(&round.nodes, round.quorum).describe(),
            _ => "",
        };
        Self::round(kind, message, resource, round)
    }

    /// An error about the client as a whole, with every node's outcome.
    pub(crate) fn client(kind: ErrorKind, message: impl Into<String>, round: RoundReport) -> Self {
        Self::new(kind, message.into(), None, Some(round))
    }

    /// This error's nodes and resource, told as `kind` with `message`, this error's own
    /// message after `what`: a lease lost after extensions failed, with the last one's
    /// outcomes.
    pub(crate) fn retold(&self, kind: ErrorKind, message: &str, what: &str) -> Self {
        let inner = &*self.inner;
        let message = match inner.message.is_empty() {
            true => format!("{message}; {what}: {}", inner.kind),
            false => format!("{message}; {what}: {}: {}", inner.kind, inner.message),
        };
        Self::new(kind, message, inner.resource.clone(), inner.round.clone())
    }

    pub(crate) fn local(kind: ErrorKind, message: impl Into<String>, resource: &str) -> Self {
        Self::new(kind, message.into(), Some(resource.to_owned()), None)
    }

    /// Too few nodes answered, and so many of them refused this client itself that no
    /// quorum is possible without them: [`ErrorKind::Denied`], since no retry can help.
    fn new(
        kind: ErrorKind,
        message: String,
        resource: Option<String>,
        round: Option<RoundReport>,
    ) -> Self {
        let denied = round.as_ref().is_some_and(|round| {
            let denied = round.count(|o| matches!(o, NodeOutcome::Denied(_)));
            denied > round.nodes.len().saturating_sub(round.quorum)
        });
        let kind = if kind == ErrorKind::Unavailable && denied { ErrorKind::Denied } else { kind };
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

    /// How many nodes refused a reader only because a writer waits there (writer
    /// preference): no one holds the lock on them.
    pub fn writers_waiting(&self) -> usize {
        self.count(|o| matches!(o, NodeOutcome::WriterWaiting))
    }

    /// Whether an acquisition was refused although no other owner can hold the lock on a
    /// quorum: contenders split the nodes' votes between them (each short of a quorum), and
    /// nobody got the lock in that round. A later attempt will likely succeed. False for
    /// any other error, and for a reader held back by a waiting writer
    /// ([`writers_waiting`](Error::writers_waiting)).
    pub fn is_split_vote(&self) -> bool {
        self.inner.kind == ErrorKind::NotAcquired
            && self
                .inner
                .round
                .as_ref()
                .is_some_and(|r| Refusal::of(&r.nodes, r.quorum) == Refusal::SplitVote)
    }

    /// How many nodes did not have our key.
    pub fn absent(&self) -> usize {
        self.count(|o| matches!(o, NodeOutcome::Absent))
    }

    /// How many nodes timed out, were unreachable or answered with an error.
    pub fn faulty(&self) -> usize {
        self.count(NodeOutcome::is_fault)
    }

    /// How many nodes failed with a reason of their own (an error reply, a refused
    /// certificate, login or permission, a refused connection), rather than a timeout.
    fn stated_faults(&self) -> usize {
        self.count(|o| {
            matches!(
                o,
                NodeOutcome::Unreachable(_) | NodeOutcome::Denied(_) | NodeOutcome::Failed(_)
            )
        })
    }

    /// Of two errors of successive attempts, the one worth reporting: `later`, unless both
    /// say that too few nodes answered and `earlier` names more of the nodes' own reasons
    /// (a certificate, a login or a permission refused at the first connect outranks the
    /// timeouts of the attempts after it).
    pub(crate) fn most_telling(earlier: Option<Error>, later: Error) -> Error {
        match earlier {
            Some(earlier)
                if later.kind() == ErrorKind::Unavailable
                    && earlier.kind() == ErrorKind::Unavailable
                    && earlier.stated_faults() > later.stated_faults() =>
            {
                earlier
            }
            _ => later,
        }
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
            ("a writer waits", self.writers_waiting()),
            ("key absent", self.absent()),
            ("wrong type", round.count(|o| *o == NodeOutcome::WrongType)),
            ("timed out", round.count(|o| *o == NodeOutcome::TimedOut)),
            ("unreachable", round.count(|o| matches!(o, NodeOutcome::Unreachable(_)))),
            ("denied", round.count(|o| matches!(o, NodeOutcome::Denied(_)))),
            ("failed", round.count(|o| matches!(o, NodeOutcome::Failed(_)))),
            ("in restart quarantine", round.count(|o| *o == NodeOutcome::Quarantined)),
            ("not waited for", self.pending()),
        ];
        for (label, count) in counts.into_iter().filter(|&(_, count)| count > 0) {
            write!(f, "; {label} {count}")?;
        }
        write!(f, "; after {:?})", round.elapsed)?;
        // What the failing nodes said, once per distinct reason: the reason is what an
        // operator acts on (a refused certificate, a missing ACL permission, a node that
        // timed out or had not answered).
        let mut reasons: Vec<(String, Vec<&str>)> = Vec::new();
        for report in round.nodes.iter() {
            if !report.outcome.is_fault() && report.outcome != NodeOutcome::Pending {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn report(outcomes: &[NodeOutcome]) -> Vec<NodeReport> {
        outcomes.iter().map(|o| NodeReport::new("n".into(), o.clone())).collect()
    }

    #[test]
    fn a_refusal_names_a_holder_only_where_one_can_hold_a_quorum() {
        use NodeOutcome::*;
        let of = |outcomes: &[NodeOutcome]| Refusal::of(&report(outcomes), outcomes.len() / 2 + 1);
        assert_eq!(of(&[Held, Held, Ok]), Refusal::Held);
        assert_eq!(of(&[Held, TimedOut, Ok]), Refusal::Held, "the silent node may hold it");
        assert_eq!(of(&[Held, Held, Ok, Ok, TimedOut]), Refusal::Held);
        assert_eq!(of(&[Held, Held, Ok, Ok, Absent]), Refusal::SplitVote);
        assert_eq!(of(&[Held, Ok, Ok, Held, Pending]), Refusal::Held);
        assert_eq!(of(&[WriterWaiting, WriterWaiting, Ok]), Refusal::WriterWaiting);
        assert_eq!(of(&[Held, WriterWaiting, Ok]), Refusal::WriterWaiting);
        assert_eq!(of(&[Held, Held, WriterWaiting]), Refusal::Held);
    }

    #[test]
    fn named_holders_short_of_a_quorum_each_are_a_split_vote() {
        use NodeOutcome::*;
        let mut nodes = report(&[Ok, Held, Held]);
        nodes[1].holder = Some("b".into());
        nodes[2].holder = Some("c".into());
        assert_eq!(Refusal::of(&nodes, 2), Refusal::SplitVote);
        nodes[2].holder = Some("b".into());
        assert_eq!(Refusal::of(&nodes, 2), Refusal::Held);
        nodes[2].holder = None;
        assert_eq!(Refusal::of(&nodes, 2), Refusal::Held, "an unnamed holder may be b");
    }

    #[test]
    fn a_refused_certificate_outranks_later_timeouts_but_not_a_later_refusal() {
        use NodeOutcome::*;
        let error = |kind, outcomes: &[NodeOutcome]| {
            let round = RoundReport { nodes: report(outcomes), quorum: 2, elapsed: Duration::ZERO };
            Error::round(kind, "", "r", round)
        };
        let certificate = Unreachable("invalid peer certificate: UnknownIssuer".into());
        let first = error(ErrorKind::Unavailable, &[certificate.clone(), certificate, TimedOut]);
        let timeouts = error(ErrorKind::Unavailable, &[TimedOut, TimedOut, TimedOut]);
        let kept = Error::most_telling(Some(first), timeouts.clone());
        assert!(kept.to_string().contains("UnknownIssuer"), "{kept}");
        let held = error(ErrorKind::NotAcquired, &[Held, Held, TimedOut]);
        let kept = Error::most_telling(Some(kept), held);
        assert_eq!(kept.kind(), ErrorKind::NotAcquired, "the last word on contention stands");
        assert_eq!(Error::most_telling(None, timeouts).faulty(), 3);
    }

    #[test]
    fn a_split_vote_says_so_in_its_message_and_accessor() {
        use NodeOutcome::*;
        let nodes = report(&[Held, Held, Ok, Ok, Absent]);
        let round = RoundReport { nodes, quorum: 3, elapsed: Duration::ZERO };
        let err = Error::refused(ErrorKind::NotAcquired, "r", round.clone());
        assert!(err.is_split_vote());
        assert!(err.to_string().contains("split vote"), "{err}");
        let err = Error::refused(ErrorKind::Unavailable, "r", round);
        assert!(!err.is_split_vote());
    }
}
