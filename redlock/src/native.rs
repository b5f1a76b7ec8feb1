//! The server's own commands that do what one of our scripts does, for a fraction of the
//! server's time: tried first on each connection, and given up on that connection for
//! good at the first sign its server lacks one (an unknown command, a syntax error, a
//! command the ACL user may not run: each of those ran nothing, so the script is sent at
//! once on the same connection, in order). Per connection, not per node: a failover swaps
//! the server behind an address, and a new server means a new connection.
//!
//! Each native form answers what its script would, so the kinds read one reply shape:
//! - `SET key token NX PX ms GET` (Redis 7.0, Valkey) answers as the acquisition script
//!   does (nil when set, the holder's token otherwise);
//! - `DELIFEQ key token` (Valkey 9.0), with the release's `PUBLISH` in the same message,
//!   answers 1 (deleted), 2 (deleted, the notification refused) or 0: absent *or held by
//!   another owner*, which it cannot tell apart (the release script says -1 for the
//!   latter; both count as not released);
//!
//! - `SET key token IFEQ token PX ms GET` (Valkey 8.1) answers as the extension script
//!   does (1 renewed, 0 absent, -1 another owner's), but only where the node refused this
//!   user scripts: it sets the lease outright, even shorter, and one still in flight may land
//!   after a later extension and cut it, so the client counts what it may cut (see
//!   [`crate::route`]); the script only ever lengthens, and needs none of that.

use std::sync::atomic::{AtomicU8, Ordering};

use redis::{Cmd, Pipeline, Value};

use crate::channel::ReleaseChannel;
use crate::config::Ttl;
use crate::failure::Failure;
use crate::server::{Server, Version};

/// One native command a server may offer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Feature {
    /// `SET ... NX PX ... GET`.
    SetNxGet,
    /// `DELIFEQ`.
    DelIfEq,
    /// `SET ... IFEQ ... PX ... GET`.
    SetIfEq,
}

impl Feature {
    const ALL: [Feature; 3] = [Feature::SetNxGet, Feature::DelIfEq, Feature::SetIfEq];

    /// The two bits of [`Offers`] that say what is known of it.
    fn shift(self) -> u8 {
        match self {
            Feature::SetNxGet => 0,
            Feature::DelIfEq => 2,
            Feature::SetIfEq => 4,
        }
    }

    /// Whether a server that reports itself as `server` may have it (`false` only where
    /// its version says it cannot: anything unknown is tried).
    fn may_be_in(self, server: &Server) -> bool {
        let at_least = |version: Option<Version>, major, minor| {
            version.is_none_or(|version| version >= Version::new(major, minor))
        };
        let valkey = server.name == "valkey";
        match self {
            Feature::SetNxGet => valkey || at_least(server.redis_version, 7, 0),
            Feature::DelIfEq => valkey && at_least(server.version, 9, 0),
            // Redis 8.4 has it too, not tried here: no such server was at hand to test it.
            Feature::SetIfEq => valkey && at_least(server.version, 8, 1),
        }
    }
}

/// What one connection's server was found to offer: per feature, not known yet, offered,
/// or not offered.
#[derive(Debug, Default)]
pub(crate) struct Offers(AtomicU8);

const OFFERED: u8 = 0b01;
const LACKING: u8 = 0b10;

impl Offers {
    /// For a server that reports itself as `server` in its `INFO`: what its version rules
    /// out is not tried.
    /// What its version allows counts as offered: a refusal (the ACL) still makes it lacking
    /// at its first use, but a release goes with its notification in one message from the
    /// start (one round trip, where a first try alone would cost two).
    pub(crate) fn for_server(server: &Server) -> Self {
        let bits = Feature::ALL.iter().fold(0, |bits, feature| {
            let known = if feature.may_be_in(server) { OFFERED } else { LACKING };
            bits | known << feature.shift()
        });
        Self(AtomicU8::new(bits))
    }

    fn bits(&self, feature: Feature) -> u8 {
        (self.0.load(Ordering::Relaxed) >> feature.shift()) & 0b11
    }

    /// Whether it is worth trying: not found lacking.
    pub(crate) fn may(&self, feature: Feature) -> bool {
        self.bits(feature) & LACKING == 0
    }

    /// Whether the server ran it already.
    pub(crate) fn known(&self, feature: Feature) -> bool {
        self.bits(feature) & OFFERED != 0
    }

    /// Records what a try found (lacking overrides offered: see [`Offers::may`]).
    pub(crate) fn note(&self, feature: Feature, offered: bool) {
        let bit = if offered { OFFERED } else { LACKING };
        self.0.fetch_or(bit << feature.shift(), Ordering::Relaxed);
    }
}

/// Whether `failure`, a native command's, says that the server ran nothing because it
/// lacks the command or this form of it (or the user may not run it): the script then
/// does the same work.
pub(crate) fn lacks(failure: &Failure) -> bool {
    match failure {
        Failure::Server { message, .. } => {
            let detail = message.split_once(' ').map_or("", |(_, detail)| detail);
            let detail = detail.trim_start().to_ascii_lowercase();
            detail.starts_with("unknown command") || detail.starts_with("syntax error")
        }
        // The command refused, not a key or channel (the script would be refused those too).
        Failure::Denied(message) => {
            message.starts_with("NOPERM") && message.contains("permissions to run")
        }
        Failure::Unreachable(_) | Failure::Refused(_) | Failure::ConnectTimedOut => false,
    }
}

/// A command's native form.
#[derive(Debug)]
pub(crate) struct Native {
    feature: Feature,
    command: Cmd,
    /// The release's notification, sent in the same message once the server ran the
    /// command or its version says it has it (before, only after its reply: a server that
    /// lacks it would publish a release that has not happened yet). A user the ACL refuses
    /// the command so publishes once per connection a moment before the script removes
    /// the key.
    publish: Option<(Cmd, Pipeline)>,
    /// An extension's lease and the hold's token (what its reply is compared with).
    outright: Option<(Ttl, Box<[u8]>)>,
}

impl Native {
    /// `SET key token NX PX ms GET`.
    pub(crate) fn acquire(key: &str, token: &[u8], ms: &[u8]) -> Self {
        let mut command = redis::cmd("SET");
        command.arg(key).arg(token).arg("NX").arg("PX").arg(ms).arg("GET");
        Self { feature: Feature::SetNxGet, command, publish: None, outright: None }
    }

    /// `SET key token IFEQ token PX ms GET`: renews the lease of `token`'s key to `ttl`,
    /// outright (see the module's page).
    pub(crate) fn extend(key: &str, token: &[u8], ttl: Ttl) -> Self {
        let mut command = redis::cmd("SET");
        let ms = ttl.arg();
        command.arg(key).arg(token).arg("IFEQ").arg(token).arg("PX").arg(ms.as_bytes());
        command.arg("GET");
        let outright = Some((ttl, token.into()));
        Self { feature: Feature::SetIfEq, command, publish: None, outright }
    }

    /// `DELIFEQ key token`, and, unless `channel_of` is `None`, the release's notification
    /// on that key's channel, naming the hold as the release script does (its token's
    /// first 16 bytes).
    pub(crate) fn release(key: &str, token: &[u8], channel_of: Option<&str>) -> Self {
        let mut command = redis::cmd("DELIFEQ");
        command.arg(key).arg(token);
        let publish = channel_of.map(|channel_of| {
            let mut publish = redis::cmd("PUBLISH");
            publish.arg(ReleaseChannel(channel_of)).arg(&token[..token.len().min(16)]);
            let mut both = redis::pipe();
            both.add_command(command.clone()).add_command(publish.clone());
            (publish, both)
        });
        Self { feature: Feature::DelIfEq, command, publish, outright: None }
    }

    pub(crate) fn feature(&self) -> Feature {
        self.feature
    }

    /// The lease of an extension that sets it outright.
    pub(crate) fn outright(&self) -> Option<Ttl> {
        self.outright.as_ref().map(|(ttl, _)| *ttl)
    }

    /// The command alone.
    pub(crate) fn command(&self) -> &Cmd {
        &self.command
    }

    /// The notification alone, and the command with it in one message.
    pub(crate) fn publish(&self) -> Option<&(Cmd, Pipeline)> {
        self.publish.as_ref()
    }

    /// The reply its script would have given, from the command's and (if sent) the
    /// notification's.
    pub(crate) fn as_script(
        &self,
        reply: Value,
        published: Option<&Result<Value, Failure>>,
    ) -> Value {
        let refused = matches!(published, Some(Err(_) | Ok(Value::ServerError(_))));
        match (self.feature, reply) {
            (Feature::DelIfEq, Value::Int(1)) => Value::Int(if refused { 2 } else { 1 }),
            (Feature::DelIfEq, Value::Int(0)) => Value::Int(0),
            (Feature::SetIfEq, Value::Nil) => Value::Int(0),
            (Feature::SetIfEq, Value::BulkString(held)) => match &self.outright {
                Some((_, token)) if held == **token => Value::Int(1),
                _ => Value::Int(-1),
            },
            (_, other) => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(name: &str, version: &str, redis_version: &str) -> Server {
        let info = format!(
            "server_name:{name}\r\n{name}_version:{version}\r\nredis_version:{redis_version}\r\n"
        );
        crate::server::parse(&info)
    }

    #[test]
    fn only_what_a_servers_version_rules_out_is_not_tried() {
        let redis_62 = Offers::for_server(&server("redis", "6.2.14", "6.2.14"));
        assert!(!redis_62.may(Feature::SetNxGet));
        assert!(!redis_62.may(Feature::DelIfEq));
        let redis_70 = Offers::for_server(&server("redis", "7.0.15", "7.0.15"));
        assert!(redis_70.may(Feature::SetNxGet));
        assert!(!redis_70.may(Feature::DelIfEq));
        let redis_84 = Offers::for_server(&server("redis", "8.4.0", "8.4.0"));
        assert!(redis_84.may(Feature::SetNxGet) && !redis_84.may(Feature::DelIfEq));
        assert!(!redis_84.may(Feature::SetIfEq), "not tried where it was never tested");
        let valkey_8 = Offers::for_server(&server("valkey", "8.1.0", "7.2.4"));
        assert!(valkey_8.may(Feature::SetNxGet) && !valkey_8.may(Feature::DelIfEq));
        assert!(valkey_8.may(Feature::SetIfEq));
        let valkey_80 = Offers::for_server(&server("valkey", "8.0.2", "7.2.4"));
        assert!(!valkey_80.may(Feature::SetIfEq));
        let valkey_9 = Offers::for_server(&server("valkey", "9.1.2", "7.2.4"));
        assert!(Feature::ALL.iter().all(|&feature| valkey_9.may(feature)));
        // What the version allows goes with its notification from the start.
        assert!(valkey_9.known(Feature::DelIfEq));
        // Refused all the same (the ACL): lacking from then on.
        valkey_9.note(Feature::DelIfEq, false);
        assert!(!valkey_9.may(Feature::DelIfEq));
        // No INFO (an ACL user without it): everything is tried.
        let unknown = Offers::default();
        assert!(Feature::ALL.iter().all(|&feature| unknown.may(feature)));
    }

    #[test]
    fn a_try_is_remembered_per_feature() {
        let offers = Offers::default();
        offers.note(Feature::DelIfEq, false);
        offers.note(Feature::SetNxGet, true);
        assert!(!offers.may(Feature::DelIfEq));
        assert!(offers.may(Feature::SetNxGet) && offers.known(Feature::SetNxGet));
    }

    fn server_error(message: &str) -> Failure {
        let code = message.split(' ').next().unwrap_or_default();
        Failure::Server { code: code.into(), message: message.into() }
    }

    #[test]
    fn an_unknown_command_a_syntax_error_or_a_refusal_say_the_server_lacks_it() {
        assert!(lacks(&server_error("ERR unknown command 'DELIFEQ', with args beginning with:")));
        assert!(lacks(&server_error("ERR syntax error")));
        assert!(lacks(&Failure::Denied("NOPERM User u has no permissions to run it".into())));
        let key = "NOPERM No permissions to access a key";
        assert!(!lacks(&Failure::Denied(key.into())), "the script would be refused it too");
        assert!(!lacks(&server_error("WRONGTYPE Operation against a key")));
        assert!(!lacks(&server_error("LOADING Redis is loading the dataset in memory")));
        assert!(!lacks(&Failure::Unreachable("reset".into())));
        assert!(!lacks(&Failure::Denied("NOAUTH Authentication required.".into())));
    }

    #[test]
    fn a_native_reply_reads_as_its_scripts() {
        let release = Native::release("k", b"t", Some("k"));
        let read = |reply, published| release.as_script(reply, published);
        assert_eq!(read(Value::Int(1), Some(&Ok(Value::Int(0)))), Value::Int(1));
        let refused = Err(Failure::Denied("NOPERM channel".into()));
        assert_eq!(read(Value::Int(1), Some(&refused)), Value::Int(2));
        assert_eq!(read(Value::Int(0), Some(&Ok(Value::Int(0)))), Value::Int(0));
        assert_eq!(read(Value::Int(1), None), Value::Int(1));
        let acquire = Native::acquire("k", b"t", b"100");
        assert_eq!(acquire.as_script(Value::Nil, None), Value::Nil);
        let holder = Value::BulkString(b"other".to_vec());
        assert_eq!(acquire.as_script(holder.clone(), None), holder);
        let ttl = Ttl::new(std::time::Duration::from_secs(1), 0.01).unwrap();
        let extend = Native::extend("k", b"t", ttl);
        assert_eq!(extend.as_script(Value::BulkString(b"t".to_vec()), None), Value::Int(1));
        assert_eq!(extend.as_script(Value::Nil, None), Value::Int(0));
        assert_eq!(extend.as_script(holder, None), Value::Int(-1));
        assert_eq!(extend.outright(), Some(ttl));
    }
}
