//! Fleet mode: `llmprof serve --alertmanager-url URL` pulls alerts from Alertmanager's v2 API instead of (or
//! besides) receiving its webhook, so one Alertmanager serves every node without a receiver per node.
//!
//! Every `--alertmanager-poll` (bounded: [`MIN_INTERVAL`]..=[`MAX_INTERVAL`]) one thread asks
//! `GET URL/api/v2/alerts?active=true&silenced=false&inhibited=false&filter=...` of the URLs in turn (HA: the
//! first that answers 200 counts), with the `Authorization` header of `--alertmanager-auth-file`. Each active
//! alert not handled before is checked with the webhook's own rules ([`Manager::is_local`]: the target resolves
//! on this node and the allow-list lets it be traced); anything else belongs to another node and is ignored
//! (not a failed session). A local alert is recorded as handled in `OUT_DIR/.alertmanager-handled` (its
//! fingerprint and `startsAt`, written and synced *before* its session starts), then handed to the manager like a
//! webhook's firing alert. A handled alert that is no longer active is handed over as resolved (its running
//! session ends early). After a restart the file is read back: an alert traced before is not traced again.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::manager::{MAX_ALERTS_PER_BATCH, Manager, Outcome};
use super::say;
use super::webhook::{Alert, AlertStatus};

/// Shortest polling interval accepted.
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);
/// Longest polling interval accepted.
pub const MAX_INTERVAL: Duration = Duration::from_secs(300);
/// Default polling interval.
pub const DEFAULT_INTERVAL: &str = "10s";
/// Default filter: the alerts deploy/'s rules mark for llmprof.
pub const DEFAULT_FILTER: &str = "llmprof=\"trace\"";
/// Connect and read timeout of one request.
const TIMEOUT: Duration = Duration::from_secs(5);
/// Largest answer read (a few thousand alerts).
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
    /// Alertmanager matchers (`name="value"`, `name=~"re"`), all must match.
    pub filters: Vec<String>,
}

/// One Alertmanager URL, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct AmUrl {
    /// `host:port`.
    pub authority: String,
    /// Path prefix without trailing `/` (empty for the root).
    pub prefix: String,
}

/// Parses `http://host[:port][/prefix]` (https is not supported here: run Alertmanager's API on the cluster
/// network or behind a local TLS proxy).
pub fn parse_url(url: &str) -> Result<AmUrl, String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("--alertmanager-url {url}: expected http://HOST:PORT[/PREFIX]"))?;
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    if authority.is_empty() {
        return Err(format!("--alertmanager-url {url}: no host"));
    }
    let authority = if authority
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        authority.to_owned()
    } else {
        format!("{authority}:80")
    };
    Ok(AmUrl {
        authority,
        prefix: match path.trim_matches('/') {
            "" => String::new(),
            p => format!("/{p}"),
        },
    })
}

/// The `Authorization` value from the auth file.
pub fn read_auth(path: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("--alertmanager-auth-file {}: {e}", path.display()))?;
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

/// A minimal HTTP/1.0 GET (no chunked encoding, the connection closes after the body); `Ok(body)` on 200.
fn get(authority: &str, path: &str, auth: Option<&str>) -> Result<String, String> {
    let addr = authority
        .to_socket_addrs()
        .map_err(|e| format!("{authority}: {e}"))?
        .next()
        .ok_or_else(|| format!("{authority}: no address"))?;
    let mut s = TcpStream::connect_timeout(&addr, TIMEOUT).map_err(|e| format!("{authority}: {e}"))?;
    s.set_read_timeout(Some(TIMEOUT)).map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(TIMEOUT)).map_err(|e| e.to_string())?;
    let auth = auth.map_or(String::new(), |a| format!("Authorization: {a}\r\n"));
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: {authority}\r\nAccept: application/json\r\n{auth}\r\n"
    )
    .map_err(|e| format!("{authority}: {e}"))?;
    let mut raw = Vec::new();
    s.take(MAX_BODY)
        .read_to_end(&mut raw)
        .map_err(|e| format!("{authority}: {e}"))?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("{authority}: not an HTTP answer"))?;
    let status = head.split_whitespace().nth(1).unwrap_or("");
    if status != "200" {
        return Err(format!(
            "{authority}: HTTP {status}: {}",
            body.chars().take(200).collect::<String>()
        ));
    }
    Ok(body.to_owned())
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
    /// Starts polling (URLs and the auth file were checked by `ServeOptions::from_config`).
    pub fn spawn(
        cfg: PullConfig,
        urls: Vec<AmUrl>,
        auth: Option<String>,
        manager: Arc<Manager>,
        out_dir: &Path,
    ) -> std::io::Result<Poller> {
        let stop = Arc::new(AtomicBool::new(false));
        let handled = Handled::load(out_dir);
        eprintln!(
            "llmprof serve: pulling alerts from {} every {:?} ({} handled before)",
            cfg.urls.join(", "),
            cfg.interval,
            handled.map.len()
        );
        let s = stop.clone();
        let handle = std::thread::Builder::new()
            .name("llmprof-serve-pull".into())
            .spawn(move || poll_loop(&cfg, &urls, auth.as_deref(), &manager, handled, &s))?;
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

fn poll_loop(
    cfg: &PullConfig,
    urls: &[AmUrl],
    auth: Option<&str>,
    manager: &Arc<Manager>,
    mut handled: Handled,
    stop: &AtomicBool,
) {
    // Alerts this node handled and that were active at the last poll (their resolution ends the session).
    let mut active_local: HashMap<String, AmAlert> = HashMap::new();
    // Firings that belong to another node: not resolved again every poll.
    let mut remote: HashSet<(String, String)> = HashSet::new();
    let mut failing = false;
    while !stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        match fetch(urls, &cfg.filters, auth) {
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
        while !stop.load(Ordering::Relaxed) && started.elapsed() < cfg.interval {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The first answer of the URLs in order.
fn fetch(urls: &[AmUrl], filters: &[String], auth: Option<&str>) -> Result<Vec<AmAlert>, String> {
    let mut errors = Vec::new();
    for u in urls {
        match get(&u.authority, &alerts_path(u, filters), auth) {
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
        assert!(parse_url("https://am:9093").unwrap_err().contains("http://"));
        assert!(parse_url("http:///x").is_err());
        let dir = std::env::temp_dir().join(format!("llmprof-pull-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("t"), "abc123\n").unwrap();
        assert_eq!(read_auth(&dir.join("t")).unwrap(), "Bearer abc123");
        std::fs::write(dir.join("t"), "Basic dXNlcjpwYXNz").unwrap();
        assert_eq!(read_auth(&dir.join("t")).unwrap(), "Basic dXNlcjpwYXNz");
        std::fs::write(dir.join("t"), "a\nb").unwrap();
        assert!(read_auth(&dir.join("t")).is_err());
        assert!(read_auth(&dir.join("missing")).is_err());
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
