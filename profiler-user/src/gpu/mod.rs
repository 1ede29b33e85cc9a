//! The GPU layer of a session: NVML counters and CUDA driver API calls of the target.
//!
//! Owns: [`GpuSession`], which `attach` starts next to the capture: the NVML sampler ([`nvml`]) feeding the
//! session's sampler queue, and the watch for libcuda in the target ([`libcuda`]) that attaches the CUDA
//! driver uprobes through [`Capture::attach_cuda`] as soon as the library is mapped (at start, or on a later
//! tick when the process loads CUDA lazily, as PyTorch does). What it cannot do it says once: one marker for
//! the trace and one line for the attach summary. The per-step aggregation of the calls (`llmprof_trace::cuda_agg`) runs in
//! the Perfetto sink, a pure consumer of the event stream.

pub mod inject;
pub mod libcuda;
pub mod nvml;
pub mod procaddr;
pub mod ptrace;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::mpsc::SyncSender;
use std::time::Duration;

use crate::capture::Capture;
use crate::causes;
use llmprof_trace::clock::boottime_ns;
use llmprof_trace::event::{Event, EventBody};
use llmprof_trace::names;

/// What the GPU layer should do.
#[derive(Clone, Debug)]
pub struct GpuOptions {
    /// NVML sampling period; `None` turns the GPU counters off.
    pub sample_interval: Option<Duration>,
    /// Attach the CUDA driver API uprobes.
    pub cuda: bool,
    /// How they are attached.
    pub cuda_calls: CudaCalls,
    /// `--gpu-kernels`: inject the CUPTI helper ([`inject`]).
    pub kernels: inject::KernelsMode,
}

impl Default for GpuOptions {
    fn default() -> Self {
        Self {
            sample_interval: Some(nvml::DEFAULT_INTERVAL),
            cuda: true,
            cuda_calls: CudaCalls::Counted,
            // Sessions started by `llmprof serve` never inject (the CLI's default is `auto`).
            kernels: inject::KernelsMode::Off,
        }
    }
}

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

/// The GPU side of one session.
#[derive(Debug)]
pub struct GpuSession {
    /// The first target (NVML's process, the `libcuda not loaded` marker).
    pid: u32,
    /// Processes whose libcuda is watched (the targets, and the processes of a tree as they appear).
    watched: BTreeSet<u32>,
    /// Processes whose libcuda was found (attached or refused): not watched again.
    done: BTreeSet<u32>,
    sampler: Option<nvml::NvmlSampler>,
    nvml_line: String,
    cuda: CudaState,
    interval: Option<Duration>,
}

/// What the GPU layer did, for the attach summary.
#[derive(Clone, Debug)]
pub struct GpuReport {
    /// One line on the GPU counters.
    pub counters: String,
    /// Where the CUDA driver probes stood at the end.
    pub cuda: CudaState,
    /// NVML samples dropped because the session queue was full.
    pub dropped: u64,
}

impl GpuSession {
    /// Starts the NVML sampler for `pid` (its samples go to `tx`) and returns the session with the markers
    /// to put on the timeline now (at most one: why there are no GPU counters). CUDA probes are attached by
    /// [`GpuSession::watch_cuda`].
    pub fn start(opts: &GpuOptions, pid: u32, tx: SyncSender<Event>) -> (Self, Vec<Event>) {
        let mut markers = Vec::new();
        let (sampler, nvml_line) = match opts.sample_interval {
            None => (None, "off (--gpu-sample-interval 0)".to_owned()),
            Some(interval) => match nvml::NvmlSampler::start(pid, interval, tx) {
                Ok(s) => {
                    let names: Vec<String> = s
                        .gpus()
                        .iter()
                        .map(|g| format!("GPU {} {}", g.index, g.name))
                        .collect();
                    let line = format!("{} every {} ms", names.join(", "), interval.as_millis());
                    (Some(s), line)
                }
                Err(e) => {
                    let e = causes::one_line(&e);
                    let text = names::marker::gpu_counters_unavailable(&e);
                    markers.push(marker(pid, text.clone()));
                    (None, format!("unavailable: {e}"))
                }
            },
        };
        let cuda = if opts.cuda {
            CudaState::Waiting
        } else {
            CudaState::Disabled
        };
        let s = Self {
            pid,
            watched: BTreeSet::from([pid]),
            done: BTreeSet::new(),
            sampler,
            nvml_line,
            cuda,
            interval: opts.sample_interval,
        };
        (s, markers)
    }

    /// UUID of the target's GPU when NVML knows it (for the OTel resource).
    pub fn gpu_uuid(&self) -> Option<String> {
        self.sampler.as_ref().and_then(|s| nvml::target_uuid(s.gpus()))
    }

    /// Watches `pid`'s libcuda too (a process of the traced tree, or another target).
    pub fn watch_process(&mut self, pid: u32) {
        if self.cuda != CudaState::Disabled && !self.done.contains(&pid) {
            self.watched.insert(pid);
        }
    }

    /// Stops watching `pid` (it exited).
    pub fn forget_process(&mut self, pid: u32) {
        self.watched.remove(&pid);
    }

    /// Attaches the CUDA driver probes of each watched process once libcuda is mapped in it. Call it at start
    /// (`first`) and every tick; it returns the markers to put on the timeline: that libcuda is not loaded in
    /// the first target (once, at start), that the probes of a process are attached, or why they could not be.
    pub fn watch_cuda(&mut self, capture: &mut Capture, first: bool) -> Vec<Event> {
        if self.cuda == CudaState::Disabled {
            return Vec::new();
        }
        let mut out = Vec::new();
        // A process that has llmprof's CUPTI helper loaded already (it loaded it itself, or an earlier session
        // injected it): its GPU activity handoff is probed too.
        for &pid in self.watched.iter().chain(&self.done) {
            let text = match capture.attach_loaded_helper(pid) {
                None => continue,
                Some(Ok(lib)) => names::gpu::marker::helper_attached(pid, &lib.display().to_string()),
                Some(Err(e)) => names::gpu::marker::helper_failed(pid, &causes::one_line(&e)),
            };
            out.push(marker(pid, text));
        }
        for pid in self.watched.clone() {
            let Some(lib) = libcuda::find_in_process(pid) else {
                if first && pid == self.pid {
                    out.push(marker(pid, names::marker::libcuda_not_loaded(pid)));
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
                    self.cuda = match &self.cuda {
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
                    if !matches!(self.cuda, CudaState::Attached { .. }) {
                        self.cuda = CudaState::Failed(e);
                    }
                    text
                }
            };
            out.push(marker(pid, text));
        }
        out
    }

    /// Stops the sampler and reports.
    pub fn finish(mut self) -> GpuReport {
        let (samples, dropped) = self
            .sampler
            .as_ref()
            .map(|s| (s.samples(), s.dropped()))
            .unwrap_or((0, 0));
        self.sampler = None;
        let counters = if self.interval.is_some() && samples > 0 {
            format!("{}, {samples} samples", self.nvml_line)
        } else {
            self.nvml_line.clone()
        };
        GpuReport {
            counters,
            cuda: self.cuda.clone(),
            dropped,
        }
    }
}

fn marker(pid: u32, text: String) -> Event {
    Event {
        ts_ns: boottime_ns(),
        pid,
        tid: 0,
        body: EventBody::Marker { text },
    }
}
