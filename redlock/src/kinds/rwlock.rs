//! The read-write lock: many readers or one writer per resource, over the quorum.
//!
//! Layout, writer preference, limits and the safety argument: [`crate::guide::kinds`].

use crate::timing;
use std::sync::Arc;

use redis::Value;

use crate::command::{self, Arg, Command, Resend};
use crate::config::Config;
use crate::engine::protocol::{Args, Identity, failed, script_answer};
use crate::engine::{Answer, Op, Protocol};
use crate::error::NodeOutcome;
use crate::guard::guard;
use crate::node::{Reply, Routes};
use crate::quorum::MAX_TTL;
use crate::retry::Retry;
use crate::token;

/// Whether a waiting writer blocks new readers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WriterPriority {
    /// The default: a refused writer records an intent that refuses new readers until it
    /// is granted or gives up, so a steady stream of readers cannot starve it.
    #[default]
    Preferred,
    /// The writer waits like any other client: readers keep coming while it waits, and
    /// under a steady read load it may never get in.
    None,
}

/// Which side of the lock a hold is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    Read,
    Write,
}

/// A waiting writer's intent: its field and lifetime, the same for all its attempts, and
/// where those attempts went out on each node (its withdrawal goes behind them).
#[derive(Clone)]
pub(crate) struct Intent {
    field: Arc<str>,
    ms: u64,
    routes: Routes,
}

impl std::fmt::Debug for Intent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Intent").field("field", &self.field).field("ms", &self.ms).finish()
    }
}

impl Intent {
    /// A fresh intent, living long enough to last from one attempt of `retry` to the next.
    pub(crate) fn new(config: &Config, retry: &Retry, nodes: usize) -> Self {
        let pause = retry.delay().saturating_add(retry.jitter());
        let gap = pause.saturating_mul(2).saturating_add(config.node_timeout.saturating_mul(4));
        // Bounded like a lease, so that the node's expiry arithmetic stays exact.
        let ms = gap.clamp(timing::MIN_INTENT, MAX_TTL).as_millis();
        let field = format!("i:{}", token::generate()).into();
        Self { field, ms: u64::try_from(ms).unwrap_or(u64::MAX), routes: Routes::new(nodes) }
    }

    /// The command that withdraws this intent from a node (a writer that gave up), with
    /// the routes of the wait's attempts, which it goes behind.
    pub(crate) fn withdrawal(&self, key: &str) -> (Command, Routes) {
        let intent = Arg::Bytes(self.field.as_bytes());
        let args = [Arg::Bytes(b""), Arg::ReleaseChannel(key), intent];
        (Command::script(&command::RW_RELEASE, &[key], &args, Resend::Safe), self.routes.clone())
    }
}

/// One reader's share or one writer's grant: the hash field `r:<token>` or `w:<token>`.
#[derive(Debug)]
pub(crate) struct Share {
    id: Identity,
    mode: Mode,
    field: Arc<str>,
    intent: Option<Intent>,
}

impl Share {
    /// A fresh share or grant of `key`; a waiting writer passes its intent.
    pub(crate) fn new(
        key: Arc<str>,
        mode: Mode,
        intent: Option<Intent>,
        label: Option<&str>,
    ) -> Self {
        let (kind, prefix) = match mode {
            Mode::Read => ("read lock", "r:"),
            Mode::Write => ("write lock", "w:"),
        };
        let id = Identity::new(kind, smallvec::smallvec![key], label);
        let field = format!("{prefix}{}", id.token).into();
        Self { id, mode, field, intent }
    }

    pub(crate) fn field(&self) -> &str {
        &self.field
    }
}

impl Protocol for Share {
    fn is_exclusive(&self) -> bool {
        self.mode == Mode::Write
    }

    fn records_intent(&self) -> bool {
        self.intent.is_some()
    }

    fn intent_routes(&self) -> Option<&Routes> {
        self.intent.as_ref().map(|intent| &intent.routes)
    }

    fn identity(&self) -> &Identity {
        &self.id
    }

    fn command(&self, op: Op, args: &Args) -> Command {
        let keys = [&*self.id.keys[0]];
        let field = self.field.as_bytes();
        let ms = args.ttl.arg();
        let intent_ms = self.intent.as_ref().map_or(0, |intent| intent.ms).to_string();
        let intent = self.intent.as_ref().map_or(&b""[..], |intent| intent.field.as_bytes());
        let (field, ms, intent) =
            (Arg::Bytes(field), Arg::Bytes(ms.as_bytes()), Arg::Bytes(intent));
        let channel = args.release_channel(keys[0]);
        let (script, argv): (_, Vec<Arg<'_>>) = match (op, self.mode) {
            (Op::Acquire, Mode::Read) => (&command::RW_READ_ACQUIRE, vec![field, ms]),
            (Op::Acquire, Mode::Write) => (
                &command::RW_WRITE_ACQUIRE,
                vec![field, ms, intent, Arg::Bytes(intent_ms.as_bytes())],
            ),
            (Op::Extend, _) => (&command::RW_EXTEND, vec![field, ms]),
            // Given up for good: the intent goes too (where it lingers, on the nodes that
            // refused us).
            (Op::Release, _) => (&command::RW_RELEASE, vec![field, channel, intent]),
            // A failed attempt of a writer that keeps waiting keeps its intent.
            (Op::CleanUp, _) => (&command::RW_RELEASE, vec![field, channel, Arg::Bytes(b"")]),
            (Op::Check, _) => {
                return Command::script(&command::RW_CHECK, &keys, &[field], Resend::Safe);
            }
        };
        let command = Command::script(script, &keys, &argv, Resend::Safe);
        if op == Op::Acquire || op == Op::Extend { command.creating() } else { command }
    }

    fn answer(&self, op: Op, reply: &Reply) -> Answer {
        match (op, &reply.value) {
            (Op::Acquire, Ok(Value::Int(1))) => NodeOutcome::Ok.into(),
            // -1: a writer holds it (or, for a writer, readers do); -2: a writer waits.
            (Op::Acquire, Ok(Value::Int(-1))) => NodeOutcome::Held.into(),
            (Op::Acquire, Ok(Value::Int(-2))) => NodeOutcome::WriterWaiting.into(),
            (Op::Acquire, other) => failed(other).into(),
            _ => script_answer(reply),
        }
    }
}

guard! {
    /// One reader's share of a read-write lock, held on a quorum of nodes, valid until
    /// [`validity()`](ReadLock::validity) reaches zero.
    ///
    /// Other readers may hold shares at the same time; no writer holds the resource while
    /// this share is valid. Call [`release()`](ReadLock::release) when done; dropped
    /// without it, the share is released in the background.
    ReadLock(Share), "share", key
}

guard! {
    /// The write side of a read-write lock, held on a quorum of nodes, valid until
    /// [`validity()`](WriteLock::validity) reaches zero: no reader and no other writer holds
    /// the resource meanwhile.
    ///
    /// Call [`release()`](WriteLock::release) when done; dropped without it, it is released
    /// in the background.
    WriteLock(Share), "write grant", key
}

impl WriteLock {
    /// The fencing token of a write lock taken with
    /// [`.fenced()`](crate::WriteRequest::fenced): larger than that of any earlier fenced
    /// grant of the resource, the same for the whole hold (extensions keep it); `None` when
    /// it was not requested. (Readers take none: they share the resource, so one order
    /// over them would fence out the other readers.)
    pub fn fencing_token(&self) -> Option<u64> {
        self.claim.fence()
    }
}

impl ReadLock {
    /// The hash field of this share (`r:<token>`), whose value is its expiry in the node's
    /// milliseconds.
    pub fn field(&self) -> &str {
        self.claim.proto().field()
    }
}

impl WriteLock {
    /// The hash field of this grant (`w:<token>`), whose value is its expiry in the node's
    /// milliseconds.
    pub fn field(&self) -> &str {
        self.claim.proto().field()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::engine::protocol::testing::reply;

    #[test]
    fn only_a_release_withdraws_the_writers_intent() {
        let config_retry = Retry::default();
        let config = Config {
            ttl: crate::config::Ttl::new(Duration::from_secs(10), 0.01).unwrap(),
            node_timeout: Duration::from_millis(50),
            connect_timeout: Duration::from_secs(1),
            drift_factor: 0.01,
            retry: config_retry,
            key_prefix: String::new(),
            restart_quarantine: Duration::ZERO,
            owner_label: None,
        };
        let intent = Intent::new(&config, &config_retry, 3);
        assert_eq!(intent.ms, 600, "2 x (100 + 100) ms + 4 x 50 ms");
        let writer = Share::new("doc".into(), Mode::Write, Some(intent.clone()), None);
        let ttl = config.ttl;
        let has_intent = |op| {
            format!("{:?}", writer.command(op, &Args::lease(ttl)).first()).contains(&*intent.field)
        };
        assert!(has_intent(Op::Acquire));
        assert!(has_intent(Op::Release));
        assert!(!has_intent(Op::CleanUp));
        assert_eq!(
            writer.answer(Op::Acquire, &reply(Value::Int(-2))).outcome,
            NodeOutcome::WriterWaiting
        );
    }

    #[test]
    fn a_writers_intent_lasts_from_one_attempt_to_the_next() {
        let mut config = crate::config::config("");
        let eager = Retry::new().with_delay(Duration::ZERO).with_jitter(Duration::ZERO);
        config.node_timeout = Duration::from_millis(5);
        let intent = Intent::new(&config, &eager, 3);
        assert_eq!(intent.ms, 50, "never shorter than MIN_INTENT");
        let slow = Retry::new().with_delay(Duration::from_secs(1)).with_jitter(Duration::ZERO);
        assert_eq!(Intent::new(&config, &slow, 3).ms, 2_020, "2 x 1 s + 4 x 5 ms");
    }
}
