//! The resource side of fencing: rejecting writes from holders whose lock is stale.
//!
//! A lease can expire while its holder is paused (GC, swapping, a stopped VM); the holder
//! then wakes up and writes as if it still held the lock. A fencing token stops that write
//! at the resource: every write carries the token of the lock it was made under
//! ([`Lock::fencing_token`](crate::Lock::fencing_token)), and the resource remembers the
//! highest token it has accepted and rejects anything lower.
//!
//! [`fenced_set`] does this for a value in Redis (any Redis: the protected resource, not
//! the lock's masters). The same check in a relational store is one conditional `UPDATE`:
//!
//! ```sql
//! -- accounts(id, balance, fence): accept the write only from the newest lock holder.
//! UPDATE accounts
//!    SET balance = $1, fence = $2
//!  WHERE id = $3 AND fence <= $2;
//! -- 0 rows updated: a newer holder has written since; this holder's lock is stale.
//! ```
//!
//! The check belongs to the resource, in the same atomic step as the write; checking the
//! token first and writing afterwards would reopen the gap it closes.

use std::sync::LazyLock;

use redis::aio::ConnectionLike;

/// Whether a fenced write was applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a rejected write means this holder's lock is stale"]
pub enum FencedWrite {
    /// The token was at least the highest seen: the value was written.
    Written,
    /// A higher token was seen before: the writer's lock is stale, nothing was written.
    Rejected,
}

static FENCED_SET: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("scripts/fenced_set.lua")));

/// Sets `key` to `value` only if `token` is at least the highest token used on `key`
/// before (kept in `<key>:fence`), atomically, in one script.
///
/// Equal tokens are accepted, so one holder may write several times under one lock.
///
/// ```no_run
/// use redlock::fence::{fenced_set, FencedWrite};
///
/// # async fn run(rl: redlock::Redlock, mut store: redis::aio::MultiplexedConnection) -> Result<(), Box<dyn std::error::Error>> {
/// let lock = rl.lock_fenced("invoice:7").await?;
/// let token = lock.fencing_token().expect("a fenced lock has a token");
/// // ... a long pause here could outlive the lease ...
/// match fenced_set(&mut store, "invoice:7:status", b"paid", token).await? {
///     FencedWrite::Written => {}
///     FencedWrite::Rejected => eprintln!("lost the lock before writing; nothing written"),
/// }
/// lock.release().await?;
/// # Ok(())
/// # }
/// ```
pub async fn fenced_set<C: ConnectionLike>(
    connection: &mut C,
    key: &str,
    value: &[u8],
    token: u64,
) -> redis::RedisResult<FencedWrite> {
    let written: i64 = FENCED_SET
        .key(key)
        .key(format!("{key}:fence"))
        .arg(value)
        .arg(token)
        .invoke_async(connection)
        .await?;
    Ok(if written == 1 { FencedWrite::Written } else { FencedWrite::Rejected })
}
