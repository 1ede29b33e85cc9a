//! The `cuda` family: CUDA driver API calls of a traced thread, seen by uprobes on the exported entry points
//! of its libcuda (and those `cuGetProcAddress` hands out).
//!
//! Calls that make the host wait (synchronize, blocking copies, alloc/free) are timed one by one: an entry and a
//! return uprobe, paired per thread in the kernel, write one [`CudaCallEvent`] per call. The attach cookie
//! ([`CudaFunc::cookie`]) tells the programs which function, symbol variant and argument they run for.
//!
//! Launch-type calls are counted instead: a kernel launch or an asynchronous copy returns in microseconds and
//! does not wait for the GPU; timing each one with an entry + return uprobe pair (the int3 path and the
//! uretprobe trampoline) cost 7–10 µs per call on the H200, more than the call itself. So by default those
//! [`COUNTED`] functions get an entry-only uprobe (`llmprof_cucount`) that only counts, per thread, in the
//! kernel: calls per function and the bytes of the copies. A thread's counts are written as one
//! [`CudaCountEvent`] when its window ends: at its first counted call [`COUNT_WINDOW_NS`] or more after the
//! window began ([`CountEnd::Window`]), at the entry of any individually timed call on the same thread (a
//! synchronize, a blocking copy, an alloc/free: [`CountEnd::Call`], so an engine step's launches end at the
//! step's copy of results), or when llmprof reads the leftovers at the end of the session
//! ([`CountEnd::Flush`]). The calls that block the host keep the entry + return pair and their own slices;
//! `--cuda-calls all` puts every function back on the pair.
//!
//! Not part of the engine ABI: no [`crate::ABI_VERSION`] change.

use crate::{EventHeader, Family};

/// Uprobe at the entry of a timed function: pushes (time, cookie, argument) on the thread's stack.
pub const CUENT_PROGRAM: &str = "llmprof_cuent";
/// Uretprobe of a timed function: pops the entry and writes a [`CudaCallEvent`].
pub const CURET_PROGRAM: &str = "llmprof_curet";
/// Entry-only uprobe at a [`COUNTED`] function: counts per thread ([`CudaCountEvent`] per window).
pub const CUCOUNT_PROGRAM: &str = "llmprof_cucount";
/// Timed calls in flight, by tid (a small stack per thread).
pub const CUDA_INFLIGHT_MAP: &str = "CUDA_INFLIGHT";
/// Counts in flight ([`CudaCountState`]), by tid; user space reads the leftovers at the end.
pub const CUDA_COUNTS_MAP: &str = "CUDA_COUNTS";
/// Per traced process: [start, end) of its libcuda's code, written by user space.
pub const CUDA_TEXT_MAP: &str = "CUDA_TEXT";
/// Calls counted by the counting program (per CPU, slot 0), for the self-accounting.
pub const CUDA_COUNTED_MAP: &str = "CUDA_COUNTED";
/// Every program of the family.
pub const PROGRAMS: [&str; 3] = [CUENT_PROGRAM, CURET_PROGRAM, CUCOUNT_PROGRAM];
/// Every map of the family.
pub const MAPS: [&str; 4] = [
    CUDA_INFLIGHT_MAP,
    CUDA_COUNTS_MAP,
    CUDA_TEXT_MAP,
    CUDA_COUNTED_MAP,
];
/// The family's kernel names.
pub const FAMILY: Family = Family {
    name: "cuda",
    programs: &PROGRAMS,
    maps: &MAPS,
};

/// A CUDA driver API call of a traced thread, recorded at its return (entry and return uprobes in libcuda,
/// paired per thread in the kernel). The times are the host thread's time inside the driver call (enqueue,
/// or waiting for the GPU in the synchronize calls), not kernel execution on the GPU.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CudaCallEvent {
    /// Header ([`crate::EventKind::CudaCall`]); `ts_ns` is the call's entry time.
    pub hdr: EventHeader,
    /// [`CudaFunc`] as u32.
    pub func: u32,
    /// [`CudaVariant`] as u32: which exported symbol of the function was called.
    pub variant: u32,
    /// Time in the call (entry to return), ns.
    pub dur_ns: u64,
    /// The argument [`CudaFunc::arg`] names (bytes, device pointer or stream), 0 when it has none.
    pub arg: u64,
    /// The returned `CUresult` (0 = CUDA_SUCCESS).
    pub result: u32,
    /// Reserved, zero.
    pub _pad: u32,
}

/// CUDA driver API functions llmprof attaches to in libcuda (append only: the value is in records).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CudaFunc {
    /// `cuLaunchKernel`.
    LaunchKernel = 0,
    /// `cuLaunchKernelEx`.
    LaunchKernelEx = 1,
    /// `cuGraphLaunch`.
    GraphLaunch = 2,
    /// `cuMemcpy`.
    Memcpy = 3,
    /// `cuMemcpyAsync`.
    MemcpyAsync = 4,
    /// `cuMemcpyHtoD`.
    MemcpyHtoD = 5,
    /// `cuMemcpyHtoDAsync`.
    MemcpyHtoDAsync = 6,
    /// `cuMemcpyDtoH`.
    MemcpyDtoH = 7,
    /// `cuMemcpyDtoHAsync`.
    MemcpyDtoHAsync = 8,
    /// `cuMemcpyDtoD`.
    MemcpyDtoD = 9,
    /// `cuMemcpyDtoDAsync`.
    MemcpyDtoDAsync = 10,
    /// `cuMemcpyPeer`.
    MemcpyPeer = 11,
    /// `cuMemcpyPeerAsync`.
    MemcpyPeerAsync = 12,
    /// `cuMemAlloc`.
    MemAlloc = 13,
    /// `cuMemFree`.
    MemFree = 14,
    /// `cuStreamSynchronize`.
    StreamSynchronize = 15,
    /// `cuCtxSynchronize`.
    CtxSynchronize = 16,
    /// `cuEventSynchronize`.
    EventSynchronize = 17,
}

/// What the recorded argument of a [`CudaFunc`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CudaArg {
    /// A byte count (`ByteCount`, `bytesize`).
    Bytes,
    /// A device pointer (`cuMemFree`'s `dptr`).
    DevicePtr,
    /// A stream handle (`cuStreamSynchronize`'s `hStream`).
    Stream,
}

/// How llmprof shows a [`CudaFunc`] call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CudaClass {
    /// Kernel and graph launches: aggregated (per engine step, or per time window).
    Launch,
    /// Copies.
    Memcpy,
    /// Allocation and free.
    Alloc,
    /// Synchronize calls, where the host waits for the GPU: always shown one by one.
    Sync,
}

impl CudaFunc {
    /// Every function, in value order.
    pub const ALL: [CudaFunc; 18] = [
        Self::LaunchKernel,
        Self::LaunchKernelEx,
        Self::GraphLaunch,
        Self::Memcpy,
        Self::MemcpyAsync,
        Self::MemcpyHtoD,
        Self::MemcpyHtoDAsync,
        Self::MemcpyDtoH,
        Self::MemcpyDtoHAsync,
        Self::MemcpyDtoD,
        Self::MemcpyDtoDAsync,
        Self::MemcpyPeer,
        Self::MemcpyPeerAsync,
        Self::MemAlloc,
        Self::MemFree,
        Self::StreamSynchronize,
        Self::CtxSynchronize,
        Self::EventSynchronize,
    ];

    /// Decodes [`CudaCallEvent::func`].
    pub fn from_raw(v: u32) -> Option<Self> {
        Self::ALL.get(v as usize).copied()
    }

    /// The driver API name without version suffix (`cuMemcpyHtoD`).
    pub fn name(self) -> &'static str {
        match self {
            Self::LaunchKernel => "cuLaunchKernel",
            Self::LaunchKernelEx => "cuLaunchKernelEx",
            Self::GraphLaunch => "cuGraphLaunch",
            Self::Memcpy => "cuMemcpy",
            Self::MemcpyAsync => "cuMemcpyAsync",
            Self::MemcpyHtoD => "cuMemcpyHtoD",
            Self::MemcpyHtoDAsync => "cuMemcpyHtoDAsync",
            Self::MemcpyDtoH => "cuMemcpyDtoH",
            Self::MemcpyDtoHAsync => "cuMemcpyDtoHAsync",
            Self::MemcpyDtoD => "cuMemcpyDtoD",
            Self::MemcpyDtoDAsync => "cuMemcpyDtoDAsync",
            Self::MemcpyPeer => "cuMemcpyPeer",
            Self::MemcpyPeerAsync => "cuMemcpyPeerAsync",
            Self::MemAlloc => "cuMemAlloc",
            Self::MemFree => "cuMemFree",
            Self::StreamSynchronize => "cuStreamSynchronize",
            Self::CtxSynchronize => "cuCtxSynchronize",
            Self::EventSynchronize => "cuEventSynchronize",
        }
    }

    /// The argument recorded at entry: its index in the C signature (x86-64 SysV: register) and meaning.
    pub fn arg(self) -> Option<(u8, CudaArg)> {
        match self {
            Self::Memcpy
            | Self::MemcpyAsync
            | Self::MemcpyHtoD
            | Self::MemcpyHtoDAsync
            | Self::MemcpyDtoH
            | Self::MemcpyDtoHAsync
            | Self::MemcpyDtoD
            | Self::MemcpyDtoDAsync => Some((2, CudaArg::Bytes)),
            // cuMemcpyPeer(dst, dstCtx, src, srcCtx, ByteCount[, hStream])
            Self::MemcpyPeer | Self::MemcpyPeerAsync => Some((4, CudaArg::Bytes)),
            // cuMemAlloc(CUdeviceptr *dptr, size_t bytesize)
            Self::MemAlloc => Some((1, CudaArg::Bytes)),
            Self::MemFree => Some((0, CudaArg::DevicePtr)),
            Self::StreamSynchronize => Some((0, CudaArg::Stream)),
            _ => None,
        }
    }

    /// How the call is shown.
    pub fn class(self) -> CudaClass {
        match self {
            Self::LaunchKernel | Self::LaunchKernelEx | Self::GraphLaunch => CudaClass::Launch,
            Self::MemAlloc | Self::MemFree => CudaClass::Alloc,
            Self::StreamSynchronize | Self::CtxSynchronize | Self::EventSynchronize => CudaClass::Sync,
            _ => CudaClass::Memcpy,
        }
    }

    /// Attach cookie of this function's uprobes: `func | variant << 8 | arg index << 16` (index
    /// [`CUDA_NO_ARG`] when the function has no recorded argument). The eBPF programs read the argument
    /// index from it and copy `func` and `variant` into the [`CudaCallEvent`].
    pub fn cookie(self, variant: CudaVariant) -> u64 {
        let idx = self.arg().map(|(i, _)| u64::from(i)).unwrap_or(CUDA_NO_ARG);
        self as u64 | (variant as u64) << 8 | idx << 16
    }
}

/// Argument index in a CUDA uprobe cookie meaning "record no argument".
pub const CUDA_NO_ARG: u64 = 0xff;

/// Which exported symbol of a [`CudaFunc`]: libcuda exports several per function (the `_v2` ABI revisions and
/// the per-thread default stream `_ptds`/`_ptsz` entry points), all attached.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CudaVariant {
    /// The plain name.
    Plain = 0,
    /// `_v2`.
    V2 = 1,
    /// `_ptds` (per-thread default stream, synchronous calls).
    Ptds = 2,
    /// `_ptsz` (per-thread default stream, asynchronous calls).
    Ptsz = 3,
    /// `_v2_ptds`.
    V2Ptds = 4,
    /// `_v2_ptsz`.
    V2Ptsz = 5,
    /// An entry point `cuGetProcAddress` hands out that no exported symbol names (how cudart, and so
    /// PyTorch, reaches the driver).
    ProcAddress = 6,
}

impl CudaVariant {
    /// Every variant, in value order.
    pub const ALL: [CudaVariant; 7] = [
        Self::Plain,
        Self::V2,
        Self::Ptds,
        Self::Ptsz,
        Self::V2Ptds,
        Self::V2Ptsz,
        Self::ProcAddress,
    ];
    /// The variants that are exported symbol names (all but [`CudaVariant::ProcAddress`]).
    pub const SYMBOLS: [CudaVariant; 6] = [
        Self::Plain,
        Self::V2,
        Self::Ptds,
        Self::Ptsz,
        Self::V2Ptds,
        Self::V2Ptsz,
    ];
    /// Decodes [`CudaCallEvent::variant`].
    pub fn from_raw(v: u32) -> Option<Self> {
        Self::ALL.get(v as usize).copied()
    }
    /// The symbol suffix (`""`, `"_v2"`, `"_ptds"`, ...; for [`CudaVariant::ProcAddress`] a note).
    pub fn suffix(self) -> &'static str {
        match self {
            Self::Plain => "",
            Self::V2 => "_v2",
            Self::Ptds => "_ptds",
            Self::Ptsz => "_ptsz",
            Self::V2Ptds => "_v2_ptds",
            Self::V2Ptsz => "_v2_ptsz",
            Self::ProcAddress => " (via cuGetProcAddress)",
        }
    }
}

/// The functions counted instead of timed, in slot order ([`CudaCountEvent::calls`]).
pub const COUNTED: [CudaFunc; 8] = [
    CudaFunc::LaunchKernel,
    CudaFunc::LaunchKernelEx,
    CudaFunc::GraphLaunch,
    CudaFunc::MemcpyAsync,
    CudaFunc::MemcpyHtoDAsync,
    CudaFunc::MemcpyDtoHAsync,
    CudaFunc::MemcpyDtoDAsync,
    CudaFunc::MemcpyPeerAsync,
];

/// Window of a thread's counts (a decode step of a launch-bound engine, or less).
pub const COUNT_WINDOW_NS: u64 = 10_000_000;

/// Most threads with counts in flight (the kernel map); a thread past it is not counted (drops of `cuda`).
pub const MAX_COUNTING_THREADS: u32 = 4096;

/// The slot of `func` in [`COUNTED`] from its raw value ([`CudaFunc`] as u32), if it is counted.
pub const fn counted_slot(raw_func: u32) -> Option<usize> {
    match raw_func {
        0 => Some(0),
        1 => Some(1),
        2 => Some(2),
        4 => Some(3),
        6 => Some(4),
        8 => Some(5),
        10 => Some(6),
        12 => Some(7),
        _ => None,
    }
}

/// Why a window of counts was written.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CountEnd {
    /// The thread's next counted call came [`COUNT_WINDOW_NS`] or more after the window began.
    Window = 0,
    /// An individually timed CUDA call of the same thread began.
    Call = 1,
    /// llmprof read what was left at the end of the session.
    Flush = 2,
}

impl CountEnd {
    /// Decodes [`CudaCountEvent::end`].
    pub fn from_raw(v: u32) -> Option<Self> {
        match v {
            0 => Some(Self::Window),
            1 => Some(Self::Call),
            2 => Some(Self::Flush),
            _ => None,
        }
    }
}

/// A thread's counts in flight (kernel map value, by tid; also what llmprof reads at the end).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CudaCountState {
    /// Entry of the window's first call, BOOTTIME ns (0: no call counted since the last write).
    pub first_ns: u64,
    /// Entry of its last call.
    pub last_ns: u64,
    /// Bytes of the counted copies.
    pub bytes: u64,
    /// Calls per [`COUNTED`] slot.
    pub calls: [u32; 8],
    /// Process (tgid) of the thread.
    pub pid: u32,
    /// Always 0.
    pub pad: u32,
}

/// One window of a thread's counted calls. Header: `ts_ns` the entry of its first call, `pid`/`tid` the
/// thread.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CudaCountEvent {
    /// Header ([`crate::EventKind::CudaCount`]).
    pub hdr: EventHeader,
    /// Entry of the window's last call, BOOTTIME ns.
    pub last_ns: u64,
    /// Bytes of the counted copies.
    pub bytes: u64,
    /// Calls per [`COUNTED`] slot.
    pub calls: [u32; 8],
    /// [`CountEnd`] as u32.
    pub end: u32,
    /// Always 0.
    pub pad: u32,
}

const _: () = assert!(core::mem::size_of::<CudaCountState>() == 64);
const _: () = assert!(core::mem::size_of::<CudaCountEvent>() == 24 + 16 + 32 + 8);

const _: () = assert!(core::mem::size_of::<CudaCallEvent>() == 56);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_functions_roundtrip_and_cookies_carry_the_argument_index() {
        for (i, f) in CudaFunc::ALL.iter().enumerate() {
            assert_eq!(CudaFunc::from_raw(i as u32), Some(*f));
        }
        for (i, v) in CudaVariant::ALL.iter().enumerate() {
            assert_eq!(CudaVariant::from_raw(i as u32), Some(*v));
        }
        let c = CudaFunc::MemcpyHtoDAsync.cookie(CudaVariant::V2Ptsz);
        assert_eq!((c & 0xff, (c >> 8) & 0xff, (c >> 16) & 0xff), (6, 5, 2));
        let c = CudaFunc::CtxSynchronize.cookie(CudaVariant::Plain);
        assert_eq!((c >> 16) & 0xff, CUDA_NO_ARG);
        assert_eq!(CudaFunc::MemAlloc.arg(), Some((1, CudaArg::Bytes)));
        assert_eq!(CudaFunc::EventSynchronize.class(), CudaClass::Sync);
    }

    #[test]
    fn slots_follow_the_counted_list_and_only_launch_type_calls_are_counted() {
        for (i, f) in COUNTED.iter().enumerate() {
            assert_eq!(counted_slot(*f as u32), Some(i), "{f:?}");
        }
        for f in CudaFunc::ALL {
            let counted = COUNTED.contains(&f);
            assert_eq!(counted_slot(f as u32).is_some(), counted, "{f:?}");
            // Nothing that makes the host wait is counted: those keep their slices.
            if counted {
                assert!(
                    matches!(f.class(), CudaClass::Launch | CudaClass::Memcpy),
                    "{f:?}"
                );
                assert!(
                    f.name().ends_with("Async") || f.class() == CudaClass::Launch,
                    "{f:?}"
                );
            }
        }
    }
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain `#[repr(C)]` integers without padding; every bit pattern is valid.
    unsafe impl aya::Pod for super::CudaCountState {}
}
