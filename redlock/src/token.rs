//! Lock tokens: the value stored under the key, unique per acquisition.

use std::fmt;

use smallvec::SmallVec;

use rand::RngCore;

/// 20 random bytes (160 bits, as the Redlock spec suggests), from the thread-local CSPRNG.
const TOKEN_BYTES: usize = 20;

/// A fresh token as 40 lowercase hex characters, so that `redis-cli GET` shows it plainly.
pub(crate) fn generate() -> String {
    hex().as_str().to_owned()
}

/// A fresh token, followed by `.<label>` when the client has an owner label.
pub(crate) fn generate_labelled(label: Option<&str>) -> Token {
    let mut bytes = SmallVec::new();
    bytes.extend_from_slice(&hex().0);
    if let Some(label) = label {
        bytes.push(b'.');
        bytes.extend_from_slice(label.as_bytes());
    }
    Token(bytes)
}

/// A hold's token, kept in place: the hex digits and a checked label always fit.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Token(SmallVec<[u8; 128]>);

impl Token {
    pub(crate) fn as_str(&self) -> &str {
        // Hex digits, a dot and a checked label: always UTF-8.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

/// The hex digits of a fresh token, on the stack.
struct Hex([u8; TOKEN_BYTES * 2]);

impl Hex {
    fn as_str(&self) -> &str {
        // Hex digits only: always ASCII.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

fn hex() -> Hex {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut bytes = [0u8; TOKEN_BYTES];
    rand::rng().fill_bytes(&mut bytes);
    let mut hex = [0u8; TOKEN_BYTES * 2];
    for (pair, byte) in hex.chunks_exact_mut(2).zip(bytes) {
        pair[0] = DIGITS[usize::from(byte >> 4)];
        pair[1] = DIGITS[usize::from(byte & 0x0f)];
    }
    Hex(hex)
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

    #[test]
    fn a_label_follows_the_token_after_a_dot() {
        let token = generate_labelled(Some("cron@host"));
        let (hex, label) = token.as_str().split_once('.').unwrap();
        assert_eq!((hex.len(), label), (40, "cron@host"));
        assert_eq!(generate_labelled(None).as_str().len(), 40);
        assert!(!generate_labelled(Some(&"a".repeat(MAX_LABEL))).0.spilled());
    }
}
