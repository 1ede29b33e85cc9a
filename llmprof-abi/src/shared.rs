//! What every probe family shares: the record header ([`EventHeader`]) and the record kinds ([`EventKind`]),
//! the per-probe counters ([`ProbeId`], [`ProbeCounters`]), the runtime [`Knob`]s, the load-time [`Config`],
//! the names of the maps every family uses ([`SHARED_MAPS`]) and the fixed-size string helpers. Re-exported at
//! the crate root.

/// The 5-byte NOP (`nopl 0x0(%rax,%rax,1)`) each probe function begins with; the uprobe sits on it, which
/// lets kernels with optimized uprobes (6.18 here) replace the int3 trap by a call.
pub const PROBE_NOP5: [u8; 5] = [0x0f, 0x1f, 0x44, 0x00, 0x00];

/// Bytes of a file path captured at open (NUL terminated, truncated).
pub const PATH_LEN: usize = 256;

/// Bytes of a process's `comm` (TASK_COMM_LEN, include/linux/sched.h).
pub const COMM_LEN: usize = 16;

/// tgids being traced (value: [`TRACED_SELF`] | [`TRACED_CHILDREN`]); every program checks it first.
pub const TRACED_MAP: &str = "TRACED";
/// The ring buffer of every record (resized by user space at load).
pub const EVENTS_MAP: &str = "EVENTS";
/// Per-CPU [`ProbeCounters`], indexed by [`ProbeId`].
pub const COUNTERS_MAP: &str = "COUNTERS";
/// The runtime [`Knob`]s, an array of [`NUM_KNOBS`] u64.
pub const KNOBS_MAP: &str = "KNOBS";
/// The maps every family uses.
pub const SHARED_MAPS: [&str; 4] = [TRACED_MAP, EVENTS_MAP, COUNTERS_MAP, KNOBS_MAP];
/// The global holding the [`Config`] (set at load, `EbpfLoader::override_global`).
pub const CONFIG_GLOBAL: &str = "LLMPROF_CONFIG";

/// Value flag of the kernel's `TRACED` map (key: tgid): the process is traced. Every entry has it.
pub const TRACED_SELF: u8 = 1;
/// Value flag of the kernel's `TRACED` map: new processes this one starts are traced too, with the same
/// flags (so a whole tree follows); without it (`--no-children`) only the process itself is traced.
pub const TRACED_CHILDREN: u8 = 2;

/// Kinds of records the eBPF programs write into the ring buffer. Each record starts with an [`EventHeader`].
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// [`StepEvent`](crate::StepEvent).
    Step = 1,
    /// [`RequestEvent`](crate::RequestEvent).
    Request = 2,
    /// [`RangeEvent`](crate::RangeEvent).
    Range = 3,
    /// [`SlowSyscallEvent`](crate::SlowSyscallEvent).
    SlowSyscall = 4,
    /// [`FileOpenEvent`](crate::FileOpenEvent).
    FileOpen = 5,
    /// [`FileIoEvent`](crate::FileIoEvent).
    FileIo = 6,
    /// [`ConnectEvent`](crate::ConnectEvent).
    Connect = 7,
    /// [`ProcessExitEvent`](crate::ProcessExitEvent).
    ProcessExit = 8,
    /// [`ContentEvent`](crate::ContentEvent).
    Content = 10,
    /// [`CudaCallEvent`](crate::CudaCallEvent).
    CudaCall = 9,
    /// [`cuda::CudaCountEvent`](crate::cuda::CudaCountEvent): a window of a thread's counted (launch-type) CUDA calls.
    CudaCount = 13,
    /// [`python::PyStackEvent`](crate::python::PyStackEvent).
    PyStack = 35,
    /// [`ProcessStartEvent`](crate::ProcessStartEvent): a traced process started a new process (not a thread).
    ProcessStart = 11,
    /// [`ProcessExecEvent`](crate::ProcessExecEvent): a traced process executed a new program.
    ProcessExec = 12,
    /// [`HttpEvent`](crate::HttpEvent) (the wire probe's response side, close, reset, TLS).
    Http = 20,
    /// [`HttpHeadEvent`](crate::HttpHeadEvent) (a request's head bytes).
    HttpHead = 21,
    /// [`sched::SchedSwitchEvent`](crate::sched::SchedSwitchEvent).
    SchedSwitch = 40,
    /// [`sched::SchedWakeEvent`](crate::sched::SchedWakeEvent).
    SchedWake = 41,
    /// [`CpuSampleEvent`](crate::CpuSampleEvent) (stack sampler; kinds 30–34 belong to it).
    CpuSample = 30,
    /// [`CpuSampleEvent`](crate::CpuSampleEvent) layout: the stack of a traced thread blocking at a context switch ([`stacks`](crate::stacks)).
    OffCpuStack = 42,
    /// [`GpuChunkEvent`](crate::GpuChunkEvent): a chunk of GPU activity handed over by the injected CUPTI helper ([`cupti`](crate::cupti)).
    GpuChunk = 50,
}

impl EventKind {
    /// Decodes [`EventHeader::kind`].
    pub fn from_raw(v: u32) -> Option<Self> {
        match v {
            1 => Some(Self::Step),
            2 => Some(Self::Request),
            3 => Some(Self::Range),
            4 => Some(Self::SlowSyscall),
            5 => Some(Self::FileOpen),
            6 => Some(Self::FileIo),
            7 => Some(Self::Connect),
            8 => Some(Self::ProcessExit),
            10 => Some(Self::Content),
            9 => Some(Self::CudaCall),
            13 => Some(Self::CudaCount),
            35 => Some(Self::PyStack),
            11 => Some(Self::ProcessStart),
            12 => Some(Self::ProcessExec),
            20 => Some(Self::Http),
            21 => Some(Self::HttpHead),
            40 => Some(Self::SchedSwitch),
            41 => Some(Self::SchedWake),
            30 => Some(Self::CpuSample),
            42 => Some(Self::OffCpuStack),
            50 => Some(Self::GpuChunk),
            _ => None,
        }
    }
}

/// Common prefix of every ring-buffer record.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct EventHeader {
    /// [`EventKind`] as u32.
    pub kind: u32,
    /// CPU the event was recorded on.
    pub cpu: u32,
    /// BOOTTIME ns when the eBPF program ran (for syscalls: the syscall's entry).
    pub ts_ns: u64,
    /// Process id (tgid).
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
}

/// Key of the per-socket sent-bytes map.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SockKey {
    /// Process id.
    pub pid: u32,
    /// Socket fd.
    pub fd: i32,
}

/// Identifies an eBPF program for the per-probe counters (index into the counters array).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeId {
    /// Engine step uprobe.
    Step = 0,
    /// Engine request uprobe.
    Request = 1,
    /// Engine range uprobe.
    Range = 2,
    /// raw_syscalls:sys_enter/sys_exit.
    Syscalls = 3,
    /// Model-file opens.
    FileOpen = 4,
    /// Model-file read/pread64/readv/mmap/close.
    FileIo = 5,
    /// connect.
    Connect = 6,
    /// sendto/sendmsg/write on sockets.
    Send = 7,
    /// sched_process_exit.
    ProcessExit = 8,
    /// Engine content uprobe (only with `--capture-content`).
    Content = 10,
    /// CUDA driver API entry/return uprobes in libcuda.
    Cuda = 9,
    /// Process-tree tracepoints (task_newtask, sched_process_exec): new processes of a traced tree.
    ProcTree = 11,
    /// HTTP/1.1 wire probe (reads and writes on followed connections; hits = requests + SSE writes).
    Http = 12,
    /// On-CPU stack sampler (perf_event program on the software CPU clock).
    CpuSample = 13,
    /// Thread states: sched_switch / sched_waking / sched_wakeup_new of traced threads (and the
    /// task_newtask program that keeps the thread map).
    Sched = 14,
    /// Python stack samples (perf_event software CPU clock, `llmprof_pysample`).
    PyStack = 15,
}

/// Number of [`ProbeId`] values (size of the counters array).
pub const NUM_PROBES: usize = 16;

/// Names of the probes, indexed by [`ProbeId`].
pub const PROBE_NAMES: [&str; NUM_PROBES] = [
    "engine_step",
    "engine_request",
    "engine_range",
    "syscalls",
    "file_open",
    "file_io",
    "connect",
    "send",
    "process_exit",
    "cuda",
    "engine_content",
    "proc_tree",
    "http",
    "cpu_sample",
    "sched",
    "py_stack",
];

/// Per-probe counters (a per-CPU array indexed by [`ProbeId`]; user space sums the CPUs).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ProbeCounters {
    /// Times the program ran for a traced process.
    pub hits: u64,
    /// Records written to the ring buffer.
    pub emitted: u64,
    /// Records lost because the ring buffer was full (or a user read failed).
    pub dropped: u64,
}

/// Read-only configuration of the eBPF programs (set through globals at load time).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// Syscalls at least this long (ns) are sent individually.
    pub slow_syscall_ns: u64,
    /// Threads whose tid is below this (at most [`SYSCALL_SLOTS`](crate::SYSCALL_SLOTS)) keep their syscall slot in the
    /// `SYSSLOTS` array, the others in the `INFLIGHT` hash; [`SYSCALL_SLOTS`](crate::SYSCALL_SLOTS) except in tests of the hash.
    pub slot_tids: u32,
    /// llmprof's own process: every program refuses it (its syscalls, thread states, samples, connections,
    /// probe hits and the processes it starts), whatever the `TRACED` map or a thread's syscall slot says,
    /// except while [`Knob::SelfTraced`] is set (the start-up calibration, which times llmprof traced).
    pub self_tgid: u32,
}

/// Runtime knobs of the eBPF programs: entries of the `KNOBS` array map (u64 each), written by user space
/// while attached (the overhead budget, `profiler-user/src/budget.rs`). Every knob's zero value means "full
/// tracing", so a freshly created map changes nothing. Append new knobs; never renumber.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Knob {
    /// Non-zero: individual slow-syscall records are not sent (the kernel aggregates continue).
    SyscallEventsOff = 0,
    /// N > 1: only ranges whose `step_id % N == 0` are sent (push and pop of one range share their step,
    /// so pairs stay whole); 0 or 1: all ranges.
    RangeSampleEvery = 1,
    /// Non-zero: the wire probe sends no per-write SSE records after a response's first content event (TTFT,
    /// response end and request counts stay; inter-token gaps are lost).
    HttpSseOff = 2,
    /// Non-zero: the thread-state programs (sched_switch, sched_waking, sched_wakeup_new) write nothing
    /// (the `--overhead-budget` step "stop thread states"; the thread map is still kept).
    ThreadStatesOff = 4,
    /// Non-zero: `llmprof_pysample` writes no Python stack samples (hits still counted).
    PySamplesOff = 5,
    /// N > 1: the stack sampler keeps one sample in N per CPU (the budget's "halve the sample rate" step
    /// writes 2, then more); 0 or 1: every sample. [`u64::MAX`]: no sample is taken (sampling stopped).
    SampleEvery = 3,
    /// Non-zero: the `sched_switch` program takes no off-CPU stacks ([`stacks`](crate::stacks)); set when stack sampling is
    /// off or stopped by the budget. [`stacks::OFFCPU_UNBOUNDED`](crate::stacks::OFFCPU_UNBOUNDED): every stack, without the per-CPU rate
    /// bound (the start-up calibration only).
    OffCpuStacksOff = 6,
    /// Non-zero: every connection a traced process accepts is followed provisionally, whatever its listening
    /// socket (a worker forked or spawned after attach, a unix socket behind a proxy): its first bytes decide
    /// — an HTTP/1.x request line is followed, TLS and HTTP/2 are reported, anything else is dropped without a
    /// record. Zero (`--http-port`): only the listening sockets user space wrote into `HTTP_LISTEN`.
    HttpAcceptAll = 7,
    /// Non-zero: llmprof's own process ([`Config::self_tgid`]) may be traced — set only while the start-up
    /// calibration times llmprof traced; zero (the default): the programs refuse it.
    SelfTraced = 8,
}

/// Entries of the `KNOBS` map (room for knobs appended later).
pub const NUM_KNOBS: usize = 16;

const _: () = {
    assert!(core::mem::size_of::<EventHeader>() == 24);
    assert!(core::mem::size_of::<SockKey>() == 8);
    assert!(core::mem::size_of::<ProbeCounters>() == 24);
};

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all these types are #[repr(C)], Copy, contain only integers/arrays of integers/floats,
    // and every bit pattern is valid for them (enums are stored as raw u32, never as Rust enums).
    unsafe impl aya::Pod for super::SockKey {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::ProbeCounters {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::Config {}
}

/// Copies `s` into a NUL-padded fixed array, truncating at a UTF-8 boundary.
pub fn fill_str<const N: usize>(s: &str) -> [u8; N] {
    let mut out = [0u8; N];
    let mut n = s.len().min(N);
    while n > 0 && !s.is_char_boundary(n) {
        n -= 1;
    }
    out[..n].copy_from_slice(&s.as_bytes()[..n]);
    out
}

/// Reads a NUL-padded fixed array back as a string slice (lossy: invalid UTF-8 ends the string).
pub fn read_str(b: &[u8]) -> &str {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    match core::str::from_utf8(&b[..end]) {
        Ok(s) => s,
        Err(e) => core::str::from_utf8(&b[..e.valid_up_to()]).unwrap_or(""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_roundtrip_and_truncate_on_char_boundary() {
        let a: [u8; 8] = fill_str("abc");
        assert_eq!(read_str(&a), "abc");
        let b: [u8; 4] = fill_str("abcé");
        assert_eq!(read_str(&b), "abc");
    }

    #[test]
    fn kinds_decode() {
        assert_eq!(EventKind::from_raw(7), Some(EventKind::Connect));
        assert_eq!(EventKind::from_raw(9), Some(EventKind::CudaCall));
        assert_eq!(EventKind::from_raw(14), None);
    }
}
