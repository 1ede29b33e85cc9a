//! The stack sampler's user half: opens one software CPU-clock perf event per online CPU (frequency mode, so
//! it works in VMs without a PMU), attaches `llmprof_sample` to each, and symbolizes its records
//! ([`crate::symbolize`]) for the decoder (`llmprof_trace::decode::stacks`) as capture drains the ring.
//!
//! The kernel program filters by the traced-tgid map, so untraced CPUs cost one hash lookup per tick. The
//! budget first halves the rate (`Knob::SampleEvery`, the divider in the kernel) and then stops sampling
//! ([`Sampler::detach`]: the perf events are closed). [`Stacks`] is the capture's part: the sampler, the
//! `Knob::OffCpuStacksOff` switch of the off-CPU stacks and the live measurement of the sampler's cost on the
//! targets. Never symbolizes llmprof's own samples (the capture drops them before).

use aya::Ebpf;
use aya::programs::PerfEvent;
use aya::programs::perf_event::{
    PerfEventConfig, PerfEventLinkId, PerfEventScope, SamplePolicy, SoftwareEvent,
};
use llmprof_abi::{CpuSampleEvent, Knob, OFFCPU_RATE_MAP};
use llmprof_trace::event::stacks::CpuSample;
use llmprof_trace::event::{Event, EventBody};

use super::error::CaptureError;
use super::object::{program, write_knob};
use super::proc::set_traced;
use crate::symbolize::{SymbolizeStats, Symbolizer};

/// The sampler's perf-event program.
pub use llmprof_abi::SAMPLE_PROGRAM;
/// Highest `--sample-rate` accepted: the kernel's default `perf_event_max_sample_rate` is 100 kHz and lowers
/// itself when sampling takes too long; 1 kHz is already 10× the default and enough for any flame graph.
pub const MAX_SAMPLE_HZ: u64 = 1000;

/// The attached sampler and its symbolizer.
#[derive(Debug)]
pub struct Sampler {
    links: Vec<PerfEventLinkId>,
    hz: u64,
    symbolizer: Symbolizer,
}

/// The stacks family of a capture: the sampler (when sampling) and the stacks decoded so far.
#[derive(Debug, Default)]
pub(super) struct Stacks {
    sampler: Option<Sampler>,
    /// On-CPU samples of the targets decoded so far (the live sampler cost's denominator).
    on_cpu: u64,
    /// Off-CPU stacks of the targets decoded (charged at their own cost by the self-accounting).
    off_cpu: u64,
}

impl Stacks {
    /// Keeps off-CPU stacks off (`Knob::OffCpuStacksOff`) until [`Stacks::go`]: set before the scheduler
    /// programs are attached.
    pub(super) fn hold_off_cpu(ebpf: &mut Ebpf) -> Result<(), CaptureError> {
        write_knob(ebpf, Knob::OffCpuStacksOff, 1)
    }

    /// Attaches the sampler at `hz` on every CPU; 0: no sampling.
    pub(super) fn start(ebpf: &mut Ebpf, hz: u64) -> Result<Self, CaptureError> {
        let sampler = match hz {
            0 => None,
            hz => Some(Sampler::attach(ebpf, hz)?),
        };
        Ok(Stacks {
            sampler,
            ..Stacks::default()
        })
    }

    /// Turns off-CPU stacks on when sampling (once every probe is attached).
    pub(super) fn go(&self, ebpf: &mut Ebpf) -> Result<(), CaptureError> {
        if self.sampler.is_some() {
            write_knob(ebpf, Knob::OffCpuStacksOff, 0)?;
        }
        Ok(())
    }

    /// The sampler, when sampling.
    pub(super) fn sampler(&self) -> Option<&Sampler> {
        self.sampler.as_ref()
    }

    /// The sampler, when sampling, to symbolize a record.
    pub(super) fn sampler_mut(&mut self) -> Option<&mut Sampler> {
        self.sampler.as_mut()
    }

    /// Counts a decoded stack: an on-CPU sample or an off-CPU stack.
    pub(super) fn decoded(&mut self, ev: &Event) {
        self.on_cpu += u64::from(matches!(ev.body, EventBody::CpuSample(_)));
        self.off_cpu += u64::from(matches!(ev.body, EventBody::OffCpuStack(_)));
    }

    /// The off-CPU stacks decoded so far.
    pub(super) fn off_cpu(&self) -> u64 {
        self.off_cpu
    }

    /// A process exited: the sampler forgets its addresses.
    pub(super) fn forget(&mut self, pid: u32) {
        if let Some(s) = self.sampler.as_mut() {
            s.forget(pid);
        }
    }

    /// Stops stack sampling (the budget's last sampling step): off-CPU stacks off, the perf events closed.
    /// Returns whether it was sampling.
    pub(super) fn detach(&mut self, ebpf: &mut Ebpf) -> Result<bool, CaptureError> {
        write_knob(ebpf, Knob::OffCpuStacksOff, 1)?;
        match self.sampler.as_mut() {
            Some(s) => s.detach(ebpf),
            None => Ok(false),
        }
    }

    /// Off-CPU stacks the kernel's rate bound did not take (by design, not a loss); 0 without sampling.
    pub(super) fn offcpu_not_taken(&self, ebpf: &Ebpf) -> u64 {
        if self.sampler.is_none() {
            return 0;
        }
        offcpu_not_taken(ebpf)
    }

    /// Starts measuring the sampler's cost on the targets ([`LiveCost`]); `None` when not sampling or the
    /// kernel's statistics are unavailable.
    pub(super) fn live_start(&self, ebpf: &mut Ebpf) -> Option<LiveCost> {
        self.sampler.as_ref()?;
        live_start(ebpf, self.on_cpu)
    }

    /// Ends the measurement ([`live_finish`]).
    pub(super) fn live_finish(&self, ebpf: &mut Ebpf, c: LiveCost) -> LiveFigures {
        live_finish(ebpf, c, self.on_cpu)
    }
}

/// Loads the sampler's program into the kernel (verifies it) without attaching it.
pub(super) fn load(ebpf: &mut Ebpf) -> Result<(), CaptureError> {
    let p: &mut PerfEvent = program(ebpf, SAMPLE_PROGRAM)?;
    p.load().map_err(|source| CaptureError::Program {
        program: SAMPLE_PROGRAM.to_string(),
        source,
    })
}

impl Sampler {
    /// Loads the program and attaches it to a CPU clock at `hz` on every online CPU.
    fn attach(ebpf: &mut Ebpf, hz: u64) -> Result<Self, CaptureError> {
        let perr = |source| CaptureError::Program {
            program: SAMPLE_PROGRAM.to_string(),
            source,
        };
        let cpus = aya::util::online_cpus().map_err(|(path, source)| CaptureError::Program {
            program: format!("{SAMPLE_PROGRAM} (reading {path})"),
            source: aya::programs::ProgramError::IOError(source),
        })?;
        load(ebpf)?;
        let p: &mut PerfEvent = program(ebpf, SAMPLE_PROGRAM)?;
        let mut links = Vec::with_capacity(cpus.len());
        for cpu in cpus {
            let link = p
                .attach(
                    PerfEventConfig::Software(SoftwareEvent::CpuClock),
                    PerfEventScope::AllProcessesOneCpu { cpu },
                    SamplePolicy::Frequency(hz),
                    false,
                )
                .map_err(perr)?;
            links.push(link);
        }
        Ok(Self {
            links,
            hz,
            symbolizer: Symbolizer::new(),
        })
    }

    /// The sampling frequency asked for, Hz.
    pub fn hz(&self) -> u64 {
        self.hz
    }

    /// Whether the perf events are still attached.
    pub fn attached(&self) -> bool {
        !self.links.is_empty()
    }

    /// Closes the perf events (the budget's last sampling step). Returns whether any were attached.
    fn detach(&mut self, ebpf: &mut Ebpf) -> Result<bool, CaptureError> {
        if self.links.is_empty() {
            return Ok(false);
        }
        let p: &mut PerfEvent = program(ebpf, SAMPLE_PROGRAM)?;
        for l in self.links.drain(..) {
            p.detach(l).map_err(|source| CaptureError::Program {
                program: SAMPLE_PROGRAM.to_string(),
                source,
            })?;
        }
        Ok(true)
    }

    /// Symbolizes one record (an on-CPU sample, or an off-CPU stack of kind `OffCpuStack`).
    pub(super) fn symbolize(&mut self, e: &CpuSampleEvent) -> CpuSample {
        self.symbolizer.sample(e)
    }

    /// A process exited: its addresses are forgotten.
    fn forget(&mut self, pid: u32) {
        self.symbolizer.forget(pid);
    }

    /// Symbolization so far.
    pub fn stats(&self) -> SymbolizeStats {
        self.symbolizer.stats()
    }
}

/// Off-CPU stacks the kernel's per-CPU rate bound did not take so far (all CPUs): not taken by design, not a
/// loss (`llmprof_abi::stacks`). 0 when the map cannot be read.
fn offcpu_not_taken(ebpf: &Ebpf) -> u64 {
    let Some(m) = ebpf.map(OFFCPU_RATE_MAP) else {
        return 0;
    };
    let Ok(a) = aya::maps::PerCpuArray::<_, [u64; 3]>::try_from(m) else {
        return 0;
    };
    a.get(&0, 0).map_or(0, |v| {
        v.iter()
            .map(|w| w[llmprof_abi::stacks::OFFCPU_RATE_NOT_TAKEN])
            .sum()
    })
}

/// Perf-event frequency of the start-up calibration: ~100 samples of llmprof's own thread in
/// [`CALIBRATION_BURN`].
const CALIBRATION_HZ: u64 = 4000;
/// How long the calibration burns CPU on llmprof's thread.
const CALIBRATION_BURN: std::time::Duration = std::time::Duration::from_millis(30);
/// Fewest samples a calibration must see to give a figure.
const CALIBRATION_MIN_RUNS: u64 = 20;

/// Measures the sampler program's cost per traced sample: with the kernel's BPF run-time statistics on,
/// llmprof puts itself in `TRACED`, attaches the program to a CPU clock of its own thread at
/// [`CALIBRATION_HZ`], burns [`CALIBRATION_BURN`] of CPU, and divides the program's run time by its runs.
/// Then it leaves `TRACED`. `None` (logged) when the statistics or the event are unavailable.
pub(super) fn calibrate(ebpf: &mut Ebpf) -> Result<Option<f64>, CaptureError> {
    let stats = match aya::sys::enable_stats(aya::sys::Stats::RunTime) {
        Ok(fd) => fd,
        Err(e) => {
            log::debug!("sampler calibration: BPF stats unavailable: {e}");
            return Ok(None);
        }
    };
    let pid = std::process::id();
    set_traced(ebpf, pid, true)?;
    let measured = (|| -> Result<Option<f64>, CaptureError> {
        let perr = |source| CaptureError::Program {
            program: SAMPLE_PROGRAM.to_string(),
            source,
        };
        let p: &mut PerfEvent = program(ebpf, SAMPLE_PROGRAM)?;
        let before = p.info().map_err(perr)?;
        let link = p
            .attach(
                PerfEventConfig::Software(SoftwareEvent::CpuClock),
                PerfEventScope::CallingProcess { cpu: None },
                SamplePolicy::Frequency(CALIBRATION_HZ),
                false,
            )
            .map_err(perr)?;
        let end = std::time::Instant::now() + CALIBRATION_BURN;
        let mut x = 1u64;
        while std::time::Instant::now() < end {
            for _ in 0..1024 {
                x = std::hint::black_box(x.rotate_left(7) ^ 0x9e37_79b9).wrapping_mul(5);
            }
        }
        std::hint::black_box(x);
        p.detach(link).map_err(perr)?;
        let after = p.info().map_err(perr)?;
        let runs = after.run_count().saturating_sub(before.run_count());
        let ns = after.run_time().saturating_sub(before.run_time()).as_nanos() as f64;
        Ok((runs >= CALIBRATION_MIN_RUNS).then(|| ns / runs as f64))
    })();
    set_traced(ebpf, pid, false)?;
    drop(stats);
    measured
}

/// The sampler's cost measured on the traced processes themselves: the kernel's BPF run-time statistics held on
/// for a window of the session ([`live_start`] … [`live_finish`]). Unlike the start-up calibration (llmprof's
/// own thread, native frames only) this includes what the targets' stacks cost: deep native stacks and the
/// walk of their Python frames.
pub struct LiveCost {
    _stats: std::os::fd::OwnedFd,
    runs: u64,
    run_ns: u128,
    samples: u64,
    /// The wire probe's arrival-stamp programs (when attached): runs and run time at the start.
    arrivals: Option<(u64, u128)>,
    started: std::time::Instant,
}

/// What the live window measured.
#[derive(Clone, Copy, Debug, Default)]
pub struct LiveFigures {
    /// The sampler's ns per on-CPU sample of the targets (`None` with too few samples).
    pub sample_ns: Option<f64>,
    /// The arrival-stamp programs (`capture::wire::ARRIVAL_TRACEPOINTS`): mean ns per run and runs per
    /// second, host-wide (`None`: not attached, or no run).
    pub arrival: Option<(f64, f64)>,
}

/// Fewest on-CPU samples of the targets a live window must see to give a figure.
const LIVE_MIN_SAMPLES: u64 = 20;

/// Runs and run time (ns) of the arrival-stamp programs together (`None` when they are not loaded).
fn arrival_runs(ebpf: &mut Ebpf) -> Option<(u64, u128)> {
    let mut total = (0u64, 0u128);
    for (_, _, prog) in super::wire::ARRIVAL_TRACEPOINTS {
        let p: &mut aya::programs::TracePoint = program(ebpf, prog).ok()?;
        let info = p.info().ok()?;
        total.0 += info.run_count();
        total.1 += info.run_time().as_nanos();
    }
    Some(total)
}

/// Turns the statistics on and notes where the sampler program stands (`samples`: on-CPU samples of the targets
/// decoded so far). `None` (logged) when the statistics are unavailable.
fn live_start(ebpf: &mut Ebpf, samples: u64) -> Option<LiveCost> {
    let stats = aya::sys::enable_stats(aya::sys::Stats::RunTime)
        .map_err(|e| log::debug!("sampler live cost: BPF stats unavailable: {e}"))
        .ok()?;
    let p: &mut PerfEvent = program(ebpf, SAMPLE_PROGRAM).ok()?;
    let info = p.info().ok()?;
    Some(LiveCost {
        _stats: stats,
        runs: info.run_count(),
        run_ns: info.run_time().as_nanos(),
        samples,
        arrivals: arrival_runs(ebpf),
        started: std::time::Instant::now(),
    })
}

/// Ends the window: the sampler program's run time in it (every run: the targets' samples and the cheap
/// early exits on other tasks) divided by the targets' on-CPU samples decoded in it, ns — all of the
/// sampler's CPU charged to the samples it took — and the arrival-stamp programs' figures. The statistics go
/// off.
fn live_finish(ebpf: &mut Ebpf, c: LiveCost, samples: u64) -> LiveFigures {
    let arrival = match (c.arrivals, arrival_runs(ebpf)) {
        (Some((r0, t0)), Some((r1, t1))) if r1 > r0 => {
            let runs = r1 - r0;
            let secs = c.started.elapsed().as_secs_f64().max(1e-3);
            Some((t1.saturating_sub(t0) as f64 / runs as f64, runs as f64 / secs))
        }
        _ => None,
    };
    let Some(info) = program::<PerfEvent>(ebpf, SAMPLE_PROGRAM)
        .ok()
        .and_then(|p| p.info().ok())
    else {
        return LiveFigures {
            sample_ns: None,
            arrival,
        };
    };
    let taken = samples.saturating_sub(c.samples);
    let ns = info.run_time().as_nanos().saturating_sub(c.run_ns) as f64;
    log::debug!(
        "sampler live cost: {} runs, {taken} target samples, {ns:.0} ns",
        info.run_count().saturating_sub(c.runs)
    );
    LiveFigures {
        sample_ns: (taken >= LIVE_MIN_SAMPLES).then(|| ns / taken as f64),
        arrival,
    }
}
