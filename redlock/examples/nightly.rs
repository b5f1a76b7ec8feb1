//! A job that must run once per schedule across machines: the same program runs from cron
//! on every machine at the same time; one of them runs the job, the others (and a machine
//! that starts late, or a second run by hand) skip it until the window is over.
//!
//! ```text
//! # crontab on every machine, every night at 02:00 (a window of one UTC day):
//! 0 2 * * *  REDLOCK_NODES=redis://10.0.0.1:6379,... /usr/local/bin/nightly
//! # try it: several at once against your nodes, each with a window of 60 s
//! REDLOCK_NODES=... cargo run -p redlock-quorum --example nightly -- 60
//! ```
//!
//! How it works: the lock is taken with a short wait (machines started together are not
//! all refused by a split vote), the job runs while the lock is kept alive,
//! and on success the lock is not released but kept until the window ends (`keep_for`), so
//! every later start in the window is refused. On failure it is released, so that a
//! machine still waiting runs the job instead. The `redlock` command's `run --once-per 1d`
//! does the same for any command, without writing Rust.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redlock::{ErrorKind, RedlockBuilder, Retry};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The window's length in seconds (a day by default); windows are aligned to the Unix
    // epoch, so machines agree on them as far as their clocks agree.
    let window: u64 = std::env::args().nth(1).map_or(Ok(86_400), |arg| arg.parse())?;
    let machine = std::env::var("MACHINE").unwrap_or_else(|_| std::process::id().to_string());
    let rl = RedlockBuilder::from_env("REDLOCK_")?.ttl(Duration::from_secs(30)).build()?;

    // Wait a little: machines started together are not all refused by a split vote, and
    // one still waiting when the job fails takes over; every later start skips at once.
    let wait = Retry::new().with_max_wait(Duration::from_secs(5));
    let lock = match rl.lock("nightly-report").retry(wait).await {
        Ok(lock) => lock,
        Err(err) if err.kind() == ErrorKind::NotAcquired => {
            println!("{machine}: skipped, another machine runs or ran the job in this window");
            rl.shutdown(Duration::from_secs(2)).await?;
            return Ok(());
        }
        Err(err) => return Err(err.into()),
    };
    // Kept alive while the job runs, however long it takes; `lost()` says if it is lost.
    let lock = lock.auto_extend();
    let job = async {
        println!("{machine}: running the job");
        tokio::time::sleep(Duration::from_secs(2)).await; // the job's work
        Ok::<(), std::io::Error>(())
    };
    let outcome = tokio::select! {
        outcome = job => outcome,
        lost = lock.lost() => {
            println!("{machine}: lost the lock mid-job ({lost}); stopping");
            rl.shutdown(Duration::from_secs(2)).await?;
            return Err(lost.into());
        }
    };
    match outcome {
        Ok(()) => {
            let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
            let until_window_ends = Duration::from_secs(window - now % window);
            lock.keep_for(until_window_ends).await?;
            println!("{machine}: done; the lock is kept for {until_window_ends:?}");
        }
        Err(err) => {
            lock.release().await?;
            println!("{machine}: the job failed ({err}); released for another machine");
        }
    }
    rl.shutdown(Duration::from_secs(2)).await?;
    Ok(())
}
