//! The GPU side of one attach session: the NVML counters ([`crate::nvml`]) and the CUDA driver probes
//! ([`crate::cuda`]) started together, the CUPTI helper's handoff probed in the processes that have it.
//!
//! Owns: [`GpuOptions`] (what the GPU side should do), [`GpuSession`] (the NVML sampler feeding the
//! session's sampler queue, and the libcuda watch of each process of the session) and [`GpuReport`] (what the
//! attach summary says of it). The samplers and the probes are their families'; this module only composes
//! them and turns what they say into timeline markers. The CUPTI helper itself is [`crate::cupti`]'s.

use std::sync::mpsc::SyncSender;
use std::time::Duration;

use crate::capture::Capture;
use crate::causes;
use crate::cuda::{CudaCalls, CudaState, CudaWatch};
use crate::cupti::KernelsMode;
use crate::nvml::{self, NvmlCounters};
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
    /// `--gpu-kernels`: inject the CUPTI helper ([`crate::cupti`]).
    pub kernels: KernelsMode,
}

impl Default for GpuOptions {
    fn default() -> Self {
        Self {
            sample_interval: Some(nvml::DEFAULT_INTERVAL),
            cuda: true,
            cuda_calls: CudaCalls::Counted,
            // Sessions started by `llmprof serve` never inject (the CLI's default is `auto`).
            kernels: KernelsMode::Off,
        }
    }
}

/// The GPU side of one session.
#[derive(Debug)]
pub struct GpuSession {
    nvml: NvmlCounters,
    cuda: CudaWatch,
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
        let (nvml, why) = NvmlCounters::start(opts.sample_interval, pid, tx);
        let markers = why.into_iter().map(|text| marker(pid, text)).collect();
        let s = Self {
            nvml,
            cuda: CudaWatch::new(opts.cuda, pid),
        };
        (s, markers)
    }

    /// UUID of the target's GPU when NVML knows it (for the OTel resource).
    pub fn gpu_uuid(&self) -> Option<String> {
        self.nvml.gpu_uuid()
    }

    /// Watches `pid`'s libcuda too (a process of the traced tree, or another target).
    pub fn watch_process(&mut self, pid: u32) {
        self.cuda.watch_process(pid);
    }

    /// Stops watching `pid` (it exited).
    pub fn forget_process(&mut self, pid: u32) {
        self.cuda.forget_process(pid);
    }

    /// Attaches the CUDA driver probes of each watched process once libcuda is mapped in it, and the CUPTI
    /// handoff of each that has llmprof's helper loaded already (it loaded it itself, or an earlier session
    /// injected it). Call it at start (`first`) and every tick; it returns the markers to put on the timeline.
    pub fn watch_cuda(&mut self, capture: &mut Capture, first: bool) -> Vec<Event> {
        let mut out = Vec::new();
        for pid in self.cuda.processes() {
            let text = match capture.attach_loaded_helper(pid) {
                None => continue,
                Some(Ok(lib)) => names::cupti::marker::helper_attached(pid, &lib.display().to_string()),
                Some(Err(e)) => names::cupti::marker::helper_failed(pid, &causes::one_line(&e)),
            };
            out.push(marker(pid, text));
        }
        out.extend(
            self.cuda
                .attach(capture, first)
                .into_iter()
                .map(|(pid, text)| marker(pid, text)),
        );
        out
    }

    /// Stops the sampler and reports.
    pub fn finish(self) -> GpuReport {
        let n = self.nvml.finish();
        GpuReport {
            counters: n.counters,
            cuda: self.cuda.state().clone(),
            dropped: n.dropped,
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
