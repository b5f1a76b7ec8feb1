//! What is sent to a node: a command prepared once per round and shared by every node, and
//! the Lua scripts the library runs (sent by hash, loaded on every new connection, and
//! again on demand).
//!
//! Scripts are loaded on connect so that the first request of each kind on a connection
//! costs one round trip, not two (`NOSCRIPT`, then `EVAL`).

use std::sync::LazyLock;

use redis::Cmd;

use crate::channel::ReleaseChannel;
use crate::native::Native;

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
    PLAIN_ACQUIRE = "plain_acquire.lua";
    RELEASE = "notify.lua", "release.lua";
    EXTEND = "lengthen.lua", "extend.lua";
    FENCE_RAISE = "fence_raise.lua";
    MULTI_ACQUIRE = "multi_acquire.lua";
    MULTI_RELEASE = "notify.lua", "multi_release.lua";
    MULTI_EXTEND = "lengthen.lua", "multi_extend.lua";
    MULTI_CHECK = "multi_check.lua";
    PERMIT_ACQUIRE = "lengthen.lua", "permit_acquire.lua";
    PERMIT_EXTEND = "lengthen.lua", "permit_extend.lua";
    REENTRANT_ACQUIRE = "reentrant_fields.lua", "hash_common.lua", "reentrant_acquire.lua";
    REENTRANT_RELEASE =
        "reentrant_fields.lua", "hash_common.lua", "notify.lua", "hash_release.lua";
    REENTRANT_EXTEND = "reentrant_fields.lua", "hash_common.lua", "hash_extend.lua";
    REENTRANT_CHECK = "reentrant_fields.lua", "hash_common.lua", "hash_check.lua";
    RW_READ_ACQUIRE = "rw_fields.lua", "hash_common.lua", "rw_read_acquire.lua";
    RW_WRITE_ACQUIRE = "rw_fields.lua", "hash_common.lua", "rw_write_acquire.lua";
    RW_RELEASE = "rw_fields.lua", "hash_common.lua", "notify.lua", "hash_release.lua";
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
    /// It creates or renews a hold: not sent past its time to go out, nor once an undo of
    /// its hold was issued (see `engine::call`).
    creates: bool,
    /// The server's own command that does the same, where the connection's server has it.
    native: Option<Native>,
}

#[derive(Debug)]
enum Kind {
    Plain(Cmd),
    Script { script: &'static Script, evalsha: Cmd },
}

impl Command {
    /// A plain command.
    pub(crate) fn plain(cmd: Cmd, resend: Resend) -> Self {
        Self { kind: Kind::Plain(cmd), resend, creates: false, native: None }
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
        A: ScriptArg,
    {
        let size = keys.iter().map(|key| key.as_ref().len()).sum::<usize>()
            + args.iter().map(ScriptArg::size).sum::<usize>()
            + script.sha.len()
            + 16;
        let mut evalsha = Cmd::with_capacity(3 + keys.len() + args.len(), size);
        evalsha.arg("EVALSHA").arg(&script.sha).arg(keys.len());
        for key in keys {
            evalsha.arg(key.as_ref());
        }
        for arg in args {
            arg.write_to(&mut evalsha);
        }
        Self { kind: Kind::Script { script, evalsha }, resend, creates: false, native: None }
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
            Kind::Script { script, evalsha } => {
                // The same keys and arguments, after the script's hash.
                let mut eval = redis::cmd("EVAL");
                eval.arg(script.source);
                for bytes in simple_args(evalsha).skip(2) {
                    eval.arg(bytes);
                }
                Some(eval)
            }
        }
    }

    pub(crate) fn resend(&self) -> Resend {
        self.resend
    }

    /// Marks a command that creates or renews a hold.
    pub(crate) fn creating(mut self) -> Self {
        self.creates = true;
        self
    }

    /// Sent as `native` where the connection's server runs it (see [`crate::native`]).
    pub(crate) fn or_native(mut self, native: Native) -> Self {
        self.native = Some(native);
        self
    }

    pub(crate) fn native(&self) -> Option<&Native> {
        self.native.as_ref()
    }

    /// Whether it creates or renews a hold (see [`Command::creating`]).
    pub(crate) fn creates(&self) -> bool {
        self.creates
    }
}

/// The arguments of `cmd` (the library's commands have no cursor argument).
fn simple_args(cmd: &Cmd) -> impl Iterator<Item = &[u8]> {
    cmd.args_iter().filter_map(|arg| match arg {
        redis::Arg::Simple(bytes) => Some(bytes),
        _ => None,
    })
}

/// One argument of a script, written straight into the command.
pub(crate) trait ScriptArg {
    /// Its length in bytes.
    fn size(&self) -> usize;
    fn write_to(&self, cmd: &mut Cmd);
}

impl ScriptArg for &[u8] {
    fn size(&self) -> usize {
        self.len()
    }

    fn write_to(&self, cmd: &mut Cmd) {
        cmd.arg(*self);
    }
}

/// A script argument that is either bytes or a key's release channel: the channel's name
/// is written into the command, never kept as a string of its own.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Arg<'a> {
    Bytes(&'a [u8]),
    /// The channel releases of this key are published on.
    ReleaseChannel(&'a str),
}

impl ScriptArg for Arg<'_> {
    fn size(&self) -> usize {
        match self {
            Self::Bytes(bytes) => bytes.len(),
            Self::ReleaseChannel(key) => ReleaseChannel(key).size(),
        }
    }

    fn write_to(&self, cmd: &mut Cmd) {
        match self {
            Self::Bytes(bytes) => bytes.write_to(cmd),
            Self::ReleaseChannel(key) => {
                cmd.arg(ReleaseChannel(key));
            }
        }
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
}

/// A command refused inside one of our scripts, said the way a refused command outside a
/// script is: `NOPERM` and the command's name. Redis 7.0 says only "The user executing the
/// script can't run this command or subcommand script: <sha>, on @user_script:<line>." (no
/// `NOPERM`, no command), which reads like a bug of ours rather than a missing ACL rule; the
/// script's hash and line find the command in our own source. `None` for any other message.
pub(crate) fn explain_refusal(message: &str) -> Option<String> {
    const REFUSED: &str = "can't run this command or subcommand";
    // Valkey names the command itself, still without the NOPERM code.
    const NAMED: &str = "has no permissions to run the '";
    if message.contains("NOPERM") {
        return None;
    }
    if let Some((_, rest)) = message.split_once(NAMED)
        && let Some((command, _)) = rest.split_once('\'')
    {
        let command = command.to_ascii_lowercase();
        return Some(format!(
            "NOPERM this user has no permissions to run the '{command}' command in a redlock \
             script (allow `+{command}`): {message}"
        ));
    }
    if !message.contains(REFUSED) {
        return None;
    }
    let named = (|| {
        // 7.0: "... script: <sha>, on @user_script:<line>."; 6.2: "Error running script
        // (call to f_<sha>): @user_script:<line>: @user_script: <line>: The user ...".
        let (sha, rest) = match message.split_once("(call to f_") {
            Some((_, rest)) => rest.split_once(')')?,
            None => message.split_once("script: ")?.1.split_once(',')?,
        };
        let (_, line) = rest.split_once("@user_script:")?;
        let line: usize = line.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()?;
        let script = all_scripts().find(|script| script.sha == sha.trim())?;
        let commands = called_on(script.source.lines().nth(line.checked_sub(1)?)?);
        (!commands.is_empty()).then_some(commands)
    })();
    Some(match named {
        Some(commands) => {
            let names: Vec<String> = commands.iter().map(|c| format!("'{c}'")).collect();
            let rules: Vec<String> = commands.iter().map(|c| format!("`+{c}`")).collect();
            format!(
                "NOPERM this user has no permissions to run the {} command in a redlock script \
                 (allow {}): {message}",
                names.join(" or "),
                rules.join(" ")
            )
        }
        None => format!("NOPERM a command in a redlock script was refused: {message}"),
    })
}

/// A refusal of a scripting command itself (`EVALSHA`, `EVAL`, `SCRIPT LOAD`), said with what
/// runs scripts and the rules to add: a user without scripting (`-@scripting`) reaches no
/// quorum for any request that needs one, and "too few nodes" alone would send an operator
/// to the network. `None` for any other message.
pub(crate) fn explain_scripting_refusal(message: &str) -> Option<String> {
    let refused = ["'evalsha'", "'eval'", "'script|load'", "'script'"];
    let lower = message.to_ascii_lowercase();
    if !lower.starts_with("noperm") || !refused.iter().any(|command| lower.contains(command)) {
        return None;
    }
    Some(format!(
        "{message} (this request runs a Lua script: allow `+evalsha +eval +script|load`, as the \
         README's `locking` ACL line does; without scripting, only the plain lock works, on a \
         server with native compare-and-delete and compare-and-set such as Valkey 9)"
    ))
}

/// The commands a line of Lua calls, lower case: `redis.call('DEL', ...)` is `del`.
fn called_on(line: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for rest in line.split("call('").skip(1) {
        let Some((name, _)) = rest.split_once('\'') else { continue };
        let name = name.to_ascii_lowercase();
        if !name.is_empty() && name.chars().all(|c| c.is_ascii_alphabetic()) && !out.contains(&name)
        {
            out.push(name);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(cmd: &Cmd) -> Vec<Vec<u8>> {
        (cmd.args_iter())
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => bytes.to_vec(),
                _ => b"<cursor>".to_vec(),
            })
            .collect()
    }

    #[test]
    fn the_eval_fallback_carries_the_same_keys_and_arguments_as_the_evalsha() {
        let command =
            Command::script(&RELEASE, &["key"], &[&b"token"[..], b"channel"], Resend::Safe);
        let first = args(command.first());
        let expected: Vec<Vec<u8>> =
            [&b"EVALSHA"[..], RELEASE.sha.as_bytes(), b"1", b"key", b"token", b"channel"]
                .map(<[u8]>::to_vec)
                .into();
        assert_eq!(first, expected);
        let fallback = args(&command.fallback().unwrap());
        assert_eq!(fallback[0], b"EVAL");
        assert_eq!(fallback[1], RELEASE.source.as_bytes());
        assert_eq!(fallback[2..], first[2..]);
    }

    #[test]
    fn a_release_channel_is_written_as_the_name_waiters_subscribe_to() {
        let args_in = [Arg::Bytes(b"token"), Arg::ReleaseChannel("app:job")];
        let command = Command::script(&RELEASE, &["app:job"], &args_in, Resend::Safe);
        let written = args(command.first());
        assert_eq!(written[4], b"token");
        assert_eq!(written[5], crate::channel::channel("app:job").as_bytes());
        assert_eq!(written[5], b"redlock:released:app:job");
        assert_eq!(args_in[1].size(), written[5].len());
        let fallback = args(&command.fallback().unwrap());
        assert_eq!(fallback[2..], written[2..]);
    }

    #[test]
    fn a_command_refused_in_a_script_by_valkey_is_named_with_noperm() {
        let said = "ERR ACL failure in script: User u has no permissions to run the 'hset' \
                    command script: on @user_script:74.";
        let explained = explain_refusal(said).unwrap();
        assert!(explained.starts_with("NOPERM"), "{explained}");
        assert!(explained.contains("'hset' command") && explained.contains("`+hset`"));
        assert_eq!(explain_refusal("NOPERM already says it"), None);
    }

    #[test]
    fn a_refused_scripting_command_names_the_rules_to_add() {
        let evalsha = "NOPERM User u has no permissions to run the 'evalsha' command";
        let explained = explain_scripting_refusal(evalsha).unwrap();
        assert!(explained.starts_with(evalsha), "{explained}");
        assert!(explained.contains("`+evalsha +eval +script|load`"), "{explained}");
        let set = "NOPERM User u has no permissions to run the 'set' command";
        assert_eq!(explain_scripting_refusal(set), None);
    }

    #[test]
    fn a_command_refused_in_a_script_is_named_with_noperm() {
        // Line 5 of the inspect script calls TYPE.
        let said = format!(
            "ERR The user executing the script can't run this command or subcommand script: \
             {}, on @user_script:5.",
            INSPECT.sha
        );
        let explained = explain_refusal(&said).unwrap();
        assert!(explained.starts_with("NOPERM"), "{explained}");
        assert!(
            explained.contains("'type' command") && explained.contains("`+type`"),
            "{explained}"
        );
        // A script we do not know, or a line without a call: still NOPERM, without a name.
        let unknown = explain_refusal(
            "ERR The user executing the script can't run this command or subcommand script: \
             abc, on @user_script:3.",
        )
        .unwrap();
        assert!(unknown.starts_with("NOPERM"), "{unknown}");
        // Anything else is left as it is.
        assert_eq!(
            explain_refusal("NOPERM this user has no permissions to run the 'set' command"),
            None
        );
        assert_eq!(explain_refusal("ERR unknown command"), None);
    }

    #[test]
    fn every_line_of_every_script_names_what_it_calls() {
        assert_eq!(called_on("local d = redis.call('DEL', KEYS[1])"), ["del"]);
        assert_eq!(called_on("redis.pcall('PUBLISH', ARGV[1], '1')"), ["publish"]);
        assert_eq!(called_on("local kind = redis.call('TYPE', KEYS[1])['ok']"), ["type"]);
        assert!(called_on("return 0").is_empty());
    }
}
