//! Lua scripts: every script the library runs, sent by hash, loaded on every new
//! connection and again on demand.
//!
//! Loading on connect matters for safety, not just speed: a release queued behind a `SET`
//! on a hung node is answered only when the node wakes up; if the node then said
//! `NOSCRIPT`, the fallback `EVAL` would come from a caller that has long given up, and
//! the late `SET` would outlive the attempt.

use std::sync::LazyLock;

use redis::Cmd;

macro_rules! scripts {
    ($($name:ident = $file:literal;)*) => {
        $(pub(crate) static $name: LazyLock<Script> =
            LazyLock::new(|| Script::new(include_str!(concat!("scripts/", $file))));)*

        /// Every script, to load on each new connection.
        pub(crate) fn all() -> impl Iterator<Item = &'static Script> {
            [$(&*$name),*].into_iter()
        }
    };
}

scripts! {
    RELEASE = "release.lua";
    EXTEND = "extend.lua";
    ACQUIRE_FENCED = "acquire_fenced.lua";
    RAISE_FENCE = "raise_fence.lua";
    REENTRANT_ACQUIRE = "reentrant_acquire.lua";
    REENTRANT_RELEASE = "reentrant_release.lua";
    REENTRANT_EXTEND = "reentrant_extend.lua";
    MULTI_ACQUIRE = "multi_acquire.lua";
    MULTI_RELEASE = "multi_release.lua";
    MULTI_EXTEND = "multi_extend.lua";
}

/// A Lua script with its SHA1 computed once.
#[derive(Debug)]
pub(crate) struct Script {
    source: &'static str,
    sha: String,
}

impl Script {
    pub(crate) fn new(source: &'static str) -> Self {
        Self { source, sha: redis::Script::new(source).get_hash().to_owned() }
    }

    /// `EVALSHA sha numkeys keys.. args..`
    pub(crate) fn evalsha(&self, keys: &[&str], args: &[&[u8]]) -> Cmd {
        Self::invocation("EVALSHA", &self.sha, keys, args)
    }

    /// `EVAL source numkeys keys.. args..`: runs the script and caches it on the node.
    pub(crate) fn eval(&self, keys: &[&str], args: &[&[u8]]) -> Cmd {
        Self::invocation("EVAL", self.source, keys, args)
    }

    /// `SCRIPT LOAD source`.
    pub(crate) fn load(&self) -> Cmd {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(self.source);
        cmd
    }

    fn invocation(verb: &str, body: &str, keys: &[&str], args: &[&[u8]]) -> Cmd {
        let mut cmd = redis::cmd(verb);
        cmd.arg(body).arg(keys.len()).arg(keys).arg(args);
        cmd
    }
}
