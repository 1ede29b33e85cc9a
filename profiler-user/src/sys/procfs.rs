//! What /proc says about a traced process: name, command line, threads, whether it is alive.
//!
//! Owns reading `/proc/PID/{comm,cmdline,stat,task}` into [`ProcessInfo`] and liveness; its memory map is
//! [`super::maps`], its sockets [`super::tcp`], its namespaces [`super::ns`]. Never writes anything.

use std::fs;

use llmprof_trace::event::{ProcessInfo, ThreadInfo};

/// Whether process `pid` is alive: `/proc/PID` exists and some thread of it is not a zombie. A process that
/// exited but was not reaped by its parent keeps its `/proc` entry (state `Z`) until the parent waits for it;
/// it makes no more calls and must count as gone. A leader that ended with `pthread_exit` is a zombie too while
/// its other threads run: the process is alive as long as one task is not.
pub fn alive(pid: u32) -> bool {
    match task_state(&format!("/proc/{pid}/stat")) {
        None => false,
        Some(s) if !is_dead(s) => true,
        Some(_) => fs::read_dir(format!("/proc/{pid}/task")).is_ok_and(|dir| {
            dir.flatten().any(|t| {
                task_state(&format!(
                    "/proc/{pid}/task/{}/stat",
                    t.file_name().to_string_lossy()
                ))
                .is_some_and(|s| !is_dead(s))
            })
        }),
    }
}

/// The state letter of a `/proc/.../stat` file (the field after the command name, which may hold `)`).
fn task_state(path: &str) -> Option<u8> {
    let stat = fs::read(path).ok()?;
    let close = stat.iter().rposition(|&b| b == b')')?;
    stat.get(close + 2).copied()
}

/// `Z` (zombie) and `X` (dead): states of a task that will not run again.
fn is_dead(state: u8) -> bool {
    matches!(state, b'Z' | b'X')
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

/// Clock ticks per second (`USER_HZ`: the unit of /proc's CPU times).
pub fn clock_ticks() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(t).ok().filter(|t| *t > 0).unwrap_or(100)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests {
    use super::*;

    #[test]
    fn reads_our_own_process() {
        let me = std::process::id();
        assert!(alive(me));
        let info = process_info(me).expect("own /proc entry");
        assert!(!info.name.is_empty());
        assert!(info.threads.iter().any(|t| t.tid == me));
        assert!(!alive(u32::MAX - 1));
    }

    #[test]
    fn an_exited_child_not_yet_reaped_is_not_alive() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        // Until we wait for it, it stays in /proc as a zombie.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while alive(pid) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(
            std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "a zombie keeps its entry"
        );
        assert!(!alive(pid), "a zombie is not alive");
        child.wait().unwrap();
    }

    #[test]
    fn a_process_whose_leader_called_pthread_exit_is_alive() {
        // Python's main thread ends while a second thread sleeps: the leader is a zombie, the process lives.
        let mut child = std::process::Command::new("python3")
            .args([
                "-c",
                "import threading, time, os, sys\n\
                 t = threading.Thread(target=time.sleep, args=(30,))\n\
                 t.start()\n\
                 print('ready', flush=True)\n\
                 import ctypes; ctypes.CDLL(None).pthread_exit(None)",
            ])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        assert_eq!(line.trim(), "ready");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while task_state(&format!("/proc/{pid}/stat")) != Some(b'Z') && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(
            task_state(&format!("/proc/{pid}/stat")),
            Some(b'Z'),
            "the leader ended"
        );
        assert!(alive(pid), "its other thread still runs");
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
