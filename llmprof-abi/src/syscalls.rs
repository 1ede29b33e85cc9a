//! The `syscalls` family: every syscall of the traced threads, timed at its entry and exit (the raw
//! `raw_syscalls:sys_enter`/`sys_exit` tracepoints), kept as per-thread aggregates in the kernel, with the slow
//! ones sent one by one.
//!
//! The exit program is also where the `files`, `egress` and `wire` families decode the syscalls they need: the
//! entry saves the arguments of the numbers in [`DECODED_SYSCALLS`] into the thread's [`SyscallSlot`], and the
//! exit, where the result is known, dispatches on the number.

use crate::{EventHeader, Family};

/// raw_syscalls:sys_enter (raw tracepoint): the entry time and number, and for [`DECODED_SYSCALLS`] the
/// arguments, into the thread's slot.
pub const SYSENT_PROGRAM: &str = "llmprof_sysent";
/// raw_syscalls:sys_exit (raw tracepoint): aggregates, slow syscalls, then the decoding of
/// [`DECODED_SYSCALLS`].
pub const SYSEXIT_PROGRAM: &str = "llmprof_sysexit";
/// Aggregates: [`SyscallKey`] → [`SyscallStats`].
pub const SYSCALLS_MAP: &str = "SYSCALLS";
/// Syscall slots ([`SyscallSlot`]) of the threads whose tid is below [`SYSCALL_SLOTS`], at their tid.
pub const SYSSLOTS_MAP: &str = "SYSSLOTS";
/// Syscall slots of the threads with larger tids, by tid.
pub const INFLIGHT_MAP: &str = "INFLIGHT";
/// Every program of the family.
pub const PROGRAMS: [&str; 2] = [SYSENT_PROGRAM, SYSEXIT_PROGRAM];
/// Every map of the family.
pub const MAPS: [&str; 3] = [SYSCALLS_MAP, SYSSLOTS_MAP, INFLIGHT_MAP];
/// The family's kernel names.
pub const FAMILY: Family = Family {
    name: "syscalls",
    programs: &PROGRAMS,
    maps: &MAPS,
};

// x86-64 syscall numbers (arch/x86/entry/syscalls/syscall_64.tbl).
/// `read(2)`.
pub const NR_READ: u64 = 0;
/// `write(2)`.
pub const NR_WRITE: u64 = 1;
/// `open(2)`.
pub const NR_OPEN: u64 = 2;
/// `close(2)`.
pub const NR_CLOSE: u64 = 3;
/// `mmap(2)`.
pub const NR_MMAP: u64 = 9;
/// `pread64(2)`.
pub const NR_PREAD64: u64 = 17;
/// `readv(2)`.
pub const NR_READV: u64 = 19;
/// `writev(2)`.
pub const NR_WRITEV: u64 = 20;
/// `connect(2)`.
pub const NR_CONNECT: u64 = 42;
/// `accept(2)`.
pub const NR_ACCEPT: u64 = 43;
/// `sendto(2)`.
pub const NR_SENDTO: u64 = 44;
/// `recvfrom(2)`.
pub const NR_RECVFROM: u64 = 45;
/// `sendmsg(2)`.
pub const NR_SENDMSG: u64 = 46;
/// `recvmsg(2)`.
pub const NR_RECVMSG: u64 = 47;
/// `exit(2)`.
pub const NR_EXIT: u64 = 60;
/// `exit_group(2)`.
pub const NR_EXIT_GROUP: u64 = 231;
/// `openat(2)`.
pub const NR_OPENAT: u64 = 257;
/// `accept4(2)`.
pub const NR_ACCEPT4: u64 = 288;

/// The syscalls whose exit the programs decode (model files, egress, the wire probe, exit status), in number
/// order: their entry saves the arguments, so they cost more per call than the rest (user space calibrates them
/// apart).
pub const DECODED_SYSCALLS: [u64; 18] = [
    NR_READ,
    NR_WRITE,
    NR_OPEN,
    NR_CLOSE,
    NR_MMAP,
    NR_PREAD64,
    NR_READV,
    NR_WRITEV,
    NR_CONNECT,
    NR_ACCEPT,
    NR_SENDTO,
    NR_RECVFROM,
    NR_SENDMSG,
    NR_RECVMSG,
    NR_EXIT,
    NR_EXIT_GROUP,
    NR_OPENAT,
    NR_ACCEPT4,
];

/// Whether syscall `nr` is one of [`DECODED_SYSCALLS`] (the test the kernel's entry and exit make).
#[inline(always)]
pub const fn is_decoded(nr: u64) -> bool {
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

/// A syscall slower than the configured threshold.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SlowSyscallEvent {
    /// Header ([`crate::EventKind::SlowSyscall`]); `ts_ns` is the entry time.
    pub hdr: EventHeader,
    /// Syscall number (x86-64).
    pub nr: u64,
    /// Return value.
    pub ret: i64,
    /// Duration, ns.
    pub dur_ns: u64,
}

/// Key of the in-kernel syscall aggregate map.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SyscallKey {
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Syscall number.
    pub nr: u64,
}

/// Log2 latency buckets: bucket i counts calls with duration in [2^i, 2^(i+1)) ns.
pub const LAT_BUCKETS: usize = 32;

/// Value of the in-kernel syscall aggregate map.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SyscallStats {
    /// Completed calls.
    pub count: u64,
    /// Total time, ns.
    pub total_ns: u64,
    /// Log2 latency histogram.
    pub hist: [u64; LAT_BUCKETS],
}

/// `SyscallSlot::nr` of a thread that is not inside a traced syscall.
pub const NO_SYSCALL: u64 = u64::MAX;

/// Entries of the kernel's `SYSSLOTS` array: the syscall slot of a thread whose tid is below this is the
/// array entry at its tid (no hash lookup); threads with larger tids (`kernel.pid_max` above it) use the
/// `INFLIGHT` hash.
pub const SYSCALL_SLOTS: u32 = 1 << 16;

/// Value of the kernel's per-thread syscall slot (`SYSSLOTS[tid]`, or `INFLIGHT` keyed by tid for tids
/// from [`SYSCALL_SLOTS`] on): the syscall the thread is in, written in place at every traced entry and
/// marked consumed ([`NO_SYSCALL`]) at exit. `args` is filled only for the syscalls whose exit needs them
/// (model files, egress, exit status). An array entry belongs to a traced thread only while its `tid`
/// field equals its index (0: free).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SyscallSlot {
    /// Entry time, CLOCK_BOOTTIME ns.
    pub ts_ns: u64,
    /// Syscall number, or [`NO_SYSCALL`].
    pub nr: u64,
    /// The six syscall arguments (only for the numbers that need them; stale otherwise).
    pub args: [u64; 6],
    /// The traced thread the slot belongs to (0: free array entry).
    pub tid: u32,
    /// Zero.
    pub pad: u32,
}

const _: () = {
    assert!(core::mem::size_of::<SlowSyscallEvent>() == 48);
    assert!(core::mem::size_of::<SyscallKey>() == 16);
    assert!(core::mem::size_of::<SyscallStats>() == 16 + 8 * LAT_BUCKETS);
    assert!(core::mem::size_of::<SyscallSlot>() == 72);
};

#[cfg(feature = "user")]
mod pod {
    // SAFETY: #[repr(C)], Copy, integers and arrays of integers only; every bit pattern is valid.
    unsafe impl aya::Pod for super::SyscallKey {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::SyscallStats {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::SyscallSlot {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_decoded_list_is_what_the_kernel_tests() {
        for nr in 0..1024 {
            assert_eq!(is_decoded(nr), DECODED_SYSCALLS.contains(&nr), "syscall {nr}");
        }
        assert!(
            DECODED_SYSCALLS.windows(2).all(|w| w[0] < w[1]),
            "in number order"
        );
    }
}
