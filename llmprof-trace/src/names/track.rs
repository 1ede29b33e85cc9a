//! Names of tracks (`track.name` in the trace processor).

/// The global track of llmprof's own markers, the overhead budget's steps and the summary.
pub const LLMPROF: &str = "llmprof";
/// A traced process's child track with one slice per engine step.
pub const STEPS: &str = "engine steps";
/// A process's child track of the device interval of each step, timed with CUDA events.
pub const DEVICE_CUDA: &str = "device (CUDA)";
/// A process's child track of the device interval of each step, timed on the host (CPU engine).
pub const DEVICE_HOST: &str = "device (host compute)";
/// Each calling thread's child track of CUDA driver calls.
pub const CUDA: &str = "CUDA driver calls (host time)";
/// Beginning of every request track's name (see [`request`]).
pub const REQUEST_PREFIX: &str = "request ";
/// Beginning of every GPU track's name: groups, NVML counters, process memory (see [`gpu_group`]).
pub const GPU_PREFIX: &str = "GPU ";
/// Beginning of the per-probe drop counter tracks (see [`drops`]).
pub const DROPS_PREFIX: &str = "llmprof drops: ";

/// A request's track: `request N`, or `request N (x-request-id)` when the header was set; a request seen
/// on the wire (id from [`crate::event::WIRE_REQ_BASE`]): `http request N (x-request-id)`.
pub fn request(req_id: u64, x_request_id: &str) -> String {
    let name = super::slice::request(req_id);
    if x_request_id.is_empty() {
        name
    } else {
        format!("{name} ({x_request_id})")
    }
}

/// A GPU's group track: `GPU N: <product name>`, with ` (<uuid>)` when NVML gave one.
pub fn gpu_group(index: u32, name: &str, uuid: &str) -> String {
    if uuid.is_empty() {
        format!("{GPU_PREFIX}{index}: {name}")
    } else {
        format!("{GPU_PREFIX}{index}: {name} ({uuid})")
    }
}

/// A GPU's NVML counter track: `GPU N <metric>` (`metric` from [`super::counter::GPU`]).
pub fn gpu_counter(index: u32, metric: &str) -> String {
    format!("{GPU_PREFIX}{index} {metric}")
}

/// The counter track of a traced process's device memory on a GPU: `GPU N memory (pid P)`.
pub fn gpu_process_memory(index: u32, pid: u32) -> String {
    format!("{GPU_PREFIX}{index} memory (pid {pid})")
}

/// A probe's drop counter track: `llmprof drops: <probe>` (probe names: `llmprof_abi::PROBE_NAMES`).
pub fn drops(probe: &str) -> String {
    format!("{DROPS_PREFIX}{probe}")
}

/// What a GPU track's name says (the reader's side of [`gpu_group`], [`gpu_counter`],
/// [`gpu_process_memory`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuTrack<'a> {
    /// A group track: GPU index and `<product name> (<uuid>)`.
    Group(u64, &'a str),
    /// The device memory of a process: GPU index and pid.
    ProcessMemory(u64, u64),
    /// An NVML counter: GPU index and the metric (the name after `GPU N `).
    Counter(u64, &'a str),
}

/// Parses a GPU track's name; `None` for any other track.
pub fn parse_gpu(name: &str) -> Option<GpuTrack<'_>> {
    let (idx, rest) = name.strip_prefix(GPU_PREFIX)?.split_once(' ')?;
    if let Some(i) = idx.strip_suffix(':') {
        return Some(GpuTrack::Group(i.parse().ok()?, rest));
    }
    let i = idx.parse().ok()?;
    let pid = rest
        .strip_prefix("memory (pid ")
        .and_then(|p| p.strip_suffix(')'))
        .and_then(|p| p.parse().ok());
    Some(match pid {
        Some(pid) => GpuTrack::ProcessMemory(i, pid),
        None => GpuTrack::Counter(i, rest),
    })
}
