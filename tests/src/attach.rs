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
