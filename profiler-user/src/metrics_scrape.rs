//! Periodic scrape of the engine's Prometheus `/metrics` into [`MetricsSample`] events.
//!
//! Owns: finding the target's listening TCP ports (LISTEN sockets of `/proc/net/tcp{,6}` whose inode is one of
//! the target's socket fds), a minimal HTTP/1.0 GET over loopback, and parsing the four vLLM gauges we plot.
//! It runs on its own thread and only sends into a bounded channel (`try_send`, counting what it drops): it
//! never blocks the session loop, and an absent endpoint is one warning, not an error.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::procfs;
use llmprof_trace::clock::boottime_ns;
use llmprof_trace::event::{Event, EventBody, MetricsSample};

/// Default scrape period (Prometheus scrapes far less often; 500 ms gives a useful counter track for a 30 s
/// trace at negligible cost to the engine).
pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(500);
/// Connect/read timeout of one scrape.
const TIMEOUT: Duration = Duration::from_millis(400);
/// Largest /metrics body we read (vLLM's is a few tens of KiB).
const MAX_BODY: u64 = 4 << 20;

/// Metric names, as vLLM exposes them (and llmserve copies, see inference/src/metrics.rs).
pub const KV_CACHE_USAGE: &str = "vllm:kv_cache_usage_perc";
/// See [`KV_CACHE_USAGE`].
pub const RUNNING: &str = "vllm:num_requests_running";
/// See [`KV_CACHE_USAGE`].
pub const WAITING: &str = "vllm:num_requests_waiting";
/// See [`KV_CACHE_USAGE`].
pub const PREEMPTIONS: &str = "vllm:num_preemptions_total";

/// TCP state LISTEN in /proc/net/tcp (include/net/tcp_states.h: TCP_LISTEN = 10).
const TCP_LISTEN: &str = "0A";

/// Parses Prometheus text exposition: sums every series of each metric we plot (labels ignored).
pub fn parse(text: &str) -> MetricsSample {
    let mut s = MetricsSample::default();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let name = &line[..name_end];
        let rest = match line[name_end..].rfind('}') {
            Some(i) => &line[name_end + i + 1..],
            None => &line[name_end..],
        };
        let Some(v) = rest.split_whitespace().next().and_then(|v| v.parse::<f64>().ok()) else {
            continue;
        };
        let slot = match name {
            KV_CACHE_USAGE => &mut s.kv_cache_usage,
            RUNNING => &mut s.running,
            WAITING => &mut s.waiting,
            PREEMPTIONS => &mut s.preemptions_total,
            _ => continue,
        };
        *slot = Some(slot.unwrap_or(0.0) + v);
    }
    s
}

/// Local TCP ports the process listens on (IPv4 and IPv6).
pub fn listening_ports(pid: u32) -> Vec<u16> {
    let inodes = procfs::socket_inodes(pid);
    let mut ports = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for (port, inode) in listening_sockets(&text) {
            if inodes.contains(&inode) && !ports.contains(&port) {
                ports.push(port);
            }
        }
    }
    ports.sort_unstable();
    ports
}

/// The LISTEN sockets of one `/proc/net/tcp` or `/proc/net/tcp6` table: (local port, socket inode).
pub fn listening_sockets(table: &str) -> Vec<(u16, u64)> {
    let mut out = Vec::new();
    for line in table.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
        if f.len() < 10 || f[3] != TCP_LISTEN {
            continue;
        }
        let Ok(inode) = f[9].parse::<u64>() else { continue };
        if let Some(port) = f[1]
            .rsplit(':')
            .next()
            .and_then(|p| u16::from_str_radix(p, 16).ok())
        {
            out.push((port, inode));
        }
    }
    out
}

/// Splits `http://HOST:PORT/PATH` into a socket address and a path (loopback/IP literals only).
fn split_url(url: &str) -> Option<(SocketAddr, String)> {
    let rest = url.strip_prefix("http://")?;
    let (hostport, path) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].to_owned()),
        None => (rest, "/".to_owned()),
    };
    let hostport = hostport.replace("localhost", "127.0.0.1");
    let addr = hostport
        .parse()
        .ok()
        .or_else(|| format!("{hostport}:80").parse().ok())?;
    Some((addr, path))
}

/// One HTTP GET; the body when the status is 200.
pub fn get(url: &str) -> Option<String> {
    let (addr, path) = split_url(url)?;
    let mut s = TcpStream::connect_timeout(&addr, TIMEOUT).ok()?;
    s.set_read_timeout(Some(TIMEOUT)).ok()?;
    s.set_write_timeout(Some(TIMEOUT)).ok()?;
    let req = format!(
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\nUser-Agent: {ua}\r\nAccept: text/plain\r\n\r\n",
        ua = llmprof_trace::wire::LLMPROF_USER_AGENT
    );
    s.write_all(req.as_bytes()).ok()?;
    let mut buf = Vec::new();
    s.take(MAX_BODY).read_to_end(&mut buf).ok()?;
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?;
    (status == "200").then(|| body.to_owned())
}

/// Finds the target's /metrics URL: the first listening port that answers with a vLLM metric.
pub fn discover(pid: u32) -> Option<String> {
    listening_ports(pid)
        .into_iter()
        .map(|p| format!("http://127.0.0.1:{p}/metrics"))
        .find(|u| get(u).map(|b| b.contains("vllm:")).unwrap_or(false))
}

/// Finds a /metrics URL among the listening ports of `pids` (a process tree) not in `tried` yet, which it
/// extends: called again as the tree grows (a server's workers listen some time after they start), each
/// port is asked once. The process that listens there and the URL.
pub fn discover_in(pids: &[u32], tried: &mut std::collections::HashSet<(u32, u16)>) -> Option<(u32, String)> {
    let tables: Vec<String> = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|t| std::fs::read_to_string(t).ok())
        .collect();
    let listening: Vec<(u16, u64)> = tables.iter().flat_map(|t| listening_sockets(t)).collect();
    for &pid in pids {
        let inodes = procfs::socket_inodes(pid);
        let mut ports: Vec<u16> = listening
            .iter()
            .filter(|(_, i)| inodes.contains(i))
            .map(|(p, _)| *p)
            .collect();
        ports.sort_unstable();
        ports.dedup();
        for port in ports {
            if !tried.insert((pid, port)) {
                continue;
            }
            let url = format!("http://127.0.0.1:{port}/metrics");
            if get(&url).map(|b| b.contains("vllm:")).unwrap_or(false) {
                return Some((pid, url));
            }
        }
    }
    None
}

/// The running scraper thread.
pub struct Scraper {
    stop: Arc<AtomicBool>,
    dropped: Arc<AtomicU64>,
    handle: Option<JoinHandle<()>>,
    /// The URL being scraped.
    pub url: String,
}

impl Scraper {
    /// Scrapes `url` every `interval`, sending a [`EventBody::Metrics`] event for `pid` per successful scrape.
    pub fn spawn(pid: u32, url: String, interval: Duration, tx: SyncSender<Event>) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let dropped = Arc::new(AtomicU64::new(0));
        let (stop2, dropped2, url2) = (stop.clone(), dropped.clone(), url.clone());
        let handle = std::thread::Builder::new()
            .name("llmprof-metrics".into())
            .spawn(move || {
                while !stop2.load(Ordering::Relaxed) {
                    if let Some(body) = get(&url2) {
                        let ev = Event {
                            ts_ns: boottime_ns(),
                            pid,
                            tid: 0,
                            body: EventBody::Metrics(parse(&body)),
                        };
                        match tx.try_send(ev) {
                            Ok(()) => {}
                            Err(TrySendError::Full(_)) => {
                                dropped2.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(TrySendError::Disconnected(_)) => return,
                        }
                    }
                    // Sleep in small slices so stop is prompt.
                    let mut left = interval;
                    while !left.is_zero() && !stop2.load(Ordering::Relaxed) {
                        let d = left.min(Duration::from_millis(50));
                        std::thread::sleep(d);
                        left -= d;
                    }
                }
            })?;
        Ok(Self {
            stop,
            dropped,
            handle: Some(handle),
            url,
        })
    }

    /// Samples dropped because the session queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

impl Drop for Scraper {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests {
    use super::*;
    use std::net::TcpListener;

    const SAMPLE: &str = "# HELP vllm:kv_cache_usage_perc KV-cache usage.\n# TYPE vllm:kv_cache_usage_perc gauge\n\
vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"smollm2\"} 0.25\n\
vllm:num_requests_running{engine=\"0\",model_name=\"smollm2\"} 3\n\
vllm:num_requests_waiting{model_name=\"smollm2\"} 1\n\
vllm:num_preemptions_total{model_name=\"smollm2\"} 7\n\
vllm:num_requests_running_other 99\n";

    #[test]
    fn parses_the_vllm_gauges() {
        let s = parse(SAMPLE);
        assert_eq!(s.kv_cache_usage, Some(0.25));
        assert_eq!(s.running, Some(3.0));
        assert_eq!(s.waiting, Some(1.0));
        assert_eq!(s.preemptions_total, Some(7.0));
        assert_eq!(parse("nothing 1\n"), MetricsSample::default());
    }

    #[test]
    fn finds_our_own_listening_port_and_scrapes_it() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        assert!(listening_ports(std::process::id()).contains(&port));
        let server = std::thread::spawn(move || {
            for _ in 0..2 {
                let (mut s, _) = l.accept().unwrap();
                let mut b = [0u8; 1024];
                let _ = s.read(&mut b).unwrap();
                let resp = format!(
                    "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n{SAMPLE}",
                    SAMPLE.len()
                );
                s.write_all(resp.as_bytes()).unwrap();
            }
        });
        let url = discover(std::process::id()).expect("discovered");
        assert_eq!(url, format!("http://127.0.0.1:{port}/metrics"));
        assert_eq!(parse(&get(&url).unwrap()).running, Some(3.0));
        server.join().unwrap();
        // Nothing listening: no body, no panic.
        assert!(get("http://127.0.0.1:1/metrics").is_none());
    }
}
