//! `llmprof serve` for the tests, and the real Prometheus and Alertmanager around it.
//!
//! [`Serve`] spawns the real binary on a free loopback port with a token and talks to its API;
//! [`prometheus`] and [`alertmanager`] start the Debian packages' daemons on loopback with the rules and routing
//! of `deploy/`, rewritten only where a test cannot wait (see [`fast_rules`] and [`test_alertmanager_config`]).
//! Every daemon is killed on drop.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::http::{self, Response};

/// The token the tests' serve requires.
pub const TOKEN: &str = "e2e-0123456789abcdef";
/// Binary of Debian's `prometheus-alertmanager` package.
pub const ALERTMANAGER: &str = "prometheus-alertmanager";

/// The repository's deploy/ directory.
pub fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// Whether `prog --version` (or `prog version`, openssl's spelling) runs.
pub fn have(prog: &str) -> bool {
    ["--version", "version"].iter().any(|a| {
        Command::new(prog)
            .arg(a)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// Whether the HTTPS tests can run: openssl (the certificate) and curl (the client); else a loud skip.
pub fn tls_tools() -> bool {
    crate::require(
        have("openssl") && have("curl"),
        "openssl and curl are needed (`cargo xtask setup-tools` installs them)",
    )
}

/// A free loopback TCP port (bound and released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// A child process killed on drop.
pub struct Daemon(pub Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A running `llmprof serve`.
pub struct Serve {
    child: Option<Child>,
    /// API port.
    pub port: u16,
    /// `--out-dir`.
    pub out_dir: PathBuf,
    /// Path of the token file.
    pub token_file: PathBuf,
    /// With HTTPS (`spawn_tls`): the certificate, which is its own CA; requests then go through curl.
    pub tls_cert: Option<PathBuf>,
    /// Its stderr so far, line by line (also echoed to the test's stderr).
    stderr: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Serve {
    /// Starts `llmprof serve --listen 127.0.0.1:0 --out-dir DIR/traces --token-file DIR/token EXTRA...` and waits
    /// (60 s at most) for its `listening on` line.
    pub fn spawn(dir: &Path, extra: &[&str]) -> Serve {
        std::fs::create_dir_all(dir).expect("test dir");
        let token_file = dir.join("token");
        std::fs::write(&token_file, format!("{TOKEN}\n")).expect("token file");
        // serve refuses a token file its group or others may read.
        std::fs::set_permissions(&token_file, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .expect("chmod 600 token file");
        let out_dir = dir.join("traces");
        let mut child = Command::new(crate::bin_path("llmprof"))
            .args(["serve", "--listen", "127.0.0.1:0", "--out-dir"])
            .arg(&out_dir)
            .arg("--token-file")
            .arg(&token_file)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn llmprof serve");
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (err_pipe, lines) = (child.stderr.take().expect("stderr"), stderr.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(err_pipe).lines().map_while(Result::ok) {
                eprintln!("{line}");
                lines.lock().unwrap_or_else(|e| e.into_inner()).push(line);
            }
        });
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                eprintln!("[llmprof serve] {line}");
                if let Some(rest) = line
                    .split("listening on http://127.0.0.1:")
                    .nth(1)
                    .or_else(|| line.split("listening on https://127.0.0.1:").nth(1))
                {
                    let port: u16 = rest
                        .split(|c: char| !c.is_ascii_digit())
                        .next()
                        .and_then(|p| p.parse().ok())
                        .unwrap_or(0);
                    let _ = tx.send(port);
                }
            }
        });
        let port = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("llmprof serve did not print `listening on http://127.0.0.1:PORT` within 60 s");
        Serve {
            child: Some(child),
            port,
            out_dir,
            token_file,
            tls_cert: None,
            stderr,
        }
    }

    /// As [`Serve::spawn`], over HTTPS: a self-signed certificate for 127.0.0.1 made by openssl in `dir`
    /// (`DIR/tls.crt`, `DIR/tls.key`), passed with `--tls-cert/--tls-key`.
    pub fn spawn_tls(dir: &Path, extra: &[&str]) -> Serve {
        std::fs::create_dir_all(dir).expect("test dir");
        let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
        let out = Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
            ])
            .args(["-days", "2", "-subj", "/CN=llmprof-e2e", "-addext"])
            .arg("subjectAltName=IP:127.0.0.1,DNS:localhost")
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .output()
            .expect("run openssl");
        assert!(
            out.status.success(),
            "openssl: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let (c, k) = (cert.display().to_string(), key.display().to_string());
        let mut args = vec!["--tls-cert", c.as_str(), "--tls-key", k.as_str()];
        args.extend_from_slice(extra);
        let mut s = Serve::spawn(dir, &args);
        s.tls_cert = Some(cert);
        s
    }

    /// One request to the API: plain HTTP through [`http::request`], or HTTPS through curl trusting the
    /// test certificate.
    fn call(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&str>,
    ) -> std::io::Result<Response> {
        let Some(ca) = &self.tls_cert else {
            return http::request(self.port, method, path, headers, body.map(str::as_bytes));
        };
        let body_file = std::env::temp_dir().join(format!(
            "llmprof-e2e-curl-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let mut cmd = Command::new("curl");
        cmd.args(["-sS", "--max-time", "120", "-X", method, "-D", "-", "--cacert"])
            .arg(ca)
            .arg("-o")
            .arg(&body_file);
        for (k, v) in headers {
            cmd.args(["-H", &format!("{k}: {v}")]);
        }
        if body.is_some() {
            cmd.args(["--data-binary", "@-"]);
        }
        let mut child = cmd
            .arg(format!("https://127.0.0.1:{}{path}", self.port))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        if let (Some(b), Some(mut stdin)) = (body, child.stdin.take()) {
            std::io::Write::write_all(&mut stdin, b.as_bytes())?;
        }
        let out = child.wait_with_output()?;
        if !out.status.success() {
            return Err(std::io::Error::other(format!(
                "curl {method} {path}: {}",
                out.status
            )));
        }
        let head = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut lines = head.lines();
        let status = lines
            .next()
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        let body = std::fs::read(&body_file).unwrap_or_default();
        let _ = std::fs::remove_file(&body_file);
        Ok(Response {
            status,
            headers,
            body,
        })
    }

    /// What serve wrote on stderr so far.
    pub fn stderr_lines(&self) -> Vec<String> {
        self.stderr.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The serve process's pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// POST /v1/alerts with the right token (`auth = Some(TOKEN)`), another one, or none.
    pub fn post_alerts(&self, body: &str, auth: Option<&str>) -> Response {
        let header = auth.map(|t| format!("Bearer {t}"));
        let headers: Vec<(&str, &str)> = header.iter().map(|h| ("Authorization", h.as_str())).collect();
        let mut headers = headers;
        headers.push(("Content-Type", "application/json"));
        self.call("POST", "/v1/alerts", &headers, Some(body))
            .expect("POST /v1/alerts")
    }

    /// GET with the token.
    pub fn get(&self, path: &str) -> Response {
        let h = format!("Bearer {TOKEN}");
        self.call("GET", path, &[("Authorization", &h)], None)
            .expect("GET")
    }

    /// GET `path` with the token, body as bytes (for trace downloads): status and body.
    pub fn download(&self, path: &str) -> (u16, Vec<u8>) {
        let r = self.get(path);
        assert!(
            !r.header("transfer-encoding")
                .is_some_and(|v| v.contains("chunked")),
            "serve sends traces with a length: {:?}",
            r.headers
        );
        (r.status, r.body)
    }

    /// GET /v1/sessions.
    pub fn sessions(&self) -> Vec<Value> {
        let r = self.get("/v1/sessions");
        assert_eq!(r.status, 200, "GET /v1/sessions: {}", r.text());
        match serde_json::from_slice(&r.body).expect("sessions JSON") {
            Value::Array(a) => a,
            other => panic!("sessions is not an array: {other}"),
        }
    }

    /// GET /metrics (text).
    pub fn metrics(&self) -> String {
        self.call("GET", "/metrics", &[], None)
            .expect("GET /metrics")
            .text()
    }

    /// GET /healthz with the token (JSON, with the detail: sessions, disk, flight recorders).
    pub fn healthz(&self) -> Value {
        let r = self.get("/healthz");
        assert_eq!(r.status, 200, "healthz: {}", r.text());
        serde_json::from_slice(&r.body).expect("healthz JSON")
    }

    /// Polls the sessions until `pred` holds for one of them (returns it) or `timeout` passes (panics).
    pub fn wait_session(&self, timeout: Duration, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let all = self.sessions();
            if let Some(s) = all.iter().find(|s| pred(s)) {
                return s.clone();
            }
            assert!(
                Instant::now() < deadline,
                "no session {what} within {timeout:?}; sessions: {all:#?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Stops serve like systemd does (SIGTERM) and returns its exit status.
    pub fn stop(mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        // SAFETY: kill(2) with the pid of our own child and SIGTERM has no memory-safety preconditions.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        child.wait().expect("wait for llmprof serve")
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// deploy/prometheus/llmprof-alerts.rules.yml with every `for:` shortened to `for` and every
/// `llmprof_duration` set to `duration`, so an alert fires within seconds; expressions, thresholds, labels and
/// the other annotations are the deployed ones.
pub fn fast_rules(for_: &str, duration: &str) -> String {
    let text = std::fs::read_to_string(deploy_dir().join("prometheus/llmprof-alerts.rules.yml"))
        .expect("deploy/prometheus/llmprof-alerts.rules.yml");
    text.lines()
        .map(|l| {
            let indent = &l[..l.len() - l.trim_start().len()];
            if l.trim_start().starts_with("for:") {
                format!("{indent}for: {for_}")
            } else if l.trim_start().starts_with("llmprof_duration:") {
                format!("{indent}llmprof_duration: {duration}")
            } else {
                l.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// deploy/alertmanager/alertmanager.yml pointed at the test's serve (HTTPS), token and certificate, with grouping
/// waits of seconds.
pub fn test_alertmanager_config(serve_port: u16, token_file: &Path, tls_cert: &Path) -> String {
    let text = std::fs::read_to_string(deploy_dir().join("alertmanager/alertmanager.yml"))
        .expect("deploy/alertmanager/alertmanager.yml");
    text.replace(
        "https://127.0.0.1:9464/v1/alerts",
        &format!("https://127.0.0.1:{serve_port}/v1/alerts"),
    )
    .replace("/etc/llmprof/token", &token_file.display().to_string())
    .replace("/etc/llmprof/tls.crt", &tls_cert.display().to_string())
    .replace("group_wait: 30s", "group_wait: 1s")
    .replace("group_wait: 10s", "group_wait: 1s")
    .replace("group_interval: 5m", "group_interval: 2s")
    .replace("group_interval: 1m", "group_interval: 2s")
}

fn wait_http(port: u16, path: &str, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        // Not listening yet: a connection error.
        if http::get(port, path).is_ok_and(|r| r.status == 200) {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("{what} did not answer {path} on 127.0.0.1:{port} within 60 s");
}

/// Starts Alertmanager on a free loopback port with `config` (clustering off); returns it and its port.
pub fn alertmanager(dir: &Path, config: &str) -> (Daemon, u16) {
    std::fs::create_dir_all(dir.join("am-data")).expect("am dir");
    let cfg = dir.join("alertmanager.yml");
    std::fs::write(&cfg, config).expect("alertmanager.yml");
    let port = free_port();
    let child = Command::new(ALERTMANAGER)
        .arg(format!("--config.file={}", cfg.display()))
        .arg(format!("--storage.path={}", dir.join("am-data").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--cluster.listen-address=")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn prometheus-alertmanager");
    let d = Daemon(child);
    wait_http(port, "/-/ready", "alertmanager");
    (d, port)
}

/// Starts Prometheus on a free loopback port scraping `engine_port` every second, evaluating `rules` every
/// second and sending alerts to `am_port`; returns it and its port.
pub fn prometheus(dir: &Path, engine_port: u16, rules: &str, am_port: u16) -> (Daemon, u16) {
    prometheus_targets(dir, &[format!("127.0.0.1:{engine_port}")], rules, am_port)
}

/// [`prometheus`] scraping several engines (`host:port` each; the `instance` label of their alerts).
pub fn prometheus_targets(dir: &Path, targets: &[String], rules: &str, am_port: u16) -> (Daemon, u16) {
    std::fs::create_dir_all(dir.join("prom-data")).expect("prom dir");
    let rules_file = dir.join("rules.yml");
    std::fs::write(&rules_file, rules).expect("rules");
    let cfg = dir.join("prometheus.yml");
    std::fs::write(
        &cfg,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\n\
             alerting:\n  alertmanagers:\n    - static_configs:\n        - targets: ['127.0.0.1:{am_port}']\n\
             scrape_configs:\n  - job_name: llmserve\n    static_configs:\n      - targets: [{}]\n",
            rules_file.display(),
            targets
                .iter()
                .map(|t| format!("'{t}'"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    )
    .expect("prometheus.yml");
    let port = free_port();
    let child = Command::new("prometheus")
        .arg(format!("--config.file={}", cfg.display()))
        .arg(format!("--storage.tsdb.path={}", dir.join("prom-data").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn prometheus");
    let d = Daemon(child);
    wait_http(port, "/-/ready", "prometheus");
    (d, port)
}

/// A Prometheus counter of serve's /metrics (0 when absent).
pub fn counter(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series).and_then(|r| r.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}
