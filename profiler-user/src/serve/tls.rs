//! HTTPS for serve's API (`--tls-cert`, `--tls-key`): rustls with the ring provider, the same TLS stack as
//! the OTLP exporter, so nothing new is compiled.
//!
//! Owns loading the certificate chain and key (PEM) into a server config. Connections (their handshakes,
//! deadlines and caps) are [`super::listen`]'s.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Why the certificate or key cannot be used. Messages name the file and the fix.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The certificate file is unreadable or holds no PEM certificate.
    #[error("--tls-cert {path}: {why} (expected a PEM certificate chain, server certificate first)")]
    Cert {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        why: String,
    },
    /// The key file is unreadable or holds no PEM private key.
    #[error("--tls-key {path}: {why} (expected a PEM private key: PKCS#8, PKCS#1 or SEC1)")]
    Key {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        why: String,
    },
    /// The key file is unreadable, or others may read it (a private key others can read is no secret).
    #[error(transparent)]
    KeyFile(#[from] super::auth::TokenError),
    /// The key does not fit the certificate, or rustls refused the pair.
    #[error("--tls-cert/--tls-key: {0}")]
    Config(String),
}

/// Builds the server config from PEM files (ALPN: HTTP/1.1, the only protocol serve speaks).
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let certs = CertificateDer::pem_file_iter(cert)
        .map_err(|e| TlsError::Cert {
            path: cert.to_owned(),
            why: e.to_string(),
        })?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Cert {
            path: cert.to_owned(),
            why: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Cert {
            path: cert.to_owned(),
            why: "no certificate in the file".into(),
        });
    }
    let pem = super::auth::read_secret(key, "--tls-key")?;
    let key = PrivateKeyDer::from_pem_slice(&pem).map_err(|e| TlsError::Key {
        path: key.to_owned(),
        why: e.to_string(),
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| TlsError::Config(e.to_string()))?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// A self-signed certificate for `localhost` and its key (0600) made by openssl in `dir` (tests); None without
/// openssl.
#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
pub(super) fn self_signed(dir: &Path) -> Option<(PathBuf, PathBuf)> {
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let o = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ])
        .args([
            "-days",
            "2",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost",
        ])
        .args(["-addext", "basicConstraints=critical,CA:FALSE", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .ok()?;
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    Some((cert, key))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests {
    use super::*;

    #[test]
    fn bad_files_say_which_and_what_is_expected() {
        let dir = std::env::temp_dir().join(format!("llmprof-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let e = server_config(&empty, &empty).unwrap_err().to_string();
        assert!(e.contains("--tls-cert") && e.contains("no certificate"), "{e}");
        let missing = dir.join("missing.pem");
        let e = server_config(&missing, &empty).unwrap_err().to_string();
        assert!(e.contains("--tls-cert") && e.contains("missing.pem"), "{e}");
        // A private key others may read is refused (what --check-config reports), with the fix.
        if let Some((cert, key)) = self_signed(&dir) {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
            let e = server_config(&cert, &key).unwrap_err().to_string();
            assert!(
                e.contains("--tls-key") && e.contains("mode 644") && e.contains("chmod 600"),
                "{e}"
            );
            std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
            assert!(server_config(&cert, &key).is_ok());
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
