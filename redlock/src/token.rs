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

/// A fresh token, followed by `.<label>` when the client has an owner label.
pub(crate) fn generate_labelled(label: Option<&str>) -> String {
    let mut token = generate();
    if let Some(label) = label {
        token.push('.');
        token.push_str(label);
    }
    token
}

/// The longest owner label.
const MAX_LABEL: usize = 64;

/// Checks an owner label: it must never contain `:` (the reentrant fields put the owner id
/// after the first `:` that follows the token) nor anything a shell or a log would mangle.
pub(crate) fn check_label(label: &str) -> Result<&str, String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || "._/@-".contains(c);
    if label.is_empty() || label.len() > MAX_LABEL || !label.chars().all(allowed) {
        return Err(format!(
            "owner_label must be 1 to {MAX_LABEL} characters of A-Z a-z 0-9 . _ / @ -"
        ));
    }
    Ok(label)
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
