//! The `cupti` family (`llmprof_abi::cupti`): the uprobe at the injected CUPTI helper's handoff function
//! (`GPU_HANDOFF`, a NOP5 function `fn(chunk: *const u8, len: u64)`). One hit per chunk, never one per kernel:
//! it copies the chunk (at most `GPU_CHUNK_MAX` bytes) into one `GpuChunkEvent`. A chunk longer than that, an
//! empty or unreadable one, or a full ring is a drop counted under `ProbeId::Cuda` (no ProbeId of its own: the
//! chunks are the CUDA probe's other source). User space reads the chunk (version, magic, records); nothing of
//! its format is checked here.

use aya_ebpf::{
    bindings::BPF_RB_NO_WAKEUP, cty::c_void, helpers::bpf_get_current_pid_tgid,
    helpers::generated::bpf_probe_read_user, macros::uprobe, programs::ProbeContext,
};
use llmprof_abi::{EventKind, GpuChunkEvent, ProbeId, cupti::GPU_CHUNK_MAX};

use crate::{EVENTS, count, header, now, traced};

/// Uprobe at `llmprof_gpu_activity(chunk, len)` in the helper library of a traced process.
#[uprobe]
pub fn llmprof_gpu(ctx: ProbeContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    if !traced((pid_tgid >> 32) as u32) {
        return 0;
    }
    let ts = now();
    let (Some(src), Some(len)) = (ctx.arg::<u64>(0), ctx.arg::<u64>(1)) else {
        return 0;
    };
    if len == 0 || len > GPU_CHUNK_MAX as u64 {
        count(ProbeId::Cuda, 1, 0, 1);
        return 0;
    }
    let Some(mut e) = EVENTS.reserve::<GpuChunkEvent>(0) else {
        count(ProbeId::Cuda, 1, 0, 1);
        return 0;
    };
    let p = e.as_mut_ptr();
    // Bounded for the verifier: 1 ..= GPU_CHUNK_MAX (checked above; the mask keeps it so after codegen).
    let n = (len as u32) & (2 * GPU_CHUNK_MAX as u32 - 1);
    let n = if n > GPU_CHUNK_MAX as u32 {
        GPU_CHUNK_MAX as u32
    } else {
        n
    };
    // SAFETY: `p` is a reserved GpuChunkEvent; every write stays inside it (`n` ≤ the `data` array). The chunk
    // is read from user memory by the helper, which fails cleanly on a bad pointer.
    let rc = unsafe {
        (&raw mut (*p).hdr).write(header(EventKind::GpuChunk, ts, pid_tgid));
        (&raw mut (*p).len).write(len);
        (&raw mut (*p).copied).write(n);
        (&raw mut (*p)._pad).write(0);
        bpf_probe_read_user((&raw mut (*p).data).cast::<c_void>(), n, src as *const c_void)
    };
    if rc != 0 {
        e.discard(0);
        count(ProbeId::Cuda, 1, 0, 1);
        return 0;
    }
    e.submit(BPF_RB_NO_WAKEUP as u64);
    count(ProbeId::Cuda, 1, 1, 0);
    0
}
