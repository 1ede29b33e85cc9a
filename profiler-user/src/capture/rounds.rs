//! Timed rounds: how every cost measurement of the capture is taken (the calibration's, the wire probe's,
//! the thread-state probe's ping-pong): [`ROUNDS`] rounds, the median one used.
//!
//! Owns the round count and the median; what a round runs is the caller's.

use std::time::Instant;

/// Rounds timed per measurement; the median round is used (robust to one preemption).
pub const ROUNDS: usize = 5;

/// Median over [`ROUNDS`] of the mean ns per call of `f` in a round of `calls`.
pub(super) fn median_round(calls: u32, mut f: impl FnMut()) -> f64 {
    let calls = calls.max(1);
    let mut rounds = [0f64; ROUNDS];
    for r in &mut rounds {
        let t = Instant::now();
        for _ in 0..calls {
            f();
        }
        *r = t.elapsed().as_nanos() as f64 / f64::from(calls);
    }
    rounds.sort_by(f64::total_cmp);
    rounds[ROUNDS / 2]
}
