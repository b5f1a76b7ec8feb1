//! Lock tokens: the value stored under the key, unique per acquisition.

use rand::RngCore;

/// 20 random bytes (160 bits, as the Redlock spec suggests), from the thread-local CSPRNG.
const TOKEN_BYTES: usize = 20;

/// A fresh token as 40 lowercase hex characters, so that `redis-cli GET` shows it plainly.
pub(crate) fn generate() -> String {
    let mut bytes = [0u8; TOKEN_BYTES];
    rand::rng().fill_bytes(&mut bytes);
    let mut token = String::with_capacity(TOKEN_BYTES * 2);
    for byte in bytes {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        token.push(char::from(HEX[usize::from(byte >> 4)]));
        token.push(char::from(HEX[usize::from(byte & 0x0f)]));
    }
    token
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn tokens_are_160_bit_hex_and_unique() {
        let tokens: HashSet<String> = (0..10_000).map(|_| generate()).collect();
        assert_eq!(tokens.len(), 10_000);
        assert!(tokens.iter().all(|t| t.len() == 40 && t.bytes().all(|b| b.is_ascii_hexdigit())));
    }
}
