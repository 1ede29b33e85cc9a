//! The `python` family (`llmprof_abi::python`): the CPython frame walker. At a sample, the sampled thread's
//! Python frames (code object + instruction), innermost first, read from the interpreter's own frame chain.
//!
//! Owns the maps user space fills for it (`PY_PROCS`: per-tgid offsets, `PY_THREADS`: tid →
//! `PyThreadState` address) and [`walk`], which any sampler calls with its output buffer; plus the
//! stand-alone sampler `llmprof_pysample` (perf_event, software CPU clock) that writes `PyStackEvent`s.
//! It never interprets a Python object (names, files and lines are user space's work) and loops at most
//! `PY_MAX_FRAMES` times.

use aya_ebpf::{
    bindings::BPF_RB_NO_WAKEUP,
    cty::c_void,
    helpers::{
        bpf_get_current_pid_tgid,
        generated::{bpf_loop, bpf_probe_read_user},
    },
    macros::{map, perf_event},
    maps::{HashMap, PerCpuArray},
    programs::PerfEventContext,
};
use llmprof_abi::{
    EventKind, Knob, ProbeId,
    python::{
        PY_LAYOUT_ALL_ENTRY, PY_LAYOUT_CSTACK_SHIMS, PY_LAYOUT_INSTR_INT, PY_MAX_FRAMES, PY_NO_OFFSET,
        PY_OWNER_CSTACK, PY_STATUS_NO_THREAD, PY_STATUS_NOT_PYTHON, PY_STATUS_OK, PY_STATUS_READ_FAILED,
        PY_STATUS_TRUNCATED, PyOffsets, PyStack, PyStackEvent,
    },
};

use crate::{EVENTS, count, header, knob, now};

/// Offsets of each Python process being sampled, by tgid (written by user space at attach).
#[map]
pub static PY_PROCS: HashMap<u32, PyOffsets> = HashMap::with_max_entries(256, 0);

/// `PyThreadState` address of each thread of those processes, by tid (user space walks the interpreter's
/// thread list and refreshes this while attached; a thread started since the last refresh has none yet).
#[map]
pub static PY_THREADS: HashMap<u32, u64> = HashMap::with_max_entries(16384, 0);

/// Frames the walker looks at beyond the ones it keeps: shim frames (3.12+) cost an iteration each.
const MAX_STEPS: usize = PY_MAX_FRAMES + 16;

#[inline(always)]
fn read_u64(addr: u64) -> Option<u64> {
    let mut v = 0u64;
    // SAFETY: reads 8 bytes of the current task's user memory into a stack value; the helper fails cleanly
    // on an unmapped or paged-out address.
    let rc = unsafe { bpf_probe_read_user((&mut v as *mut u64).cast::<c_void>(), 8, addr as *const c_void) };
    (rc == 0).then_some(v)
}

#[inline(always)]
fn read_u8(addr: u64) -> Option<u8> {
    let mut v = 0u8;
    // SAFETY: as in `read_u64`, one byte.
    let rc = unsafe { bpf_probe_read_user((&mut v as *mut u8).cast::<c_void>(), 1, addr as *const c_void) };
    (rc == 0).then_some(v)
}

/// The walk's state between `bpf_loop` iterations (on the caller's stack; the callback gets a pointer).
#[repr(C)]
struct Walk {
    off: PyOffsets,
    out: *mut PyStack,
    frame: u64,
    n: u64,
    status: u32,
    _pad: u32,
}

/// One step of the walk (a `bpf_loop` callback, so the verifier checks one iteration, not
/// `MAX_STEPS`): keeps the current frame, or skips it when it is a shim, and moves to its caller.
/// Returns 1 to stop.
#[inline(never)]
extern "C" fn step(_index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `ctx` is the `Walk` that `walk` passed to `bpf_loop`, on its stack, alive for the loop.
    let w = unsafe { &mut *ctx.cast::<Walk>() };
    let frame = w.frame;
    if frame == 0 {
        return 1;
    }
    let off = &w.off;
    if w.n >= PY_MAX_FRAMES as u64 {
        w.status |= PY_STATUS_TRUNCATED;
        return 1;
    }
    let Some(prev) = read_u64(frame + off.frame_previous as u64) else {
        w.status = PY_STATUS_READ_FAILED;
        return 1;
    };
    let out = w.out;
    if off.flags & PY_LAYOUT_CSTACK_SHIMS != 0 {
        let owner = read_u8(frame + off.frame_owner as u64).unwrap_or(0);
        if owner == PY_OWNER_CSTACK {
            // The shim a C eval call pushes below its first frame: that frame (the last kept) is an entry.
            if w.n > 0 {
                // SAFETY: `out` is the caller's output buffer, valid for the whole walk.
                unsafe { (*out).entry_mask |= 1u64 << ((w.n - 1) & (PY_MAX_FRAMES as u64 - 1)) };
            }
            w.frame = prev;
            return 0;
        }
    }
    let (Some(code), Some(mut instr)) = (
        read_u64(frame + off.frame_code as u64),
        read_u64(frame + off.frame_instr as u64),
    ) else {
        w.status = PY_STATUS_READ_FAILED;
        return 1;
    };
    if off.flags & PY_LAYOUT_INSTR_INT != 0 {
        instr &= 0xffff_ffff;
    }
    let i = (w.n & (PY_MAX_FRAMES as u64 - 1)) as usize;
    let entry = off.flags & PY_LAYOUT_ALL_ENTRY != 0
        || (off.frame_is_entry != PY_NO_OFFSET
            && read_u8(frame + off.frame_is_entry as u64).unwrap_or(0) != 0);
    // SAFETY: as above; `i` is masked to the array.
    unsafe {
        (*out).frames[i].code = code;
        (*out).frames[i].instr = instr;
        if entry {
            (*out).entry_mask |= 1u64 << i;
        }
    }
    w.n += 1;
    w.frame = prev;
    0
}

/// Walks the Python frames of the current thread (`pid_tgid` from `bpf_get_current_pid_tgid`) into `out`:
/// innermost first, at most `PY_MAX_FRAMES`, with `out.status` saying how it ended. Returns whether the
/// process is a Python process being sampled (false: `out` says `PY_STATUS_NOT_PYTHON`, nothing read).
/// Cost: two hash lookups, then 3–4 `bpf_probe_read_user` per frame, in a `bpf_loop` (kernel 5.17+).
/// This is the hook a native stack sampler calls in its own perf_event program (its record embeds a
/// `PyStack`; `out` must stay valid for the call, e.g. a per-CPU scratch map value).
#[inline(always)]
pub fn walk(pid_tgid: u64, out: *mut PyStack) -> bool {
    // SAFETY: the caller passes a valid, exclusive `PyStack`.
    let o = unsafe { &mut *out };
    o.nframes = 0;
    o.entry_mask = 0;
    let tgid = (pid_tgid >> 32) as u32;
    let tid = pid_tgid as u32;
    // SAFETY: copied out of the map value at once.
    let Some(off) = (unsafe { PY_PROCS.get(&tgid) }).copied() else {
        o.status = PY_STATUS_NOT_PYTHON;
        return false;
    };
    // SAFETY: as above.
    let Some(tstate) = (unsafe { PY_THREADS.get(&tid) }).copied() else {
        o.status = PY_STATUS_NO_THREAD;
        return true;
    };
    let Some(mut frame) = read_u64(tstate + off.tstate_frame as u64) else {
        o.status = PY_STATUS_READ_FAILED;
        return true;
    };
    if off.cframe_current != PY_NO_OFFSET && frame != 0 {
        match read_u64(frame + off.cframe_current as u64) {
            Some(f) => frame = f,
            None => {
                o.status = PY_STATUS_READ_FAILED;
                return true;
            }
        }
    }
    let mut w = Walk {
        off,
        out,
        frame,
        n: 0,
        status: PY_STATUS_OK,
        _pad: 0,
    };
    // SAFETY: `step` is a BPF callback of the signature bpf_loop expects; `w` outlives the loop.
    unsafe {
        bpf_loop(
            MAX_STEPS as u32,
            step as *mut c_void,
            (&mut w as *mut Walk).cast::<c_void>(),
            0,
        )
    };
    o.nframes = w.n as u32;
    o.status = w.status;
    true
}

/// Scratch for one sample's record (too large for the 512-byte BPF stack), per CPU.
#[map]
static PY_SCRATCH: PerCpuArray<PyStackEvent> = PerCpuArray::with_max_entries(1, 0);

/// Writes one `PyStackEvent` for the running thread at `ts` when its process is a sampled Python process:
/// called by the native stack sampler (`stacks::llmprof_sample`) right after its own record of the same
/// instant, so user space joins the two by (tid, ts), and by the stand-alone `llmprof_pysample`. Other
/// processes cost one hash lookup.
#[inline(always)]
pub fn emit(pid_tgid: u64, ts: u64) {
    let tgid = (pid_tgid >> 32) as u32;
    // SAFETY: presence test only.
    if unsafe { PY_PROCS.get(&tgid) }.is_none() {
        return;
    }
    if knob(Knob::PySamplesOff) != 0 {
        count(ProbeId::PyStack, 1, 0, 0);
        return;
    }
    let Some(e) = PY_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: `e` is this CPU's scratch slot; a perf_event program does not nest on a CPU.
    unsafe {
        (&raw mut (*e).hdr).write(header(EventKind::PyStack, ts, pid_tgid));
        walk(pid_tgid, &raw mut (*e).stack);
    }
    // SAFETY: as above; read only for the copy into the ring.
    let rec = unsafe { &*e };
    if EVENTS
        .output::<PyStackEvent>(rec, BPF_RB_NO_WAKEUP as u64)
        .is_err()
    {
        count(ProbeId::PyStack, 1, 0, 1);
        return;
    }
    count(ProbeId::PyStack, 1, 1, 0);
}

/// perf_event (software CPU clock, one per CPU), used only when the native stack sampler is off: one
/// `PyStackEvent` per sample of a thread of a Python process being sampled.
#[perf_event]
pub fn llmprof_pysample(_ctx: PerfEventContext) -> u32 {
    emit(bpf_get_current_pid_tgid(), now());
    0
}
