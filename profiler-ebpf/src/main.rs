//! llmprof's eBPF programs: the only code of llmprof that runs in the kernel. One file (~900 lines) on purpose: it is the object, every program beside the maps it shares, and the committed object embeds its line numbers.
//!
//! Owns the programs, their maps and the records they write (layouts from `llmprof_abi`, never redefined
//! here). Everything is filtered first by the `TRACED` map of tgids, so untraced processes cost one hash
//! lookup; llmprof's own process (`Config::self_tgid`) is refused by every program whatever that map says
//! ([`is_self`]), except while its start-up calibration sets `Knob::SelfTraced`. Programs (kernel names are at most 15 bytes; all start with `llmprof_` so a listing finds them):
//! - `llmprof_sysent` / `llmprof_sysexit` (raw_syscalls:sys_enter/sys_exit): per-thread syscall aggregates,
//!   slow syscalls, and, dispatched on the syscall number at exit, model-file opens/reads/mmaps/closes,
//!   connects and bytes sent on connected sockets. One pair of tracepoints instead of one per syscall:
//!   the syscall's arguments are saved at entry and everything is decided at exit, where the result is known.
//! - `llmprof_pexit` (sched:sched_process_exit): the end of every traced process (removed from `TRACED`).
//! - `llmprof_fork` / `llmprof_exec` (task:task_newtask, sched:sched_process_exec; module `proc`): new
//!   processes of a traced tree enter `TRACED` before they run; exec'd programs are reported.
//! - `llmprof_step` / `llmprof_request` / `llmprof_range` (uprobes at the engine's probe NOPs): copy the
//!   engine's record with `bpf_probe_read_user` straight into the ring-buffer reservation.
//! - `llmprof_content` (uprobe at the engine's content probe, attached only with `--capture-content`):
//!   copies the record and up to `CONTENT_MAX` bytes of the text it points to.
//! - `llmprof_cuent` / `llmprof_curet` (uprobe / uretprobe at CUDA driver API entry points in libcuda; the
//!   attach cookie holds function, symbol variant and argument index): the entry pushes (time, cookie, that
//!   argument) on a small per-thread stack, the return pops it and writes one `CudaCallEvent`.
//! - `llmprof_gpu` (uprobe at the injected CUPTI helper's handoff function; module `gpu`): one chunk of GPU
//!   activity records per hit, copied into one `GpuChunkEvent`.
//! - `llmprof_pysample` (perf_event, software CPU clock; module `python`): the sampled thread's CPython
//!   frames, one `PyStackEvent` per sample.
//!
//! - `llmprof_skready` / `llmprof_skrecv` / `llmprof_skgone` (sock:sk_data_ready, sock:sock_recv_length,
//!   tcp:tcp_destroy_sock; module `http`): when a request's bytes arrived in the server's socket.
//! - `llmprof_tnew` / `llmprof_sswitch` / `llmprof_swaking` / `llmprof_swnew` (module `sched`): thread
//!   states of the traced threads and the tid → tgid map they need.
//! - `llmprof_sample` (perf_event, software CPU clock, one event per CPU; module `sample`): on-CPU stack
//!   samples of traced threads (kernel and user frames).
//!
//! Records go to one ring buffer (`EVENTS`) without wakeups (user space polls); every reservation failure
//! is counted in `COUNTERS` (per-CPU, indexed by `ProbeId`). This code must never loop unboundedly or keep
//! per-event state it does not free.
#![no_std]
#![no_main]

mod cudacount;
mod gpu;
mod http;
mod offcpu;
mod proc;
mod python;
mod sample;
mod sched;

use aya_ebpf::{
    EbpfContext, Global,
    bindings::BPF_RB_NO_WAKEUP,
    cty::c_void,
    helpers::{
        bpf_get_current_pid_tgid, bpf_get_smp_processor_id, bpf_ktime_get_boot_ns,
        bpf_probe_read_user_str_bytes,
        generated::{bpf_get_attach_cookie, bpf_probe_read_kernel, bpf_probe_read_user},
    },
    macros::{map, raw_tracepoint, tracepoint, uprobe, uretprobe},
    maps::{Array, HashMap, PerCpuArray, RingBuf},
    programs::{ProbeContext, RawTracePointContext, RetProbeContext, TracePointContext},
};
use aya_log_ebpf::warn;
use llmprof_abi::{
    ABI_VERSION, CONTENT_MAX, Config, ConnectEvent, ContentEvent, ContentRecord, CudaCallEvent, EventHeader,
    EventKind, FileIoEvent, FileOp, FileOpenEvent, FilePattern, Knob, LAT_BUCKETS, MAX_PATTERNS, NO_SYSCALL,
    NUM_KNOBS, NUM_PROBES, PATH_LEN, PATTERN_LEN, PatternKind, ProbeCounters, ProbeId, ProcessExitEvent,
    RangeEvent, RangeRecord, RequestEvent, SYSCALL_SLOTS, SlowSyscallEvent, SockKey, StepEvent, SyscallKey,
    SyscallSlot, SyscallStats, WIRE_DECODE_READ, WIRE_DECODE_WRITE,
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

/// Syscall aggregates per (pid, tid, nr).
#[map]
static SYSCALLS: HashMap<SyscallKey, SyscallStats> = HashMap::with_max_entries(16384, 0);

/// One slot per traced thread whose tid is below `SYSCALL_SLOTS`, at its tid: the syscall it is in
/// (entry time, number, and the arguments of the numbers that need them), updated in place at every entry
/// and marked consumed (`NO_SYSCALL`) at exit; claimed (its `tid` set) at a thread's first traced syscall,
/// freed when the thread exits (`llmprof_pexit`). An array entry is found without hashing (the verifier
/// inlines the lookup), which is most of what a fast call costs beside the clock.
#[map]
static SYSSLOTS: Array<Inflight> = Array::with_max_entries(SYSCALL_SLOTS, 0);

/// The same slots, by tid, for threads whose tid is `SYSCALL_SLOTS` or more (`kernel.pid_max` above it).
#[map]
static INFLIGHT: HashMap<u32, Inflight> = HashMap::with_max_entries(16384, 0);

/// Model-file fds being tracked, by (pid, fd).
#[map]
static FILES: HashMap<SockKey, u8> = HashMap::with_max_entries(4096, 0);

/// Sockets the target connected, by (pid, fd); removed at close.
#[map]
static CONNECTED: HashMap<SockKey, u8> = HashMap::with_max_entries(4096, 0);

/// Bytes sent per connected socket, by (pid, fd); kept after close so totals survive.
#[map]
static SENT: HashMap<SockKey, u64> = HashMap::with_max_entries(4096, 0);

/// Model-file path patterns, written by user space before attaching.
#[map]
static PATTERNS: Array<FilePattern> = Array::with_max_entries(MAX_PATTERNS as u32, 0);

/// Status passed to exit_group (or to exit by the main thread), by tgid, reported at sched_process_exit.
#[map]
static EXIT_CODES: HashMap<u32, i64> = HashMap::with_max_entries(1024, 0);

/// CUDA driver calls in flight per thread: at most this many nested (a driver entry point calling another
/// exported one); a deeper call replaces the stack (its frames belonged to calls whose return never came).
const CUDA_STACK: usize = 4;

/// One CUDA driver call between entry and return.
#[repr(C)]
#[derive(Clone, Copy)]
struct CudaFrame {
    ts_ns: u64,
    cookie: u64,
    arg: u64,
}

/// The CUDA driver calls a thread is inside, innermost last.
#[repr(C)]
#[derive(Clone, Copy)]
struct CudaStack {
    depth: u64,
    frames: [CudaFrame; CUDA_STACK],
}

/// CUDA calls in flight, by tid; an entry is removed when its thread's outermost call returns.
#[map]
static CUDA_INFLIGHT: HashMap<u32, CudaStack> = HashMap::with_max_entries(16384, 0);
/// Runtime knobs (`llmprof_abi::Knob`), written by user space while attached; zero = full tracing.
#[map]
static KNOBS: Array<u64> = Array::with_max_entries(NUM_KNOBS as u32, 0);

#[inline(always)]
fn knob(k: Knob) -> u64 {
    KNOBS.get(k as u32).copied().unwrap_or(0)
}

/// A syscall between entry and exit (layout shared with user space, which clears the slots).
type Inflight = SyscallSlot;

// x86-64 syscall numbers (arch/x86/entry/syscalls/syscall_64.tbl).
pub(crate) const NR_READ: u64 = 0;
const NR_WRITE: u64 = 1;
const NR_OPEN: u64 = 2;
const NR_CLOSE: u64 = 3;
const NR_MMAP: u64 = 9;
const NR_PREAD64: u64 = 17;
pub(crate) const NR_READV: u64 = 19;
const NR_WRITEV: u64 = 20;
const NR_CONNECT: u64 = 42;
const NR_ACCEPT: u64 = 43;
const NR_SENDTO: u64 = 44;
pub(crate) const NR_RECVFROM: u64 = 45;
const NR_SENDMSG: u64 = 46;
pub(crate) const NR_RECVMSG: u64 = 47;
const NR_ACCEPT4: u64 = 288;
const NR_EXIT: u64 = 60;
const NR_EXIT_GROUP: u64 = 231;
const NR_OPENAT: u64 = 257;
/// include/uapi/asm-generic/errno.h
const EINPROGRESS: i64 = 115;
/// include/linux/socket.h
const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;

// Tracepoint field offsets (/sys/kernel/tracing/events/*/*/format; stable ABI).
const SCHED_EXIT_GROUP_DEAD: usize = 32;
// x86-64 `struct pt_regs` (arch/x86/include/asm/ptrace.h), in 8-byte words: r15 r14 r13 r12 bp bx r11 r10
// r9 r8 ax cx dx si di orig_ax; the syscall arguments are di, si, dx, r10, r8, r9.
const PT_REGS_WORDS: usize = 16;
const REG_R10: usize = 7;
const REG_R9: usize = 8;
const REG_R8: usize = 9;
const REG_DX: usize = 12;
const REG_SI: usize = 13;
const REG_DI: usize = 14;

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

/// Whether the syscall `nr` needs its arguments at exit (model files, egress, exit status). Every other
/// syscall is timed and counted only: its entry writes two words, its exit reads them.
#[inline(always)]
fn needs_args(nr: u64) -> bool {
    matches!(
        nr,
        NR_READ
            | NR_WRITE
            | NR_OPEN
            | NR_CLOSE
            | NR_MMAP
            | NR_PREAD64
            | NR_READV
            | NR_WRITEV
            | NR_CONNECT
            | NR_SENDTO
            | NR_SENDMSG
            | NR_ACCEPT
            | NR_RECVFROM
            | NR_RECVMSG
            | NR_ACCEPT4
            | NR_EXIT
            | NR_EXIT_GROUP
            | NR_OPENAT
    )
}

/// The six syscall arguments from the `pt_regs` a raw sys_enter tracepoint passes (x86-64: rdi, rsi, rdx,
/// r10, r8, r9; `arch/x86/include/asm/ptrace.h`).
#[inline(always)]
fn syscall_args(regs: u64) -> [u64; 6] {
    let mut r = [0u64; PT_REGS_WORDS];
    // SAFETY: reads the kernel's pt_regs of this syscall into a stack array of the same size; a fault makes
    // the helper fail and leaves zeros.
    let rc = unsafe {
        bpf_probe_read_kernel(
            r.as_mut_ptr().cast::<c_void>(),
            (PT_REGS_WORDS * 8) as u32,
            regs as *const c_void,
        )
    };
    if rc != 0 {
        return [0; 6];
    }
    [r[REG_DI], r[REG_SI], r[REG_DX], r[REG_R10], r[REG_R8], r[REG_R9]]
}

/// Whether the thread `tid` keeps its syscall slot in `SYSSLOTS` (else in `INFLIGHT`).
#[inline(always)]
fn in_array(tid: u32) -> bool {
    tid < SYSCALL_SLOTS && tid < LLMPROF_CONFIG.load().slot_tids
}

/// The syscall slot of a traced thread: its `SYSSLOTS` entry when the entry is claimed by it, else its
/// `INFLIGHT` entry. `None` for a thread that has not made a traced syscall (or whose slot was freed).
#[inline(always)]
pub(crate) fn slot_of(tid: u32) -> Option<*mut Inflight> {
    if in_array(tid) {
        let a = SYSSLOTS.get_ptr_mut(tid)?;
        // SAFETY: a valid array entry; only the thread `tid` (and its exit) writes an entry at index `tid`.
        return (unsafe { (*a).tid } == tid).then_some(a);
    }
    INFLIGHT.get_ptr_mut(&tid)
}

/// The slot a syscall entry writes: the thread's own (a thread with a slot is traced: slots are only
/// claimed here, and freed when the thread exits or user space stops tracing its process), or a fresh one
/// when the thread's process is traced.
#[inline(always)]
fn entry_slot(tgid: u32, tid: u32) -> Option<*mut Inflight> {
    if is_self(tgid) {
        return None;
    }
    if let Some(s) = slot_of(tid) {
        return Some(s);
    }
    if !traced(tgid) {
        return None;
    }
    let fresh = Inflight {
        ts_ns: 0,
        nr: NO_SYSCALL,
        args: [0; 6],
        tid,
        pad: 0,
    };
    if in_array(tid) {
        let a = SYSSLOTS.get_ptr_mut(tid)?;
        // SAFETY: the entry at this thread's tid, written only by this thread and its exit.
        unsafe { *a = fresh };
        return Some(a);
    }
    if INFLIGHT.insert(&tid, &fresh, 0).is_err() {
        count(ProbeId::Syscalls, 0, 0, 1);
        return None;
    }
    INFLIGHT.get_ptr_mut(&tid)
}

/// Frees the syscall slot of an exiting thread.
#[inline(always)]
fn free_slot(tid: u32) {
    if in_array(tid) {
        if let Some(a) = SYSSLOTS.get_ptr_mut(tid) {
            // SAFETY: the entry at the exiting thread's tid; the thread makes no more syscalls.
            unsafe { (*a).tid = 0 };
        }
        return;
    }
    let _ = INFLIGHT.remove(&tid);
}

/// raw_syscalls:sys_enter (raw tracepoint: `(struct pt_regs *regs, long id)`) — the entry time and number
/// of a traced thread's syscall, written in place into the thread's slot; the arguments only for the
/// numbers [`needs_args`] names.
#[raw_tracepoint(tracepoint = "sys_enter")]
pub fn llmprof_sysent(ctx: RawTracePointContext) -> i32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let tid = pid_tgid as u32;
    let nr: u64 = ctx.arg(1);
    let Some(slot) = entry_slot(tgid, tid) else {
        return 0;
    };
    if needs_args(nr) {
        let args = syscall_args(ctx.arg(0));
        if nr == NR_EXIT_GROUP || (nr == NR_EXIT && tid == tgid) {
            let _ = EXIT_CODES.insert(&tgid, &(args[0] as i64), 0);
        }
        // SAFETY: a valid map value of this thread (the key is its tid); only this thread writes it.
        unsafe { (*slot).args = args };
    }
    let ts_ns = now();
    // SAFETY: see above.
    unsafe {
        (*slot).ts_ns = ts_ns;
        (*slot).nr = nr;
    }
    0
}

/// raw_syscalls:sys_exit (raw tracepoint: `(struct pt_regs *regs, long ret)`) — aggregates, slow syscalls,
/// then, for the numbers [`needs_args`] names, the syscall-specific records. The thread's slot is the
/// filter: only a traced thread's entry filled it, and the exit marks it consumed.
#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn llmprof_sysexit(ctx: RawTracePointContext) -> i32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    let Some(slot) = slot_of(tid) else {
        return 0;
    };
    // SAFETY: a valid map value of this thread; only this thread writes it.
    let (ts_ns, nr) = unsafe { ((*slot).ts_ns, (*slot).nr) };
    if nr == NO_SYSCALL {
        return 0;
    }
    // SAFETY: see above.
    unsafe { (*slot).nr = NO_SYSCALL };
    let tgid = (pid_tgid >> 32) as u32;
    let end = now();
    let dur = end.saturating_sub(ts_ns);
    aggregate(tgid, tid, nr, dur);
    count(ProbeId::Syscalls, 1, 0, 0);
    let slow = dur >= LLMPROF_CONFIG.load().slow_syscall_ns;
    if !slow && !needs_args(nr) {
        return 0;
    }
    let ret: i64 = ctx.arg(1);
    // SAFETY: see above; copied out so the records below read a stable value.
    let inf = Inflight {
        ts_ns,
        nr,
        args: unsafe { (*slot).args },
        tid,
        pad: 0,
    };
    if slow && knob(Knob::SyscallEventsOff) == 0 {
        slow_syscall(pid_tgid, &inf, ret, dur);
    }
    match nr {
        // One call site for both opens: the pattern loops are verified once, not per caller.
        NR_OPENAT | NR_OPEN => {
            // openat(dfd, path, flags, mode) / open(path, flags, mode)
            let (path_ptr, flags) = if nr == NR_OPENAT {
                (inf.args[1], inf.args[2])
            } else {
                (inf.args[0], inf.args[1])
            };
            file_open(pid_tgid, &inf, path_ptr, flags as u32, ret, dur)
        }
        NR_READ => {
            file_io(pid_tgid, &inf, FileOp::Read, inf.args[2], ret, dur);
            http::decode_exit(&ctx, WIRE_DECODE_READ, pid_tgid, &inf, ret);
        }
        NR_PREAD64 => file_io(pid_tgid, &inf, FileOp::Pread, inf.args[2], ret, dur),
        NR_READV => {
            file_io(pid_tgid, &inf, FileOp::Readv, ret.max(0) as u64, ret, dur);
            http::decode_exit(&ctx, WIRE_DECODE_READ, pid_tgid, &inf, ret);
        }
        NR_RECVFROM | NR_RECVMSG => {
            http::decode_exit(&ctx, WIRE_DECODE_READ, pid_tgid, &inf, ret);
        }
        NR_MMAP => mmap(pid_tgid, &inf, ret, dur),
        NR_CLOSE => {
            close(pid_tgid, &inf, ret, dur);
            http::on_close(pid_tgid, inf.args[0]);
        }
        NR_CONNECT => connect(pid_tgid, &inf, ret, dur),
        NR_ACCEPT | NR_ACCEPT4 => {
            http::on_accept(tgid, inf.args[0], ret);
        }
        NR_WRITE | NR_WRITEV | NR_SENDTO | NR_SENDMSG => {
            sent(tgid, &inf, ret);
            http::decode_exit(&ctx, WIRE_DECODE_WRITE, pid_tgid, &inf, ret);
        }
        _ => {}
    }
    0
}

#[inline(always)]
fn aggregate(pid: u32, tid: u32, nr: u64, dur: u64) {
    let key = SyscallKey { pid, tid, nr };
    let mut p = SYSCALLS.get_ptr_mut(&key);
    if p.is_none() {
        let zero = SyscallStats {
            count: 0,
            total_ns: 0,
            hist: [0; LAT_BUCKETS],
        };
        let _ = SYSCALLS.insert(&key, &zero, 0);
        p = SYSCALLS.get_ptr_mut(&key);
    }
    let Some(s) = p else { return };
    let bucket = log2(dur).min(LAT_BUCKETS as u64 - 1) as usize;
    // SAFETY: a valid map value; one thread (the key's tid) writes it at a time.
    unsafe {
        (*s).count += 1;
        (*s).total_ns += dur;
        (*s).hist[bucket] += 1;
    }
}

/// floor(log2(v)), 0 for v < 2: a binary search over six constant shifts, unrolled (BPF has no clz).
#[inline(always)]
fn log2(mut v: u64) -> u64 {
    let mut r = 0;
    for shift in [32u64, 16, 8, 4, 2, 1] {
        if v >> shift != 0 {
            v >>= shift;
            r += shift;
        }
    }
    r
}

#[inline(always)]
fn slow_syscall(pid_tgid: u64, inf: &Inflight, ret: i64, dur: u64) {
    let Some(mut e) = EVENTS.reserve::<SlowSyscallEvent>(0) else {
        count(ProbeId::Syscalls, 0, 0, 1);
        return;
    };
    e.write(SlowSyscallEvent {
        hdr: header(EventKind::SlowSyscall, inf.ts_ns, pid_tgid),
        nr: inf.nr,
        ret,
        dur_ns: dur,
    });
    e.submit(BPF_RB_NO_WAKEUP as u64);
    count(ProbeId::Syscalls, 0, 1, 0);
}

#[inline(always)]
fn file_open(pid_tgid: u64, inf: &Inflight, path_ptr: u64, flags: u32, ret: i64, dur: u64) {
    let Some(mut e) = EVENTS.reserve::<FileOpenEvent>(0) else {
        count(ProbeId::FileOpen, 1, 0, 1);
        return;
    };
    let p = e.as_mut_ptr();
    // SAFETY: `p` points to a reserved ring-buffer slot of the right size; fields are written before submit.
    let path: &mut [u8; PATH_LEN] = unsafe { &mut (*p).path };
    // SAFETY: reads at most PATH_LEN bytes of user memory into the reservation; faults return an error.
    let n = match unsafe { bpf_probe_read_user_str_bytes(path_ptr as *const u8, path) } {
        Ok(s) => s.len(),
        Err(_) => {
            e.discard(0);
            return;
        }
    };
    if !matches_any(path, n) {
        e.discard(0);
        return;
    }
    // SAFETY: see above.
    unsafe {
        (*p).hdr = header(EventKind::FileOpen, inf.ts_ns, pid_tgid);
        (*p).ret = ret;
        (*p).dur_ns = dur;
        (*p).flags = flags;
        (*p)._pad = 0;
    }
    e.submit(BPF_RB_NO_WAKEUP as u64);
    count(ProbeId::FileOpen, 1, 1, 0);
    if ret >= 0 {
        let key = SockKey {
            pid: (pid_tgid >> 32) as u32,
            fd: ret as i32,
        };
        let _ = FILES.insert(&key, &1, 0);
    }
}

/// Whether `path[..n]` matches one of the configured patterns.
#[inline(always)]
fn matches_any(path: &[u8; PATH_LEN], n: usize) -> bool {
    for k in 0..MAX_PATTERNS as u32 {
        let Some(pat) = PATTERNS.get(k) else { continue };
        let len = (pat.len as usize) & (PATTERN_LEN * 2 - 1);
        if len == 0 || len > PATTERN_LEN || len > n {
            continue;
        }
        let start = if pat.kind == PatternKind::Suffix as u32 {
            n - len
        } else if pat.kind == PatternKind::Prefix as u32 {
            0
        } else {
            continue;
        };
        let mut ok = true;
        for i in 0..PATTERN_LEN {
            if i >= len {
                break;
            }
            if path[(start + i) & (PATH_LEN - 1)] != pat.bytes[i] {
                ok = false;
                break;
            }
        }
        if ok {
            return true;
        }
    }
    false
}

#[inline(always)]
fn tracked_file(pid_tgid: u64, fd: u64) -> Option<SockKey> {
    let key = SockKey {
        pid: (pid_tgid >> 32) as u32,
        fd: fd as i32,
    };
    // SAFETY: presence test only.
    unsafe { FILES.get(&key) }.map(|_| key)
}

#[inline(always)]
fn emit_file_io(pid_tgid: u64, inf: &Inflight, op: FileOp, fd: i32, len: u64, ret: i64, dur: u64) {
    let Some(mut e) = EVENTS.reserve::<FileIoEvent>(0) else {
        count(ProbeId::FileIo, 1, 0, 1);
        return;
    };
    e.write(FileIoEvent {
        hdr: header(EventKind::FileIo, inf.ts_ns, pid_tgid),
        op: op as u32,
        fd,
        ret,
        len,
        dur_ns: dur,
    });
    e.submit(BPF_RB_NO_WAKEUP as u64);
    count(ProbeId::FileIo, 1, 1, 0);
}

#[inline(always)]
fn file_io(pid_tgid: u64, inf: &Inflight, op: FileOp, len: u64, ret: i64, dur: u64) {
    if let Some(key) = tracked_file(pid_tgid, inf.args[0]) {
        emit_file_io(pid_tgid, inf, op, key.fd, len, ret, dur);
    }
}

#[inline(always)]
fn mmap(pid_tgid: u64, inf: &Inflight, ret: i64, dur: u64) {
    if let Some(key) = tracked_file(pid_tgid, inf.args[4]) {
        emit_file_io(pid_tgid, inf, FileOp::Mmap, key.fd, inf.args[1], ret, dur);
    }
}

#[inline(always)]
fn close(pid_tgid: u64, inf: &Inflight, ret: i64, dur: u64) {
    if let Some(key) = tracked_file(pid_tgid, inf.args[0]) {
        emit_file_io(pid_tgid, inf, FileOp::Close, key.fd, 0, ret, dur);
        let _ = FILES.remove(&key);
    }
    let key = SockKey {
        pid: (pid_tgid >> 32) as u32,
        fd: inf.args[0] as i32,
    };
    let _ = CONNECTED.remove(&key);
}

/// sockaddr_in / sockaddr_in6 prefix: family, port (network order), then the address
/// (IPv4 at offset 4; IPv6 at offset 8 after the flow info).
#[repr(C)]
#[derive(Clone, Copy)]
struct SockAddr {
    family: u16,
    port_be: u16,
    v4_or_flow: [u8; 4],
    v6: [u8; 16],
}

#[inline(always)]
fn connect(pid_tgid: u64, inf: &Inflight, ret: i64, dur: u64) {
    let addrlen = inf.args[2];
    if addrlen < 8 {
        return;
    }
    let mut sa = SockAddr {
        family: 0,
        port_be: 0,
        v4_or_flow: [0; 4],
        v6: [0; 16],
    };
    let want = if addrlen >= 24 { 24 } else { 8 };
    // SAFETY: reads `want` (<= size_of::<SockAddr>()) bytes of user memory into a stack value.
    let rc = unsafe {
        bpf_probe_read_user(
            (&mut sa as *mut SockAddr).cast::<c_void>(),
            want,
            inf.args[1] as *const c_void,
        )
    };
    if rc != 0 || (sa.family != AF_INET && sa.family != AF_INET6) {
        return;
    }
    let mut addr = [0u8; 16];
    if sa.family == AF_INET {
        addr[..4].copy_from_slice(&sa.v4_or_flow);
    } else {
        addr = sa.v6;
    }
    let fd = inf.args[0] as i32;
    let Some(mut e) = EVENTS.reserve::<ConnectEvent>(0) else {
        count(ProbeId::Connect, 1, 0, 1);
        return;
    };
    e.write(ConnectEvent {
        hdr: header(EventKind::Connect, inf.ts_ns, pid_tgid),
        ret,
        dur_ns: dur,
        fd,
        family: sa.family,
        port: u16::from_be(sa.port_be),
        addr,
        allowed: 0,
        _pad: [0; 7],
    });
    e.submit(BPF_RB_NO_WAKEUP as u64);
    count(ProbeId::Connect, 1, 1, 0);
    if ret == 0 || ret == -EINPROGRESS {
        let key = SockKey {
            pid: (pid_tgid >> 32) as u32,
            fd,
        };
        let _ = CONNECTED.insert(&key, &1, 0);
        let _ = SENT.insert(&key, &0, 0);
    }
}

#[inline(always)]
fn sent(tgid: u32, inf: &Inflight, ret: i64) {
    if ret <= 0 {
        return;
    }
    let key = SockKey {
        pid: tgid,
        fd: inf.args[0] as i32,
    };
    // SAFETY: presence test only.
    if unsafe { CONNECTED.get(&key) }.is_none() {
        return;
    }
    if let Some(p) = SENT.get_ptr_mut(&key) {
        // SAFETY: a valid map value. Not atomic (the bpfel target has no atomic RMW in `core`): two
        // threads sending on one socket at the same instant may lose one addition.
        unsafe { *p += ret as u64 };
        count(ProbeId::Send, 1, 0, 0);
    }
}

/// sched:sched_process_exit — a thread of a traced process exits (its syscall slot is freed); for the
/// last one, the process's end.
#[tracepoint]
pub fn llmprof_pexit(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if !traced(tgid) {
        // An untraced child of a traced process leaves the thread map here; a traced thread leaves it at
        // its last context switch (`sched::llmprof_sswitch`), which comes after this tracepoint.
        sched::forget_thread(pid_tgid as u32);
        return 0;
    }
    // Every exiting thread frees its syscall slot.
    free_slot(pid_tgid as u32);
    let group_dead: u8 = tp_field(&ctx, SCHED_EXIT_GROUP_DEAD);
    if group_dead == 0 {
        return 0;
    }
    // SAFETY: copied out before removal.
    let exit_code = unsafe { EXIT_CODES.get(&tgid) }.copied().unwrap_or(-1);
    let _ = EXIT_CODES.remove(&tgid);
    // The pid may be reused by an unrelated process.
    let _ = TRACED.remove(&tgid);
    let Some(mut e) = EVENTS.reserve::<ProcessExitEvent>(0) else {
        count(ProbeId::ProcessExit, 1, 0, 1);
        return 0;
    };
    e.write(ProcessExitEvent {
        hdr: header(EventKind::ProcessExit, now(), pid_tgid),
        exit_code,
    });
    // The last record of a process: wake the reader.
    e.submit(0);
    count(ProbeId::ProcessExit, 1, 1, 0);
    0
}

/// Writes a reserved `T` = an `EventHeader` of `kind` + the engine record the probe's first argument points to
/// (kept if it reads and its `abi_version` is ours); hits, records and drops are counted under `id`.
#[inline(always)]
fn engine_record<T: 'static>(ctx: &ProbeContext, id: ProbeId, kind: EventKind) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    if !traced((pid_tgid >> 32) as u32) {
        return 0;
    }
    let ts = now();
    let Some(src) = ctx.arg::<u64>(0) else { return 0 };
    let Some(mut e) = EVENTS.reserve::<T>(0) else {
        count(id, 1, 0, 1);
        return 0;
    };
    let base = e.as_mut_ptr().cast::<u8>();
    let hdr_len = core::mem::size_of::<EventHeader>();
    let rec_len = core::mem::size_of::<T>() - hdr_len;
    // SAFETY: the reservation holds a T = { EventHeader, record }; both writes stay inside it; the
    // record is read from user memory by the helper, which fails cleanly on a bad pointer.
    let rc = unsafe {
        base.cast::<EventHeader>().write(header(kind, ts, pid_tgid));
        bpf_probe_read_user(
            base.add(hdr_len).cast::<c_void>(),
            rec_len as u32,
            src as *const c_void,
        )
    };
    // SAFETY: the record was just written (rc == 0); its first field is the ABI version.
    let version = unsafe { base.add(hdr_len).cast::<u32>().read() };
    if rc != 0 || version != ABI_VERSION {
        e.discard(0);
        warn!(
            ctx,
            "llmprof: engine record rejected (read rc {}, abi {})", rc, version
        );
        count(id, 1, 0, 1);
        return 0;
    }
    e.submit(BPF_RB_NO_WAKEUP as u64);
    count(id, 1, 1, 0);
    0
}

/// Uprobe at `llmprof_probe_step`.
#[uprobe]
pub fn llmprof_step(ctx: ProbeContext) -> u32 {
    engine_record::<StepEvent>(&ctx, ProbeId::Step, EventKind::Step)
}

/// Uprobe at `llmprof_probe_request`.
#[uprobe]
pub fn llmprof_request(ctx: ProbeContext) -> u32 {
    engine_record::<RequestEvent>(&ctx, ProbeId::Request, EventKind::Request)
}

/// Uprobe at `llmprof_probe_range`. With `Knob::RangeSampleEvery` = N > 1, only ranges of steps
/// `step_id % N == 0` are sent; the others count as hits that were neither emitted nor dropped.
#[uprobe]
pub fn llmprof_range(ctx: ProbeContext) -> u32 {
    let every = knob(Knob::RangeSampleEvery);
    if every > 1 {
        if !traced((bpf_get_current_pid_tgid() >> 32) as u32) {
            return 0;
        }
        let Some(src) = ctx.arg::<u64>(0) else { return 0 };
        let mut step_id = 0u64;
        // SAFETY: reads 8 bytes of the engine's record (the step_id field) into a stack value; a bad
        // pointer makes the helper fail, and the range is then sent (and rejected) as without sampling.
        let rc = unsafe {
            bpf_probe_read_user(
                (&mut step_id as *mut u64).cast::<c_void>(),
                8,
                (src as usize + core::mem::offset_of!(RangeRecord, step_id)) as *const c_void,
            )
        };
        if rc == 0 && step_id % every != 0 {
            count(ProbeId::Range, 1, 0, 0);
            return 0;
        }
    }
    engine_record::<RangeEvent>(&ctx, ProbeId::Range, EventKind::Range)
}

/// The attach cookie of the running CUDA uprobe and the argument its index names (0 when none): the
/// argument registers of the x86-64 SysV ABI, read with volatile loads (a `match` over `ctx.arg(n)` is folded
/// by LLVM into one load at a computed context offset, which the verifier rejects).
#[inline(always)]
fn cuda_arg(ctx: &ProbeContext) -> (u64, u64) {
    // SAFETY: the helper only reads the cookie of the link this program runs for.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let regs = ctx.regs;
    // SAFETY: `regs` is the probe's pt_regs context pointer; fields are read at constant offsets.
    let args = unsafe {
        [
            core::ptr::read_volatile(&(*regs).rdi),
            core::ptr::read_volatile(&(*regs).rsi),
            core::ptr::read_volatile(&(*regs).rdx),
            core::ptr::read_volatile(&(*regs).rcx),
            core::ptr::read_volatile(&(*regs).r8),
            core::ptr::read_volatile(&(*regs).r9),
        ]
    };
    let idx = ((cookie >> 16) & 0xff) as usize;
    (cookie, if idx < args.len() { args[idx] } else { 0 })
}

/// Uprobe at the entry of an individually timed CUDA driver function: ends the thread's counted window
/// (`cudacount`), remembers when, which (cookie) and its cheap argument.
#[uprobe]
pub fn llmprof_cuent(ctx: ProbeContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    if !traced((pid_tgid >> 32) as u32) {
        return 0;
    }
    cudacount::flush(pid_tgid as u32);
    let ts_ns = now();
    let (cookie, arg) = cuda_arg(&ctx);
    let frame = CudaFrame { ts_ns, cookie, arg };
    let tid = pid_tgid as u32;
    match CUDA_INFLIGHT.get_ptr_mut(&tid) {
        Some(s) => {
            // SAFETY: a valid map value, written only by its own thread (the key is the tid).
            let overflow = unsafe {
                let mut d = (*s).depth;
                let overflow = d >= CUDA_STACK as u64;
                if overflow {
                    d = 0;
                }
                (*s).frames[(d as usize) & (CUDA_STACK - 1)] = frame;
                (*s).depth = d + 1;
                overflow
            };
            count(ProbeId::Cuda, 1, 0, u64::from(overflow));
        }
        None => {
            let empty = CudaFrame {
                ts_ns: 0,
                cookie: 0,
                arg: 0,
            };
            let stack = CudaStack {
                depth: 1,
                frames: [frame, empty, empty, empty],
            };
            let failed = CUDA_INFLIGHT.insert(&tid, &stack, 0).is_err();
            count(ProbeId::Cuda, 1, 0, u64::from(failed));
        }
    }
    0
}

/// Uretprobe of a CUDA driver function: pop the matching entry and write the call.
#[uretprobe]
pub fn llmprof_curet(ctx: RetProbeContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    if !traced((pid_tgid >> 32) as u32) {
        return 0;
    }
    let end = now();
    // SAFETY: as in `llmprof_cuent`.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let tid = pid_tgid as u32;
    let Some(s) = CUDA_INFLIGHT.get_ptr_mut(&tid) else {
        return 0;
    };
    // SAFETY: a valid map value of this thread; copied out before the entry may be removed.
    let (frame, depth, nested_same) = unsafe {
        let depth = (*s).depth;
        let mut found = CUDA_STACK;
        // Innermost frame of this function; frames above it are calls whose return never came.
        for i in (0..CUDA_STACK).rev() {
            if (i as u64) < depth && (*s).frames[i].cookie == cookie {
                found = i;
                break;
            }
        }
        if found == CUDA_STACK {
            return 0;
        }
        (*s).depth = found as u64;
        // A call nested in a call of the same function (an exported wrapper calling the implementation
        // that cuGetProcAddress hands out, both probed) is the outer call: only the outer one is written.
        let same_as_outer =
            found > 0 && ((*s).frames[(found - 1) & (CUDA_STACK - 1)].cookie & 0xff) == (cookie & 0xff);
        ((*s).frames[found], found, same_as_outer)
    };
    if depth == 0 {
        let _ = CUDA_INFLIGHT.remove(&tid);
    }
    if nested_same {
        return 0;
    }
    let result: u64 = ctx.ret();
    let Some(mut e) = EVENTS.reserve::<CudaCallEvent>(0) else {
        count(ProbeId::Cuda, 0, 0, 1);
        return 0;
    };
    e.write(CudaCallEvent {
        hdr: header(EventKind::CudaCall, frame.ts_ns, pid_tgid),
        func: (frame.cookie & 0xff) as u32,
        variant: ((frame.cookie >> 8) & 0xff) as u32,
        dur_ns: end.saturating_sub(frame.ts_ns),
        arg: frame.arg,
        result: result as u32,
        _pad: 0,
    });
    e.submit(BPF_RB_NO_WAKEUP as u64);
    count(ProbeId::Cuda, 0, 1, 0);
    0
}

/// Uprobe at `llmprof_probe_content`: the record, then the first `CONTENT_MAX` bytes of its text.
#[uprobe]
pub fn llmprof_content(ctx: ProbeContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    if !traced((pid_tgid >> 32) as u32) {
        return 0;
    }
    let ts = now();
    let Some(src) = ctx.arg::<u64>(0) else { return 0 };
    let Some(mut e) = EVENTS.reserve::<ContentEvent>(0) else {
        count(ProbeId::Content, 1, 0, 1);
        return 0;
    };
    let p = e.as_mut_ptr();
    // SAFETY: `p` is a reserved ContentEvent; every write stays inside it. The user reads go through the
    // helper, which fails cleanly on a bad pointer; the text length is clamped to the `data` array.
    let ok = unsafe {
        (&raw mut (*p).hdr).write(header(EventKind::Content, ts, pid_tgid));
        let rec = &raw mut (*p).rec;
        let rc = bpf_probe_read_user(
            rec.cast::<c_void>(),
            core::mem::size_of::<ContentRecord>() as u32,
            src as *const c_void,
        );
        if rc != 0 || (*rec).abi_version != ABI_VERSION {
            false
        } else {
            let n = if (*rec).len > CONTENT_MAX as u64 {
                CONTENT_MAX as u32
            } else {
                (*rec).len as u32
            };
            (&raw mut (*p).copied).write(n);
            (&raw mut (*p)._pad).write(0);
            n == 0
                || bpf_probe_read_user(
                    (&raw mut (*p).data).cast::<c_void>(),
                    n,
                    (*rec).ptr as *const c_void,
                ) == 0
        }
    };
    if !ok {
        e.discard(0);
        count(ProbeId::Content, 1, 0, 1);
        return 0;
    }
    e.submit(BPF_RB_NO_WAKEUP as u64);
    count(ProbeId::Content, 1, 1, 0);
    0
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
