//! Waiting for a spawned `llmprof attach` (or `serve`) to say its probes are live: the one place the tests read
//! that line, so a change of wording is one edit.

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStderr};

/// What `llmprof attach` prints on stderr once every probe is attached.
pub const PROBES_LIVE: &str = "probes live";

/// Reads `child`'s stderr (spawned with `Stdio::piped()`) line by line until [`PROBES_LIVE`]; returns the reader,
/// positioned after that line, and everything read so far. Panics (after killing the child) with what it printed
/// if it exits first.
pub fn wait_probes_live(child: &mut Child) -> (BufReader<ChildStderr>, String) {
    let Some(stderr) = child.stderr.take() else {
        panic!("llmprof's stderr is not piped");
    };
    let mut stderr = BufReader::new(stderr);
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        let n = stderr
            .read_line(&mut line)
            .unwrap_or_else(|e| panic!("reading llmprof's stderr: {e}"));
        if n == 0 {
            let _ = child.kill();
            panic!("llmprof exited before its probes were live:\n{seen}");
        }
        seen.push_str(&line);
        if line.contains(PROBES_LIVE) {
            return (stderr, seen);
        }
    }
}

/// A running `llmprof attach`, stopped (SIGINT, like Ctrl-C) by [`Attached::stop`].
pub struct Attached {
    child: std::process::Child,
    log: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Attached {
    /// Starts `llmprof attach --pid PID --gpu-sample-interval 0 EXTRA... -o TRACE` and returns once its probes are
    /// live.
    pub fn start(pid: u32, extra: &[&str], trace: &std::path::Path) -> Attached {
        let mut child = std::process::Command::new(crate::bin_path("llmprof"))
            .args(["attach", "--pid", &pid.to_string(), "--gpu-sample-interval", "0"])
            .args(extra)
            .arg("-o")
            .arg(trace)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn llmprof attach");
        let (stderr, seen) = wait_probes_live(&mut child);
        let log = std::sync::Arc::new(std::sync::Mutex::new(seen));
        let l2 = log.clone();
        // Keep draining its stderr (so that it never blocks on a full pipe), echoed and kept.
        std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                eprintln!("[llmprof] {line}");
                if let Ok(mut l) = l2.lock() {
                    l.push_str(&line);
                    l.push('\n');
                }
            }
        });
        Attached { child, log }
    }

    /// What it printed on stderr so far.
    pub fn log(&self) -> String {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// Stops it as Ctrl-C does, asserts that it exited successfully and returns what it printed on stdout.
    pub fn stop(self) -> String {
        // SAFETY: kill(2) with our own child's pid and SIGINT has no memory-safety preconditions.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let out = self.child.wait_with_output().expect("llmprof exit");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        eprintln!("{stdout}");
        assert!(out.status.success(), "llmprof attach failed: {}", out.status);
        stdout
    }
}

/// `llmprof report --json TRACE`, parsed (panics with its stderr when it fails).
pub fn report_json(trace: &std::path::Path) -> serde_json::Value {
    let out = report(&["--json"], trace);
    serde_json::from_slice(&out).expect("llmprof report --json is JSON")
}

/// `llmprof report TRACE`, the text a person reads (panics with its stderr when it fails).
pub fn report_text(trace: &std::path::Path) -> String {
    String::from_utf8_lossy(&report(&[], trace)).into_owned()
}

/// The output of `llmprof report ARGS TRACE`, which must succeed.
fn report(args: &[&str], trace: &std::path::Path) -> Vec<u8> {
    let out = std::process::Command::new(crate::bin_path("llmprof"))
        .arg("report")
        .args(args)
        .arg(trace)
        .output()
        .expect("run llmprof report");
    assert!(
        out.status.success(),
        "llmprof report: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}
