//! The API-key check shared by both protocols: the token of an
//! `authorization: Bearer <key>` value (scheme in any case, as RFC 7235
//! reads it) and a comparison that takes the same time wherever the first
//! differing byte is.

/// The token of an `Authorization: Bearer <token>` header (or gRPC
/// `authorization` metadata) value; None for another scheme or no token.
pub fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// Compares secrets without an early exit on the first differing byte (the
/// length, which is not secret here, may still decide early).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether an authorization value carries exactly `key`.
pub fn bearer_matches(value: &str, key: &str) -> bool {
    bearer_token(value).is_some_and(|t| constant_time_eq(t.as_bytes(), key.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_token_parsing() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer  abc "), Some("abc"));
        assert_eq!(bearer_token("BEARER abc"), Some("abc"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearer "), None);
        assert_eq!(bearer_token("abc"), None);
    }

    #[test]
    fn constant_time_comparison() {
        assert!(constant_time_eq(b"key", b"key"));
        assert!(!constant_time_eq(b"key", b"kez"));
        assert!(!constant_time_eq(b"key", b"key2"));
        assert!(bearer_matches("bearer key", "key"));
        assert!(!bearer_matches("Bearer kez", "key"));
        assert!(!bearer_matches("key", "key"));
    }
}
