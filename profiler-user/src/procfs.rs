//! What /proc says about a traced process: name, command line, threads, existence.
//!
//! Owns reading `/proc/PID/{comm,cmdline,task}` into [`ProcessInfo`]; never writes anything.

use std::fs;
use std::path::Path;

use llmprof_trace::event::{ProcessInfo, ThreadInfo};

/// Whether `/proc/PID` exists.
pub fn exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// `comm` of a process or thread (`/proc/PID/task/TID/comm`), trimmed.
fn comm(path: &str) -> Option<String> {
    fs::read_to_string(path).ok().map(|s| s.trim_end().to_owned())
}

/// Name of thread `tid` of `pid`, when it still exists.
pub fn thread_name(pid: u32, tid: u32) -> Option<String> {
    comm(&format!("/proc/{pid}/task/{tid}/comm"))
}

/// Thread ids of `pid` now listed in `/proc/PID/task` (empty when the process is gone).
pub fn thread_ids(pid: u32) -> Vec<u32> {
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()))
        .collect()
}

/// Reads the process and its current threads; `None` when the process does not exist.
pub fn process_info(pid: u32) -> Option<ProcessInfo> {
    let name = comm(&format!("/proc/{pid}/comm"))?;
    let cmdline = fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            b.split(|&c| c == 0)
                .filter(|s| !s.is_empty())
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default();
    let mut threads = Vec::new();
    if let Ok(dir) = fs::read_dir(format!("/proc/{pid}/task")) {
        for e in dir.flatten() {
            let Some(tid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if let Some(name) = thread_name(pid, tid) {
                threads.push(ThreadInfo { tid, name });
            }
        }
    }
    threads.sort_by_key(|t| t.tid);
    Some(ProcessInfo {
        pid,
        name,
        cmdline,
        threads,
        engine_probes: false,
    })
}

/// Socket inodes of the process's open fds (`/proc/PID/fd/* -> socket:[INODE]`).
pub fn socket_inodes(pid: u32) -> Vec<u64> {
    let mut out = Vec::new();
    if let Ok(dir) = fs::read_dir(format!("/proc/{pid}/fd")) {
        for e in dir.flatten() {
            if let Ok(target) = fs::read_link(e.path()) {
                let t = target.to_string_lossy();
                if let Some(inode) = t.strip_prefix("socket:[").and_then(|s| s.strip_suffix(']'))
                    && let Ok(i) = inode.parse()
                {
                    out.push(i);
                }
            }
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests {
    use super::*;

    #[test]
    fn reads_our_own_process() {
        let me = std::process::id();
        assert!(exists(me));
        let info = process_info(me).expect("own /proc entry");
        assert!(!info.name.is_empty());
        assert!(info.threads.iter().any(|t| t.tid == me));
        assert!(!exists(u32::MAX - 1));
    }
}
