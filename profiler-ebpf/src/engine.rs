//! The `engine` family (`llmprof_abi::engine`): uprobes at the probe NOPs of an instrumented engine. Each copies
//! the engine's record with `bpf_probe_read_user` straight into the ring-buffer reservation, behind an
//! `EventHeader`, and keeps it only when it reads and carries our `ABI_VERSION` (else a counted drop).
//! `llmprof_content` (attached only with `--capture-content`) also copies up to `CONTENT_MAX` bytes of the text
//! the record points to.

use aya_ebpf::{
    bindings::BPF_RB_NO_WAKEUP,
    cty::c_void,
    helpers::{bpf_get_current_pid_tgid, generated::bpf_probe_read_user},
    macros::uprobe,
    programs::ProbeContext,
};
use llmprof_abi::{
    ABI_VERSION, CONTENT_MAX, ContentEvent, ContentRecord, EventHeader, EventKind, Knob, ProbeId, RangeEvent,
    RangeRecord, RequestEvent, StepEvent,
};

use crate::{EVENTS, count, header, knob, now, traced};

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
        crate::log::engine_record_rejected::<T>(ctx, rc, version);
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
