//! Counted CUDA driver calls: the default mode of the libcuda probes for launch-type calls.
//!
//! A kernel launch or an asynchronous copy returns in microseconds and does not wait for the GPU; timing
//! each one with an entry + return uprobe pair (the int3 path and the uretprobe trampoline) cost 7–10 µs per
//! call on the H200, more than the call itself. So by default those [`COUNTED`] functions get an entry-only
//! uprobe (`llmprof_cucount`) that only counts, per thread, in the kernel: calls per function and the bytes
//! of the copies. A thread's counts are written as one [`CudaCountEvent`] when its window ends: at its first
//! counted call [`COUNT_WINDOW_NS`] or more after the window began ([`CountEnd::Window`]), at the entry of any
//! individually timed call on the same thread (a synchronize, a blocking copy, an alloc/free:
//! [`CountEnd::Call`], so an engine step's launches end at the step's copy of results), or when llmprof reads
//! the leftovers at the end of the session ([`CountEnd::Flush`]). The calls that block the host keep the
//! entry + return pair and their own slices; `--cuda-calls all` puts every function back on the pair.
//!
//! Not part of the engine ABI: no [`crate::ABI_VERSION`] change.

use crate::{CudaFunc, EventHeader};

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

#[cfg(test)]
mod tests {
    use super::*;

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
                    matches!(f.class(), crate::CudaClass::Launch | crate::CudaClass::Memcpy),
                    "{f:?}"
                );
                assert!(
                    f.name().ends_with("Async") || f.class() == crate::CudaClass::Launch,
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
