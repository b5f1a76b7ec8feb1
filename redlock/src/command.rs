//! What is sent to a node: a command prepared once per round and shared by every node, and
//! the Lua scripts the library runs (sent by hash, loaded on every new connection, and
//! again on demand).
//!
//! Loading scripts on connect matters for safety, not just speed: a release queued behind
//! a `SET` on a hung node is answered only when the node wakes up; if the node then said
//! `NOSCRIPT`, the fallback `EVAL` would come from a caller that has long given up, and
//! the late `SET` would outlive the attempt.

use std::sync::LazyLock;

use redis::Cmd;

macro_rules! scripts {
    ($($name:ident = $($file:literal),+;)*) => {
        $(pub(crate) static $name: LazyLock<Script> = LazyLock::new(|| {
            Script::new(concat!($(include_str!(concat!("lua/", $file))),+))
        });)*

        /// Every script, to load on each new connection.
        pub(crate) fn all_scripts() -> impl Iterator<Item = &'static Script> {
            [$(&*$name),*].into_iter()
        }
    };
}

scripts! {
    RELEASE = "release.lua";
    EXTEND = "extend.lua";
    FENCE_RAISE = "fence_raise.lua";
    MULTI_ACQUIRE = "multi_acquire.lua";
    MULTI_RELEASE = "multi_release.lua";
    MULTI_EXTEND = "multi_extend.lua";
    MULTI_CHECK = "multi_check.lua";
    REENTRANT_ACQUIRE = "reentrant_fields.lua", "hash_common.lua", "reentrant_acquire.lua";
    REENTRANT_RELEASE = "reentrant_fields.lua", "hash_common.lua", "hash_release.lua";
    REENTRANT_EXTEND = "reentrant_fields.lua", "hash_common.lua", "hash_extend.lua";
    REENTRANT_CHECK = "reentrant_fields.lua", "hash_common.lua", "hash_check.lua";
    RW_READ_ACQUIRE = "rw_fields.lua", "hash_common.lua", "rw_read_acquire.lua";
    RW_WRITE_ACQUIRE = "rw_fields.lua", "hash_common.lua", "rw_write_acquire.lua";
    RW_RELEASE = "rw_fields.lua", "hash_common.lua", "hash_release.lua";
    RW_EXTEND = "rw_fields.lua", "hash_common.lua", "hash_extend.lua";
    RW_CHECK = "rw_fields.lua", "hash_common.lua", "hash_check.lua";
    INSPECT = "inspect.lua";
    FORCE_RELEASE = "force_release.lua";
}

/// Whether a command may be sent a second time when the connection it went out on dropped
/// before the reply arrived (it may or may not have run).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Resend {
    /// Running it twice has the effect of running it once (every lock operation of this
    /// library is built that way: compare-and-set by a token unique to the hold).
    Safe,
    /// Never re-sent: the node reports the dropped connection instead.
    Never,
}

/// One command for one round, built once and sent to every node.
#[derive(Debug)]
pub(crate) struct Command {
    kind: Kind,
    resend: Resend,
}

#[derive(Debug)]
enum Kind {
    Plain(Cmd),
    Script { script: &'static Script, evalsha: Cmd, keys: Vec<String>, args: Vec<Vec<u8>> },
}

impl Command {
    /// A plain command.
    pub(crate) fn plain(cmd: Cmd, resend: Resend) -> Self {
        Self { kind: Kind::Plain(cmd), resend }
    }

    /// An invocation of `script`, by hash, with the `EVAL` fallback for a node that does not
    /// know it.
    pub(crate) fn script<K, A>(
        script: &'static Script,
        keys: &[K],
        args: &[A],
        resend: Resend,
    ) -> Self
    where
        K: AsRef<str>,
        A: AsRef<[u8]>,
    {
        let keys: Vec<String> = keys.iter().map(|key| key.as_ref().to_owned()).collect();
        let args: Vec<Vec<u8>> = args.iter().map(|arg| arg.as_ref().to_vec()).collect();
        let evalsha = script.invocation("EVALSHA", &script.sha, &keys, &args);
        Self { kind: Kind::Script { script, evalsha, keys, args }, resend }
    }

    /// What is sent first.
    pub(crate) fn first(&self) -> &Cmd {
        match &self.kind {
            Kind::Plain(cmd) | Kind::Script { evalsha: cmd, .. } => cmd,
        }
    }

    /// The `EVAL` fallback of a script, built only when a node answers `NOSCRIPT`.
    pub(crate) fn fallback(&self) -> Option<Cmd> {
        match &self.kind {
            Kind::Plain(_) => None,
            Kind::Script { script, keys, args, .. } => {
                Some(script.invocation("EVAL", script.source, keys, args))
            }
        }
    }

    pub(crate) fn resend(&self) -> Resend {
        self.resend
    }
}

/// A Lua script with its SHA1 computed once.
#[derive(Debug)]
pub(crate) struct Script {
    source: &'static str,
    sha: String,
}

impl Script {
    fn new(source: &'static str) -> Self {
        Self { source, sha: redis::Script::new(source).get_hash().to_owned() }
    }

    /// `SCRIPT LOAD source`.
    pub(crate) fn load(&self) -> Cmd {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(self.source);
        cmd
    }

    fn invocation(&self, verb: &str, body: &str, keys: &[String], args: &[Vec<u8>]) -> Cmd {
        let mut cmd = redis::cmd(verb);
        cmd.arg(body).arg(keys.len()).arg(keys).arg(args);
        cmd
    }
}
