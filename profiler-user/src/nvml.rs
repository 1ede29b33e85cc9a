//! GPU counters from NVML, sampled on a thread of llmprof.
//!
//! Owns: the NVML counters of a session ([`NvmlCounters`]: the sampler and the one line the attach summary
//! says about them), loading NVML (`nvml-wrapper`, which `dlopen`s `libnvidia-ml.so.1` at run time, so llmprof builds and
//! runs without NVIDIA libraries; a missing library or driver is an `Err`, never a panic), reading every GPU's
//! utilization, memory, power, SM clock, temperature, PCIe throughput and the target process's device memory
//! into [`GpuSample`] events, and sending them into the session's bounded queue (`try_send`, counting what it
//! drops). It never blocks the session loop or the traced process.

use std::ffi::OsStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{Clock, PcieUtilCounter, TemperatureSensor};
use nvml_wrapper::enums::device::UsedGpuMemory;

use llmprof_trace::clock::boottime_ns;
use llmprof_trace::event::{Event, EventBody, GpuSample};

/// Default sampling period (`--gpu-sample-interval`): 100 ms resolves a decode burst without a visible cost.
pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(100);
/// The library NVML lives in (installed by the NVIDIA driver).
pub const NVML_LIB: &str = "libnvidia-ml.so.1";
/// Environment variable naming another NVML library to load (tests point it at a missing file to check the
/// "NVML absent" path on any host).
pub const NVML_LIB_ENV: &str = "LLMPROF_NVML_LIB";
/// NVML reports PCIe throughput in KB/s (1 KB = 1024 bytes, nvml.h `nvmlDeviceGetPcieThroughput`).
const PCIE_KB: f64 = 1024.0;

/// A GPU NVML sees.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuInfo {
    /// NVML index.
    pub index: u32,
    /// Product name.
    pub name: String,
    /// `GPU-...` UUID.
    pub uuid: String,
    /// Whether the traced process has a compute context on it (at start).
    pub used_by_target: bool,
}

/// Why there are no GPU counters.
#[derive(Debug, thiserror::Error)]
pub enum NvmlUnavailable {
    /// The library or the driver could not be initialized.
    #[error("NVML ({lib}) could not be initialized")]
    Init {
        /// The library tried.
        lib: String,
        /// nvml-wrapper's error.
        #[source]
        source: nvml_wrapper::error::NvmlError,
    },
    /// NVML works but sees no GPU.
    #[error("NVML sees no GPU")]
    NoDevice,
    /// The sampler thread could not be started.
    #[error("cannot start the NVML sampler thread")]
    Thread(#[source] std::io::Error),
}

/// The running sampler.
pub struct NvmlSampler {
    stop: Arc<AtomicBool>,
    dropped: Arc<AtomicU64>,
    samples: Arc<AtomicU64>,
    handle: Option<JoinHandle<()>>,
    gpus: Vec<GpuInfo>,
}

impl std::fmt::Debug for NvmlSampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlSampler").field("gpus", &self.gpus).finish()
    }
}

/// Loads NVML (from [`NVML_LIB_ENV`] when set, else [`NVML_LIB`]).
pub fn init() -> Result<Nvml, NvmlUnavailable> {
    let lib = std::env::var(NVML_LIB_ENV).unwrap_or_else(|_| NVML_LIB.to_owned());
    Nvml::builder()
        .lib_path(OsStr::new(&lib))
        .init()
        .map_err(|source| NvmlUnavailable::Init { lib, source })
}

/// The GPUs of `nvml`, marking those on which `pid` runs compute work.
pub fn gpus(nvml: &Nvml, pid: u32) -> Vec<GpuInfo> {
    let n = nvml.device_count().unwrap_or(0);
    (0..n)
        .filter_map(|i| {
            let d = nvml.device_by_index(i).ok()?;
            let used_by_target = d
                .running_compute_processes()
                .map(|ps| ps.iter().any(|p| p.pid == pid))
                .unwrap_or(false);
            Some(GpuInfo {
                index: i,
                name: d.name().unwrap_or_else(|_| format!("GPU {i}")),
                uuid: d.uuid().unwrap_or_default(),
                used_by_target,
            })
        })
        .collect()
}

/// The UUID of the traced process's GPU: the one it runs compute work on, or the only GPU there is.
pub fn target_uuid(gpus: &[GpuInfo]) -> Option<String> {
    let used: Vec<&GpuInfo> = gpus.iter().filter(|g| g.used_by_target).collect();
    let pick = match (used.as_slice(), gpus) {
        ([one], _) => Some(*one),
        ([], [only]) => Some(only),
        _ => None,
    };
    pick.map(|g| g.uuid.clone()).filter(|u| !u.is_empty())
}

/// One sample of GPU `index`; counters the GPU does not support stay `None`.
pub fn sample(nvml: &Nvml, index: u32, pid: u32) -> Option<GpuSample> {
    let d = nvml.device_by_index(index).ok()?;
    let util = d.utilization_rates().ok();
    let mem = d.memory_info().ok();
    let process_mem_bytes = d.running_compute_processes().ok().and_then(|ps| {
        ps.iter()
            .filter(|p| p.pid == pid)
            .map(|p| match p.used_gpu_memory {
                UsedGpuMemory::Used(b) => b,
                UsedGpuMemory::Unavailable => 0,
            })
            .reduce(|a, b| a + b)
    });
    Some(GpuSample {
        index,
        name: d.name().unwrap_or_default(),
        uuid: d.uuid().unwrap_or_default(),
        util_gpu_pct: util.as_ref().map(|u| f64::from(u.gpu)),
        util_mem_pct: util.as_ref().map(|u| f64::from(u.memory)),
        mem_used_bytes: mem.as_ref().map(|m| m.used),
        mem_total_bytes: mem.as_ref().map(|m| m.total),
        power_w: d.power_usage().ok().map(|mw| f64::from(mw) / 1e3),
        sm_clock_mhz: d.clock_info(Clock::SM).ok().map(f64::from),
        temperature_c: d.temperature(TemperatureSensor::Gpu).ok().map(f64::from),
        pcie_tx_bytes_per_s: d
            .pcie_throughput(PcieUtilCounter::Send)
            .ok()
            .map(|kb| f64::from(kb) * PCIE_KB),
        pcie_rx_bytes_per_s: d
            .pcie_throughput(PcieUtilCounter::Receive)
            .ok()
            .map(|kb| f64::from(kb) * PCIE_KB),
        process_mem_bytes,
    })
}

impl NvmlSampler {
    /// Loads NVML and samples every GPU every `interval` for `pid`, sending [`EventBody::GpuSample`] events.
    pub fn start(pid: u32, interval: Duration, tx: SyncSender<Event>) -> Result<Self, NvmlUnavailable> {
        let nvml = init()?;
        let gpus = gpus(&nvml, pid);
        if gpus.is_empty() {
            return Err(NvmlUnavailable::NoDevice);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let dropped = Arc::new(AtomicU64::new(0));
        let samples = Arc::new(AtomicU64::new(0));
        let (stop2, dropped2, samples2) = (stop.clone(), dropped.clone(), samples.clone());
        let indices: Vec<u32> = gpus.iter().map(|g| g.index).collect();
        let handle = std::thread::Builder::new()
            .name("llmprof-nvml".into())
            .spawn(move || {
                while !stop2.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    for &i in &indices {
                        let Some(s) = sample(&nvml, i, pid) else { continue };
                        let ev = Event {
                            ts_ns: boottime_ns(),
                            pid,
                            tid: 0,
                            body: EventBody::GpuSample(Box::new(s)),
                        };
                        match tx.try_send(ev) {
                            Ok(()) => {
                                samples2.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(TrySendError::Full(_)) => {
                                dropped2.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(TrySendError::Disconnected(_)) => return,
                        }
                    }
                    // Sleep the rest of the period in small slices so stop is prompt.
                    let mut left = interval.saturating_sub(t.elapsed());
                    while !left.is_zero() && !stop2.load(Ordering::Relaxed) {
                        let d = left.min(Duration::from_millis(20));
                        std::thread::sleep(d);
                        left = left.saturating_sub(d);
                    }
                }
            })
            .map_err(NvmlUnavailable::Thread)?;
        Ok(Self {
            stop,
            dropped,
            samples,
            handle: Some(handle),
            gpus,
        })
    }

    /// The GPUs being sampled.
    pub fn gpus(&self) -> &[GpuInfo] {
        &self.gpus
    }

    /// Samples sent so far.
    pub fn samples(&self) -> u64 {
        self.samples.load(Ordering::Relaxed)
    }

    /// Samples dropped because the session queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

impl Drop for NvmlSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// The NVML counters of one session: the sampler, when it runs, and what the summary says of it.
#[derive(Debug)]
pub struct NvmlCounters {
    sampler: Option<NvmlSampler>,
    line: String,
    interval: Option<Duration>,
}

/// What the NVML counters did, for the attach summary.
#[derive(Clone, Debug)]
pub struct NvmlReport {
    /// One line on the GPU counters.
    pub counters: String,
    /// Samples dropped because the session queue was full.
    pub dropped: u64,
}

impl NvmlCounters {
    /// Starts sampling every `interval` (None: off) for `pid`, its samples into `tx`; with the text of the
    /// marker to put on the timeline when there are no counters (why).
    pub fn start(interval: Option<Duration>, pid: u32, tx: SyncSender<Event>) -> (Self, Option<String>) {
        let mut marker = None;
        let (sampler, line) = match interval {
            None => (None, "off (--gpu-sample-interval 0)".to_owned()),
            Some(interval) => match NvmlSampler::start(pid, interval, tx) {
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
                    let e = crate::causes::one_line(&e);
                    marker = Some(llmprof_trace::names::marker::gpu_counters_unavailable(&e));
                    (None, format!("unavailable: {e}"))
                }
            },
        };
        (
            Self {
                sampler,
                line,
                interval,
            },
            marker,
        )
    }

    /// UUID of the target's GPU when NVML knows it (for the OTel resource).
    pub fn gpu_uuid(&self) -> Option<String> {
        self.sampler.as_ref().and_then(|s| target_uuid(s.gpus()))
    }

    /// Stops the sampler and reports.
    pub fn finish(mut self) -> NvmlReport {
        let (samples, dropped) = self
            .sampler
            .as_ref()
            .map(|s| (s.samples(), s.dropped()))
            .unwrap_or((0, 0));
        self.sampler = None;
        let counters = if self.interval.is_some() && samples > 0 {
            format!("{}, {samples} samples", self.line)
        } else {
            self.line.clone()
        };
        NvmlReport { counters, dropped }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_an_error_not_a_panic() {
        let r = Nvml::builder()
            .lib_path(OsStr::new("/nonexistent/libnvidia-ml.so.1"))
            .init();
        assert!(r.is_err());
        let (tx, _rx) = std::sync::mpsc::sync_channel(1);
        // On a host without NVIDIA libraries this is the real path; on a GPU host it samples.
        match NvmlSampler::start(std::process::id(), Duration::from_millis(10), tx) {
            Ok(s) => assert!(!s.gpus().is_empty()),
            Err(e) => assert!(e.to_string().contains("NVML"), "{e}"),
        }
    }

    #[test]
    fn the_target_gpu_is_the_one_it_uses_or_the_only_one() {
        let g = |i: u32, used: bool| GpuInfo {
            index: i,
            name: "H100".into(),
            uuid: format!("GPU-{i}"),
            used_by_target: used,
        };
        assert_eq!(target_uuid(&[g(0, false)]), Some("GPU-0".into()));
        assert_eq!(target_uuid(&[g(0, false), g(1, true)]), Some("GPU-1".into()));
        assert_eq!(target_uuid(&[g(0, false), g(1, false)]), None);
        assert_eq!(target_uuid(&[]), None);
    }
}
