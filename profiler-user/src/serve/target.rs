//! Which local process an alert is about.
//!
//! Owns the resolution rules, in order: an explicit `pid` label; else the `instance` label's port, mapped to
//! the local process listening on it; else the configured default target. A port is mapped through the LISTEN
//! sockets of `/proc/PID/net/tcp{,6}` (read once per network namespace, so servers in containers are found
//! too) and the socket inodes of each process's fds (the same tables `metrics_scrape` reads for discovery).
//! Read-only; never signals or touches a process.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::str::FromStr;

use crate::metrics_scrape::listening_sockets;
use crate::procfs;

use super::webhook::Alert;

/// Label naming the target pid explicitly.
pub const PID_LABEL: &str = "pid";
/// Prometheus' `instance` label (`host:port` of the scraped endpoint).
pub const INSTANCE_LABEL: &str = "instance";

/// A configured target: a pid, or whatever process listens on a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetSpec {
    /// This process.
    Pid(u32),
    /// The local process listening on this TCP port.
    Port(u16),
}

impl FromStr for TargetSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("invalid target {s:?}: use pid:N or port:N (e.g. port:8000)");
        match s.split_once(':') {
            Some(("pid", n)) => n
                .parse()
                .ok()
                .filter(|&p| p > 0)
                .map(TargetSpec::Pid)
                .ok_or_else(bad),
            Some(("port", n)) => n
                .parse()
                .ok()
                .filter(|&p| p > 0)
                .map(TargetSpec::Port)
                .ok_or_else(bad),
            _ => Err(bad()),
        }
    }
}

impl std::fmt::Display for TargetSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TargetSpec::Pid(p) => write!(f, "pid:{p}"),
            TargetSpec::Port(p) => write!(f, "port:{p}"),
        }
    }
}

/// A resolved target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    /// The process.
    pub pid: u32,
    /// How it was found (shown in the sessions list).
    pub how: String,
}

/// Why an alert names no local process.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum ResolveError {
    /// The `pid` label is not a number.
    #[error("label pid={0:?} is not a process id")]
    BadPid(String),
    /// No such process.
    #[error("no process with pid {0} on this host")]
    NoProcess(u32),
    /// The `instance` label has no port.
    #[error("label instance={0:?} has no port (expected host:port)")]
    BadInstance(String),
    /// Nothing listens on the port here.
    #[error("no local process listens on TCP port {port} (from {from})")]
    NoListener {
        /// The port.
        port: u16,
        /// Where the port came from.
        from: String,
    },
    /// Neither label and no default.
    #[error("the alert has no pid or instance label and llmprof serve has no --default-target")]
    NoTarget,
}

/// Resolves an alert to a process, falling back to `default` only when the alert names none.
pub fn resolve_alert(alert: &Alert, default: Option<TargetSpec>) -> Result<Resolved, ResolveError> {
    if let Some(p) = alert.labels.get(PID_LABEL) {
        let pid: u32 = p.trim().parse().map_err(|_| ResolveError::BadPid(p.clone()))?;
        return resolve(TargetSpec::Pid(pid), "label pid");
    }
    if let Some(inst) = alert.labels.get(INSTANCE_LABEL) {
        let port = instance_port(inst).ok_or_else(|| ResolveError::BadInstance(inst.clone()))?;
        return resolve(TargetSpec::Port(port), &format!("label instance={inst}"));
    }
    match default {
        Some(d) => resolve(d, &format!("default target {d}")),
        None => Err(ResolveError::NoTarget),
    }
}

/// Resolves a spec now; `from` says where the spec came from.
pub fn resolve(spec: TargetSpec, from: &str) -> Result<Resolved, ResolveError> {
    match spec {
        TargetSpec::Pid(pid) => {
            if pid == 0 || !procfs::exists(pid) {
                return Err(ResolveError::NoProcess(pid));
            }
            Ok(Resolved {
                pid,
                how: from.to_owned(),
            })
        }
        TargetSpec::Port(port) => {
            let pids = pids_listening_on(port);
            let Some(&pid) = pids.first() else {
                return Err(ResolveError::NoListener {
                    port,
                    from: from.to_owned(),
                });
            };
            let mut how = format!("{from} → port {port} → pid {pid}");
            if pids.len() > 1 {
                how.push_str(&format!(" (lowest of {} listeners: {pids:?})", pids.len()));
            }
            Ok(Resolved { pid, how })
        }
    }
}

/// The port of `host:port`, `[v6]:port` or `http://host:port/path`.
pub fn instance_port(instance: &str) -> Option<u16> {
    let s = instance.trim();
    let s = s.split_once("://").map_or(s, |(_, r)| r);
    let hostport = s.split('/').next()?;
    let (_, port) = hostport.rsplit_once(':')?;
    if port.is_empty() || hostport.ends_with(']') {
        return None;
    }
    port.parse().ok().filter(|&p| p > 0)
}

/// Pids (sorted) of the processes with a LISTEN socket on `port`, in any network namespace.
pub fn pids_listening_on(port: u16) -> Vec<u32> {
    // One representative process per network namespace: its /proc/PID/net/tcp{,6} is that namespace's table.
    let mut by_netns: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let ns = std::fs::read_link(format!("/proc/{pid}/ns/net"))
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        by_netns.entry(ns).or_default().push(pid);
    }
    let mut out = Vec::new();
    for pids in by_netns.values() {
        let mut wanted: HashSet<u64> = HashSet::new();
        for &rep in pids.iter().take(3) {
            for table in ["tcp", "tcp6"] {
                let path = format!("/proc/{rep}/net/{table}");
                if let Ok(text) = std::fs::read_to_string(Path::new(&path)) {
                    wanted.extend(
                        listening_sockets(&text)
                            .into_iter()
                            .filter(|&(p, _)| p == port)
                            .map(|(_, inode)| inode),
                    );
                }
            }
            if !wanted.is_empty() || Path::new(&format!("/proc/{rep}/net/tcp")).exists() {
                break;
            }
        }
        if wanted.is_empty() {
            continue;
        }
        for &pid in pids {
            if procfs::socket_inodes(pid).iter().any(|i| wanted.contains(i)) {
                out.push(pid);
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests {
    use super::*;
    use crate::serve::webhook::AlertStatus;

    fn alert(labels: &[(&str, &str)]) -> Alert {
        Alert {
            status: AlertStatus::Firing,
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            annotations: Default::default(),
            starts_at: String::new(),
            ends_at: String::new(),
            generator_url: String::new(),
            fingerprint: "f".into(),
        }
    }

    #[test]
    fn parses_specs_and_instances() {
        assert_eq!("pid:12".parse(), Ok(TargetSpec::Pid(12)));
        assert_eq!("port:8000".parse(), Ok(TargetSpec::Port(8000)));
        assert!("8000".parse::<TargetSpec>().is_err());
        assert!("port:0".parse::<TargetSpec>().is_err());
        assert!("port:99999".parse::<TargetSpec>().is_err());
        assert_eq!(instance_port("127.0.0.1:8000"), Some(8000));
        assert_eq!(instance_port("llm-7.example:9090"), Some(9090));
        assert_eq!(instance_port("[::1]:8001"), Some(8001));
        assert_eq!(instance_port("http://10.0.0.1:8002/metrics"), Some(8002));
        assert_eq!(instance_port("llm-7"), None);
        assert_eq!(instance_port("[::1]"), None);
    }

    #[test]
    fn resolves_pid_labels_ports_and_defaults() {
        let me = std::process::id();
        let r = resolve_alert(&alert(&[("pid", &me.to_string())]), None).unwrap();
        assert_eq!(r.pid, me);
        assert_eq!(
            resolve_alert(&alert(&[("pid", "1073741823")]), None),
            Err(ResolveError::NoProcess(1_073_741_823))
        );
        assert!(matches!(
            resolve_alert(&alert(&[("pid", "x")]), None),
            Err(ResolveError::BadPid(_))
        ));
        // Our own listener is found from the instance label's port.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let r = resolve_alert(&alert(&[("instance", &format!("localhost:{port}"))]), None).unwrap();
        assert_eq!(r.pid, me, "{}", r.how);
        drop(l);
        assert!(matches!(
            resolve_alert(&alert(&[("instance", &format!("localhost:{port}"))]), None),
            Err(ResolveError::NoListener { .. })
        ));
        assert_eq!(resolve_alert(&alert(&[]), None), Err(ResolveError::NoTarget));
        let r = resolve_alert(&alert(&[]), Some(TargetSpec::Pid(me))).unwrap();
        assert!(r.how.contains("default"), "{}", r.how);
    }
}
