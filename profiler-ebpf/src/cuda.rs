//! The `cuda` family (`llmprof_abi::cuda`): uprobes on the CUDA driver API entry points of a traced process's
//! libcuda; the attach cookie (`CudaFunc::cookie`) holds the function, its symbol variant and the index of the
//! argument to record.
//!
//! Timed calls: `llmprof_cuent` (entry) pushes (time, cookie, argument) on the thread's small stack in
//! `CUDA_INFLIGHT`, `llmprof_curet` (return) pops it and writes one `CudaCallEvent`. Counted calls (the
//! launch-type functions, `llmprof_abi::cuda::COUNTED`): the entry-only `llmprof_cucount` counts calls (and
//! copy bytes) per thread in `CUDA_COUNTS` and writes a thread's window as one `CudaCountEvent` when the
//! window is over, or when the thread enters a timed call ([`flush`]). No loop but the bounded stack search.

use aya_ebpf::{
    EbpfContext,
    bindings::BPF_RB_NO_WAKEUP,
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_user, generated::bpf_get_attach_cookie},
    macros::{map, uprobe, uretprobe},
    maps::{HashMap, PerCpuArray},
    programs::{ProbeContext, RetProbeContext},
};
use llmprof_abi::{
    CUDA_NO_ARG, CudaCallEvent, EventKind, ProbeId,
    cuda::{COUNT_WINDOW_NS, CountEnd, CudaCountEvent, CudaCountState, MAX_COUNTING_THREADS, counted_slot},
};

use crate::{EVENTS, count, header, now, traced};

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
/// ([`flush`]), remembers when, which (cookie) and its cheap argument.
#[uprobe]
pub fn llmprof_cuent(ctx: ProbeContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    if !traced((pid_tgid >> 32) as u32) {
        return 0;
    }
    flush(pid_tgid as u32);
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

/// Counts in flight, by tid.
#[map]
static CUDA_COUNTS: HashMap<u32, CudaCountState> = HashMap::with_max_entries(MAX_COUNTING_THREADS, 0);

/// Per traced process: [start, end) of its libcuda's code. A counted function entered with a return address
/// inside it was called by the driver itself (an exported wrapper calling the implementation that
/// `cuGetProcAddress` hands out, both probed): the outer call was counted, this one is not.
#[map]
static CUDA_TEXT: HashMap<u32, [u64; 2]> = HashMap::with_max_entries(1024, 0);

/// Calls counted by `llmprof_cucount` (slot 0; user space sums the CPUs): what the self-accounting charges
/// at the counted cost, the rest of the `cuda` hits at the timed pair's.
#[map]
static CUDA_COUNTED: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Writes `s` as a window ending for `end` and clears it. A window the ring cannot take is lost: its calls
/// are counted as drops of `cuda`.
#[inline(always)]
fn write(s: *mut CudaCountState, tid: u32, end: CountEnd) {
    // SAFETY: `s` is a valid map value of this thread (the key is its tid); only this thread writes it.
    let st = unsafe { *s };
    if st.first_ns == 0 {
        return;
    }
    // SAFETY: as above.
    unsafe {
        (*s).first_ns = 0;
        (*s).bytes = 0;
        (*s).calls = [0; 8];
    }
    let pid_tgid = (u64::from(st.pid) << 32) | u64::from(tid);
    let Some(mut e) = EVENTS.reserve::<CudaCountEvent>(0) else {
        let lost: u32 = st.calls.iter().sum();
        count(ProbeId::Cuda, 0, 0, u64::from(lost));
        return;
    };
    e.write(CudaCountEvent {
        hdr: header(EventKind::CudaCount, st.first_ns, pid_tgid),
        last_ns: st.last_ns,
        bytes: st.bytes,
        calls: st.calls,
        end: end as u32,
        pad: 0,
    });
    e.submit(BPF_RB_NO_WAKEUP as u64);
    count(ProbeId::Cuda, 0, 1, 0);
}

/// The thread `tid` enters an individually timed CUDA call: its counts so far end there.
#[inline(always)]
pub fn flush(tid: u32) {
    if let Some(s) = CUDA_COUNTS.get_ptr_mut(&tid) {
        write(s, tid, CountEnd::Call);
    }
}

/// Whether the return address at the top of the stack (the probe sits on the function's first instruction)
/// lies in `pid`'s libcuda code.
#[inline(always)]
fn called_from_driver(ctx: &ProbeContext, pid: u32) -> bool {
    // SAFETY: the value is copied out of the map.
    let Some(text) = (unsafe { CUDA_TEXT.get(&pid) }).copied() else {
        return false;
    };
    let regs = ctx.regs;
    // SAFETY: `regs` is the probe's pt_regs context pointer; a field at a constant offset.
    let sp = unsafe { core::ptr::read_volatile(&(*regs).rsp) };
    // SAFETY: the helper reads user memory and fails cleanly on a bad address.
    let ret: u64 = match unsafe { bpf_probe_read_user(sp as *const u64) } {
        Ok(r) => r,
        Err(_) => return false,
    };
    ret >= text[0] && ret < text[1]
}

/// Entry-only uprobe at a counted CUDA driver function (cookie as for `llmprof_cuent`).
#[uprobe]
pub fn llmprof_cucount(ctx: ProbeContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let pid = (pid_tgid >> 32) as u32;
    if !traced(pid) {
        return 0;
    }
    let (cookie, arg) = cuda_arg(&ctx);
    let Some(slot) = counted_slot((cookie & 0xff) as u32) else {
        return 0;
    };
    if called_from_driver(&ctx, pid) {
        return 0;
    }
    // Only copies record an argument (their byte count); launches have none.
    let bytes = if (cookie >> 16) & 0xff == CUDA_NO_ARG {
        0
    } else {
        arg
    };
    let ts = now();
    let tid = pid_tgid as u32;
    if let Some(c) = CUDA_COUNTED.get_ptr_mut(0) {
        // SAFETY: this CPU's slot of a per-CPU array; uprobe programs do not nest on a CPU.
        unsafe { *c += 1 };
    }
    match CUDA_COUNTS.get_ptr_mut(&tid) {
        Some(s) => {
            // SAFETY: a valid map value of this thread; only this thread writes it.
            let stale = unsafe { (*s).first_ns != 0 && ts.saturating_sub((*s).first_ns) >= COUNT_WINDOW_NS };
            if stale {
                write(s, tid, CountEnd::Window);
            }
            // SAFETY: as above; `slot` < 8 (masked for the verifier).
            unsafe {
                if (*s).first_ns == 0 {
                    (*s).first_ns = ts;
                }
                (*s).last_ns = ts;
                (*s).bytes += bytes;
                (*s).calls[slot & 7] += 1;
                (*s).pid = pid;
            }
            count(ProbeId::Cuda, 1, 0, 0);
        }
        None => {
            let mut st = CudaCountState {
                first_ns: ts,
                last_ns: ts,
                bytes,
                calls: [0; 8],
                pid,
                pad: 0,
            };
            st.calls[slot & 7] = 1;
            let failed = CUDA_COUNTS.insert(&tid, &st, 0).is_err();
            count(ProbeId::Cuda, 1, 0, u64::from(failed));
        }
    }
    0
}
