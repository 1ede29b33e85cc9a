//! Device time on the host clock: CUDA events mapped onto CLOCK_BOOTTIME through a reference event.
//!
//! CUDA events only measure time between each other (`cuEventElapsedTime`, milliseconds as f32, ~0.5 µs
//! resolution). To put a step's start/end events on the host's BOOTTIME timeline (docs/probe-abi.md) we record
//! a reference event on an idle stream between two host clock reads: the GPU timestamps it between them, so its
//! host time is their midpoint, within half their distance. Every later event is `reference + elapsed`. The
//! anchor is renewed every [`ANCHOR_INTERVAL_NS`]: that bounds both the f32 rounding of `elapsed` (an f32 of
//! 1000 ms has a 61 ns step) and the drift between the GPU and host clocks. [`Anchor`] is the pure mapping;
//! [`EventClock`] owns the reference event. Never synchronizes anything but its own events.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaEvent, CudaStream, DriverError, sys};

/// How often the reference event is re-recorded (1 s: f32 milliseconds keep ≤ 61 ns resolution, and clock
/// drift of tens of ppm stays below a microsecond).
pub const ANCHOR_INTERVAL_NS: u64 = 1_000_000_000;

/// A reference event's place on the host clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Anchor {
    /// BOOTTIME ns at which the reference event completed (midpoint of the two host reads around it).
    pub host_ns: u64,
    /// Half the distance between the two host reads: the uncertainty of `host_ns`.
    pub uncertainty_ns: u64,
}

impl Anchor {
    /// The anchor of a reference event recorded (on an idle stream) between host reads `before` and `after`.
    pub fn from_bracket(before_ns: u64, after_ns: u64) -> Self {
        let (lo, hi) = (before_ns.min(after_ns), before_ns.max(after_ns));
        Anchor {
            host_ns: lo + (hi - lo) / 2,
            uncertainty_ns: (hi - lo) / 2,
        }
    }

    /// Host BOOTTIME ns of an event `elapsed_ms` after the reference (negative: before it).
    pub fn map(&self, elapsed_ms: f32) -> u64 {
        let offset_ns = (f64::from(elapsed_ms) * 1e6).round();
        if offset_ns >= 0.0 {
            self.host_ns.saturating_add(offset_ns as u64)
        } else {
            self.host_ns.saturating_sub((-offset_ns) as u64)
        }
    }

    /// Whether an anchor taken at `self.host_ns` should be renewed at host time `now_ns`.
    pub fn is_stale(&self, now_ns: u64, interval_ns: u64) -> bool {
        now_ns.saturating_sub(self.host_ns) >= interval_ns
    }
}

/// A device interval on the host clock, with `end ≥ start`.
pub fn interval(anchor: &Anchor, start_ms: f32, end_ms: f32) -> (u64, u64) {
    let s = anchor.map(start_ms);
    let e = anchor.map(end_ms).max(s);
    (s, e)
}

/// The reference event and its anchor.
#[derive(Debug)]
pub struct EventClock {
    reference: CudaEvent,
    anchor: Option<Anchor>,
    anchors_taken: u64,
}

/// A timing-enabled event (the default flags; `CU_EVENT_DISABLE_TIMING` would make them useless here).
pub fn timing_event(ctx: &Arc<CudaContext>) -> Result<CudaEvent, DriverError> {
    ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
}

impl EventClock {
    /// A clock with a reference event in `ctx` (anchored on first use).
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Self, DriverError> {
        Ok(EventClock {
            reference: timing_event(ctx)?,
            anchor: None,
            anchors_taken: 0,
        })
    }

    /// Renews the anchor when it is missing or older than [`ANCHOR_INTERVAL_NS`]. Call it when `stream` is idle
    /// (between steps): the reference event then completes as soon as the GPU sees it.
    pub fn maybe_reanchor(&mut self, stream: &CudaStream) -> Result<(), DriverError> {
        let now = llmprof_probes::boottime_ns();
        if self.anchor.is_some_and(|a| !a.is_stale(now, ANCHOR_INTERVAL_NS)) {
            return Ok(());
        }
        stream.synchronize()?;
        let before = llmprof_probes::boottime_ns();
        self.reference.record(stream)?;
        self.reference.synchronize()?;
        let after = llmprof_probes::boottime_ns();
        self.anchor = Some(Anchor::from_bracket(before, after));
        self.anchors_taken += 1;
        Ok(())
    }

    /// The current anchor.
    pub fn anchor(&self) -> Option<Anchor> {
        self.anchor
    }

    /// How many anchors were taken so far.
    pub fn anchors_taken(&self) -> u64 {
        self.anchors_taken
    }

    /// BOOTTIME ns of the completed events `start` and `end` (waits for them).
    pub fn host_interval(&self, start: &CudaEvent, end: &CudaEvent) -> Result<(u64, u64), DriverError> {
        let Some(anchor) = self.anchor else {
            return Err(DriverError(sys::CUresult::CUDA_ERROR_NOT_READY));
        };
        let s = self.reference.elapsed_ms(start)?;
        let e = self.reference.elapsed_ms(end)?;
        Ok(interval(&anchor, s, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bracket_midpoint_and_uncertainty() {
        let a = Anchor::from_bracket(1_000, 1_010);
        assert_eq!(
            a,
            Anchor {
                host_ns: 1_005,
                uncertainty_ns: 5
            }
        );
        // Reads in the wrong order still give the same bracket.
        assert_eq!(Anchor::from_bracket(1_010, 1_000), a);
    }

    #[test]
    fn maps_offsets_after_and_before_the_reference() {
        let a = Anchor {
            host_ns: 10_000_000_000,
            uncertainty_ns: 0,
        };
        assert_eq!(a.map(0.0), 10_000_000_000);
        assert_eq!(a.map(1.5), 10_001_500_000);
        assert_eq!(a.map(-0.25), 9_999_750_000);
        // Offsets never wrap below zero.
        let early = Anchor {
            host_ns: 100,
            uncertainty_ns: 0,
        };
        assert_eq!(early.map(-1.0), 0);
    }

    #[test]
    fn f32_milliseconds_within_the_anchor_interval_keep_sub_microsecond_resolution() {
        let a = Anchor {
            host_ns: 5_000_000_000,
            uncertainty_ns: 0,
        };
        // 999.9995 ms after the anchor: the f32 rounding error must stay under 100 ns.
        let ms = 999.999_5_f32;
        let exact = 5_000_000_000u64 + 999_999_500;
        let got = a.map(ms);
        assert!(got.abs_diff(exact) < 100, "{got} vs {exact}");
        const {
            assert!(
                ANCHOR_INTERVAL_NS <= 1_000_000_000,
                "f32 ms resolution is checked up to 1 s"
            )
        };
    }

    #[test]
    fn interval_is_never_reversed() {
        let a = Anchor {
            host_ns: 1_000_000,
            uncertainty_ns: 0,
        };
        assert_eq!(interval(&a, 0.010, 0.030), (1_010_000, 1_030_000));
        // Events read out of order (end before start) collapse to an empty interval at the start.
        assert_eq!(interval(&a, 0.030, 0.010), (1_030_000, 1_030_000));
    }

    #[test]
    fn staleness() {
        let a = Anchor {
            host_ns: 1_000,
            uncertainty_ns: 0,
        };
        assert!(!a.is_stale(1_000 + ANCHOR_INTERVAL_NS - 1, ANCHOR_INTERVAL_NS));
        assert!(a.is_stale(1_000 + ANCHOR_INTERVAL_NS, ANCHOR_INTERVAL_NS));
        assert!(
            !a.is_stale(0, ANCHOR_INTERVAL_NS),
            "a clock read before the anchor is not stale"
        );
    }
}
