//! Usage-stats reporting: the engine's one outbound connection, off by default.
//!
//! Serving engines phone home (vLLM reports usage statistics to its maintainers unless told not to); this is the
//! kind of egress an SRE wants to see on a timeline. With `--usage-stats-url http://HOST:PORT/PATH` the engine
//! POSTs a small JSON document (model, uptime, counters; never prompts or completions) at start-up and then every
//! `--usage-stats-interval`. It runs on its own thread, with short timeouts, and never touches the step loop: a
//! failed report is logged once and retried at the next interval.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::metrics::Metrics;

/// Connect/read/write timeout of one report.
const REPORT_TIMEOUT: Duration = Duration::from_secs(2);

/// Errors of the reporter's configuration.
#[derive(Debug, thiserror::Error)]
pub enum UsageStatsError {
    /// Only `http://host:port/path` URLs are supported.
    #[error("usage-stats URL {0:?} is not of the form http://HOST[:PORT][/PATH]")]
    BadUrl(String),
}

/// A parsed `http://` destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    host: String,
    port: u16,
    path: String,
}

impl Target {
    /// Parses `http://HOST[:PORT][/PATH]`.
    pub fn parse(url: &str) -> Result<Self, UsageStatsError> {
        let bad = || UsageStatsError::BadUrl(url.to_string());
        let rest = url.strip_prefix("http://").ok_or_else(bad)?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) => (h, p.parse().map_err(|_| bad())?),
            None => (authority, 80),
        };
        if host.is_empty() {
            return Err(bad());
        }
        Ok(Self {
            host: host.to_string(),
            port,
            path: path.to_string(),
        })
    }
}

/// Starts the reporter thread.
pub fn start(
    target: Target,
    interval: Duration,
    model: String,
    metrics: Arc<Metrics>,
) -> std::io::Result<()> {
    let started = Instant::now();
    std::thread::Builder::new().name("llmserve-usage".into()).spawn(move || {
        let mut warned = false;
        loop {
            let body = format!(
                r#"{{"engine":"llmserve","version":"{}","model":{:?},"uptime_s":{:.0},"preemptions":{}}}"#,
                env!("CARGO_PKG_VERSION"),
                model,
                started.elapsed().as_secs_f64(),
                metrics.preemptions()
            );
            match report(&target, &body) {
                Ok(()) => warned = false,
                Err(e) if !warned => {
                    eprintln!("llmserve: usage-stats report to {}:{} failed: {e}", target.host, target.port);
                    warned = true;
                }
                Err(_) => {}
            }
            std::thread::sleep(interval);
        }
    })?;
    Ok(())
}

fn report(t: &Target, body: &str) -> std::io::Result<()> {
    let addr = (t.host.as_str(), t.port)
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| std::io::Error::other("no address"))?;
    let mut s = TcpStream::connect_timeout(&addr, REPORT_TIMEOUT)?;
    s.set_write_timeout(Some(REPORT_TIMEOUT))?;
    s.set_read_timeout(Some(REPORT_TIMEOUT))?;
    write!(
        s,
        "POST {} HTTP/1.1\r\nHost: {}:{}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        t.path,
        t.host,
        t.port,
        body.len()
    )?;
    // Read (and discard) whatever answer comes; a peer that closes at once is fine.
    let mut buf = [0u8; 512];
    let _ = s.read(&mut buf);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_http_urls() {
        let t = Target::parse("http://127.0.0.1:9000/usage").expect("valid");
        assert_eq!(
            (t.host.as_str(), t.port, t.path.as_str()),
            ("127.0.0.1", 9000, "/usage")
        );
        let t = Target::parse("http://stats.example").expect("valid");
        assert_eq!((t.port, t.path.as_str()), (80, "/"));
        assert!(Target::parse("https://x").is_err());
        assert!(Target::parse("http://:80/").is_err());
        assert!(Target::parse("http://h:notaport/").is_err());
    }

    #[test]
    fn reports_reach_a_listener() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        let t = Target::parse(&format!("http://127.0.0.1:{port}/u")).expect("valid");
        let h = std::thread::spawn(move || {
            let (mut c, _) = l.accept().expect("accept");
            let mut s = String::new();
            let _ = c.read_to_string(&mut s);
            s
        });
        report(&t, r#"{"a":1}"#).expect("report");
        let got = h.join().expect("join");
        assert!(
            got.starts_with("POST /u HTTP/1.1") && got.ends_with(r#"{"a":1}"#),
            "{got}"
        );
    }
}
