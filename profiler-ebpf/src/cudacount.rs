//! Counted CUDA driver calls (`llmprof_abi::cudacount`): the entry-only uprobe `llmprof_cucount` at the
//! launch-type functions counts calls (and copy bytes) per thread in `CUDA_COUNTS`, and writes a thread's
//! window as one `CudaCountEvent` when the window is over, or when the thread enters an individually timed
//! call (`flush`, called by `llmprof_cuent`). No return probe, no per-call record.

use aya_ebpf::{
    bindings::BPF_RB_NO_WAKEUP,
    helpers::bpf_probe_read_user,
    macros::{map, uprobe},
    maps::{HashMap, PerCpuArray},
    programs::ProbeContext,
};
use llmprof_abi::{
    EventKind, ProbeId,
    cudacount::{
        COUNT_WINDOW_NS, CountEnd, CudaCountEvent, CudaCountState, MAX_COUNTING_THREADS, counted_slot,
    },
};

use crate::{EVENTS, count, cuda_arg, header, now, traced};

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
    let pid_tgid = aya_ebpf::helpers::bpf_get_current_pid_tgid();
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
    let bytes = if (cookie >> 16) & 0xff == llmprof_abi::CUDA_NO_ARG {
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
