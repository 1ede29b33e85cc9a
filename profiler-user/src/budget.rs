//! `--overhead-budget`: keeps llmprof's estimated cost to the target under a limit by tracing less.
//!
//! Owns the budget's definition, the documented degradation order and the decision to take the next step.
//! **Definition**: the estimated CPU time llmprof's probes add to the target (hits × the cost per hit
//! calibrated beside the session, [`crate::selfacct`]) as a percentage of the target's own CPU time over the same
//! window (all threads, measured from /proc, minus the estimate, since the kernel charges the probes to the
//! target). For a CPU-bound target this is its slowdown. It is judged every [`CHECK_INTERVAL`] once the
//! target used at least [`MIN_TARGET_CPU`] of CPU in the window (an idle target is never judged on noise);
//! once a step was taken, the next windows are shorter ([`FOLLOW_UP_INTERVAL`], [`FOLLOW_UP_MIN_CPU`]) so a
//! target far over budget reaches the step that helps in ~160 ms rather than ~300 ms.
//!
//! **Order** ([`LEVELS`]), one step per judgment that exceeds the budget, never undone within a session:
//! 1. `syscall_events_off` — individual (slow) syscall events stop; the kernel aggregates continue;
//! 2. `ranges_sampled` — NVTX-style ranges of 1 step in [`RANGE_SAMPLE_EVERY`] only;
//! 3. `thread_states_off` — the thread-state programs write nothing more (the `ThreadStatesOff` knob: each
//!    switch of a traced thread still runs the program up to the knob test, a few ns): Perfetto's thread-state
//!    rows and the report's thread section end at this point. Before the CUDA probes because a thread state is
//!    context around the other events, not an event of the engine itself;
//! 4. `cuda_detached` — the CUDA driver uprobes (entry + return per call, µs each) are detached and none is
//!    attached later: CUDA call events stop (this is what removes the cost of a launch-heavy target; they
//!    are neither engine steps nor requests);
//! 5. `http_sse_off` — the HTTP wire probe stops sending a record per SSE write after each response's first
//!    content event (wire TTFT, request counts and ends stay; wire inter-token gaps stop);
//! 6. `syscalls_detached` — the raw_syscalls programs are detached: aggregates freeze, model-file, egress and
//!    wire (HTTP) events stop (this is what removes the per-syscall cost of a syscall-heavy target);
//! 7. `ranges_detached` — the range uprobe is detached;
//! 8. `sample_rate_halved` — the stack sampler keeps one sample in 2 per CPU (`Knob::SampleEvery`);
//! 9. `sampling_stopped` — the sampler's perf events are closed: no more stack samples.
//!
//! Sampling comes last: at the default 99 Hz it costs the target about one sampler run (a few µs, calibrated
//! as `sample_ns`) per busy thread every 10 ms, far below what the earlier steps remove, and flame graphs are
//! what a user looks at once steps and requests are known.
//!
//! Engine steps and request events are kept to the end: when the budget is still exceeded at the last level
//! that is said once ([`Budget::exhausted`]). Each step is applied by [`apply`] and written to the trace as
//! an instant (`EventBody::Degraded`) and to the summary.

use std::time::Duration;

use llmprof_abi::{Knob, ProbeId};

use crate::capture::{Calibration, Capture, CaptureError};
use crate::selfacct::{Snapshot, added_ns, overhead_pct};
use llmprof_trace::event::Degradation;

/// How often the budget is judged: short, so a target that blows the budget pays for at most a few
/// windows before the steps that fix it are taken.
pub const CHECK_INTERVAL: Duration = Duration::from_millis(100);
/// Target CPU a window must hold before it is judged (below it the estimate is noise).
pub const MIN_TARGET_CPU: Duration = Duration::from_millis(20);
/// Window length once a step was taken: the first judgment showed the estimate is meaningful.
pub const FOLLOW_UP_INTERVAL: Duration = Duration::from_millis(30);
/// Target CPU a follow-up window must hold.
pub const FOLLOW_UP_MIN_CPU: Duration = Duration::from_millis(10);
/// `ranges_sampled`: the ranges of one step in this many are kept.
pub const RANGE_SAMPLE_EVERY: u64 = 16;

/// The degradation steps, in order: `(name, what changes)`. Level N means the first N are in force.
pub const LEVELS: [(&str, &str); 9] = [
    (
        "syscall_events_off",
        "individual syscall events off; kernel syscall aggregates continue",
    ),
    (
        "ranges_sampled",
        "NVTX-style ranges sampled: 1 step in 16 (steps and requests complete)",
    ),
    (
        "thread_states_off",
        "thread states off: no more sched_switch / sched_waking records (Perfetto thread-state rows end here)",
    ),
    (
        "cuda_detached",
        "CUDA driver uprobes detached: CUDA call events stop (steps and requests complete)",
    ),
    (
        "http_sse_off",
        "wire probe: per-SSE-write records off after each response's first content event (TTFT, ends and \
         request counts stay)",
    ),
    (
        "syscalls_detached",
        "raw_syscalls programs detached: syscall aggregates frozen, model-file and egress events stop",
    ),
    (
        "ranges_detached",
        "range uprobe detached; engine steps and requests only",
    ),
    (
        "sample_rate_halved",
        "stack sampler keeps 1 sample in 2 (half the --sample-rate)",
    ),
    (
        "sampling_stopped",
        "stack sampler detached: no more CPU samples; engine steps and requests only",
    ),
];

/// Parses `1%`, `0.5%` or `2` (percent) into a percentage in (0, 100].
pub fn parse_percent(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let num = t.strip_suffix('%').unwrap_or(t).trim();
    let v: f64 = num
        .parse()
        .map_err(|_| format!("invalid budget {s:?} (examples: 1%, 0.5%)"))?;
    if !v.is_finite() || v <= 0.0 || v > 100.0 {
        return Err(format!("budget {s:?} must be above 0% and at most 100%"));
    }
    Ok(v)
}

/// What the budget decided at a check.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Not judged yet (window too short or too little target CPU) or within the budget.
    Ok,
    /// Over budget: take step `level` (1-based index into [`LEVELS`]).
    Degrade {
        /// The level to enter.
        level: u32,
        /// The estimate, % of the target's CPU.
        overhead_pct: f64,
    },
    /// Over budget at the last level (said once).
    Exhausted {
        /// The estimate, % of the target's CPU.
        overhead_pct: f64,
    },
}

/// The budget's state in a session.
#[derive(Debug)]
pub struct Budget {
    pct: f64,
    cal: Calibration,
    level: u32,
    window_start: Snapshot,
    exhausted: bool,
    taken: Vec<Degradation>,
}

impl Budget {
    /// A budget of `pct` % judged from `start` on.
    pub fn new(pct: f64, cal: Calibration, start: Snapshot) -> Self {
        Budget {
            pct,
            cal,
            level: 0,
            window_start: start,
            exhausted: false,
            taken: Vec::new(),
        }
    }

    /// The costs per hit to judge by, once measured (until then nothing is charged, so the budget holds).
    pub fn set_calibration(&mut self, cal: Calibration) {
        self.cal = cal;
    }

    /// The budget, %.
    pub fn pct(&self) -> f64 {
        self.pct
    }

    /// The level in force (0: full tracing).
    pub fn level(&self) -> u32 {
        self.level
    }

    /// Whether the last level was reached and the budget is still exceeded.
    pub fn exhausted(&self) -> bool {
        self.exhausted
    }

    /// The steps taken so far.
    pub fn taken(&self) -> &[Degradation] {
        &self.taken
    }

    /// How long the current window must last before [`Budget::check`] judges it.
    pub fn interval(&self) -> Duration {
        if self.level == 0 {
            CHECK_INTERVAL
        } else {
            FOLLOW_UP_INTERVAL
        }
    }

    /// Judges the window ending at `now`. A judged window (over or under) starts the next one.
    pub fn check(&mut self, now: Snapshot) -> Verdict {
        let (Some(t0), Some(t1)) = (self.window_start.target_cpu_ns, now.target_cpu_ns) else {
            return Verdict::Ok;
        };
        let target = t1.saturating_sub(t0);
        let min_cpu = if self.level == 0 {
            MIN_TARGET_CPU
        } else {
            FOLLOW_UP_MIN_CPU
        };
        if now.at.duration_since(self.window_start.at) < self.interval() || target < min_cpu.as_nanos() as u64
        {
            return Verdict::Ok;
        }
        let added: f64 = added_ns(&self.cal, &self.window_start.counters, &now.counters)
            .iter()
            .sum();
        self.window_start = now;
        let pct = overhead_pct(added, target as f64);
        if pct <= self.pct || self.exhausted {
            return Verdict::Ok;
        }
        if (self.level as usize) < LEVELS.len() {
            self.level += 1;
            Verdict::Degrade {
                level: self.level,
                overhead_pct: pct,
            }
        } else {
            self.exhausted = true;
            Verdict::Exhausted { overhead_pct: pct }
        }
    }

    /// Records a step that [`apply`] took.
    pub fn record(&mut self, d: Degradation) {
        self.taken.push(d);
    }
}

/// Puts `level` (1-based) in force on the capture and describes it; `syscalls_counted` is the kernel's
/// syscall count at that moment.
pub fn apply(
    capture: &mut Capture,
    level: u32,
    overhead_pct: f64,
    budget_pct: f64,
) -> Result<Degradation, CaptureError> {
    let idx = (level as usize).clamp(1, LEVELS.len()) - 1;
    let (name, what) = LEVELS[idx];
    let mut change = what.to_owned();
    match idx {
        0 => capture.set_knob(Knob::SyscallEventsOff, 1)?,
        1 => capture.set_knob(Knob::RangeSampleEvery, RANGE_SAMPLE_EVERY)?,
        2 => capture.set_knob(Knob::ThreadStatesOff, 1)?,
        3 => {
            if !capture.detach_cuda()? {
                change.push_str(" (none was attached)");
            }
        }
        4 => capture.set_knob(Knob::HttpSseOff, 1)?,
        5 => {
            if !capture.detach_syscalls()? {
                change.push_str(" (were not attached)");
            }
        }
        6 => {
            if !capture.detach_ranges()? {
                change.push_str(" (no range uprobe was attached)");
            }
        }
        7 => capture.set_knob(Knob::SampleEvery, 2)?,
        _ => {
            if !capture.detach_sampler()? {
                change.push_str(" (was not sampling)");
            }
        }
    }
    Ok(Degradation {
        level,
        name,
        change,
        overhead_pct,
        budget_pct,
        syscalls_counted: capture.counters()[ProbeId::Syscalls as usize].hits,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::selfacct::Counters;

    fn snap(at: Instant, ms: u64, syscalls: u64, target_cpu_ms: u64) -> Snapshot {
        let mut counters = Counters::default();
        counters.probes[ProbeId::Syscalls as usize].hits = syscalls;
        Snapshot {
            at: at + Duration::from_millis(ms),
            counters,
            target_cpu_ns: Some(target_cpu_ms * 1_000_000),
            self_cpu_ns: 0,
        }
    }

    fn cal() -> Calibration {
        Calibration {
            syscall_ns: 1_000.0,
            ..Calibration::default()
        }
    }

    #[test]
    fn percentages_parse_with_or_without_the_sign() {
        assert_eq!(parse_percent("1%"), Ok(1.0));
        assert_eq!(parse_percent("0.5"), Ok(0.5));
        assert!(parse_percent("0%").is_err());
        assert!(parse_percent("150%").is_err());
        assert!(parse_percent("lots").unwrap_err().contains("examples"));
    }

    #[test]
    fn steps_are_taken_in_order_one_per_exceeding_window_then_exhausted_once() {
        let t = Instant::now();
        let mut b = Budget::new(1.0, cal(), snap(t, 0, 0, 0));
        // 50k syscalls × 1 µs = 50 ms added to 100 ms of target CPU: +100 %.
        let mut levels = Vec::new();
        for i in 1..=11u64 {
            match b.check(snap(t, 100 * i, 50_000 * i, 100 * i)) {
                Verdict::Degrade { level, overhead_pct } => {
                    assert!((overhead_pct - 100.0).abs() < 1e-6);
                    levels.push(level)
                }
                Verdict::Exhausted { .. } => levels.push(99),
                Verdict::Ok => levels.push(0),
            }
        }
        assert_eq!(levels, [1, 2, 3, 4, 5, 6, 7, 8, 9, 99, 0]);
        assert!(b.exhausted());
    }

    #[test]
    fn after_a_step_the_windows_are_shorter() {
        let t = Instant::now();
        let mut b = Budget::new(1.0, cal(), snap(t, 0, 0, 0));
        assert_eq!(b.interval(), CHECK_INTERVAL);
        assert!(matches!(
            b.check(snap(t, 100, 50_000, 100)),
            Verdict::Degrade { level: 1, .. }
        ));
        assert_eq!(b.interval(), FOLLOW_UP_INTERVAL);
        // 30 ms later, 15 ms of target CPU of which 7.5 ms added: judged, next step.
        assert!(matches!(
            b.check(snap(t, 130, 57_500, 115)),
            Verdict::Degrade { level: 2, .. }
        ));
    }

    #[test]
    fn short_windows_idle_targets_and_a_met_budget_change_nothing() {
        let t = Instant::now();
        let mut b = Budget::new(1.0, cal(), snap(t, 0, 0, 0));
        assert_eq!(b.check(snap(t, 50, 50_000, 50)), Verdict::Ok, "window too short");
        assert_eq!(
            b.check(snap(t, 500, 50_000, 10)),
            Verdict::Ok,
            "10 ms of target CPU: not judged"
        );
        // 500 syscalls × 1 µs = 0.5 ms of 200 ms: 0.25 %.
        let mut b = Budget::new(1.0, cal(), snap(t, 0, 0, 0));
        assert_eq!(b.check(snap(t, 200, 500, 200)), Verdict::Ok);
        assert_eq!(b.level(), 0);
    }
}
