//! Which local process an alert is about.
//!
//! Owns the resolution rules, in order: an explicit `pid` label (a pid of serve's pid namespace, or of the
//! one `--pid-namespace` names); else the `instance` label, whose host must be this machine (one of its
//! addresses, `localhost`, its host name) or a local network namespace (a pod IP), mapped to the process
//! listening on its port in that namespace; else the configured default target. A `port:N` target (default
//! target, `--watch`, `--allow-target`) is looked up only in the network namespaces `--port-netns` names
//! ([`PortNetns`]: serve's own by default). A network namespace that a user created in a user namespace of
//! their own is never looked in: there anyone may listen on any port and claim any address (see
//! [`netns::all`]). A port is mapped through the LISTEN sockets of `/proc/PID/net/tcp{,6}` and the socket
//! inodes of each process's fds (the same tables `metrics_scrape` reads for discovery), read once per batch of
//! alerts ([`Snapshot`]). Whether the process found may be traced is [`super::allow`]'s decision. Read-only;
//! never signals or touches a process.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, ToSocketAddrs};
use std::path::Path;
use std::str::FromStr;

use crate::sys::{ns, procfs, tcp};

use super::netns;
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
    /// The `pid` label names no process of the configured pid namespace.
    #[error("label pid={pid}: no process has that pid in the pid namespace {ns} (--pid-namespace)")]
    NoProcessInNs {
        /// The label's pid.
        pid: u32,
        /// The namespace.
        ns: String,
    },
    /// The `instance` label's host is not this machine nor one of its network namespaces.
    #[error("{from}: {host} is not an address of this host or of a local network namespace")]
    NotLocal {
        /// The host part.
        host: String,
        /// Where it came from.
        from: String,
    },
    /// Neither label and no default.
    #[error("the alert has no pid or instance label and llmprof serve has no --default-target")]
    NoTarget,
}

/// Where `port:N` targets are looked for (`--port-netns`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum PortNetns {
    /// serve's own network namespace (the host's, for the shipped unit and the DaemonSet's `hostNetwork`).
    #[default]
    Own,
    /// serve's own and every network namespace root made (a container runtime's pods, `ip netns`).
    Root,
    /// One namespace, `net:[INODE]` of the file the operator named (`/run/netns/NAME`, `/proc/PID/ns/net`).
    Named(String),
}

impl FromStr for PortNetns {
    type Err = String;

    /// `own`, `root`, or the path of a network namespace file.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "own" => Ok(PortNetns::Own),
            "root" => Ok(PortNetns::Root),
            p if p.starts_with('/') => match ns::id_of_file(Path::new(p), ns::Kind::Net) {
                Ok(id) => Ok(PortNetns::Named(id)),
                Err(ns::NsFileError::NotNamespace) => Err(format!(
                    "--port-netns {p}: not a network namespace file (use /run/netns/NAME or /proc/PID/ns/net)"
                )),
                Err(e) => Err(format!("--port-netns {p}: {e}")),
            },
            _ => Err(format!(
                "invalid --port-netns {s:?}: use own, root, or the path of a namespace file (/run/netns/NAME)"
            )),
        }
    }
}

impl std::fmt::Display for PortNetns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PortNetns::Own => write!(f, "own"),
            PortNetns::Root => write!(f, "root"),
            PortNetns::Named(id) => write!(f, "{id}"),
        }
    }
}

/// How labels are read: where `pid` labels are pids, and the fallback target.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResolveConfig {
    /// Target of alerts without `pid` or `instance` labels.
    pub default: Option<TargetSpec>,
    /// The pid namespace `pid` labels are read in (`pid:[INODE]`, from `--pid-namespace`); None: serve's own.
    pub pid_ns: Option<String>,
    /// Where `port:N` targets are looked for.
    pub port_netns: PortNetns,
}

/// The LISTEN sockets of one network namespace and the processes holding them.
#[derive(Debug, Default)]
struct Listeners {
    /// (port, socket inode).
    sockets: Vec<(u16, u64)>,
    /// socket inode → pids holding it.
    owners: HashMap<u64, Vec<u32>>,
}

/// One look at `/proc` for a batch of alerts (a webhook, a poll): the network namespaces and their addresses,
/// and each namespace's listeners on first use. A batch of thousands of alerts costs one walk, not one each.
#[derive(Debug)]
pub struct Snapshot {
    scope: PortNetns,
    all: Vec<netns::NetNs>,
    own: String,
    listeners: HashMap<String, Listeners>,
}

impl Snapshot {
    /// Reads the namespaces now; `scope` is where `port:N` looks.
    pub fn take(scope: &PortNetns) -> Snapshot {
        Snapshot {
            scope: scope.clone(),
            all: netns::all(),
            own: ns::id_of(std::process::id(), ns::Kind::Net).unwrap_or_default(),
            listeners: HashMap::new(),
        }
    }

    /// The namespaces `port:N` looks in.
    fn in_scope(&self, n: &netns::NetNs) -> bool {
        match &self.scope {
            PortNetns::Own => n.id == self.own,
            PortNetns::Root => true,
            PortNetns::Named(id) => &n.id == id,
        }
    }

    /// Pids (sorted) with a LISTEN socket on `port` in the namespaces of `--port-netns`.
    pub fn listening_on(&mut self, port: u16) -> Vec<u32> {
        let ids: Vec<String> = self
            .all
            .iter()
            .filter(|n| self.in_scope(n))
            .map(|n| n.id.clone())
            .collect();
        self.listening_in(&ids, port)
    }

    /// Pids (sorted) with a LISTEN socket on `port` in the namespaces `ids`.
    fn listening_in(&mut self, ids: &[String], port: u16) -> Vec<u32> {
        let mut out = Vec::new();
        for id in ids {
            let Some(ns) = self.all.iter().find(|n| &n.id == id) else {
                continue;
            };
            let l = self
                .listeners
                .entry(id.clone())
                .or_insert_with(|| listeners_of(ns));
            for (p, inode) in &l.sockets {
                if *p == port
                    && let Some(pids) = l.owners.get(inode)
                {
                    out.extend_from_slice(pids);
                }
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }
}

/// Resolves an alert to a process, falling back to the default only when the alert names none. Reads /proc and
/// may resolve a host name: run it off the async runtime.
pub fn resolve_alert(alert: &Alert, cfg: &ResolveConfig) -> Result<Resolved, ResolveError> {
    resolve_alert_in(alert, cfg, &mut Snapshot::take(&cfg.port_netns))
}

/// [`resolve_alert`] with the `/proc` view of a batch.
pub fn resolve_alert_in(
    alert: &Alert,
    cfg: &ResolveConfig,
    snap: &mut Snapshot,
) -> Result<Resolved, ResolveError> {
    if let Some(p) = alert.labels.get(PID_LABEL) {
        let pid: u32 = p.trim().parse().map_err(|_| ResolveError::BadPid(p.clone()))?;
        let Some(ns) = &cfg.pid_ns else {
            return resolve_in(TargetSpec::Pid(pid), "label pid", snap);
        };
        let host_pid =
            netns::translate_pid(ns, pid).ok_or(ResolveError::NoProcessInNs { pid, ns: ns.clone() })?;
        return resolve_in(
            TargetSpec::Pid(host_pid),
            &format!("label pid={pid} in {ns} → pid {host_pid}"),
            snap,
        );
    }
    if let Some(inst) = alert.labels.get(INSTANCE_LABEL) {
        let port = instance_port(inst).ok_or_else(|| ResolveError::BadInstance(inst.clone()))?;
        let host = instance_host(inst).ok_or_else(|| ResolveError::BadInstance(inst.clone()))?;
        return resolve_instance(&host, port, &format!("label instance={inst}"), snap);
    }
    match cfg.default {
        Some(d) => resolve_in(d, &format!("default target {d}"), snap),
        None => Err(ResolveError::NoTarget),
    }
}

/// Resolves a spec now; `from` says where the spec came from.
pub fn resolve(spec: TargetSpec, from: &str, scope: &PortNetns) -> Result<Resolved, ResolveError> {
    resolve_in(spec, from, &mut Snapshot::take(scope))
}

fn resolve_in(spec: TargetSpec, from: &str, snap: &mut Snapshot) -> Result<Resolved, ResolveError> {
    match spec {
        TargetSpec::Pid(pid) => {
            if pid == 0 || !procfs::alive(pid) {
                return Err(ResolveError::NoProcess(pid));
            }
            Ok(Resolved {
                pid,
                how: from.to_owned(),
            })
        }
        TargetSpec::Port(port) => pick(snap.listening_on(port), port, from),
    }
}

/// The lowest pid of `pids` (the listener's parent, when workers share the socket), said so when several.
fn pick(pids: Vec<u32>, port: u16, from: &str) -> Result<Resolved, ResolveError> {
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

/// An `instance` is only ever this host: its host part must be one of this host's addresses (loopback and
/// `localhost` mean serve's own network namespace) or the address of a local network namespace (a pod IP);
/// the port is then looked up in that namespace only.
fn resolve_instance(
    host: &str,
    port: u16,
    from: &str,
    snap: &mut Snapshot,
) -> Result<Resolved, ResolveError> {
    let addrs = host_addresses(host, &snap.all, &snap.own);
    let chosen: Vec<String> = snap
        .all
        .iter()
        .filter(|n| {
            addrs.iter().any(|a| {
                if a.is_loopback() || a.is_unspecified() {
                    n.id == snap.own
                } else {
                    n.addrs.contains(a)
                }
            })
        })
        .map(|n| n.id.clone())
        .collect();
    if chosen.is_empty() {
        return Err(ResolveError::NotLocal {
            host: host.to_owned(),
            from: from.to_owned(),
        });
    }
    let pids = snap.listening_in(&chosen, port);
    pick(pids, port, &format!("{from} → {host}"))
}

/// The addresses `host` stands for: an IP literal, `localhost`, this machine's host name (serve's own
/// namespace), or what the resolver says.
fn host_addresses(host: &str, all: &[netns::NetNs], own: &str) -> Vec<IpAddr> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return vec![ip];
    }
    if host.eq_ignore_ascii_case("localhost") {
        return vec![IpAddr::V4(Ipv4Addr::LOCALHOST)];
    }
    if is_own_hostname(host) {
        // This host: the non-loopback addresses of serve's namespace.
        return all
            .iter()
            .find(|n| n.id == own)
            .map(|n| n.addrs.iter().copied().filter(|a| !a.is_loopback()).collect())
            .unwrap_or_default();
    }
    (host, 0)
        .to_socket_addrs()
        .map(|it| it.map(|s| s.ip()).collect())
        .unwrap_or_default()
}

/// Whether `host` is this machine's host name (or its first label).
fn is_own_hostname(host: &str) -> bool {
    let Ok(name) = std::fs::read_to_string("/proc/sys/kernel/hostname") else {
        return false;
    };
    let name = name.trim();
    !name.is_empty()
        && (host.eq_ignore_ascii_case(name)
            || host
                .split('.')
                .next()
                .is_some_and(|h| h.eq_ignore_ascii_case(name)))
}

/// The host part of `host:port`, `[v6]:port` or `http://host:port/path`.
pub fn instance_host(instance: &str) -> Option<String> {
    let s = instance.trim();
    let s = s.split_once("://").map_or(s, |(_, r)| r);
    let hostport = s.split('/').next()?;
    let (host, _) = hostport.rsplit_once(':')?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    (!host.is_empty()).then(|| host.to_owned())
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

/// The listeners of one network namespace: its LISTEN sockets (asked in one representative process's
/// namespace) and which of its processes hold them.
fn listeners_of(ns: &netns::NetNs) -> Listeners {
    let mut sockets = Vec::new();
    for &rep in ns.pids.iter().take(3) {
        sockets.extend(tcp::listeners(Some(rep)));
        if !sockets.is_empty() || Path::new(&format!("/proc/{rep}/net/tcp")).exists() {
            break;
        }
    }
    let mut owners: HashMap<u64, Vec<u32>> = HashMap::new();
    if !sockets.is_empty() {
        let listening: std::collections::HashSet<u64> = sockets.iter().map(|(_, i)| *i).collect();
        for &pid in &ns.pids {
            for i in tcp::socket_fds(pid).into_keys() {
                if listening.contains(&i) {
                    owners.entry(i).or_default().push(pid);
                }
            }
        }
    }
    Listeners { sockets, owners }
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

    fn cfg(default: Option<TargetSpec>) -> ResolveConfig {
        ResolveConfig {
            default,
            pid_ns: None,
            port_netns: PortNetns::Own,
        }
    }

    #[test]
    fn resolves_pid_labels_ports_and_defaults() {
        let me = std::process::id();
        let r = resolve_alert(&alert(&[("pid", &me.to_string())]), &cfg(None)).unwrap();
        assert_eq!(r.pid, me);
        assert_eq!(
            resolve_alert(&alert(&[("pid", "1073741823")]), &cfg(None)),
            Err(ResolveError::NoProcess(1_073_741_823))
        );
        assert!(matches!(
            resolve_alert(&alert(&[("pid", "x")]), &cfg(None)),
            Err(ResolveError::BadPid(_))
        ));
        // Our own listener is found from the instance label's port.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let r = resolve_alert(&alert(&[("instance", &format!("localhost:{port}"))]), &cfg(None)).unwrap();
        assert_eq!(r.pid, me, "{}", r.how);
        drop(l);
        assert!(matches!(
            resolve_alert(&alert(&[("instance", &format!("localhost:{port}"))]), &cfg(None)),
            Err(ResolveError::NoListener { .. })
        ));
        assert_eq!(
            resolve_alert(&alert(&[]), &cfg(None)),
            Err(ResolveError::NoTarget)
        );
        let r = resolve_alert(&alert(&[]), &cfg(Some(TargetSpec::Pid(me)))).unwrap();
        assert!(r.how.contains("default"), "{}", r.how);
    }

    #[test]
    fn instances_resolve_only_on_this_host() {
        assert_eq!(instance_host("127.0.0.1:8000").as_deref(), Some("127.0.0.1"));
        assert_eq!(instance_host("[::1]:8001").as_deref(), Some("::1"));
        assert_eq!(
            instance_host("http://llm-7.example:8002/metrics").as_deref(),
            Some("llm-7.example")
        );
        assert_eq!(instance_host(":8000"), None);
        let me = std::process::id();
        let l = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
        let port = l.local_addr().unwrap().port();
        // Loopback and this host's own addresses find our listener.
        for host in ["127.0.0.1", "localhost"] {
            let r = resolve_alert(&alert(&[("instance", &format!("{host}:{port}"))]), &cfg(None)).unwrap();
            assert_eq!(r.pid, me, "{}", r.how);
        }
        let own = ns::id_of(me, ns::Kind::Net).unwrap();
        if let Some(addr) = netns::all()
            .into_iter()
            .find(|n| n.id == own)
            .and_then(|n| n.addrs.into_iter().find(|a| !a.is_loopback()))
        {
            let inst = match addr {
                IpAddr::V4(a) => format!("{a}:{port}"),
                IpAddr::V6(a) => format!("[{a}]:{port}"),
            };
            let r = resolve_alert(&alert(&[("instance", &inst)]), &cfg(None)).unwrap();
            assert_eq!(r.pid, me, "{}", r.how);
        }
        // A remote host with the same port is refused, not mapped to our listener (TEST-NET-3, RFC 5737).
        let e = resolve_alert(
            &alert(&[("instance", &format!("203.0.113.7:{port}"))]),
            &cfg(None),
        )
        .unwrap_err();
        assert!(matches!(e, ResolveError::NotLocal { .. }), "{e}");
        assert!(e.to_string().contains("203.0.113.7"), "{e}");
    }

    #[test]
    fn pid_labels_read_in_the_configured_namespace() {
        let me = std::process::id();
        let ns = std::fs::read_link(format!("/proc/{me}/ns/pid")).unwrap();
        let c = ResolveConfig {
            default: None,
            pid_ns: Some(ns.to_string_lossy().into_owned()),
            port_netns: PortNetns::Own,
        };
        let r = resolve_alert(&alert(&[("pid", &me.to_string())]), &c).unwrap();
        assert_eq!(r.pid, me, "{}", r.how);
        let c = ResolveConfig {
            default: None,
            pid_ns: Some("pid:[1]".into()),
            port_netns: PortNetns::Own,
        };
        let e = resolve_alert(&alert(&[("pid", &me.to_string())]), &c).unwrap_err();
        assert!(matches!(e, ResolveError::NoProcessInNs { .. }), "{e}");
    }
}
