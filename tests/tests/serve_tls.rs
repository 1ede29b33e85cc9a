//! `llmprof serve --tls-cert/--tls-key`, against the real binary and curl: the API
//! speaks HTTPS with the operator's certificate, still asks for the token, refuses plain HTTP on that port and
//! keeps answering while a client sits in an unfinished handshake. The certificate is made by openssl
//! (`e2e::serve::Serve::spawn_tls`).

use std::io::Write;
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use e2e::serve::{Serve, TOKEN};
use e2e::{is_root, require};

/// curl over HTTPS: (HTTP status, body); status 0 when the TLS connection itself failed.
fn curl(port: u16, path: &str, ca: Option<&str>, token: Option<&str>) -> (u16, String) {
    let mut c = Command::new("curl");
    c.args(["-sS", "--max-time", "10", "-w", "\n%{http_code}"]);
    if let Some(ca) = ca {
        c.args(["--cacert", ca]);
    }
    if let Some(t) = token {
        c.args(["-H", &format!("Authorization: Bearer {t}")]);
    }
    let out = c
        .arg(format!("https://127.0.0.1:{port}{path}"))
        .output()
        .expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

#[test]
fn serve_speaks_https_with_the_operators_certificate() {
    if !require(is_root(), "not root: llmprof serve needs root") || !e2e::serve::tls_tools() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("llmprof-serve-tls-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // A self-signed certificate for 127.0.0.1 made by openssl (`Serve::spawn_tls`).
    let srv = Serve::spawn_tls(&dir, &[]);
    let cert = srv.tls_cert.clone().expect("HTTPS").display().to_string();

    // A client that opens a connection and never starts its handshake holds up nobody.
    let mut stalled = TcpStream::connect(("127.0.0.1", srv.port)).expect("connect");
    let (code, body) = curl(srv.port, "/healthz", Some(&cert), None);
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        body.trim(),
        r#"{"status":"ok"}"#,
        "without the token /healthz says only that"
    );
    // The token is still required, over TLS too.
    assert_eq!(curl(srv.port, "/v1/sessions", Some(&cert), None).0, 401);
    let (code, body) = curl(srv.port, "/v1/sessions", Some(&cert), Some(TOKEN));
    assert_eq!((code, body.trim()), (200, "[]"));
    // A client that does not trust the certificate gets no answer at all.
    assert_eq!(curl(srv.port, "/healthz", None, None).0, 0);
    // Plain HTTP on the TLS port is not served.
    let r = e2e::http::request(srv.port, "GET", "/healthz", &[], None);
    assert!(
        r.is_err() || r.as_ref().is_ok_and(|r| r.status != 200),
        "plain HTTP answered: {:?}",
        r.map(|r| r.status)
    );
    let _ = stalled.write_all(b"\x16");
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(curl(srv.port, "/healthz", Some(&cert), None).0, 200);
    drop(srv);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn unusable_certificates_are_refused_at_start_with_the_file_named() {
    let dir = std::env::temp_dir().join(format!("llmprof-serve-tls-bad-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let bogus = dir.join("bogus.pem");
    std::fs::write(&bogus, "not a certificate\n").expect("write");
    let out = Command::new(e2e::bin_path("llmprof"))
        .args(["serve", "--out-dir"])
        .arg(dir.join("traces"))
        .arg("--tls-cert")
        .arg(&bogus)
        .arg("--tls-key")
        .arg(&bogus)
        .output()
        .expect("run llmprof serve");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--tls-cert") && err.contains("bogus.pem"), "{err}");
    // --tls-cert without --tls-key is a usage error too.
    let out = Command::new(e2e::bin_path("llmprof"))
        .args(["serve", "--out-dir", "/tmp/x", "--tls-cert"])
        .arg(&bogus)
        .output()
        .expect("run llmprof serve");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--tls-key"));
    let _ = std::fs::remove_dir_all(&dir);
}
