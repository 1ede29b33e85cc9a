//! The calibration in a child process: the hidden `llmprof calibrate-probes` subcommand ([`SUBCOMMAND`])
//! that runs [`super::calibrate::run`] and prints one JSON line ([`ChildReport`]), and the session's handle
//! on that child ([`Background`]).
//!
//! Owns the child's arguments, its output format and its lifetime (reaped by a thread, killed through a pidfd
//! when the session stops waiting). Never measures anything itself, and never reads more of the child's
//! output than [`CHILD_OUTPUT_MAX`].

use super::calibrate::{Calibration, CalibrationConfig};
use super::error::CaptureError;

/// The hidden subcommand of the `llmprof` binary that runs [`super::calibrate::run`] and prints the result as
/// one JSON line.
pub const SUBCOMMAND: &str = "calibrate-probes";
/// Most bytes read back from a calibration child (its JSON line is ~1 KiB; its error, a few lines).
pub const CHILD_OUTPUT_MAX: u64 = 64 << 10;

impl CalibrationConfig {
    /// The arguments of [`SUBCOMMAND`] that ask for this configuration (`crate::cli` parses them back).
    pub fn to_args(&self) -> Vec<String> {
        let mut a = vec![SUBCOMMAND.to_owned()];
        for (on, flag) in [
            (self.engine, "--engine"),
            (self.cuda, "--cuda"),
            (self.thread_states, "--thread-states"),
            (self.sample, "--sample"),
            (self.http, "--http"),
        ] {
            if on {
                a.push(flag.to_owned());
            }
        }
        if let Some(u) = self.untraced {
            a.push(format!("--untraced-ns={}", u.plain_ns));
            a.push(format!("--untraced-decoded-ns={}", u.decoded_ns));
        }
        a
    }
}

/// What [`SUBCOMMAND`] prints on stdout: one JSON line, the calibration or why there is none.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChildReport {
    /// The measured costs.
    Calibration(Box<Calibration>),
    /// Why nothing was measured (the error with its causes, one line).
    Error(String),
}

impl ChildReport {
    /// The report of `r`, as the child prints it.
    pub fn line(r: &Result<Calibration, CaptureError>) -> String {
        let report = match r {
            Ok(c) => ChildReport::Calibration(Box::new(*c)),
            Err(e) => ChildReport::Error(crate::causes::one_line(e)),
        };
        serde_json::to_string(&report).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// The child's output read back.
    fn parse(stdout: &str) -> Result<Calibration, String> {
        match serde_json::from_str::<ChildReport>(stdout.trim()) {
            Ok(ChildReport::Calibration(c)) => Ok(*c),
            Ok(ChildReport::Error(why)) => Err(why),
            Err(_) if stdout.trim().is_empty() => {
                Err("the calibration process ended without a result".into())
            }
            Err(e) => Err(format!("the calibration process printed something else ({e})")),
        }
    }
}

/// A calibration running in a child process (`llmprof calibrate-probes`), started by a session once its
/// probes are live: the kernel verifies the calibration's own programs and they are timed while the session
/// already traces, off its start-up path, in a process of its own (its syscalls, records and counters
/// never mix with the session's; see [`super::calibrate::run`]). A thread reads the child's one line and reaps it (its CPU
/// time then counts in llmprof's own, `RUSAGE_CHILDREN`); dropping this kills a child still running.
pub struct Background {
    /// A pidfd of the child: the kill on drop can never reach a process that reused its pid.
    pidfd: Option<std::os::fd::OwnedFd>,
    rx: std::sync::mpsc::Receiver<Result<Calibration, String>>,
    done: Option<Result<Calibration, String>>,
}

impl Background {
    /// Starts `exe` (the `llmprof` binary) with [`SUBCOMMAND`] for `cfg`.
    pub fn spawn(exe: &std::path::Path, cfg: &CalibrationConfig) -> std::io::Result<Self> {
        use std::io::{BufRead, Read};
        use std::os::fd::FromRawFd;
        let mut child = std::process::Command::new(exe)
            .args(cfg.to_args())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            // Its diagnostic log (`LLMPROF_LOG`) joins the session's; otherwise it writes nothing there.
            .stderr(std::process::Stdio::inherit())
            .spawn()?;
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1; our child is not reaped yet,
        // so the pid is still its own.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, child.id() as libc::pid_t, 0) };
        // SAFETY: a non-negative return is a new fd that nothing else owns.
        let pidfd = (fd >= 0).then(|| unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) });
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("llmprof-calib".into())
            .spawn(move || {
                // One line: the child's exit (detaching its probes) comes after it and takes a while.
                let mut stdout = String::new();
                if let Some(o) = child.stdout.take() {
                    let _ = std::io::BufReader::new(o.take(CHILD_OUTPUT_MAX)).read_line(&mut stdout);
                }
                let _ = tx.send(ChildReport::parse(&stdout));
                // After the result: its exit (detaching its probes) may take a while and delays nobody.
                let _ = child.wait();
            })?;
        Ok(Background {
            pidfd,
            rx,
            done: None,
        })
    }

    /// The result once the child reported it, without waiting.
    pub fn poll(&mut self) -> Option<&Result<Calibration, String>> {
        if self.done.is_none() {
            match self.rx.try_recv() {
                Ok(r) => self.done = Some(r),
                Err(std::sync::mpsc::TryRecvError::Empty) => {}
                Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                    self.done = Some(Err("the calibration process ended without a result".into()))
                }
            }
        }
        self.done.as_ref()
    }

    /// Waits at most `limit` for the result; `None` when it has not come (the child is then killed).
    pub fn wait(&mut self, limit: std::time::Duration) -> Option<&Result<Calibration, String>> {
        if self.done.is_none() {
            match self.rx.recv_timeout(limit) {
                Ok(r) => self.done = Some(r),
                Err(_) => self.kill(),
            }
        }
        self.done.as_ref()
    }

    fn kill(&mut self) {
        if let Some(fd) = self.pidfd.take() {
            use std::os::fd::AsRawFd;
            // SAFETY: pidfd_send_signal with a pidfd we own, SIGKILL, no siginfo, no flags; an exited child
            // makes it fail with ESRCH, harmlessly.
            unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    fd.as_raw_fd(),
                    libc::SIGKILL,
                    std::ptr::null::<libc::siginfo_t>(),
                    0,
                )
            };
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if self.done.is_none() {
            self.kill();
        }
    }
}
