//! The CUPTI helper (family `cupti`), user side: `--gpu-kernels`, loading llmprof's CUPTI helper library into
//! a running CUDA process with [`crate::inject`] and switching it on and off.
//!
//! Owns the decisions that are the helper's: where the helper is (next to the `llmprof` binary, or
//! `$LLMPROF_CUPTI_LIB`; either only when [`inject::trusted_path`] accepts it: the target loads that file, so
//! whoever could swap it would run code in the target), whether the target can take it (libcuda mapped), the
//! helper's functions (`GPU_START`, `GPU_STOP`, its counters `GPU_STATS`), and [`GpuKernels`], the helper in
//! each process of one session. Loading and calling are [`crate::inject`]'s.
//!
//! The sequence `attach` runs: [`inject`] (dlopen only; a helper already mapped by an earlier attach is
//! reused) → the capture's uprobe on the handoff → [`Injected::start`] → … → [`Injected::stop`] before the
//! uprobes go. It never touches the target when `--gpu-kernels off`.

use std::path::PathBuf;
use std::time::Duration;

use llmprof_abi::cupti::{GPU_HELPER_LIB, GPU_START, GPU_STATS, GPU_STOP, GpuHelperStats, GpuStartStatus};

use crate::inject::ptrace::LibcFns;
use crate::inject::{self, Arg, InjectError};
use crate::sys::maps::MappedFile;

/// Overrides where llmprof looks for the helper library (a path to the `.so`; used only when root owns it and
/// the directories above it, and nobody else may write any of them).
pub const HELPER_ENV: &str = "LLMPROF_CUPTI_LIB";
/// How long the target's `dlopen` of the helper, and `GPU_START` (which loads CUPTI), may take.
const LOAD_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a stop may take (a flush of the last buffers).
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// Name prefix of the helper's copies in a target's `/tmp` or `/dev/shm`.
const COPY_PREFIX: &str = "llmprof-cupti-";

/// `--gpu-kernels`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum KernelsMode {
    /// Inject when the target maps libcuda and the helper library is found (else say why and go on); the
    /// helper hands over summaries: per 100 ms window and kernel name count/total/min/max, the GPU's busy
    /// intervals, CUDA graph launches as a whole.
    #[default]
    Auto,
    /// As `auto`, or refuse the session.
    On,
    /// Every kernel, copy, memset and wait as its own slice, CUDA graphs node by node, with the launching
    /// calls (flows): the deep mode, more cost; or refuse the session.
    All,
    /// Never touch the target.
    Off,
}

impl KernelsMode {
    /// A failure to record refuses the session.
    pub fn strict(self) -> bool {
        matches!(self, Self::On | Self::All)
    }

    /// The flags `attach` passes to `GPU_START`: the deep mode every record and the driver/runtime calls
    /// that issued them (`GPU_FLAG_API_CALLS`: launch → kernel flows); the default summaries alone (CUPTI's
    /// API records were most of its cost: 195k in 12 s on an H200 llmserve, 3.6 M in 6 s on a PyTorch loop).
    pub fn start_flags(self) -> u64 {
        use llmprof_abi::cupti::{GPU_FLAG_API_CALLS, GPU_FLAG_EVERY_RECORD};
        match self {
            Self::All => GPU_FLAG_API_CALLS | GPU_FLAG_EVERY_RECORD,
            _ => 0,
        }
    }
}

/// Why the helper could not be loaded or called.
#[derive(Debug, thiserror::Error)]
pub enum CuptiError {
    #[error(
        "the CUPTI helper library {GPU_HELPER_LIB} is not next to llmprof (looked at {looked}); build it with \
         `cargo build -p llmprof-cupti` or set {HELPER_ENV}"
    )]
    HelperNotFound {
        /// The paths tried.
        looked: String,
    },
    /// The helper library could be swapped by someone other than root.
    #[error(
        "the CUPTI helper library {path} is not loaded into a target: {why} (the target would run whatever \
         is there; install it root-owned, not group/world-writable, in root-owned directories)"
    )]
    HelperUntrusted {
        /// The file.
        path: String,
        /// What is wrong.
        why: String,
    },
    /// libcuda is not mapped.
    #[error("pid {pid} has no CUDA driver library (libcuda.so) loaded: no GPU work to record")]
    NoLibcuda {
        /// The target.
        pid: u32,
    },
    /// The helper could not start recording (`--gpu-kernels on`).
    #[error("pid {pid}: {why}")]
    Refused {
        /// The target.
        pid: u32,
        /// What the helper answered.
        why: &'static str,
    },
    /// Loading the helper or calling it failed.
    #[error(transparent)]
    Inject(#[from] InjectError),
}

/// Where the helper library is: `$LLMPROF_CUPTI_LIB`, else next to the running `llmprof`, else in
/// `../lib/llmprof/` from it ([`inject::find_helper`]: root-owned, or the running llmprof's owner's).
pub fn find_helper() -> Result<PathBuf, CuptiError> {
    inject::find_helper(GPU_HELPER_LIB, HELPER_ENV).map_err(|e| match e {
        inject::HelperMissing::NotFound(looked) => CuptiError::HelperNotFound { looked },
        inject::HelperMissing::Untrusted { path, why } => CuptiError::HelperUntrusted { path, why },
    })
}

/// The helper library loaded in a target.
#[derive(Clone, Debug)]
pub struct Injected {
    /// The target.
    pub pid: u32,
    /// The library's path as the target sees it.
    pub target_path: String,
    /// The same file from llmprof's side, even once its copy was removed: `/proc/PID/map_files/START-END`
    /// (what a uprobe attaches to).
    pub host_path: PathBuf,
    /// It was already loaded (an earlier attach): not loaded again.
    pub reused: bool,
    libc: Option<LibcFns>,
    start_fn: u64,
    stop_fn: u64,
    stats: u64,
    /// Bytes of the helper's counters (their symbol's size, at most [`GpuHelperStats`]'s): a helper an earlier
    /// llmprof loaded has fewer; the rest read as 0.
    stats_len: usize,
}
impl Injected {
    /// The helper records summaries when asked to (a helper of the oldest chunk version, loaded by an earlier
    /// llmprof, records every kernel whatever the flags).
    pub fn summarizes(&self) -> bool {
        self.stats_len == 0 || self.stats_len >= core::mem::size_of::<GpuHelperStats>()
    }
}

/// Loads the helper into `pid` (dlopen in one of its threads), or finds it there from an earlier attach.
/// The checks come in the order a user can act on, and a target that is simply not a CUDA process (no
/// libcuda, statically linked) is told so before a missing helper is.
pub fn inject(pid: u32) -> Result<Injected, CuptiError> {
    let mapped = inject::loaded_files(pid)?;
    if let Some(m) = mapped.iter().find(|m| inject::basename(m) == GPU_HELPER_LIB) {
        return resolve(pid, m, true);
    }
    // Cheap checks first: most processes of a tree are not CUDA processes.
    if !inject::has_loader(&mapped) {
        return Err(InjectError::Static { pid }.into());
    }
    if !mapped
        .iter()
        .any(|m| inject::basename(m).starts_with(crate::cuda::libcuda::LIBCUDA_PREFIX))
    {
        return Err(CuptiError::NoLibcuda { pid });
    }
    let helper = find_helper()?;
    let loaded = inject::load(pid, &mapped, &helper, COPY_PREFIX, LOAD_TIMEOUT)?;
    let mut i = resolve(pid, &loaded.mapping, false)?;
    i.target_path = loaded.target_path;
    i.libc = Some(loaded.libc);
    Ok(i)
}

/// The helper already loaded in `pid` (by an earlier attach), if any; nothing is called in the target.
pub fn find_loaded(pid: u32) -> Result<Option<Injected>, CuptiError> {
    let mapped = inject::loaded_files(pid)?;
    mapped
        .iter()
        .find(|m| inject::basename(m) == GPU_HELPER_LIB)
        .map(|m| resolve(pid, m, true))
        .transpose()
}

fn resolve(pid: u32, m: &MappedFile, reused: bool) -> Result<Injected, CuptiError> {
    let names = [GPU_START, GPU_STOP, GPU_STATS];
    let f = inject::symbols_of(m, &names)?;
    let at = |i: usize| {
        f[i].ok_or_else(|| InjectError::Symbol {
            path: m.path.display().to_string(),
            symbol: names[i],
        })
    };
    let (stats, stats_len) = at(2)?;
    Ok(Injected {
        pid,
        target_path: m.path.display().to_string(),
        start_fn: at(0)?.0,
        stop_fn: at(1)?.0,
        stats,
        stats_len: stats_len.min(core::mem::size_of::<GpuHelperStats>() as u64) as usize,
        host_path: m.probe_path.clone(),
        reused,
        libc: None,
    })
}

impl Injected {
    /// The target's libc functions (found again for a helper an earlier attach loaded).
    fn libc(&self) -> Result<LibcFns, InjectError> {
        match self.libc {
            Some(l) => Ok(l),
            None => inject::libc_of(self.pid),
        }
    }

    /// Calls `GPU_START(flags)` in the target.
    pub fn start(&self, flags: u64) -> Result<Option<GpuStartStatus>, InjectError> {
        let v = inject::call(
            self.pid,
            self.libc()?,
            GPU_START,
            self.start_fn,
            &[],
            &[Arg::Val(flags)],
            LOAD_TIMEOUT,
        )?;
        Ok(GpuStartStatus::from_raw(v as u32))
    }

    /// Calls `GPU_STOP()` in the target (flush, disable, unsubscribe; the library stays).
    pub fn stop(&self) -> Result<(), InjectError> {
        inject::call(
            self.pid,
            self.libc()?,
            GPU_STOP,
            self.stop_fn,
            &[],
            &[],
            STOP_TIMEOUT,
        )
        .map(|_| ())
    }

    /// The helper's counters, read from the target's memory.
    pub fn stats(&self) -> Result<GpuHelperStats, InjectError> {
        use std::os::unix::fs::FileExt as _;
        let mut buf = [0u8; core::mem::size_of::<GpuHelperStats>()];
        let len = if self.stats_len == 0 {
            buf.len()
        } else {
            self.stats_len
        };
        std::fs::File::open(format!("/proc/{}/mem", self.pid))
            .and_then(|f| f.read_exact_at(&mut buf[..len], self.stats))
            .map_err(|_| InjectError::Exited {
                pid: self.pid,
                during: "the read of the helper's counters",
            })?;
        let w = |i: usize| u64::from_le_bytes(buf[i * 8..i * 8 + 8].try_into().unwrap_or_default());
        Ok(GpuHelperStats {
            chunks: w(0),
            records: w(1),
            names: w(2),
            dropped: w(3),
            buffers: w(4),
            starts: w(5),
            stops: w(6),
            active: w(7),
            cupti_records: w(8),
            helper_cpu_ns: w(9),
            cupti_thread_cpu_ns: w(10),
            flags: w(11),
            summaries: w(12),
            busy: w(13),
            graph_trace: w(14),
        })
    }
}

/// `--gpu-kernels` in one session: the helper injected into each process of the traced tree that uses CUDA
/// (the `--pid` process and its children at attach, and any process of the tree that loads libcuda later, e.g.
/// vLLM's engine core), and whether each records.
#[derive(Debug, Default)]
pub struct GpuKernels {
    mode: KernelsMode,
    /// The processes the helper is loaded in, and whether `GPU_START` succeeded there.
    procs: Vec<(Injected, bool)>,
    /// Processes already looked at (injected, refused, or without CUDA when looked at).
    tried: std::collections::HashSet<u32>,
    /// Per recording process: its helper's counters when this session started it (a helper reused from an
    /// earlier session counts from there).
    base: std::collections::HashMap<u32, GpuHelperStats>,
    /// What the processes stopped so far used during this session.
    stopped: crate::selfacct::CuptiCounters,
}

/// One line on stderr, ignoring a closed stderr.
fn say(msg: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "llmprof: GPU kernels: {msg}");
}

impl GpuKernels {
    /// Step 1 (before capture): loads the helper into each of `pids` that uses CUDA (`off`: nothing). `on`
    /// refuses with the reason when a process with libcuda cannot be injected or when none has libcuda; `auto`
    /// says it in one line (nothing for a process that simply does not use CUDA) and goes on.
    pub fn prepare(mode: KernelsMode, pids: &[u32]) -> Result<Self, CuptiError> {
        let mut k = Self {
            mode,
            procs: Vec::new(),
            tried: std::collections::HashSet::new(),
            base: std::collections::HashMap::new(),
            stopped: crate::selfacct::CuptiCounters::default(),
        };
        if mode == KernelsMode::Off {
            return Ok(k);
        }
        let mut no_cuda = None;
        for &pid in pids {
            // A process without libcuda yet is looked at again on later ticks ([`GpuKernels::adopt`]).
            let r = k.load(pid);
            if !matches!(r, Err(CuptiError::NoLibcuda { .. })) {
                k.tried.insert(pid);
            }
            match r {
                Ok(()) => {}
                Err(e @ (CuptiError::NoLibcuda { .. } | CuptiError::Inject(InjectError::Static { .. }))) => {
                    no_cuda.get_or_insert(e);
                }
                Err(e) if mode.strict() => return Err(e),
                Err(e) => say(&format!("not recorded in pid {pid}: {e}")),
            }
        }
        match no_cuda {
            Some(e) if mode.strict() && k.procs.is_empty() => Err(e),
            _ => Ok(k),
        }
    }

    /// Loads the helper into `pid` (dlopen only).
    fn load(&mut self, pid: u32) -> Result<(), CuptiError> {
        let t0 = std::time::Instant::now();
        let i = inject(pid)?;
        say(&format!(
            "{} {} in pid {pid} ({:.1} ms)",
            if i.reused { "reusing" } else { "loaded" },
            i.target_path,
            t0.elapsed().as_secs_f64() * 1e3
        ));
        self.procs.push((i, false));
        Ok(())
    }

    /// The helpers loaded and not started yet (the capture's handoff uprobe goes on each `host_path`, then
    /// [`GpuKernels::start`]).
    pub fn pending(&self) -> Vec<Injected> {
        self.procs
            .iter()
            .filter(|(_, s)| !s)
            .map(|(i, _)| i.clone())
            .collect()
    }

    /// A process of the tree seen on a later tick: when it has libcuda now and was not looked at with it, the
    /// helper is loaded into it (`auto` and `on`; a failure is said in one line, the session goes on). True
    /// when it was loaded: the caller attaches the handoff and calls [`GpuKernels::start`].
    pub fn adopt(&mut self, pid: u32) -> bool {
        if self.mode == KernelsMode::Off || self.tried.contains(&pid) {
            return false;
        }
        if crate::cuda::libcuda::find_in_process(pid).is_none() {
            // Looked at again on the next tick: CUDA may be initialised later (PyTorch does it lazily).
            return false;
        }
        self.tried.insert(pid);
        match self.load(pid) {
            Ok(()) => true,
            Err(CuptiError::NoLibcuda { .. } | CuptiError::Inject(InjectError::Static { .. })) => false,
            Err(e) => {
                say(&format!("not recorded in pid {pid}: {e}"));
                false
            }
        }
    }

    /// Step 2 (after `pid`'s handoff uprobe is live): `GPU_START` there. A subscriber already in the target is
    /// said in one line and the session goes on without its kernels; other refusals fail `on` sessions. True
    /// when the helper records.
    pub fn start(&mut self, pid: u32) -> Result<bool, CuptiError> {
        let mode = self.mode;
        let Some((inj, started)) = self.procs.iter_mut().find(|(i, _)| i.pid == pid) else {
            return Ok(false);
        };
        let t0 = std::time::Instant::now();
        let status = match inj.start(mode.start_flags()) {
            Ok(s) => s,
            Err(e) if mode.strict() => return Err(e.into()),
            Err(e) => {
                say(&format!("not recorded in pid {pid}: {e}"));
                return Ok(false);
            }
        };
        if matches!(
            status,
            Some(GpuStartStatus::Started | GpuStartStatus::AlreadyStarted)
        ) && let Ok(b) = inj.stats()
        {
            self.base.insert(pid, b);
        }
        let why = match status {
            Some(GpuStartStatus::Started) => {
                *started = true;
                say(&format!(
                    "recording {} in pid {pid} (started in {:.1} ms)",
                    if mode == KernelsMode::All {
                        "every kernel"
                    } else if inj.summarizes() {
                        "kernel summaries"
                    } else {
                        "every kernel (the helper an earlier llmprof loaded there does not summarize; \
                         restart the process for summaries)"
                    },
                    t0.elapsed().as_secs_f64() * 1e3
                ));
                return Ok(true);
            }
            Some(GpuStartStatus::AlreadyStarted) => {
                // An earlier session ended without stopping it: it records; this session stops it.
                *started = true;
                return Ok(true);
            }
            Some(GpuStartStatus::SubscriberTaken) => {
                say(&format!(
                    "CUPTI already has a subscriber in pid {pid} (Kineto, Nsight or another tool): going on without its kernels"
                ));
                return Ok(false);
            }
            Some(GpuStartStatus::NoCupti) => {
                "no CUPTI library (libcupti.so) found in or next to the target's CUDA libraries"
            }
            Some(GpuStartStatus::NoLibcuda) => "the target has no libcuda loaded",
            Some(GpuStartStatus::CuptiError) => "CUPTI refused to record (see the target's stderr)",
            None => "the helper answered an unknown status",
        };
        if mode.strict() {
            return Err(CuptiError::Refused { pid, why });
        }
        say(&format!("not recorded in pid {pid}: {why}"));
        Ok(false)
    }

    /// The end (before the uprobes go): `GPU_STOP` (flush, disable, unsubscribe) in every process that
    /// records, and the helpers' counters summed.
    pub fn stop(&mut self) -> Option<GpuHelperStats> {
        let mut total: Option<GpuHelperStats> = None;
        for (inj, started) in &mut self.procs {
            if !std::mem::take(started) {
                continue;
            }
            let t0 = std::time::Instant::now();
            if let Err(e) = inj.stop() {
                say(&format!("stopping the helper in pid {} failed: {e}", inj.pid));
            }
            let ms = t0.elapsed().as_secs_f64() * 1e3;
            let Ok(s) = inj.stats() else { continue };
            let used = since(&s, self.base.get(&inj.pid));
            self.stopped.records += used.records;
            self.stopped.thread_cpu_ns += used.thread_cpu_ns;
            say(&format!(
                "stopped in pid {} in {ms:.1} ms; the helper handed over {} chunks ({} records, {} names, {} dropped; {} summary rows, {} busy intervals, from {} CUPTI records; graph-level records {}) since it was loaded",
                inj.pid,
                s.chunks,
                s.records,
                s.names,
                s.dropped,
                s.summaries,
                s.busy,
                s.cupti_records,
                if s.graph_trace != 0 { "on" } else { "off" }
            ));
            let t = total.get_or_insert_with(GpuHelperStats::default);
            t.chunks += s.chunks;
            t.records += s.records;
            t.names += s.names;
            t.dropped += s.dropped;
            t.cupti_records += s.cupti_records;
            t.summaries += s.summaries;
            t.busy += s.busy;
            t.helper_cpu_ns += s.helper_cpu_ns;
            t.cupti_thread_cpu_ns += s.cupti_thread_cpu_ns;
            t.graph_trace |= s.graph_trace;
        }
        total
    }
}

/// What a helper used since `base` (its counters when this session started it).
fn since(now: &GpuHelperStats, base: Option<&GpuHelperStats>) -> crate::selfacct::CuptiCounters {
    let b = base.copied().unwrap_or_default();
    crate::selfacct::CuptiCounters {
        records: now.cupti_records.saturating_sub(b.cupti_records),
        thread_cpu_ns: now.cupti_thread_cpu_ns.saturating_sub(b.cupti_thread_cpu_ns),
    }
}

impl GpuKernels {
    /// What the helpers used during this session so far (the recording ones read from their targets'
    /// memory now, the stopped ones as they were at their stop), for the self-accounting
    /// ([`crate::selfacct::CuptiCost`]).
    pub fn counters(&self) -> crate::selfacct::CuptiCounters {
        let mut total = self.stopped;
        for (inj, started) in &self.procs {
            if !started {
                continue;
            }
            let Ok(s) = inj.stats() else { continue };
            let used = since(&s, self.base.get(&inj.pid));
            total.records += used.records;
            total.thread_cpu_ns += used.thread_cpu_ns;
        }
        total
    }
}

impl Drop for GpuKernels {
    /// A session that ends early (an error) still turns CUPTI off in the target.
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests panic with the error")]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_loaded_here_and_a_process_without_libcuda_is_told_so() {
        let pid = std::process::id();
        assert!(find_loaded(pid).unwrap().is_none());
        assert!(matches!(inject(pid), Err(CuptiError::NoLibcuda { .. })));
    }

    #[test]
    fn a_missing_helper_names_where_it_looked() {
        let err = CuptiError::HelperNotFound {
            looked: "/x/libllmprof_cupti.so".into(),
        };
        assert!(err.to_string().contains("cargo build -p llmprof-cupti"), "{err}");
    }
}
