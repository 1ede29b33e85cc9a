//! What /proc says about a traced process: name, command line, threads, existence.
//!
//! Owns reading `/proc/PID/{comm,cmdline,task}` into [`ProcessInfo`] and the parsing of a `/proc/PID/maps` line
//! ([`MapsLine`]); never writes anything.

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

/// One line of `/proc/PID/maps` (`start-end perms offset dev inode pathname`), parsed once for every reader of
/// a process's mappings (libcuda lookup, the injector, the counting CUDA probe's code range).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapsLine<'a> {
    /// First address of the mapping.
    pub start: u64,
    /// One past its last address.
    pub end: u64,
    /// `r-xp` and the like.
    pub perms: &'a str,
    /// File offset of `start`.
    pub offset: u64,
    /// The mapped file as the process sees it (may contain spaces; a trailing ` (deleted)` removed), or a
    /// pseudo name (`[heap]`) or "" for an anonymous mapping.
    pub path: &'a str,
}

impl<'a> MapsLine<'a> {
    /// Parses one line; None when it is not a maps line.
    pub fn parse(line: &'a str) -> Option<Self> {
        let mut f = line.splitn(6, char::is_whitespace);
        let (range, perms, offset) = (f.next()?, f.next()?, f.next()?);
        let path = f.nth(2).unwrap_or("").trim_start();
        let (a, b) = range.split_once('-')?;
        Some(Self {
            start: u64::from_str_radix(a, 16).ok()?,
            end: u64::from_str_radix(b, 16).ok()?,
            perms,
            offset: u64::from_str_radix(offset, 16).ok()?,
            path: path.strip_suffix(" (deleted)").unwrap_or(path),
        })
    }

    /// Whether it maps a file (an absolute path).
    pub fn is_file(&self) -> bool {
        self.path.starts_with('/')
    }
}

#[cfg(test)]
mod maps_tests {
    use super::MapsLine;

    #[test]
    fn parses_files_with_spaces_deleted_ones_and_anonymous_mappings() {
        let l = MapsLine::parse(
            "7f10000000-7f10100000 r-xp 00010000 08:01 43 /opt/my lib/libcuda.so.1 (deleted)",
        )
        .unwrap_or_else(|| panic!("a maps line"));
        assert_eq!(
            (l.start, l.end, l.perms, l.offset, l.path),
            (
                0x7f10000000,
                0x7f10100000,
                "r-xp",
                0x10000,
                "/opt/my lib/libcuda.so.1"
            )
        );
        assert!(l.is_file());
        let anon =
            MapsLine::parse("7f20000000-7f20001000 rw-p 00000000 00:00 0").unwrap_or_else(|| panic!("anon"));
        assert!(!anon.is_file());
        assert_eq!(MapsLine::parse("not a maps line"), None);
    }
}
