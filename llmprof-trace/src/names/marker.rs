//! Instants on the [`super::track::LLMPROF`] track: markers, the budget's steps, alerts, the summary.

/// The final instant with the session statistics and self-accounting.
pub const SUMMARY: &str = "llmprof summary";
/// Where the trace's view begins (the probes went live, or the flight recorder's history starts): a request
/// that arrived before it was in flight when llmprof attached.
pub const TRACING_STARTED: &str = "tracing started";
/// The traced process exited (also the session's end reason then).
pub const TARGET_EXITED: &str = "target exited";
/// Beginning of the marker written when a process's engine probes were not found.
pub const ENGINE_PROBES_NOT_FOUND: &str = "engine probes not found";
/// Beginning of the marker written when `--max-trace-size` ended the trace (also the session's end reason).
pub const SIZE_LIMIT_REACHED: &str = "trace size limit reached";
/// Beginning of an overhead budget step's instant (followed by the step's name).
pub const DEGRADATION_PREFIX: &str = "overhead budget: ";
/// Beginning of the instant `llmprof serve` writes for the alert behind a trace.
pub const ALERT_FIRED_PREFIX: &str = "alert fired: ";
/// Beginning of the GPU layer's marker when NVML cannot be used.
pub const GPU_COUNTERS_UNAVAILABLE: &str = "GPU counters unavailable";
/// Beginning of the GPU layer's marker when the target has not loaded libcuda (yet).
pub const LIBCUDA_NOT_LOADED: &str = "libcuda not loaded";
/// Beginning of the GPU layer's markers about the CUDA driver probes (attached or failed).
pub const CUDA_PROBES: &str = "CUDA driver probes";
/// Beginnings of the markers `llmprof report` lists as the GPU layer's (`NVML`: read for traces of earlier
/// versions; nothing writes it today).
pub const GPU_PREFIXES: [&str; 4] = [GPU_COUNTERS_UNAVAILABLE, "NVML", LIBCUDA_NOT_LOADED, CUDA_PROBES];

/// Beginning of the marker written when a traced process's port speaks TLS or HTTP/2.
pub const WIRE_NOT_DECODED: &str = "wire probe: not decoded";

/// `wire probe: not decoded: pid P fd F speaks <what>`.
pub fn wire_not_decoded(pid: u32, fd: i32, what: &str) -> String {
    format!("{WIRE_NOT_DECODED}: pid {pid} fd {fd} speaks {what}")
}

/// `engine probes not found in pid P: engine tracks are empty`.
pub fn engine_probes_not_found(pid: u32) -> String {
    format!("{ENGINE_PROBES_NOT_FOUND} in pid {pid}: engine tracks are empty")
}

/// `trace size limit reached (--max-trace-size N bytes): trace ended early, M events not written`.
pub fn size_limit_reached(limit: u64, not_written: u64) -> String {
    format!(
        "{SIZE_LIMIT_REACHED} (--max-trace-size {limit} bytes): trace ended early, {not_written} events not written"
    )
}

/// `overhead budget: <step>` (step names: `llmprof::budget::LEVELS`).
pub fn degradation(step: &str) -> String {
    format!("{DEGRADATION_PREFIX}{step}")
}

/// `overhead budget P% still exceeded (est. E%) with engine steps and requests only: kept`.
pub fn budget_exhausted(budget_pct: f64, overhead_pct: f64) -> String {
    format!(
        "overhead budget {budget_pct}% still exceeded (est. {overhead_pct:.1}%) with engine steps and requests only: kept"
    )
}

/// `alert fired: <alertname>`.
pub fn alert_fired(alertname: &str) -> String {
    format!("{ALERT_FIRED_PREFIX}{alertname}")
}

/// `flight recorder history incomplete for the last N ms before the alert`.
pub fn flight_recorder_incomplete(ms: f64) -> String {
    format!("flight recorder history incomplete for the last {ms:.0} ms before the alert")
}

/// `GPU counters unavailable: <why>`.
pub fn gpu_counters_unavailable(why: &str) -> String {
    format!("{GPU_COUNTERS_UNAVAILABLE}: {why}")
}

/// `libcuda not loaded in pid P: no CUDA driver calls yet (probes attach when it loads)`.
pub fn libcuda_not_loaded(pid: u32) -> String {
    format!("{LIBCUDA_NOT_LOADED} in pid {pid}: no CUDA driver calls yet (probes attach when it loads)")
}

/// `CUDA driver probes attached: N entry points of LIB (M of them only reachable through
/// cuGetProcAddress)`.
pub fn cuda_probes_attached(entry_points: usize, lib: &str, via_proc_address: usize) -> String {
    format!(
        "{CUDA_PROBES} attached: {entry_points} entry points of {lib} ({via_proc_address} of them only \
         reachable through cuGetProcAddress)"
    )
}

/// `CUDA driver probes failed: <why>`.
pub fn cuda_probes_failed(why: &str) -> String {
    format!("{CUDA_PROBES} failed: {why}")
}
