//! The flight recorder: a low-overhead capture of each watched target kept running into a byte-bounded ring,
//! so an alert's trace can start with the seconds before the alert.
//!
//! Owns, per target, one long-lived [`Capture`] (engine probes + syscalls slower than a higher threshold than
//! `attach`'s, a smaller kernel ring) and a /metrics scraper, polled by one thread through a [`Merger`] into a
//! [`Ring`] of decoded events. The ring keeps at most `window` of history and never more than its byte
//! budget: when full it evicts the oldest events and counts them as dropped. It never blocks the target: the
//! kernel side is the same non-blocking ring as `attach`, and the recorder thread only ever waits on itself.
//! A session reads a [`FlightRecorder::snapshot`] once its own capture is live (see `attach::Prelude`).

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::capture::{Capture, CaptureConfig};
use crate::metrics_scrape::{self, Scraper};
use crate::proctree::{self, Tree};
use crate::sys::procfs;
use llmprof_trace::clock::boottime_ns;
use llmprof_trace::event::{Event, EventBody};
use llmprof_trace::merge::{DEFAULT_WINDOW_NS, Merger};
use llmprof_trace::names::marker;

use super::target::{self, TargetSpec};

/// Slow-syscall threshold of the recorder's capture: higher than `attach`'s 1 ms so an idle server's blocking
/// waits do not fill the ring; the session's own capture records the 1 ms ones from the alert on.
pub const RECORDER_SLOW_SYSCALL: Duration = Duration::from_millis(10);
/// Kernel ring of the recorder's capture (it is drained every [`POLL`], so bursts of ~100k events fit).
pub const RECORDER_RING_BYTES: usize = 8 << 20;
/// Poll period of the recorder thread.
const POLL: Duration = Duration::from_millis(50);
/// How soon a missing or exited target is looked up again; doubled after each failed capture start (a
/// persistent error, e.g. an engine of another probe ABI, must not reload eBPF programs every 2 s).
const RETRY: Duration = Duration::from_secs(2);
/// Longest wait between two capture starts that failed.
const MAX_RETRY: Duration = Duration::from_secs(60);
/// Longest a snapshot waits for the recorder to have drained everything before the cut.
const SNAPSHOT_WAIT: Duration = Duration::from_secs(3);

/// Bytes an event holds in the ring: the struct, its boxed record and its strings.
pub fn event_bytes(ev: &Event) -> usize {
    std::mem::size_of::<Event>()
        + match &ev.body {
            EventBody::Step(_) => std::mem::size_of::<llmprof_abi::StepRecord>(),
            EventBody::Request(_) => std::mem::size_of::<llmprof_abi::RequestRecord>(),
            EventBody::FileOpen { path, .. } => path.capacity(),
            EventBody::FileIo { path, .. } => path.as_ref().map_or(0, String::capacity),
            EventBody::Marker { text } => text.capacity(),
            _ => 0,
        }
}

/// A byte-bounded, time-bounded ring of ordered events.
#[derive(Debug)]
pub struct Ring {
    events: VecDeque<(Event, usize)>,
    bytes: usize,
    max_bytes: usize,
    window_ns: u64,
    dropped: u64,
}

impl Ring {
    /// An empty ring keeping `window` of history in at most `max_bytes`.
    pub fn new(window: Duration, max_bytes: usize) -> Ring {
        Ring {
            events: VecDeque::new(),
            bytes: 0,
            max_bytes,
            window_ns: u64::try_from(window.as_nanos()).unwrap_or(u64::MAX),
            dropped: 0,
        }
    }

    /// Appends an event (timestamps non-decreasing), first forgetting what is older than the window, then
    /// evicting the oldest (counted as dropped) while the budget would be exceeded.
    pub fn push(&mut self, ev: Event) {
        let size = event_bytes(&ev);
        self.expire(ev.ts_ns);
        if size > self.max_bytes {
            self.dropped += 1;
            return;
        }
        while self.bytes + size > self.max_bytes {
            let Some((_, s)) = self.events.pop_front() else {
                break;
            };
            self.bytes -= s;
            self.dropped += 1;
        }
        self.bytes += size;
        self.events.push_back((ev, size));
    }

    /// Forgets events older than the window before `now_ns` (normal ageing, not drops).
    pub fn expire(&mut self, now_ns: u64) {
        let horizon = now_ns.saturating_sub(self.window_ns);
        while self.events.front().is_some_and(|(e, _)| e.ts_ns < horizon) {
            if let Some((_, s)) = self.events.pop_front() {
                self.bytes -= s;
            }
        }
    }

    /// Copies the events of `pid` and of the processes of its tree (`tree`) with `from_ns <= ts < to_ns`, in
    /// order.
    pub fn snapshot(&self, pid: u32, tree: &HashSet<u32>, from_ns: u64, to_ns: u64) -> Vec<Event> {
        self.events
            .iter()
            .map(|(e, _)| e)
            .filter(|e| (e.pid == pid || tree.contains(&e.pid)) && e.ts_ns >= from_ns && e.ts_ns < to_ns)
            .cloned()
            .collect()
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Events held.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// Events evicted by the byte budget before they aged out.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// The byte budget.
    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }
}

/// What a recorder reports (healthz, metrics).
#[derive(Clone, Debug, serde::Serialize)]
pub struct RecorderStatus {
    /// The configured target.
    pub target: String,
    /// The process recorded now, if any.
    pub pid: Option<u32>,
    /// `recording`, `waiting: <why>` or `stopped`.
    pub state: String,
    /// Events in the ring.
    pub events: usize,
    /// Bytes in the ring.
    pub bytes: usize,
    /// Byte budget of the ring.
    pub max_bytes: usize,
    /// Events evicted by the budget.
    pub dropped: u64,
    /// Records the kernel ring dropped.
    pub kernel_dropped: u64,
}

struct Shared {
    ring: Mutex<Ring>,
    stop: AtomicBool,
    /// Everything older than this (BOOTTIME ns) is in the ring.
    watermark: AtomicU64,
    kernel_dropped: AtomicU64,
    state: Mutex<(Option<u32>, String)>,
    /// The target recorded now and every process of its tree recorded with it (process trees).
    tree: Mutex<(u32, HashSet<u32>)>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking holder leaves plain data behind; keep serving it.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One watched target's recorder thread.
pub struct FlightRecorder {
    spec: TargetSpec,
    window: Duration,
    shared: Arc<Shared>,
    handle: Option<JoinHandle<()>>,
}

impl FlightRecorder {
    /// Starts recording `spec` (resolved now and again whenever its process is gone).
    pub fn spawn(
        spec: TargetSpec,
        window: Duration,
        max_bytes: usize,
        scope: &target::PortNetns,
    ) -> std::io::Result<FlightRecorder> {
        let scope = scope.clone();
        let shared = Arc::new(Shared {
            ring: Mutex::new(Ring::new(window, max_bytes)),
            stop: AtomicBool::new(false),
            watermark: AtomicU64::new(0),
            kernel_dropped: AtomicU64::new(0),
            state: Mutex::new((None, "starting".into())),
            tree: Mutex::new((0, HashSet::new())),
        });
        let s2 = shared.clone();
        let handle = std::thread::Builder::new()
            .name(format!("llmprof-flight-{spec}"))
            .spawn(move || record(spec, &scope, &s2))?;
        Ok(FlightRecorder {
            spec,
            window,
            shared,
            handle: Some(handle),
        })
    }

    /// The pid recorded now.
    pub fn pid(&self) -> Option<u32> {
        let st = lock(&self.shared.state);
        (st.1 == "recording").then_some(st.0).flatten()
    }

    /// The recorder's history window.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Events of `pid` from `window` before `cut_ns` up to it; waits (at most [`SNAPSHOT_WAIT`]) until the
    /// recorder drained everything older than the cut.
    pub fn snapshot(&self, pid: u32, cut_ns: u64) -> Vec<Event> {
        snapshot(&self.shared, pid, cut_ns, self.window)
    }

    /// A closure form of [`FlightRecorder::snapshot`] for `attach::Prelude` (outlives the borrow of `self`).
    pub fn prelude(&self, pid: u32) -> crate::attach::Prelude {
        let (shared, window) = (self.shared.clone(), self.window);
        crate::attach::Prelude(Arc::new(move |cut| snapshot(&shared, pid, cut, window)))
    }

    /// Current status.
    pub fn status(&self) -> RecorderStatus {
        let ring = lock(&self.shared.ring);
        let st = lock(&self.shared.state);
        RecorderStatus {
            target: self.spec.to_string(),
            pid: st.0,
            state: st.1.clone(),
            events: ring.len(),
            bytes: ring.bytes(),
            max_bytes: ring.max_bytes(),
            dropped: ring.dropped(),
            kernel_dropped: self.shared.kernel_dropped.load(Ordering::Relaxed),
        }
    }
}

impl Drop for FlightRecorder {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn snapshot(shared: &Shared, pid: u32, cut_ns: u64, window: Duration) -> Vec<Event> {
    let deadline = Instant::now() + SNAPSHOT_WAIT;
    while shared.watermark.load(Ordering::Relaxed) < cut_ns && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let from = cut_ns.saturating_sub(u64::try_from(window.as_nanos()).unwrap_or(u64::MAX));
    let tree = {
        let t = lock(&shared.tree);
        if t.0 == pid { t.1.clone() } else { HashSet::new() }
    };
    let mut events = lock(&shared.ring).snapshot(pid, &tree, from, cut_ns);
    let drained = shared.watermark.load(Ordering::Relaxed);
    if drained < cut_ns {
        // The recorder fell behind (a loaded host): say where its history stops being complete.
        let at = drained.max(events.last().map_or(from, |e| e.ts_ns));
        events.push(Event {
            ts_ns: at.min(cut_ns.saturating_sub(1)),
            pid,
            tid: 0,
            body: EventBody::Marker {
                text: marker::flight_recorder_incomplete((cut_ns - drained) as f64 / 1e6),
            },
        });
    }
    events
}

fn set_state(shared: &Shared, pid: Option<u32>, state: String) {
    *lock(&shared.state) = (pid, state);
}

/// Sleeps `d` in small slices; false when asked to stop.
fn nap(shared: &Shared, d: Duration) -> bool {
    let end = Instant::now() + d;
    while Instant::now() < end {
        if shared.stop.load(Ordering::Relaxed) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    !shared.stop.load(Ordering::Relaxed)
}

/// The recorder thread: resolve, capture until the process is gone, repeat.
fn record(spec: TargetSpec, scope: &target::PortNetns, shared: &Shared) {
    let mut backoff = RETRY;
    while !shared.stop.load(Ordering::Relaxed) {
        let pid = match target::resolve(spec, &format!("--watch {spec}"), scope) {
            Ok(r) => r.pid,
            Err(e) => {
                set_state(shared, None, format!("waiting: {e}"));
                if !nap(shared, RETRY) {
                    break;
                }
                continue;
            }
        };
        match record_pid(pid, shared) {
            Ok(()) => backoff = RETRY,
            Err(e) => {
                let e = crate::causes::one_line(&e);
                eprintln!(
                    "llmprof serve: flight recorder for {spec} (pid {pid}): {e}; retrying in {backoff:?}"
                );
                set_state(shared, Some(pid), format!("waiting: {e}"));
                if !nap(shared, backoff) {
                    break;
                }
                backoff = (backoff * 2).min(MAX_RETRY);
            }
        }
    }
    set_state(shared, None, "stopped".into());
}

fn record_pid(pid: u32, shared: &Shared) -> Result<(), crate::capture::CaptureError> {
    // The same tree semantics as a session: the target, its descendants, every process it starts.
    let pids = proctree::descendants(&[pid]);
    let cfg = CaptureConfig {
        pids: pids.clone(),
        follow_children: true,
        slow_syscall: RECORDER_SLOW_SYSCALL,
        ring_bytes: RECORDER_RING_BYTES,
        ..Default::default()
    };
    let mut capture = Capture::start(&cfg)?;
    let mut tree = Tree::new(&pids, true);
    *lock(&shared.tree) = (pid, pids.iter().copied().collect());
    let (tx, rx) = mpsc::sync_channel(256);
    let scraper = metrics_scrape::discover_in(&pids, &mut HashSet::new())
        .and_then(|(p, url)| Scraper::spawn(p, url, metrics_scrape::DEFAULT_INTERVAL, tx).ok());
    set_state(shared, Some(pid), "recording".into());
    let mut merger = Merger::new(DEFAULT_WINDOW_NS);
    let (mut polled, mut ready) = (Vec::new(), Vec::new());
    let mut last_check = Instant::now();
    let result = loop {
        if shared.stop.load(Ordering::Relaxed) {
            break Ok(());
        }
        let before = boottime_ns();
        if let Err(e) = capture.poll(&mut polled, POLL) {
            break Err(e);
        }
        let mut exited = false;
        for mut ev in polled.drain(..) {
            let change = tree.on_event(&mut ev);
            exited |= matches!(ev.body, EventBody::ProcessExit { .. }) && ev.pid == pid;
            merger.push(ev);
            if let Some(p) = change.added.or(change.exec) {
                lock(&shared.tree).1.insert(p);
                let _ = proctree::attach_engine(&mut capture, p);
            }
        }
        while let Ok(ev) = rx.try_recv() {
            merger.push(ev);
        }
        merger.drain_at(boottime_ns(), &mut ready);
        {
            let mut ring = lock(&shared.ring);
            for ev in ready.drain(..) {
                ring.push(ev);
            }
            ring.expire(boottime_ns());
        }
        // Everything recorded before `before - window` has left the merge.
        shared
            .watermark
            .store(before.saturating_sub(DEFAULT_WINDOW_NS), Ordering::Relaxed);
        if last_check.elapsed() >= Duration::from_secs(1) {
            last_check = Instant::now();
            let dropped = capture.counters().iter().map(|c| c.dropped).sum();
            shared.kernel_dropped.store(dropped, Ordering::Relaxed);
            exited |= !procfs::alive(pid);
        }
        if exited {
            break Ok(());
        }
    };
    drop(scraper);
    result
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests {
    use super::*;

    fn ev(ts_ns: u64, pid: u32, text: &str) -> Event {
        llmprof_trace::testing::marker(pid, 0, ts_ns, text)
    }

    #[test]
    fn keeps_the_window_and_forgets_older_events() {
        let mut r = Ring::new(Duration::from_secs(10), 1 << 20);
        for s in 0..30u64 {
            r.push(ev(s * 1_000_000_000, 1, "x"));
        }
        // Events at 19..=29 s are within 10 s of the newest (29 s).
        assert_eq!(r.len(), 11);
        assert_eq!(r.dropped(), 0, "ageing out is not a drop");
        let snap = r.snapshot(1, &HashSet::from([1]), 25_000_000_000, 28_000_000_000);
        let ts: Vec<u64> = snap.iter().map(|e| e.ts_ns / 1_000_000_000).collect();
        assert_eq!(ts, vec![25, 26, 27]);
        assert!(
            r.snapshot(2, &HashSet::new(), 0, u64::MAX).is_empty(),
            "other pids are not in a snapshot"
        );
        r.push(ev(29_500_000_000, 7, "child"));
        assert_eq!(
            r.snapshot(1, &HashSet::from([7]), 29_000_000_000, u64::MAX).len(),
            2,
            "the processes of the target's tree are in its snapshot"
        );
    }

    #[test]
    fn enforces_the_byte_budget_and_counts_drops() {
        let one = event_bytes(&ev(0, 1, &"y".repeat(100)));
        let budget = one * 5;
        let mut r = Ring::new(Duration::from_secs(3600), budget);
        for i in 0..100u64 {
            r.push(ev(i, 1, &"y".repeat(100)));
            assert!(r.bytes() <= budget, "over budget after {i}: {}", r.bytes());
        }
        assert_eq!(r.len(), 5);
        assert_eq!(r.dropped(), 95);
        // The newest are kept.
        assert_eq!(
            r.snapshot(1, &HashSet::new(), 0, u64::MAX)
                .first()
                .map(|e| e.ts_ns),
            Some(95)
        );
        // An event larger than the whole budget is dropped, not stored.
        r.push(ev(200, 1, &"z".repeat(budget)));
        assert_eq!(r.dropped(), 96);
        assert!(r.bytes() <= budget);
    }
}
