//! Turning the stream of CUDA driver calls into a readable, bounded set of slices.
//!
//! Owns the policy of what is shown one by one and what is aggregated, per calling thread:
//! - synchronize calls (`cuStreamSynchronize`, `cuCtxSynchronize`, `cuEventSynchronize`) are always their
//!   own slice: they are where the host waits for the GPU;
//! - copies, allocations and frees are their own slice when they take at least [`INDIVIDUAL_MIN_NS`];
//! - kernel and graph launches (and the shorter copies/allocations) are gathered into batch slices: when the
//!   process has llmprof's engine probes, per engine step (a batch ends at the step's end, and every batch
//!   that started inside a step carries its `step_id`: batches wait, bounded, for the step record, which the
//!   engine emits when the step ends), otherwise per [`WINDOW_NS`] window; a batch also ends at any
//!   individually shown call on its thread (typically the step's copy of results or its synchronize), so the
//!   slices of a thread never overlap (calls nested in an individual call are shown individually, inside it);
//! - launch-type calls counted in the kernel instead of timed (the default; `llmprof_abi::cuda`) come
//!   as windows of counts ([`CudaAggregator::counted`]) and join the batch like the calls they count, with
//!   no host time;
//! - at most [`INDIVIDUAL_PER_SEC`] individual slices per thread and second; calls beyond it join the batch
//!   and are counted in [`AggStats::over_budget`].
//!
//! Pure code: events in, [`CudaSlice`]s out, tested without a kernel. The Perfetto sink renders the slices.

use std::collections::{BTreeMap, HashMap, HashSet};

use llmprof_abi::{CudaClass, CudaFunc, CudaVariant};

/// Window of a launch batch without engine probes (10 ms: a few hundred launches of a busy decode loop).
pub const WINDOW_NS: u64 = 10_000_000;
/// Longest batch with engine probes (a batch normally ends at its step; this bounds an idle engine's).
pub const ENGINE_MAX_BATCH_NS: u64 = 1_000_000_000;
/// Copies, allocations and frees at least this long (50 µs) get their own slice; shorter ones are batched.
pub const INDIVIDUAL_MIN_NS: u64 = 50_000;
/// Most individual slices per thread and second; past it calls are batched (a runaway loop of
/// synchronize calls stays bounded).
pub const INDIVIDUAL_PER_SEC: u32 = 2_000;

/// Most finished batches waiting for their engine step record; past it the oldest are written unlabelled.
pub const MAX_PENDING: usize = 4096;

/// Why a batch ended, as shown in its args.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchEnd {
    /// An engine step ended.
    Step,
    /// The time window elapsed.
    Window,
    /// An individually shown call on the same thread.
    Call,
    /// The end of the trace.
    End,
}

/// What a [`CudaSlice`] shows.
#[derive(Clone, Debug, PartialEq)]
pub enum CudaSliceKind {
    /// One call.
    Call {
        /// The function.
        func: CudaFunc,
        /// Which of its symbols.
        variant: CudaVariant,
        /// The recorded argument ([`CudaFunc::arg`]).
        arg: u64,
        /// The `CUresult`.
        result: u32,
    },
    /// Several calls gathered.
    Batch {
        /// Calls per function: (count, total host ns).
        funcs: BTreeMap<CudaFunc, (u64, u64)>,
        /// Calls in the batch.
        calls: u64,
        /// Sum of the calls' host times, ns.
        host_total_ns: u64,
        /// Longest call, ns.
        max_ns: u64,
        /// Calls that returned an error.
        errors: u64,
        /// Why the batch ended.
        end: BatchEnd,
        /// Whether the batch followed engine steps (else the time window).
        per_step: bool,
        /// Calls of `calls` that were counted, not timed (the default for launch-type calls): they add
        /// nothing to the host times.
        counted: u64,
        /// Bytes of the counted copies.
        counted_bytes: u64,
    },
}

/// A slice on a thread's CUDA track.
#[derive(Clone, Debug, PartialEq)]
pub struct CudaSlice {
    /// Process.
    pub pid: u32,
    /// Calling thread.
    pub tid: u32,
    /// Start (entry of the first call), BOOTTIME ns.
    pub ts_ns: u64,
    /// Duration (to the return of the last call), ns.
    pub dur_ns: u64,
    /// The engine step it belongs to (it started inside the step's host interval), when known.
    pub step_id: Option<u64>,
    /// What it shows.
    pub kind: CudaSliceKind,
}

/// What the aggregator saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AggStats {
    /// Calls seen.
    pub calls: u64,
    /// Calls shown one by one.
    pub individual: u64,
    /// Batch slices written.
    pub batches: u64,
    /// Calls inside batches.
    pub batched_calls: u64,
    /// Calls batched because their thread exceeded [`INDIVIDUAL_PER_SEC`].
    pub over_budget: u64,
}

#[derive(Debug)]
struct Batch {
    start: u64,
    end: u64,
    funcs: BTreeMap<CudaFunc, (u64, u64)>,
    calls: u64,
    host_total_ns: u64,
    max_ns: u64,
    errors: u64,
    counted: u64,
    counted_bytes: u64,
}

impl Batch {
    fn new(start: u64, end: u64) -> Self {
        Self {
            start,
            end,
            funcs: BTreeMap::new(),
            calls: 0,
            host_total_ns: 0,
            max_ns: 0,
            errors: 0,
            counted: 0,
            counted_bytes: 0,
        }
    }
}

#[derive(Debug, Default)]
struct ThreadState {
    batch: Option<Batch>,
    /// End of the last individual slice: calls starting before it are nested in it.
    busy_until: u64,
    /// (second, individual slices in it).
    budget: (u64, u32),
}

/// The aggregator; feed it ordered events.
#[derive(Debug, Default)]
pub struct CudaAggregator {
    engine_pids: HashSet<u32>,
    threads: HashMap<(u32, u32), ThreadState>,
    /// Finished batches of engine processes, waiting for the step record that labels them.
    pending: Vec<CudaSlice>,
    next_sweep: u64,
    stats: AggStats,
}

impl CudaAggregator {
    /// An aggregator; batches of `engine_pids` follow engine steps, the others a time window.
    pub fn new(engine_pids: impl IntoIterator<Item = u32>) -> Self {
        Self {
            engine_pids: engine_pids.into_iter().collect(),
            ..Self::default()
        }
    }

    /// What it saw so far.
    pub fn stats(&self) -> AggStats {
        self.stats
    }

    fn max_batch(&self, pid: u32) -> u64 {
        if self.engine_pids.contains(&pid) {
            ENGINE_MAX_BATCH_NS
        } else {
            WINDOW_NS
        }
    }

    /// One call (event time `ts_ns` = its entry).
    #[expect(clippy::too_many_arguments, reason = "the fields of one CudaCall event")]
    pub fn call(
        &mut self,
        pid: u32,
        tid: u32,
        ts_ns: u64,
        func: CudaFunc,
        variant: CudaVariant,
        dur_ns: u64,
        arg: u64,
        result: u32,
        out: &mut Vec<CudaSlice>,
    ) {
        self.stats.calls += 1;
        let per_step = self.engine_pids.contains(&pid);
        let st = self.threads.entry((pid, tid)).or_default();
        let end = ts_ns.saturating_add(dur_ns);
        let individual = ts_ns < st.busy_until
            || match func.class() {
                CudaClass::Sync => true,
                CudaClass::Launch => false,
                CudaClass::Memcpy | CudaClass::Alloc => dur_ns >= INDIVIDUAL_MIN_NS,
            };
        let nested = ts_ns < st.busy_until;
        let second = ts_ns / 1_000_000_000;
        if st.budget.0 != second {
            st.budget = (second, 0);
        }
        let over_budget = individual && !nested && st.budget.1 >= INDIVIDUAL_PER_SEC;
        if individual && !over_budget {
            st.budget.1 += 1;
            st.busy_until = st.busy_until.max(end);
            let open = if nested { None } else { st.batch.take() };
            if let Some(b) = open {
                let slice = close(pid, tid, b, BatchEnd::Call, per_step);
                self.emit(slice, out);
            }
            self.stats.individual += 1;
            let slice = CudaSlice {
                pid,
                tid,
                ts_ns,
                dur_ns,
                step_id: None,
                kind: CudaSliceKind::Call {
                    func,
                    variant,
                    arg,
                    result,
                },
            };
            self.emit(slice, out);
            return;
        }
        if over_budget {
            self.stats.over_budget += 1;
        }
        let b = self.open_batch(pid, tid, ts_ns, end, out);
        b.end = b.end.max(end);
        let f = b.funcs.entry(func).or_default();
        f.0 += 1;
        f.1 += dur_ns;
        b.calls += 1;
        b.host_total_ns += dur_ns;
        b.max_ns = b.max_ns.max(dur_ns);
        b.errors += u64::from(result != 0);
        self.stats.batched_calls += 1;
    }

    /// The open batch of `(pid, tid)` a call at `ts_ns` joins: the current one unless it is older than its
    /// window (then it is written and a new one begins).
    fn open_batch(
        &mut self,
        pid: u32,
        tid: u32,
        ts_ns: u64,
        end: u64,
        out: &mut Vec<CudaSlice>,
    ) -> &mut Batch {
        let max_batch = self.max_batch(pid);
        let per_step = self.engine_pids.contains(&pid);
        let st = self.threads.entry((pid, tid)).or_default();
        if st
            .batch
            .as_ref()
            .is_some_and(|b| ts_ns.saturating_sub(b.start) >= max_batch)
            && let Some(b) = st.batch.take()
        {
            let slice = close(pid, tid, b, BatchEnd::Window, per_step);
            self.emit(slice, out);
        }
        self.threads
            .entry((pid, tid))
            .or_default()
            .batch
            .get_or_insert_with(|| Batch::new(ts_ns, end))
    }

    /// A window of counted calls of one thread (`calls` in `llmprof_abi::cuda::COUNTED` order), its
    /// first call's entry at `first_ns`, its last one's at `last_ns`: they join the thread's batch like the
    /// launches they are, without host times.
    #[expect(clippy::too_many_arguments, reason = "the fields of one CudaCount event")]
    pub fn counted(
        &mut self,
        pid: u32,
        tid: u32,
        first_ns: u64,
        last_ns: u64,
        calls: &[u32; 8],
        bytes: u64,
        out: &mut Vec<CudaSlice>,
    ) {
        let n: u64 = calls.iter().map(|&c| u64::from(c)).sum();
        if n == 0 {
            return;
        }
        self.stats.calls += n;
        self.stats.batched_calls += n;
        let b = self.open_batch(pid, tid, first_ns, last_ns, out);
        b.end = b.end.max(last_ns);
        for (f, &c) in llmprof_abi::cuda::COUNTED.iter().zip(calls) {
            if c > 0 {
                b.funcs.entry(*f).or_default().0 += u64::from(c);
            }
        }
        b.calls += n;
        b.counted += n;
        b.counted_bytes += bytes;
    }

    /// Writes a finished slice, or, for an engine process, keeps it until its step record arrives.
    fn emit(&mut self, slice: CudaSlice, out: &mut Vec<CudaSlice>) {
        if matches!(slice.kind, CudaSliceKind::Batch { .. }) {
            self.stats.batches += 1;
        }
        if !self.engine_pids.contains(&slice.pid) {
            out.push(slice);
            return;
        }
        if self.pending.len() >= MAX_PENDING {
            out.push(self.pending.remove(0));
        }
        self.pending.push(slice);
    }

    /// An engine step of `pid` ran over `[host_start_ns, host_end_ns]` (its record arrives at its end): its
    /// threads' open batches end with it, and every slice of `pid` that started inside it gets its id. A step
    /// makes `pid` an engine from now on (a process of the tree that started an engine after the attach).
    pub fn step(
        &mut self,
        pid: u32,
        host_start_ns: u64,
        host_end_ns: u64,
        step_id: u64,
        out: &mut Vec<CudaSlice>,
    ) {
        self.engine_pids.insert(pid);
        let mut keys: Vec<(u32, u32)> = self
            .threads
            .iter()
            .filter(|((p, _), st)| *p == pid && st.batch.as_ref().is_some_and(|b| b.start < host_end_ns))
            .map(|(k, _)| *k)
            .collect();
        keys.sort_unstable();
        for k in keys {
            if let Some(b) = self.threads.get_mut(&k).and_then(|st| st.batch.take()) {
                let slice = close(k.0, k.1, b, BatchEnd::Step, true);
                self.emit(slice, out);
            }
        }
        let (mine, rest): (Vec<CudaSlice>, Vec<CudaSlice>) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|s| s.pid == pid);
        self.pending = rest;
        for mut s in mine {
            if s.ts_ns >= host_start_ns && s.ts_ns < host_end_ns {
                s.step_id = Some(step_id);
            }
            out.push(s);
        }
    }

    /// Time advanced to `now_ns` (any event): ends batches older than their window, so an idle thread's
    /// batch is written soon. Cheap when called often: it sweeps at most every half window.
    pub fn advance(&mut self, now_ns: u64, out: &mut Vec<CudaSlice>) {
        if now_ns < self.next_sweep {
            return;
        }
        self.next_sweep = now_ns + WINDOW_NS / 2;
        let mut keys: Vec<(u32, u32)> = Vec::new();
        for ((pid, tid), st) in &self.threads {
            let max = self.max_batch(*pid);
            if st
                .batch
                .as_ref()
                .is_some_and(|b| now_ns.saturating_sub(b.start) >= max)
            {
                keys.push((*pid, *tid));
            }
        }
        keys.sort_unstable();
        for k in keys {
            let per_step = self.engine_pids.contains(&k.0);
            if let Some(b) = self.threads.get_mut(&k).and_then(|st| st.batch.take()) {
                let slice = close(k.0, k.1, b, BatchEnd::Window, per_step);
                self.emit(slice, out);
            }
        }
        // Batches whose step record never came (an engine thread outside steps) are written unlabelled.
        let (old, young): (Vec<CudaSlice>, Vec<CudaSlice>) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|s| now_ns.saturating_sub(s.ts_ns) >= ENGINE_MAX_BATCH_NS);
        self.pending = young;
        out.extend(old);
    }

    /// Ends every open batch (end of the trace).
    pub fn finish(&mut self, out: &mut Vec<CudaSlice>) {
        let mut keys: Vec<(u32, u32)> = self.threads.keys().copied().collect();
        keys.sort_unstable();
        for k in keys {
            let per_step = self.engine_pids.contains(&k.0);
            if let Some(b) = self.threads.get_mut(&k).and_then(|st| st.batch.take()) {
                let slice = close(k.0, k.1, b, BatchEnd::End, per_step);
                self.emit(slice, out);
            }
        }
        out.append(&mut self.pending);
    }
}

fn close(pid: u32, tid: u32, b: Batch, end: BatchEnd, per_step: bool) -> CudaSlice {
    CudaSlice {
        pid,
        tid,
        ts_ns: b.start,
        dur_ns: b.end.saturating_sub(b.start),
        step_id: None,
        kind: CudaSliceKind::Batch {
            funcs: b.funcs,
            calls: b.calls,
            host_total_ns: b.host_total_ns,
            max_ns: b.max_ns,
            errors: b.errors,
            end,
            per_step,
            counted: b.counted,
            counted_bytes: b.counted_bytes,
        },
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests panic with the error")]
mod tests {
    use super::*;

    fn call(a: &mut CudaAggregator, tid: u32, ts: u64, func: CudaFunc, dur: u64, out: &mut Vec<CudaSlice>) {
        a.call(1, tid, ts, func, CudaVariant::Plain, dur, 0, 0, out);
    }

    fn batch_calls(s: &CudaSlice) -> u64 {
        match &s.kind {
            CudaSliceKind::Batch { calls, .. } => *calls,
            CudaSliceKind::Call { .. } => 0,
        }
    }

    #[test]
    fn counted_windows_join_the_step_batch_without_host_time() {
        let mut a = CudaAggregator::new([1]);
        let mut out = Vec::new();
        // Two windows of counted calls (kernel side: the second began 10 ms after the first), then the
        // step's synchronize, individually timed.
        let mut w1 = [0u32; 8];
        w1[0] = 60; // cuLaunchKernel
        w1[4] = 2; // cuMemcpyHtoDAsync
        let mut w2 = [0u32; 8];
        w2[0] = 40;
        w2[2] = 1; // cuGraphLaunch
        a.counted(1, 7, 1_000, 9_000_000, &w1, 4096, &mut out);
        a.counted(1, 7, 11_000_000, 12_000_000, &w2, 0, &mut out);
        call(
            &mut a,
            7,
            12_500_000,
            CudaFunc::StreamSynchronize,
            1_000_000,
            &mut out,
        );
        a.step(1, 500, 14_000_000, 3, &mut out);
        assert_eq!(out.len(), 2, "{out:#?}");
        let CudaSliceKind::Batch {
            funcs,
            calls,
            host_total_ns,
            counted,
            counted_bytes,
            end,
            ..
        } = &out[0].kind
        else {
            panic!("{:?}", out[0]);
        };
        assert_eq!(
            (*calls, *counted, *counted_bytes, *host_total_ns),
            (103, 103, 4096, 0)
        );
        assert_eq!(funcs[&CudaFunc::LaunchKernel], (100, 0));
        assert_eq!(funcs[&CudaFunc::MemcpyHtoDAsync], (2, 0));
        assert_eq!(funcs[&CudaFunc::GraphLaunch], (1, 0));
        assert_eq!(*end, BatchEnd::Call);
        assert_eq!(
            (out[0].ts_ns, out[0].dur_ns, out[0].step_id),
            (1_000, 12_000_000 - 1_000, Some(3))
        );
        assert!(matches!(
            out[1].kind,
            CudaSliceKind::Call {
                func: CudaFunc::StreamSynchronize,
                ..
            }
        ));
        assert_eq!(a.stats().calls, 104);
    }

    #[test]
    fn launches_gather_per_step_and_syncs_stay_individual() {
        let mut a = CudaAggregator::new([1]);
        let mut out = Vec::new();
        // Step 1: 100 launches, then a sync that ends the batch.
        for i in 0..100 {
            call(
                &mut a,
                7,
                1_000 + i * 1_000,
                CudaFunc::LaunchKernel,
                500,
                &mut out,
            );
        }
        call(
            &mut a,
            7,
            200_000,
            CudaFunc::StreamSynchronize,
            5_000_000,
            &mut out,
        );
        assert!(
            out.is_empty(),
            "the batch and the sync wait for their step record"
        );
        a.step(1, 500, 5_300_000, 1, &mut out);
        assert_eq!(out.len(), 2);
        assert_eq!(batch_calls(&out[0]), 100);
        assert_eq!(
            (out[0].ts_ns, out[0].dur_ns, out[0].step_id),
            (1_000, 99_000 + 500, Some(1))
        );
        assert!(matches!(
            out[0].kind,
            CudaSliceKind::Batch {
                end: BatchEnd::Call,
                per_step: true,
                ..
            }
        ));
        assert_eq!(out[1].step_id, Some(1));
        assert!(matches!(
            out[1].kind,
            CudaSliceKind::Call {
                func: CudaFunc::StreamSynchronize,
                ..
            }
        ));
        // More launches, ended by the step's end.
        for i in 0..10 {
            call(&mut a, 7, 6_000_000 + i, CudaFunc::LaunchKernel, 1, &mut out);
        }
        a.step(1, 5_500_000, 7_000_000, 2, &mut out);
        assert_eq!(out.len(), 3);
        assert_eq!(out[2].step_id, Some(2));
        assert!(matches!(
            out[2].kind,
            CudaSliceKind::Batch {
                end: BatchEnd::Step,
                calls: 10,
                ..
            }
        ));
        a.finish(&mut out);
        assert_eq!(out.len(), 3, "nothing left open");
        assert_eq!(
            a.stats(),
            AggStats {
                calls: 111,
                individual: 1,
                batches: 2,
                batched_calls: 110,
                over_budget: 0
            }
        );
    }

    #[test]
    fn without_engine_probes_batches_follow_the_window_and_long_copies_stand_alone() {
        let mut a = CudaAggregator::new([]);
        let mut out = Vec::new();
        call(&mut a, 7, 0, CudaFunc::LaunchKernel, 10, &mut out);
        call(&mut a, 7, 5, CudaFunc::MemcpyHtoDAsync, 1_000, &mut out);
        call(&mut a, 7, WINDOW_NS + 1, CudaFunc::LaunchKernel, 10, &mut out);
        assert_eq!(out.len(), 1);
        assert!(matches!(
            out[0].kind,
            CudaSliceKind::Batch {
                end: BatchEnd::Window,
                calls: 2,
                ..
            }
        ));
        call(
            &mut a,
            7,
            WINDOW_NS + 100,
            CudaFunc::MemcpyDtoH,
            2 * INDIVIDUAL_MIN_NS,
            &mut out,
        );
        assert_eq!(out.len(), 3, "the batch ends before the long copy");
        a.advance(3 * WINDOW_NS, &mut out);
        a.finish(&mut out);
        assert_eq!(out.len(), 3);
        // Threads are independent; an idle batch is closed by the sweep.
        call(&mut a, 8, 4 * WINDOW_NS, CudaFunc::GraphLaunch, 10, &mut out);
        a.advance(6 * WINDOW_NS, &mut out);
        assert_eq!(out.len(), 4);
        assert_eq!(out[3].tid, 8);
    }

    #[test]
    fn a_process_whose_first_step_comes_later_is_batched_per_step_from_then_on() {
        let mut a = CudaAggregator::new([]);
        let mut out = Vec::new();
        // The test's calls are pid 1's.
        a.step(1, 0, 1_000, 1, &mut out);
        for i in 0..10 {
            call(
                &mut a,
                9,
                20_000_000 + i * 1_000,
                CudaFunc::LaunchKernel,
                500,
                &mut out,
            );
        }
        // Past the 10 ms window: an engine's batch still waits for its step record.
        a.advance(40_000_000, &mut out);
        assert!(out.is_empty(), "{out:?}");
        a.step(1, 19_000_000, 41_000_000, 2, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!((batch_calls(&out[0]), out[0].step_id), (10, Some(2)));
    }

    #[test]
    fn nested_calls_are_individual_and_inside_their_parent() {
        let mut a = CudaAggregator::new([]);
        let mut out = Vec::new();
        call(&mut a, 7, 100, CudaFunc::CtxSynchronize, 1_000, &mut out);
        call(&mut a, 7, 200, CudaFunc::LaunchKernel, 10, &mut out);
        assert_eq!(out.len(), 2);
        assert!(matches!(
            out[1].kind,
            CudaSliceKind::Call {
                func: CudaFunc::LaunchKernel,
                ..
            }
        ));
    }

    #[test]
    fn individual_slices_are_bounded_per_thread_and_second() {
        let mut a = CudaAggregator::new([]);
        let mut out = Vec::new();
        let n = u64::from(INDIVIDUAL_PER_SEC) + 500;
        for i in 0..n {
            call(&mut a, 7, i * 10, CudaFunc::EventSynchronize, 5, &mut out);
        }
        a.finish(&mut out);
        let s = a.stats();
        assert_eq!(s.individual, u64::from(INDIVIDUAL_PER_SEC));
        assert_eq!(s.over_budget, 500);
        assert_eq!(out.len(), INDIVIDUAL_PER_SEC as usize + 1);
    }
}
