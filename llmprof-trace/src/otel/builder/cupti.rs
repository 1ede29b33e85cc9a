//! GPU time of request spans (CUPTI kernels, [`crate::event::cupti`]): each kernel is charged to the engine step whose host
//! time held its launch (in the default mode, each busy interval's kernel time to the step whose host time
//! held its start), and a request span gets, over the steps that served it, each step's kernel time × the
//! request's share of that step's tokens (`llmprof.gpu.kernel_time`, seconds; only in sessions with GPU
//! activity).
//!
//! Kernels are counted when their chunk arrives: work handed over after the request finished (the helper hands a
//! buffer over when CUPTI fills or flushes it) is not in that request's span. Bounded: [`STEPS_TIMED`] step
//! totals, the request's first [`STEPS_PER_REQUEST`] steps.

use std::collections::{HashMap, VecDeque};

use llmprof_abi::cupti::GpuActivityKind;
use llmprof_abi::{MAX_STEP_REQS, StepRecord};

use crate::event::cupti::{GpuApi, GpuWork, LaunchLinks};

/// Step kernel-time totals kept (oldest dropped first).
pub const STEPS_TIMED: usize = 65_536;
/// Steps of one request whose share is kept.
pub const STEPS_PER_REQUEST: usize = 16_384;

/// Kernel time per step, and the links that find a kernel's step.
#[derive(Debug, Default)]
pub(super) struct GpuTime {
    links: LaunchLinks,
    per_step: HashMap<(u32, u64), u64>,
    order: VecDeque<(u32, u64)>,
    seen: bool,
}

/// Each request's share of the step's tokens (its `req_tokens` over the batch's; equal shares without them).
pub(super) fn shares(rec: &StepRecord) -> impl Iterator<Item = (u64, f64)> + '_ {
    let n = (rec.num_req_ids as usize).min(MAX_STEP_REQS);
    let total: u64 = rec.req_tokens[..n].iter().map(|&t| u64::from(t)).sum();
    (0..n).map(move |i| {
        let share = if total > 0 {
            f64::from(rec.req_tokens[i]) / total as f64
        } else {
            1.0 / n as f64
        };
        (rec.req_ids[i], share)
    })
}

impl GpuTime {
    pub(super) fn step(&mut self, pid: u32, rec: &StepRecord) {
        self.links.step(pid, rec);
    }

    pub(super) fn api(&mut self, pid: u32, tid: u32, c: &GpuApi) {
        self.seen = true;
        self.links.call(pid, c.rec.correlation, tid, c.rec.start_ns);
    }

    pub(super) fn work(&mut self, pid: u32, w: &GpuWork) {
        self.seen = true;
        // A graph launch as a whole (the default mode) is in a busy interval too: counted there.
        if w.kind != GpuActivityKind::Kernel {
            return;
        }
        let Some(step) = w.step(pid, &self.links) else {
            return;
        };
        self.add(pid, step, w.rec.end_ns - w.rec.start_ns);
    }

    /// A busy interval (the default mode): its kernel time goes to the step whose host time holds its start.
    pub(super) fn busy(&mut self, pid: u32, b: &crate::event::cupti::GpuBusyInterval) {
        self.seen = true;
        if let Some(step) = self.links.step_at(pid, b.rec.start_ns) {
            self.add(pid, step, b.rec.busy_ns);
        }
    }

    fn add(&mut self, pid: u32, step: u64, ns: u64) {
        let key = (pid, step);
        if !self.per_step.contains_key(&key) {
            if self.order.len() == STEPS_TIMED
                && let Some(old) = self.order.pop_front()
            {
                self.per_step.remove(&old);
            }
            self.order.push_back(key);
        }
        *self.per_step.entry(key).or_default() += ns;
    }

    /// Kernel time of a request of `pid` served by `steps` (step id, share), ns; `None` in a session without GPU
    /// activity.
    pub(super) fn request_ns(&self, pid: u32, steps: &[(u64, f64)]) -> Option<f64> {
        self.seen.then(|| {
            steps
                .iter()
                .map(|&(s, share)| self.per_step.get(&(pid, s)).map_or(0.0, |&ns| ns as f64 * share))
                .sum()
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly")]
mod tests {
    use super::*;
    use crate::testing;

    const MS: u64 = 1_000_000;
    const T0: u64 = 5_000 * MS;

    #[test]
    fn shares_follow_the_tokens_or_split_equally() {
        let s = testing::step(1, 1, llmprof_abi::StepKind::Mixed, 1, 0, 1, &[7, 8])
            .req_tokens([3, 1])
            .build();
        let crate::event::EventBody::Step(rec) = &s.body else {
            panic!()
        };
        assert_eq!(shares(rec).collect::<Vec<_>>(), vec![(7, 0.75), (8, 0.25)]);
        let s = testing::step(1, 1, llmprof_abi::StepKind::Decode, 1, 0, 1, &[7, 8]).build();
        let crate::event::EventBody::Step(rec) = &s.body else {
            panic!()
        };
        assert_eq!(shares(rec).collect::<Vec<_>>(), vec![(7, 0.5), (8, 0.5)]);
    }

    #[test]
    fn a_request_gets_the_kernel_time_of_its_steps() {
        let (events, _) = testing::cupti::engine_fixture(10, 11, T0);
        let mut t = GpuTime::default();
        assert_eq!(
            t.request_ns(10, &[(1, 1.0)]),
            None,
            "no GPU activity: no attribute"
        );
        for e in &events {
            match &e.body {
                crate::event::EventBody::Step(r) => t.step(e.pid, r),
                crate::event::EventBody::GpuApi(c) => t.api(e.pid, e.tid, c),
                crate::event::EventBody::GpuWork(w) => t.work(e.pid, w),
                _ => {}
            }
        }
        // Step 1: gemm 2 ms + softmax 1 ms; step 2: the same; the copy is not kernel time.
        assert_eq!(t.request_ns(10, &[(1, 1.0), (2, 1.0)]), Some(6.0 * MS as f64));
        assert_eq!(t.request_ns(10, &[(2, 0.5)]), Some(1.5 * MS as f64));
        assert_eq!(
            t.request_ns(99, &[(1, 1.0)]),
            Some(0.0),
            "another process's steps"
        );
    }
}
