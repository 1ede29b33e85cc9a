//! BOOTTIME → wall-clock conversion for span times.
//!
//! Owns the one offset the OTel sink uses. Every event carries CLOCK_BOOTTIME nanoseconds (the probe ABI's clock,
//! which keeps counting across suspend), while OTLP spans carry Unix-epoch wall-clock times. The offset
//! `CLOCK_REALTIME − CLOCK_BOOTTIME` is sampled once when the sink starts (bracketing one BOOTTIME read between two
//! REALTIME reads and using their midpoint, so the error is under half the bracket, well below a microsecond) and
//! applied to every timestamp of the session. A wall-clock step during the session (NTP slew, `date -s`) is
//! therefore not followed: spans keep the engine's relative timing, which is what a trace must get right, and stay
//! within the step of the caller's spans.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Converts BOOTTIME ns to wall-clock time with a fixed offset.
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
        let r0 = clock_ns(libc::CLOCK_REALTIME)?;
        let b = clock_ns(libc::CLOCK_BOOTTIME)?;
        let r1 = clock_ns(libc::CLOCK_REALTIME)?;
        let real_mid = r0 + (r1 - r0) / 2;
        Ok(Self {
            offset_ns: (real_mid - b) as i64,
        })
    }

    /// The offset, ns.
    pub fn offset_ns(&self) -> i64 {
        self.offset_ns
    }

    /// Wall-clock time of a BOOTTIME timestamp (clamped at the Unix epoch).
    pub fn to_system_time(&self, boot_ns: u64) -> SystemTime {
        let wall = i128::from(boot_ns) + i128::from(self.offset_ns);
        let wall = u64::try_from(wall.max(0)).unwrap_or(u64::MAX);
        UNIX_EPOCH + Duration::from_nanos(wall)
    }
}

/// Reads a clock as ns.
fn clock_ns(clock: libc::clockid_t) -> std::io::Result<i128> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call; clock_gettime writes only into it.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(i128::from(ts.tv_sec) * 1_000_000_000 + i128::from(ts.tv_nsec))
}

/// BOOTTIME now, ns (used for the end of requests still open when a session finishes without any later event).
pub fn boottime_now_ns() -> std::io::Result<u64> {
    Ok(u64::try_from(clock_ns(libc::CLOCK_BOOTTIME)?).unwrap_or(0))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests unwrap to fail loudly")]
mod tests {
    use super::*;

    #[test]
    fn offset_maps_boottime_to_now() {
        let clock = WallClock::now().expect("clock_gettime");
        let boot = boottime_now_ns().expect("clock_gettime");
        let wall = clock.to_system_time(boot);
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
    }
}
