//! Where a token's tombstone lives: the key an undo leaves so that nothing of the token is
//! created on that node again (see `lua/create_guard.lua` and `lua/undo_mark.lua`).
//!
//! It lives in the same Redis Cluster hash slot as the lock key it guards (a script may
//! touch only keys of one slot there) and begins with the lock key, so that an ACL key
//! pattern that covers the lock keys (`~app:*`) covers their tombstones too.

use crate::fence::has_hash_tag;

/// What separates the lock key from the rest of a tombstone's name.
const MARK: &str = ":undone:";

/// The tombstone of `token` for the lock key `key`: `key:undone:token` when `key` has a hash
/// tag (the tag still decides the slot), `key:undone:{key}:token` when it has none (then
/// the whole of `key` is its tag, which is the slot of `key` itself). A key with a brace but
/// no tag (a `{` with no `}` after it, or a `}` alone) is the one case whose tombstone may
/// land in another slot.
pub(crate) fn key(key: &str, token: &str) -> String {
    // Built at its final size: every acquisition makes one, and `format!` costs several
    // times as much (and leaves room that a boxed `str` then gives back).
    let tagged = has_hash_tag(key);
    let tag = if tagged { 0 } else { key.len() + "{}:".len() };
    let mut name = String::with_capacity(key.len() + MARK.len() + tag + token.len());
    name.push_str(key);
    name.push_str(MARK);
    if !tagged {
        name.push('{');
        name.push_str(key);
        name.push_str("}:");
    }
    name.push_str(token);
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Redis Cluster's slot of `key` (CRC16/XMODEM of its hash tag, or of the whole key).
    fn slot(key: &str) -> u16 {
        let bytes = key.as_bytes();
        let tagged = key.find('{').and_then(|open| {
            let len = key[open + 1..].find('}')?;
            (len > 0).then(|| &bytes[open + 1..open + 1 + len])
        });
        let mut crc: u16 = 0;
        for &byte in tagged.unwrap_or(bytes) {
            crc ^= u16::from(byte) << 8;
            for _ in 0..8 {
                crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
            }
        }
        crc % 16384
    }

    #[test]
    fn the_slot_function_matches_redis_cluster_on_known_keys() {
        // From the Redis Cluster specification: 123456789 has CRC16 0x31C3.
        assert_eq!(slot("123456789"), 0x31C3);
        assert_eq!(slot("{user1000}.following"), slot("user1000"));
    }

    proptest::proptest! {
        #[test]
        fn a_tombstone_shares_its_lock_keys_slot_and_prefix(
            key in "[a-z:{}]{0,12}[a-z]{1,4}",
            token in "[0-9a-f]{40}(\\.[a-z]{0,5})?",
        ) {
            let tombstone = super::key(&key, &token);
            proptest::prop_assert!(tombstone.starts_with(&key));
            let stray_brace = !has_hash_tag(&key) && key.contains(['{', '}']);
            if !stray_brace {
                proptest::prop_assert_eq!(slot(&tombstone), slot(&key), "{}", tombstone);
            }
        }
    }
}
