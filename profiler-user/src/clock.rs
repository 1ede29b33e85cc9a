//! The session's clock: CLOCK_BOOTTIME nanoseconds, the timebase of every event (and Perfetto's default).

/// Reads `clock` with `clock_gettime`, in ns (0 if the call fails, which it does not for these ids).
fn read(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    if rc != 0 {
        return 0;
    }
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

/// Now, CLOCK_BOOTTIME ns (what `bpf_ktime_get_boot_ns()` returns in the eBPF programs).
pub fn boottime_ns() -> u64 {
    read(libc::CLOCK_BOOTTIME)
}

/// Now, CLOCK_REALTIME ns (for the trace's clock snapshot, so the UI can show wall-clock time).
pub fn realtime_ns() -> u64 {
    read(libc::CLOCK_REALTIME)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests {
    #[test]
    fn boottime_advances() {
        let a = super::boottime_ns();
        let b = super::boottime_ns();
        assert!(a > 0 && b >= a);
        assert!(super::realtime_ns() > 1_600_000_000_000_000_000);
    }
}
