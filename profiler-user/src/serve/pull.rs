//! Fleet mode: `llmprof serve --alertmanager-url URL` pulls alerts from Alertmanager's v2 API instead of (or
//! besides) receiving its webhook, so one Alertmanager serves every node without a receiver per node.
//!
//! Every `--alertmanager-poll` (bounded: [`MIN_INTERVAL`]..=[`MAX_INTERVAL`]) one thread asks
//! `GET URL/api/v2/alerts?active=true&silenced=false&inhibited=false&filter=...` of the URLs in turn (HA: the
//! first that answers 200 counts), with the `Authorization` header of `--alertmanager-auth-file` (a secret:
//! root's, mode 600, like the token), over HTTPS for `https://` URLs (rustls with the system roots and
//! `--alertmanager-ca-cert`, the OTLP exporter's stack). A poll has one deadline ([`POLL_DEADLINE`]) for all
//! its URLs, name lookups, connections and reads together: an Alertmanager (or something pretending to be
//! one) that trickles its answer a byte at a time ends the poll at the deadline, and a poll still stuck then
//! is left to end on its own while the next ones are skipped. Each active
//! alert not handled before is checked with the webhook's own rules ([`Manager::is_local`]: the target resolves
//! on this node and the allow-list lets it be traced); anything else belongs to another node and is ignored
//! (not a failed session). A local alert is recorded as handled in `OUT_DIR/.alertmanager-handled` (its
//! fingerprint and `startsAt`, written and synced *before* its session starts), then handed to the manager like a
//! webhook's firing alert. A handled alert that is no longer active is handed over as resolved (its running
//! session ends early). After a restart the file is read back: an alert traced before is not traced again.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::manager::{MAX_ALERTS_PER_BATCH, Manager, Outcome};
use super::say;
use super::webhook::{Alert, AlertStatus};
use crate::sys::http;

/// Shortest polling interval accepted.
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);
/// Longest polling interval accepted.
pub const MAX_INTERVAL: Duration = Duration::from_secs(300);
/// Default polling interval.
pub const DEFAULT_INTERVAL: &str = "10s";
/// Default filter: the alerts deploy/'s rules mark for llmprof.
pub const DEFAULT_FILTER: &str = "llmprof=\"trace\"";
/// Everything one poll may take: every URL's name lookup, connection, TLS handshake and answer together.
pub const POLL_DEADLINE: Duration = Duration::from_secs(10);
/// Largest answer read, head and body (a few thousand alerts).
const MAX_BODY: u64 = 16 << 20;
/// The handled-alerts file in the output directory.
pub const HANDLED_FILE: &str = ".alertmanager-handled";
/// Most handled alerts remembered (the oldest no longer active are forgotten first).
const MAX_HANDLED: usize = 10_000;

/// What fleet mode was asked for (`urls` empty: off).
#[derive(Clone, Debug, Default)]
pub struct PullConfig {
    /// Alertmanager base URLs (`http://host:port[/prefix]`), tried in order.
    pub urls: Vec<String>,
    /// Polling interval.
    pub interval: Duration,
    /// File whose content is the `Authorization` header value (a lone token is sent as `Bearer TOKEN`).
    pub auth_file: Option<PathBuf>,
    /// PEM certificates trusted besides the system roots for `https://` URLs (a private CA).
    pub ca_file: Option<PathBuf>,
    /// Alertmanager matchers (`name="value"`, `name=~"re"`), all must match.
    pub filters: Vec<String>,
}

/// One Alertmanager URL, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct AmUrl {
    /// `https://`.
    pub tls: bool,
    /// The host (for TLS: the name the certificate must carry).
    pub host: String,
    /// `host:port`.
    pub authority: String,
    /// Path prefix without trailing `/` (empty for the root).
    pub prefix: String,
}

/// Parses `http[s]://host[:port][/prefix]`.
pub fn parse_url(url: &str) -> Result<AmUrl, String> {
    let (tls, rest) = match (url.strip_prefix("https://"), url.strip_prefix("http://")) {
        (Some(r), _) => (true, r),
        (None, Some(r)) => (false, r),
        _ => {
            return Err(format!(
                "--alertmanager-url {url}: expected http[s]://HOST:PORT[/PREFIX]"
            ));
        }
    };
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    if authority.is_empty() {
        return Err(format!("--alertmanager-url {url}: no host"));
    }
    let (host, authority) = match authority.rsplit_once(':') {
        Some((h, p)) if p.parse::<u16>().is_ok() && !h.is_empty() => (h, authority.to_owned()),
        _ => (authority, format!("{authority}:{}", if tls { 443 } else { 80 })),
    };
    Ok(AmUrl {
        tls,
        host: host.trim_start_matches('[').trim_end_matches(']').to_owned(),
        authority,
        prefix: match path.trim_matches('/') {
            "" => String::new(),
            p => format!("/{p}"),
        },
    })
}

/// The `Authorization` value from the auth file (a secret: see [`super::auth::read_secret`]).
pub fn read_auth(path: &Path) -> Result<String, String> {
    let bytes = super::auth::read_secret(path, "--alertmanager-auth-file").map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&bytes);
    let v = text.trim();
    if v.is_empty() {
        return Err(format!("--alertmanager-auth-file {}: empty", path.display()));
    }
    if v.contains(['\r', '\n']) {
        return Err(format!(
            "--alertmanager-auth-file {}: one line expected (a token or `Scheme credentials`)",
            path.display()
        ));
    }
    Ok(if v.contains(' ') {
        v.to_owned()
    } else {
        format!("Bearer {v}")
    })
}

/// Fleet mode's options, checked: URLs parsed, credentials read, the TLS configuration built.
#[derive(Clone, Debug)]
pub struct Checked {
    /// As asked.
    pub cfg: PullConfig,
    /// The URLs.
    pub urls: Vec<AmUrl>,
    /// The `Authorization` value.
    pub auth: Option<String>,
    /// For `https://` URLs.
    pub tls: Arc<rustls::ClientConfig>,
}

impl Checked {
    /// Checks `cfg` (what `serve --check-config` reports).
    pub fn new(cfg: &PullConfig) -> Result<Checked, String> {
        let urls = cfg
            .urls
            .iter()
            .map(|u| parse_url(u))
            .collect::<Result<Vec<_>, _>>()?;
        let auth = cfg.auth_file.as_deref().map(read_auth).transpose()?;
        let tls = tls_config(cfg.ca_file.as_deref())?;
        Ok(Checked {
            cfg: cfg.clone(),
            urls,
            auth,
            tls,
        })
    }
}

/// The rustls configuration `https://` URLs are polled with (system roots and `--alertmanager-ca-cert`).
pub fn tls_config(ca_file: Option<&Path>) -> Result<Arc<rustls::ClientConfig>, String> {
    let files = crate::otel::tls::TlsFiles {
        ca: ca_file.map(Path::to_path_buf),
        ..Default::default()
    };
    let material = crate::otel::tls::TlsMaterial::load(&files)
        .map_err(|e| format!("--alertmanager-ca-cert: {}", crate::causes::one_line(&e)))?;
    material
        .client_config()
        .map(Arc::new)
        .map_err(|e| crate::causes::one_line(&e))
}

/// Percent-encodes a query value.
fn encode(v: &str) -> String {
    let mut out = String::new();
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The request path of the alert list.
pub fn alerts_path(url: &AmUrl, filters: &[String]) -> String {
    let mut p = format!(
        "{}/api/v2/alerts?active=true&silenced=false&inhibited=false&unprocessed=false",
        url.prefix
    );
    for f in filters {
        p.push_str("&filter=");
        p.push_str(&encode(f));
    }
    p
}

/// One alert of `GET /api/v2/alerts` (the fields serve uses).
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AmAlert {
    /// Labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Annotations.
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// Identity of the alert.
    pub fingerprint: String,
    /// RFC 3339 start (a new firing of the same alert has a new one).
    #[serde(default)]
    pub starts_at: String,
    /// RFC 3339 end.
    #[serde(default)]
    pub ends_at: String,
    /// Link to the expression.
    #[serde(default, rename = "generatorURL")]
    pub generator_url: String,
    /// `{state: active|suppressed|unprocessed}`.
    #[serde(default)]
    pub status: AmStatus,
}

/// The state of an alert in Alertmanager.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct AmStatus {
    /// `active`, `suppressed` or `unprocessed`.
    #[serde(default)]
    pub state: String,
}

impl AmAlert {
    /// The webhook's shape of this alert.
    pub fn to_alert(&self, status: AlertStatus) -> Alert {
        Alert {
            status,
            labels: self.labels.clone(),
            annotations: self.annotations.clone(),
            starts_at: self.starts_at.clone(),
            ends_at: self.ends_at.clone(),
            generator_url: self.generator_url.clone(),
            fingerprint: self.fingerprint.clone(),
        }
    }
}

/// One GET of `path` on `url` ([`crate::sys::http`], over TLS for an `https://` URL); `Ok(body)` on 200.
/// Every step is bounded by `deadline`.
fn get(
    url: &AmUrl,
    path: &str,
    auth: Option<&str>,
    tls: &Arc<rustls::ClientConfig>,
    deadline: Instant,
) -> Result<String, String> {
    let authority = &url.authority;
    let mut headers = vec![("Accept", "application/json")];
    headers.extend(auth.map(|a| ("Authorization", a)));
    let req = http::Get {
        authority,
        path,
        headers: &headers,
        max_answer: MAX_BODY,
        tls: url.tls.then_some((url.host.as_str(), tls)),
    };
    let answer = http::get(&req, deadline).map_err(|e| match e {
        http::HttpError::TimedOut => format!("{authority}: no answer within the poll's {POLL_DEADLINE:?}"),
        e => format!("{authority}: {e}"),
    })?;
    if answer.status != 200 {
        return Err(format!(
            "{authority}: HTTP {}: {}",
            answer.status,
            answer.body.chars().take(200).collect::<String>()
        ));
    }
    Ok(answer.body)
}

/// The handled alerts (fingerprint → `startsAt`), kept in [`HANDLED_FILE`].
#[derive(Debug, Default)]
pub struct Handled {
    path: PathBuf,
    map: HashMap<String, String>,
    /// Insertion order, for forgetting the oldest.
    order: Vec<String>,
}

impl Handled {
    /// Reads the file of `out_dir` (missing: nothing handled yet).
    pub fn load(out_dir: &Path) -> Handled {
        let path = out_dir.join(HANDLED_FILE);
        let mut h = Handled {
            path,
            ..Handled::default()
        };
        if let Ok(text) = std::fs::read_to_string(&h.path) {
            for line in text.lines() {
                if let Some((fp, starts)) = line.split_once(' ') {
                    h.remember(fp, starts);
                }
            }
        }
        h
    }

    fn remember(&mut self, fp: &str, starts: &str) {
        if self.map.insert(fp.to_owned(), starts.to_owned()).is_none() {
            self.order.push(fp.to_owned());
        }
    }

    /// Whether this firing of the alert was handled.
    pub fn contains(&self, fp: &str, starts: &str) -> bool {
        self.map.get(fp).is_some_and(|s| s == starts)
    }

    /// Forgets one alert (it was not traced for a passing reason: the session cap) and writes the file.
    pub fn forget(&mut self, fp: &str) -> std::io::Result<()> {
        self.map.remove(fp);
        self.order.retain(|f| f != fp);
        self.write()
    }

    /// Records one firing and writes the file (a new file renamed over the old one, synced).
    pub fn insert(&mut self, fp: &str, starts: &str, active: &HashSet<String>) -> std::io::Result<()> {
        self.remember(fp, starts);
        if self.order.len() > MAX_HANDLED {
            let mut drop_n = self.order.len() - MAX_HANDLED;
            let map = &mut self.map;
            self.order.retain(|f| {
                if drop_n > 0 && !active.contains(f) {
                    drop_n -= 1;
                    map.remove(f);
                    false
                } else {
                    true
                }
            });
        }
        self.write()
    }

    /// A new file (created by [`crate::files::create_trace`]: `O_EXCL | O_NOFOLLOW`, 0600, never through a
    /// planted link) renamed over the old one, synced. A name left at the temporary path (a crash, or a
    /// link someone planted) is removed first: `unlink` removes a link, never what it points to.
    fn write(&self) -> std::io::Result<()> {
        let tmp = self.path.with_extension("tmp");
        match std::fs::remove_file(&tmp) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        {
            let mut f = crate::files::create_trace(&tmp)?;
            for fp in &self.order {
                if let Some(s) = self.map.get(fp) {
                    writeln!(f, "{fp} {s}")?;
                }
            }
            f.sync_all()?;
        }
        std::fs::rename(&tmp, &self.path)
    }
}

/// The polling thread.
pub struct Poller {
    handle: Option<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
}

impl Poller {
    /// Starts polling (URLs, the auth file and the CA were checked by `ServeOptions::from_config`).
    pub fn spawn(checked: Checked, manager: Arc<Manager>, out_dir: &Path) -> std::io::Result<Poller> {
        let stop = Arc::new(AtomicBool::new(false));
        let handled = Handled::load(out_dir);
        eprintln!(
            "llmprof serve: pulling alerts from {} every {:?} ({} handled before)",
            checked.cfg.urls.join(", "),
            checked.cfg.interval,
            handled.map.len()
        );
        let s = stop.clone();
        let handle = std::thread::Builder::new()
            .name("llmprof-serve-pull".into())
            .spawn(move || poll_loop(&checked, &manager, handled, &s))?;
        Ok(Poller {
            handle: Some(handle),
            stop,
        })
    }

    /// Stops the thread (before the manager's shutdown, so nothing starts meanwhile).
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn poll_loop(checked: &Checked, manager: &Arc<Manager>, mut handled: Handled, stop: &AtomicBool) {
    // Alerts this node handled and that were active at the last poll (their resolution ends the session).
    let mut active_local: HashMap<String, AmAlert> = HashMap::new();
    // Firings that belong to another node: not resolved again every poll.
    let mut remote: HashSet<(String, String)> = HashSet::new();
    let mut failing = false;
    let busy = Arc::new(AtomicBool::new(false));
    while !stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        match fetch_bounded(checked, &busy) {
            Ok(alerts) => {
                if failing {
                    eprintln!("llmprof serve: Alertmanager answers again");
                    failing = false;
                }
                let outcomes = apply(&alerts, manager, &mut handled, &mut active_local, &mut remote);
                for (fp, o) in outcomes {
                    say::line(&format!("pulled alert {fp}: {}", describe(&o)));
                }
            }
            Err(e) => {
                if !failing {
                    eprintln!("llmprof serve: no Alertmanager answered: {e}");
                    failing = true;
                }
            }
        }
        while !stop.load(Ordering::Relaxed) && started.elapsed() < checked.cfg.interval {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// [`fetch`] on a worker, given up at [`POLL_DEADLINE`] (a name lookup cannot be bounded otherwise); while a
/// given-up poll is still stuck, polls are skipped.
fn fetch_bounded(checked: &Checked, busy: &Arc<AtomicBool>) -> Result<Vec<AmAlert>, String> {
    if busy.swap(true, Ordering::AcqRel) {
        return Err(format!(
            "a poll given up after {POLL_DEADLINE:?} is still stuck; skipped"
        ));
    }
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let (c, b) = (checked.clone(), busy.clone());
    let spawned = std::thread::Builder::new()
        .name("llmprof-serve-poll".into())
        .spawn(move || {
            let r = fetch(&c, Instant::now() + POLL_DEADLINE);
            b.store(false, Ordering::Release);
            let _ = tx.send(r);
        });
    if let Err(e) = spawned {
        busy.store(false, Ordering::Release);
        return Err(e.to_string());
    }
    rx.recv_timeout(POLL_DEADLINE + Duration::from_secs(1))
        .unwrap_or_else(|_| Err(format!("no answer within {POLL_DEADLINE:?}")))
}

/// The first answer of the URLs in order, all of them within `deadline`.
fn fetch(checked: &Checked, deadline: Instant) -> Result<Vec<AmAlert>, String> {
    let mut errors = Vec::new();
    for u in &checked.urls {
        match get(
            u,
            &alerts_path(u, &checked.cfg.filters),
            checked.auth.as_deref(),
            &checked.tls,
            deadline,
        ) {
            Ok(body) => {
                return serde_json::from_str(&body)
                    .map_err(|e| format!("{}: not an alert list: {e}", u.authority));
            }
            Err(e) => errors.push(e),
        }
    }
    Err(errors.join("; "))
}

/// One poll's alerts through the rules; returns what became of the alerts this node acted on.
fn apply(
    alerts: &[AmAlert],
    manager: &Arc<Manager>,
    handled: &mut Handled,
    active_local: &mut HashMap<String, AmAlert>,
    remote: &mut HashSet<(String, String)>,
) -> Vec<(String, Outcome)> {
    let mut out = Vec::new();
    let active: HashSet<String> = alerts
        .iter()
        .filter(|a| a.status.state == "active")
        .map(|a| a.fingerprint.clone())
        .collect();
    // One look at /proc per poll; at most MAX_ALERTS_PER_BATCH new alerts looked at (the rest, still active,
    // on later polls).
    let mut snap = manager.snapshot();
    let mut looked_at = 0usize;
    let mut left_out = 0usize;
    for a in alerts.iter().filter(|a| a.status.state == "active") {
        if handled.contains(&a.fingerprint, &a.starts_at) {
            active_local.insert(a.fingerprint.clone(), a.clone());
            continue;
        }
        let key = (a.fingerprint.clone(), a.starts_at.clone());
        if remote.contains(&key) {
            continue;
        }
        if looked_at == MAX_ALERTS_PER_BATCH {
            left_out += 1;
            continue;
        }
        looked_at += 1;
        let alert = a.to_alert(AlertStatus::Firing);
        if !manager.is_local(&alert, &mut snap) {
            say::line(&format!(
                "pulled alert {} ({}): not on this node, ignored",
                a.fingerprint,
                alert.name()
            ));
            remote.insert(key);
            continue;
        }
        // Recorded before the session starts: a crash in between loses a trace, never doubles one.
        if let Err(e) = handled.insert(&a.fingerprint, &a.starts_at, &active) {
            eprintln!(
                "llmprof serve: cannot record the handled alert {} in {}: {e}; not tracing it",
                a.fingerprint,
                handled.path.display()
            );
            continue;
        }
        let outcome = manager.handle_in(&alert, &mut snap);
        // Alerts over the session cap are not remembered (as with the webhook): a later poll may start them.
        if matches!(&outcome, Outcome::Skipped { reason, .. } if reason.contains("--max-sessions")) {
            if let Err(e) = handled.forget(&a.fingerprint) {
                eprintln!("llmprof serve: cannot update {}: {e}", handled.path.display());
            }
        } else {
            active_local.insert(a.fingerprint.clone(), a.clone());
        }
        out.push((a.fingerprint.clone(), outcome));
    }
    let gone: Vec<String> = active_local
        .keys()
        .filter(|fp| !active.contains(*fp))
        .cloned()
        .collect();
    for fp in gone {
        if let Some(a) = active_local.remove(&fp) {
            out.push((
                fp,
                manager.handle_in(&a.to_alert(AlertStatus::Resolved), &mut snap),
            ));
        }
    }
    manager.over_cap("poll", left_out);
    remote.retain(|(fp, _)| active.contains(fp));
    out
}

fn describe(o: &Outcome) -> String {
    serde_json::to_string(o).unwrap_or_else(|_| format!("{o:?}"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn urls_filters_and_auth_are_read_as_documented() {
        let u = parse_url("http://alertmanager.monitoring:9093").unwrap();
        assert_eq!(u.authority, "alertmanager.monitoring:9093");
        assert_eq!(
            alerts_path(&u, &[DEFAULT_FILTER.into()]),
            "/api/v2/alerts?active=true&silenced=false&inhibited=false&unprocessed=false&filter=llmprof%3D%22trace%22"
        );
        let u = parse_url("http://10.0.0.1/am/").unwrap();
        assert_eq!((u.authority.as_str(), u.prefix.as_str()), ("10.0.0.1:80", "/am"));
        let u = parse_url("https://am.monitoring").unwrap();
        assert_eq!(
            (u.tls, u.host.as_str(), u.authority.as_str()),
            (true, "am.monitoring", "am.monitoring:443")
        );
        assert!(parse_url("ftp://am:9093").unwrap_err().contains("http[s]://"));
        assert!(parse_url("http:///x").is_err());
        let dir = std::env::temp_dir().join(format!("llmprof-pull-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let t = dir.join("t");
        let write = |text: &str, mode: u32| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::write(&t, text).unwrap();
            std::fs::set_permissions(&t, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        write("abc123\n", 0o600);
        assert_eq!(read_auth(&t).unwrap(), "Bearer abc123");
        write("Basic dXNlcjpwYXNz", 0o600);
        assert_eq!(read_auth(&t).unwrap(), "Basic dXNlcjpwYXNz");
        write("a\nb", 0o600);
        assert!(read_auth(&t).is_err());
        // Credentials others may read are refused, with the fix.
        write("abc123\n", 0o644);
        let e = read_auth(&t).unwrap_err();
        assert!(
            e.contains("--alertmanager-auth-file") && e.contains("chmod 600"),
            "{e}"
        );
        assert!(read_auth(&dir.join("missing")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A listener on loopback that answers each connection with `answer`, `chunk` bytes every `gap`.
    fn trickling_server(answer: Vec<u8>, chunk: usize, gap: Duration) -> u16 {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for c in l.incoming().flatten() {
                let answer = answer.clone();
                std::thread::spawn(move || {
                    let mut c = c;
                    let mut buf = [0u8; 4096];
                    let _ = c.read(&mut buf);
                    for part in answer.chunks(chunk) {
                        if c.write_all(part).is_err() {
                            return;
                        }
                        std::thread::sleep(gap);
                    }
                });
            }
        });
        port
    }

    fn checked(url: &str) -> Checked {
        Checked::new(&PullConfig {
            urls: vec![url.to_owned()],
            interval: Duration::from_secs(10),
            filters: vec![DEFAULT_FILTER.into()],
            ..PullConfig::default()
        })
        .unwrap()
    }

    #[test]
    fn a_poll_has_one_deadline_however_slowly_the_answer_trickles() {
        let body = "[]";
        let answer = format!("HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n{body}", body.len());
        // Quick: answered.
        let quick = trickling_server(answer.clone().into_bytes(), 4096, Duration::ZERO);
        let c = checked(&format!("http://127.0.0.1:{quick}"));
        assert_eq!(
            fetch(&c, Instant::now() + Duration::from_secs(5)).unwrap().len(),
            0
        );
        // One byte every 100 ms: each read is quick, the whole is not.
        let slow = trickling_server(answer.into_bytes(), 1, Duration::from_millis(100));
        let c = checked(&format!("http://127.0.0.1:{slow}"));
        let t0 = Instant::now();
        let e = fetch(&c, Instant::now() + Duration::from_millis(500)).unwrap_err();
        assert!(e.contains("within"), "{e}");
        assert!(t0.elapsed() < Duration::from_secs(3));
    }

    #[test]
    fn https_urls_are_polled_over_tls() {
        let dir = std::env::temp_dir().join(format!("llmprof-pull-tls-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let Some((cert, key)) = super::super::tls::self_signed(&dir) else {
            return;
        };
        let server = super::super::tls::server_config(&cert, &key).unwrap();
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for tcp in l.incoming().flatten() {
                let conn = rustls::ServerConnection::new(server.clone()).unwrap();
                let mut s = rustls::StreamOwned::new(conn, tcp);
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf);
                let body = r#"[{"fingerprint":"f1","startsAt":"t","status":{"state":"active"},"labels":{"alertname":"A"}}]"#;
                let _ = write!(
                    s,
                    "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                s.conn.send_close_notify();
                let _ = s.flush();
            }
        });
        let mut cfg = PullConfig {
            urls: vec![format!("https://localhost:{port}")],
            interval: Duration::from_secs(10),
            ca_file: Some(cert),
            ..PullConfig::default()
        };
        let alerts = fetch(
            &Checked::new(&cfg).unwrap(),
            Instant::now() + Duration::from_secs(10),
        )
        .unwrap();
        assert_eq!(alerts[0].fingerprint, "f1");
        // Without the CA the certificate is not trusted.
        cfg.ca_file = None;
        let e = fetch(
            &Checked::new(&cfg).unwrap(),
            Instant::now() + Duration::from_secs(10),
        )
        .unwrap_err();
        assert!(e.to_lowercase().contains("certificate"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn handled_alerts_survive_a_restart_and_a_new_firing_is_new() {
        let dir = std::env::temp_dir().join(format!("llmprof-pull-handled-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut h = Handled::load(&dir);
        assert!(!h.contains("fp1", "t1"));
        h.insert("fp1", "t1", &HashSet::new()).unwrap();
        h.insert("fp2", "t2", &HashSet::new()).unwrap();
        let h = Handled::load(&dir);
        assert!(h.contains("fp1", "t1") && h.contains("fp2", "t2"));
        assert!(
            !h.contains("fp1", "t9"),
            "the same alert firing again is a new incident"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_planted_symlink_at_the_temporary_file_is_not_written_through() {
        let dir = std::env::temp_dir().join(format!("llmprof-pull-link-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let victim = dir.join("victim");
        std::fs::write(&victim, "precious").unwrap();
        std::os::unix::fs::symlink(&victim, dir.join(".alertmanager-handled.tmp")).unwrap();
        let mut h = Handled::load(&dir);
        h.insert("fp1", "t1", &HashSet::new()).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        let written = dir.join(HANDLED_FILE);
        assert!(!written.symlink_metadata().unwrap().file_type().is_symlink());
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(written.metadata().unwrap().permissions().mode() & 0o777, 0o600);
        assert!(Handled::load(&dir).contains("fp1", "t1"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_v2_alert_list_parses() {
        let body = r#"[{"annotations":{"llmprof_duration":"8s"},"endsAt":"2026-11-26T13:00:00Z",
            "fingerprint":"0123abcd","receivers":[{"name":"llmprof"}],"startsAt":"2026-11-26T12:55:00Z",
            "status":{"inhibitedBy":[],"silencedBy":[],"state":"active"},"updatedAt":"2026-11-26T12:55:01Z",
            "generatorURL":"http://prom/graph","labels":{"alertname":"LLMQueueBacklog","instance":"10.0.0.2:8000"}}]"#;
        let a: Vec<AmAlert> = serde_json::from_str(body).unwrap();
        let w = a[0].to_alert(AlertStatus::Firing);
        assert_eq!(w.fingerprint, "0123abcd");
        assert_eq!(w.labels["instance"], "10.0.0.2:8000");
        assert_eq!(w.requested_duration().unwrap(), Some(Duration::from_secs(8)));
        assert_eq!(a[0].status.state, "active");
    }
}
