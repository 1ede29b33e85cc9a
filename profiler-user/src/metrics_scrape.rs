//! Periodic scrape of the engine's Prometheus `/metrics` into [`MetricsSample`] events.
//!
//! Owns: finding the target's listening TCP ports (the namespace's listeners whose inode is one of
//! the target's socket fds, [`crate::sys::tcp`]), the GET of its /metrics over loopback ([`crate::sys::http`])
//! and parsing the four vLLM gauges we plot. Every GET to a traced server first finds the server's end of the
//! connection (the socket whose peer port is this GET's own local port, and the fd of a traced process holding
//! it) and registers it in the wire family's [`own_conns`] before the request is sent, so the wire view leaves
//! llmprof's own requests out by what no client can forge, not by a header.
//! It runs on its own thread and only sends into a bounded channel (`try_send`, counting what it drops): it
//! never blocks the session loop, and an absent endpoint is one warning, not an error.

use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::capture::wire::own_conns;
use crate::sys::{http, tcp};
use llmprof_trace::clock::boottime_ns;
use llmprof_trace::event::{Event, EventBody, MetricsSample};

/// Default scrape period (Prometheus scrapes far less often; 500 ms gives a useful counter track for a 30 s
/// trace at negligible cost to the engine).
pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(500);
/// How long connecting may take, and then the request and its answer together.
const TIMEOUT: Duration = Duration::from_millis(400);
/// Largest /metrics answer we read (vLLM's is a few tens of KiB).
const MAX_BODY: u64 = 4 << 20;

/// Metric names, as vLLM exposes them (and llmserve copies, see inference/src/metrics.rs).
pub const KV_CACHE_USAGE: &str = "vllm:kv_cache_usage_perc";
/// See [`KV_CACHE_USAGE`].
pub const RUNNING: &str = "vllm:num_requests_running";
/// See [`KV_CACHE_USAGE`].
pub const WAITING: &str = "vllm:num_requests_waiting";
/// See [`KV_CACHE_USAGE`].
pub const PREEMPTIONS: &str = "vllm:num_preemptions_total";

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
    ports_among(&tcp::listeners(None), pid)
}

/// The ports of `listening` ((port, socket inode) of a namespace) whose socket is one of `pid`'s fds.
fn ports_among(listening: &[(u16, u64)], pid: u32) -> Vec<u16> {
    let fds = tcp::socket_fds(pid);
    let mut ports: Vec<u16> = listening
        .iter()
        .filter(|(_, inode)| fds.contains_key(inode))
        .map(|(port, _)| *port)
        .collect();
    ports.sort_unstable();
    ports.dedup();
    ports
}

/// The authority (`IP:PORT`) and path of `http://HOST:PORT/PATH` (loopback and IP literals only: `localhost`
/// is 127.0.0.1, nothing is looked up).
fn split_url(url: &str) -> Option<(String, String)> {
    let rest = url.strip_prefix("http://")?;
    let (hostport, path) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].to_owned()),
        None => (rest, "/".to_owned()),
    };
    let hostport = hostport.replace("localhost", "127.0.0.1");
    let addr: std::net::SocketAddr = hostport
        .parse()
        .ok()
        .or_else(|| format!("{hostport}:80").parse().ok())?;
    Some((addr.to_string(), path))
}

/// How long the server may take to accept llmprof's connection before the GET goes ahead unregistered.
const ACCEPT_WAIT: Duration = Duration::from_millis(200);

/// The server's end of `s` among `pids`: (pid, fd). Waits up to [`ACCEPT_WAIT`] for the server to accept.
fn server_end(s: &TcpStream, pids: &[u32]) -> Option<(u32, i32)> {
    let (client, server) = (s.local_addr().ok()?, s.peer_addr().ok()?);
    let first = *pids.first()?;
    let until = std::time::Instant::now() + ACCEPT_WAIT;
    let inode = loop {
        match tcp::connection(Some(first), server, client) {
            Some(i) => break i,
            None if std::time::Instant::now() < until => std::thread::sleep(Duration::from_millis(2)),
            None => return None,
        }
    };
    pids.iter()
        .find_map(|&pid| Some((pid, *tcp::socket_fds(pid).get(&inode)?)))
}

/// One HTTP GET; the body when the status is 200.
pub fn get(url: &str) -> Option<String> {
    get_from(url, &[])
}

/// One HTTP GET of a server run by `server_pids` (the listener first): the server's end of the connection is
/// registered in [`own_conns`] for as long as the GET lasts. The body when the status is 200.
pub fn get_from(url: &str, server_pids: &[u32]) -> Option<String> {
    let (authority, path) = split_url(url)?;
    let tcp = http::connect(&authority, Instant::now() + TIMEOUT).ok()?;
    let end = server_end(&tcp, server_pids);
    let own = own_conns();
    if let Some((pid, fd)) = end {
        own.open(pid, fd, boottime_ns());
    }
    let req = http::Get {
        authority: &authority,
        path: &path,
        headers: &[
            (
                "User-Agent",
                llmprof_trace::decode::wire::requests::LLMPROF_USER_AGENT,
            ),
            ("Accept", "text/plain"),
        ],
        max_answer: MAX_BODY,
        tls: None,
    };
    let answer = http::get_on(tcp, &req, Instant::now() + TIMEOUT);
    if let Some((pid, fd)) = end {
        own.close(pid, fd, boottime_ns());
    }
    answer.ok().filter(|r| r.status == 200).map(|r| r.body)
}

/// Finds the target's /metrics URL: the first listening port that answers with a vLLM metric.
pub fn discover(pid: u32) -> Option<String> {
    listening_ports(pid)
        .into_iter()
        .map(|p| format!("http://127.0.0.1:{p}/metrics"))
        .find(|u| get_from(u, &[pid]).map(|b| b.contains("vllm:")).unwrap_or(false))
}

/// Finds a /metrics URL among the listening ports of `pids` (a process tree) not in `tried` yet, which it
/// extends: called again as the tree grows (a server's workers listen some time after they start), each
/// port is asked once. The process that listens there and the URL.
pub fn discover_in(pids: &[u32], tried: &mut std::collections::HashSet<(u32, u16)>) -> Option<(u32, String)> {
    let listening = tcp::listeners(None);
    for &pid in pids {
        for port in ports_among(&listening, pid) {
            if !tried.insert((pid, port)) {
                continue;
            }
            let url = format!("http://127.0.0.1:{port}/metrics");
            if get_from(&url, pids).map(|b| b.contains("vllm:")).unwrap_or(false) {
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
                // The listener and its descendants (workers sharing the socket may accept), looked up again
                // now and then as the tree changes.
                let mut servers: Vec<u32> = Vec::new();
                let mut scrapes = 0u32;
                while !stop2.load(Ordering::Relaxed) {
                    if scrapes.is_multiple_of(20) {
                        servers = crate::proctree::descendants(&[pid]);
                    }
                    scrapes = scrapes.wrapping_add(1);
                    if let Some(body) = get_from(&url2, &servers) {
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
    use std::io::{Read, Write};
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

    #[test]
    fn a_get_registers_the_servers_end_of_its_connection_while_it_lasts() {
        use std::os::fd::AsRawFd;
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let me = std::process::id();
        let server = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let fd = s.as_raw_fd();
            let mut b = [0u8; 1024];
            let _ = s.read(&mut b).unwrap();
            let read_at = boottime_ns();
            s.write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok")
                .unwrap();
            (fd, read_at)
        });
        let body = get_from(&format!("http://127.0.0.1:{port}/metrics"), &[me]).unwrap();
        assert_eq!(body, "ok");
        let (fd, read_at) = server.join().unwrap();
        let after = boottime_ns();
        let own = own_conns();
        assert!(own.is_own(me, fd, read_at), "the server's read was llmprof's");
        assert!(!own.is_own(me, fd, after + 1_000_000), "not after the GET ended");
        assert!(!own.is_own(me, fd + 1000, read_at));
    }
}
