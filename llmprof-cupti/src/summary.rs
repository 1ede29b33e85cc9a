//! The default mode's summaries: what one window of CUPTI records becomes when every kernel is not wanted.
//!
//! Owns the arithmetic of `llmprof_abi::cupti::GpuSummary` and `GpuBusy`: per window (one completed CUPTI
//! buffer) and device, the count, total, min and max GPU time of each kernel name, copy kind and wait type;
//! and the GPU's busy intervals, compacted: kernels (and graph launches) whose idle gap to the previous one
//! is under the gap threshold extend the open interval, which carries the union of their times (`busy_ns`,
//! so the idle time inside stays exact) and its top kernel. An interval also ends at [`MAX_SPAN_NS`], and
//! when it ended more than the threshold before the window's clock reading (the GPU went idle). The
//! threshold adapts per window so a device hands over at most [`MAX_BUSY_PER_WINDOW`] intervals (doubling
//! when a window had more, halving when it had under a quarter, within [`MIN_GAP_NS`]..=[`MAX_GAP_NS`]).
//!
//! Bounded: at most [`MAX_ROWS`] summary rows per window (the rest of a kind and device is summed into a row
//! of name id 0), [`MAX_DEVICES`] devices, [`MAX_TOP`] kernel names per interval for its top kernel. Pure,
//! no allocation after [`Summarizer::new`]: records come in through [`Summarizer::add`], records go out
//! through the [`Packer`] at [`Summarizer::finish`].

use llmprof_abi::cupti::{GpuActivity, GpuActivityKind, GpuBusy, GpuRecordHeader, GpuRecordKind, GpuSummary};

use crate::convert::{Packer, Sink};

/// Summary rows per window (beyond: summed per kind and device into name id 0).
pub const MAX_ROWS: usize = 256;
/// Of [`MAX_ROWS`], the rows kept for those sums.
pub const OVERFLOW_ROWS: usize = 16;
/// Devices tracked for busy intervals (work of a higher ordinal shares the last one's).
pub const MAX_DEVICES: usize = 16;
/// Kernel names remembered per open interval to find its top kernel.
pub const MAX_TOP: usize = 32;
/// Longest interval: bounds how far a compacted interval can spread over engine steps.
pub const MAX_SPAN_NS: u64 = 10_000_000;
/// Smallest gap threshold: a gap of this much or more between two kernels ends an interval.
pub const MIN_GAP_NS: u64 = 5_000;
/// Largest gap threshold.
pub const MAX_GAP_NS: u64 = 2_000_000;
/// Busy intervals a device may hand over per window before the threshold doubles; twice this is a hard cap
/// (past it, the window's spans of that device merge whatever their gaps, up to [`MAX_SPAN_NS`]).
pub const MAX_BUSY_PER_WINDOW: usize = 150;
/// Windows in a row with under a quarter of [`MAX_BUSY_PER_WINDOW`] before the threshold halves.
pub const CALM_WINDOWS: u32 = 10;
/// Spans (kernels, graph launches) of one window kept for sorting; beyond, a window's spans are folded in
/// as they come (intervals then see them in arrival order).
pub const MAX_SPANS: usize = 8192;

#[derive(Clone, Copy, Debug, Default)]
struct Span {
    device: u32,
    start: u64,
    end: u64,
    name_id: u32,
}

#[derive(Clone, Copy)]
struct Open {
    start: u64,
    end: u64,
    busy: u64,
    kernels: u32,
    top: [(u32, u32, u64); MAX_TOP],
    tops: usize,
}

impl Open {
    fn new(s: &Span) -> Self {
        let mut o = Open {
            start: s.start,
            end: s.end,
            busy: s.end - s.start,
            kernels: 1,
            top: [(0, 0, 0); MAX_TOP],
            tops: 0,
        };
        o.note(s);
        o
    }

    fn note(&mut self, s: &Span) {
        let d = s.end - s.start;
        if let Some(t) = self.top[..self.tops].iter_mut().find(|t| t.0 == s.name_id) {
            t.1 += 1;
            t.2 += d;
        } else if self.tops < MAX_TOP {
            self.top[self.tops] = (s.name_id, 1, d);
            self.tops += 1;
        }
    }

    fn record(&self, device: u32) -> GpuBusy {
        let (name, count, ns) = self.top[..self.tops]
            .iter()
            .copied()
            .max_by_key(|t| (t.2, std::cmp::Reverse(t.0)))
            .unwrap_or((0, 0, 0));
        GpuBusy {
            hdr: GpuRecordHeader::new(GpuRecordKind::Busy, core::mem::size_of::<GpuBusy>()),
            device,
            kernels: self.kernels,
            start_ns: self.start,
            end_ns: self.end,
            busy_ns: self.busy,
            top_name_id: name,
            top_count: count,
            top_ns: ns,
        }
    }
}

/// The summaries of the window in progress and the open busy interval of each device.
#[derive(Debug)]
pub struct Summarizer {
    window: u32,
    gap_ns: [u64; MAX_DEVICES],
    rows: Vec<GpuSummary>,
    spans: Vec<Span>,
    open: [Option<Open>; MAX_DEVICES],
    /// Per device: the end of the last interval handed over (work before it is not counted again).
    done: [u64; MAX_DEVICES],
    busy_out: [usize; MAX_DEVICES],
    calm: [u32; MAX_DEVICES],
    /// Records that found no summary row (every row taken): counted as dropped by the caller.
    pub unsummed: u64,
}

impl std::fmt::Debug for Open {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Open({}..{}, busy {})", self.start, self.end, self.busy)
    }
}

impl Default for Summarizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Summarizer {
    /// An empty summarizer (its buffers are reserved here).
    pub fn new() -> Self {
        Self {
            window: 0,
            gap_ns: [MIN_GAP_NS; MAX_DEVICES],
            rows: Vec::with_capacity(MAX_ROWS),
            spans: Vec::with_capacity(MAX_SPANS),
            open: [None; MAX_DEVICES],
            done: [0; MAX_DEVICES],
            busy_out: [0; MAX_DEVICES],
            calm: [0; MAX_DEVICES],
            unsummed: 0,
        }
    }

    /// A new session: window numbers from 0, thresholds reset, nothing open.
    pub fn reset(&mut self) {
        *self = Self {
            rows: std::mem::take(&mut self.rows),
            spans: std::mem::take(&mut self.spans),
            ..Self::new()
        };
        self.rows.clear();
        self.spans.clear();
    }

    /// The gap threshold of `device` now, ns.
    pub fn gap_ns(&self, device: u32) -> u64 {
        self.gap_ns[slot(device)]
    }

    /// Adds one converted activity whose kernel name id is `name_id`. Kernels, copies, memsets and waits
    /// are summed into the window's rows; kernels and graph launches also feed the busy intervals (a graph
    /// launch's own record is the caller's to hand over).
    pub fn add(&mut self, a: &GpuActivity, name_id: u32, out: &mut Packer, sink: &mut impl Sink) {
        let Some(kind) = GpuActivityKind::from_raw(a.kind) else {
            return;
        };
        let end = a.end_ns.max(a.start_ns);
        if matches!(kind, GpuActivityKind::Kernel | GpuActivityKind::Graph) {
            let s = Span {
                device: a.device,
                start: a.start_ns,
                end,
                name_id,
            };
            if self.spans.len() < MAX_SPANS {
                self.spans.push(s);
            } else {
                self.fold(&s, out, sink);
            }
        }
        if kind == GpuActivityKind::Graph {
            return;
        }
        let (device, name_id) = match kind {
            GpuActivityKind::Kernel => (a.device, name_id),
            GpuActivityKind::Sync => (0, 0),
            _ => (a.device, 0),
        };
        let detail = if kind == GpuActivityKind::Kernel {
            0
        } else {
            a.detail
        };
        let dur = end - a.start_ns;
        let key = |r: &GpuSummary| {
            r.kind == kind as u32 && r.device == device && r.name_id == name_id && r.detail == detail
        };
        let i = match self.rows.iter().position(key) {
            Some(i) => i,
            None if self.rows.len() < MAX_ROWS - OVERFLOW_ROWS => {
                self.rows.push(self.row(kind, device, name_id, detail));
                self.rows.len() - 1
            }
            // Full: the rest of this kind and device is summed into its row of name id 0.
            None => {
                let rest = |r: &GpuSummary| {
                    r.kind == kind as u32 && r.device == device && r.name_id == 0 && r.detail == 0
                };
                match self.rows.iter().position(rest) {
                    Some(i) => i,
                    None if self.rows.len() < MAX_ROWS => {
                        self.rows.push(self.row(kind, device, 0, 0));
                        self.rows.len() - 1
                    }
                    None => {
                        self.unsummed += 1;
                        return;
                    }
                }
            }
        };
        let r = &mut self.rows[i];
        r.count += 1;
        r.total_ns += dur;
        r.min_ns = r.min_ns.min(dur);
        r.max_ns = r.max_ns.max(dur);
        r.first_ns = r.first_ns.min(a.start_ns);
        r.last_ns = r.last_ns.max(end);
        r.bytes += a.bytes;
    }

    fn row(&self, kind: GpuActivityKind, device: u32, name_id: u32, detail: u32) -> GpuSummary {
        GpuSummary {
            hdr: GpuRecordHeader::new(GpuRecordKind::Summary, core::mem::size_of::<GpuSummary>()),
            window: self.window,
            kind: kind as u32,
            device,
            name_id,
            detail,
            pad: 0,
            count: 0,
            total_ns: 0,
            min_ns: u64::MAX,
            max_ns: 0,
            first_ns: u64::MAX,
            last_ns: 0,
            bytes: 0,
        }
    }

    /// One span into its device's open interval (closing it first when the gap or the span says so).
    ///
    /// Spans come sorted by start within a window, but a later window may bring work that started earlier
    /// (another stream's kernel that completed later): what lies before the open interval extends it
    /// backwards, what lies before [`Summarizer`]'s `done` (the end of the last interval handed over) is not
    /// counted again, and a span that ended before either is handed over as an interval of its own.
    fn fold(&mut self, s: &Span, out: &mut Packer, sink: &mut impl Sink) {
        let d = slot(s.device);
        if s.end <= self.done[d] {
            self.emit(d, &Open::new(s), out, sink);
            return;
        }
        let s = Span {
            start: s.start.max(self.done[d]),
            ..*s
        };
        let gap = if self.busy_out[d] >= 2 * MAX_BUSY_PER_WINDOW {
            u64::MAX
        } else {
            self.gap_ns[d]
        };
        match &mut self.open[d] {
            Some(o) if s.end.saturating_add(gap) <= o.start => {
                let alone = Open::new(&s);
                self.emit(d, &alone, out, sink);
            }
            Some(o)
                if s.start < o.end.saturating_add(gap)
                    && s.end.max(o.end) - s.start.min(o.start) <= MAX_SPAN_NS =>
            {
                if s.start < o.start {
                    o.busy += s.end.min(o.start) - s.start;
                    o.start = s.start;
                }
                o.busy += s.end.saturating_sub(s.start.max(o.end));
                o.end = o.end.max(s.end);
                o.kernels = o.kernels.saturating_add(1);
                o.note(&s);
            }
            _ => {
                if let Some(o) = self.open[d].take() {
                    self.emit(d, &o, out, sink);
                    self.done[d] = self.done[d].max(o.end);
                }
                if s.end <= self.done[d] {
                    self.emit(d, &Open::new(&s), out, sink);
                } else {
                    let s = Span {
                        start: s.start.max(self.done[d]),
                        ..s
                    };
                    self.open[d] = Some(Open::new(&s));
                }
            }
        }
    }

    /// Hands over one interval of device slot `d`.
    fn emit(&mut self, d: usize, o: &Open, out: &mut Packer, sink: &mut impl Sink) {
        out.add_plain(&o.record(d as u32), sink);
        self.busy_out[d] += 1;
    }

    /// Ends the window: the busy intervals of its spans (in start order), the intervals that ended more than
    /// the gap threshold before `now` (CUPTI ns; `u64::MAX` closes all), then every summary row. Adapts the
    /// thresholds. Returns (summary rows, busy intervals) handed over.
    pub fn finish(&mut self, now: u64, out: &mut Packer, sink: &mut impl Sink) -> (u64, u64) {
        let mut spans = std::mem::take(&mut self.spans);
        spans.sort_unstable_by_key(|s| (s.device, s.start, s.end));
        for s in &spans {
            self.fold(s, out, sink);
        }
        spans.clear();
        self.spans = spans;
        for d in 0..MAX_DEVICES {
            let stale = self.open[d]
                .as_ref()
                .is_some_and(|o| o.end.saturating_add(self.gap_ns[d]) < now || now == u64::MAX);
            if stale && let Some(o) = self.open[d].take() {
                self.emit(d, &o, out, sink);
                self.done[d] = self.done[d].max(o.end);
            }
        }
        let busy: usize = self.busy_out.iter().sum();
        for d in 0..MAX_DEVICES {
            let n = std::mem::take(&mut self.busy_out[d]);
            let g = &mut self.gap_ns[d];
            if n > MAX_BUSY_PER_WINDOW {
                *g = (*g * 2).min(MAX_GAP_NS);
                self.calm[d] = 0;
            } else if n < MAX_BUSY_PER_WINDOW / 4 {
                self.calm[d] += 1;
                if self.calm[d] >= CALM_WINDOWS {
                    *g = (*g / 2).max(MIN_GAP_NS);
                    self.calm[d] = 0;
                }
            } else {
                self.calm[d] = 0;
            }
        }
        let rows = self.rows.len();
        for r in &self.rows {
            out.add_plain(r, sink);
        }
        self.rows.clear();
        if rows > 0 {
            self.window = self.window.wrapping_add(1);
        }
        (rows as u64, busy as u64)
    }
}

fn slot(device: u32) -> usize {
    (device as usize).min(MAX_DEVICES - 1)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests panic with the error")]
mod tests {
    use super::*;
    use crate::convert::test_sink::Collect;
    use llmprof_abi::cupti::GpuChunkHeader;

    fn u32_at(b: &[u8], o: usize) -> u32 {
        u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
    }
    fn u64_at(b: &[u8], o: usize) -> u64 {
        u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
    }

    /// The records of the chunks: summaries as (kind, device, name, detail, count, total, min, max), busy
    /// intervals as (device, kernels, start, end, busy, top name, top count, top ns).
    #[allow(clippy::type_complexity, reason = "a test's tuple view")]
    fn records(
        chunks: &[Vec<u8>],
    ) -> (
        Vec<(u32, u32, u32, u32, u64, u64, u64, u64)>,
        Vec<(u32, u32, u64, u64, u64, u32, u32, u64)>,
    ) {
        let (mut sums, mut busy) = (Vec::new(), Vec::new());
        for c in chunks {
            let mut off = core::mem::size_of::<GpuChunkHeader>();
            while off < c.len() {
                let kind = u16::from_le_bytes([c[off], c[off + 1]]);
                let size = u32_at(c, off + 4) as usize;
                let r = &c[off..off + size];
                if kind == GpuRecordKind::Summary as u16 {
                    sums.push((
                        u32_at(r, 12),
                        u32_at(r, 16),
                        u32_at(r, 20),
                        u32_at(r, 24),
                        u64_at(r, 32),
                        u64_at(r, 40),
                        u64_at(r, 48),
                        u64_at(r, 56),
                    ));
                } else if kind == GpuRecordKind::Busy as u16 {
                    busy.push((
                        u32_at(r, 8),
                        u32_at(r, 12),
                        u64_at(r, 16),
                        u64_at(r, 24),
                        u64_at(r, 32),
                        u32_at(r, 40),
                        u32_at(r, 44),
                        u64_at(r, 48),
                    ));
                }
                off += size;
            }
        }
        (sums, busy)
    }

    fn act(kind: GpuActivityKind, device: u32, start: u64, end: u64) -> GpuActivity {
        let mut a = crate::convert::activity(kind);
        a.device = device;
        a.start_ns = start;
        a.end_ns = end;
        a
    }

    #[test]
    fn kernels_sum_per_name_and_busy_intervals_keep_the_idle_time_inside() {
        let (mut s, mut p, mut sink) = (Summarizer::new(), Packer::new(), Collect::default());
        let k = GpuActivityKind::Kernel;
        // Step 1: gemm 0-10 µs, softmax 12-15 µs (a 2 µs gap: under the threshold), gemm 14-20 (overlaps).
        // Step 2 after a 100 µs gap: gemm 120-130. Added out of order: the window sorts them.
        for (start, end, name) in [
            (120_000, 130_000, 1),
            (0, 10_000, 1),
            (12_000, 15_000, 2),
            (14_000, 20_000, 1),
        ] {
            s.add(&act(k, 0, start, end), name, &mut p, &mut sink);
        }
        s.add(&act(GpuActivityKind::Sync, 0, 5, 25), 0, &mut p, &mut sink);
        assert_eq!(s.finish(1_000_000, &mut p, &mut sink), (3, 2));
        p.flush(&mut sink);
        let (sums, busy) = records(&sink.0);
        assert_eq!(
            sums,
            vec![
                (0, 0, 1, 0, 3, 26_000, 6_000, 10_000),
                (0, 0, 2, 0, 1, 3_000, 3_000, 3_000),
                (3, 0, 0, 0, 1, 20, 20, 20),
            ]
        );
        assert_eq!(
            busy,
            vec![
                (0, 3, 0, 20_000, 18_000, 1, 2, 16_000),
                (0, 1, 120_000, 130_000, 10_000, 1, 1, 10_000)
            ]
        );
    }

    #[test]
    fn an_open_interval_waits_for_the_next_window_unless_the_gpu_went_idle() {
        let (mut s, mut p, mut sink) = (Summarizer::new(), Packer::new(), Collect::default());
        let k = GpuActivityKind::Kernel;
        s.add(&act(k, 1, 0, 1_000), 7, &mut p, &mut sink);
        // The window's clock is 2 µs after the kernel: still open (the next kernel may continue it).
        assert_eq!(s.finish(3_000, &mut p, &mut sink), (1, 0));
        s.add(&act(k, 1, 2_000, 3_000), 7, &mut p, &mut sink);
        // Graph launches count as one kernel of name 0 and are not summed into rows.
        s.add(
            &act(GpuActivityKind::Graph, 1, 3_500, 9_000),
            0,
            &mut p,
            &mut sink,
        );
        assert_eq!(s.finish(1_000_000, &mut p, &mut sink), (1, 1));
        p.flush(&mut sink);
        let (_, busy) = records(&sink.0);
        assert_eq!(busy, vec![(1, 3, 0, 9_000, 7_500, 0, 1, 5_500)]);
        assert_eq!(s.window, 2);
    }

    #[test]
    fn work_reported_a_window_late_is_counted_once() {
        let (mut s, mut p, mut sink) = (Summarizer::new(), Packer::new(), Collect::default());
        let k = GpuActivityKind::Kernel;
        // Window 1: two kernels 100 ns apart, one interval, left open (the clock is close behind).
        s.add(&act(k, 0, 100_000, 200_000), 1, &mut p, &mut sink);
        s.add(&act(k, 0, 200_100, 300_000), 1, &mut p, &mut sink);
        s.finish(301_000, &mut p, &mut sink);
        // Window 2: another stream's kernel that started before them and completed during them.
        s.add(&act(k, 0, 50_000, 150_000), 2, &mut p, &mut sink);
        assert_eq!(s.finish(u64::MAX, &mut p, &mut sink).1, 1);
        // Window 3: a kernel that ran inside the interval handed over, reported later still: its own
        // interval; one that began inside it and ended after it: only what lies after it counts.
        s.add(&act(k, 0, 60_000, 70_000), 3, &mut p, &mut sink);
        s.add(&act(k, 0, 290_000, 310_000), 3, &mut p, &mut sink);
        assert_eq!(s.finish(u64::MAX, &mut p, &mut sink).1, 2);
        p.flush(&mut sink);
        let (_, busy) = records(&sink.0);
        let spans: Vec<(u32, u64, u64, u64)> = busy.iter().map(|b| (b.1, b.2, b.3, b.4)).collect();
        assert_eq!(
            spans,
            vec![
                (3, 50_000, 300_000, 249_900),
                (1, 60_000, 70_000, 10_000),
                (1, 300_000, 310_000, 10_000)
            ]
        );
    }

    #[test]
    fn a_flood_of_separated_kernels_raises_the_gap_threshold_and_rows_stay_bounded() {
        let (mut s, mut p, mut sink) = (Summarizer::new(), Packer::new(), Collect::default());
        let k = GpuActivityKind::Kernel;
        let mut t = 0;
        for w in 0..6 {
            for i in 0..1000u32 {
                // 1 µs kernels 10 µs apart, 1000 names: more than a window's rows.
                s.add(&act(k, 0, t, t + 1_000), i + 1, &mut p, &mut sink);
                t += 11_000;
            }
            let (rows, busy) = s.finish(t + 10_000_000, &mut p, &mut sink);
            assert_eq!(rows, (MAX_ROWS - OVERFLOW_ROWS + 1) as u64, "window {w}");
            assert!(busy <= MAX_BUSY_PER_WINDOW as u64 * 2 + 2, "window {w}: {busy}");
        }
        assert!(s.gap_ns(0) > 10_000, "{}", s.gap_ns(0));
        p.flush(&mut sink);
        let (sums, busy) = records(&sink.0);
        let total: u64 = sums.iter().map(|r| r.4).sum();
        assert_eq!(total, 6000, "every kernel counted once");
        let kernels: u64 = busy.iter().map(|b| u64::from(b.1)).sum();
        assert_eq!(kernels, 6000);
        let busy_ns: u64 = busy.iter().map(|b| b.4).sum();
        assert_eq!(
            busy_ns,
            6000 * 1_000,
            "busy time stays exact when intervals merge"
        );
    }
}
