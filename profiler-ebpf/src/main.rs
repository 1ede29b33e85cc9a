//! llmprof's eBPF programs: the only code of llmprof that runs in the kernel, one module per probe family (the
//! same names as `llmprof_abi`'s modules, which own the records, constants and the program and map names).
//!
//! This file holds what every family shares: the `TRACED` filter, the `EVENTS` ring, the per-probe `COUNTERS`,
//! the runtime `KNOBS`, the load-time `LLMPROF_CONFIG` and the helpers around them. Everything is filtered first
//! by the `TRACED` map of tgids, so untraced processes cost one hash lookup; llmprof's own process
//! (`Config::self_tgid`) is refused by every program whatever that map says ([`is_self`]), except while its
//! start-up calibration sets `Knob::SelfTraced`. Program names all start with `llmprof_`, so a listing finds
//! them (the kernel keeps 15 bytes of a name):
//! - `syscalls`: `llmprof_sysent` / `llmprof_sysexit` (raw_syscalls:sys_enter/sys_exit): per-thread syscall
//!   aggregates and slow syscalls; the exit also dispatches, on the syscall number, to the `files`, `egress`
//!   and `wire` families. One pair of tracepoints instead of one per syscall: the syscall's arguments are
//!   saved at entry and everything is decided at exit, where the result is known.
//! - `files`, `egress`: no program of their own (model-file opens/reads/mmaps/closes; connects and bytes
//!   sent, decoded at the syscall exit).
//! - `engine`: `llmprof_step` / `llmprof_request` / `llmprof_range` (uprobes at the engine's probe NOPs) copy
//!   the engine's record with `bpf_probe_read_user` straight into the ring-buffer reservation;
//!   `llmprof_content` (only with `--capture-content`) also copies up to `CONTENT_MAX` bytes of the text.
//! - `cuda`: `llmprof_cuent` / `llmprof_curet` (uprobe / uretprobe at CUDA driver entry points in libcuda; the
//!   attach cookie holds function, symbol variant and argument index) write one `CudaCallEvent` per timed
//!   call; `llmprof_cucount` (entry only) counts the launch-type calls per thread.
//! - `cupti`: `llmprof_gpu` (uprobe at the injected CUPTI helper's handoff function): one chunk of GPU
//!   activity records per hit, copied into one `GpuChunkEvent`.
//! - `wire`: `llmprof_wirerd` / `llmprof_wirewr` (tail-called from `llmprof_sysexit` through `WIRE_DECODERS`)
//!   decode HTTP/1.1 reads and writes of followed connections; `llmprof_skready` / `llmprof_skrecv` /
//!   `llmprof_skgone` (sock:sk_data_ready, sock:sock_recv_length, tcp:tcp_destroy_sock) stamp when a
//!   request's bytes arrived in the server's socket.
//! - `stacks`: `llmprof_sample` (perf_event, software CPU clock, one event per CPU): on-CPU stack samples of
//!   traced threads (kernel and user frames); off-CPU stacks are taken by `sched`'s switch program.
//! - `sched`: `llmprof_tnew` / `llmprof_sswitch` / `llmprof_swaking` / `llmprof_swnew`: thread states of the
//!   traced threads and the tid → tgid map they need.
//! - `python`: `llmprof_pysample` (perf_event, software CPU clock): the sampled thread's CPython frames, one
//!   `PyStackEvent` per sample (also written beside every native sample of a Python process).
//! - `proc`: `llmprof_fork` / `llmprof_exec` / `llmprof_pexit` (task:task_newtask, sched:sched_process_exec,
//!   sched:sched_process_exit): new processes of a traced tree enter `TRACED` before they run, exec'd
//!   programs are reported, and every traced process's end.
//!
//! Records go to one ring buffer (`EVENTS`) without wakeups (user space polls); every reservation failure
//! is counted in `COUNTERS` (per-CPU, indexed by `ProbeId`). This code must never loop unboundedly or keep
//! per-event state it does not free.
#![no_std]
#![no_main]

mod cuda;
mod cupti;
mod egress;
mod engine;
mod files;
mod log;
mod proc;
mod python;
mod sched;
mod stacks;
mod syscalls;
mod wire;

use aya_ebpf::{
    Global,
    helpers::{bpf_get_smp_processor_id, bpf_ktime_get_boot_ns},
    macros::map,
    maps::{Array, HashMap, PerCpuArray, RingBuf},
    programs::TracePointContext,
};
use llmprof_abi::{
    Config, EventHeader, EventKind, Knob, NUM_KNOBS, NUM_PROBES, ProbeCounters, ProbeId, SYSCALL_SLOTS,
};

/// Set by user space at load (`EbpfLoader::override_global`); the default is llmprof's documented one.
#[unsafe(no_mangle)]
static LLMPROF_CONFIG: Global<Config> = Global::new(Config {
    slow_syscall_ns: 1_000_000,
    slot_tids: SYSCALL_SLOTS,
    self_tgid: 0,
});

/// Default ring size; user space resizes it at load (`--ring-size`). 64 MiB dropped nothing in a
/// 1M-event burst here (docs/performance.md, Capture).
const RING_BYTES: u32 = 64 << 20;

/// tgids being traced; the value holds `TRACED_SELF` and, for trees, `TRACED_CHILDREN` (module `proc`).
#[map]
static TRACED: HashMap<u32, u8> = HashMap::with_max_entries(1024, 0);

/// All records, each starting with an `EventHeader`.
#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(RING_BYTES, 0);

/// Per-probe hit/emitted/dropped counters.
#[map]
static COUNTERS: PerCpuArray<ProbeCounters> = PerCpuArray::with_max_entries(NUM_PROBES as u32, 0);

/// Runtime knobs (`llmprof_abi::Knob`), written by user space while attached; zero = full tracing.
#[map]
static KNOBS: Array<u64> = Array::with_max_entries(NUM_KNOBS as u32, 0);

#[inline(always)]
fn knob(k: Knob) -> u64 {
    KNOBS.get(k as u32).copied().unwrap_or(0)
}

/// A field of a classic tracepoint's record at byte `off` (an offset of its format file); the default when the
/// read fails.
#[inline(always)]
pub(crate) fn tp_field<T: Copy + Default>(ctx: &TracePointContext, off: usize) -> T {
    // SAFETY: `off` is a field offset of this tracepoint's format (the callers' constants); a failed read
    // leaves the default.
    unsafe { ctx.read_at::<T>(off) }.unwrap_or_default()
}

#[inline(always)]
fn count(id: ProbeId, hits: u64, emitted: u64, dropped: u64) {
    if let Some(c) = COUNTERS.get_ptr_mut(id as u32) {
        // SAFETY: a per-CPU array slot of this CPU; programs do not nest on a CPU for these hooks.
        unsafe {
            (*c).hits += hits;
            (*c).emitted += emitted;
            (*c).dropped += dropped;
        }
    }
}

#[inline(always)]
fn header(kind: EventKind, ts_ns: u64, pid_tgid: u64) -> EventHeader {
    EventHeader {
        kind: kind as u32,
        // SAFETY: helper without arguments.
        cpu: unsafe { bpf_get_smp_processor_id() },
        ts_ns,
        pid: (pid_tgid >> 32) as u32,
        tid: pid_tgid as u32,
    }
}

/// Whether `tgid` is llmprof itself outside its start-up calibration: never traced, whatever `TRACED` or a
/// thread's syscall slot says (one compare for every other process; the knob is read only for llmprof).
#[inline(always)]
pub(crate) fn is_self(tgid: u32) -> bool {
    tgid == LLMPROF_CONFIG.load().self_tgid && knob(Knob::SelfTraced) == 0
}

#[inline(always)]
fn traced(tgid: u32) -> bool {
    // SAFETY: the value is only tested for presence.
    !is_self(tgid) && unsafe { TRACED.get(&tgid) }.is_some()
}

#[inline(always)]
fn now() -> u64 {
    // SAFETY: helper without arguments.
    unsafe { bpf_ktime_get_boot_ns() }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

/// GPL-compatible license, required for the tracing helpers (bpf_probe_read_user, ring buffers).
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
