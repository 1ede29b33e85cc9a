//! The names of GPU activity in a trace (CUPTI records handed over by the injected helper, [`crate::event::cupti`]):
//! tracks, slices, args and summary keys. Part of [`crate::names`] (one owner of every name), in its own file.

/// Names of tracks.
pub mod track {
    const STREAM_PREFIX: &str = "CUDA device ";

    /// A process's child track of the work of one device and stream: `CUDA device D stream S`.
    pub fn stream(device: u32, stream: u32) -> String {
        format!("{STREAM_PREFIX}{device} stream {stream}")
    }

    /// The reader's side of [`stream`]: (device, stream).
    pub fn parse_stream(name: &str) -> Option<(u32, u32)> {
        let (d, s) = name.strip_prefix(STREAM_PREFIX)?.split_once(" stream ")?;
        Some((d.parse().ok()?, s.parse().ok()?))
    }

    /// A thread's child track of the CUDA API calls CUPTI recorded (the launches flows start from).
    pub const API: &str = "CUDA API calls (CUPTI)";
    /// A thread's child track (or a process's, when the waiting thread is unknown) of its host waits for the
    /// GPU (CUPTI synchronization records).
    pub const WAITS: &str = "GPU waits (CUPTI)";

    const BUSY_PREFIX: &str = "CUDA device ";
    const BUSY_SUFFIX: &str = " busy";

    /// A process's child track of one device's busy intervals (the default mode's summaries): `CUDA device D
    /// busy`.
    pub fn busy(device: u32) -> String {
        format!("{BUSY_PREFIX}{device}{BUSY_SUFFIX}")
    }

    /// The reader's side of [`busy`]: the device.
    pub fn parse_busy(name: &str) -> Option<u32> {
        name.strip_prefix(BUSY_PREFIX)?
            .strip_suffix(BUSY_SUFFIX)?
            .parse()
            .ok()
    }

    /// A process's child track of its GPU work summed per window (the default mode).
    pub const SUMMARY: &str = "GPU work per window (CUPTI)";
}

/// Names of slices.
pub mod slice {
    /// A kernel whose name was not sent (or not kept).
    pub const KERNEL_UNNAMED: &str = "kernel";
    /// The slice of one window's summary (its rows in the args).
    pub const WINDOW: &str = "GPU work (window summary)";

    /// A CUDA graph launch as a whole: `CUDA graph 5`.
    pub fn graph(id: u32) -> String {
        format!("CUDA graph {id}")
    }

    const BUSY: &str = "GPU busy";
    const BUSY_TOP: &str = "GPU busy: ";

    /// A busy interval, named by its top kernel: `GPU busy: gemm<128>` (`GPU busy` without one).
    pub fn busy(top: Option<&str>) -> String {
        match top {
            Some(t) if !t.is_empty() => format!("{BUSY_TOP}{t}"),
            _ => BUSY.to_owned(),
        }
    }

    /// The reader's side of [`busy`]: the top kernel (None: a busy slice without one, or another slice).
    pub fn parse_busy(name: &str) -> Option<&str> {
        name.strip_prefix(BUSY_TOP).filter(|t| !t.is_empty())
    }
    /// A memset.
    pub const MEMSET: &str = "memset";

    /// CUPTI's `CUpti_ActivityMemcpyKind`, by value.
    const COPY_KINDS: [&str; 11] = [
        "?", "HtoD", "DtoH", "HtoA", "AtoH", "AtoA", "AtoD", "DtoA", "DtoD", "HtoH", "PtoP",
    ];

    /// A copy kind's short name (`HtoD`, ...; `?` when unknown).
    pub fn copy_kind(detail: u32) -> &'static str {
        COPY_KINDS.get(detail as usize).copied().unwrap_or("?")
    }

    /// A copy: `memcpy HtoD`.
    pub fn memcpy(detail: u32) -> String {
        format!("memcpy {}", copy_kind(detail))
    }

    /// A host wait (CUPTI's `CUpti_ActivitySynchronizationType`): `GPU wait (stream synchronize)`.
    pub fn wait(detail: u32) -> String {
        let what = match detail {
            1 => "event synchronize",
            2 => "stream wait event",
            3 => "stream synchronize",
            4 => "context synchronize",
            _ => "unknown",
        };
        format!("GPU wait ({what})")
    }

    /// A CUDA API call CUPTI recorded: the function's name (`cuLaunchKernel`, from the target's CUPTI), or,
    /// without one, its callback id: `CUDA driver call #307` / `CUDA runtime call #211` (the number is what
    /// `cupti_driver_cbid.h` / `cupti_runtime_cbid.h` of the target's CUPTI say).
    pub fn api_call(cbid: u32, runtime: bool, name: Option<&str>) -> String {
        if let Some(n) = name.filter(|n| !n.is_empty()) {
            return n.to_owned();
        }
        let api = if runtime { "runtime" } else { "driver" };
        format!("CUDA {api} call #{cbid}")
    }
}

/// Slice categories.
pub mod category {
    /// GPU work (kernels, copies, memsets) on the stream tracks.
    pub const GPU: &str = "gpu";
    /// CUDA API calls and host waits CUPTI recorded.
    pub const CUDA_API: &str = "cuda-api";
}

/// Argument keys of the GPU slices (`debug.<key>` in the trace processor).
pub mod arg {
    /// What the work is: [`KIND_KERNEL`], `memcpy`, `memset`.
    pub const KIND: &str = "gpu_kind";
    /// [`KIND`] of a kernel.
    pub const KIND_KERNEL: &str = "kernel";
    /// [`KIND`] of a copy.
    pub const KIND_MEMCPY: &str = "memcpy";
    /// [`KIND`] of a memset.
    pub const KIND_MEMSET: &str = "memset";
    /// [`KIND`] of a CUDA graph launch as a whole.
    pub const KIND_GRAPH: &str = "graph";
    /// [`KIND`] of a host wait (in a window's rows).
    pub const KIND_WAIT: &str = "wait";

    /// Busy interval: kernels (a graph launch counts one) inside it.
    pub const KERNELS: &str = "kernels";
    /// Busy interval: the union of its kernels' times, ns.
    pub const BUSY_NS: &str = "busy_ns";
    /// Busy interval: GPU idle between its kernels, ns (its span − `busy_ns`).
    pub const IDLE_NS: &str = "idle_ns";
    /// Busy interval: its top kernel's (the one its slice is named after) GPU time inside it, ns.
    pub const TOP_KERNEL_NS: &str = "top_kernel_ns";
    /// Busy interval: that kernel's launches inside it.
    pub const TOP_KERNEL_COUNT: &str = "top_kernel_count";
    /// Window summary: the helper's window number.
    pub const WINDOW: &str = "window";
    /// Window summary, one entry per row (arrays of equal length): what the row sums ([`KIND`]'s values and
    /// [`KIND_WAIT`]).
    pub const ROW_KIND: &str = "row_kind";
    /// Window summary rows: the kernel name, copy kind (`memcpy HtoD`) or wait (`GPU wait (...)`).
    pub const ROW_NAME: &str = "row_name";
    /// Window summary rows: CUDA device.
    pub const ROW_DEVICE: &str = "row_device";
    /// Window summary rows: records summed.
    pub const ROW_COUNT: &str = "row_count";
    /// Window summary rows: their summed duration, ns.
    pub const ROW_TOTAL_NS: &str = "row_total_ns";
    /// Window summary rows: the shortest, ns.
    pub const ROW_MIN_NS: &str = "row_min_ns";
    /// Window summary rows: the longest, ns.
    pub const ROW_MAX_NS: &str = "row_max_ns";
    /// Window summary rows: bytes (copies, memsets).
    pub const ROW_BYTES: &str = "row_bytes";
    /// CUDA device ordinal.
    pub const DEVICE: &str = "device";
    /// CUPTI stream id.
    pub const STREAM: &str = "stream_id";
    /// Grid dimensions `x,y,z`.
    pub const GRID: &str = "grid";
    /// Block dimensions `x,y,z`.
    pub const BLOCK: &str = "block";
    /// Registers per thread.
    pub const REGISTERS: &str = "registers";
    /// Static shared memory per block, bytes.
    pub const SHARED_STATIC: &str = "shared_static_bytes";
    /// Dynamic shared memory per block, bytes.
    pub const SHARED_DYNAMIC: &str = "shared_dynamic_bytes";
    /// CUDA graph the work was launched from (absent outside graphs).
    pub const GRAPH_ID: &str = "graph_id";
    /// Graph node id.
    pub const GRAPH_NODE: &str = "graph_node";
    /// Copy kind (`HtoD`, ...).
    pub const COPY_KIND: &str = "copy_kind";
    /// Correlation id of the launching API call.
    pub const CORRELATION: &str = "correlation_id";
    /// The kernel's name as CUPTI gave it, when demangling changed it.
    pub const MANGLED: &str = "mangled";
    /// Thread that launched the work (from its API call record).
    pub const LAUNCH_TID: &str = "launch_tid";
    /// CUPTI callback id of an API call.
    pub const CBID: &str = "cbid";

    /// Summary: GPU activity chunks read and lost, `chunks=C activities=A api_calls=P summaries=R busy=I
    /// bad_chunks=B missed_chunks=M helper_dropped=D skipped_records=S skipped_names=N`.
    pub const SUMMARY: &str = "gpu_activity";
    /// Summary: GPU activity records lost in all (the loss counts of [`SUMMARY`] but `missed_chunks`, see
    /// `GpuStats::lost`).
    pub const LOST: &str = "gpu_activity_lost";
}

/// Values made of `key=value` words.
pub mod value {
    use crate::event::cupti::GpuStats;

    /// The summary's [`super::arg::SUMMARY`] value.
    pub fn gpu_activity(g: &GpuStats) -> String {
        format!(
            "chunks={} activities={} api_calls={} summaries={} busy={} bad_chunks={} missed_chunks={} \
             helper_dropped={} skipped_records={} skipped_names={}",
            g.chunks,
            g.activities,
            g.api_calls,
            g.summaries,
            g.busy,
            g.bad_chunks,
            g.missed_chunks,
            g.helper_dropped,
            g.skipped_records,
            g.skipped_names
        )
    }
}

/// Marker texts on the `llmprof` track.
pub mod marker {
    /// The handoff probe is attached in a process that has the helper library loaded.
    pub fn helper_attached(pid: u32, lib: &str) -> String {
        format!("GPU activity: handoff probe attached in pid {pid} ({lib})")
    }

    /// The helper library is loaded in a process but its handoff could not be probed.
    pub fn helper_failed(pid: u32, why: &str) -> String {
        format!("GPU activity: handoff probe not attached in pid {pid}: {why}")
    }
}
