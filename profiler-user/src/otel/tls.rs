//! TLS to the collector for `https://` endpoints, for both transports.
//!
//! Owns the trust roots (the system store plus `--otlp-ca-cert`) and the optional client identity (mTLS,
//! `--otlp-client-cert`/`--otlp-client-key`), turned into tonic's `ClientTlsConfig` for OTLP/gRPC and a
//! hyper-rustls connector for OTLP/HTTP. Files are read and parsed when the sink starts, so a bad path or PEM
//! fails before anything is attached. rustls with the ring provider only.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::OtelError;

/// TLS files named by options or the `OTEL_EXPORTER_OTLP_*CERTIFICATE`/`CLIENT_*` variables.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificates trusted in addition to the system roots (a private CA).
    pub ca: Option<PathBuf>,
    /// PEM client certificate chain for mutual TLS.
    pub client_cert: Option<PathBuf>,
    /// PEM private key of the client certificate.
    pub client_key: Option<PathBuf>,
}

/// The files read and checked.
#[derive(Clone, Debug)]
pub struct TlsMaterial {
    ca_pem: Option<Vec<u8>>,
    ca: Vec<CertificateDer<'static>>,
    identity: Option<Identity>,
}

#[derive(Clone, Debug)]
struct Identity {
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
}

fn tls_err(path: &Path, reason: impl Into<String>) -> OtelError {
    OtelError::Tls {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

fn read(path: &Path) -> Result<Vec<u8>, OtelError> {
    std::fs::read(path).map_err(|e| tls_err(path, format!("cannot read it: {e}")))
}

fn certs(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, OtelError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| tls_err(path, format!("not a PEM certificate file: {e}")))?;
    if certs.is_empty() {
        return Err(tls_err(
            path,
            "holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
        ));
    }
    Ok(certs)
}

impl TlsMaterial {
    /// Reads and checks the files. A client certificate needs its key and the other way round.
    pub fn load(files: &TlsFiles) -> Result<Self, OtelError> {
        let (ca_pem, ca) = match &files.ca {
            Some(p) => {
                let pem = read(p)?;
                let c = certs(p, &pem)?;
                (Some(pem), c)
            }
            None => (None, Vec::new()),
        };
        let identity = match (&files.client_cert, &files.client_key) {
            (None, None) => None,
            (Some(c), None) => return Err(tls_err(c, "a client certificate needs --otlp-client-key")),
            (None, Some(k)) => return Err(tls_err(k, "a client key needs --otlp-client-cert")),
            (Some(c), Some(k)) => {
                let cert_pem = read(c)?;
                certs(c, &cert_pem)?;
                let key_pem = read(k)?;
                PrivateKeyDer::from_pem_slice(&key_pem)
                    .map_err(|e| tls_err(k, format!("not a PEM private key: {e}")))?;
                Some(Identity { cert_pem, key_pem })
            }
        };
        Ok(Self { ca_pem, ca, identity })
    }

    /// For OTLP/gRPC (tonic): system roots, the extra CA, the client identity.
    pub fn grpc(&self) -> tonic::transport::ClientTlsConfig {
        let mut cfg = tonic::transport::ClientTlsConfig::new().with_native_roots();
        if let Some(pem) = &self.ca_pem {
            cfg = cfg.ca_certificate(tonic::transport::Certificate::from_pem(pem));
        }
        if let Some(id) = &self.identity {
            cfg = cfg.identity(tonic::transport::Identity::from_pem(&id.cert_pem, &id.key_pem));
        }
        cfg
    }

    /// For OTLP/HTTP: a hyper connector speaking TLS with the same roots and identity (plain http:// URLs
    /// still work through it).
    pub fn http_connector(
        &self,
    ) -> Result<hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>, OtelError>
    {
        Ok(hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(self.client_config()?)
            .https_or_http()
            .enable_http1()
            .build())
    }

    /// A rustls client configuration with the system roots, the extra CA and the client identity (also what
    /// `serve`'s Alertmanager poller speaks HTTPS with).
    pub fn client_config(&self) -> Result<rustls::ClientConfig, OtelError> {
        let mut roots = rustls::RootCertStore::empty();
        // Unreadable system certificates are skipped (rustls-native-certs reports them); the extra CA must load.
        let native = rustls_native_certs::load_native_certs();
        roots.add_parsable_certificates(native.certs);
        for c in &self.ca {
            roots
                .add(c.clone())
                .map_err(|e| OtelError::TlsSetup(e.to_string()))?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| OtelError::TlsSetup(e.to_string()))?
            .with_root_certificates(roots);
        let config = match &self.identity {
            None => builder.with_no_client_auth(),
            Some(id) => {
                let chain = CertificateDer::pem_slice_iter(&id.cert_pem)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| OtelError::TlsSetup(e.to_string()))?;
                let key = PrivateKeyDer::from_pem_slice(&id.key_pem)
                    .map_err(|e| OtelError::TlsSetup(e.to_string()))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| OtelError::TlsSetup(format!("client certificate and key: {e}")))?
            }
        };
        Ok(config)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests {
    use super::*;

    #[test]
    fn missing_and_malformed_files_are_named_in_the_error() {
        let dir = std::env::temp_dir().join(format!("llmprof-tls-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let junk = dir.join("junk.pem");
        std::fs::write(&junk, "not a certificate").unwrap();
        let e = TlsMaterial::load(&TlsFiles {
            ca: Some(dir.join("absent.pem")),
            ..Default::default()
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("absent.pem") && e.contains("cannot read"), "{e}");
        let e = TlsMaterial::load(&TlsFiles {
            ca: Some(junk.clone()),
            ..Default::default()
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("junk.pem") && e.contains("no PEM certificate"), "{e}");
        let e = TlsMaterial::load(&TlsFiles {
            client_cert: Some(junk.clone()),
            ..Default::default()
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("--otlp-client-key"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
