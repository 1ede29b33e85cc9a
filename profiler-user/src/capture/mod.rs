//! Capture: loads llmprof's eBPF programs, attaches them to the traced processes and hands what they record
//! to the decoder ([`llmprof_trace::decode`]), which turns it into the [`llmprof_trace::event`] stream.
//!
//! Owns everything that touches the kernel (and nothing else: sinks consume the events). [`Capture`] is a
//! thin owner of the eBPF object ([`object`]) and its record ring, with one part per probe family, each in
//! the file named by the family (as in `llmprof-abi`, `profiler-ebpf` and `llmprof_trace::decode`):
//! [`syscalls`], [`files`], [`egress`], [`engine`], [`cuda`], [`cupti`], [`wire`], [`stacks`], [`sched`],
//! [`python`], [`proc`]. A part owns its programs, links and attach state and reads or writes its own maps;
//! this file only orders the start, drains the ring (each record goes to its family's decoder through
//! [`Decoder`]) and forwards the session's calls to the part that answers them. The parts never import this
//! file: what they share is in [`object`], [`error`] and [`tracefs`].
//!
//! Lifecycle: [`Capture::start`] checks privileges and targets, loads the object (ring size and slow-syscall
//! threshold set at load), fills the pattern map, attaches the tracepoints and, for each target whose binary
//! exports the probe ABI, the engine uprobes; then, when asked, measures the per-hit cost on llmprof itself
//! ([`calibrate`]) and only then puts the targets in the traced-pid map. While running, the overhead budget
//! turns `KNOBS` ([`Capture::set_knob`]) and detaches the syscall or range programs
//! ([`Capture::detach_syscalls`], [`Capture::detach_ranges`]). [`Capture::poll`] drains the ring buffer
//! (the kernel never wakes us per event, see `BPF_RB_NO_WAKEUP`; we poll at [`POLL_INTERVAL`]). Dropping the
//! `Capture` detaches and unloads everything.

pub mod calibrate;
pub mod calibrate_child;
mod calibrate_http;
mod config;
pub mod cuda;
pub mod cupti;
pub mod egress;
pub mod elf;
pub mod engine;
mod error;
pub mod files;
mod object;
pub mod patterns;
pub mod proc;
pub mod python;
mod rounds;
pub mod sched;
pub mod stacks;
pub mod syscalls;
mod tracefs;
pub mod wire;

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use aya::Ebpf;
use aya::maps::{MapData, RingBuf};
use llmprof_abi::{Config, Knob, NUM_PROBES, ProbeCounters};
use llmprof_trace::decode::{Decoded, Decoder, Resolve};
use llmprof_trace::event::cupti::GpuStats;
use llmprof_trace::event::{Event, EventBody, SyscallAggregate};

pub use calibrate::Calibration;
pub use config::{CaptureConfig, DEEP_RING_BYTES, DEFAULT_RING_BYTES, DEFAULT_SLOW_SYSCALL};
pub use cuda::{CUDA_COUNT_PROGRAM, CUDA_PROGRAMS};
pub use egress::{Cidr, CidrError};
pub use engine::{EngineProbes, inspect_engine};
pub use error::{CaptureError, HandoffError};
pub use object::ensure_tracefs;
pub use patterns::{DEFAULT_MODEL_PATTERNS, PatternError};
pub use syscalls::DECODED_SYSCALLS;
pub use tracefs::{TRACEFS, tracepoint_dir};

/// How often [`Capture::poll`] looks at the ring when the kernel does not wake it (the programs submit
/// with `BPF_RB_NO_WAKEUP`): 20 ms keeps a 16 MiB ring far from full at a million events/s.
pub const POLL_INTERVAL: Duration = Duration::from_millis(20);
/// Most records one [`Capture::poll`] decodes before returning, so a full ring cannot stall the caller.
const MAX_RECORDS_PER_POLL: usize = 1 << 16;

/// Tracepoints every session attaches: (category, name, program): the syscalls pair (as raw tracepoints,
/// [`syscalls`]) and the process-tree programs ([`proc`]).
pub const TRACEPOINTS: [(&str, &str, &str); 5] = [
    syscalls::TRACEPOINTS[0],
    syscalls::TRACEPOINTS[1],
    proc::TRACEPOINTS[0],
    proc::TRACEPOINTS[1],
    proc::TRACEPOINTS[2],
];
/// Every program name of the object (all start with `llmprof_`, which a kernel listing shows).
pub const PROGRAM_NAMES: [&str; 22] = [
    sched::SCHED_TRACEPOINTS[0].2,
    sched::SCHED_TRACEPOINTS[1].2,
    sched::SCHED_TRACEPOINTS[2].2,
    sched::SCHED_TRACEPOINTS[3].2,
    TRACEPOINTS[0].2,
    TRACEPOINTS[1].2,
    TRACEPOINTS[2].2,
    TRACEPOINTS[3].2,
    TRACEPOINTS[4].2,
    llmprof_abi::engine::PROGRAMS[0],
    llmprof_abi::engine::PROGRAMS[1],
    llmprof_abi::engine::PROGRAMS[2],
    llmprof_abi::engine::PROGRAMS[3],
    CUDA_PROGRAMS.0,
    CUDA_PROGRAMS.1,
    CUDA_COUNT_PROGRAM,
    python::PROGRAM,
    stacks::SAMPLE_PROGRAM,
    cupti::HANDOFF_PROGRAM,
    wire::ARRIVAL_TRACEPOINTS[0].2,
    wire::ARRIVAL_TRACEPOINTS[1].2,
    wire::ARRIVAL_TRACEPOINTS[2].2,
];

/// A running capture: programs loaded and attached until dropped.
pub struct Capture {
    ring: RingBuf<MapData>,
    // Declared after `ring` so maps and programs outlive the ring reader; dropping them detaches
    // every link and closes every fd, which unloads the programs.
    ebpf: Ebpf,
    logger: Option<aya_log::EbpfLogger<&'static dyn log::Log>>,
    decoder: Decoder,
    /// The targets and the `TRACED` map.
    traced: proc::Traced,
    syscalls: syscalls::Syscalls,
    engine: engine::Engine,
    cuda: cuda::Cuda,
    cupti: cupti::Cupti,
    wire: wire::Wire,
    stacks: stacks::Stacks,
    python: python::PySampling,
    /// Thread states are recorded (the thread map is kept).
    thread_states: bool,
    /// Stack samples of the last drain, not handed out yet (see [`Capture::drain`]).
    held: Vec<Event>,
    /// The untraced syscall references ([`CaptureConfig::measure_untraced`]).
    untraced: Option<calibrate::Untraced>,
    attach_latency: Duration,
    /// llmprof's own pid (its calibration samples are dropped).
    self_pid: u32,
}

impl std::fmt::Debug for Capture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Capture")
            .field("pids", &self.traced.pids)
            .field("engine", self.engine.by_pid())
            .finish()
    }
}

impl Capture {
    /// Loads and attaches everything for `cfg.pids`. Fails before loading anything when not root, a pid
    /// does not exist, a tracepoint is missing, a pattern is unsupported or an engine speaks another ABI.
    pub fn start(cfg: &CaptureConfig) -> Result<Capture, CaptureError> {
        let t0 = Instant::now();
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(CaptureError::NotRoot);
        }
        let engine = engine::inspect_targets(&cfg.pids, cfg.follow_children)?;
        let patterns = patterns::parse_all(&cfg.model_patterns)?;
        log::debug!("capture: targets inspected in {:?}", t0.elapsed());
        ensure_tracefs()?;
        let sched_tps = if cfg.thread_states {
            &sched::SCHED_TRACEPOINTS[..]
        } else {
            &[]
        };
        for &(category, name, _) in TRACEPOINTS.iter().chain(sched_tps) {
            if !tracepoint_dir(category, name).exists() {
                return Err(CaptureError::MissingTracepoint {
                    category: category.to_string(),
                    name: name.to_string(),
                });
            }
        }

        let config = Config {
            slow_syscall_ns: u64::try_from(cfg.slow_syscall.as_nanos()).unwrap_or(u64::MAX),
            slot_tids: cfg.syscall_slot_tids.min(llmprof_abi::SYSCALL_SLOTS),
            self_tgid: std::process::id(),
        };
        let mut ebpf = object::load_object(&config, cfg.ring_bytes)?;
        log::debug!("capture: object loaded (maps created) at {:?}", t0.elapsed());
        let logger = match aya_log::EbpfLogger::init(&mut ebpf) {
            Ok(l) => Some(l),
            Err(e) => {
                log::debug!("eBPF logs unavailable: {e}");
                None
            }
        };

        // Targets enter TRACED last, once every program is attached.
        files::fill_patterns(&mut ebpf, &patterns)?;
        // The untraced syscall reference is taken before any tracepoint is attached: an attached
        // raw_syscalls program slows every syscall of every process (the slow entry path, the filter),
        // and that is part of what a target pays.
        let untraced = cfg
            .measure_untraced
            .then(|| calibrate::Untraced::measure(calibrate::STARTUP_CALLS_PER_ROUND));
        // Before the exit program runs: it hands followed connections' reads and writes to these.
        if cfg.http != wire::HttpPorts::Off {
            wire::load_decoders(&mut ebpf)?;
        }
        let syscalls = syscalls::Syscalls::attach(&mut ebpf)?;
        object::attach_tracepoints(&mut ebpf, &proc::TRACEPOINTS)?;

        // Off-CPU stacks wait until the sampler is attached.
        stacks::Stacks::hold_off_cpu(&mut ebpf)?;
        if cfg.thread_states {
            sched::attach(&mut ebpf)?;
        }
        if cfg.http != wire::HttpPorts::Off
            && let Err(why) = wire::attach_arrivals(&mut ebpf, &cfg.http)?
        {
            log::warn!("wire probe: {why}: requests start when the server reads them, not when they arrive");
        }
        log::debug!("capture: tracepoints verified and attached at {:?}", t0.elapsed());
        let stacks = stacks::Stacks::start(&mut ebpf, cfg.sample_hz)?;
        let engine = engine::Engine::start(
            &mut ebpf,
            engine,
            cfg.capture_content,
            cfg.follow_children,
            cfg.pids.first().copied(),
        )?;

        let ring = object::take_ring(&mut ebpf)?;
        stacks.go(&mut ebpf)?;
        // Before the processes are traced: with every port followed, any accepted connection is probed by its
        // first bytes in the kernel (workers that get their socket after attach included).
        object::write_knob(
            &mut ebpf,
            Knob::HttpAcceptAll,
            u64::from(cfg.http == wire::HttpPorts::All),
        )?;
        // The kernel refuses llmprof's own process; a capture asked to trace it (`llmprof doctor` timing its own
        // probes) lifts that for this instance. `attach` never asks (`--pid` of llmprof is refused).
        if cfg.pids.contains(&std::process::id()) {
            object::write_knob(&mut ebpf, Knob::SelfTraced, 1)?;
        }
        let traced = proc::Traced::new(&cfg.pids, cfg.follow_children);
        traced.start(&mut ebpf)?;
        // After TRACED: from here on task_newtask adds new threads, so the listing misses none.
        if cfg.thread_states {
            let n = sched::fill_threads(&mut ebpf, &cfg.pids)?;
            log::debug!("capture: {n} threads in the thread-state map");
        }
        let python =
            python::PySampling::start(&mut ebpf, &cfg.pids, cfg.python_hz, stacks.sampler().is_some())?;
        log::debug!("capture: all probes live at {:?}", t0.elapsed());
        let mut cap = Capture {
            ring,
            ebpf,
            logger,
            decoder: Decoder::new(cfg.egress_allow.clone()),
            traced,
            syscalls,
            engine,
            cuda: cuda::Cuda::new(cfg.cuda_counted),
            cupti: cupti::Cupti::default(),
            wire: wire::Wire::new(&cfg.http),
            stacks,
            python,
            thread_states: cfg.thread_states,
            held: Vec::new(),
            untraced,
            attach_latency: t0.elapsed(),
            self_pid: std::process::id(),
        };
        cap.refresh_http()?;
        Ok(cap)
    }

    /// Appends the events recorded since the last call to `out`. Returns as soon as it has some, or after
    /// at most `timeout` without any.
    pub fn poll(&mut self, out: &mut Vec<Event>, timeout: Duration) -> Result<(), CaptureError> {
        let deadline = Instant::now() + timeout;
        loop {
            let got = self.drain(out);
            if let Some(l) = self.logger.as_mut() {
                l.flush();
            }
            let now = Instant::now();
            if got > 0 || now >= deadline {
                return Ok(());
            }
            let wait = (deadline - now).min(POLL_INTERVAL);
            let mut pfd = libc::pollfd {
                fd: self.ring.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = libc::c_int::try_from(wait.as_millis().max(1)).unwrap_or(libc::c_int::MAX);
            // SAFETY: `pfd` is a valid pollfd for the duration of the call and nfds is 1.
            let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
            if rc < 0 {
                let err = std::io::Error::last_os_error();
                if err.kind() != std::io::ErrorKind::Interrupted {
                    return Err(CaptureError::Poll(err));
                }
            }
        }
    }

    /// Decodes up to [`MAX_RECORDS_PER_POLL`] records of the ring into `out`; returns how many it read. Each
    /// record goes to its family's decoder ([`Decoder::decode`] dispatches by kind); what comes back goes to
    /// the family part that keeps state across records (stacks, wire) or straight out.
    fn drain(&mut self, out: &mut Vec<Event>) -> usize {
        self.python.maybe_refresh(&mut self.ebpf);
        // Stack samples wait one drain in `held` before they are handed out: the kernel submits a sample's
        // native record before its Python stack, and a drain (or the batch bound) can fall between the two.
        let mut carried = std::mem::take(&mut self.held);
        let mut n = 0;
        while n < MAX_RECORDS_PER_POLL {
            let Some(item) = self.ring.next() else { break };
            let mut machine = Machine {
                sampler: self.stacks.sampler_mut(),
                python: &mut self.python,
                self_pid: self.self_pid,
            };
            match self.decoder.decode(&item, &mut machine) {
                Decoded::Stack(ev) => {
                    self.stacks.decoded(&ev);
                    self.held.push(ev);
                }
                Decoded::PyStack(ev) => {
                    llmprof_trace::decode::python::splice_or_push(ev, [&mut self.held, &mut carried], out);
                }
                Decoded::Events(mut evs) => out.append(&mut evs),
                Decoded::Wire(r) => self.wire.push(r, out),
                Decoded::Event(ev) => {
                    // The engine's own request records: what a wire request of its process may have carried.
                    self.wire.engine(&ev);
                    if let EventBody::ProcessExit { .. } = &ev.body {
                        self.stacks.forget(ev.pid);
                        self.cupti.forget(ev.pid);
                    }
                    out.push(ev);
                }
                Decoded::Nothing | Decoded::Invalid => {}
            }
            n += 1;
        }
        out.append(&mut carried);
        n
    }

    /// Hands out the stack samples the last drain held back (see [`Capture::poll`]): at the end of a session,
    /// after its last poll.
    pub fn release_held(&mut self, out: &mut Vec<Event>) {
        out.append(&mut self.held);
    }

    /// Records the decoder could not make sense of.
    pub fn decode_errors(&self) -> u64 {
        self.decoder.undecodable()
    }

    /// Per-probe counters summed over CPUs, indexed by `llmprof_abi::ProbeId`.
    pub fn counters(&self) -> [ProbeCounters; NUM_PROBES] {
        object::read_counters(&self.ebpf)
    }

    /// Sets a runtime knob of the programs (takes effect on the next hit).
    pub fn set_knob(&mut self, knob: Knob, value: u64) -> Result<(), CaptureError> {
        object::write_knob(&mut self.ebpf, knob, value)
    }

    /// Kernel ids of the programs this capture loaded (to check they are gone after drop).
    pub fn program_ids(&self) -> Vec<u32> {
        self.ebpf
            .programs()
            .filter_map(|(_, p)| p.info().ok())
            .map(|i| i.id())
            .collect()
    }

    /// The untraced syscall references taken before anything was attached (None unless
    /// [`CaptureConfig::measure_untraced`]); what [`calibrate::run`] measures against.
    pub fn untraced(&self) -> Option<calibrate::Untraced> {
        self.untraced
    }

    /// Time from the start of [`Capture::start`] until every probe was live.
    pub fn attach_latency(&self) -> Duration {
        self.attach_latency
    }

    // proc: the traced set.

    /// Puts processes found after the start in the traced set (with the targets' flags: a tree follows
    /// their children too). The kernel adds the children of traced processes by itself; this is for what
    /// it cannot see, e.g. a child forked between the /proc walk and the start.
    pub fn trace_pids(&mut self, pids: &[u32]) -> Result<(), CaptureError> {
        self.traced.add(&mut self.ebpf, pids)?;
        // Their threads that exist now (later ones come from task_newtask).
        if self.thread_states {
            sched::fill_threads(&mut self.ebpf, pids)?;
        }
        Ok(())
    }

    /// A process joined the session after the start (a process of the tree): its listening sockets are
    /// followed from the next [`Capture::refresh_http`].
    pub fn process_joined(&mut self, pid: u32) {
        self.wire.process_joined(pid);
    }

    /// A process left the session.
    pub fn process_left(&mut self, pid: u32) {
        self.wire.process_left(pid);
    }

    // syscalls, egress.

    /// Detaches the raw_syscalls programs: syscall aggregates, slow syscalls, model-file I/O, connects and
    /// sent bytes stop (what was aggregated stays readable). Returns false when they were not attached.
    pub fn detach_syscalls(&mut self) -> Result<bool, CaptureError> {
        self.syscalls.detach(&mut self.ebpf)
    }

    /// Completed syscalls of the traced processes so far (sum of the in-kernel aggregates).
    pub fn syscall_total(&self) -> u64 {
        syscalls::total(&self.ebpf)
    }

    /// Completed syscalls of the traced processes so far whose number is one of [`DECODED_SYSCALLS`]
    /// ([`syscalls::decoded`]).
    pub fn syscalls_decoded(&self) -> u64 {
        syscalls::decoded(&self.ebpf)
    }

    /// The in-kernel syscall aggregates per (pid, tid, syscall).
    pub fn syscall_aggregates(&self) -> Vec<SyscallAggregate> {
        syscalls::aggregates(&self.ebpf)
    }

    /// Bytes sent on each socket the targets connected: (pid, fd, bytes).
    pub fn sent_bytes(&self) -> Vec<(u32, i32, u64)> {
        egress::sent_bytes(&self.ebpf)
    }

    // engine.

    /// Whether the engine probes of `pid` are attached (NotFound for pids not traced).
    pub fn engine_probes(&self, pid: u32) -> EngineProbes {
        self.engine.probes(pid)
    }

    /// The engine probes of the first process whose probes were attached during the capture (at start or
    /// later, in a process of the tree), if any.
    pub fn any_engine(&self) -> Option<EngineProbes> {
        self.engine.any()
    }

    /// Whether the engine uprobe programs are loaded (a target or a tree that may gain an engine).
    pub fn engine_programs_loaded(&self) -> bool {
        self.engine.loaded()
    }

    /// Attaches the engine probes to `pid`'s current image when its binary exports the probe ABI (a process
    /// of the tree that started or executed an engine); nothing when they are attached to that image
    /// already. What `pid` exports now.
    pub fn attach_engine(&mut self, pid: u32) -> Result<EngineProbes, CaptureError> {
        self.engine.attach(&mut self.ebpf, pid)
    }

    /// Attaches the engine probes to the helper library at `lib` (a path llmprof can open: the target's
    /// mapping of it, `/proc/PID/map_files/…`) in `pid`: a library that exports the probe ABI, as the
    /// Python-hooks helper does. `pid`'s engine probes are then those of the library.
    pub fn attach_engine_library(&mut self, pid: u32, lib: &Path) -> Result<EngineProbes, CaptureError> {
        self.engine.attach_library(&mut self.ebpf, pid, lib)
    }

    /// Detaches the engine range uprobes (steps and requests stay). Returns false when none was attached.
    pub fn detach_ranges(&mut self) -> Result<bool, CaptureError> {
        self.engine.detach_ranges(&mut self.ebpf)
    }

    // cuda.

    /// Attaches the CUDA driver uprobes of `pid` at each `(file offset, cookie)` of the library `lib` (see
    /// `crate::cuda::libcuda`): the counting entry-only uprobe at the launch-type functions when
    /// [`CaptureConfig::cuda_counted`], else the entry + return pair (return probe first, so every entry seen
    /// has its return). Returns how many entry points were attached; entry points the kernel refuses are
    /// skipped (logged), and an error is returned only when none could be attached.
    pub fn attach_cuda(
        &mut self,
        pid: u32,
        lib: &Path,
        points: &[(u64, u64)],
    ) -> Result<usize, CaptureError> {
        self.cuda.attach(&mut self.ebpf, pid, lib, points)
    }

    /// The injected CUPTI helper records `pid`'s kernels, graph launches, copies and waits: its launch-type,
    /// copy and synchronize calls are no longer probed at all (their uprobes of `pid` go, counting or timed;
    /// none is attached later), so no call is paid for twice. Returns how many links went.
    pub fn cuda_launches_from_cupti(&mut self, pid: u32) -> usize {
        self.cuda.launches_from_cupti(pid)
    }

    /// Detaches the CUDA driver uprobes and attaches none later (the `cuda_detached` budget step). Returns
    /// false when none was attached. Takes ~0.1 s per link (RCU grace periods), on parallel threads.
    pub fn detach_cuda(&mut self) -> Result<bool, CaptureError> {
        Ok(self.cuda.detach())
    }

    /// CUDA driver uprobe links attached (entry and return), which [`Drop`] detaches.
    pub fn cuda_links(&self) -> usize {
        self.cuda.link_count()
    }

    /// CUDA calls counted by the entry-only uprobe so far (the rest of the `cuda` hits were timed).
    pub fn cuda_counted_calls(&self) -> u64 {
        cuda::counted_calls(&self.ebpf)
    }

    /// The counted CUDA calls still in the kernel's per-thread windows, as events (the end of a session:
    /// a thread's last window is otherwise written only at its next call). Clears them.
    pub fn flush_cuda_counts(&mut self, out: &mut Vec<Event>) {
        cuda::flush_counts(&mut self.ebpf, self.self_pid, out);
    }

    // cupti.

    /// Attaches the GPU helper's handoff uprobe in `pid`'s copy of the helper library `lib` (a path this
    /// process can open: under `/proc/PID/root` for a target in another mount namespace). Attaching a process
    /// twice is a no-op.
    pub fn attach_handoff(&mut self, pid: u32, lib: &Path) -> Result<(), CaptureError> {
        self.cupti.attach_handoff(&mut self.ebpf, pid, lib)
    }

    /// Attaches the handoff probe of `pid` if it has the GPU helper library mapped and is not attached yet (a
    /// process that loaded the helper itself, or one injected by an earlier session). `None`: nothing to do.
    pub fn attach_loaded_helper(&mut self, pid: u32) -> Option<Result<PathBuf, CaptureError>> {
        self.cupti.attach_loaded_helper(&mut self.ebpf, pid)
    }

    /// Processes whose handoff probe is attached.
    pub fn handoff_pids(&self) -> Vec<u32> {
        self.cupti.handoff_pids()
    }

    /// What the GPU activity chunks held and lost so far.
    pub fn gpu_stats(&self) -> GpuStats {
        self.decoder.cupti_stats().clone()
    }

    // wire.

    /// Finds the traced processes' listening sockets (and connections established on them) and has the wire
    /// probe follow them; call again to pick up sockets opened later (and processes that joined). Returns the
    /// ports followed per process.
    pub fn refresh_http(&mut self) -> Result<&HashMap<u32, Vec<u16>>, CaptureError> {
        self.wire.refresh(&mut self.ebpf, &self.traced.pids)
    }

    /// What the wire reconstruction saw so far.
    pub fn wire_stats(&self) -> llmprof_trace::decode::wire::requests::WireStats {
        self.wire.stats()
    }

    // stacks.

    /// The stack sampler, when sampling.
    pub fn sampler(&self) -> Option<&stacks::Sampler> {
        self.stacks.sampler()
    }

    /// Stops stack sampling (the budget's last sampling step): closes the perf events. Returns whether it
    /// was sampling.
    pub fn detach_sampler(&mut self) -> Result<bool, CaptureError> {
        self.stacks.detach(&mut self.ebpf)
    }

    /// The off-CPU stacks decoded so far (taken by the `sched_switch` program at a blocking switch).
    pub fn offcpu_stacks(&self) -> u64 {
        self.stacks.off_cpu()
    }

    /// Off-CPU stacks the kernel's rate bound did not take (by design, not a loss); 0 without stack sampling.
    pub fn offcpu_not_taken(&self) -> u64 {
        self.stacks.offcpu_not_taken(&self.ebpf)
    }

    /// Starts measuring the sampler's cost on the targets ([`stacks::LiveCost`]); `None` when not sampling or
    /// the kernel's statistics are unavailable.
    pub fn live_sample_cost_start(&mut self) -> Option<stacks::LiveCost> {
        self.stacks.live_start(&mut self.ebpf)
    }

    /// Ends the measurement: ns per on-CPU sample of the targets (`None`: too few samples), and the wire
    /// probe's arrival stamps.
    pub fn live_sample_cost_finish(&mut self, c: stacks::LiveCost) -> stacks::LiveFigures {
        self.stacks.live_finish(&mut self.ebpf, c)
    }

    // python.

    /// Python stack sampling: the targets sampled and the problems of those that cannot be.
    pub fn python(&self) -> &python::PySampling {
        &self.python
    }

    /// A process joined the session (or, with `exec`, executed a program: what was known of its image is
    /// dropped): Python sampling starts when it runs a supported CPython. Returns the problem, for the
    /// timeline, when it runs a Python that cannot be read (e.g. an unsupported version).
    pub fn watch_python(&mut self, pid: u32, exec: bool) -> Option<String> {
        if exec {
            self.python.remove(&mut self.ebpf, pid);
        }
        let before = self.python.problems().len();
        if let Err(e) = self.python.add(&mut self.ebpf, pid) {
            log::debug!("python: pid {pid}: {e}");
        }
        self.python.problems().get(before).cloned()
    }

    /// A process left the session: its Python maps entries and resolved code objects go.
    pub fn forget_python(&mut self, pid: u32) {
        self.python.remove(&mut self.ebpf, pid);
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        // Stop recording first; dropping the fields then detaches every link and unloads the programs.
        self.traced.stop(&mut self.ebpf);
        self.cuda.detach_all();
    }
}

/// The machine's half of decoding ([`Resolve`]): the sampler's symbols and the Python targets' memory.
struct Machine<'a> {
    sampler: Option<&'a mut stacks::Sampler>,
    python: &'a mut python::PySampling,
    /// llmprof's own pid: its samples (the sampler's start-up calibration) are not the targets'.
    self_pid: u32,
}

impl Resolve for Machine<'_> {
    fn native_stack(
        &mut self,
        rec: &llmprof_abi::CpuSampleEvent,
    ) -> Option<llmprof_trace::event::stacks::CpuSample> {
        if rec.hdr.pid == self.self_pid {
            return None;
        }
        Some(self.sampler.as_mut()?.symbolize(rec))
    }

    fn python_stack(
        &mut self,
        pid: u32,
        stack: &llmprof_abi::python::PyStack,
    ) -> Option<llmprof_trace::event::python::PyStackSample> {
        self.python.resolve(pid, stack)
    }
}
