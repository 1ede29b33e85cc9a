//! The `syscalls` family (`llmprof_abi::syscalls`): `llmprof_sysent` / `llmprof_sysexit` on the raw
//! `raw_syscalls:sys_enter`/`sys_exit` tracepoints time every syscall of a traced thread, keep per-(pid, tid,
//! nr) aggregates and send the slow ones.
//!
//! Owns the per-thread syscall slots (`SYSSLOTS` by tid, `INFLIGHT` for larger tids): a thread's slot is
//! claimed at its first traced syscall and is then its filter. The entry saves the arguments of the numbers the
//! exit decodes (`llmprof_abi::syscalls::DECODED_SYSCALLS`); the exit, where the result is known, dispatches on
//! the number to the `files`, `egress` and `wire` families (and keeps the exit status for `proc`). Every call
//! costs one slot lookup and a clock read at each edge; nothing else unless it was slow or decoded.

use aya_ebpf::{
    bindings::BPF_RB_NO_WAKEUP,
    cty::c_void,
    helpers::{bpf_get_current_pid_tgid, generated::bpf_probe_read_kernel},
    macros::{map, raw_tracepoint},
    maps::{Array, HashMap},
    programs::RawTracePointContext,
};
use llmprof_abi::{
    EventKind, FileOp, Knob, LAT_BUCKETS, NO_SYSCALL, ProbeId, SYSCALL_SLOTS, SlowSyscallEvent, SyscallKey,
    SyscallSlot, SyscallStats, WIRE_DECODE_READ, WIRE_DECODE_WRITE,
    syscalls::{
        NR_ACCEPT, NR_ACCEPT4, NR_CLOSE, NR_CONNECT, NR_EXIT, NR_EXIT_GROUP, NR_MMAP, NR_OPEN, NR_OPENAT,
        NR_PREAD64, NR_READ, NR_READV, NR_RECVFROM, NR_RECVMSG, NR_SENDMSG, NR_SENDTO, NR_WRITE, NR_WRITEV,
        is_decoded,
    },
};

use crate::{EVENTS, LLMPROF_CONFIG, count, egress, files, header, is_self, knob, now, proc, traced, wire};

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

/// A syscall between entry and exit (layout shared with user space, which clears the slots).
pub(crate) type Inflight = SyscallSlot;

// x86-64 `struct pt_regs` (arch/x86/include/asm/ptrace.h), in 8-byte words: r15 r14 r13 r12 bp bx r11 r10
// r9 r8 ax cx dx si di orig_ax; the syscall arguments are di, si, dx, r10, r8, r9.
const PT_REGS_WORDS: usize = 16;
const REG_R10: usize = 7;
const REG_R9: usize = 8;
const REG_R8: usize = 9;
const REG_DX: usize = 12;
const REG_SI: usize = 13;
const REG_DI: usize = 14;

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
pub(crate) fn free_slot(tid: u32) {
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
/// numbers [`is_decoded`] names.
#[raw_tracepoint(tracepoint = "sys_enter")]
pub fn llmprof_sysent(ctx: RawTracePointContext) -> i32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let tid = pid_tgid as u32;
    let nr: u64 = ctx.arg(1);
    let Some(slot) = entry_slot(tgid, tid) else {
        return 0;
    };
    if is_decoded(nr) {
        let args = syscall_args(ctx.arg(0));
        if nr == NR_EXIT_GROUP || (nr == NR_EXIT && tid == tgid) {
            let _ = proc::EXIT_CODES.insert(&tgid, &(args[0] as i64), 0);
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
/// then, for the numbers [`is_decoded`] names, the syscall-specific records. The thread's slot is the
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
    if !slow && !is_decoded(nr) {
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
            files::open(pid_tgid, &inf, path_ptr, flags as u32, ret, dur)
        }
        NR_READ => {
            files::io(pid_tgid, &inf, FileOp::Read, inf.args[2], ret, dur);
            wire::decode_exit(&ctx, WIRE_DECODE_READ, pid_tgid, &inf, ret);
        }
        NR_PREAD64 => files::io(pid_tgid, &inf, FileOp::Pread, inf.args[2], ret, dur),
        NR_READV => {
            files::io(pid_tgid, &inf, FileOp::Readv, ret.max(0) as u64, ret, dur);
            wire::decode_exit(&ctx, WIRE_DECODE_READ, pid_tgid, &inf, ret);
        }
        NR_RECVFROM | NR_RECVMSG => {
            wire::decode_exit(&ctx, WIRE_DECODE_READ, pid_tgid, &inf, ret);
        }
        NR_MMAP => files::mmap(pid_tgid, &inf, ret, dur),
        NR_CLOSE => {
            files::close(pid_tgid, &inf, ret, dur);
            egress::forget(pid_tgid, &inf);
            wire::on_close(pid_tgid, inf.args[0]);
        }
        NR_CONNECT => egress::connect(pid_tgid, &inf, ret, dur),
        NR_ACCEPT | NR_ACCEPT4 => {
            wire::on_accept(tgid, inf.args[0], ret);
        }
        NR_WRITE | NR_WRITEV | NR_SENDTO | NR_SENDMSG => {
            egress::sent(tgid, &inf, ret);
            wire::decode_exit(&ctx, WIRE_DECODE_WRITE, pid_tgid, &inf, ret);
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
