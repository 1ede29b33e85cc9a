//! What llmprof costs a session, and what it does about it: the per-hit costs measured by the calibration
//! child ([`crate::capture::calibrate_child::Background`]), the sampler's cost measured on the targets, the
//! self-accounting's samples on the timeline and the overhead budget's steps.
//!
//! Owns when each is measured or judged and what reaches the timeline; the figures themselves are the
//! self-accounting's (`selfacct`) and the budget's (`budget`). Never writes the trace: events go to the
//! session's merge.

use std::time::{Duration, Instant};

use llmprof_trace::clock::boottime_ns;
use llmprof_trace::event::{Event, EventBody, OverheadSummary};
use llmprof_trace::merge::Merger;
use llmprof_trace::names::marker;

use super::options::{AttachError, AttachOptions};
use crate::budget::{self, Budget, Verdict};
use crate::capture::Capture;
use crate::capture::calibrate::CalibrationConfig;
use crate::capture::calibrate_child::Background;
use crate::selfacct::{Counters, SelfAccount, Snapshot, TargetCpu};

/// When the sampler's cost on the targets starts being measured (past the start-up transient), and for how long:
/// the kernel's BPF run-time statistics are on for every program of the host meanwhile (two clock reads per
/// program run), so the window is short and happens once.
const LIVE_COST_FROM: Duration = Duration::from_secs(2);
/// See [`LIVE_COST_FROM`].
const LIVE_COST_FOR: Duration = Duration::from_secs(3);
/// Longest a session's end waits for its calibration child (it takes ~0.1–0.3 s on an idle 2-core machine,
/// seconds when that machine is saturated).
pub(super) const CALIBRATION_WAIT: Duration = Duration::from_secs(10);

/// Where the measurement of the sampler's cost on the targets stands ([`Capture::live_sample_cost_start`]).
enum LiveCost {
    Waiting,
    Measuring(crate::capture::stacks::LiveCost, Instant),
    Done,
}

/// Where the measurement of the per-hit costs stands ([`Background`]).
enum Calibrating {
    /// Not started yet, or never (no calibrator binary).
    NotStarted,
    /// The child runs.
    Running(Box<Background>),
    /// The costs are in the self-accounting and the budget.
    Done,
    /// No costs (said once).
    Failed,
}

/// llmprof's cost in a session: the self-accounting, the budget and the measurements they take.
pub(super) struct Costs {
    acct: SelfAccount,
    budget: Option<Budget>,
    /// The per-hit costs, measured by a child process beside the session.
    calibrating: Calibrating,
    /// The sampler's cost measured on the targets.
    live_cost: LiveCost,
    last_budget_check: Instant,
}

impl Costs {
    /// The self-accounting and the budget (`--overhead-budget`), charging nothing until the costs per hit
    /// are measured.
    pub(super) fn new(acct: SelfAccount, budget: Option<Budget>) -> Self {
        Costs {
            acct,
            budget,
            calibrating: Calibrating::NotStarted,
            live_cost: LiveCost::Waiting,
            last_budget_check: Instant::now(),
        }
    }

    /// Starts the calibration child for the probes this session attached, with the untraced references the
    /// capture took before attaching them.
    pub(super) fn start_calibration(&mut self, opts: &AttachOptions, capture: &Capture) {
        let Some(exe) = &opts.calibrator else {
            return;
        };
        let cfg = CalibrationConfig {
            engine: capture.engine_programs_loaded(),
            cuda: opts.gpu.cuda,
            thread_states: opts.thread_states,
            sample: opts.sample_hz > 0,
            http: opts.http != crate::capture::wire::HttpPorts::Off,
            untraced: capture.untraced(),
        };
        self.calibrating = match Background::spawn(exe, &cfg) {
            Ok(bg) => Calibrating::Running(Box::new(bg)),
            Err(e) => {
                note!(
                    "warning: cannot start the probe-cost calibration ({}): the overhead estimate charges nothing",
                    crate::causes::one_line(&e)
                );
                Calibrating::Failed
            }
        };
    }

    /// The budget's interval starts now (the live loop's start).
    pub(super) fn restart_budget_clock(&mut self) {
        self.last_budget_check = Instant::now();
    }

    /// The self-accounting's sample since the last one, onto the timeline (its counter tracks); the
    /// estimated overhead %.
    pub(super) fn overhead_sample(&mut self, counters: Counters, merger: &mut Merger) -> Option<f64> {
        let level = self.budget.as_ref().map_or(0, Budget::level);
        let sample = self.acct.sample(counters, level);
        let est_pct = sample.est_overhead_pct;
        merger.push(Event {
            ts_ns: boottime_ns(),
            pid: 0,
            tid: 0,
            body: EventBody::Overhead(Box::new(sample)),
        });
        est_pct
    }

    /// Takes the calibration child's result once it came (waiting at most `wait` for it): the self-accounting
    /// and the budget charge its costs from then on, over the whole session. A failure is said once. True
    /// when the costs came now.
    pub(super) fn calibration_step(&mut self, wait: Option<Duration>) -> bool {
        let Calibrating::Running(bg) = &mut self.calibrating else {
            return false;
        };
        let got = match wait {
            Some(limit) => bg.wait(limit).cloned(),
            None => bg.poll().cloned(),
        };
        match got {
            Some(Ok(cal)) => {
                log::debug!("attach: calibrated in {:.1} ms", cal.took_ms);
                self.acct.set_calibration(cal);
                if let Some(b) = self.budget.as_mut() {
                    b.set_calibration(cal);
                }
                self.calibrating = Calibrating::Done;
                return true;
            }
            Some(Err(why)) => {
                note!("warning: probe costs not measured: {why}; the overhead estimate charges nothing");
                self.calibrating = Calibrating::Failed;
            }
            None if wait.is_some() => {
                note!("warning: probe costs not measured in time; the overhead estimate charges nothing");
                self.calibrating = Calibrating::Failed;
            }
            None => {}
        }
        false
    }

    /// Judges the overhead budget when its interval has passed, and records the step it takes.
    pub(super) fn budget_step(
        &mut self,
        capture: &mut Capture,
        targets: &TargetCpu,
        merger: &mut Merger,
    ) -> Result<(), AttachError> {
        if let Some(b) = self.budget.as_mut()
            && self.last_budget_check.elapsed() >= b.interval()
        {
            self.last_budget_check = Instant::now();
            if let Some(ev) = check_budget(b, capture, targets)? {
                merger.push(ev);
            }
        }
        Ok(())
    }

    /// The sampler's cost on the targets (their Python stacks included), measured once from
    /// [`LIVE_COST_FROM`] for [`LIVE_COST_FOR`] after the live loop's start (`since_start` ago); the
    /// self-accounting charges every sample that figure from then on (the start-up figure, on llmprof's own
    /// thread, knows no Python frames).
    pub(super) fn live_cost_step(&mut self, since_start: Duration, capture: &mut Capture) {
        self.live_cost = match std::mem::replace(&mut self.live_cost, LiveCost::Done) {
            LiveCost::Waiting if since_start >= LIVE_COST_FROM => match capture.live_sample_cost_start() {
                Some(c) => LiveCost::Measuring(c, Instant::now()),
                None => LiveCost::Done,
            },
            LiveCost::Measuring(c, t) if t.elapsed() >= LIVE_COST_FOR => {
                let f = capture.live_sample_cost_finish(c);
                if let Some(ns) = f.sample_ns {
                    log::info!("stack sampler: {ns:.0} ns per sample of the targets (measured on them)");
                }
                self.acct.set_live(f);
                LiveCost::Done
            }
            other => other,
        };
    }

    /// A session that ends inside the live-cost window still has a figure from what it measured.
    pub(super) fn finish_live_cost(&mut self, capture: &mut Capture) {
        if let LiveCost::Measuring(c, _) = std::mem::replace(&mut self.live_cost, LiveCost::Done) {
            let f = capture.live_sample_cost_finish(c);
            self.acct.set_live(f);
        }
    }

    /// The session's overhead summary at the end, from the final `counters`.
    pub(super) fn summary(&mut self, counters: Counters) -> OverheadSummary {
        self.acct.summary(
            counters,
            self.budget.as_ref().map(Budget::pct),
            self.budget
                .as_ref()
                .map(|b| b.taken().to_vec())
                .unwrap_or_default(),
        )
    }
}

/// Judges the overhead budget and takes its next step when it is exceeded; the event to record, if any.
fn check_budget(
    b: &mut Budget,
    capture: &mut Capture,
    targets: &TargetCpu,
) -> Result<Option<Event>, AttachError> {
    let body = match b.check(Snapshot::take(targets, Counters::of(capture))) {
        Verdict::Ok => return Ok(None),
        Verdict::Degrade { level, overhead_pct } => {
            let d = budget::apply(capture, level, overhead_pct, b.pct())?;
            note!(
                "llmprof: overhead budget {}% exceeded (est. {overhead_pct:.1}% of the target's CPU): {}",
                b.pct(),
                d.change
            );
            b.record(d.clone());
            EventBody::Degraded(d)
        }
        Verdict::Exhausted { overhead_pct } => {
            let text = marker::budget_exhausted(b.pct(), overhead_pct);
            note!("llmprof: {text}");
            EventBody::Marker { text }
        }
    };
    Ok(Some(Event {
        ts_ns: boottime_ns(),
        pid: 0,
        tid: 0,
        body,
    }))
}
