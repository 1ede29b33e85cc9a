//! OTLP over TLS: mutual TLS with a private CA over gRPC, TLS over HTTP, an untrusted collector certificate, an
//! unreadable TLS file.

use super::*;

fn tls_fixture(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tls")
        .join(name)
}

fn pem(name: &str) -> Vec<u8> {
    std::fs::read(tls_fixture(name)).unwrap()
}

/// The OTLP/gRPC receiver behind TLS with the fixture server certificate; with `client_ca`, it also demands a
/// client certificate signed by the fixture CA (mutual TLS).
fn start_grpc_tls_receiver(client_ca: bool) -> (SocketAddr, Received, tokio::runtime::Runtime) {
    let mut tls = tonic::transport::ServerTlsConfig::new().identity(tonic::transport::Identity::from_pem(
        pem("server.pem"),
        pem("server.key"),
    ));
    if client_ca {
        tls = tls.client_ca_root(tonic::transport::Certificate::from_pem(pem("ca.pem")));
    }
    common::start_grpc_receiver_with(Some(tls))
}

/// The OTLP/HTTP receiver behind TLS (rustls on std threads) with the fixture server certificate.
fn start_http_tls_receiver() -> (SocketAddr, Received, Arc<Mutex<HttpSeen>>) {
    use rustls::pki_types::pem::PemObject;
    let chain = rustls::pki_types::CertificateDer::pem_slice_iter(&pem("server.pem"))
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(&pem("server.key")).unwrap();
    let config = Arc::new(
        rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap(),
    );
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let got = Received::default();
    let seen = Arc::new(Mutex::new(HttpSeen::default()));
    let (got2, seen2) = (got.clone(), seen.clone());
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            let (got, seen, config) = (got2.clone(), seen2.clone(), config.clone());
            std::thread::spawn(move || {
                let tls = rustls::ServerConnection::new(config).unwrap();
                serve_http_conn(rustls::StreamOwned::new(tls, conn), &got, &seen);
            });
        }
    });
    (addr, got, seen)
}

fn tls_files(ca: bool, client: bool) -> TlsFiles {
    TlsFiles {
        ca: ca.then(|| tls_fixture("ca.pem")),
        client_cert: client.then(|| tls_fixture("client.pem")),
        client_key: client.then(|| tls_fixture("client.key")),
    }
}

#[test]
fn grpc_over_mutual_tls_with_a_private_ca() {
    let (addr, got, _rt) = start_grpc_tls_receiver(true);
    // As a user configures it: the standard variables name the CA and the client certificate.
    let env: HashMap<&str, String> = [
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("https://localhost:{}", addr.port()),
        ),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc".into()),
        (
            "OTEL_EXPORTER_OTLP_CERTIFICATE",
            tls_fixture("ca.pem").display().to_string(),
        ),
        (
            "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
            tls_fixture("client.pem").display().to_string(),
        ),
        (
            "OTEL_EXPORTER_OTLP_CLIENT_KEY",
            tls_fixture("client.key").display().to_string(),
        ),
    ]
    .into_iter()
    .collect();
    let mut cfg = OtelOptions::default()
        .resolve_with(|k| env.get(k).cloned())
        .unwrap()
        .expect("endpoint configured");
    assert_eq!(cfg.tls, tls_files(true, true));
    cfg.resource_attributes = config(String::new(), OtlpProtocol::Grpc).resource_attributes;
    let clock = WallClock::now().unwrap();
    let mut sink = OtelSink::with_config(&cfg, resource_info(), clock).unwrap();
    let t0_wall = push_fixture(&mut sink, clock);
    let stats = sink.finish();
    assert_eq!(stats.spans_exported, 12, "{stats:?}");
    assert_eq!(stats.export_errors, 0, "{stats:?}");
    check_received(&got.lock().unwrap(), t0_wall);
}

#[test]
fn http_over_tls_with_a_private_ca() {
    let (addr, got, seen) = start_http_tls_receiver();
    let opts = OtelOptions {
        otlp_endpoint: Some(format!("https://localhost:{}", addr.port())),
        otlp_protocol: Some(OtlpProtocol::Http),
        otlp_ca_cert: Some(tls_fixture("ca.pem")),
        ..Default::default()
    };
    let mut cfg = opts.resolve_with(|_| None).unwrap().expect("endpoint configured");
    cfg.resource_attributes = config(String::new(), OtlpProtocol::Http).resource_attributes;
    let clock = WallClock::now().unwrap();
    let mut sink = OtelSink::with_config(&cfg, resource_info(), clock).unwrap();
    let t0_wall = push_fixture(&mut sink, clock);
    let stats = sink.finish();
    assert_eq!(stats.spans_exported, 12, "{stats:?}");
    assert!(seen.lock().unwrap().paths.iter().all(|p| p == "/v1/traces"));
    check_received(&got.lock().unwrap(), t0_wall);
}

#[test]
fn untrusted_collector_certificate_fails_the_export_not_the_session() {
    for protocol in [OtlpProtocol::Grpc, OtlpProtocol::Http] {
        // The fixture CA is not in the system store: without --otlp-ca-cert the handshake must fail.
        let (addr, got, _keep) = match protocol {
            OtlpProtocol::Grpc => {
                let (a, g, rt) = start_grpc_tls_receiver(false);
                (a, g, Some(rt))
            }
            OtlpProtocol::Http => {
                let (a, g, _) = start_http_tls_receiver();
                (a, g, None)
            }
        };
        let endpoint = match protocol {
            OtlpProtocol::Grpc => format!("https://localhost:{}", addr.port()),
            OtlpProtocol::Http => format!("https://localhost:{}/v1/traces", addr.port()),
        };
        let clock = WallClock::now().unwrap();
        let mut sink = OtelSink::with_config(&config(endpoint, protocol), resource_info(), clock).unwrap();
        push_fixture(&mut sink, clock);
        let stats = sink.finish();
        assert_eq!(stats.spans_exported, 0, "{protocol:?}: {stats:?}");
        assert_eq!(stats.spans_dropped, 12, "{protocol:?}: {stats:?}");
        assert!(got.lock().unwrap().is_empty(), "{protocol:?}");
    }
}

#[test]
fn unreadable_tls_file_is_a_clear_error_before_anything_starts() {
    let mut cfg = config("https://localhost:4318/v1/traces".into(), OtlpProtocol::Http);
    cfg.tls.ca = Some(tls_fixture("no-such-ca.pem"));
    let Err(err) = OtelSink::with_config(&cfg, resource_info(), WallClock::now().unwrap()) else {
        panic!("a missing CA file must be refused");
    };
    let err = err.to_string();
    assert!(err.contains("no-such-ca.pem"), "{err}");
}
