//! `redlock`: run a command under a Redlock quorum lock, inspect a lock, free one by hand.
//!
//! Exit codes of `redlock run`: the command's own status (128 + N if it died of signal N);
//! 75 when the lock is held elsewhere (`--conflict-exit-code`; with `--once-per`, also when
//! it was kept, or the window marked done, by this window's run); 124 when the lock was lost, or could not be kept, while
//! the command ran; 125 for redlock's own failure (configuration, nodes unavailable);
//! 126 when the command cannot be executed, 127 when it is not found; 128 + N when redlock
//! itself got signal N while waiting for the lock.

mod admin;
mod check;
mod config;
mod done;
mod held;
mod once;
mod run;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// The lock was held elsewhere.
pub(crate) const EXIT_CONFLICT: u8 = 75;
/// The lock was lost, or could not be kept, while the command ran.
pub(crate) const EXIT_LOST: u8 = 124;
/// redlock's own failure: configuration, nodes unavailable, TLS, ACL.
pub(crate) const EXIT_FAILURE: u8 = 125;
/// The command exists but cannot be executed.
pub(crate) const EXIT_NOT_EXECUTABLE: u8 = 126;
/// The command was not found.
pub(crate) const EXIT_NOT_FOUND: u8 = 127;

#[derive(Debug, Parser)]
#[command(
    name = "redlock",
    version,
    about = "Distributed locks over independent Redis masters (Redlock)"
)]
struct Cli {
    #[command(flatten)]
    config: config::Options,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Runs a command while holding the lock on RESOURCE, or with --permits N one of N permits
    /// (no shell: the command is executed directly, in its own process group).
    #[command(after_help = run::AFTER_HELP)]
    Run(run::RunArgs),
    /// Shows, per node, who holds RESOURCE (with --permits N: each of its N permits) and for
    /// how long (advisory).
    Inspect(admin::InspectArgs),
    /// Frees RESOURCE on every node whoever holds it (an administrator's last resort).
    Release(admin::ReleaseArgs),
    /// Checks that every node fits the Redlock model: reachable, Redis 6.2+ or Valkey, an
    /// independent master without replicas, persistence, eviction policy, duplicates, clocks.
    Check,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime =
        match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
            Ok(runtime) => runtime,
            Err(err) => {
                eprintln!("redlock: cannot start: {err}");
                return ExitCode::from(EXIT_FAILURE);
            }
        };
    let code = runtime.block_on(async move {
        match cli.command {
            Command::Run(args) => run::run(&cli.config, args).await,
            Command::Inspect(args) => admin::inspect(&cli.config, args).await,
            Command::Release(args) => admin::release(&cli.config, args).await,
            Command::Check => check::check(&cli.config).await,
        }
    });
    ExitCode::from(code)
}
