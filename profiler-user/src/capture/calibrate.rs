//! Per-hit cost of llmprof's probes, measured on the running machine.
//!
//! Owns the timing loops (shared with `llmprof doctor`) and the calibration ([`run`]): an instance of
//! llmprof's programs of its own — its own maps, ring and counters — traces the calling process for a
//! few hundred milliseconds and times it: `getppid` untraced and traced (the cost of the raw_syscalls pair on
//! one syscall, including the slower syscall entry any attached tracepoint causes), the same for `close(-1)`
//! (a syscall whose exit the programs decode: argument copy at entry, records at exit,
//! [`DECODED_SYSCALLS`](super::syscalls::DECODED_SYSCALLS)), the range probe detached, attached, and attached
//! but sampled out (the optimized NOP5 path and the int3 trap differ ~20×, and kernels differ), and, as the
//! session uses them, the thread-state, stack-sampler, CUDA and wire probes. It never touches a target or a
//! session's maps: llmprof itself never enters a session's `TRACED`.
//!
//! A session does not wait for it: `llmprof attach` goes live first and runs the calibration in a child
//! process ([`super::calibrate_child::Background`], the hidden `llmprof calibrate-probes`), whose result the
//! self-accounting and the budget charge over the whole session once it arrives (~0.2–0.4 s later on this
//! 2-core VM). The session takes the untraced references ([`Untraced`], ~2 ms) before attaching its own
//! programs, since an attached raw_syscalls program slows every syscall of every process and that is part of
//! what a target pays; the child corrects for passing through the session's programs as well
//! ([`untraced_reference`]).
//!
//! Cost model (what [`Calibration`] feeds into `selfacct`): a traced syscall costs `syscall_ns`, or
//! `syscall_decoded_ns` when its number is one the exit decodes; an engine
//! probe hit costs `probe_ns` on top of the syscalls it makes itself. On 6.18 an optimized hit *is* a
//! `uprobe` syscall that the raw_syscalls programs may see and count as a syscall hit, so `probe_ns` is the
//! attached-minus-detached time of a probe call minus `syscall_ns` × the syscall hits each call produced
//! (measured, `syscalls_per_probe_hit`): every nanosecond is counted once.
//!
//! CUDA driver probes (when the session may attach them, [`CalibrationConfig::cuda`]): the
//! `llmprof_cuent`/`llmprof_curet` pair is attached to [`llmprof_calibrate_cuda_call`], a no-op stand-in
//! for a driver function in llmprof itself, and a call is timed detached and attached (~7 ms). A CUDA call
//! costs `cuda_call_ns`, the entry uprobe *and* the return uprobe (the uretprobe's trampoline is the larger
//! part), minus `syscall_ns` × the syscall hits each call produced (a 6.11+ kernel returns through the
//! `uretprobe` syscall). The counting entry-only uprobe (`llmprof_cucount`, launch-type calls in the default
//! `--cuda-calls counted` mode) is attached to a second stand-in, [`llmprof_calibrate_cuda_launch`], and
//! timed the same way: `cuda_count_ns`. The `cuda` counter counts one hit per call of either kind; the
//! kernel's `CUDA_COUNTED` says how many were counted, so counted × `cuda_count_ns` + the rest ×
//! `cuda_call_ns`.

use std::time::Instant;

use aya::programs::UProbe;
use aya::programs::uprobe::{UProbeAttachLocation, UProbeScope};
use llmprof_abi::{CudaFunc, CudaVariant, Knob, ProbeId, RangeOp, RangeRecord};

use super::error::CaptureError;
use super::object::{program, read_counters, write_knob};
use super::proc::set_traced;

/// Calls per timed round at attach start-up (5 rounds of each of 5 measurements: ~30–70 ms in all on this
/// host, idle to loaded).
pub const STARTUP_CALLS_PER_ROUND: u32 = 600;
/// Calls per timed round of the CUDA probe pair (entry + return uprobe: ~20 µs a call on this 2-core VM,
/// so 5 rounds of 60 calls attached take ~7 ms; 200 took ~25 ms).
pub const CUDA_CALLS_PER_ROUND: u32 = 60;
pub use super::rounds::ROUNDS;
use super::rounds::median_round;

pub use llmprof_trace::calibration::{Calibration, ENTRY_CALL, ENTRY_INT3, entry_name};

/// First instruction byte of the range probe as this process now executes it (the kernel rewrites it
/// in this process's copy of the page when a uprobe is attached).
pub fn probe_first_byte() -> u8 {
    let f = llmprof_probes::llmprof_probe_range as *const u8;
    // SAFETY: `f` points to the probe function's code, at least 6 readable bytes (NOP5 + ret, see
    // llmprof-probes); a volatile read because the kernel changes the byte behind the compiler's back.
    unsafe { std::ptr::read_volatile(f) }
}

/// Median over [`ROUNDS`] of the mean ns per `getppid` syscall in a round of `calls` (the cheapest syscall
/// there is: what is left is the syscall path plus, when traced, llmprof's raw_syscalls programs).
pub fn median_ns_per_syscall(calls: u32) -> f64 {
    median_round(calls, || {
        // SAFETY: getppid takes no arguments, cannot fail and touches no memory of ours.
        std::hint::black_box(unsafe { libc::syscall(libc::SYS_getppid) });
    })
}

/// Median over [`ROUNDS`] of the mean ns per `close(-1)` syscall in a round of `calls`: the cheapest call of
/// the class whose exit llmprof decodes (the entry copies its arguments, the exit looks the fd up among the
/// model files), since the kernel fails it at once with EBADF.
pub fn median_ns_per_decoded_syscall(calls: u32) -> f64 {
    median_round(calls, || {
        // SAFETY: close(-1) closes nothing (no fd is negative): the kernel returns EBADF.
        std::hint::black_box(unsafe { libc::close(std::hint::black_box(-1)) });
    })
}

/// The untraced references of both syscall classes, taken before any tracepoint is attached (an attached
/// raw_syscalls program slows every syscall of every process, and that is part of what a target pays).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Untraced {
    /// `getppid`, ns per call.
    pub plain_ns: f64,
    /// `close(-1)`, ns per call.
    pub decoded_ns: f64,
}

impl Untraced {
    /// Times both classes now, `calls` per round.
    pub fn measure(calls: u32) -> Self {
        Untraced {
            plain_ns: median_ns_per_syscall(calls),
            decoded_ns: median_ns_per_decoded_syscall(calls),
        }
    }
}

/// Median over [`ROUNDS`] of the mean ns per `llmprof_probes::range(rec)` call in a round of `calls`.
pub fn median_ns_per_call(rec: &RangeRecord, calls: u32) -> f64 {
    median_round(calls, || llmprof_probes::range(std::hint::black_box(rec)))
}

/// Timings of one start-up calibration, before they become a [`Calibration`].
#[derive(Clone, Copy, Debug, Default)]
pub struct Raw {
    /// getppid untraced / traced, ns.
    pub sys_untraced: f64,
    /// See [`Raw::sys_untraced`].
    pub sys_traced: f64,
    /// close(-1) untraced / traced, ns (the decoded class); None when not measured.
    pub decoded_untraced: Option<f64>,
    /// See [`Raw::decoded_untraced`].
    pub decoded_traced: Option<f64>,
    /// Probe call detached / attached / attached and sampled out, ns; None without an attached probe.
    pub probe_detached: f64,
    /// See [`Raw::probe_detached`].
    pub probe_attached: Option<f64>,
    /// See [`Raw::probe_detached`].
    pub probe_sampled_out: Option<f64>,
    /// Syscall hits counted per probe call.
    pub syscalls_per_call: f64,
    /// First byte of the attached probe.
    pub entry: Option<u8>,
    /// Call of [`llmprof_calibrate_cuda_call`] detached / with the CUDA probe pair attached, ns.
    pub cuda_detached: f64,
    /// See [`Raw::cuda_detached`]; None when not measured.
    pub cuda_attached: Option<f64>,
    /// Syscall hits counted per CUDA-probed call (the `uretprobe` syscall on 6.11+ kernels).
    pub syscalls_per_cuda_call: f64,
    /// Call of [`llmprof_calibrate_cuda_launch`] with the counting probe attached, ns; None when not
    /// measured (its detached time is [`Raw::cuda_detached`]: the two stand-ins are the same code).
    pub cuda_count_attached: Option<f64>,
    /// Syscall hits counted per call of it.
    pub syscalls_per_cuda_count: f64,
    /// Pipe ping-pong round trip untraced / traced, ns (thread states); None when not measured.
    pub pingpong_untraced: Option<f64>,
    /// See [`Raw::pingpong_untraced`].
    pub pingpong_traced: Option<f64>,
    /// Thread-state records (sched hits) per traced round trip.
    pub sched_hits_per_trip: f64,
    /// Syscall hits per traced round trip (its pipe reads and writes, the decoded class).
    pub syscalls_per_trip: f64,
    /// Traced round trip with off-CPU stacks taken at every block, ns; None when not measured.
    pub pingpong_offcpu: Option<f64>,
    /// Off-CPU stacks taken per round trip in that measurement.
    pub offcpu_stacks_per_trip: f64,
    /// The wire probe's costs; None when not measured.
    pub http: Option<super::calibrate_http::HttpCost>,
}

impl Raw {
    /// Applies the cost model of the module docs. Negative differences (noise on a fast path) become 0.
    pub fn into_calibration(self, took_ms: f64) -> Calibration {
        let syscall_ns = (self.sys_traced - self.sys_untraced).max(0.0);
        let syscall_decoded_ns = match (self.decoded_untraced, self.decoded_traced) {
            (Some(u), Some(t)) => Some((t - u).max(0.0)),
            _ => None,
        };
        let probe =
            |attached: f64| (attached - self.probe_detached - syscall_ns * self.syscalls_per_call).max(0.0);
        Calibration {
            syscall_ns,
            syscall_untraced_ns: self.sys_untraced,
            syscall_decoded_ns,
            syscall_decoded_untraced_ns: self.decoded_untraced,
            probe_ns: self.probe_attached.map(probe),
            probe_sampled_out_ns: self.probe_sampled_out.map(probe),
            syscalls_per_probe_hit: self.syscalls_per_call,
            probe_entry: self.entry,
            cuda_call_ns: self
                .cuda_attached
                .map(|a| (a - self.cuda_detached - syscall_ns * self.syscalls_per_cuda_call).max(0.0)),
            cuda_count_ns: self
                .cuda_count_attached
                .map(|a| (a - self.cuda_detached - syscall_ns * self.syscalls_per_cuda_count).max(0.0)),
            sched_event_ns: match (self.pingpong_untraced, self.pingpong_traced) {
                (Some(u), Some(t)) if self.sched_hits_per_trip > 0.0 => {
                    let decoded = syscall_decoded_ns.unwrap_or(syscall_ns);
                    Some(((t - u - decoded * self.syscalls_per_trip) / self.sched_hits_per_trip).max(0.0))
                }
                _ => None,
            },
            sample_ns: None,
            sample_live_ns: None,
            http_arrival_ns: None,
            http_arrival_runs_per_s: None,
            offcpu_stack_ns: match (self.pingpong_traced, self.pingpong_offcpu) {
                (Some(t), Some(o)) if self.offcpu_stacks_per_trip > 0.0 => {
                    Some(((o - t) / self.offcpu_stacks_per_trip).max(0.0))
                }
                _ => None,
            },
            http_request_ns: self.http.map(|h| h.request_ns),
            http_sse_write_ns: self.http.map(|h| h.sse_write_ns),
            took_ms,
        }
    }
}

/// The function the CUDA probe pair is attached to while calibrating: a stand-in for a driver call that
/// returns at once (so what the timing sees is the entry uprobe and the return uprobe).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn llmprof_calibrate_cuda_call(x: u64) -> u64 {
    std::hint::black_box(x).wrapping_add(1)
}

/// The function the counting CUDA probe is attached to while calibrating (the same code as
/// [`llmprof_calibrate_cuda_call`], another address).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn llmprof_calibrate_cuda_launch(x: u64) -> u64 {
    std::hint::black_box(x).wrapping_add(2)
}

/// Median over [`ROUNDS`] of the mean ns per [`llmprof_calibrate_cuda_call`] in a round of `calls`.
pub fn median_ns_per_cuda_call(calls: u32) -> f64 {
    median_ns_per_stand_in(llmprof_calibrate_cuda_call, calls)
}

/// Median over [`ROUNDS`] of the mean ns per call of a CUDA stand-in `f` in a round of `calls`.
fn median_ns_per_stand_in(f: extern "C" fn(u64) -> u64, calls: u32) -> f64 {
    median_round(calls, || {
        std::hint::black_box(f(std::hint::black_box(1)));
    })
}

/// What a calibration measures: the probes the session it is for attaches.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CalibrationConfig {
    /// The engine's range probe (timed on llmprof's own probe function).
    pub engine: bool,
    /// The CUDA driver probes: the entry + return pair and the counting entry probe.
    pub cuda: bool,
    /// Thread-state records (a traced pipe ping-pong).
    pub thread_states: bool,
    /// The stack sampler (and, with `thread_states`, off-CPU stacks).
    pub sample: bool,
    /// The HTTP wire probe.
    pub http: bool,
    /// The untraced references, taken by the session before its own programs were attached; `None`:
    /// measured here, before this calibration's programs are attached.
    pub untraced: Option<Untraced>,
}

/// Ring of a calibration's own instance of the programs: the records of one timed round fit (they are
/// discarded after each measurement).
const CALIBRATION_RING_BYTES: usize = 4 << 20;

/// Loads an instance of llmprof's programs of its own, traces the calling process with it and times the
/// probes `cfg` names (see the module docs); the instance is gone when this returns. It touches no map
/// of any session: a session's targets never share a counter or a ring with it, and llmprof itself never
/// enters a session's `TRACED`. Takes ~100–250 ms (~70 ms of it the kernel's verifier), so a session runs
/// it in a child process after its probes are live ([`super::calibrate_child::Background`]). Needs root.
pub fn run(cfg: &CalibrationConfig) -> Result<Calibration, CaptureError> {
    measure(cfg).map(|(cal, _instance)| cal)
}

/// [`run`], handing the result to `report` before the instance is taken down (detaching its uprobes waits
/// for RCU grace periods, ~0.1 s each): what the calibration child does, so its session gets the figures
/// without waiting for that.
pub fn run_reporting(cfg: &CalibrationConfig, report: impl FnOnce(&Result<Calibration, CaptureError>)) {
    match measure(cfg) {
        Ok((cal, instance)) => {
            report(&Ok(cal));
            drop(instance);
        }
        Err(e) => report(&Err(e)),
    }
}

/// [`run`]'s measurements; the instance is returned so that the caller decides when it goes.
fn measure(cfg: &CalibrationConfig) -> Result<(Calibration, aya::Ebpf), CaptureError> {
    let t0 = Instant::now();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(CaptureError::NotRoot);
    }
    super::object::ensure_tracefs()?;
    let calls = STARTUP_CALLS_PER_ROUND;
    // With a session's reference (taken before its programs were attached), this process's syscalls pass
    // through the session's programs too, untraced there: what those add is measured before and after this
    // instance's own pair is attached (one more untraced pass) and taken off, see [`untraced_reference`].
    let before_own = cfg.untraced.map(|_| Untraced::measure(calls));
    let untraced = cfg.untraced.unwrap_or_else(|| Untraced::measure(calls));
    let config = llmprof_abi::Config {
        slow_syscall_ns: u64::try_from(super::config::DEFAULT_SLOW_SYSCALL.as_nanos()).unwrap_or(u64::MAX),
        slot_tids: llmprof_abi::SYSCALL_SLOTS,
        // This instance times this process traced: the kernel's refusal is lifted while it does (set_traced).
        self_tgid: std::process::id(),
    };
    let mut ebpf = super::object::load_object(&config, CALIBRATION_RING_BYTES)?;
    if cfg.http {
        super::wire::load_decoders(&mut ebpf)?;
    }
    let _syscalls = super::syscalls::Syscalls::attach(&mut ebpf)?;
    let untraced = match before_own {
        Some(u1) => untraced_reference(untraced, u1, Untraced::measure(calls)),
        None => untraced,
    };
    if cfg.thread_states {
        super::sched::attach(&mut ebpf)?;
    }
    if cfg.engine {
        super::engine::load_programs(&mut ebpf, false)?;
    }
    if cfg.sample {
        super::stacks::load(&mut ebpf)?;
    }
    let mut ring = super::object::take_ring(&mut ebpf)?;
    let me = std::process::id();
    llmprof_probes::keep();
    let rec = RangeRecord::new(RangeOp::Mark, 0, 1, "llmprof", "calibration");
    let mut raw = Raw {
        sys_untraced: untraced.plain_ns,
        decoded_untraced: Some(untraced.decoded_ns),
        probe_detached: median_ns_per_call(&rec, calls),
        cuda_detached: if cfg.cuda {
            median_ns_per_cuda_call(CUDA_CALLS_PER_ROUND)
        } else {
            0.0
        },
        ..Raw::default()
    };
    // Off-CPU stacks only while measured.
    write_knob(&mut ebpf, Knob::OffCpuStacksOff, 1)?;
    if cfg.thread_states {
        // Untraced, with the programs attached: what every process pays is not the target's extra.
        raw.pingpong_untraced =
            super::sched::median_ns_per_pingpong(super::sched::PINGPONG_ROUND_TRIPS, |_| {});
    }
    set_traced(&mut ebpf, me, true)?;
    measure_traced(&mut ebpf, &mut raw, &rec, calls, cfg.engine)?;
    drain(&mut ring);
    if cfg.thread_states && raw.pingpong_untraced.is_some() {
        measure_sched(&mut ebpf, &mut raw);
        if cfg.sample && raw.pingpong_traced.is_some() {
            measure_offcpu(&mut ebpf, &mut raw);
        }
        drain(&mut ring);
    }
    // A CUDA pair that cannot be measured leaves its cost unknown (the engine-probe cost is charged
    // instead); the session's own `attach_cuda` reports its own failure if it fails too.
    if cfg.cuda
        && let Err(e) = measure_cuda(&mut ebpf, &mut raw)
    {
        log::warn!(
            "calibrate: CUDA probe cost not measured: {}",
            crate::causes::one_line(&e)
        );
        raw.cuda_attached = None;
    }
    if cfg.http {
        match super::calibrate_http::measure(&mut ebpf) {
            Ok(c) => raw.http = Some(c),
            Err(e) => log::warn!(
                "calibrate: wire probe cost not measured: {}",
                crate::causes::one_line(&e)
            ),
        }
        drain(&mut ring);
    }
    set_traced(&mut ebpf, me, false)?;
    let sample_ns = if cfg.sample {
        super::stacks::calibrate(&mut ebpf)?
    } else {
        None
    };
    let mut cal = raw.into_calibration(0.0);
    cal.sample_ns = sample_ns;
    cal.took_ms = t0.elapsed().as_secs_f64() * 1e3;
    log::debug!("calibrate: done in {:.1} ms: {cal:?}", cal.took_ms);
    Ok((cal, ebpf))
}

/// The untraced reference of a calibration beside a session. `u0`: the session's, before any program was
/// attached (the plain syscall); `u1`: here, with the session's pair attached (+ the slow syscall path any
/// attached raw_syscalls program causes, + one untraced pass of the pair); `u2`: with this instance's pair
/// attached too (+ a second untraced pass). The traced measurement then holds the slow path, the session's
/// untraced pass and this instance's traced pass, while a target pays the slow path and one traced pass:
/// the reference is `u0` plus one untraced pass, `u2 - u1` (never negative).
fn untraced_reference(u0: Untraced, u1: Untraced, u2: Untraced) -> Untraced {
    Untraced {
        plain_ns: u0.plain_ns + (u2.plain_ns - u1.plain_ns).max(0.0),
        decoded_ns: u0.decoded_ns + (u2.decoded_ns - u1.decoded_ns).max(0.0),
    }
}

/// Discards the records a measurement left in the calibration's ring.
fn drain(ring: &mut aya::maps::RingBuf<aya::maps::MapData>) {
    while ring.next().is_some() {}
}

fn measure_traced(
    ebpf: &mut aya::Ebpf,
    raw: &mut Raw,
    rec: &RangeRecord,
    calls: u32,
    range_probe_loaded: bool,
) -> Result<(), CaptureError> {
    raw.sys_traced = median_ns_per_syscall(calls);
    raw.decoded_traced = Some(median_ns_per_decoded_syscall(calls));
    if !range_probe_loaded {
        return Ok(());
    }
    let me = std::num::NonZeroU32::new(std::process::id()).ok_or(CaptureError::PidNotFound(0))?;
    let p: &mut UProbe = program(ebpf, llmprof_abi::RANGE_PROGRAM)?;
    let perr = |source| CaptureError::Program {
        program: "llmprof_range at llmprof itself (calibration)".to_owned(),
        source,
    };
    // The file offset from our own mapping: resolving the symbol would parse llmprof's ELF (tens of ms
    // with debug info), more than the whole measurement.
    let addr = llmprof_probes::llmprof_probe_range as *const u8 as u64;
    let location = match self_file_offset(addr) {
        Some(off) => UProbeAttachLocation::AbsoluteOffset(off),
        None => UProbeAttachLocation::Symbol(llmprof_abi::PROBE_RANGE),
    };
    let link = p
        .attach(location, "/proc/self/exe", UProbeScope::OneProcess(me))
        .map_err(perr)?;
    let sys_before = read_counters(ebpf)[ProbeId::Syscalls as usize].hits;
    raw.probe_attached = Some(median_ns_per_call(rec, calls));
    let sys_after = read_counters(ebpf)[ProbeId::Syscalls as usize].hits;
    raw.entry = Some(probe_first_byte());
    raw.syscalls_per_call = sys_after.saturating_sub(sys_before) as f64 / (f64::from(calls) * ROUNDS as f64);
    // Sampled out: the record's step (1) is not a multiple of the sampling period.
    write_knob(ebpf, Knob::RangeSampleEvery, u64::MAX)?;
    raw.probe_sampled_out = Some(median_ns_per_call(rec, calls));
    write_knob(ebpf, Knob::RangeSampleEvery, 0)?;
    // The link stays until the capture is dropped: detaching a uprobe waits for an RCU grace period
    // (~100 ms here), and llmprof, no longer in TRACED, never calls its probe again.
    let _ = link;
    Ok(())
}

/// Times the ping-pong with llmprof traced and both threads in the thread map; the counters give the records
/// and syscalls per round trip. The threads leave the map afterwards. A failure leaves the cost unmeasured.
fn measure_sched(ebpf: &mut aya::Ebpf, raw: &mut Raw) {
    let me = std::process::id();
    let before = read_counters(ebpf);
    let trips = super::sched::PINGPONG_ROUND_TRIPS;
    let mut reg_err = None;
    raw.pingpong_traced = super::sched::median_ns_per_pingpong(trips, |tids| {
        if let Err(e) = super::sched::put_threads(ebpf, me, tids) {
            reg_err = Some(e);
        }
    });
    let after = read_counters(ebpf);
    let n = f64::from(trips) * ROUNDS as f64;
    let delta = |id: ProbeId| after[id as usize].hits.saturating_sub(before[id as usize].hits) as f64 / n;
    raw.sched_hits_per_trip = delta(ProbeId::Sched);
    raw.syscalls_per_trip = delta(ProbeId::Syscalls);
    if let Err(e) = super::sched::forget_threads(ebpf, me).and(reg_err.map_or(Ok(()), Err)) {
        log::warn!(
            "calibrate: thread-state cost not measured: {}",
            crate::causes::one_line(&e)
        );
        raw.pingpong_traced = None;
    }
}

/// The traced ping-pong again with an off-CPU stack (kernel + user walk, ring record; no Python walk: llmprof
/// is not Python) taken at every block, without the rate bound: the extra time per stack is the cost of one.
/// Stacks go back off (the capture turns them on once calibrated). A failure leaves the cost unmeasured.
fn measure_offcpu(ebpf: &mut aya::Ebpf, raw: &mut Raw) {
    let me = std::process::id();
    if write_knob(ebpf, Knob::OffCpuStacksOff, llmprof_abi::stacks::OFFCPU_UNBOUNDED).is_err() {
        return;
    }
    let before = read_counters(ebpf);
    let trips = super::sched::PINGPONG_ROUND_TRIPS;
    let mut reg_err = None;
    let measured = super::sched::median_ns_per_pingpong(trips, |tids| {
        if let Err(e) = super::sched::put_threads(ebpf, me, tids) {
            reg_err = Some(e);
        }
    });
    let after = read_counters(ebpf);
    let off = write_knob(ebpf, Knob::OffCpuStacksOff, 1);
    let i = ProbeId::CpuSample as usize;
    raw.offcpu_stacks_per_trip =
        after[i].hits.saturating_sub(before[i].hits) as f64 / (f64::from(trips) * ROUNDS as f64);
    raw.pingpong_offcpu = measured;
    if let Err(e) = super::sched::forget_threads(ebpf, me)
        .and(reg_err.map_or(Ok(()), Err))
        .and(off)
    {
        log::warn!(
            "calibrate: off-CPU stack cost not measured: {}",
            crate::causes::one_line(&e)
        );
        raw.pingpong_offcpu = None;
    }
}

/// Loads the CUDA programs (when not yet loaded) and times [`llmprof_calibrate_cuda_call`] with the pair
/// attached (return probe first, as [`super::Capture::attach_cuda`] does), then
/// [`llmprof_calibrate_cuda_launch`] with the counting probe. The links stay, as in
/// [`measure_traced`]: llmprof leaves TRACED right after, so its stand-in costs nothing more.
fn measure_cuda(ebpf: &mut aya::Ebpf, raw: &mut Raw) -> Result<(), CaptureError> {
    let (entry, ret) = super::cuda::CUDA_PROGRAMS;
    let Some(per_call) = time_attached(ebpf, &[ret, entry], llmprof_calibrate_cuda_call)? else {
        return Ok(());
    };
    (raw.cuda_attached, raw.syscalls_per_cuda_call) = (Some(per_call.0), per_call.1);
    if let Some((ns, sys)) = time_attached(
        ebpf,
        &[super::cuda::CUDA_COUNT_PROGRAM],
        llmprof_calibrate_cuda_launch,
    )? {
        (raw.cuda_count_attached, raw.syscalls_per_cuda_count) = (Some(ns), sys);
    }
    Ok(())
}

/// Attaches `progs` (loading them when not yet loaded) at the stand-in `f` in llmprof itself, with the cookie
/// of a `cuLaunchKernel`, and times `f`: (ns per call, syscall hits per call). None when llmprof's own
/// mapping is not found. The links stay, as in [`measure_traced`]: llmprof leaves TRACED right after, so its
/// stand-ins cost nothing more.
fn time_attached(
    ebpf: &mut aya::Ebpf,
    progs: &[&str],
    f: extern "C" fn(u64) -> u64,
) -> Result<Option<(f64, f64)>, CaptureError> {
    let me = std::num::NonZeroU32::new(std::process::id()).ok_or(CaptureError::PidNotFound(0))?;
    let Some(off) = self_file_offset(f as *const u8 as u64) else {
        log::debug!("calibrate: llmprof's own mapping not found; CUDA probe cost not measured");
        return Ok(None);
    };
    for &prog in progs {
        let p: &mut UProbe = program(ebpf, prog)?;
        let perr = |source| CaptureError::Program {
            program: format!("{prog} at llmprof itself (calibration)"),
            source,
        };
        if p.fd().is_err() {
            p.load().map_err(perr)?;
        }
        let point = aya::programs::uprobe::UProbeAttachPoint {
            location: UProbeAttachLocation::AbsoluteOffset(off),
            cookie: Some(CudaFunc::LaunchKernel.cookie(CudaVariant::Plain)),
        };
        let perr = |source| CaptureError::Program {
            program: format!("{prog} at llmprof itself (calibration)"),
            source,
        };
        p.attach(point, "/proc/self/exe", UProbeScope::OneProcess(me))
            .map_err(perr)?;
    }
    let calls = CUDA_CALLS_PER_ROUND;
    let sys_before = read_counters(ebpf)[ProbeId::Syscalls as usize].hits;
    let ns = median_ns_per_stand_in(f, calls);
    let sys_after = read_counters(ebpf)[ProbeId::Syscalls as usize].hits;
    let per_call = sys_after.saturating_sub(sys_before) as f64 / (f64::from(calls) * ROUNDS as f64);
    Ok(Some((ns, per_call)))
}

/// File offset in llmprof's own executable of the code at `addr`, from `/proc/self/maps`.
fn self_file_offset(addr: u64) -> Option<u64> {
    let exe = std::fs::read_link("/proc/self/exe").ok()?;
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .find_map(|l| parse_maps_line(l, addr, &exe.to_string_lossy()))
}

/// `addr - start + offset` when the maps line `l` maps `path` and contains `addr`.
fn parse_maps_line(l: &str, addr: u64, path: &str) -> Option<u64> {
    let m = crate::sys::maps::MapsLine::parse(l)?;
    (m.path == path && (m.start..m.end).contains(&addr)).then(|| addr - m.start + m.offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_syscall_an_optimized_hit_makes_is_charged_once() {
        let raw = Raw {
            sys_untraced: 200.0,
            sys_traced: 1_400.0,
            decoded_untraced: Some(300.0),
            decoded_traced: Some(1_800.0),
            probe_detached: 2.0,
            probe_attached: Some(3_002.0),
            probe_sampled_out: Some(2_202.0),
            syscalls_per_call: 1.0,
            entry: Some(ENTRY_CALL),
            cuda_detached: 3.0,
            cuda_attached: Some(5_203.0),
            syscalls_per_cuda_call: 1.0,
            cuda_count_attached: Some(1_003.0),
            syscalls_per_cuda_count: 0.0,
            pingpong_untraced: Some(10_000.0),
            pingpong_traced: Some(16_800.0),
            sched_hits_per_trip: 4.0,
            syscalls_per_trip: 4.0,
            pingpong_offcpu: Some(20_400.0),
            offcpu_stacks_per_trip: 2.0,
            http: Some(super::super::calibrate_http::HttpCost {
                request_ns: 2_000.0,
                sse_write_ns: 1_300.0,
            }),
        };
        let c = raw.into_calibration(30.0);
        // 3600 ns more per round trip with a stack at each of its 2 blocks.
        assert_eq!(c.offcpu_stack_ns, Some(1_800.0));
        assert_eq!(c.http_request_ns, Some(2_000.0));
        assert_eq!(c.http_sse_write_ns, Some(1_300.0));
        // 6800 ns more per round trip: its 4 pipe syscalls at the decoded cost (4 × 1500), the rest over
        // its 4 thread-state records.
        assert_eq!(c.sched_event_ns, Some(200.0));
        assert_eq!(c.syscall_ns, 1_200.0);
        assert_eq!(c.syscall_decoded_ns, Some(1_500.0));
        assert_eq!(c.decoded_ns(), 1_500.0);
        // The uretprobe syscall of each CUDA call is charged as a syscall, not twice.
        assert_eq!(c.cuda_call_ns, Some(4_000.0));
        // The counting probe makes no syscall (no return probe): all of it is the probe.
        assert_eq!(c.cuda_count_ns, Some(1_000.0));
        assert_eq!(c.probe_ns, Some(1_800.0));
        assert_eq!(c.probe_sampled_out_ns, Some(1_000.0));
        assert_eq!(c.optimized(), Some(true));
    }

    #[test]
    fn noise_never_makes_a_negative_cost() {
        let raw = Raw {
            sys_untraced: 200.0,
            sys_traced: 190.0,
            probe_detached: 2.0,
            ..Raw::default()
        };
        let c = raw.into_calibration(1.0);
        assert_eq!(c.syscall_ns, 0.0);
        // Not measured: the decoded class is charged the plain cost.
        assert_eq!(c.syscall_decoded_ns, None);
        assert_eq!(c.decoded_ns(), 0.0);
        assert_eq!(c.probe_ns, None);
        assert_eq!(c.cuda_call_ns, None);
        assert_eq!(c.optimized(), None);
        let c = Raw {
            decoded_untraced: Some(300.0),
            decoded_traced: Some(290.0),
            ..raw
        }
        .into_calibration(1.0);
        assert_eq!(c.syscall_decoded_ns, Some(0.0));
    }

    #[test]
    fn file_offsets_come_from_the_mapping_that_holds_the_address() {
        let l = "55d0c000-55d0d000 r-xp 00002000 08:01 123 /usr/bin/llmprof";
        assert_eq!(parse_maps_line(l, 0x55d0c010, "/usr/bin/llmprof"), Some(0x2010));
        assert_eq!(parse_maps_line(l, 0x55d0d000, "/usr/bin/llmprof"), None);
        assert_eq!(parse_maps_line(l, 0x55d0c010, "/other"), None);
        let f = llmprof_probes::llmprof_probe_range as *const u8 as u64;
        assert!(
            self_file_offset(f).is_some(),
            "this test binary maps its own code"
        );
    }

    #[test]
    fn timing_loops_measure_something() {
        assert!(median_ns_per_syscall(100) > 0.0);
        assert!(median_ns_per_decoded_syscall(100) > 0.0);
        let rec = RangeRecord::new(llmprof_abi::RangeOp::Mark, 0, 0, "t", "t");
        assert!(median_ns_per_call(&rec, 100) > 0.0);
        assert!(median_ns_per_cuda_call(100) > 0.0);
    }
}
