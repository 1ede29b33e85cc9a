//! Bearer-token authentication of the API (Alertmanager's `http_config.authorization`).
//!
//! Owns reading the files that hold serve's secrets ([`read_secret`]: the token, the Alertmanager
//! credentials, the TLS private key — each refused unless only root, or serve's own user, can read or change
//! it) and checking an `Authorization` header against the token in constant time (the time taken depends on
//! the lengths only, never on where the first differing byte is). Never logs a secret.

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Why a secret's file (the token file, `--alertmanager-auth-file`, `--tls-key`) cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The file could not be read.
    #[error("cannot read {what} {path}")]
    Read {
        /// Which option.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The file holds no token.
    #[error("the token file {0} is empty: write a random token into it (e.g. `openssl rand -hex 32 > FILE`)")]
    Empty(PathBuf),
    /// Someone other than root (or serve's own user) owns the file, or its group or others may read it.
    #[error(
        "{what} {path} is owned by uid {uid} with mode {mode:03o}: it must belong to root (or the user \
         llmprof serve runs as) and be readable by its owner only: run `chown root {path}; chmod 600 {path}`"
    )]
    Permissions {
        /// Which option.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Its owner.
        uid: u32,
        /// Its permission bits.
        mode: u32,
    },
}

/// Largest secret file read (a token, a credentials line, a PEM key).
const SECRET_MAX: u64 = 64 << 10;

/// Reads the file holding a secret (`what` names the option in messages). The file (a symlink to it is
/// followed, as Kubernetes mounts Secrets) must be owned by root or by the user serve runs as, with no
/// permission for its group or others: a secret anyone can read or replace protects nothing. The checks are on
/// the file read (fstat), not on a name that could change in between.
pub fn read_secret(path: &Path, what: &'static str) -> Result<Vec<u8>, TokenError> {
    let read_err = |source| TokenError::Read {
        what,
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read_err)?;
    let meta = file.metadata().map_err(read_err)?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    let mode = meta.mode() & 0o777;
    if (meta.uid() != 0 && meta.uid() != euid) || mode & 0o077 != 0 {
        return Err(TokenError::Permissions {
            what,
            path: path.to_owned(),
            uid: meta.uid(),
            mode,
        });
    }
    let mut out = Vec::new();
    file.take(SECRET_MAX).read_to_end(&mut out).map_err(read_err)?;
    Ok(out)
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
    /// Reads the token from `path` ([`read_secret`]; surrounding whitespace, e.g. a final newline, is not part
    /// of it).
    pub fn from_file(path: &Path) -> Result<Token, TokenError> {
        let text = read_secret(path, "the token file")?;
        let t = trim_ascii(&text);
        if t.is_empty() {
            return Err(TokenError::Empty(path.to_owned()));
        }
        Ok(Token(t.to_vec()))
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
    use std::os::unix::fs::PermissionsExt;

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
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(Token::from_file(&f).unwrap().check_header(Some(b"Bearer abc")));
        std::fs::write(&f, " \n").unwrap();
        assert!(matches!(Token::from_file(&f), Err(TokenError::Empty(_))));
        assert!(matches!(
            Token::from_file(&dir.join("missing")),
            Err(TokenError::Read { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_token_file_others_can_read_or_own_is_refused_with_the_fix() {
        let dir = std::env::temp_dir().join(format!("llmprof-token-perm-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("token");
        std::fs::write(&f, "abc\n").unwrap();
        for mode in [0o644, 0o640, 0o604, 0o660, 0o700 | 0o004] {
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).unwrap();
            let e = Token::from_file(&f).unwrap_err();
            assert!(matches!(e, TokenError::Permissions { .. }), "mode {mode:o}: {e}");
            let msg = e.to_string();
            assert!(msg.contains(&format!("chmod 600 {}", f.display())), "{msg}");
            assert!(msg.contains(&format!("chown root {}", f.display())), "{msg}");
        }
        for mode in [0o600, 0o400] {
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).unwrap();
            assert!(Token::from_file(&f).is_ok(), "mode {mode:o}");
        }
        // Owned by another user (only root can give a file away): refused even at 0600.
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            std::os::unix::fs::chown(&f, Some(65534), None).unwrap();
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
            let e = Token::from_file(&f).unwrap_err();
            assert!(matches!(e, TokenError::Permissions { uid: 65534, .. }), "{e}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
