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

/// A UTC calendar time: (year, month, day, hour, minute, second) of `unix_secs` seconds since 1970-01-01.
pub fn utc_civil(unix_secs: u64) -> (i64, u32, u32, u32, u32, u32) {
    let (days, rem) = (unix_secs / 86_400, unix_secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let (h, mi, s) = (rem / 3600, rem % 3600 / 60, rem % 60);
    (y, m as u32, d as u32, h as u32, mi as u32, s as u32)
}

/// `unix_secs` as RFC 3339 UTC, e.g. `2026-11-26T01:02:03Z`.
pub fn rfc3339(unix_secs: u64) -> String {
    let (y, m, d, h, mi, s) = utc_civil(unix_secs);
    format!("{y:04}-{m:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z")
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

    #[test]
    fn civil_time_of_known_instants() {
        assert_eq!(super::rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(super::rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(super::rfc3339(1_795_741_323), "2026-11-27T01:02:03Z");
    }
}
