//! The cuda family's user half: the CUDA driver uprobes (`profiler-ebpf/src/cuda.rs`) at libcuda's entry
//! points, which `crate::cuda::libcuda` resolves per process.
//!
//! Owns loading the programs, attaching them per process (the counting entry-only uprobe at the launch-type
//! calls, `llmprof_abi::cuda::COUNTED`, with `--cuda-calls counted`; else the timed entry + return pair),
//! telling the counting probe where libcuda's code is (`CUDA_TEXT`), reading and flushing its counts
//! (`CUDA_COUNTED`, `CUDA_COUNTS`), and detaching: for the budget, for a process whose launches the injected
//! CUPTI helper records, and at the end (in parallel, [`detach_parallel`]). The timed records are decoded by
//! `llmprof_trace::decode::cuda`. Never probes a call twice: a call CUPTI records is not probed in a process
//! the helper records.

use std::collections::HashSet;
use std::num::NonZeroU32;
use std::path::Path;

use aya::Ebpf;
use aya::maps::{HashMap, PerCpuArray};
use aya::programs::UProbe;
use aya::programs::uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLink, UProbeScope};
use llmprof_abi::cuda::{self, CudaCountState};
use llmprof_abi::{
    CUCOUNT_PROGRAM, CUDA_COUNTED_MAP, CUDA_COUNTS_MAP, CUDA_TEXT_MAP, CUENT_PROGRAM, CURET_PROGRAM,
};
use llmprof_trace::event::{Event, EventBody};

use super::error::CaptureError;
use super::object::{load_uprobe, program};

/// CUDA driver uprobe programs: at entry, at return (loaded on the first [`Cuda::attach`]).
pub const CUDA_PROGRAMS: (&str, &str) = (CUENT_PROGRAM, CURET_PROGRAM);
/// The entry-only uprobe that counts launch-type CUDA calls ([`llmprof_abi::cuda`]).
pub const CUDA_COUNT_PROGRAM: &str = CUCOUNT_PROGRAM;

/// The CUDA driver probes of a capture.
#[derive(Default)]
pub(super) struct Cuda {
    loaded: bool,
    /// Launch-type calls get the counting uprobe (`CaptureConfig::cuda_counted`).
    counted: bool,
    /// The budget detached the probes ([`Cuda::detach`]): none is attached again.
    detached: bool,
    /// The uprobe links, owned here so they can be detached in parallel.
    links: Vec<UProbeLink>,
    /// The links of the calls CUPTI also records (launch-type calls, counted or timed, and the synchronize
    /// calls), by process: detached when the injected helper records that process.
    count_links: Vec<(u32, UProbeLink)>,
    /// Processes whose launch-type, copy and synchronize calls come from the injected CUPTI helper: not probed.
    launches_from_cupti: HashSet<u32>,
}

impl Cuda {
    /// No probe attached yet; `counted`: launch-type calls get the counting uprobe.
    pub(super) fn new(counted: bool) -> Self {
        Cuda {
            counted,
            ..Cuda::default()
        }
    }

    /// Attaches the probes of `pid` at each `(file offset, cookie)` of the library `lib` (return probe first,
    /// so every entry seen has its return). Returns how many entry points were attached; entry points the
    /// kernel refuses are skipped (logged), and an error is returned only when none could be attached.
    pub(super) fn attach(
        &mut self,
        ebpf: &mut Ebpf,
        pid: u32,
        lib: &Path,
        points: &[(u64, u64)],
    ) -> Result<usize, CaptureError> {
        let (entry, ret) = CUDA_PROGRAMS;
        if self.detached {
            return Ok(0);
        }
        if !self.loaded {
            for prog in [ret, entry, CUDA_COUNT_PROGRAM] {
                load_uprobe(ebpf, prog)?;
            }
            self.loaded = true;
        }
        let Some(nz) = NonZeroU32::new(pid) else {
            return Err(CaptureError::PidNotFound(pid));
        };
        if self.counted {
            set_cuda_text(ebpf, pid, lib);
        }
        let mut attached = 0;
        let mut first_err = None;
        for &(offset, cookie) in points {
            let launch_type = cuda::counted_slot((cookie & 0xff) as u32).is_some();
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
            let counted = self.counted && launch_type;
            let progs: &[&str] = if counted {
                &[CUDA_COUNT_PROGRAM]
            } else {
                &[ret, entry]
            };
            let mut ok = true;
            for &prog in progs {
                let p: &mut UProbe = program(ebpf, prog)?;
                let point = UProbeAttachPoint {
                    location: UProbeAttachLocation::AbsoluteOffset(offset),
                    cookie: Some(cookie),
                };
                match p.attach(point, lib, UProbeScope::OneProcess(nz)) {
                    Ok(id) => match p.take_link(id) {
                        Ok(link) if cupti_records_it => self.count_links.push((pid, link)),
                        Ok(link) => self.links.push(link),
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

    /// The injected CUPTI helper records `pid`'s kernels, graph launches, copies and waits: its launch-type,
    /// copy and synchronize calls are no longer probed at all (their uprobes of `pid` go, counting or timed;
    /// none is attached later), so no call is paid for twice. Returns how many links went.
    pub(super) fn launches_from_cupti(&mut self, pid: u32) -> usize {
        self.launches_from_cupti.insert(pid);
        let (mine, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.count_links)
            .into_iter()
            .partition(|(p, _)| *p == pid);
        self.count_links = rest;
        let n = mine.len();
        detach_parallel(mine.into_iter().map(|(_, l)| l).collect());
        n
    }

    /// Detaches every probe and attaches none later (the `cuda_detached` budget step). Returns false when
    /// none was attached. Takes ~0.1 s per link (RCU grace periods), on parallel threads.
    pub(super) fn detach(&mut self) -> bool {
        self.detached = true;
        let links = self.take_links();
        let any = !links.is_empty();
        detach_parallel(links);
        any
    }

    /// Detaches every probe (the end of the capture).
    pub(super) fn detach_all(&mut self) {
        detach_parallel(std::mem::take(&mut self.links));
        detach_parallel(
            std::mem::take(&mut self.count_links)
                .into_iter()
                .map(|(_, l)| l)
                .collect(),
        );
    }

    fn take_links(&mut self) -> Vec<UProbeLink> {
        let mut links = std::mem::take(&mut self.links);
        links.extend(std::mem::take(&mut self.count_links).into_iter().map(|(_, l)| l));
        links
    }

    /// Uprobe links attached (entry and return, counting).
    pub(super) fn link_count(&self) -> usize {
        self.links.len() + self.count_links.len()
    }
}

/// Tells the counting probe where `pid`'s libcuda code is (`CUDA_TEXT`): a counted call returning into it
/// is nested in another driver call and not counted again. Without it (maps unreadable, map full) nested
/// calls count twice; logged.
fn set_cuda_text(ebpf: &mut Ebpf, pid: u32, lib: &Path) {
    // `lib` is the library's `/proc/PID/map_files/` entry, whose link names the file as the maps do, or
    // its path.
    let path = std::fs::read_link(lib).unwrap_or_else(|_| lib.to_owned());
    let range = crate::sys::maps::Maps::of(pid)
        .ok()
        .and_then(|maps| maps.exec_range(&path.to_string_lossy()));
    let Some((start, end)) = range else {
        log::debug!("capture: pid {pid}: libcuda's code range not found; nested counted calls count twice");
        return;
    };
    let set = ebpf
        .map_mut(CUDA_TEXT_MAP)
        .and_then(|m| HashMap::<_, u32, [u64; 2]>::try_from(m).ok())
        .map(|mut m| m.insert(pid, [start, end], 0));
    if !matches!(set, Some(Ok(()))) {
        log::debug!("capture: pid {pid}: {CUDA_TEXT_MAP} not set; nested counted calls count twice");
    }
}

/// CUDA calls counted by the entry-only uprobe so far (the rest of the `cuda` hits were timed).
pub(super) fn counted_calls(ebpf: &Ebpf) -> u64 {
    ebpf.map(CUDA_COUNTED_MAP)
        .and_then(|m| PerCpuArray::<_, u64>::try_from(m).ok())
        .and_then(|a| a.get(&0, 0).ok())
        .map(|v| v.iter().sum())
        .unwrap_or(0)
}

/// The counted CUDA calls still in the kernel's per-thread windows, as events (the end of a session: a
/// thread's last window is otherwise written only at its next call), but those of `self_pid`. Clears them.
pub(super) fn flush_counts(ebpf: &mut Ebpf, self_pid: u32, out: &mut Vec<Event>) {
    let Some(mut m) = ebpf
        .map_mut(CUDA_COUNTS_MAP)
        .and_then(|m| HashMap::<_, u32, CudaCountState>::try_from(m).ok())
    else {
        return;
    };
    let left: Vec<(u32, CudaCountState)> = m.iter().filter_map(Result::ok).collect();
    for (tid, st) in left {
        let _ = m.remove(&tid);
        if st.first_ns == 0 || st.pid == self_pid {
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

/// Threads that detach the CUDA uprobe links. Each detach waits for RCU grace periods in the kernel (~0.1 s
/// per link on a busy 6.18 VM, much of it serialized by the kernel's trace-event lock); threads recover a
/// part of it (32 links: 4.5 s one by one, 3 to 3.5 s here).
const DETACH_THREADS: usize = 16;

/// Drops `links` (detaching them) on up to [`DETACH_THREADS`] threads and waits for all.
fn detach_parallel(mut links: Vec<UProbeLink>) {
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
