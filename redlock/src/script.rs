//! Lua scripts, sent by hash and loaded on demand.

use redis::Cmd;

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

    fn invocation(verb: &str, body: &str, keys: &[&str], args: &[&[u8]]) -> Cmd {
        let mut cmd = redis::cmd(verb);
        cmd.arg(body).arg(keys.len()).arg(keys).arg(args);
        cmd
    }
}
