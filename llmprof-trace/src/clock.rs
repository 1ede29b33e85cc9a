//! The one clock module: CLOCK_BOOTTIME nanoseconds, the timebase of every event (what `bpf_ktime_get_boot_ns()`
//! returns in the eBPF programs, and Perfetto's default clock), and its one conversion to wall-clock time.
//!
//! Owns every clock read of the trace side and the BOOTTIME → REALTIME offset ([`WallClock`]). Every event carries
//! BOOTTIME ns (it keeps counting across suspend); OTLP spans and the trace's clock snapshot carry Unix-epoch
//! wall-clock times. The offset `CLOCK_REALTIME − CLOCK_BOOTTIME` is sampled once per session (one BOOTTIME read
//! bracketed between two REALTIME reads, their midpoint used, so the error is under half the bracket, well below a
//! microsecond) and applied to every timestamp of the session. A wall-clock step during the session (NTP slew,
//! `date -s`) is therefore not followed: spans keep the engine's relative timing, which is what a trace must get
//! right. Also the civil-time helpers used for trace file names and RFC 3339 stamps.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Reads `clock` with `clock_gettime`, in ns.
fn read(clock: libc::clockid_t) -> std::io::Result<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call; clock_gettime writes only into it.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    Ok(secs.saturating_mul(1_000_000_000).saturating_add(nanos))
}

/// Now, CLOCK_BOOTTIME ns (0 if the call fails, which it does not for this id on Linux).
pub fn boottime_ns() -> u64 {
    read(libc::CLOCK_BOOTTIME).unwrap_or(0)
}

/// Now, CLOCK_REALTIME ns (0 if the call fails, which it does not for this id on Linux).
pub fn realtime_ns() -> u64 {
    read(libc::CLOCK_REALTIME).unwrap_or(0)
}

/// Converts BOOTTIME ns to wall-clock time with a fixed offset sampled once (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WallClock {
    /// `CLOCK_REALTIME − CLOCK_BOOTTIME`, ns.
    offset_ns: i64,
}

impl WallClock {
    /// A converter with a given offset (`CLOCK_REALTIME − CLOCK_BOOTTIME`, ns); tests use fixed offsets.
    pub fn with_offset(offset_ns: i64) -> Self {
        Self { offset_ns }
    }

    /// Samples the offset of this machine now.
    pub fn now() -> std::io::Result<Self> {
        let r0 = i128::from(read(libc::CLOCK_REALTIME)?);
        let b = i128::from(read(libc::CLOCK_BOOTTIME)?);
        let r1 = i128::from(read(libc::CLOCK_REALTIME)?);
        let real_mid = r0 + (r1 - r0) / 2;
        let offset_ns = i64::try_from(real_mid - b).unwrap_or(i64::MAX);
        Ok(Self { offset_ns })
    }

    /// The offset, ns.
    pub fn offset_ns(&self) -> i64 {
        self.offset_ns
    }

    /// Wall-clock ns since the Unix epoch of a BOOTTIME timestamp (clamped at the epoch).
    pub fn to_unix_ns(&self, boot_ns: u64) -> u64 {
        let wall = i128::from(boot_ns) + i128::from(self.offset_ns);
        u64::try_from(wall.max(0)).unwrap_or(u64::MAX)
    }

    /// Wall-clock time of a BOOTTIME timestamp (clamped at the Unix epoch).
    pub fn to_system_time(&self, boot_ns: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_nanos(self.to_unix_ns(boot_ns))
    }
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
    use super::*;

    #[test]
    fn boottime_advances() {
        let a = boottime_ns();
        let b = boottime_ns();
        assert!(a > 0 && b >= a);
        assert!(realtime_ns() > 1_600_000_000_000_000_000);
    }

    #[test]
    fn civil_time_of_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_795_741_323), "2026-11-27T01:02:03Z");
    }

    #[test]
    fn offset_maps_boottime_to_now() {
        let clock = WallClock::now().expect("clock_gettime");
        let wall = clock.to_system_time(boottime_ns());
        let now = SystemTime::now();
        let diff = now.duration_since(wall).unwrap_or_else(|e| e.duration());
        assert!(
            diff < Duration::from_millis(50),
            "BOOTTIME converted is {diff:?} away from now"
        );
    }

    #[test]
    fn fixed_offset_is_exact() {
        let clock = WallClock::with_offset(1_700_000_000_000_000_000);
        assert_eq!(
            clock.to_system_time(1_500),
            UNIX_EPOCH + Duration::from_nanos(1_700_000_000_000_001_500)
        );
        assert_eq!(WallClock::with_offset(-10).to_unix_ns(5), 0);
    }
}
