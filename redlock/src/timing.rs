//! Every timing constant of the engine, each with its reason: the rules they serve are on
//! one page, `guide::engine`.

use std::time::Duration;

/// The longest wait for a round's stragglers once it is decided.
pub(crate) const LINGER_MAX: Duration = Duration::from_millis(2);

/// Redis expires keys with one millisecond precision; the reference implementation adds
/// these two milliseconds to the drift allowance to cover it.
pub(crate) const EXPIRY_PRECISION: Duration = Duration::from_millis(2);

/// Pauses before a lost undo goes out again: the first is short (a reset connection is
/// usually replaced at once), the last lets a node that resets every connection for a
/// moment recover.
pub(crate) const UNDO_AGAIN: [Duration; 3] =
    [Duration::from_millis(10), Duration::from_millis(50), Duration::from_millis(200)];

/// The first pause before an undo that failed is sent again from the background; it doubles
/// each time, up to [`RESEND_MAX`]: a node that resets, or is down and may come back with
/// its data, is tried a few times a second at first, then once a second until nothing it
/// removes can exist any more.
pub(crate) const RESEND_FIRST: Duration = Duration::from_millis(50);

/// The longest pause between two background sends of an undo (see [`RESEND_FIRST`]).
pub(crate) const RESEND_MAX: Duration = Duration::from_secs(1);

/// How many holds' releases a watched channel remembers (which nodes published each): the
/// publications of one release reach the nodes within moments of each other, so only the
/// newest matter.
pub(crate) const RELEASES_HEARD: usize = 32;

/// How long the first waiter in line may take to start an attempt another waiter asked
/// for before that one takes its place: long against a task's wake-up, short against a
/// wait.
pub(crate) const STALL: Duration = Duration::from_millis(100);

/// The shortest pause after a tick a waiter let pass without an attempt of its own (one
/// behind the first in line, or one while a hold of this client has the line's turn). A
/// release wakes every waiter at once, so such ticks only stand in for a lost notification
/// or a hold left to expire: with a policy of no pause they had the first waiter make
/// round after round (about 2,300 rounds and half a core a second against loopback nodes).
/// Half the default policy's shortest pause: such a waiter still polls twice as fast as a
/// default one, at about 20 rounds a second.
pub(crate) const PASSED_TICK_MIN_PAUSE: Duration = Duration::from_millis(50);

/// How many quick retries a lost split gets per release.
pub(crate) const SPLIT_RETRIES: u32 = 3;

/// The pause before a node's next connect once one failed, doubling per failed connect
/// from the first to the last: short, so that a node restarted is used again at once, and
/// a connect a second at most to a node that stays down (see `node::Down`).
pub(crate) const CONNECT_BACKOFF: (Duration, Duration) =
    (Duration::from_millis(10), Duration::from_secs(1));

/// The shortest and longest pause before a subscriber reconnects.
pub(crate) const SUBSCRIBE_BACKOFF: (Duration, Duration) =
    (Duration::from_millis(50), Duration::from_secs(2));

/// The shortest intent lifetime, whatever the retry policy.
pub(crate) const MIN_INTENT: Duration = Duration::from_millis(50);

/// The shortest pause between two extension attempts, so that a failing node set is not
/// hammered in a loop.
pub(crate) const EXTEND_MIN_RETRY: Duration = Duration::from_millis(10);

/// The longest a timer guarding a deadline sleeps before it reads the clock again: how
/// late, at most, it notices a suspend that ate its lease (its Tokio timer does not count
/// the suspend). Measured (`lease::tests::cost_of_watching_leases_for_a_suspend`, release
/// build): 0.84 µs a wake; 1000 leases watched by `lost()` cost 0.34% of a core. The same
/// on every platform (elsewhere only the test hook moves this clock ahead): one behaviour.
pub(crate) const WAKE_CHECK: Duration = Duration::from_millis(250);

/// How long the own thread lets its last tasks finish once the client is gone: they are
/// bounded by their node timeouts, this only caps a pathological configuration.
pub(crate) const GRACE: Duration = Duration::from_secs(10);

/// Redis reports its uptime in whole wall-clock seconds: the process may have started up to
/// this much later than the reported uptime implies.
pub(crate) const UPTIME_RESOLUTION: Duration = Duration::from_secs(1);

/// How long a node that missed a wait for stragglers is not waited for (unless it answers
/// in time before): a node that is slow for good costs one wait of at most 2 ms a second, a
/// node that was slow once is waited for again within a second, whatever the rounds see.
pub(crate) const LATE_FOR: Duration = Duration::from_secs(1);

/// Requests one connection may have queued and not yet written (redis-rs defaults to 50).
pub(crate) const PIPELINE_BUFFER: usize = 4096;

/// How soon a send must be refused, within its first poll, to count as never written: a
/// connection whose driver had already stopped refuses it in a few microseconds, while a
/// request written, run and then failed with its connection takes a round trip to the
/// node and back, and a wake-up of the driver's thread (a caller's thread preempted
/// between queueing the request and waiting for its reply can see both in one poll).
pub(crate) const UNWRITTEN_WITHIN: Duration = Duration::from_micros(20);

/// The latest a create goes out after its round starts: a connect timeout, then a node
/// timeout (`NodeCall::send` refuses to send it later; the re-sends of its undos count on
/// it).
pub(crate) fn sent_within(connect_timeout: Duration, node_timeout: Duration) -> Duration {
    connect_timeout + node_timeout
}

/// The latest a create is written after its round starts: sent within [`sent_within`], and
/// sent anew at most one more node timeout later (a send again on a new connection). What
/// the re-sends of its undos count from.
pub(crate) fn written_within(connect_timeout: Duration, node_timeout: Duration) -> Duration {
    sent_within(connect_timeout, node_timeout) + node_timeout
}
