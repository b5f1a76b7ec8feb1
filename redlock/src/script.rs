//! Lua scripts: every script the library runs, sent by hash, loaded on every new
//! connection and again on demand.
//!
//! Loading on connect matters for safety, not just speed: a release queued behind a `SET`
//! on a hung node is answered only when the node wakes up; if the node then said
//! `NOSCRIPT`, the fallback `EVAL` would come from a caller that has long given up, and
//! the late `SET` would outlive the attempt.

use std::sync::{Arc, LazyLock};

use redis::Cmd;

macro_rules! scripts {
    ($($name:ident = $($file:literal),+;)*) => {
        $(pub(crate) static $name: LazyLock<Script> = LazyLock::new(|| {
            Script::new(concat!($(include_str!(concat!("scripts/", $file))),+))
        });)*

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
    RW_READ_ACQUIRE = "rw_common.lua", "rw_read_acquire.lua";
    RW_WRITE_ACQUIRE = "rw_common.lua", "rw_write_acquire.lua";
    RW_RELEASE = "rw_common.lua", "rw_release.lua";
    RW_EXTEND = "rw_common.lua", "rw_extend.lua";
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

    /// One invocation, prepared once and shared by every node of a round.
    pub(crate) fn call(&'static self, keys: &[&str], args: &[&[u8]]) -> Arc<Call> {
        Arc::new(Call {
            script: self,
            evalsha: self.evalsha(keys, args),
            keys: keys.iter().map(|key| (*key).to_owned()).collect(),
            args: args.iter().map(|arg| arg.to_vec()).collect(),
        })
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

/// A script invocation prepared once per round: the `EVALSHA` command every node gets, and
/// what it takes to fall back to `EVAL` on a node that does not know the script.
#[derive(Debug)]
pub(crate) struct Call {
    script: &'static Script,
    evalsha: Cmd,
    keys: Vec<String>,
    args: Vec<Vec<u8>>,
}

impl Call {
    pub(crate) fn evalsha(&self) -> &Cmd {
        &self.evalsha
    }

    /// The `EVAL` fallback, built only when a node answers `NOSCRIPT`.
    pub(crate) fn eval(&self) -> Cmd {
        let keys: Vec<&str> = self.keys.iter().map(String::as_str).collect();
        let args: Vec<&[u8]> = self.args.iter().map(Vec::as_slice).collect();
        self.script.eval(&keys, &args)
    }
}
