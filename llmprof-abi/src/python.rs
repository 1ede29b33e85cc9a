//! The `python` family: CPython frames in stack samples, the layouts shared by the eBPF Python walker
//! (`profiler-ebpf/src/python.rs`) and user space (`profiler-user/src/python/`).
//!
//! User space finds CPython processes (the `_PyRuntime` symbol in the executable or a mapped libpython),
//! writes one [`PyOffsets`] per process (keyed by tgid) and the thread → `PyThreadState` address of each of
//! its threads (keyed by tid, refreshed while attached). At a sample, the walker follows the thread's
//! current frame chain and writes a [`PyStack`]: per frame the code object's address and the raw
//! instruction value, which user space turns into function, file and line by reading the process's memory.
//! Nothing here interprets a Python object: that stays in user space.

use crate::Family;

/// perf_event (software CPU clock), used only when the native sampler is off: one [`PyStackEvent`] per sample.
pub const PYSAMPLE_PROGRAM: &str = "llmprof_pysample";
/// [`PyOffsets`] of each Python process being sampled, by tgid; written by user space.
pub const PY_PROCS_MAP: &str = "PY_PROCS";
/// `PyThreadState` address of each thread of those processes, by tid; refreshed by user space.
pub const PY_THREADS_MAP: &str = "PY_THREADS";
/// Per-CPU scratch of one sample's record.
pub const PY_SCRATCH_MAP: &str = "PY_SCRATCH";
/// Every program of the family.
pub const PROGRAMS: [&str; 1] = [PYSAMPLE_PROGRAM];
/// Every map of the family.
pub const MAPS: [&str; 3] = [PY_PROCS_MAP, PY_THREADS_MAP, PY_SCRATCH_MAP];
/// The family's kernel names.
pub const FAMILY: Family = Family {
    name: "python",
    programs: &PROGRAMS,
    maps: &MAPS,
};

/// Most Python frames one sample keeps (innermost first); deeper stacks are cut and flagged
/// [`PY_STATUS_TRUNCATED`]. A power of two, so the kernel indexes `frames` with a mask.
pub const PY_MAX_FRAMES: usize = 64;

/// An offset that does not exist in this Python version.
pub const PY_NO_OFFSET: u32 = u32::MAX;

/// `PyOffsets::flags`: the frame chain holds shim frames owned by the C stack (3.12+,
/// `FRAME_OWNED_BY_CSTACK`), which the walker skips and which mark the frame above them as an entry frame.
pub const PY_LAYOUT_CSTACK_SHIMS: u32 = 1;
/// `PyOffsets::flags`: every frame is run by its own C eval call (3.10: `PyFrameObject` chains).
pub const PY_LAYOUT_ALL_ENTRY: u32 = 2;
/// `PyOffsets::flags`: the instruction field is a 4-byte `int` (3.10 `f_lasti`), not a pointer.
pub const PY_LAYOUT_INSTR_INT: u32 = 4;

/// `_PyInterpreterFrame.owner` value of a shim frame (`FRAME_OWNED_BY_CSTACK`, Include/internal/pycore_frame.h
/// of 3.12 and 3.13).
pub const PY_OWNER_CSTACK: u8 = 3;

/// Where the walker finds what it needs in one CPython version's structures (byte offsets).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyOffsets {
    /// `(major << 8) | minor`, e.g. `0x030b` for 3.11 (user space only; the kernel reads the offsets).
    pub version: u32,
    /// `PY_LAYOUT_*` bits.
    pub flags: u32,
    /// In `PyThreadState`: the current frame (3.10 `frame`, 3.13 `current_frame`) or the `cframe`
    /// pointer (3.11, 3.12; then [`PyOffsets::cframe_current`] applies).
    pub tstate_frame: u32,
    /// In `_PyCFrame`: `current_frame` (3.11, 3.12), or [`PY_NO_OFFSET`].
    pub cframe_current: u32,
    /// In the frame: the caller's frame (`f_back` in 3.10, `previous` since 3.11).
    pub frame_previous: u32,
    /// In the frame: the code object (`f_code`; `f_executable` in 3.13).
    pub frame_code: u32,
    /// In the frame: the instruction (`f_lasti` in 3.10, `prev_instr` in 3.11/3.12, `instr_ptr` in 3.13).
    pub frame_instr: u32,
    /// In the frame: `owner` (1 byte), or [`PY_NO_OFFSET`] (3.10).
    pub frame_owner: u32,
    /// In the frame: `is_entry` (1 byte, 3.11 only), or [`PY_NO_OFFSET`].
    pub frame_is_entry: u32,
    /// Zero.
    pub _pad: u32,
}

/// One Python frame of a sample.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyFrameRaw {
    /// Address of the frame's code object in the process.
    pub code: u64,
    /// The raw instruction field: 3.10 the `f_lasti` index (low 32 bits), 3.11+ the address of the
    /// instruction inside the code object's `co_code_adaptive`.
    pub instr: u64,
}

/// `PyStack::status`: the walk reached the outermost frame.
pub const PY_STATUS_OK: u32 = 0;
/// `PyStack::status`: the process is not a known Python process.
pub const PY_STATUS_NOT_PYTHON: u32 = 1;
/// `PyStack::status`: the thread has no known `PyThreadState` (not a Python thread, or not seen yet).
pub const PY_STATUS_NO_THREAD: u32 = 2;
/// `PyStack::status`: a read of the process's memory failed (paged out, or the chain changed under us).
pub const PY_STATUS_READ_FAILED: u32 = 3;
/// `PyStack::status` bit: more than [`PY_MAX_FRAMES`] frames; the outermost ones are missing.
pub const PY_STATUS_TRUNCATED: u32 = 0x100;

/// The Python stack of one thread at one instant, innermost frame first.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PyStack {
    /// Valid entries of `frames`.
    pub nframes: u32,
    /// `PY_STATUS_*`.
    pub status: u32,
    /// Bit i set: frame i is the first frame its C eval call (`_PyEval_EvalFrameDefault`) ran, i.e. the
    /// native eval frame that runs frames `..=i` (from the previous entry on) sits below frame i.
    pub entry_mask: u64,
    /// The frames, innermost first.
    pub frames: [PyFrameRaw; PY_MAX_FRAMES],
}

/// A Python stack sample (perf_event software CPU clock, program `llmprof_pysample`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PyStackEvent {
    /// Header ([`crate::EventKind::PyStack`]).
    pub hdr: crate::EventHeader,
    /// The stack.
    pub stack: PyStack,
}

const _: () = {
    assert!(PY_MAX_FRAMES.is_power_of_two() && PY_MAX_FRAMES <= 64);
    assert!(core::mem::size_of::<PyOffsets>() == 40);
    assert!(core::mem::size_of::<PyFrameRaw>() == 16);
    assert!(core::mem::size_of::<PyStack>() == 16 + 16 * PY_MAX_FRAMES);
    assert!(core::mem::size_of::<PyStackEvent>() == 24 + core::mem::size_of::<PyStack>());
};

#[cfg(feature = "user")]
mod pod {
    // SAFETY: #[repr(C)], Copy, integers only; every bit pattern is valid.
    unsafe impl aya::Pod for super::PyOffsets {}
}
