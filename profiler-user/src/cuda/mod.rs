//! The CUDA driver probes (family `cuda`), user side: which processes' libcuda is watched, and the resolution
//! of the driver's entry points the uprobes go on.
//!
//! Owns: [`CudaWatch`], which `attach` runs next to the capture: the watch for libcuda in each process of the
//! session ([`libcuda`]) that attaches the CUDA driver uprobes through [`Capture::attach_cuda`] as soon as the
//! library is mapped (at start, or on a later tick when the process loads CUDA lazily, as PyTorch does). What it
//! cannot do it says once: one marker for the trace and one line for the attach summary ([`CudaState`]). The
//! uprobes themselves are the capture's; the per-step aggregation of the calls (`llmprof_trace::perfetto::sink::cuda::agg`) runs
//! in the Perfetto sink, a pure consumer of the event stream.

pub mod libcuda;
pub mod procaddr;

use std::collections::BTreeSet;
use std::path::PathBuf;

use crate::capture::Capture;
use crate::causes;
use llmprof_trace::names;

/// How the CUDA driver calls are probed (`--cuda-calls`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum CudaCalls {
    /// Launches and asynchronous copies counted in the kernel (entry-only uprobe; per thread, per engine
    /// step or 10 ms window); the calls that block the host timed one by one.
    #[default]
    Counted,
    /// Every call timed (entry + return uprobe pair).
    All,
}

/// Where the CUDA driver probes stand.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CudaState {
    /// `--no-cuda`.
    Disabled,
    /// libcuda is not mapped in the target (yet): watched every tick.
    Waiting,
    /// Attached to `functions` entry points of `lib` (summed over the processes of a tree).
    Attached {
        /// The library.
        lib: PathBuf,
        /// Entry points attached.
        functions: usize,
    },
    /// Attaching failed (the reason); not retried.
    Failed(String),
}

/// The libcuda watch of one session.
#[derive(Debug)]
pub struct CudaWatch {
    /// The first target (the `libcuda not loaded` marker).
    pid: u32,
    /// Processes whose libcuda is watched (the targets, and the processes of a tree as they appear).
    watched: BTreeSet<u32>,
    /// Processes whose libcuda was found (attached or refused): not watched again.
    done: BTreeSet<u32>,
    state: CudaState,
}

impl CudaWatch {
    /// Watches `pid` (the first target) when `enabled` (off: `--no-cuda`).
    pub fn new(enabled: bool, pid: u32) -> Self {
        Self {
            pid,
            watched: BTreeSet::from([pid]),
            done: BTreeSet::new(),
            state: if enabled {
                CudaState::Waiting
            } else {
                CudaState::Disabled
            },
        }
    }

    /// Watches `pid`'s libcuda too (a process of the traced tree, or another target).
    pub fn watch_process(&mut self, pid: u32) {
        if self.state != CudaState::Disabled && !self.done.contains(&pid) {
            self.watched.insert(pid);
        }
    }

    /// Stops watching `pid` (it exited).
    pub fn forget_process(&mut self, pid: u32) {
        self.watched.remove(&pid);
    }

    /// The processes of the session the watch looks at (watched or found), none when it is off.
    pub fn processes(&self) -> Vec<u32> {
        if self.state == CudaState::Disabled {
            return Vec::new();
        }
        self.watched.iter().chain(&self.done).copied().collect()
    }

    /// Attaches the CUDA driver probes of each watched process once libcuda is mapped in it. Call it at start
    /// (`first`) and every tick; it returns the markers to put on the timeline, `(pid, text)`: that libcuda is
    /// not loaded in the first target (once, at start), that the probes of a process are attached, or why they
    /// could not be.
    pub fn attach(&mut self, capture: &mut Capture, first: bool) -> Vec<(u32, String)> {
        if self.state == CudaState::Disabled {
            return Vec::new();
        }
        let mut out = Vec::new();
        for pid in self.watched.clone() {
            let Some(lib) = libcuda::find_in_process(pid) else {
                if first && pid == self.pid {
                    out.push((pid, names::marker::libcuda_not_loaded(pid)));
                }
                continue;
            };
            self.watched.remove(&pid);
            self.done.insert(pid);
            let result = libcuda::resolve(&lib)
                .map_err(|e| causes::one_line(&e))
                .and_then(|entries| {
                    let points: Vec<(u64, u64)> =
                        entries.iter().map(|e| (e.file_offset, e.cookie())).collect();
                    let via_proc = entries
                        .iter()
                        .filter(|e| e.variant == llmprof_abi::CudaVariant::ProcAddress)
                        .count();
                    capture
                        .attach_cuda(pid, &lib.probe_path, &points)
                        .map(|n| (n, via_proc))
                        .map_err(|e| causes::one_line(&e))
                });
            let text = match result {
                Ok((n, via_proc)) => {
                    let text =
                        names::marker::cuda_probes_attached(n, &lib.path.display().to_string(), via_proc);
                    self.state = match &self.state {
                        CudaState::Attached { lib, functions } => CudaState::Attached {
                            lib: lib.clone(),
                            functions: functions + n,
                        },
                        _ => CudaState::Attached {
                            lib: lib.path,
                            functions: n,
                        },
                    };
                    text
                }
                Err(e) => {
                    let text = names::marker::cuda_probes_failed(&e);
                    if !matches!(self.state, CudaState::Attached { .. }) {
                        self.state = CudaState::Failed(e);
                    }
                    text
                }
            };
            out.push((pid, text));
        }
        out
    }

    /// Where the probes stand.
    pub fn state(&self) -> &CudaState {
        &self.state
    }
}
