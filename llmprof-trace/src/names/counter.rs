//! Counter tracks: `(name, unit)`.

/// A process's engine KV-cache usage (`vllm:kv_cache_usage_perc`, 0..1).
pub const KV_USAGE: (&str, &str) = ("KV cache usage", "fraction");
/// A process's running requests (`vllm:num_requests_running`).
pub const RUNNING: (&str, &str) = ("requests running", "requests");
/// A process's waiting requests (`vllm:num_requests_waiting`).
pub const WAITING: (&str, &str) = ("requests waiting", "requests");
/// A process's preemptions so far (`vllm:num_preemptions_total`).
pub const PREEMPTIONS: (&str, &str) = ("preemptions", "preemptions");
/// A process's syscall rate over the last sampling interval (kernel aggregates).
pub const SYSCALL_RATE: (&str, &str) = ("syscalls/s", "calls/s");
/// Unit of the `GPU N memory (pid P)` tracks ([`super::track::gpu_process_memory`]).
pub const GPU_PROCESS_MEMORY_UNIT: &str = "MiB";
/// NVML `utilization.gpu`: percent of time a kernel ran.
pub const GPU_UTILIZATION: (&str, &str) = ("utilization", "%");
/// NVML `utilization.memory`: percent of time device memory was read or written.
pub const GPU_MEMORY_UTILIZATION: (&str, &str) = ("memory utilization", "%");
/// Device memory in use.
pub const GPU_MEMORY_USED: (&str, &str) = ("memory used", "MiB");
/// Board power draw.
pub const GPU_POWER: (&str, &str) = ("power", "W");
/// SM clock.
pub const GPU_SM_CLOCK: (&str, &str) = ("SM clock", "MHz");
/// GPU temperature.
pub const GPU_TEMPERATURE: (&str, &str) = ("temperature", "°C");
/// PCIe transmit throughput.
pub const GPU_PCIE_TX: (&str, &str) = ("PCIe TX (device to host)", "MB/s");
/// PCIe receive throughput.
pub const GPU_PCIE_RX: (&str, &str) = ("PCIe RX (host to device)", "MB/s");
/// NVML counters of each GPU: (metric, unit), the metric being the track name after `GPU N `
/// ([`super::track::gpu_counter`]). The index is the metric's id in the track uuid.
pub const GPU: [(&str, &str); 8] = [
    GPU_UTILIZATION,
    GPU_MEMORY_UTILIZATION,
    GPU_MEMORY_USED,
    GPU_POWER,
    GPU_SM_CLOCK,
    GPU_TEMPERATURE,
    GPU_PCIE_TX,
    GPU_PCIE_RX,
];
/// Estimated CPU the probes added to the target, % of its own CPU (the `--overhead-budget` measure).
pub const OVERHEAD_TARGET_PCT: (&str, &str) = ("llmprof overhead: est. target CPU added", "%");
/// Estimated CPU the probes added, ms per second.
pub const OVERHEAD_ADDED_CPU: (&str, &str) = ("llmprof overhead: est. added CPU", "ms/s");
/// llmprof's own CPU, % of one core.
pub const LLMPROF_CPU: (&str, &str) = ("llmprof CPU", "%");
/// llmprof's resident memory.
pub const LLMPROF_RSS: (&str, &str) = ("llmprof RSS", "MiB");
/// Calibrated cost per traced syscall.
pub const COST_SYSCALL: (&str, &str) = ("llmprof cost per hit: syscall", "ns");
/// Calibrated cost per engine probe hit.
pub const COST_ENGINE_PROBE: (&str, &str) = ("llmprof cost per hit: engine probe", "ns");
/// The overhead budget's degradation level in force.
pub const DEGRADATION_LEVEL: (&str, &str) = ("llmprof degradation level", "level");
/// Calibrated cost per traced syscall whose exit llmprof decodes (read, write, close, ...).
pub const COST_SYSCALL_DECODED: (&str, &str) = ("llmprof cost per hit: decoded syscall", "ns");
/// Calibrated cost per CUDA driver call.
pub const COST_CUDA_CALL: (&str, &str) = ("llmprof cost per hit: CUDA call (entry + return probe)", "ns");
/// Global counter tracks of llmprof's self-accounting, written every tick (`llmprof::selfacct`); the index
/// is the track's key.
pub const OVERHEAD: [(&str, &str); 9] = [
    OVERHEAD_TARGET_PCT,
    OVERHEAD_ADDED_CPU,
    LLMPROF_CPU,
    LLMPROF_RSS,
    COST_SYSCALL,
    COST_ENGINE_PROBE,
    DEGRADATION_LEVEL,
    COST_CUDA_CALL,
    COST_SYSCALL_DECODED,
];
