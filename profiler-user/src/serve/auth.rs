//! Bearer-token authentication of the API (Alertmanager's `http_config.authorization`).
//!
//! Owns loading the token file and checking an `Authorization` header against it in constant time (the time
//! taken depends on the lengths only, never on where the first differing byte is). Never logs a token.

use std::path::{Path, PathBuf};

/// Why the token file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The file could not be read.
    #[error("cannot read the token file {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The file holds no token.
    #[error("the token file {0} is empty: write a random token into it (e.g. `openssl rand -hex 32 > FILE`)")]
    Empty(PathBuf),
}

/// The expected bearer token.
#[derive(Clone)]
pub struct Token(Vec<u8>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl Token {
    /// Reads the token from `path` (surrounding whitespace, e.g. a final newline, is not part of it).
    pub fn from_file(path: &Path) -> Result<Token, TokenError> {
        let text = std::fs::read_to_string(path).map_err(|source| TokenError::Read {
            path: path.to_owned(),
            source,
        })?;
        let t = text.trim();
        if t.is_empty() {
            return Err(TokenError::Empty(path.to_owned()));
        }
        Ok(Token(t.as_bytes().to_vec()))
    }

    /// A token from a string (tests).
    pub fn new(t: &str) -> Token {
        Token(t.as_bytes().to_vec())
    }

    /// Whether an `Authorization` header value (`Bearer TOKEN`) carries this token.
    pub fn check_header(&self, header: Option<&[u8]>) -> bool {
        let Some(h) = header else { return false };
        // The scheme is case-insensitive (RFC 9110 §11.1); one space separates it from the credentials.
        if h.len() < 7 || !h[..7].eq_ignore_ascii_case(b"bearer ") {
            return false;
        }
        constant_time_eq(trim_ascii(&h[7..]), &self.0)
    }
}

fn trim_ascii(b: &[u8]) -> &[u8] {
    let start = b.iter().position(|c| !c.is_ascii_whitespace()).unwrap_or(b.len());
    let end = b
        .iter()
        .rposition(|c| !c.is_ascii_whitespace())
        .map_or(start, |i| i + 1);
    &b[start..end]
}

/// Compares in time that depends only on the lengths: every byte of the longer input is visited and the
/// differences are OR-ed together, with no early exit; `black_box` keeps the optimizer from adding one.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let n = a.len().max(b.len());
    let mut diff = u64::from(a.len() != b.len());
    for i in 0..n {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= u64::from(std::hint::black_box(x ^ y));
    }
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests {
    use super::*;

    #[test]
    fn compares_whole_tokens_only() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
        assert!(constant_time_eq(b"", b""));
    }

    #[test]
    fn checks_bearer_headers() {
        let t = Token::new("s3cret");
        assert!(t.check_header(Some(b"Bearer s3cret")));
        assert!(t.check_header(Some(b"bearer s3cret ")));
        assert!(!t.check_header(Some(b"Basic s3cret")));
        assert!(!t.check_header(Some(b"Bearer s3cre")));
        assert!(!t.check_header(Some(b"Bearer")));
        assert!(!t.check_header(None));
        assert_eq!(format!("{t:?}"), "Token(<redacted>)");
    }

    #[test]
    fn token_file_is_trimmed_and_must_not_be_empty() {
        let dir = std::env::temp_dir().join(format!("llmprof-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("token");
        std::fs::write(&f, "abc\n").unwrap();
        assert!(Token::from_file(&f).unwrap().check_header(Some(b"Bearer abc")));
        std::fs::write(&f, " \n").unwrap();
        assert!(matches!(Token::from_file(&f), Err(TokenError::Empty(_))));
        assert!(matches!(
            Token::from_file(&dir.join("missing")),
            Err(TokenError::Read { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
