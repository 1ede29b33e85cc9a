//! Incremental reorder of events from several sources by timestamp.
//!
//! Owns the ordering guarantee of the stream the sinks see: events are held in a min-heap until the
//! watermark (highest timestamp seen minus the reorder window) passes them, then released in
//! `(ts_ns, arrival order)` order. An event older than what was already released cannot be placed any more:
//! it is released immediately and counted in [`Merger::late`] (the Perfetto trace processor sorts anyway, so
//! it is not lost; the count says the window was too small). Memory is bounded by the events of one window.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::event::Event;

/// Default reorder window: ring buffers are drained every few ms and the /metrics scraper stamps samples when
/// it reads them, so 50 ms covers both with margin (measured: poll interval 10 ms in `attach`).
pub const DEFAULT_WINDOW_NS: u64 = 50_000_000;

struct Entry {
    ts: u64,
    seq: u64,
    ev: Event,
}

impl PartialEq for Entry {
    fn eq(&self, o: &Self) -> bool {
        (self.ts, self.seq) == (o.ts, o.seq)
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Entry {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.ts, self.seq).cmp(&(o.ts, o.seq))
    }
}

/// The reorder buffer.
pub struct Merger {
    window_ns: u64,
    heap: BinaryHeap<Reverse<Entry>>,
    seq: u64,
    max_seen: u64,
    released: u64,
    late: u64,
}

impl Merger {
    /// A merger holding events for `window_ns` behind the newest one.
    pub fn new(window_ns: u64) -> Self {
        Self {
            window_ns,
            heap: BinaryHeap::new(),
            seq: 0,
            max_seen: 0,
            released: 0,
            late: 0,
        }
    }

    /// Adds an event from any source.
    pub fn push(&mut self, ev: Event) {
        self.max_seen = self.max_seen.max(ev.ts_ns);
        self.seq += 1;
        self.heap.push(Reverse(Entry {
            ts: ev.ts_ns,
            seq: self.seq,
            ev,
        }));
    }

    /// Moves every event at or below the watermark to `out`, in order.
    pub fn drain_ready(&mut self, out: &mut Vec<Event>) {
        let watermark = self.max_seen.saturating_sub(self.window_ns);
        self.drain_until(watermark, out);
    }

    /// Advances the watermark to `now_ns - window` even without new events (a quiet source must not hold
    /// back the others forever), then drains.
    pub fn drain_at(&mut self, now_ns: u64, out: &mut Vec<Event>) {
        self.max_seen = self.max_seen.max(now_ns);
        self.drain_ready(out);
    }

    /// Moves everything to `out`, in order (end of session).
    pub fn finish(&mut self, out: &mut Vec<Event>) {
        self.drain_until(u64::MAX, out);
    }

    fn drain_until(&mut self, watermark: u64, out: &mut Vec<Event>) {
        while let Some(Reverse(top)) = self.heap.peek() {
            if top.ts > watermark {
                break;
            }
            let Some(Reverse(e)) = self.heap.pop() else { break };
            if e.ts < self.released {
                self.late += 1;
            }
            self.released = self.released.max(e.ts);
            out.push(e.ev);
        }
    }

    /// Events released after a newer one had already been released.
    pub fn late(&self) -> u64 {
        self.late
    }

    /// Events currently held.
    pub fn pending(&self) -> usize {
        self.heap.len()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests {
    use super::*;
    use crate::testing;

    fn ev(ts: u64) -> Event {
        testing::marker(1, 1, ts, &ts.to_string())
    }

    #[test]
    fn interleaved_sources_come_out_ordered_and_late_ones_are_counted() {
        let mut m = Merger::new(100);
        let mut out = Vec::new();
        // Two sources, each ordered, interleaved out of order within the window.
        for ts in [10, 50, 30, 200, 120, 60, 400] {
            m.push(ev(ts));
            m.drain_ready(&mut out);
        }
        let ts: Vec<u64> = out.iter().map(|e| e.ts_ns).collect();
        assert_eq!(ts, vec![10, 30, 50, 60, 120, 200]);
        assert_eq!(m.late(), 0);
        // 100 arrives after 200 was released: too late, released at once and counted.
        m.push(ev(100));
        m.drain_at(1000, &mut out);
        assert_eq!(m.late(), 1);
        m.finish(&mut out);
        assert_eq!(out.len(), 8);
        assert_eq!(m.pending(), 0);
    }
}
