//! What an alert may trace: the operator's allow-list.
//!
//! Owns the decision "may a session trace this process": an alert names a process (its `pid` or `instance`
//! label, see [`super::target`]); serve traces it only when the operator allowed it, i.e. when it is the
//! `--default-target` or a `--watch` target, or matches an `--allow-target` rule:
//! - `exe:PATH` — the process's executable is PATH, or lies under PATH when PATH ends with `/`
//!   (`exe:/opt/vllm/bin/`), as serve's own mount namespace sees it: the path `/proc/PID/exe` names must be
//!   that very file (same device and inode) in serve's namespace, so a user's own mount over `/opt` in a
//!   namespace of theirs matches nothing;
//! - `cgroup:PREFIX` — one of the process's cgroup paths (`/proc/PID/cgroup`) starts with PREFIX (a container
//!   or pod: `cgroup:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234.slice`);
//! - `port:N` — the process listens on TCP port N in the network namespaces `--port-netns` names (serve's own
//!   by default; never one a user created, see [`super::netns::all`]);
//! - `pid:N` — this process.
//!
//! Never allowed, whatever the rules say: pid 1 (init), llmprof serve itself, and kernel threads (no
//! executable). Every refusal carries a reason that the sessions list shows.

use std::path::{Path, PathBuf};
use std::str::FromStr;

use super::target::{Snapshot, TargetSpec};

/// One `--allow-target` rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AllowRule {
    /// The executable is this path, or lies under it when it ends with `/`.
    Exe(PathBuf),
    /// A cgroup path of the process starts with this prefix.
    Cgroup(String),
    /// The process listens on this TCP port.
    Port(u16),
    /// This pid.
    Pid(u32),
}

impl FromStr for AllowRule {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |why: &str| {
            format!(
                "invalid --allow-target {s:?}: {why} (use exe:/path/to/binary, exe:/dir/, cgroup:/prefix, port:N or pid:N)"
            )
        };
        match s.split_once(':') {
            Some(("exe", p)) if p.starts_with('/') => Ok(AllowRule::Exe(PathBuf::from(p))),
            Some(("exe", _)) => Err(bad("the executable must be an absolute path")),
            Some(("cgroup", c)) if c.starts_with('/') && c.len() > 1 => Ok(AllowRule::Cgroup(c.to_owned())),
            Some(("cgroup", _)) => Err(bad("the cgroup must be an absolute path other than /")),
            Some(("port" | "pid", _)) => match s.parse::<TargetSpec>() {
                Ok(TargetSpec::Port(p)) => Ok(AllowRule::Port(p)),
                Ok(TargetSpec::Pid(p)) => Ok(AllowRule::Pid(p)),
                Err(_) => Err(bad("not a number from 1 to 65535 (port) or a pid")),
            },
            _ => Err(bad("unknown kind")),
        }
    }
}

impl std::fmt::Display for AllowRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AllowRule::Exe(p) => write!(f, "exe:{}", p.display()),
            AllowRule::Cgroup(c) => write!(f, "cgroup:{c}"),
            AllowRule::Port(p) => write!(f, "port:{p}"),
            AllowRule::Pid(p) => write!(f, "pid:{p}"),
        }
    }
}

impl From<TargetSpec> for AllowRule {
    fn from(t: TargetSpec) -> Self {
        match t {
            TargetSpec::Pid(p) => AllowRule::Pid(p),
            TargetSpec::Port(p) => AllowRule::Port(p),
        }
    }
}

/// Why a process may not be traced (shown as the session's reason).
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum Refusal {
    /// pid 1.
    #[error("refusing to trace pid 1 (init)")]
    Init,
    /// llmprof serve itself.
    #[error("refusing to trace pid {0}: it is llmprof serve itself")]
    Serve(u32),
    /// A kernel thread or a process without a readable executable.
    #[error("refusing to trace pid {0}: it has no executable (a kernel thread, or it exited)")]
    NoExe(u32),
    /// Matches no rule.
    #[error(
        "refusing to trace pid {pid} ({exe}): not allowed by --default-target, --watch or --allow-target ({rules})"
    )]
    NotAllowed {
        /// The process.
        pid: u32,
        /// Its executable.
        exe: String,
        /// The rules, as configured.
        rules: String,
    },
}

/// The operator's allow-list: explicit rules plus the default and watched targets.
#[derive(Clone, Debug, Default)]
pub struct AllowList {
    rules: Vec<AllowRule>,
}

impl AllowList {
    /// `--allow-target` rules, plus the `--default-target` and `--watch` targets (allowed implicitly).
    pub fn new(explicit: &[AllowRule], default: Option<TargetSpec>, watch: &[TargetSpec]) -> Self {
        let mut rules: Vec<AllowRule> = explicit.to_vec();
        for t in default.iter().chain(watch) {
            let r = AllowRule::from(*t);
            if !rules.contains(&r) {
                rules.push(r);
            }
        }
        AllowList { rules }
    }

    /// Whether no rule is configured (every alert is then refused).
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// How many rules (the default target and `--watch` targets included).
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// Decides whether `pid` may be traced; reads `/proc` (run it off the async runtime), through the batch's
    /// `snap` for listeners.
    pub fn check(&self, pid: u32, snap: &mut Snapshot) -> Result<(), Refusal> {
        self.check_with(pid, std::process::id(), &mut ProcFacts { snap })
    }

    fn check_with(&self, pid: u32, own_pid: u32, facts: &mut dyn Facts) -> Result<(), Refusal> {
        if pid == 1 {
            return Err(Refusal::Init);
        }
        if pid == own_pid {
            return Err(Refusal::Serve(pid));
        }
        let Some(exe) = facts.exe(pid) else {
            return Err(Refusal::NoExe(pid));
        };
        let allowed = self.rules.iter().any(|r| match r {
            AllowRule::Pid(p) => *p == pid,
            // The path in serve's namespace must be the running file itself.
            AllowRule::Exe(p) => exe_matches(p, &exe) && facts.is_exe(pid, &exe),
            AllowRule::Cgroup(prefix) => facts.cgroups(pid).iter().any(|c| cgroup_matches(prefix, c)),
            AllowRule::Port(port) => facts.listeners(*port).contains(&pid),
        });
        if allowed {
            return Ok(());
        }
        Err(Refusal::NotAllowed {
            pid,
            exe: exe.display().to_string(),
            rules: if self.rules.is_empty() {
                "none configured".to_owned()
            } else {
                self.rules
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            },
        })
    }
}

/// `exe:` semantics: the same path, or under a directory given with a trailing `/`.
fn exe_matches(rule: &Path, exe: &Path) -> bool {
    if rule.as_os_str().to_string_lossy().ends_with('/') {
        exe.starts_with(rule)
    } else {
        exe == rule
    }
}

/// `cgroup:` semantics: a path prefix on component boundaries (`/a/b` matches `/a/b` and `/a/b/c`, not `/a/bc`).
fn cgroup_matches(prefix: &str, cgroup: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    cgroup == prefix
        || cgroup
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// What the decision reads about processes (the real one reads /proc; tests pass their own).
trait Facts {
    fn exe(&self, pid: u32) -> Option<PathBuf>;
    /// Whether `path`, looked up in serve's own mount namespace, is the file `pid` runs.
    fn is_exe(&self, pid: u32, path: &Path) -> bool;
    fn cgroups(&self, pid: u32) -> Vec<String>;
    fn listeners(&mut self, port: u16) -> Vec<u32>;
}

struct ProcFacts<'a> {
    snap: &'a mut Snapshot,
}

/// (device, inode) of the file at `path` from its cached attributes (no round trip to a FUSE server).
fn file_id(path: &str) -> Option<(u32, u32, u64)> {
    let c = std::ffi::CString::new(path).ok()?;
    // SAFETY: an all-zero `statx` is a valid value of this plain C struct.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: statx writes one `statx` into valid memory; the path is NUL-terminated.
    let r = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::AT_STATX_DONT_SYNC,
            libc::STATX_INO,
            &mut st,
        )
    };
    (r == 0).then_some((st.stx_dev_major, st.stx_dev_minor, st.stx_ino))
}

impl Facts for ProcFacts<'_> {
    fn exe(&self, pid: u32) -> Option<PathBuf> {
        std::fs::read_link(format!("/proc/{pid}/exe")).ok()
    }

    fn is_exe(&self, pid: u32, path: &Path) -> bool {
        let running = file_id(&format!("/proc/{pid}/exe"));
        running.is_some() && running == path.to_str().and_then(file_id)
    }

    fn cgroups(&self, pid: u32) -> Vec<String> {
        std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .map(|t| parse_cgroups(&t))
            .unwrap_or_default()
    }

    fn listeners(&mut self, port: u16) -> Vec<u32> {
        self.snap.listening_on(port)
    }
}

/// The cgroup paths of `/proc/PID/cgroup` (`hierarchy-ID:controllers:path` lines; v2 has one, `0::/path`).
fn parse_cgroups(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.splitn(3, ':').nth(2))
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests {
    use super::*;

    struct Fake;

    impl Facts for Fake {
        fn exe(&self, pid: u32) -> Option<PathBuf> {
            match pid {
                2 => None,
                10 => Some("/usr/bin/llmserve".into()),
                11 => Some("/opt/vllm/bin/python3.11".into()),
                _ => Some("/usr/sbin/sshd".into()),
            }
        }
        fn is_exe(&self, _pid: u32, _path: &Path) -> bool {
            true
        }
        fn cgroups(&self, pid: u32) -> Vec<String> {
            match pid {
                12 => vec!["/kubepods.slice/pod-a.slice/cri-1.scope".into()],
                _ => vec!["/system.slice/ssh.service".into()],
            }
        }
        fn listeners(&mut self, port: u16) -> Vec<u32> {
            if port == 8000 { vec![13] } else { vec![] }
        }
    }

    fn list(rules: &[&str]) -> AllowList {
        let rules: Vec<AllowRule> = rules.iter().map(|r| r.parse().unwrap()).collect();
        AllowList::new(&rules, None, &[])
    }

    #[test]
    fn parses_rules_and_rejects_bad_ones() {
        assert_eq!(
            "exe:/usr/bin/llmserve".parse(),
            Ok(AllowRule::Exe("/usr/bin/llmserve".into()))
        );
        assert_eq!(
            "cgroup:/kubepods.slice".parse(),
            Ok(AllowRule::Cgroup("/kubepods.slice".into()))
        );
        assert_eq!("port:8000".parse(), Ok(AllowRule::Port(8000)));
        assert_eq!("pid:42".parse(), Ok(AllowRule::Pid(42)));
        for bad in [
            "exe:llmserve",
            "cgroup:/",
            "cgroup:x",
            "port:0",
            "port:70000",
            "pid:x",
            "llmserve",
            "host:a",
        ] {
            let e = bad.parse::<AllowRule>().unwrap_err();
            assert!(e.contains("--allow-target"), "{bad}: {e}");
        }
        // Display round-trips (the sessions list shows the rules as configured).
        for r in [
            "exe:/opt/vllm/bin/",
            "cgroup:/kubepods.slice",
            "port:8000",
            "pid:42",
        ] {
            assert_eq!(r.parse::<AllowRule>().unwrap().to_string(), r);
        }
    }

    #[test]
    fn init_serve_and_kernel_threads_are_never_allowed() {
        let all = list(&["pid:1", "pid:99", "pid:2", "exe:/usr/"]);
        assert_eq!(all.check_with(1, 99, &mut Fake), Err(Refusal::Init));
        assert_eq!(all.check_with(99, 99, &mut Fake), Err(Refusal::Serve(99)));
        assert_eq!(all.check_with(2, 99, &mut Fake), Err(Refusal::NoExe(2)));
    }

    #[test]
    fn each_rule_kind_allows_only_what_it_names() {
        let l = list(&[
            "exe:/usr/bin/llmserve",
            "exe:/opt/vllm/bin/",
            "cgroup:/kubepods.slice/pod-a.slice",
            "port:8000",
            "pid:14",
        ]);
        for ok in [10, 11, 12, 13, 14] {
            assert_eq!(l.check_with(ok, 99, &mut Fake), Ok(()), "pid {ok}");
        }
        let e = l.check_with(15, 99, &mut Fake).unwrap_err();
        assert!(matches!(e, Refusal::NotAllowed { pid: 15, .. }));
        let msg = e.to_string();
        assert!(
            msg.contains("/usr/sbin/sshd") && msg.contains("port:8000"),
            "{msg}"
        );
        // Prefixes stop at path components.
        assert!(!cgroup_matches(
            "/kubepods.slice/pod-a",
            "/kubepods.slice/pod-ab/x"
        ));
        assert!(cgroup_matches(
            "/kubepods.slice/pod-a/",
            "/kubepods.slice/pod-a/x"
        ));
        assert!(!exe_matches(
            Path::new("/opt/vllm/bin"),
            Path::new("/opt/vllm/bin/python3")
        ));
    }

    #[test]
    fn without_rules_everything_is_refused_and_targets_are_implicit() {
        let none = AllowList::new(&[], None, &[]);
        assert!(none.is_empty());
        let e = none.check_with(10, 99, &mut Fake).unwrap_err().to_string();
        assert!(e.contains("none configured"), "{e}");
        let implicit = AllowList::new(&[], Some(TargetSpec::Pid(10)), &[TargetSpec::Port(8000)]);
        assert_eq!(implicit.check_with(10, 99, &mut Fake), Ok(()));
        assert_eq!(implicit.check_with(13, 99, &mut Fake), Ok(()));
        assert!(implicit.check_with(11, 99, &mut Fake).is_err());
    }

    /// `setpriv` as uid/gid 65534 (nobody) running `unshare ARGS sh -c SCRIPT`: a user's own namespaces. None
    /// when not root or the script did not print `ready` (no unprivileged user namespaces here).
    fn as_nobody_in_own_namespaces(unshare: &str, script: &str) -> Option<std::process::Child> {
        use std::io::BufRead;
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return None;
        }
        let mut child = std::process::Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "unshare",
                unshare,
                "sh",
                "-c",
                script,
            ])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .ok()?;
        let mut line = String::new();
        let ready = child
            .stdout
            .as_mut()
            .map(std::io::BufReader::new)
            .is_some_and(|mut o| o.read_line(&mut line).is_ok() && line.trim() == "ready");
        if !ready {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        Some(child)
    }

    #[test]
    fn a_users_mount_over_an_allowed_directory_matches_nothing() {
        // A user mounts a tmpfs over /opt in a mount namespace of their own and runs "/opt/llm/bin/python"
        // from it: /proc/PID/exe names a path under exe:/opt/llm/, but serve's /opt has no such file.
        let Some(mut child) = as_nobody_in_own_namespaces(
            "-Urm",
            "mount -t tmpfs none /opt && mkdir -p /opt/llm/bin && cp /bin/sleep /opt/llm/bin/python && \
             echo ready && exec /opt/llm/bin/python 600",
        ) else {
            return;
        };
        let pid = child.id();
        // Until the exec happened.
        for _ in 0..200 {
            if std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|e| e.ends_with("llm/bin/python")) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
        assert_eq!(exe, Path::new("/opt/llm/bin/python"), "the path looks allowed");
        let l = list(&["exe:/opt/llm/", "exe:/opt/llm/bin/python"]);
        let mut snap = Snapshot::take(&super::super::target::PortNetns::Root);
        let r = l.check(pid, &mut snap);
        let _ = child.kill();
        let _ = child.wait();
        assert!(matches!(r, Err(Refusal::NotAllowed { .. })), "{r:?}");
    }

    #[test]
    fn a_listener_in_a_users_own_network_namespace_is_never_found() {
        // A user listens on a port in a network namespace of their own (any port, any address there).
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let Some(mut child) = as_nobody_in_own_namespaces(
            "-Urn",
            &format!(
                "exec python3 -c \"import socket,time; s=socket.socket(); s.bind(('127.0.0.1', {port})); \
                 s.listen(); print('ready', flush=True); time.sleep(600)\""
            ),
        ) else {
            return;
        };
        let pid = child.id();
        let l = list(&[&format!("port:{port}")]);
        for scope in [
            super::super::target::PortNetns::Own,
            super::super::target::PortNetns::Root,
        ] {
            let mut snap = Snapshot::take(&scope);
            assert!(snap.listening_on(port).is_empty(), "{scope}");
            assert!(l.check(pid, &mut snap).is_err(), "{scope}");
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    #[test]
    fn reads_cgroup_files_of_both_versions() {
        assert_eq!(
            parse_cgroups("0::/user.slice/session-1.scope\n"),
            vec!["/user.slice/session-1.scope"]
        );
        assert_eq!(
            parse_cgroups("12:memory:/docker/abc\n1:name=systemd:/docker/abc\n"),
            vec!["/docker/abc", "/docker/abc"]
        );
        // Our own process reads as something.
        let mut snap = Snapshot::take(&super::super::target::PortNetns::Own);
        let facts = ProcFacts { snap: &mut snap };
        assert!(!facts.cgroups(std::process::id()).is_empty());
        let exe = facts.exe(std::process::id()).unwrap();
        assert!(facts.is_exe(std::process::id(), &exe));
        assert!(!facts.is_exe(std::process::id(), Path::new("/bin/sh")));
    }
}
