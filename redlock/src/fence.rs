//! The resource side of fencing: rejecting writes from holders whose lock is stale.
//!
//! A lease can expire while its holder is paused (GC, swapping, a stopped VM); the holder
//! then wakes up and writes as if it still held the lock. A fencing token stops that write
//! at the resource: every write carries the token of the lock it was made under
//! ([`Lock::fencing_token`](crate::Lock::fencing_token), from a lock taken with
//! `.fenced()`), and the resource remembers the highest token it has accepted and rejects
//! anything lower. How tokens are ordered: [`crate::guide::fencing`].
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
    LazyLock::new(|| redis::Script::new(include_str!("lua/fenced_set.lua")));

/// What [`token_key`] appends to a key without a hash tag, once wrapped in braces.
const UNTAGGED_SUFFIX: &str = ":fence";
/// What [`token_key`] appends to a key with a hash tag. It differs from
/// [`UNTAGGED_SUFFIX`] in its last character, so no store of a tagged key can equal one of
/// an untagged key (`{a}` and `a` once shared `{a}:fence`).
const TAGGED_SUFFIX: &str = ":fence-t";

/// The key where [`fenced_set`] keeps the highest token seen for `key`: in the same Redis
/// Cluster hash slot as `key` (`{key}:fence` for a key without a hash tag, `key:fence-t`
/// for a key with one), and a different store for every key (the mapping is injective).
/// Keys that contain a `}` without a valid hash tag are not supported on a Redis Cluster
/// (give them a tag): their store may land in another slot.
pub fn token_key(key: &str) -> String {
    if has_hash_tag(key) {
        format!("{key}{TAGGED_SUFFIX}")
    } else {
        format!("{{{key}}}{UNTAGGED_SUFFIX}")
    }
}

/// Whether `key` is the token store of some key ([`token_key`]'s image): such a key cannot
/// take a fenced value, since its own token store is where another value's tokens live.
pub fn is_token_key(key: &str) -> bool {
    if let Some(value_key) = key.strip_suffix(TAGGED_SUFFIX)
        && has_hash_tag(value_key)
    {
        return true;
    }
    key.strip_suffix(UNTAGGED_SUFFIX)
        .and_then(|wrapped| wrapped.strip_prefix('{')?.strip_suffix('}'))
        .is_some_and(|value_key| !has_hash_tag(value_key))
}

/// Whether `key` has a Redis Cluster hash tag: a non-empty `{...}` part, the first `{`
/// up to the next `}`.
pub(crate) fn has_hash_tag(key: &str) -> bool {
    key.find('{').and_then(|open| key[open + 1..].find('}').map(|len| len > 0)).unwrap_or(false)
}

/// Sets `key` to `value` only if `token` is at least the highest token used on `key`
/// before (kept in [`token_key`]`(key)`), atomically, in one script. Equal tokens are
/// accepted, so one holder may write several times under one lock. Tokens are compared
/// as numbers of any size (as digit strings, never as Lua doubles).
///
/// ```no_run
/// use redlock::fence::{fenced_set, FencedWrite};
///
/// # async fn run(rl: redlock::Redlock) -> Result<(), Box<dyn std::error::Error>> {
/// // The store: any async redis-rs connection, of the `redis` version this crate
/// // re-exports (`redlock::redis`), to a Redis that is not one of the lock's masters.
/// let mut store = redlock::redis::Client::open("redis://store.internal:6379")?
///     .get_multiplexed_async_connection()
///     .await?;
/// let lock = rl.lock("invoice:7").fenced().await?;
/// // Some for a lock taken `.fenced()`: a forgotten `.fenced()` fails here, not as token 0.
/// let fence = lock.fencing_token().expect("taken .fenced()");
/// match fenced_set(&mut store, "invoice:7:status", b"paid", fence).await? {
///     FencedWrite::Written => {}
///     FencedWrite::Rejected => eprintln!("lost the lock before writing; nothing written"),
/// }
/// lock.release().await?;
/// # Ok(())
/// # }
/// ```
///
/// # Errors
/// The connection's error; a server error when the stored token is not a number; a client
/// error ([`redis::ErrorKind::InvalidClientConfig`]) when `key` is itself a token store
/// ([`is_token_key`]), before anything is sent.
pub async fn fenced_set<C: ConnectionLike>(
    connection: &mut C,
    key: &str,
    value: &[u8],
    token: u64,
) -> redis::RedisResult<FencedWrite> {
    if is_token_key(key) {
        return Err(redis::RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "a fenced value cannot be kept at a key that is a token store",
            key.to_owned(),
        )));
    }
    let written: i64 = FENCED_SET
        .key(key)
        .key(token_key(key))
        .arg(value)
        .arg(token.to_string())
        .invoke_async(connection)
        .await?;
    Ok(if written == 1 { FencedWrite::Written } else { FencedWrite::Rejected })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_counter_stays_in_the_values_hash_slot() {
        assert_eq!(token_key("invoice:7"), "{invoice:7}:fence");
        assert_eq!(token_key("{orders}:7"), "{orders}:7:fence-t");
        assert_eq!(token_key("a{}b"), "{a{}b}:fence");
        assert!(!has_hash_tag("a{b"));
        assert!(has_hash_tag("x{b}y"));
    }

    #[test]
    fn a_key_and_its_braced_form_have_different_token_stores() {
        assert_ne!(token_key("a"), token_key("{a}"));
        assert!(is_token_key(&token_key("a")));
        assert!(is_token_key(&token_key("{a}")));
        assert!(!is_token_key("a"));
        assert!(!is_token_key("{a}"));
        assert!(!is_token_key("invoice:fence"));
    }

    proptest::proptest! {
        #[test]
        fn token_stores_are_distinct_and_never_value_keys(
            a in "[a-c{}:]{0,6}(:fence(-t)?)?",
            b in "[a-c{}:]{0,6}(:fence(-t)?)?",
        ) {
            if a != b {
                proptest::prop_assert_ne!(token_key(&a), token_key(&b));
            }
            proptest::prop_assert!(is_token_key(&token_key(&a)));
            // A store's key maps to a store of its own, never to itself.
            proptest::prop_assert_ne!(token_key(&token_key(&a)), token_key(&a));
        }
    }
}
