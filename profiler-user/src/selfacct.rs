//! Self-accounting: what llmprof costs, measured while it runs.
//!
//! Owns the arithmetic of llmprof's overhead and the /proc reads it needs: the estimated CPU time the probes
//! add to the target (per probe: hits × the cost per hit calibrated beside the session, see
//! [`crate::capture::calibrate`]), the target's own CPU time (all its threads' `schedstat`, ns), llmprof's
//! CPU (`getrusage`) and resident memory (`/proc/self/statm`). [`SelfAccount::sample`] turns two
//! [`Snapshot`]s into an [`OverheadSample`] (counter tracks every tick); [`SelfAccount::summary`] the whole
//! session. It never touches the kernel's maps itself: the caller hands it the probe counters.
//!
//! Which cost each probe's hits carry: `syscalls` the calibrated raw_syscalls cost per syscall of its class
//! — `syscall_decoded_ns` for the [`DECODED_SYSCALLS`] (their count comes from the per-syscall aggregates,
//! [`Counters::syscalls_decoded`]), `syscall_ns` for every other hit (this includes the `uprobe` syscall an
//! optimized engine-probe hit makes); the other syscall-derived probes
//! (model files, connect, send, process exit) nothing extra (they run inside the same exit program); engine
//! probes, and any uprobe added later, the calibrated uprobe cost, with range hits the sampling knob
//! skipped at the (lower) sampled-out cost; `cuda` (one hit per driver call, counted at entry) the
//! calibrated cost of the entry-only counting uprobe for the calls it counted ([`Counters::cuda_counted`])
//! and of the entry + return uprobe pair for the others (the engine-probe cost when the pair was not
//! measured);
//! `sched` (one hit per sched_switch / sched_waking record of a traced thread) the calibrated cost of a
//! thread-state record (nothing when it was not measured); `cpu_sample` the sampler's cost per on-CPU sample
//! (measured live on the targets once known) for the samples, and the calibrated cost of an off-CPU stack for
//! the off-CPU stacks among its hits ([`Counters::offcpu_stacks`]: the `sched_switch` program takes those,
//! not the sampler). The thread-state programs also run, filtered out
//! after two lookups, for every other switch on the machine: that cost is everyone's, not the target's.
//!
//! What runs in the target on llmprof's behalf without a probe hit — the injected CUPTI helper — is
//! [`CuptiCost`]'s: the CPU time of CUPTI's buffer thread and of the helper's callbacks, measured by the
//! helper itself (its thread's CLOCK_THREAD_CPUTIME_ID, in the counters llmprof reads from the target's
//! memory), plus CUPTI's work in the threads that launch (timestamps and records of each activity, inside
//! the CUDA calls), which no counter shows: the records CUPTI wrote × [`CUPTI_RECORD_NS`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use llmprof_abi::{NUM_PROBES, ProbeCounters, ProbeId};

use crate::capture::Capture;
#[cfg(doc)]
use crate::capture::DECODED_SYSCALLS;

use llmprof_trace::calibration::Calibration;
use llmprof_trace::event::{CuptiEstimate, Degradation, OverheadSample, OverheadSummary};

/// Probes whose hits cost nothing beyond the syscall the `syscalls` counter already charged.
const INSIDE_SYSCALL_EXIT: [ProbeId; 5] = [
    ProbeId::FileOpen,
    ProbeId::FileIo,
    ProbeId::Connect,
    ProbeId::Send,
    ProbeId::ProcessExit,
];

/// What the self-accounting charges, read from the capture at one instant
/// ([`Counters::of`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct Counters {
    /// Per-probe counters (summed over CPUs).
    pub probes: [ProbeCounters; NUM_PROBES],
    /// Of the `syscalls` hits, those of the decoded class ([`DECODED_SYSCALLS`]).
    pub syscalls_decoded: u64,
    /// Of the `cuda` hits, the calls counted by the entry-only probe (the rest were timed by the pair).
    pub cuda_counted: u64,
    /// Of the `cpu_sample` hits, the off-CPU stacks (taken by the `sched_switch` program at a blocking
    /// switch, charged at their own calibrated cost; the rest are the sampler's on-CPU samples).
    pub offcpu_stacks: u64,
    /// The injected CUPTI helpers' counters since this session started them
    /// ([`crate::cupti::GpuKernels::counters`]; zero without them).
    pub cupti: CuptiCounters,
    /// The Python hooks' records and their calibrated cost since this session installed them
    /// ([`crate::pyhooks::PyHooks::counters`]).
    pub python_hooks: crate::pyhooks::PyHooksCounters,
}

impl Counters {
    /// The counters of `capture` the self-accounting charges: [`Capture::counters`],
    /// [`Capture::syscalls_decoded`], the counted CUDA calls and the off-CPU stacks (the CUPTI helpers' are
    /// added by the session).
    pub fn of(capture: &Capture) -> Self {
        Self {
            probes: capture.counters(),
            syscalls_decoded: capture.syscalls_decoded(),
            cuda_counted: capture.cuda_counted_calls(),
            offcpu_stacks: capture.offcpu_stacks(),
            cupti: CuptiCounters::default(),
            python_hooks: crate::pyhooks::PyHooksCounters::default(),
        }
    }
}

/// The CUPTI helpers' own counters that the estimate uses, summed over the processes that record.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CuptiCounters {
    /// CUPTI records written (every kind).
    pub records: u64,
    /// CPU time of CUPTI's buffer thread and the helper's callbacks, ns (measured in the target).
    pub thread_cpu_ns: u64,
}

/// CUPTI's work in a launching thread per record it writes, ns: taking the timestamps and filling the
/// record inside the CUDA call. Not measurable from outside the CUDA call and not in any counter; this figure
/// is an assumption for the estimate until `tools/gpu/bench_attach.py` measures it on a GPU (it prints the
/// cost per CUPTI record it saw: the A/B loss of the default mode over `--gpu-kernels off`, per record).
pub const CUPTI_RECORD_NS: f64 = 300.0;

/// What the injected CUPTI helper adds to the target (see the module doc): measured thread CPU plus records ×
/// [`CUPTI_RECORD_NS`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CuptiCost {
    /// Assumed ns per record in the launching threads.
    pub per_record_ns: f64,
}

impl CuptiCost {
    /// The estimate's parts.
    pub fn new() -> Self {
        Self {
            per_record_ns: CUPTI_RECORD_NS,
        }
    }

    /// Estimated ns between two readings: (measured thread CPU, records × the per-record figure).
    pub fn added_ns(&self, before: &CuptiCounters, now: &CuptiCounters) -> (f64, f64) {
        let thread = now.thread_cpu_ns.saturating_sub(before.thread_cpu_ns) as f64;
        let records = now.records.saturating_sub(before.records) as f64;
        (thread, records * self.per_record_ns)
    }

    /// The whole session's part of the summary.
    pub fn estimate(&self, before: &CuptiCounters, now: &CuptiCounters) -> Option<CuptiEstimate> {
        if now.records == 0 && now.thread_cpu_ns == 0 {
            return None;
        }
        let (thread, records) = self.added_ns(before, now);
        Some(CuptiEstimate {
            added_ns: thread + records,
            thread_cpu_ns: thread,
            records: now.records.saturating_sub(before.records),
            per_record_ns: self.per_record_ns,
        })
    }
}

/// The counters and clocks at one instant.
#[derive(Clone, Copy, Debug)]
pub struct Snapshot {
    /// When.
    pub at: Instant,
    /// The counters.
    pub counters: Counters,
    /// The target's CPU time so far, ns (None once it is gone).
    pub target_cpu_ns: Option<u64>,
    /// llmprof's CPU time so far, ns.
    pub self_cpu_ns: u64,
}

impl Snapshot {
    /// Reads the clocks now (the target's: every process of `targets`); `counters` come from the capture.
    pub fn take(targets: &TargetCpu, counters: Counters) -> Self {
        Snapshot {
            at: Instant::now(),
            counters,
            target_cpu_ns: targets.cpu_ns(),
            self_cpu_ns: self_cpu_ns(),
        }
    }
}

/// The CPU time of the traced processes, a set that changes (process trees): the sum of each process's last
/// reading, so a process that exits keeps counting what it used up to the last reading before its exit (and
/// the sum never goes backwards). Cloned handles share the set: the session adds and removes processes, the
/// self-accounting and the budget read it.
#[derive(Clone, Debug, Default)]
pub struct TargetCpu(Arc<Mutex<TargetCpuState>>);

#[derive(Debug, Default)]
struct TargetCpuState {
    live: BTreeSet<u32>,
    last: BTreeMap<u32, u64>,
    /// Per process, each live thread's last `schedstat` reading, and what the threads seen to exit had used:
    /// a thread that ends between two readings keeps its time in the sum (summing only the threads alive at
    /// each reading made a server that runs a thread per request look idle, or even go backwards).
    threads: BTreeMap<u32, (BTreeMap<u32, u64>, u64)>,
}

impl TargetCpu {
    /// The processes `pids`.
    pub fn new(pids: &[u32]) -> Self {
        let t = Self::default();
        for &p in pids {
            t.add(p);
        }
        t
    }

    fn state(&self) -> std::sync::MutexGuard<'_, TargetCpuState> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A process joined (its CPU so far counts from the next reading: it started during the session).
    pub fn add(&self, pid: u32) {
        self.state().live.insert(pid);
    }

    /// The first live process of the set (the `--pid` target, first given).
    pub fn first(&self) -> Option<u32> {
        self.state().live.iter().next().copied()
    }

    /// A process exited: its last reading stays in the sum.
    pub fn remove(&self, pid: u32) {
        self.state().live.remove(&pid);
    }

    /// Reads every live process; the sum over every process read so far. None before any reading succeeded.
    pub fn cpu_ns(&self) -> Option<u64> {
        let mut st = self.state();
        let live: Vec<u32> = st.live.iter().copied().collect();
        for pid in live {
            let reading = match threads_cpu_ns(pid) {
                Some(now) => Some(st.fold_threads(pid, now)),
                None => process_cpu_ns(pid),
            };
            match reading {
                Some(ns) => {
                    st.last.insert(pid, ns);
                }
                None => {
                    st.live.remove(&pid);
                }
            }
        }
        (!st.last.is_empty()).then(|| st.last.values().sum())
    }
}

impl TargetCpuState {
    /// Takes one reading of `pid`'s live threads (`(tid, ns)`): threads no longer there keep what they had
    /// used; the process's CPU so far.
    fn fold_threads(&mut self, pid: u32, now: Vec<(u32, u64)>) -> u64 {
        let (live, gone) = self.threads.entry(pid).or_default();
        let seen: BTreeMap<u32, u64> = now.into_iter().collect();
        for (tid, ns) in std::mem::take(live) {
            if !seen.contains_key(&tid) {
                *gone += ns;
            }
        }
        *live = seen;
        *gone + live.values().sum::<u64>()
    }
}

/// Each live thread of `pid` and its CPU time so far, ns (`/proc/PID/task/*/schedstat`, first field); None
/// when the process is gone or has no schedstats.
fn threads_cpu_ns(pid: u32) -> Option<Vec<(u32, u64)>> {
    let dir = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut out = Vec::new();
    for e in dir.flatten() {
        let Some(tid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(s) = std::fs::read_to_string(e.path().join("schedstat")) else {
            continue;
        };
        if let Some(ns) = s.split_whitespace().next().and_then(|v| v.parse::<u64>().ok()) {
            out.push((tid, ns));
        }
    }
    (!out.is_empty()).then_some(out)
}

/// Estimated ns the traced syscalls added between two readings: decoded hits at the decoded cost, the
/// rest at the plain cost. The decoded count never exceeds the hits (the two are read one after the other).
pub fn syscalls_added_ns(cal: &Calibration, before: &Counters, now: &Counters) -> f64 {
    let i = ProbeId::Syscalls as usize;
    let hits = now.probes[i].hits.saturating_sub(before.probes[i].hits);
    let decoded = now
        .syscalls_decoded
        .saturating_sub(before.syscalls_decoded)
        .min(hits);
    (hits - decoded) as f64 * cal.syscall_ns + decoded as f64 * cal.decoded_ns()
}

/// Estimated ns the probes added to the target between two counter readings, per probe.
pub fn added_ns(cal: &Calibration, before: &Counters, now: &Counters) -> [f64; NUM_PROBES] {
    let mut out = [0f64; NUM_PROBES];
    let probe = cal.probe_ns.unwrap_or(0.0);
    let syscalls = syscalls_added_ns(cal, before, now);
    let (before_counted, now_counted) = (before.cuda_counted, now.cuda_counted);
    let (offcpu_before, offcpu_now) = (before.offcpu_stacks, now.offcpu_stacks);
    let (before, now) = (&before.probes, &now.probes);
    for (i, slot) in out.iter_mut().enumerate() {
        let hits = now[i].hits.saturating_sub(before[i].hits) as f64;
        *slot = if i == ProbeId::Syscalls as usize {
            syscalls
        } else if INSIDE_SYSCALL_EXIT.iter().any(|p| *p as usize == i) {
            0.0
        } else if i == ProbeId::CpuSample as usize {
            let on_cpu = cal.sample_live_ns.or(cal.sample_ns).unwrap_or(0.0);
            let offcpu = (offcpu_now.saturating_sub(offcpu_before) as f64).min(hits);
            (hits - offcpu) * on_cpu + offcpu * cal.offcpu_stack_ns.or(cal.sample_ns).unwrap_or(on_cpu)
        } else if i == ProbeId::Cuda as usize {
            let counted = (now_counted.saturating_sub(before_counted) as f64).min(hits);
            let pair = cal.cuda_call_ns.unwrap_or(probe);
            (hits - counted) * pair + counted * cal.cuda_count_ns.unwrap_or(pair)
        } else if i == ProbeId::Http as usize {
            // A hit is a followed read or write on top of its (decoded) syscall; the writes of a stream
            // outnumber the one head read per request by the tokens it streams, so every hit is charged the
            // SSE-write figure.
            hits * cal.http_sse_write_ns.unwrap_or(0.0)
        } else if i == ProbeId::Sched as usize {
            hits * cal.sched_event_ns.unwrap_or(0.0)
        } else if i == ProbeId::Range as usize {
            let sent = (now[i].emitted + now[i].dropped).saturating_sub(before[i].emitted + before[i].dropped)
                as f64;
            let skipped = (hits - sent).max(0.0);
            (hits - skipped) * probe + skipped * cal.probe_sampled_out_ns.unwrap_or(probe)
        } else {
            hits * probe
        };
    }
    out
}

/// Largest overhead [`overhead_pct`] reports, %: an estimate above ~90 % of the target's measured CPU says
/// the calibration does not fit the moment (e.g. a loaded machine), not that the target ran 100× slower.
pub const MAX_OVERHEAD_PCT: f64 = 1_000.0;

/// `added` as a percentage of the target's CPU time without it (`target` includes it: the programs run
/// in the target's context and the kernel charges their time to it), at most [`MAX_OVERHEAD_PCT`].
pub fn overhead_pct(added_ns: f64, target_cpu_ns: f64) -> f64 {
    let added = added_ns.min(target_cpu_ns);
    let own = (target_cpu_ns - added).max(1.0);
    (added / own * 100.0).min(MAX_OVERHEAD_PCT)
}

/// The session's self-accounting.
#[derive(Debug)]
pub struct SelfAccount {
    targets: TargetCpu,
    cal: Calibration,
    cupti: CuptiCost,
    start: Snapshot,
    last: Snapshot,
    max_rss: u64,
    /// The most of it no other process mapped ([`private_bytes`]).
    max_private: u64,
    /// The CPUs llmprof shares with the target and their idle time at the start.
    share: Option<crate::cpushare::Window>,
}

impl SelfAccount {
    /// What the live window measured ([`crate::capture::stacks::LiveFigures`]): the sampler's cost per
    /// sample on the targets themselves, charged for every sample of the session from now on in place of the
    /// start-up figure (when measured), and the wire probe's arrival stamps (reported, not charged: they
    /// run host-wide, mostly in softirq or in the sending process).
    pub fn set_live(&mut self, f: crate::capture::stacks::LiveFigures) {
        if let Some(ns) = f.sample_ns {
            self.cal.sample_live_ns = Some(ns);
        }
        if let Some((ns, per_s)) = f.arrival {
            self.cal.http_arrival_ns = Some(ns);
            self.cal.http_arrival_runs_per_s = Some(per_s);
        }
    }

    /// The costs per hit measured by the calibration, charged over the whole session from now on (the
    /// session starts with none: its calibration runs beside it). Figures measured on the targets during
    /// the session ([`SelfAccount::set_live`]) are kept.
    pub fn set_calibration(&mut self, cal: Calibration) {
        let live = (
            self.cal.sample_live_ns,
            self.cal.http_arrival_ns,
            self.cal.http_arrival_runs_per_s,
        );
        self.cal = Calibration {
            sample_live_ns: live.0.or(cal.sample_live_ns),
            http_arrival_ns: live.1.or(cal.http_arrival_ns),
            http_arrival_runs_per_s: live.2.or(cal.http_arrival_runs_per_s),
            ..cal
        };
    }

    /// Starts accounting at `counters` (the capture's counters when tracing began).
    pub fn new(targets: TargetCpu, cal: Calibration, counters: Counters) -> Self {
        let s = Snapshot::take(&targets, counters);
        let share = targets.first().and_then(crate::cpushare::Window::start);
        SelfAccount {
            targets,
            cal,
            cupti: CuptiCost::new(),
            start: s,
            last: s,
            max_rss: rss_bytes(),
            max_private: private_bytes(),
            share,
        }
    }

    /// The calibration in use.
    pub fn calibration(&self) -> &Calibration {
        &self.cal
    }

    /// The sample since the previous call (or the start), at degradation `level`.
    pub fn sample(&mut self, counters: Counters, level: u32) -> OverheadSample {
        let now = Snapshot::take(&self.targets, counters);
        let rss = rss_bytes();
        self.max_rss = self.max_rss.max(rss);
        self.max_private = self.max_private.max(private_bytes());
        let (thread, records) = self
            .cupti
            .added_ns(&self.last.counters.cupti, &now.counters.cupti);
        let hooks = (now.counters.python_hooks.added_ns - self.last.counters.python_hooks.added_ns).max(0.0);
        let added: f64 = added_ns(&self.cal, &self.last.counters, &now.counters)
            .iter()
            .sum::<f64>()
            + thread
            + records
            + hooks;
        let target = match (self.last.target_cpu_ns, now.target_cpu_ns) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a) as f64),
            _ => None,
        };
        let s = OverheadSample {
            interval_ns: now.at.duration_since(self.last.at).as_nanos() as u64,
            est_added_ns: added,
            target_cpu_ns: target,
            est_overhead_pct: target.filter(|t| *t > 0.0).map(|t| overhead_pct(added, t)),
            llmprof_cpu_ns: now.self_cpu_ns.saturating_sub(self.last.self_cpu_ns) as f64,
            llmprof_rss_bytes: rss,
            cost_syscall_ns: self.cal.syscall_ns,
            cost_syscall_decoded_ns: self.cal.syscall_decoded_ns,
            cost_probe_ns: self.cal.probe_ns,
            cost_cuda_ns: self.cal.cuda_call_ns,
            level,
        };
        self.last = now;
        s
    }

    /// The whole session up to `counters` (the final ones).
    pub fn summary(
        &mut self,
        counters: Counters,
        budget_pct: Option<f64>,
        degradations: Vec<Degradation>,
    ) -> OverheadSummary {
        let now = Snapshot::take(&self.targets, counters);
        self.max_rss = self.max_rss.max(rss_bytes()).max(max_rss_bytes());
        self.max_private = self.max_private.max(private_bytes());
        let by_probe = added_ns(&self.cal, &self.start.counters, &now.counters);
        let cupti = self
            .cupti
            .estimate(&self.start.counters.cupti, &now.counters.cupti);
        let (h0, h1) = (&self.start.counters.python_hooks, &now.counters.python_hooks);
        let python_hooks = (h1.records > h0.records).then(|| llmprof_trace::event::PyHooksEstimate {
            added_ns: (h1.added_ns - h0.added_ns).max(0.0),
            records: h1.records - h0.records,
        });
        let added: f64 = by_probe.iter().sum::<f64>()
            + cupti.as_ref().map_or(0.0, |c| c.added_ns)
            + python_hooks.as_ref().map_or(0.0, |h| h.added_ns);
        // The target may be gone at the end: its CPU up to the last reading then.
        let end_cpu = now.target_cpu_ns.or(self.last.target_cpu_ns);
        let target = match (self.start.target_cpu_ns, end_cpu) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a) as f64),
            _ => None,
        };
        let mut summary = OverheadSummary {
            elapsed_ns: now.at.duration_since(self.start.at).as_nanos() as u64,
            est_added_ns: added,
            est_added_by_probe_ns: by_probe.to_vec(),
            target_cpu_ns: target,
            est_overhead_pct: target.filter(|t| *t > 0.0).map(|t| overhead_pct(added, t)),
            llmprof_cpu_ns: now.self_cpu_ns.saturating_sub(self.start.self_cpu_ns) as f64,
            llmprof_max_rss_bytes: self.max_rss,
            llmprof_max_private_bytes: self.max_private,
            calibration: Some(self.cal),
            budget_pct,
            degradations,
            size_limit: None,
            events_not_written: 0,
            symbolized_stacks: 0,
            symbolize_ns: 0.0,
            cupti,
            python_hooks,
            ..OverheadSummary::default()
        };
        self.charge_shared_cpus(&mut summary);
        summary
    }

    /// Adds to the session's estimate llmprof's own CPU that the target lost on the CPUs they share
    /// ([`crate::cpushare`]: the part idle time could not absorb, in the target's share of the busy time).
    fn charge_shared_cpus(&self, s: &mut OverheadSummary) {
        let (Some(w), Some(target)) = (&self.share, s.target_cpu_ns) else {
            return;
        };
        let Some(c) = w.contention(s.elapsed_ns as f64, target, s.llmprof_cpu_ns) else {
            return;
        };
        let probes = s.est_added_ns;
        s.contention_ns = Some(c.charged_ns);
        s.shared_cpus = u32::try_from(c.shared_cpus).unwrap_or(u32::MAX);
        s.shared_idle_pct = Some(c.idle_pct);
        s.est_added_ns = probes + c.charged_ns;
        // The probes run in the target's context (its CPU time includes them); llmprof's own CPU does not.
        let own = (target - probes.min(target)).max(1.0);
        s.est_overhead_pct = (target > 0.0).then(|| (s.est_added_ns / own * 100.0).min(MAX_OVERHEAD_PCT));
    }
}

/// CPU time of every thread of `pid` so far, ns: the sum of `/proc/PID/task/*/schedstat` (first field,
/// ns on CPU), falling back to `utime + stime` of `/proc/PID/stat` (clock ticks) without schedstats.
/// Threads that exited are missed by schedstat; the fallback counts them. None when the process is gone.
pub fn process_cpu_ns(pid: u32) -> Option<u64> {
    if let Some(threads) = threads_cpu_ns(pid) {
        return Some(threads.iter().map(|(_, ns)| ns).sum());
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat_cpu_ns(&stat)
}

/// `utime + stime` of a `/proc/PID/stat` line, ns.
pub fn stat_cpu_ns(stat: &str) -> Option<u64> {
    // Fields after the parenthesised comm (which may hold spaces): state is field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some((utime + stime) * (1_000_000_000 / crate::sys::procfs::clock_ticks()))
}

fn rusage_self() -> Option<libc::rusage> {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::uninit();
    // SAFETY: `ru` is valid for writes of one rusage; getrusage fills it entirely on success.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr()) };
    // SAFETY: initialized by the successful call above.
    (rc == 0).then(|| unsafe { ru.assume_init() })
}

/// llmprof's CPU time so far (all threads, user + system), ns.
pub fn self_cpu_ns() -> u64 {
    let Some(ru) = rusage_self() else { return 0 };
    let tv = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1_000;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// llmprof's peak resident memory so far, bytes.
pub fn max_rss_bytes() -> u64 {
    rusage_self().map_or(0, |ru| ru.ru_maxrss as u64 * 1024)
}

/// llmprof's resident pages that no other process maps now, bytes (`Private_Clean` and `Private_Dirty` of
/// `/proc/self/smaps_rollup`): its heap, stacks and ring, and the pages of files it alone reads. The rest of
/// its RSS is pages it shares, mostly of the target's libraries that symbolization maps (and the target keeps
/// resident anyway). 0 when the file cannot be read.
pub fn private_bytes() -> u64 {
    let Ok(s) = std::fs::read_to_string("/proc/self/smaps_rollup") else {
        return 0;
    };
    s.lines()
        .filter(|l| l.starts_with("Private_Clean:") || l.starts_with("Private_Dirty:"))
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum::<u64>()
        * 1024
}

/// llmprof's resident memory now, bytes (`/proc/self/statm`, second field, pages).
pub fn rss_bytes() -> u64 {
    let Ok(s) = std::fs::read_to_string("/proc/self/statm") else {
        return 0;
    };
    // SAFETY: sysconf has no preconditions.
    let page = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    s.split_whitespace()
        .nth(1)
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(0, |p| p * page)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests {
    use super::*;

    fn cal() -> Calibration {
        Calibration {
            syscall_ns: 1_000.0,
            probe_ns: Some(2_000.0),
            probe_sampled_out_ns: Some(500.0),
            cuda_call_ns: Some(5_000.0),
            cuda_count_ns: Some(900.0),
            http_request_ns: Some(2_100.0),
            http_sse_write_ns: Some(1_300.0),
            ..Calibration::default()
        }
    }

    #[test]
    fn a_thread_that_ends_keeps_its_time_in_the_process_sum() {
        let mut st = TargetCpuState::default();
        assert_eq!(st.fold_threads(7, vec![(7, 100), (8, 50)]), 150);
        // Thread 8 ended, 9 started: 8's 50 ns stay.
        assert_eq!(st.fold_threads(7, vec![(7, 120), (9, 10)]), 180);
        assert_eq!(st.fold_threads(7, vec![(7, 130)]), 190);
    }

    #[test]
    fn each_probe_is_charged_its_own_cost_and_syscall_children_nothing() {
        let before = Counters::default();
        let mut c = before.probes;
        c[ProbeId::Syscalls as usize].hits = 10;
        c[ProbeId::FileIo as usize].hits = 7;
        c[ProbeId::Step as usize].hits = 3;
        c[ProbeId::Cuda as usize].hits = 4;
        c[ProbeId::Http as usize].hits = 5;
        c[ProbeId::Range as usize] = ProbeCounters {
            hits: 10,
            emitted: 3,
            dropped: 1,
        };
        let now = Counters {
            probes: c,
            ..Counters::default()
        };
        let a = added_ns(&cal(), &before, &now);
        assert_eq!(a[ProbeId::Syscalls as usize], 10_000.0);
        assert_eq!(a[ProbeId::FileIo as usize], 0.0);
        assert_eq!(a[ProbeId::Step as usize], 6_000.0);
        // A CUDA call pays the entry + return pair, not an engine probe hit.
        assert_eq!(a[ProbeId::Cuda as usize], 20_000.0);
        // Followed reads and writes of the wire probe: the SSE-write figure each, on top of their syscalls.
        assert_eq!(a[ProbeId::Http as usize], 5.0 * 1_300.0);
        let no_cuda = Calibration {
            cuda_call_ns: None,
            ..cal()
        };
        assert_eq!(added_ns(&no_cuda, &before, &now)[ProbeId::Cuda as usize], 8_000.0);
        // Of the 4 calls, 3 were counted (launches) at the entry-only cost, 1 timed by the pair.
        let counted = Counters {
            cuda_counted: 3,
            ..now
        };
        assert_eq!(a.len(), NUM_PROBES);
        assert_eq!(
            added_ns(&cal(), &before, &counted)[ProbeId::Cuda as usize],
            5_000.0 + 3.0 * 900.0
        );
        // 4 sent at the full cost, 6 sampled out at the lower one.
        assert_eq!(a[ProbeId::Range as usize], 4.0 * 2_000.0 + 6.0 * 500.0);
    }

    fn syscalls(hits: u64, decoded: u64) -> Counters {
        let mut c = Counters {
            syscalls_decoded: decoded,
            ..Counters::default()
        };
        c.probes[ProbeId::Syscalls as usize].hits = hits;
        c
    }

    #[test]
    fn decoded_syscalls_are_charged_their_own_cost_and_the_rest_the_plain_one() {
        let two = Calibration {
            syscall_decoded_ns: Some(1_500.0),
            ..cal()
        };
        // 100 → 1,100 hits, of which 40 → 240 decoded: 800 plain × 1,000 + 200 decoded × 1,500.
        let (before, now) = (syscalls(100, 40), syscalls(1_100, 240));
        let want = 800.0 * 1_000.0 + 200.0 * 1_500.0;
        assert_eq!(syscalls_added_ns(&two, &before, &now), want);
        let by_probe = added_ns(&two, &before, &now);
        assert_eq!(by_probe[ProbeId::Syscalls as usize], want);
        assert_eq!(
            by_probe.iter().sum::<f64>(),
            want,
            "the total is the sum of both classes"
        );
        // Not measured (an older calibration): every hit at the plain cost.
        assert_eq!(syscalls_added_ns(&cal(), &before, &now), 1_000.0 * 1_000.0);
        // The aggregates read after the counter may be ahead of it: never more decoded than hits,
        // never a negative plain count.
        assert_eq!(
            syscalls_added_ns(&two, &syscalls(0, 0), &syscalls(10, 12)),
            10.0 * 1_500.0
        );
        // Aggregates that shrank (a map entry gone): no negative decoded count.
        assert_eq!(
            syscalls_added_ns(&two, &syscalls(0, 50), &syscalls(10, 20)),
            10.0 * 1_000.0
        );
    }

    #[test]
    fn off_cpu_stacks_are_charged_their_own_cost_and_samples_the_samplers() {
        let c = Calibration {
            sample_ns: Some(1_500.0),
            sample_live_ns: Some(7_000.0),
            offcpu_stack_ns: Some(2_000.0),
            ..cal()
        };
        let mut now = Counters {
            offcpu_stacks: 90,
            ..Counters::default()
        };
        now.probes[ProbeId::CpuSample as usize].hits = 100;
        let before = Counters::default();
        // 10 on-CPU samples at the live figure, 90 off-CPU stacks at theirs.
        assert_eq!(
            added_ns(&c, &before, &now)[ProbeId::CpuSample as usize],
            10.0 * 7_000.0 + 90.0 * 2_000.0
        );
        // Off-CPU stacks not calibrated: the sampler's calibrated figure per stack walk.
        let no_offcpu = Calibration {
            offcpu_stack_ns: None,
            ..c
        };
        assert_eq!(
            added_ns(&no_offcpu, &before, &now)[ProbeId::CpuSample as usize],
            10.0 * 7_000.0 + 90.0 * 1_500.0
        );
    }

    #[test]
    fn the_cupti_helper_is_its_measured_threads_plus_records_at_the_assumed_figure() {
        let cost = CuptiCost::new();
        let before = CuptiCounters {
            records: 1_000,
            thread_cpu_ns: 5_000_000,
        };
        let now = CuptiCounters {
            records: 11_000,
            thread_cpu_ns: 7_000_000,
        };
        let e = cost.estimate(&before, &now).unwrap();
        assert_eq!(e.records, 10_000);
        assert_eq!(e.thread_cpu_ns, 2e6);
        assert_eq!(e.added_ns, 2e6 + 10_000.0 * CUPTI_RECORD_NS);
        assert_eq!(
            cost.estimate(&CuptiCounters::default(), &CuptiCounters::default()),
            None,
            "no helper, no part"
        );
    }

    #[test]
    fn overhead_is_relative_to_the_targets_own_cpu() {
        // 100 ms of target CPU of which 50 ms were added: the target's own work took 50 ms, +100 %.
        assert!((overhead_pct(50e6, 100e6) - 100.0).abs() < 1e-9);
        assert!((overhead_pct(1e6, 101e6) - 1.0).abs() < 1e-9);
        // An estimate above the measured time is capped, never negative or infinite.
        assert_eq!(overhead_pct(200e6, 100e6), MAX_OVERHEAD_PCT);
        assert_eq!(overhead_pct(0.0, 0.0), 0.0);
    }

    #[test]
    fn target_cpu_of_a_tree_keeps_what_an_exited_process_used() {
        let me = std::process::id();
        let t = TargetCpu::new(&[me, u32::MAX - 3]);
        let a = t.cpu_ns().expect("this process is readable");
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        let b = t.cpu_ns().unwrap();
        assert!(b >= a, "{b} < {a}");
        t.remove(me);
        assert_eq!(t.cpu_ns(), Some(b), "an exited process keeps its last reading");
    }

    #[test]
    fn proc_readers_see_this_process() {
        assert!(process_cpu_ns(std::process::id()).is_some());
        assert!(rss_bytes() > 0);
        assert!(max_rss_bytes() > 0);
        let (private, rss) = (private_bytes(), rss_bytes());
        assert!(
            private > 0 && private <= rss + (1 << 20),
            "private {private} of {rss}"
        );
        let line = "12 (a b) S 1 2 3 4 5 6 7 8 9 10 150 50 0 0";
        assert_eq!(
            stat_cpu_ns(line),
            Some(200 * (1_000_000_000 / crate::sys::procfs::clock_ticks()))
        );
    }
}
