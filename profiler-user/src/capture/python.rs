//! Python stack sampling in a capture: finds the CPython targets, fills the walker's maps (`PY_PROCS`,
//! `PY_THREADS`), attaches `llmprof_pysample` to a software CPU clock on every CPU, keeps the thread map
//! fresh, and resolves the kernel's walks for the decoder (`llmprof_trace::decode::python`).
//!
//! Owns the Python half of capture; the kernel walker is `profiler-ebpf/src/python.rs`, the reading of the
//! target's memory `crate::python`. A target that is not Python is skipped silently; one whose Python
//! cannot be read (unsupported version) is reported once through [`PySampling::problems`].

use std::collections::{HashMap as StdHashMap, HashSet};
use std::time::{Duration, Instant};

use aya::Ebpf;
use aya::maps::HashMap;
use aya::programs::PerfEvent;
use aya::programs::perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent};
use llmprof_abi::python::{PyOffsets, PyStack};
use llmprof_abi::{PY_PROCS_MAP, PY_THREADS_MAP, PYSAMPLE_PROGRAM};
use llmprof_trace::event::python::PyStackSample;

use super::error::CaptureError;
use super::object::{map_err, map_mut, program};
use crate::python::{PyProcess, PythonError};

/// The perf_event program.
pub const PROGRAM: &str = PYSAMPLE_PROGRAM;
/// Default sampling frequency, Hz (as `bpftrace profile:hz:99`: off the 100 Hz timer tick's phase).
pub const DEFAULT_HZ: u64 = 99;
/// How often the thread → thread-state map is refreshed: a thread started since is sampled without Python
/// frames (status `no_thread`) until then.
pub const REFRESH_INTERVAL: Duration = Duration::from_millis(200);

/// The Python targets of a capture.
#[derive(Debug, Default)]
pub struct PySampling {
    /// Sampling frequency, Hz (0: off).
    hz: u64,
    /// `llmprof_pysample` is attached.
    attached: bool,
    /// The native stack sampler runs and writes the Python stacks of its samples (`python::emit` in its
    /// program): `llmprof_pysample` is then never attached.
    native_sampler: bool,
    procs: StdHashMap<u32, PyProcess>,
    /// Threads currently in `PY_THREADS`, per process.
    threads: StdHashMap<u32, HashSet<u32>>,
    problems: Vec<String>,
    last_refresh: Option<Instant>,
}

impl PySampling {
    /// Discovers the Python targets among `pids` ([`PySampling::add`] each). `hz` = 0: sampling off. With
    /// `native_sampler`, the native stack sampler's samples carry the Python stacks (same instant, one timer)
    /// and this module only keeps the maps; otherwise it attaches its own sampler at `hz`.
    pub fn start(ebpf: &mut Ebpf, pids: &[u32], hz: u64, native_sampler: bool) -> Result<Self, CaptureError> {
        let mut s = Self {
            hz,
            native_sampler,
            ..Self::default()
        };
        for &pid in pids {
            s.add(ebpf, pid)?;
        }
        Ok(s)
    }

    /// Starts sampling `pid` if it runs a supported CPython (a process found after the start, e.g. a forked
    /// worker, goes through here too): writes its offsets and threads, and attaches the sampler on every CPU
    /// at the first Python process. Returns whether it is sampled; a non-Python process is skipped, an
    /// unreadable Python (unsupported version, ...) is added to [`PySampling::problems`].
    pub fn add(&mut self, ebpf: &mut Ebpf, pid: u32) -> Result<bool, CaptureError> {
        if self.hz == 0 || self.procs.contains_key(&pid) {
            return Ok(false);
        }
        let p = match PyProcess::discover(pid) {
            Ok(p) => p,
            Err(PythonError::NotPython(_)) => return Ok(false),
            Err(e) => {
                self.problems.push(crate::causes::one_line(&e));
                return Ok(false);
            }
        };
        log::debug!("python: pid {pid} runs CPython {}.{}", p.version.0, p.version.1);
        {
            let mut m: HashMap<_, u32, PyOffsets> = map_mut(ebpf, PY_PROCS_MAP)?;
            m.insert(pid, p.walker_offsets(), 0)
                .map_err(map_err(PY_PROCS_MAP))?;
        }
        self.procs.insert(pid, p);
        self.refresh(ebpf);
        if !self.attached && !self.native_sampler {
            self.attach(ebpf)?;
        }
        Ok(true)
    }

    /// Stops sampling `pid` (it exited): its entries leave the maps and its resolved code objects are freed.
    pub fn remove(&mut self, ebpf: &mut Ebpf, pid: u32) {
        if self.procs.remove(&pid).is_none() {
            return;
        }
        if let Some(map) = ebpf.map_mut(PY_PROCS_MAP)
            && let Ok(mut m) = HashMap::<_, u32, PyOffsets>::try_from(map)
        {
            let _ = m.remove(&pid);
        }
        let tids = self.threads.remove(&pid).unwrap_or_default();
        if let Some(map) = ebpf.map_mut(PY_THREADS_MAP)
            && let Ok(mut m) = HashMap::<_, u32, u64>::try_from(map)
        {
            for tid in tids {
                let _ = m.remove(&tid);
            }
        }
    }

    /// Loads `llmprof_pysample` and attaches it to a software CPU clock at `hz` on every online CPU.
    fn attach(&mut self, ebpf: &mut Ebpf) -> Result<(), CaptureError> {
        let p: &mut PerfEvent = program(ebpf, PROGRAM)?;
        let perr = |source| CaptureError::Program {
            program: PROGRAM.to_string(),
            source,
        };
        p.load().map_err(perr)?;
        let cpus = aya::util::online_cpus().map_err(|(_, e)| CaptureError::Poll(e))?;
        for cpu in cpus {
            p.attach(
                PerfEventConfig::Software(SoftwareEvent::CpuClock),
                PerfEventScope::AllProcessesOneCpu { cpu },
                SamplePolicy::Frequency(self.hz),
                false,
            )
            .map_err(perr)?;
        }
        self.attached = true;
        Ok(())
    }

    /// Why some targets' Python frames cannot be read, one message each.
    pub fn problems(&self) -> &[String] {
        &self.problems
    }

    /// Python targets being sampled: `(pid, (3, minor))`.
    pub fn targets(&self) -> Vec<(u32, (u32, u32))> {
        self.procs.iter().map(|(pid, p)| (*pid, p.version)).collect()
    }

    /// Rewrites `PY_THREADS` from the interpreters' thread lists, at most every [`REFRESH_INTERVAL`].
    pub fn maybe_refresh(&mut self, ebpf: &mut Ebpf) {
        if self.procs.is_empty() || self.last_refresh.is_some_and(|t| t.elapsed() < REFRESH_INTERVAL) {
            return;
        }
        self.refresh(ebpf);
    }

    fn refresh(&mut self, ebpf: &mut Ebpf) {
        self.last_refresh = Some(Instant::now());
        let Some(map) = ebpf.map_mut(PY_THREADS_MAP) else {
            return;
        };
        let Ok(mut m) = HashMap::<_, u32, u64>::try_from(map) else {
            return;
        };
        for (pid, p) in self.procs.iter_mut() {
            let now = match p.threads() {
                Ok(t) => t,
                Err(e) => {
                    log::debug!("python: {}", crate::causes::one_line(&e));
                    continue;
                }
            };
            let known = self.threads.entry(*pid).or_default();
            let live: HashSet<u32> = now.iter().map(|(tid, _)| *tid).collect();
            for tid in known.difference(&live) {
                let _ = m.remove(tid);
            }
            for (tid, tstate) in &now {
                if m.insert(*tid, *tstate, 0).is_err() {
                    log::debug!("python: PY_THREADS is full");
                }
            }
            *known = live;
        }
    }

    /// Resolves a kernel walk of process `pid`; None when `pid` is not a sampled Python process.
    pub fn resolve(&mut self, pid: u32, stack: &PyStack) -> Option<PyStackSample> {
        Some(self.procs.get_mut(&pid)?.resolve(stack))
    }
}
