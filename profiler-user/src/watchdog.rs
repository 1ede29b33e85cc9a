//! A session's deadlines, whatever the target does: a session may take [`START_GRACE`] to start (stopping a
//! thread, loading the GPU helper, attaching probes) and [`END_GRACE`] to end (stopping the helper, draining,
//! finishing the trace) beyond its duration. Past them, `llmprof attach` exits ([`arm`]) and `llmprof serve`
//! frees the session's slot (`serve::manager`): no target can keep either alive by what it maps or does.
//!
//! Owns the deadlines and the CLI's watchdog thread; never touches the capture itself.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Longest start-up: the GPU helper's load deadline (30 s) and stopping a thread (5 s), with room for a
/// loaded machine.
pub const START_GRACE: Duration = Duration::from_secs(60);
/// Longest end after the duration or a stop request: the GPU helper's stop deadline (10 s) and the trace's
/// last drain and write, with room for a loaded machine.
pub const END_GRACE: Duration = Duration::from_secs(60);

/// When a session of `duration` started now must be over (None: it runs until stopped).
pub fn deadline(duration: Option<Duration>) -> Option<Instant> {
    duration.map(|d| Instant::now() + START_GRACE + d + END_GRACE)
}

/// `llmprof attach`'s watchdog: a thread that ends the process with `code` (after one line on stderr) when
/// the session runs past [`deadline`] of `duration`, or [`END_GRACE`] after `stop` was set. The trace written
/// so far stays readable (it is streamed: every prefix is a valid trace).
pub fn arm(duration: Option<Duration>, stop: &'static AtomicBool, code: i32) {
    let deadline = deadline(duration);
    let spawned = std::thread::Builder::new()
        .name("llmprof-watchdog".into())
        .spawn(move || {
            let mut stop_seen: Option<Instant> = None;
            loop {
                std::thread::sleep(Duration::from_millis(200));
                if stop.load(Ordering::Relaxed) {
                    stop_seen.get_or_insert_with(Instant::now);
                }
                let why = if deadline.is_some_and(|d| Instant::now() >= d) {
                    "did not end within its duration and the grace for start-up and end"
                } else if stop_seen.is_some_and(|s| s.elapsed() >= END_GRACE) {
                    "did not end within the grace after it was asked to stop"
                } else {
                    continue;
                };
                eprintln!(
                    "llmprof: the session {why} ({START_GRACE:?} + {END_GRACE:?}): something it reads is stuck; \
                     exiting (the trace written so far is readable)"
                );
                std::process::exit(code);
            }
        });
    if let Err(e) = spawned {
        eprintln!("llmprof: cannot start the session's watchdog: {e}");
    }
}
