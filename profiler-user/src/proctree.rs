//! Process trees in user space: which processes a session traces, and what it does when one appears.
//!
//! Owns the /proc walk that finds the descendants of the `--pid` targets at attach ([`descendants`]), the
//! set of live traced processes of a session ([`Tree`]), and the reaction to the kernel's process records:
//! naming a new or exec'd process from /proc ([`Tree::on_event`] fills the command line the kernel cannot
//! read), attaching engine probes to a process whose image exports the probe ABI, and handing new
//! processes to the GPU layer (libcuda probes) and to /metrics discovery. The kernel does the pickup itself
//! (`profiler-ebpf/src/proc.rs` puts a child in the traced set at fork): nothing here is on the path of an
//! event, so a slow /proc read never loses one. Never writes to /proc or to a traced process.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fs;

use llmprof_trace::event::{Event, EventBody, ProcessInfo};

use crate::capture::{Capture, EngineProbes};
use crate::sys::procfs;

/// The parent pid of `pid` from `/proc/PID/stat` (the field after the parenthesised `comm`, which may hold
/// spaces and parentheses itself).
pub fn parent_of(pid: u32) -> Option<u32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_ppid(&stat)
}

/// The ppid field of a `/proc/PID/stat` line.
fn parse_ppid(stat: &str) -> Option<u32> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// llmprof's own processes as seen from `roots`: this process and, when one of its ancestors is a root, the
/// ancestors between it and that root (a `sudo` or `doas` that runs llmprof, the shell it was typed in): they
/// exist only to run llmprof and are never traced. The kernel refuses llmprof's own process whatever the maps
/// say (`llmprof_abi::Config::self_tgid`); these are the processes user space never puts in the traced set.
pub fn own_processes(roots: &[u32]) -> Vec<u32> {
    own_chain(std::process::id(), roots, parent_of)
}

/// `me` and its ancestors up to, not including, the first one in `roots` — or `me` alone when no ancestor is
/// in `roots` (the chain then never meets a traced tree). Bounded by pid 1 and by a cycle guard.
fn own_chain(me: u32, roots: &[u32], parent: impl Fn(u32) -> Option<u32>) -> Vec<u32> {
    let mut chain = vec![me];
    let mut p = me;
    while let Some(pp) = parent(p) {
        if roots.contains(&pp) {
            return chain;
        }
        if pp <= 1 || chain.contains(&pp) || chain.len() > 4096 {
            break;
        }
        chain.push(pp);
        p = pp;
    }
    vec![me]
}

/// `roots` and every living descendant of them, each once, roots first (then by pid). llmprof's own
/// processes ([`own_processes`]) and what they started are left out.
pub fn descendants(roots: &[u32]) -> Vec<u32> {
    let own = own_processes(roots);
    let mut children: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    if let Ok(dir) = fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if let Some(ppid) = parent_of(pid) {
                children.entry(ppid).or_default().push(pid);
            }
        }
    }
    let mut out: Vec<u32> = Vec::new();
    let mut seen = HashSet::new();
    for &r in roots {
        if seen.insert(r) {
            out.push(r);
        }
    }
    let mut found = BTreeSet::new();
    let mut stack: Vec<u32> = roots.to_vec();
    while let Some(p) = stack.pop() {
        for &c in children.get(&p).map(Vec::as_slice).unwrap_or(&[]) {
            if !own.contains(&c) && seen.insert(c) {
                found.insert(c);
                stack.push(c);
            }
        }
    }
    out.extend(found);
    out
}

/// The live traced processes of a session and what it learned about them.
#[derive(Debug)]
pub struct Tree {
    /// Whether new processes are followed (not `--no-children`).
    follow: bool,
    /// Processes traced and not seen to exit.
    live: BTreeSet<u32>,
    /// Every process traced during the session.
    seen: BTreeSet<u32>,
}

/// What a process record changed, for the session to act on.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Change {
    /// A process joined the session (started by a traced one, or found in /proc after the start).
    pub added: Option<u32>,
    /// A process executed a program (its probes may have changed).
    pub exec: Option<u32>,
    /// A process left it.
    pub exited: Option<u32>,
}

impl Tree {
    /// A session tracing `pids` (the targets and, with `follow`, their descendants at attach).
    pub fn new(pids: &[u32], follow: bool) -> Self {
        Self {
            follow,
            live: pids.iter().copied().collect(),
            seen: pids.iter().copied().collect(),
        }
    }

    /// Whether new processes are followed.
    pub fn follows(&self) -> bool {
        self.follow
    }

    /// The traced processes not seen to exit.
    pub fn live(&self) -> impl Iterator<Item = u32> + '_ {
        self.live.iter().copied()
    }

    /// Whether every traced process has exited.
    pub fn all_exited(&self) -> bool {
        self.live.is_empty()
    }

    /// How many processes the session traced in all.
    pub fn total(&self) -> usize {
        self.seen.len()
    }

    /// Looks at one decoded event before it is merged: fills the command line of a process start or exec
    /// from /proc (the kernel record has the `comm` and file name only) and says what changed.
    pub fn on_event(&mut self, ev: &mut Event) -> Change {
        let mut change = Change::default();
        match &mut ev.body {
            EventBody::ProcessStart { name, cmdline, .. } => {
                fill_from_proc(ev.pid, name, cmdline);
                if self.live.insert(ev.pid) {
                    self.seen.insert(ev.pid);
                    change.added = Some(ev.pid);
                }
            }
            EventBody::ProcessExec {
                filename,
                name,
                cmdline,
            } => {
                fill_from_proc(ev.pid, name, cmdline);
                if cmdline.is_empty() {
                    cmdline.clone_from(filename);
                }
                change.exec = Some(ev.pid);
            }
            EventBody::ProcessExit { .. } if self.live.remove(&ev.pid) => {
                change.exited = Some(ev.pid);
            }
            _ => {}
        }
        change
    }

    /// Forgets processes that are gone from /proc without an exit record (one `stat` per live process).
    pub fn prune(&mut self) {
        self.live.retain(|&p| procfs::alive(p));
    }

    /// Processes of the tree that /proc shows and the kernel did not report (started between the /proc walk
    /// and the start of tracing, or whose start record was dropped): they join the session now, each with a
    /// synthetic process start at `ts_ns`. Also forgets processes that are gone without an exit record.
    pub fn rescan(&mut self, ts_ns: u64) -> Vec<Event> {
        self.prune();
        if !self.follow || self.live.is_empty() {
            return Vec::new();
        }
        let roots: Vec<u32> = self.live.iter().copied().collect();
        let mut out = Vec::new();
        for pid in descendants(&roots) {
            if self.live.contains(&pid) {
                continue;
            }
            let (mut name, mut cmdline) = (String::new(), String::new());
            fill_from_proc(pid, &mut name, &mut cmdline);
            out.push(Event {
                ts_ns,
                pid,
                tid: 0,
                body: EventBody::ProcessStart {
                    ppid: parent_of(pid).unwrap_or(0),
                    name,
                    cmdline,
                },
            });
            self.live.insert(pid);
            self.seen.insert(pid);
        }
        out
    }
}

/// Overwrites `name` and `cmdline` with what /proc says of `pid` now, when it is still there.
fn fill_from_proc(pid: u32, name: &mut String, cmdline: &mut String) {
    if let Some(ProcessInfo {
        name: n, cmdline: c, ..
    }) = procfs::process_info(pid)
    {
        if !n.is_empty() {
            *name = n;
        }
        if !c.is_empty() {
            *cmdline = c;
        }
    }
}

/// Attaches the engine probes of a process that joined the session or executed a program, when its image
/// exports the probe ABI; a marker text for the timeline when they were attached or refused.
pub fn attach_engine(capture: &mut Capture, pid: u32) -> Option<String> {
    match capture.attach_engine(pid) {
        Ok(EngineProbes::Attached { .. }) => {
            log::debug!("proctree: engine probes attached to pid {pid}");
            None
        }
        Ok(EngineProbes::NotFound) => None,
        Ok(EngineProbes::AbiMismatch { found, expected }) => Some(format!(
            "engine probes of pid {pid} not attached: probe ABI {found}, this llmprof speaks {expected}"
        )),
        // Gone already (a short-lived child), or a uprobe the kernel refused.
        Err(e) => {
            log::debug!("proctree: engine probes of pid {pid}: {e}");
            None
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests {
    use super::*;

    #[test]
    fn ppid_is_read_after_a_comm_with_spaces_and_parentheses() {
        assert_eq!(parse_ppid("42 (a b) c) S 7 42 42 0 -1"), Some(7));
        assert_eq!(parse_ppid("garbage"), None);
    }

    #[test]
    fn own_processes_are_llmprof_and_the_wrappers_between_it_and_a_traced_ancestor() {
        // shell 100 → sudo 200 → llmprof 300; 50 is the shell's parent.
        let parent = |p: u32| match p {
            300 => Some(200),
            200 => Some(100),
            100 => Some(50),
            50 => Some(1),
            _ => None,
        };
        assert_eq!(own_chain(300, &[100], parent), vec![300, 200]);
        assert_eq!(own_chain(300, &[50], parent), vec![300, 200, 100]);
        // No ancestor is traced: only llmprof itself (the chain never meets the tree).
        assert_eq!(own_chain(300, &[999], parent), vec![300]);
        // A cycle in a lying /proc ends the walk.
        assert_eq!(
            own_chain(7, &[1000], |p| Some(if p == 7 { 8 } else { 7 })),
            vec![7]
        );
    }

    #[test]
    fn descendants_of_an_ancestor_of_llmprof_leave_llmprof_out() {
        let me = std::process::id();
        let Some(parent) = parent_of(me) else { return };
        let found = descendants(&[parent]);
        assert_eq!(found[0], parent);
        assert!(!found.contains(&me), "llmprof is not its own target: {found:?}");
    }

    #[test]
    fn descendants_of_this_process_include_a_child_and_its_child() {
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & wait"])
            .spawn()
            .unwrap();
        let me = std::process::id();
        let cpid = child.id();
        // The grandchild (sleep) appears once the shell forked it.
        let mut found = Vec::new();
        for _ in 0..200 {
            found = descendants(&[me]);
            if found.iter().any(|&p| parent_of(p) == Some(cpid)) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(found[0], me, "the root comes first");
        assert!(found.contains(&cpid), "{found:?}");
        assert!(
            found.iter().any(|&p| parent_of(p) == Some(cpid)) || !procfs::alive(cpid),
            "the shell's child is a descendant: {found:?}"
        );
    }

    #[test]
    fn a_started_process_joins_and_its_exit_leaves() {
        let mut t = Tree::new(&[1], true);
        let mut ev = Event {
            ts_ns: 1,
            pid: 4_000_000,
            tid: 4_000_000,
            body: EventBody::ProcessStart {
                ppid: 1,
                name: "x".into(),
                cmdline: String::new(),
            },
        };
        assert_eq!(t.on_event(&mut ev).added, Some(4_000_000));
        assert_eq!(t.total(), 2);
        ev.body = EventBody::ProcessExit { exit_code: 0 };
        assert_eq!(t.on_event(&mut ev).exited, Some(4_000_000));
        ev.pid = 1;
        t.on_event(&mut ev);
        assert!(t.all_exited());
    }
}
