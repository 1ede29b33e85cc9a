//! serve's per-alert log lines on stderr, rate-limited: a storm of alerts (a webhook of thousands, a poll of
//! thousands) writes a few lines and one count of what it left out, not a line per alert into the journal.
//!
//! Owns the limiter only: at most [`BURST`] lines per [`WINDOW`]; past them lines are counted, and the first
//! line of a later window says how many were left out. Lines about serve itself (start, stop, quota) do not
//! go through here.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Lines written per window.
pub const BURST: u32 = 20;
/// The window.
pub const WINDOW: Duration = Duration::from_secs(10);

#[derive(Debug)]
struct State {
    start: Instant,
    written: u32,
    left_out: u64,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

/// What [`Limiter::admit`] decided: write the line (after a note of how many were left out before it), or not.
#[derive(Debug, PartialEq, Eq)]
enum Decision {
    Write { left_out_before: u64 },
    Drop,
}

fn admit(state: &mut Option<State>, now: Instant) -> Decision {
    let s = state.get_or_insert(State {
        start: now,
        written: 0,
        left_out: 0,
    });
    if now.duration_since(s.start) >= WINDOW {
        let left_out_before = std::mem::take(&mut s.left_out);
        s.start = now;
        s.written = 1;
        return Decision::Write { left_out_before };
    }
    if s.written < BURST {
        s.written += 1;
        return Decision::Write { left_out_before: 0 };
    }
    s.left_out += 1;
    Decision::Drop
}

/// Writes `llmprof serve: LINE` unless the limit is reached.
pub fn line(text: &str) {
    let d = admit(
        &mut STATE.lock().unwrap_or_else(|e| e.into_inner()),
        Instant::now(),
    );
    if let Decision::Write { left_out_before } = d {
        if left_out_before > 0 {
            eprintln!("llmprof serve: ({left_out_before} similar lines left out in the last {WINDOW:?})");
        }
        eprintln!("llmprof serve: {text}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_storm_writes_a_burst_then_one_count() {
        let mut s = None;
        let t0 = Instant::now();
        let written = (0..9000).filter(|_| admit(&mut s, t0) != Decision::Drop).count();
        assert_eq!(written, BURST as usize);
        assert_eq!(
            admit(&mut s, t0 + WINDOW),
            Decision::Write {
                left_out_before: 9000 - u64::from(BURST)
            }
        );
        assert_eq!(admit(&mut s, t0 + WINDOW), Decision::Write { left_out_before: 0 });
    }
}
