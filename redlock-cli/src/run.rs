//! `redlock run`: take the lock, run the command while keeping the lock alive, release.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::{Duration, SystemTime};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use redlock::{ErrorKind, Retry};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;

use crate::config::{Options, Wait, parse_signal, parse_wait};
use crate::done::{self, Marks, Seen};
use crate::held;
use crate::once::Window;
use crate::{EXIT_CONFLICT, EXIT_FAILURE, EXIT_LOST, EXIT_NOT_EXECUTABLE, EXIT_NOT_FOUND};

/// The help text after the options: exit codes and the grace period.
pub(crate) const AFTER_HELP: &str = "\
The command gets REDLOCK_RESOURCE, REDLOCK_TOKEN and, with --fenced, REDLOCK_FENCING_TOKEN in
its environment; with --permits N also REDLOCK_PERMIT_SLOT (0..N-1), and the conflict status
when all N permits are held. SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 sent to redlock are
forwarded to the command's process group.

If the lock cannot be kept while the command runs (a majority of nodes unreachable, --max-hold
reached), redlock sends --lost-signal to the command's process group while enough of the
lock's validity is left for SIGKILL to follow --kill-after later (a third of the lease if that
is shorter) and still land before the validity ends, so the command is dead before another
machine can get the lock. If the lock is found gone (freed by `redlock release --force`, a
node set that lost it), the signal goes at once and SIGKILL --kill-after later: another holder
may then run meanwhile. Work that must never overlap, pauses of this machine included,
should check a fencing token (--fenced, REDLOCK_FENCING_TOKEN) where it writes.

With --once-per D the command runs once per window of length D: windows are fixed spans of
UTC time aligned to the Unix epoch (1d: UTC days; 1h: hours; 5m: :00, :05, ...), each
beginning 2 s (or a tenth of D, if shorter) before its boundary, and a run belongs to the
window in which it starts. When the command succeeds the lock is not released but kept until
the window ends, so a late start or a retry in that window exits with the conflict code;
the successful run also marks the window done on every node (a key under the lock's key,
<prefix><RESOURCE>:redlock-done:<window end in ms>, set with SET and expiring at the
window's end), and a waiting run (--wait 30s, --wait forever) that reads the mark on a
quorum of nodes exits with the conflict code at once (it reads the mark as it starts, then
about every half second while it waits) instead of waiting out the kept lock. A run still in
progress is waited for: if its command fails, the lock is released at once, so a waiting run
(or another machine) gets it and runs the command. A run stops trying the lead before its
window ends (--wait never waits past that), and one granted after that, or granted in a
window marked done, gives the lock back without running the command, as the window's kept
lock may just have expired by a clock ahead of its own. Schedule the job inside its window (e.g.
`0 2 * * *` with --once-per 1d), with clocks synchronised to within the lead, and make it
shorter than the window.

A refusal that was a split vote (nobody holds the lock; synchronised starters divided the
nodes) is retried a few times within a second, even with --wait 0.

Exit status: the command's own (128+N if it died of signal N); 75 when the lock is held
elsewhere (--conflict-exit-code, e.g. 0 for cron fan-out); 124 when the lock was lost or
could not be kept; 125
for redlock's own failure (configuration, nodes unavailable, TLS, ACL); 126 when the command
cannot be executed; 127 when it is not found; 128+N when redlock got signal N while waiting.";

/// The signals forwarded to the command.
const FORWARDED: [Signal; 6] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
];

/// How long redlock waits for releases still in flight before it exits.
const SHUTDOWN: Duration = Duration::from_secs(5);

#[derive(Debug, clap::Args)]
pub(crate) struct RunArgs {
    /// How long to wait for the lock: 0 (one attempt), a duration (30s), or forever.
    #[arg(long, env = "REDLOCK_WAIT", default_value = "0", value_parser = parse_wait)]
    wait: Wait,
    /// Give the lock up after this long even if the command still runs (it is then lost).
    #[arg(long, value_parser = humantime::parse_duration)]
    max_hold: Option<Duration>,
    /// Take a fencing token and pass it as REDLOCK_FENCING_TOKEN.
    #[arg(long)]
    fenced: bool,
    /// The signal sent to the command's process group when the lock is lost.
    #[arg(long, default_value = "TERM", value_parser = parse_signal)]
    lost_signal: Signal,
    /// How long after --lost-signal the process group gets SIGKILL (a third of the lease at
    /// most, when the lock could not be kept: the kill lands before its validity ends).
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    kill_after: Duration,
    /// Take one of N permits of RESOURCE (a counting lock: at most N commands at once, each
    /// on its own slot, passed as REDLOCK_PERMIT_SLOT) instead of the lock. Every run of one
    /// resource must use the same N.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    permits: Option<u32>,
    /// Run the command once per window of this length (e.g. 1d, 1h): on success keep the
    /// lock until the window ends instead of releasing it (see below).
    #[arg(long, value_parser = crate::once::parse_period)]
    once_per: Option<Duration>,
    /// The exit status when the lock is held elsewhere.
    #[arg(long, default_value_t = EXIT_CONFLICT)]
    conflict_exit_code: u8,
    /// The resource to lock.
    resource: String,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// What ended the wait for the command.
enum Event {
    Exited(std::io::Result<ExitStatus>),
    Signal(Signal),
    Lost(redlock::Error),
    /// Little enough of the validity is left that the command must be stopped now.
    Expiring,
}

pub(crate) async fn run(options: &Options, args: RunArgs) -> u8 {
    let rl = match options.client() {
        Ok(rl) => rl,
        Err(err) => {
            eprintln!("redlock: {err}");
            return EXIT_FAILURE;
        }
    };
    // Every node at once, before the first attempt: a cold start's connects (TCP, TLS,
    // AUTH, the server check) are bounded by the connect timeout, not by the attempt's
    // node timeout. What failed here, the attempt reports. Before the signal handlers: a
    // signal meanwhile ends redlock at once, and nothing is held yet.
    let _ = rl.connect().await;
    let mut signals = match forwarded_signals() {
        Ok(signals) => signals,
        Err(err) => {
            eprintln!("redlock: cannot watch signals: {err}");
            return EXIT_FAILURE;
        }
    };

    let window = args.once_per.map(|period| Window::of(period, SystemTime::now()));
    // A run never waits past its window: the lock it waits for is kept until then.
    let wait = match (args.wait, window) {
        (Wait::Once, _) | (_, None) => args.wait,
        (Wait::For(max_wait), Some(window)) => {
            Wait::For(max_wait.min(window.open_for(SystemTime::now())))
        }
        (Wait::Forever, Some(window)) => Wait::For(window.open_for(SystemTime::now())),
    };
    let retry = match wait {
        Wait::Once => None,
        Wait::For(max_wait) => Some(waiting().with_max_wait(max_wait)),
        Wait::Forever => Some(waiting().with_max_wait(Duration::MAX)),
    };
    let (permits, fenced) = (args.permits, args.fenced);
    let request = || held::acquire(&rl, &args.resource, permits, options.ttl, fenced, retry);
    let mut marks = window.map(|window| Marks::new(options, &args.resource, window));
    // A waiting run watches for the window's job to be marked done: the lock a successful
    // run keeps looks to its attempts like a run in progress, and would be waited out.
    let watched = marks.as_mut().filter(|_| retry.is_some());
    let acquired = tokio::select! {
        acquired = retrying_split_votes(request) => acquired,
        Some(sig) = signals.recv() => {
            // The attempt in flight is dropped: whatever it set is released in the
            // background, and shutdown waits for that.
            shut_down(&rl).await;
            return 128 + sig as u8;
        }
        seen = until_done(watched, rl.quorum()) => {
            // As for a signal, the attempt in flight is dropped and cleaned up.
            eprintln!("redlock: {}: {}", args.resource, done_already(seen, rl.quorum()));
            shut_down(&rl).await;
            return args.conflict_exit_code;
        }
    };
    let lock = match acquired {
        Ok(lock) => lock,
        Err(err) if err.kind() == ErrorKind::NotAcquired => {
            // A split vote or a waiting writer is not a holder: a conflict code of 0 must
            // not hide a run on which nobody held the lock.
            let why = if err.is_split_vote() {
                "was not acquired by anyone (a split vote)"
            } else if err.writers_waiting() > 0 {
                "is awaited by a writer"
            } else if args.permits.is_some() {
                "has every permit held elsewhere"
            } else {
                "is held elsewhere"
            };
            eprintln!("redlock: {} {why}: {err}", args.resource);
            shut_down(&rl).await;
            return args.conflict_exit_code;
        }
        Err(err) => {
            eprintln!("redlock: {err}");
            shut_down(&rl).await;
            return EXIT_FAILURE;
        }
    };

    if window.is_some_and(|window| window.open_for(SystemTime::now()).is_zero()) {
        // Granted as the window closes: most likely as this window's kept lock expired.
        eprintln!("redlock: {}: granted as its window closes: not running", args.resource);
        if let Err(err) = lock.release().await {
            eprintln!("redlock: release: {err}");
        }
        shut_down(&rl).await;
        return args.conflict_exit_code;
    }
    if let Some(marks) = &mut marks {
        // Granted although the job is done: the kept lock was lost (nodes restarted empty,
        // or it could not be kept), and the marks, written before it was kept, say so.
        let seen = marks.read().await;
        if seen.done >= rl.quorum() {
            eprintln!("redlock: {}: {}", args.resource, done_already(seen, rl.quorum()));
            if let Err(err) = lock.release().await {
                eprintln!("redlock: release: {err}");
            }
            shut_down(&rl).await;
            return args.conflict_exit_code;
        }
    }

    let mut command = tokio::process::Command::new(&args.command[0]);
    command
        .args(&args.command[1..])
        .env("REDLOCK_RESOURCE", &args.resource)
        .env("REDLOCK_TOKEN", lock.token())
        .process_group(0);
    if let Some(slot) = lock.slot() {
        command.env("REDLOCK_PERMIT_SLOT", slot.to_string());
    }
    if let Some(token) = lock.fencing_token() {
        command.env("REDLOCK_FENCING_TOKEN", token.to_string());
    }
    let token = lock.token().to_owned();
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(err) => {
            eprintln!("redlock: {}: {err}", args.command[0]);
            if let Err(err) = lock.release().await {
                eprintln!("redlock: release: {err}");
            }
            shut_down(&rl).await;
            return match err.kind() {
                std::io::ErrorKind::NotFound => EXIT_NOT_FOUND,
                _ => EXIT_NOT_EXECUTABLE,
            };
        }
    };
    // Its own process group: the group id is the child's pid.
    let group = child.id().and_then(|pid| i32::try_from(pid).ok()).map(Pid::from_raw);
    // Before the extender starts, so that its cap is never reached before this one's.
    let held_since = tokio::time::Instant::now();
    let auto = match args.max_hold {
        Some(max_hold) => lock.auto_extend_capped(max_hold),
        None => lock.auto_extend(),
    };
    // What must be left of the validity when the lost signal goes, for the kill to land
    // before it ends. A third of the lease: a healthy extender keeps about two thirds.
    let grace = args.kill_after.min(options.ttl / 3);

    loop {
        let event = tokio::select! {
            biased;
            status = child.wait() => Event::Exited(status),
            Some(sig) = signals.recv() => Event::Signal(sig),
            err = auto.lost() => Event::Lost(err),
            // Wakes at least every second: a suspend of the machine does not move the timer.
            () = tokio::time::sleep(auto.validity().saturating_sub(grace).min(Duration::from_secs(1))) => Event::Expiring,
        };
        match event {
            Event::Signal(sig) => {
                if let Some(group) = group {
                    let _ = killpg(group, sig);
                }
            }
            Event::Exited(status) => {
                let code = match status {
                    Ok(status) => exit_code(status),
                    Err(err) => {
                        eprintln!("redlock: waiting for the command: {err}");
                        EXIT_FAILURE
                    }
                };
                match (window, &mut marks) {
                    // Kept, not released: a later run in the window must find it held. A
                    // job that outlived its window releases: the next window's run is due.
                    (Some(window), Some(marks))
                        if code == 0 && !window.left(SystemTime::now()).is_zero() =>
                    {
                        // Marked before it is kept: runs waiting in the window stop at once
                        // rather than wait out a lock that will never be given back.
                        let seen = marks.mark(&token, window.left(SystemTime::now())).await;
                        if seen.done < rl.quorum() {
                            eprintln!(
                                "redlock: {}: the job is marked done on {} of {} nodes (quorum {}): runs waiting in this window wait until it ends",
                                args.resource,
                                seen.done,
                                seen.of,
                                rl.quorum()
                            );
                        }
                        if let Err(err) = auto.keep_for(window.left(SystemTime::now())).await {
                            eprintln!(
                                "redlock: the lock could not be kept until the window ends (another run in it may run the command again): {err}"
                            );
                        }
                    }
                    _ => {
                        if let Err(err) = auto.release().await {
                            eprintln!("redlock: release: {err}");
                        }
                    }
                }
                shut_down(&rl).await;
                return code;
            }
            Event::Lost(err) => {
                // A validity that ran out says only that: the nodes' reasons are the last
                // failed extension's.
                let failure = match auto.lease().extension_failure() {
                    Some(failure) if err.nodes().is_empty() => {
                        format!(" (the last extension: {})", failure)
                    }
                    _ => String::new(),
                };
                eprintln!(
                    "redlock: {}: the lock was lost while the command ran: {err}{failure}",
                    args.resource
                );
                if let Some(group) = group {
                    let _ = killpg(group, args.lost_signal);
                    if tokio::time::timeout(args.kill_after, child.wait()).await.is_err() {
                        let _ = killpg(group, Signal::SIGKILL);
                        let _ = child.wait().await;
                    }
                }
                let _ = auto.release().await;
                shut_down(&rl).await;
                return EXIT_LOST;
            }
            Event::Expiring => {
                let left = auto.validity();
                // An extension landed meanwhile, or the loss itself is next (`lost()`).
                if left > grace || auto.lease().is_lost() {
                    continue;
                }
                // The nodes' reasons are what an operator acts on (which nodes, refused or
                // silent), so the failed extension's error is printed whole.
                let why = match (auto.lease().extension_failure(), args.max_hold) {
                    (Some(failure), _) => failure.to_string(),
                    // The extender stops within a third of the lease of the cap.
                    (None, Some(max_hold))
                        if held_since.elapsed() + grace + options.ttl / 3 >= max_hold =>
                    {
                        format!("--max-hold {} reached", humantime::format_duration(max_hold))
                    }
                    (None, _) => "no extension landed in time".to_owned(),
                };
                eprintln!("redlock: {}: the lock could not be kept: {why}", args.resource);
                eprintln!(
                    "redlock: {}: sending {} with {left:?} of its validity left, SIGKILL when it ends",
                    args.resource, args.lost_signal
                );
                if let Some(group) = group {
                    let _ = killpg(group, args.lost_signal);
                    if tokio::time::timeout(auto.validity(), child.wait()).await.is_err() {
                        let _ = killpg(group, Signal::SIGKILL);
                        let _ = child.wait().await;
                    }
                }
                let _ = auto.release().await;
                shut_down(&rl).await;
                return EXIT_LOST;
            }
        }
    }
}

/// Completes when a quorum of the nodes holds the window's mark (read at once, then every
/// [`done::POLL`]); never without marks to watch.
async fn until_done(marks: Option<&mut Marks>, quorum: usize) -> Seen {
    let Some(marks) = marks else { return std::future::pending().await };
    loop {
        let seen = marks.read().await;
        if seen.done >= quorum {
            return seen;
        }
        tokio::time::sleep(done::POLL).await;
    }
}

/// Why a run of a window whose job is done does not run it.
fn done_already(seen: Seen, quorum: usize) -> String {
    format!(
        "this window's job is done (marked on {} of {} nodes, quorum {quorum}): not running",
        seen.done, seen.of
    )
}

/// How many more attempts a split vote gets, within [`SPLIT_VOTE_WINDOW`] of the first.
const SPLIT_VOTE_RETRIES: u32 = 4;
/// How long after the first attempt a split vote is still retried.
const SPLIT_VOTE_WINDOW: Duration = Duration::from_secs(1);

/// The acquisition `request()` makes, tried again when it ends in a split vote: nobody holds
/// the lock, so synchronised starters (cron on every machine at once) would otherwise all
/// give up. Random pauses pull them apart.
async fn retrying_split_votes<R>(request: impl Fn() -> R) -> redlock::Result<held::Held>
where
    R: std::future::IntoFuture<Output = redlock::Result<held::Held>>,
{
    let began = tokio::time::Instant::now();
    let mut retries = 0;
    loop {
        match request().await {
            Err(err) if err.is_split_vote() && retries < SPLIT_VOTE_RETRIES => {
                let pause = Duration::from_millis(50) + random_up_to(Duration::from_millis(150));
                if began.elapsed() + pause > SPLIT_VOTE_WINDOW {
                    return Err(err);
                }
                retries += 1;
                tokio::time::sleep(pause).await;
            }
            result => return result,
        }
    }
}

/// A random duration in `[0, bound)`, from the standard library's per-process random keys.
fn random_up_to(bound: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    let random = std::collections::hash_map::RandomState::new().build_hasher().finish();
    let nanos = u64::try_from(bound.as_nanos()).unwrap_or(u64::MAX).max(1);
    Duration::from_nanos(random % nanos)
}

/// Retries soon, for as long as the wait allows.
fn waiting() -> Retry {
    Retry::new()
        .with_unbounded_attempts()
        .with_delay(Duration::from_millis(50))
        .with_jitter(Duration::from_millis(100))
}

/// The command's status as redlock's: its code, or 128 + the signal that ended it.
fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(EXIT_FAILURE),
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(EXIT_FAILURE),
        (None, None) => EXIT_FAILURE,
    }
}

/// Waits for the releases in flight, reporting the nodes it could not clean.
async fn shut_down(rl: &redlock::Redlock) {
    match rl.shutdown(SHUTDOWN).await {
        Ok(report) if !report.is_clean() => eprintln!("redlock: shutdown: {report}"),
        Ok(_) => {}
        Err(err) => eprintln!("redlock: shutdown: {err}"),
    }
}

/// Every forwarded signal, as it arrives.
fn forwarded_signals() -> std::io::Result<mpsc::UnboundedReceiver<Signal>> {
    let (tx, rx) = mpsc::unbounded_channel();
    for sig in FORWARDED {
        let mut stream = signal(SignalKind::from_raw(sig as i32))?;
        let tx = tx.clone();
        tokio::spawn(async move {
            while stream.recv().await.is_some() {
                if tx.send(sig).is_err() {
                    return;
                }
            }
        });
    }
    Ok(rx)
}
