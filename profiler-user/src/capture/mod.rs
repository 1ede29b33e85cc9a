//! Capture: loads llmprof's eBPF programs, attaches them to the traced processes and hands what they record
//! to the decoder ([`llmprof_trace::decode`]), which turns it into the [`llmprof_trace::event`] stream.
//!
//! Owns everything that touches the kernel (and nothing else: sinks consume the events). The programs are
//! the committed object `profiler-user/ebpf/llmprof-ebpf.o`, built from `profiler-ebpf/` by
//! `cargo xtask build-ebpf` and embedded here, so llmprof builds with stable Rust alone.
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
mod calibrate_http;
pub mod cupti;
pub mod elf;
pub mod patterns;
pub mod python;
mod rounds;
pub mod sched;
pub mod stacks;
mod traced;
pub mod wire;

use std::collections::{HashMap as StdHashMap, HashSet};
use std::num::NonZeroU32;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use aya::maps::{Array, HashMap, MapData, PerCpuArray, RingBuf};
use aya::programs::raw_trace_point::RawTracePointLinkId;
use aya::programs::uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLinkId, UProbeScope};
use aya::programs::{RawTracePoint, TracePoint, UProbe};
use aya::{Ebpf, EbpfLoader};
use llmprof_abi::cudacount;
use llmprof_abi::{
    ABI_VERSION, Config, ENGINE_PROBES, FilePattern, Knob, NUM_KNOBS, NUM_PROBES, PROBE_CONTENT,
    ProbeCounters, SockKey, SyscallKey, SyscallStats, TRACED_CHILDREN, TRACED_SELF,
};

pub use calibrate::Calibration;
pub use llmprof_trace::decode::egress::{Cidr, CidrError};
pub use patterns::{DEFAULT_MODEL_PATTERNS, PatternError};

use llmprof_trace::decode::{Decoded, Decoder, Resolve};
use llmprof_trace::event::{Event, EventBody, SyscallAggregate};

/// The eBPF object, built by `cargo xtask build-ebpf` (checked in CI by `build-ebpf --check`).
static EBPF_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("CARGO_MANIFEST_DIR"), "/ebpf/llmprof-ebpf.o"));

/// How often [`Capture::poll`] looks at the ring when the kernel does not wake it (the programs submit
/// with `BPF_RB_NO_WAKEUP`): 20 ms keeps a 16 MiB ring far from full at a million events/s.
pub const POLL_INTERVAL: Duration = Duration::from_millis(20);
/// Default slow-syscall threshold (`--slow-syscall`), as documented in the CLI.
pub const DEFAULT_SLOW_SYSCALL: Duration = Duration::from_millis(1);
/// Default ring size. The kernel maps a ring's pages twice into llmprof (for records that wrap around), all
/// resident from the start: 16 MiB is 32 MiB of llmprof's RSS, and 0.5–1 s of events at the highest rates
/// measured (docs/performance.md, Capture).
pub const DEFAULT_RING_BYTES: usize = 16 << 20;
/// Ring size of the deep GPU mode (`--gpu-kernels all`): every CUPTI record in 16 KiB chunks.
pub const DEEP_RING_BYTES: usize = 64 << 20;
/// Most records one [`Capture::poll`] decodes before returning, so a full ring cannot stall the caller.
const MAX_RECORDS_PER_POLL: usize = 1 << 16;
/// Where tracefs lives on current kernels; mounted by [`Capture::start`] when missing.
pub const TRACEFS: &str = "/sys/kernel/tracing";

/// Tracepoints the programs need: (category, name, program). The `raw_syscalls` pair is attached as raw
/// tracepoints (`BPF_PROG_TYPE_RAW_TRACEPOINT`: the program gets the tracepoint's own arguments, `pt_regs`
/// and the number or return value, without the perf record a classic tracepoint program builds first, which
/// cost more than the programs themselves; see docs/performance.md).
/// `task_newtask` and `sched_process_exec` feed process trees (`profiler-ebpf/src/proc.rs`): they are attached
/// for every session (a process traced without `--no-children` costs them one map lookup per fork/exec).
pub const TRACEPOINTS: [(&str, &str, &str); 5] = [
    ("raw_syscalls", "sys_enter", "llmprof_sysent"),
    ("raw_syscalls", "sys_exit", "llmprof_sysexit"),
    ("sched", "sched_process_exit", "llmprof_pexit"),
    ("task", "task_newtask", "llmprof_fork"),
    ("sched", "sched_process_exec", "llmprof_exec"),
];
/// The syscall numbers whose exit the raw_syscalls programs decode (owned by `llmprof_abi::syscalls`, which
/// the eBPF programs test against too).
pub use llmprof_abi::syscalls::DECODED_SYSCALLS;
/// Uprobe programs, in [`ENGINE_PROBES`] order.
const UPROBES: [&str; 3] = ["llmprof_step", "llmprof_request", "llmprof_range"];
/// CUDA driver uprobe programs: at entry, at return (loaded on the first [`Capture::attach_cuda`]).
pub const CUDA_PROGRAMS: (&str, &str) = ("llmprof_cuent", "llmprof_curet");
/// The entry-only uprobe that counts launch-type CUDA calls ([`llmprof_abi::cudacount`]).
pub const CUDA_COUNT_PROGRAM: &str = "llmprof_cucount";
/// Every program name of the object (all start with `llmprof_`, which a kernel listing shows).
pub const PROGRAM_NAMES: [&str; 22] = [
    "llmprof_tnew",
    "llmprof_sswitch",
    "llmprof_swaking",
    "llmprof_swnew",
    "llmprof_sysent",
    "llmprof_sysexit",
    "llmprof_pexit",
    "llmprof_fork",
    "llmprof_exec",
    "llmprof_step",
    "llmprof_request",
    "llmprof_range",
    "llmprof_content",
    "llmprof_cuent",
    "llmprof_curet",
    CUDA_COUNT_PROGRAM,
    "llmprof_pysample",
    stacks::SAMPLE_PROGRAM,
    cupti::HANDOFF_PROGRAM,
    wire::ARRIVAL_TRACEPOINTS[0].2,
    wire::ARRIVAL_TRACEPOINTS[1].2,
    wire::ARRIVAL_TRACEPOINTS[2].2,
];
/// The content uprobe program (attached only with [`CaptureConfig::capture_content`]).
const CONTENT_UPROBE: &str = "llmprof_content";

/// What to capture.
#[derive(Clone, Debug)]
pub struct CaptureConfig {
    /// Processes (tgids) to trace.
    pub pids: Vec<u32>,
    /// Trace the processes they start too, from their first instruction (the kernel adds them to the
    /// traced set at fork: process trees). Off: only `pids` (`--no-children`).
    pub follow_children: bool,
    /// Syscalls at least this long are recorded individually.
    pub slow_syscall: Duration,
    /// Model-file patterns (`*.gguf`, `/models/*`); see [`patterns`].
    pub model_patterns: Vec<String>,
    /// Connects outside these networks are flagged.
    pub egress_allow: Vec<Cidr>,
    /// Ring-buffer size in bytes (rounded up to a power of two, at least one page).
    pub ring_bytes: usize,
    /// Attach the engine's content probe: prompt and completion text leave the engine (opt-in).
    pub capture_content: bool,
    /// Time two cheap syscalls before any program is attached (~2 ms): the untraced reference a later
    /// [`calibrate::run`] measures the probes' cost against ([`Capture::untraced`]).
    pub measure_untraced: bool,
    /// Launch-type CUDA calls ([`llmprof_abi::cudacount::COUNTED`]) get the entry-only counting uprobe
    /// instead of the timed entry + return pair (`--cuda-calls counted`, the default; off: `--cuda-calls all`).
    pub cuda_counted: bool,
    /// Python stack samples of CPython 3.10–3.13 targets, Hz (0: off; [`python::DEFAULT_HZ`]).
    pub python_hz: u64,
    /// Which listening ports the HTTP wire probe follows ([`http`]).
    pub http: wire::HttpPorts,
    /// Record thread states (sched_switch / sched_waking of the traced threads, [`sched`]).
    pub thread_states: bool,
    /// On-CPU stack samples per second and CPU (`--sample-rate`); 0: no sampling (the default here;
    /// `llmprof attach` passes 99).
    pub sample_hz: u64,
    /// Threads with a tid below this keep their syscall slot in the kernel's tid-indexed array, the others
    /// in a hash ([`llmprof_abi::SYSCALL_SLOTS`], the default, is the most; lower it only to exercise the
    /// hash, as `tests/syscall_exact.rs` does).
    pub syscall_slot_tids: u32,
}

impl Default for CaptureConfig {
    fn default() -> Self {
        Self {
            pids: Vec::new(),
            follow_children: false,
            slow_syscall: DEFAULT_SLOW_SYSCALL,
            model_patterns: DEFAULT_MODEL_PATTERNS.iter().map(|s| s.to_string()).collect(),
            egress_allow: Cidr::default_allow(),
            ring_bytes: DEFAULT_RING_BYTES,
            capture_content: false,
            measure_untraced: false,
            cuda_counted: true,
            python_hz: python::DEFAULT_HZ,
            http: wire::HttpPorts::All,
            thread_states: true,
            sample_hz: 0,
            syscall_slot_tids: llmprof_abi::SYSCALL_SLOTS,
        }
    }
}

/// Whether a target's engine probes are live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EngineProbes {
    /// The uprobes are attached.
    Attached {
        /// The engine's probe ABI version.
        abi_version: u32,
    },
    /// The binary does not export the probe ABI (not an llmprof-instrumented engine).
    NotFound,
    /// The binary's probe ABI differs from this llmprof's.
    AbiMismatch {
        /// The engine's version.
        found: u32,
        /// This llmprof's version.
        expected: u32,
    },
}

/// Why capture could not start or continue. Messages say what to do next.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// Loading eBPF programs needs root (or CAP_BPF + CAP_PERFMON).
    #[error("llmprof needs root to load eBPF programs: run it with sudo (or grant CAP_BPF and CAP_PERFMON)")]
    NotRoot,
    /// No such process.
    #[error("no process with pid {0}: check the pid (e.g. `pgrep llmserve`)")]
    PidNotFound(u32),
    /// The kernel lacks a tracepoint the programs need.
    #[error(
        "this kernel has no tracepoint {category}:{name} (looked in {TRACEFS}/events): llmprof needs a kernel with tracepoints and tracefs"
    )]
    MissingTracepoint {
        /// Tracepoint category, e.g. `raw_syscalls`.
        category: String,
        /// Tracepoint name, e.g. `sys_enter`.
        name: String,
    },
    /// tracefs is not mounted and could not be mounted.
    #[error(
        "tracefs is not mounted at {TRACEFS} and mounting it failed: run `mount -t tracefs nodev {TRACEFS}`"
    )]
    Tracefs(#[source] std::io::Error),
    /// The wire probe's start-up calibration could not make its socket pairs.
    #[error("the wire probe's calibration could not create a socket pair")]
    CalibrationSocket(#[source] std::io::Error),
    /// The engine speaks another probe ABI version.
    #[error(
        "the engine (pid {pid}) uses llmprof probe ABI {found}, this llmprof speaks {expected}: use the llmprof built with that engine version"
    )]
    AbiMismatch {
        /// The traced process.
        pid: u32,
        /// The engine's version.
        found: u32,
        /// This llmprof's version.
        expected: u32,
    },
    /// A `--model-path` pattern is not supported.
    #[error(transparent)]
    Pattern(#[from] PatternError),
    /// The target's binary could not be inspected.
    #[error(transparent)]
    Elf(#[from] crate::sys::elf::ElfError),
    /// The kernel refused to load the programs (the verifier log is in the source chain).
    #[error(
        "the kernel refused llmprof's eBPF programs (see the verifier log below); please report it with `uname -r`"
    )]
    Load(#[source] aya::EbpfError),
    /// A program could not be loaded or attached.
    #[error("could not load or attach eBPF program {program}")]
    Program {
        /// The program's name.
        program: String,
        /// aya's error (includes the verifier log for load failures).
        #[source]
        source: aya::programs::ProgramError,
    },
    /// A map was missing or could not be read or written.
    #[error("eBPF map {map} cannot be used")]
    Map {
        /// The map's name.
        map: String,
        /// aya's error.
        #[source]
        source: aya::maps::MapError,
    },
    /// The GPU helper library's handoff function cannot be probed.
    #[error(transparent)]
    GpuHandoff(#[from] cupti::HandoffError),
    /// The object lacks a program or map this llmprof expects (object and source out of sync).
    #[error("the embedded eBPF object has no {0}: rebuild it with `cargo xtask build-ebpf`")]
    MissingInObject(String),
    /// Polling the ring buffer failed.
    #[error("polling the ring buffer failed")]
    Poll(#[source] std::io::Error),
}

/// A running capture: programs loaded and attached until dropped.
pub struct Capture {
    ring: RingBuf<MapData>,
    // Declared after `ring` so maps and programs outlive the ring reader; dropping them detaches
    // every link and closes every fd, which unloads the programs.
    ebpf: Ebpf,
    logger: Option<aya_log::EbpfLogger<&'static dyn log::Log>>,
    decoder: Decoder,
    engine: StdHashMap<u32, EngineProbes>,
    /// The images whose engine probes are attached, by (pid, device, inode of the executable).
    engine_images: HashSet<(u32, u64, u64)>,
    /// What each executable exports, by (device, inode): a tree that starts the same program many times
    /// (workers, shells) has its ELF read once.
    image_probes: StdHashMap<(u64, u64), EngineProbes>,
    /// The engine uprobe programs are loaded (at start when a target or a later child may need them).
    engine_loaded: bool,
    /// `CaptureConfig::capture_content`.
    capture_content: bool,
    /// The budget detached the range probes: new engines get none.
    ranges_detached: bool,
    /// `TRACED` flags of the targets (`TRACED_SELF`, plus `TRACED_CHILDREN` for trees).
    traced_flags: u8,
    /// Thread states are recorded (the thread map is kept).
    thread_states: bool,
    pids: Vec<u32>,
    attach_latency: Duration,
    cuda_loaded: bool,
    /// [`CaptureConfig::cuda_counted`].
    cuda_counted: bool,
    /// The budget detached the CUDA probes ([`Capture::detach_cuda`]): none is attached again.
    cuda_detached: bool,
    /// The CUDA driver uprobe links, owned here so [`Drop`] can detach them in parallel.
    cuda_links: Vec<aya::programs::uprobe::UProbeLink>,
    /// The links of the calls CUPTI also records (launch-type calls, counted or timed, and the synchronize
    /// calls), by process: detached when the injected helper records that process.
    cuda_count_links: Vec<(u32, aya::programs::uprobe::UProbeLink)>,
    /// Processes whose launch-type, copy and synchronize calls come from the injected CUPTI helper: not probed.
    launches_from_cupti: HashSet<u32>,
    /// The untraced syscall references ([`CaptureConfig::measure_untraced`]).
    untraced: Option<calibrate::Untraced>,
    /// raw_syscalls attachments (enter, exit), detachable by [`Capture::detach_syscalls`].
    syscall_links: Vec<(&'static str, RawTracePointLinkId)>,
    /// Range uprobe attachments, detachable by [`Capture::detach_ranges`].
    range_links: Vec<UProbeLinkId>,
    /// Python stack sampling of the Python targets.
    python: python::PySampling,
    /// Requests rebuilt from the HTTP wire probe's records.
    wire: llmprof_trace::wire::Reconstructor,
    /// Which ports the wire probe follows.
    http_ports: wire::HttpPorts,
    /// Ports followed so far, per traced process.
    http_followed: StdHashMap<u32, Vec<u16>>,
    /// Last id given to a connection seeded from /proc (counts down from `u64::MAX`).
    http_seeded: u64,
    /// Processes that joined the session after the start (process trees): their sockets are followed too.
    joined: std::collections::BTreeSet<u32>,
    /// The stack sampler, when sampling ([`CaptureConfig::sample_hz`]).
    sampler: Option<stacks::Sampler>,
    /// llmprof's own pid (its calibration samples are dropped).
    self_pid: u32,
    /// On-CPU samples of the targets decoded so far (the live sampler cost's denominator).
    samples_decoded: u64,
    /// Off-CPU stacks of the targets decoded (charged at their own cost by the self-accounting).
    offcpu_decoded: u64,
    /// Stack samples of the last drain, not handed out yet (see [`Capture::drain`]).
    held: Vec<Event>,
    /// The GPU activity handoff probe.
    gpu: cupti::GpuCapture,
}

impl std::fmt::Debug for Capture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Capture")
            .field("pids", &self.pids)
            .field("engine", &self.engine)
            .finish()
    }
}

/// Inspects the binary of `pid` without attaching: whether its engine probes could be attached.
pub fn inspect_engine(pid: u32) -> Result<EngineProbes, CaptureError> {
    let exe = exe_of(pid)?;
    let elf = elf::inspect(&exe)?;
    Ok(match elf.abi_version {
        None => EngineProbes::NotFound,
        Some(_) if !elf.probes.iter().all(|p| *p) => EngineProbes::NotFound,
        Some(v) if v != ABI_VERSION => EngineProbes::AbiMismatch {
            found: v,
            expected: ABI_VERSION,
        },
        Some(v) => EngineProbes::Attached { abi_version: v },
    })
}

fn exe_of(pid: u32) -> Result<PathBuf, CaptureError> {
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    if pid == 0 || !proc_dir.join("exe").exists() {
        return Err(CaptureError::PidNotFound(pid));
    }
    Ok(proc_dir.join("exe"))
}

/// Loads the embedded eBPF object: maps created (the ring at `ring_bytes`), nothing loaded into the kernel's
/// verifier yet.
fn load_object(config: &Config, ring_bytes: usize) -> Result<Ebpf, CaptureError> {
    EbpfLoader::new()
        .override_global("LLMPROF_CONFIG", config, true)
        .map_max_entries("EVENTS", ring_size(ring_bytes))
        .load(EBPF_OBJECT)
        .map_err(CaptureError::Load)
}

/// Takes the record ring out of a loaded object.
fn take_ring(ebpf: &mut Ebpf) -> Result<RingBuf<aya::maps::MapData>, CaptureError> {
    let ring_map = ebpf
        .take_map("EVENTS")
        .ok_or_else(|| CaptureError::MissingInObject("map EVENTS".into()))?;
    RingBuf::try_from(ring_map).map_err(map_err("EVENTS"))
}

/// Loads and attaches `tps` (of [`TRACEPOINTS`]), the `raw_syscalls` pair as raw tracepoints; returns those
/// links (detachable by the budget).
fn attach_syscall_tracepoints(
    ebpf: &mut Ebpf,
    tps: &[(&'static str, &'static str, &'static str)],
) -> Result<Vec<(&'static str, RawTracePointLinkId)>, CaptureError> {
    let mut syscall_links = Vec::new();
    for &(category, name, prog) in tps {
        let perr = |source| CaptureError::Program {
            program: prog.to_string(),
            source,
        };
        let t = Instant::now();
        let loaded;
        if category == "raw_syscalls" {
            let p: &mut RawTracePoint = program(ebpf, prog)?;
            p.load().map_err(perr)?;
            loaded = t.elapsed();
            syscall_links.push((prog, p.attach(name).map_err(perr)?));
        } else {
            let p: &mut TracePoint = program(ebpf, prog)?;
            p.load().map_err(perr)?;
            loaded = t.elapsed();
            p.attach(category, name).map_err(perr)?;
        }
        log::debug!(
            "capture: {prog}: verified in {loaded:?}, attached in {:?}",
            t.elapsed() - loaded
        );
    }
    Ok(syscall_links)
}

/// Loads and attaches classic tracepoint programs, `(category, name, program)` each, in order.
pub(crate) fn attach_tracepoints(ebpf: &mut Ebpf, tps: &[(&str, &str, &str)]) -> Result<(), CaptureError> {
    for &(category, name, prog) in tps {
        let perr = |source| CaptureError::Program {
            program: prog.to_string(),
            source,
        };
        let p: &mut TracePoint = program(ebpf, prog)?;
        p.load().map_err(perr)?;
        p.attach(category, name).map_err(perr)?;
    }
    Ok(())
}

/// The tracefs directory of tracepoint `category:name` (it exists when the kernel has the tracepoint).
pub fn tracepoint_dir(category: &str, name: &str) -> std::path::PathBuf {
    Path::new(TRACEFS).join("events").join(category).join(name)
}

/// Mounts tracefs at [`TRACEFS`] unless its `events` directory is already there (needs root).
pub fn ensure_tracefs() -> Result<(), CaptureError> {
    let events = Path::new(TRACEFS).join("events");
    if events.is_dir() {
        return Ok(());
    }
    let c = |s: &str| std::ffi::CString::new(s).map_err(|e| CaptureError::Tracefs(e.into()));
    let (src, target, fstype) = (c("nodev")?, c(TRACEFS)?, c("tracefs")?);
    // SAFETY: all pointers are valid NUL-terminated strings for the duration of the call; data is null.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(CaptureError::Tracefs(std::io::Error::last_os_error()));
    }
    Ok(())
}

fn ring_size(bytes: usize) -> u32 {
    // Page size on x86-64; the kernel wants a power-of-two multiple of it.
    const PAGE: usize = 4096;
    let n = bytes.clamp(PAGE, 1 << 30).next_power_of_two();
    u32::try_from(n).unwrap_or(1 << 30)
}

fn map_err(map: &str) -> impl FnOnce(aya::maps::MapError) -> CaptureError + '_ {
    move |source| CaptureError::Map {
        map: map.to_string(),
        source,
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
        let mut engine = StdHashMap::new();
        for (i, &pid) in cfg.pids.iter().enumerate() {
            // The first pid is the user's target; with trees, the others may be descendants that exited since
            // they were found, or run a program that cannot be inspected: they are traced without engine probes.
            let tolerant = i > 0 && cfg.follow_children;
            let probes = match inspect_engine(pid) {
                Ok(p) => p,
                Err(e) if tolerant => {
                    log::debug!("capture: pid {pid} not inspected: {e}");
                    continue;
                }
                Err(e) => return Err(e),
            };
            if let EngineProbes::AbiMismatch { found, expected } = probes {
                if tolerant {
                    log::warn!(
                        "pid {pid} uses llmprof probe ABI {found}, this llmprof speaks {expected}: no engine probes"
                    );
                    continue;
                }
                return Err(CaptureError::AbiMismatch { pid, found, expected });
            }
            engine.insert(pid, probes);
        }
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
        let mut ebpf = load_object(&config, cfg.ring_bytes)?;
        log::debug!("capture: object loaded (maps created) at {:?}", t0.elapsed());
        let logger = match aya_log::EbpfLogger::init(&mut ebpf) {
            Ok(l) => Some(l),
            Err(e) => {
                log::debug!("eBPF logs unavailable: {e}");
                None
            }
        };

        // Targets enter TRACED last, once every program is attached.
        fill_patterns(&mut ebpf, &patterns)?;
        // The untraced syscall reference is taken before any tracepoint is attached: an attached
        // raw_syscalls program slows every syscall of every process (the slow entry path, the filter),
        // and that is part of what a target pays.
        let untraced = cfg
            .measure_untraced
            .then(|| calibrate::Untraced::measure(calibrate::STARTUP_CALLS_PER_ROUND));
        let mut range_links = Vec::new();
        // Before the exit program runs: it hands followed connections' reads and writes to these.
        if cfg.http != wire::HttpPorts::Off {
            wire::load_decoders(&mut ebpf)?;
        }
        let syscall_links = attach_syscall_tracepoints(&mut ebpf, &TRACEPOINTS)?;

        // Off-CPU stacks wait until the sampler is attached.
        write_knob(&mut ebpf, Knob::OffCpuStacksOff, 1)?;
        if cfg.thread_states {
            sched::attach(&mut ebpf)?;
        }
        if cfg.http != wire::HttpPorts::Off
            && let Err(why) = wire::attach_arrivals(&mut ebpf, &cfg.http)?
        {
            log::warn!("wire probe: {why}: requests start when the server reads them, not when they arrive");
        }
        log::debug!("capture: tracepoints verified and attached at {:?}", t0.elapsed());
        let sampler = match cfg.sample_hz {
            0 => None,
            hz => Some(stacks::Sampler::attach(&mut ebpf, hz)?),
        };
        let want_uprobes = engine
            .values()
            .any(|e| matches!(e, EngineProbes::Attached { .. }));
        // A tree may gain an engine later: its programs are loaded (and calibrated) up front.
        let engine_loaded = want_uprobes || cfg.follow_children;
        if engine_loaded {
            load_engine_programs(&mut ebpf, cfg.capture_content)?;
        }
        let mut engine_images = HashSet::new();
        for (&pid, probes) in engine.iter_mut() {
            if !matches!(probes, EngineProbes::Attached { .. }) {
                continue;
            }
            let attached = image_of(pid).and_then(|image| {
                let links = attach_engine_programs(&mut ebpf, pid, cfg.capture_content, true)?;
                Ok((image, links))
            });
            match attached {
                Ok((image, links)) => {
                    range_links.extend(links);
                    engine_images.insert((pid, image.0, image.1));
                }
                Err(e) if cfg.follow_children && cfg.pids.first() != Some(&pid) => {
                    log::debug!("capture: engine probes of pid {pid}: {e}");
                    *probes = EngineProbes::NotFound;
                }
                Err(e) => return Err(e),
            }
        }

        let ring = take_ring(&mut ebpf)?;
        if sampler.is_some() {
            write_knob(&mut ebpf, Knob::OffCpuStacksOff, 0)?;
        }
        let traced_flags = TRACED_SELF | if cfg.follow_children { TRACED_CHILDREN } else { 0 };
        // Before the processes are traced: with every port followed, any accepted connection is probed by its
        // first bytes in the kernel (workers that get their socket after attach included).
        write_knob(
            &mut ebpf,
            Knob::HttpAcceptAll,
            u64::from(cfg.http == wire::HttpPorts::All),
        )?;
        // The kernel refuses llmprof's own process; a capture asked to trace it (`llmprof doctor` timing its own
        // probes) lifts that for this instance. `attach` never asks (`--pid` of llmprof is refused).
        if cfg.pids.contains(&std::process::id()) {
            write_knob(&mut ebpf, Knob::SelfTraced, 1)?;
        }
        fill_traced(&mut ebpf, &cfg.pids, traced_flags)?;
        // After TRACED: from here on task_newtask adds new threads, so the listing misses none.
        if cfg.thread_states {
            let n = sched::fill_threads(&mut ebpf, &cfg.pids)?;
            log::debug!("capture: {n} threads in the thread-state map");
        }
        let python = python::PySampling::start(&mut ebpf, &cfg.pids, cfg.python_hz, sampler.is_some())?;
        log::debug!("capture: all probes live at {:?}", t0.elapsed());
        let mut cap = Capture {
            ring,
            ebpf,
            logger,
            decoder: Decoder::new(cfg.egress_allow.clone()),
            engine,
            engine_images,
            image_probes: StdHashMap::new(),
            engine_loaded,
            capture_content: cfg.capture_content,
            ranges_detached: false,
            traced_flags,
            thread_states: cfg.thread_states,
            pids: cfg.pids.clone(),
            attach_latency: t0.elapsed(),
            cuda_loaded: false,
            cuda_counted: cfg.cuda_counted,
            cuda_detached: false,
            cuda_links: Vec::new(),
            cuda_count_links: Vec::new(),
            launches_from_cupti: HashSet::new(),
            untraced,
            syscall_links,
            range_links,
            python,
            wire: llmprof_trace::wire::Reconstructor::with_own(wire::own_conns()),
            http_ports: cfg.http.clone(),
            http_followed: StdHashMap::new(),
            http_seeded: u64::MAX,
            joined: std::collections::BTreeSet::new(),
            sampler,
            self_pid: std::process::id(),
            samples_decoded: 0,
            offcpu_decoded: 0,
            held: Vec::new(),
            gpu: cupti::GpuCapture::default(),
        };
        cap.refresh_http()?;
        Ok(cap)
    }

    /// A process joined the session after the start (a process of the tree): its listening sockets are
    /// followed from the next [`Capture::refresh_http`].
    pub fn process_joined(&mut self, pid: u32) {
        self.joined.insert(pid);
    }

    /// A process left the session.
    pub fn process_left(&mut self, pid: u32) {
        self.joined.remove(&pid);
        self.http_followed.remove(&pid);
    }

    /// Finds the traced processes' listening sockets (and connections established on them) and has the wire
    /// probe follow them; call again to pick up sockets opened later (and processes that joined). Returns the
    /// ports followed per process.
    pub fn refresh_http(&mut self) -> Result<&StdHashMap<u32, Vec<u16>>, CaptureError> {
        let pids: Vec<u32> = self.pids.iter().chain(&self.joined).copied().collect();
        for pid in pids {
            let socks = wire::discover(pid, &self.http_ports);
            if socks.listening.is_empty() {
                continue;
            }
            let ports = wire::fill(
                &mut self.ebpf,
                pid,
                &socks,
                &self.http_ports,
                &mut self.http_seeded,
            )?;
            let known = self.http_followed.entry(pid).or_default();
            if *known != ports {
                log::info!("wire probe: following HTTP on port(s) {ports:?} of pid {pid}");
                *known = ports;
            }
        }
        Ok(&self.http_followed)
    }

    /// What the wire reconstruction saw so far.
    pub fn wire_stats(&self) -> llmprof_trace::wire::WireStats {
        self.wire.stats
    }

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
        let (entry, ret) = CUDA_PROGRAMS;
        if self.cuda_detached {
            return Ok(0);
        }
        if !self.cuda_loaded {
            for prog in [ret, entry, CUDA_COUNT_PROGRAM] {
                let p: &mut UProbe = program(&mut self.ebpf, prog)?;
                // The start-up calibration may have loaded it already.
                if p.fd().is_ok() {
                    continue;
                }
                p.load().map_err(|source| CaptureError::Program {
                    program: prog.to_string(),
                    source,
                })?;
            }
            self.cuda_loaded = true;
        }
        let Some(nz) = NonZeroU32::new(pid) else {
            return Err(CaptureError::PidNotFound(pid));
        };
        if self.cuda_counted {
            self.set_cuda_text(pid, lib);
        }
        let mut attached = 0;
        let mut first_err = None;
        for &(offset, cookie) in points {
            let launch_type = cudacount::counted_slot((cookie & 0xff) as u32).is_some();
            // CUPTI records copies and waits as well as launches (their GPU spans; the host's wait shows in the
            // thread's state and off-CPU stack).
            let copy_or_sync = llmprof_abi::CudaFunc::from_raw((cookie & 0xff) as u32).is_some_and(|f| {
                matches!(
                    f.class(),
                    llmprof_abi::CudaClass::Sync | llmprof_abi::CudaClass::Memcpy
                )
            });
            let cupti_records_it = launch_type || copy_or_sync;
            if cupti_records_it && self.launches_from_cupti.contains(&pid) {
                continue;
            }
            let counted = self.cuda_counted && launch_type;
            let progs: &[&str] = if counted {
                &[CUDA_COUNT_PROGRAM]
            } else {
                &[ret, entry]
            };
            let mut ok = true;
            for &prog in progs {
                let p: &mut UProbe = program(&mut self.ebpf, prog)?;
                let point = UProbeAttachPoint {
                    location: UProbeAttachLocation::AbsoluteOffset(offset),
                    cookie: Some(cookie),
                };
                match p.attach(point, lib, UProbeScope::OneProcess(nz)) {
                    Ok(id) => match p.take_link(id) {
                        Ok(link) if cupti_records_it => self.cuda_count_links.push((pid, link)),
                        Ok(link) => self.cuda_links.push(link),
                        Err(_) => {}
                    },
                    Err(source) => {
                        log::debug!("capture: {prog} at {offset:#x} of {}: {source}", lib.display());
                        first_err.get_or_insert(CaptureError::Program {
                            program: format!("{prog} at offset {offset:#x} of {}", lib.display()),
                            source,
                        });
                        ok = false;
                        break;
                    }
                }
            }
            attached += usize::from(ok);
        }
        match first_err {
            Some(e) if attached == 0 => Err(e),
            _ => Ok(attached),
        }
    }

    /// Tells the counting probe where `pid`'s libcuda code is (`CUDA_TEXT`): a counted call returning into it
    /// is nested in another driver call and not counted again. Without it (maps unreadable, map full) nested
    /// calls count twice; logged.
    fn set_cuda_text(&mut self, pid: u32, lib: &Path) {
        // `lib` is the library's `/proc/PID/map_files/` entry, whose link names the file as the maps do, or
        // its path.
        let path = std::fs::read_link(lib).unwrap_or_else(|_| lib.to_owned());
        let range = crate::sys::maps::Maps::of(pid)
            .ok()
            .and_then(|maps| maps.exec_range(&path.to_string_lossy()));
        let Some((start, end)) = range else {
            log::debug!(
                "capture: pid {pid}: libcuda's code range not found; nested counted calls count twice"
            );
            return;
        };
        let set = self
            .ebpf
            .map_mut("CUDA_TEXT")
            .and_then(|m| HashMap::<_, u32, [u64; 2]>::try_from(m).ok())
            .map(|mut m| m.insert(pid, [start, end], 0));
        if !matches!(set, Some(Ok(()))) {
            log::debug!("capture: pid {pid}: CUDA_TEXT not set; nested counted calls count twice");
        }
    }

    /// The injected CUPTI helper records `pid`'s kernels, graph launches, copies and waits: its launch-type,
    /// copy and synchronize calls are no longer probed at all (their uprobes of `pid` go, counting or timed; none is
    /// attached later), so no call is paid for twice. Returns how many links went.
    pub fn cuda_launches_from_cupti(&mut self, pid: u32) -> usize {
        self.launches_from_cupti.insert(pid);
        let (mine, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.cuda_count_links)
            .into_iter()
            .partition(|(p, _)| *p == pid);
        self.cuda_count_links = rest;
        let n = mine.len();
        detach_parallel(mine.into_iter().map(|(_, l)| l).collect());
        n
    }

    /// CUDA calls counted by the entry-only uprobe so far (the rest of the `cuda` hits were timed).
    pub fn cuda_counted_calls(&self) -> u64 {
        self.ebpf
            .map("CUDA_COUNTED")
            .and_then(|m| PerCpuArray::<_, u64>::try_from(m).ok())
            .and_then(|a| a.get(&0, 0).ok())
            .map(|v| v.iter().sum())
            .unwrap_or(0)
    }

    /// The counted CUDA calls still in the kernel's per-thread windows, as events (the end of a session:
    /// a thread's last window is otherwise written only at its next call). Clears them.
    pub fn flush_cuda_counts(&mut self, out: &mut Vec<Event>) {
        let Some(mut m) = self
            .ebpf
            .map_mut("CUDA_COUNTS")
            .and_then(|m| HashMap::<_, u32, cudacount::CudaCountState>::try_from(m).ok())
        else {
            return;
        };
        let left: Vec<(u32, cudacount::CudaCountState)> = m.iter().filter_map(Result::ok).collect();
        for (tid, st) in left {
            let _ = m.remove(&tid);
            if st.first_ns == 0 || st.pid == self.self_pid {
                continue;
            }
            out.push(Event {
                ts_ns: st.first_ns,
                pid: st.pid,
                tid,
                body: EventBody::CudaCount {
                    last_ns: st.last_ns,
                    calls: st.calls,
                    bytes: st.bytes,
                },
            });
        }
    }

    /// Whether the engine probes of `pid` are attached (NotFound for pids not traced).
    pub fn engine_probes(&self, pid: u32) -> EngineProbes {
        self.engine.get(&pid).cloned().unwrap_or(EngineProbes::NotFound)
    }

    /// The engine probes of the first process whose probes were attached during the capture (at start or
    /// later, in a process of the tree), if any.
    pub fn any_engine(&self) -> Option<EngineProbes> {
        let mut pids: Vec<&u32> = self.engine.keys().collect();
        pids.sort_unstable();
        pids.into_iter()
            .filter_map(|p| self.engine.get(p))
            .find(|e| matches!(e, EngineProbes::Attached { .. }))
            .cloned()
    }

    /// Puts processes found after the start in the traced set (with the targets' flags: a tree follows
    /// their children too). The kernel adds the children of traced processes by itself; this is for what
    /// it cannot see, e.g. a child forked between the /proc walk and the start.
    pub fn trace_pids(&mut self, pids: &[u32]) -> Result<(), CaptureError> {
        fill_traced(&mut self.ebpf, pids, self.traced_flags)?;
        // Their threads that exist now (later ones come from task_newtask).
        if self.thread_states {
            sched::fill_threads(&mut self.ebpf, pids)?;
        }
        Ok(())
    }

    /// Attaches the engine probes to `pid`'s current image when its binary exports the probe ABI (a process
    /// of the tree that started or executed an engine); nothing when they are attached to that image
    /// already. What `pid` exports now.
    pub fn attach_engine(&mut self, pid: u32) -> Result<EngineProbes, CaptureError> {
        let image = image_of(pid)?;
        let probes = match self.image_probes.get(&image) {
            Some(p) => p.clone(),
            None => {
                let p = inspect_engine(pid)?;
                self.image_probes.insert(image, p.clone());
                p
            }
        };
        if matches!(probes, EngineProbes::Attached { .. })
            && !self.engine_images.contains(&(pid, image.0, image.1))
        {
            if !self.engine_loaded {
                load_engine_programs(&mut self.ebpf, self.capture_content)?;
                self.engine_loaded = true;
            }
            let links =
                attach_engine_programs(&mut self.ebpf, pid, self.capture_content, !self.ranges_detached)?;
            self.range_links.extend(links);
            self.engine_images.insert((pid, image.0, image.1));
        }
        self.engine.insert(pid, probes.clone());
        Ok(probes)
    }

    /// Attaches the engine probes to the helper library at `lib` (a path llmprof can open: the target's
    /// mapping of it, `/proc/PID/map_files/…`) in `pid`: a library that exports the probe ABI, as the
    /// Python-hooks helper does. `pid`'s engine probes are then those of the library.
    pub fn attach_engine_library(&mut self, pid: u32, lib: &Path) -> Result<EngineProbes, CaptureError> {
        let probes = match elf::inspect(lib)? {
            i if i.abi_version.is_none() || !i.probes.iter().all(|p| *p) => EngineProbes::NotFound,
            i if i.abi_version != Some(ABI_VERSION) => EngineProbes::AbiMismatch {
                found: i.abi_version.unwrap_or(0),
                expected: ABI_VERSION,
            },
            _ => EngineProbes::Attached {
                abi_version: ABI_VERSION,
            },
        };
        if matches!(probes, EngineProbes::Attached { .. }) {
            if !self.engine_loaded {
                load_engine_programs(&mut self.ebpf, self.capture_content)?;
                self.engine_loaded = true;
            }
            let links = attach_engine_programs_at(
                &mut self.ebpf,
                pid,
                lib,
                self.capture_content,
                !self.ranges_detached,
            )?;
            self.range_links.extend(links);
        }
        self.engine.insert(pid, probes.clone());
        Ok(probes)
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

    fn drain(&mut self, out: &mut Vec<Event>) -> usize {
        self.python.maybe_refresh(&mut self.ebpf);
        // Stack samples wait one drain in `held` before they are handed out: the kernel submits a sample's
        // native record before its Python stack, and a drain (or the batch bound) can fall between the two.
        let mut carried = std::mem::take(&mut self.held);
        let mut n = 0;
        while n < MAX_RECORDS_PER_POLL {
            let Some(item) = self.ring.next() else { break };
            let mut machine = Machine {
                sampler: self.sampler.as_mut(),
                python: &mut self.python,
                self_pid: self.self_pid,
            };
            match self.decoder.decode(&item, &mut machine) {
                Decoded::Stack(ev) => {
                    self.samples_decoded += u64::from(matches!(ev.body, EventBody::CpuSample(_)));
                    self.offcpu_decoded += u64::from(matches!(ev.body, EventBody::OffCpuStack(_)));
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
                        if let Some(s) = self.sampler.as_mut() {
                            s.forget(ev.pid);
                        }
                        self.gpu.forget(ev.pid);
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

    /// The stack sampler, when sampling.
    pub fn sampler(&self) -> Option<&stacks::Sampler> {
        self.sampler.as_ref()
    }

    /// Stops stack sampling (the budget's last sampling step): closes the perf events. Returns whether it
    /// was sampling.
    pub fn detach_sampler(&mut self) -> Result<bool, CaptureError> {
        write_knob(&mut self.ebpf, Knob::OffCpuStacksOff, 1)?;
        match self.sampler.as_mut() {
            Some(s) => s.detach(&mut self.ebpf),
            None => Ok(false),
        }
    }

    /// Records the decoder could not make sense of.
    pub fn decode_errors(&self) -> u64 {
        self.decoder.undecodable()
    }

    /// Per-probe counters summed over CPUs, indexed by `llmprof_abi::ProbeId`.
    pub fn counters(&self) -> [ProbeCounters; NUM_PROBES] {
        read_counters(&self.ebpf)
    }

    /// Off-CPU stacks the kernel's rate bound did not take (by design, not a loss); 0 without stack sampling.
    pub fn offcpu_not_taken(&self) -> u64 {
        if self.sampler.is_none() {
            return 0;
        }
        stacks::offcpu_not_taken(&self.ebpf)
    }

    /// Whether the engine uprobe programs are loaded (a target or a tree that may gain an engine).
    pub fn engine_programs_loaded(&self) -> bool {
        self.engine_loaded
    }

    /// The untraced syscall references taken before anything was attached (None unless
    /// [`CaptureConfig::measure_untraced`]); what [`calibrate::run`] measures against.
    pub fn untraced(&self) -> Option<calibrate::Untraced> {
        self.untraced
    }

    /// Starts measuring the sampler's cost on the targets ([`stacks::LiveCost`]); `None` when not sampling or
    /// the kernel's statistics are unavailable.
    pub fn live_sample_cost_start(&mut self) -> Option<stacks::LiveCost> {
        self.sampler.as_ref()?;
        stacks::live_start(&mut self.ebpf, self.samples_decoded)
    }

    /// Ends the measurement: ns per on-CPU sample of the targets (`None`: too few samples), and the wire
    /// probe's arrival stamps.
    pub fn live_sample_cost_finish(&mut self, c: stacks::LiveCost) -> stacks::LiveFigures {
        stacks::live_finish(&mut self.ebpf, c, self.samples_decoded)
    }

    /// Sets a runtime knob of the programs (takes effect on the next hit).
    pub fn set_knob(&mut self, knob: Knob, value: u64) -> Result<(), CaptureError> {
        write_knob(&mut self.ebpf, knob, value)
    }

    /// Detaches the raw_syscalls programs: syscall aggregates, slow syscalls, model-file I/O, connects and
    /// sent bytes stop (what was aggregated stays readable). Returns false when they were not attached.
    pub fn detach_syscalls(&mut self) -> Result<bool, CaptureError> {
        let links = std::mem::take(&mut self.syscall_links);
        let any = !links.is_empty();
        for (prog, link) in links {
            let p: &mut RawTracePoint = program(&mut self.ebpf, prog)?;
            p.detach(link).map_err(|source| CaptureError::Program {
                program: prog.to_string(),
                source,
            })?;
        }
        Ok(any)
    }

    /// Detaches the engine range uprobes (steps and requests stay). Returns false when none was attached.
    pub fn detach_ranges(&mut self) -> Result<bool, CaptureError> {
        self.ranges_detached = true;
        let links = std::mem::take(&mut self.range_links);
        let any = !links.is_empty();
        for link in links {
            let p: &mut UProbe = program(&mut self.ebpf, "llmprof_range")?;
            p.detach(link).map_err(|source| CaptureError::Program {
                program: "llmprof_range".to_owned(),
                source,
            })?;
        }
        Ok(any)
    }

    /// Detaches the CUDA driver uprobes and attaches none later (the `cuda_detached` budget step). Returns
    /// false when none was attached. Takes ~0.1 s per link (RCU grace periods), on parallel threads.
    pub fn detach_cuda(&mut self) -> Result<bool, CaptureError> {
        self.cuda_detached = true;
        let mut links = std::mem::take(&mut self.cuda_links);
        links.extend(
            std::mem::take(&mut self.cuda_count_links)
                .into_iter()
                .map(|(_, l)| l),
        );
        let any = !links.is_empty();
        detach_parallel(links);
        Ok(any)
    }

    /// Completed syscalls of the traced processes so far (sum of the in-kernel aggregates).
    pub fn syscall_total(&self) -> u64 {
        self.with_syscalls(|_, s| s.count).sum()
    }

    /// Completed syscalls of the traced processes so far whose number is one of [`DECODED_SYSCALLS`] (from
    /// the in-kernel aggregates: a call whose aggregate did not fit the map is counted by the `syscalls`
    /// counter only, i.e. charged as a plain call). Reads every key of the map but only the decoded
    /// numbers' values.
    pub fn syscalls_decoded(&self) -> u64 {
        let Some(m) = self
            .ebpf
            .map("SYSCALLS")
            .and_then(|m| HashMap::<_, SyscallKey, SyscallStats>::try_from(m).ok())
        else {
            return 0;
        };
        m.keys()
            .filter_map(Result::ok)
            .filter(|k| DECODED_SYSCALLS.contains(&k.nr))
            .filter_map(|k| m.get(&k, 0).ok())
            .map(|s| s.count)
            .sum()
    }

    /// The off-CPU stacks decoded so far (taken by the `sched_switch` program at a blocking switch).
    pub fn offcpu_stacks(&self) -> u64 {
        self.offcpu_decoded
    }

    /// The in-kernel syscall aggregates per (pid, tid, syscall).
    pub fn syscall_aggregates(&self) -> Vec<SyscallAggregate> {
        self.with_syscalls(|k, s| SyscallAggregate {
            pid: k.pid,
            tid: k.tid,
            nr: k.nr,
            count: s.count,
            total_ns: s.total_ns,
            hist: s.hist.to_vec(),
        })
        .collect()
    }

    fn with_syscalls<'a, T: 'a>(
        &'a self,
        f: impl Fn(&SyscallKey, &SyscallStats) -> T + 'a,
    ) -> impl Iterator<Item = T> + 'a {
        let map = self
            .ebpf
            .map("SYSCALLS")
            .and_then(|m| HashMap::<_, SyscallKey, SyscallStats>::try_from(m).ok());
        map.into_iter().flat_map(move |m| {
            let items: Vec<T> = m.iter().filter_map(Result::ok).map(|(k, s)| f(&k, &s)).collect();
            items
        })
    }

    /// Bytes sent on each socket the targets connected: (pid, fd, bytes).
    pub fn sent_bytes(&self) -> Vec<(u32, i32, u64)> {
        let Some(map) = self.ebpf.map("SENT") else {
            return Vec::new();
        };
        let Ok(m) = HashMap::<_, SockKey, u64>::try_from(map) else {
            return Vec::new();
        };
        m.iter()
            .filter_map(Result::ok)
            .map(|(k, v)| (k.pid, k.fd, v))
            .collect()
    }

    /// Kernel ids of the programs this capture loaded (to check they are gone after drop).
    pub fn program_ids(&self) -> Vec<u32> {
        self.ebpf
            .programs()
            .filter_map(|(_, p)| p.info().ok())
            .map(|i| i.id())
            .collect()
    }

    /// CUDA driver uprobe links attached (entry and return), which [`Drop`] detaches.
    pub fn cuda_links(&self) -> usize {
        self.cuda_links.len() + self.cuda_count_links.len()
    }

    /// Time from the start of [`Capture::start`] until every probe was live.
    pub fn attach_latency(&self) -> Duration {
        self.attach_latency
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        // Stop recording first; dropping the fields then detaches every link and unloads the programs.
        if let Some(map) = self.ebpf.map_mut("TRACED")
            && let Ok(mut traced) = HashMap::<_, u32, u8>::try_from(map)
        {
            // The targets and every process the kernel added for them (trees).
            let all: Vec<u32> = traced.keys().filter_map(Result::ok).collect();
            for pid in self.pids.iter().chain(&all) {
                let _ = traced.remove(pid);
            }
        }
        detach_parallel(std::mem::take(&mut self.cuda_links));
        detach_parallel(
            std::mem::take(&mut self.cuda_count_links)
                .into_iter()
                .map(|(_, l)| l)
                .collect(),
        );
    }
}

/// Threads that detach the CUDA uprobe links. Each detach waits for RCU grace periods in the kernel (~0.1 s
/// per link on a busy 6.18 VM, much of it serialized by the kernel's trace-event lock); threads recover a
/// part of it (32 links: 4.5 s one by one, 3 to 3.5 s here).
const DETACH_THREADS: usize = 16;

/// Drops `links` (detaching them) on up to [`DETACH_THREADS`] threads and waits for all.
fn detach_parallel(mut links: Vec<aya::programs::uprobe::UProbeLink>) {
    if links.is_empty() {
        return;
    }
    let per = links.len().div_ceil(DETACH_THREADS);
    std::thread::scope(|s| {
        while !links.is_empty() {
            let chunk: Vec<_> = links.drain(..per.min(links.len())).collect();
            s.spawn(move || drop(chunk));
        }
    });
}

fn program<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut T, CaptureError>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    let p = ebpf
        .program_mut(name)
        .ok_or_else(|| CaptureError::MissingInObject(format!("program {name}")))?;
    p.try_into().map_err(|source| CaptureError::Program {
        program: name.to_string(),
        source,
    })
}

/// The machine's half of decoding ([`Resolve`]): the sampler's symbols and the Python targets' memory.
struct Machine<'a> {
    sampler: Option<&'a mut stacks::Sampler>,
    python: &'a mut python::PySampling,
    /// llmprof's own pid: its samples (the sampler's start-up calibration) are not the targets'.
    self_pid: u32,
}

impl Resolve for Machine<'_> {
    fn native_stack(&mut self, rec: &llmprof_abi::CpuSampleEvent) -> Option<llmprof_trace::stack::CpuSample> {
        if rec.hdr.pid == self.self_pid {
            return None;
        }
        Some(self.sampler.as_mut()?.symbolize(rec))
    }

    fn python_stack(
        &mut self,
        pid: u32,
        stack: &llmprof_abi::python::PyStack,
    ) -> Option<llmprof_trace::pystack::PyStackSample> {
        self.python.resolve(pid, stack)
    }
}

/// Puts `pids` in the `TRACED` map with `flags`.
fn fill_traced(ebpf: &mut Ebpf, pids: &[u32], flags: u8) -> Result<(), CaptureError> {
    let map = ebpf
        .map_mut("TRACED")
        .ok_or_else(|| CaptureError::MissingInObject("map TRACED".into()))?;
    let mut traced = HashMap::<_, u32, u8>::try_from(map).map_err(map_err("TRACED"))?;
    for &pid in pids {
        traced.insert(pid, flags, 0).map_err(map_err("TRACED"))?;
    }
    Ok(())
}

fn fill_patterns(ebpf: &mut Ebpf, patterns: &[FilePattern]) -> Result<(), CaptureError> {
    let map = ebpf
        .map_mut("PATTERNS")
        .ok_or_else(|| CaptureError::MissingInObject("map PATTERNS".into()))?;
    let mut pats = Array::<_, FilePattern>::try_from(map).map_err(map_err("PATTERNS"))?;
    for (i, p) in patterns.iter().enumerate() {
        pats.set(i as u32, p, 0).map_err(map_err("PATTERNS"))?;
    }
    Ok(())
}

/// Loads the engine uprobe programs (and the content one when asked).
fn load_engine_programs(ebpf: &mut Ebpf, content: bool) -> Result<(), CaptureError> {
    let content = content.then_some(CONTENT_UPROBE);
    for prog in UPROBES.into_iter().chain(content) {
        let p: &mut UProbe = program(ebpf, prog)?;
        if p.fd().is_ok() {
            continue;
        }
        p.load().map_err(|source| CaptureError::Program {
            program: prog.to_string(),
            source,
        })?;
    }
    Ok(())
}

/// Attaches the (loaded) engine uprobes to `pid`'s executable; the range links (detachable by the budget).
fn attach_engine_programs(
    ebpf: &mut Ebpf,
    pid: u32,
    content: bool,
    ranges: bool,
) -> Result<Vec<UProbeLinkId>, CaptureError> {
    attach_engine_programs_at(ebpf, pid, &exe_of(pid)?, content, ranges)
}

/// Attaches the (loaded) engine uprobes to the file `image` (an executable or a library exporting the probe
/// functions) in `pid`; the range links.
fn attach_engine_programs_at(
    ebpf: &mut Ebpf,
    pid: u32,
    image: &Path,
    content: bool,
    ranges: bool,
) -> Result<Vec<UProbeLinkId>, CaptureError> {
    let Some(nz) = NonZeroU32::new(pid) else {
        return Err(CaptureError::PidNotFound(pid));
    };
    let content = content.then_some((&PROBE_CONTENT, CONTENT_UPROBE));
    let mut range_links = Vec::new();
    for (sym, prog) in ENGINE_PROBES.iter().zip(UPROBES).chain(content) {
        if prog == "llmprof_range" && !ranges {
            continue;
        }
        let p: &mut UProbe = program(ebpf, prog)?;
        let link = p
            .attach(*sym, image, UProbeScope::OneProcess(nz))
            .map_err(|source| CaptureError::Program {
                program: format!("{prog} at {sym} of pid {pid}"),
                source,
            })?;
        if prog == "llmprof_range" {
            range_links.push(link);
        }
    }
    Ok(range_links)
}

/// (device, inode) of `pid`'s executable: one image, whatever path it was started by.
fn image_of(pid: u32) -> Result<(u64, u64), CaptureError> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(exe_of(pid)?).map_err(|_| CaptureError::PidNotFound(pid))?;
    Ok((m.dev(), m.ino()))
}

/// Per-probe counters summed over CPUs, as the kernel holds them (no baseline subtracted).
fn read_counters(ebpf: &Ebpf) -> [ProbeCounters; NUM_PROBES] {
    let mut out = [ProbeCounters::default(); NUM_PROBES];
    let Some(map) = ebpf.map("COUNTERS") else {
        return out;
    };
    let Ok(arr) = PerCpuArray::<_, ProbeCounters>::try_from(map) else {
        return out;
    };
    for (i, slot) in out.iter_mut().enumerate() {
        let Ok(vals) = arr.get(&(i as u32), 0) else {
            continue;
        };
        for v in vals.iter() {
            slot.hits += v.hits;
            slot.emitted += v.emitted;
            slot.dropped += v.dropped;
        }
    }
    out
}

fn write_knob(ebpf: &mut Ebpf, knob: Knob, value: u64) -> Result<(), CaptureError> {
    let map = ebpf
        .map_mut("KNOBS")
        .ok_or_else(|| CaptureError::MissingInObject("map KNOBS".into()))?;
    let mut knobs = Array::<_, u64>::try_from(map).map_err(map_err("KNOBS"))?;
    debug_assert!((knob as usize) < NUM_KNOBS);
    knobs.set(knob as u32, value, 0).map_err(map_err("KNOBS"))
}
