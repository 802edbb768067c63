//! Bearer tokens of solvers and runners: `<id>.<secret>`, the secret 32 random bytes. Only the
//! secret's SHA-256 is stored; a presented token is looked up by its id and its secret's hash
//! compared with the stored one in constant time, so neither the table nor the timing of a
//! failed check tells anything about a valid secret.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// A new token for `id` and the hash to store for it.
pub fn issue(id: &str) -> (String, String) {
    let secret: [u8; 32] = rand::random();
    let secret = hex::encode(secret);
    (format!("{id}.{secret}"), hash(&secret))
}

pub fn hash(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// Splits a presented token into (id, secret); `None` when it is not of the form `<id>.<secret>`.
pub fn split(token: &str) -> Option<(&str, &str)> {
    let (id, secret) = token.rsplit_once('.')?;
    (!id.is_empty() && !secret.is_empty()).then_some((id, secret))
}

/// Whether `secret` hashes to `stored`, compared in constant time.
pub fn matches(secret: &str, stored: &str) -> bool {
    hash(secret).as_bytes().ct_eq(stored.as_bytes()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_matches_only_its_own_hash() {
        let (token, stored) = issue("alice");
        let (id, secret) = split(&token).unwrap();
        assert_eq!(id, "alice");
        assert!(matches(secret, &stored));
        assert!(!matches("0", &stored));
        let (_, other) = issue("alice");
        assert!(!matches(secret, &other));
        assert!(!stored.contains(secret));
    }

    #[test]
    fn malformed_tokens_are_refused() {
        assert_eq!(split("nodot"), None);
        assert_eq!(split(".secret"), None);
        assert_eq!(split("id."), None);
        assert_eq!(split("a.b.c"), Some(("a.b", "c")));
    }
}
