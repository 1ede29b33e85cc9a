//! `llmprof attach`: one tracing session, from the checks to the finished trace.
//!
//! Owns the orchestration only: preflight checks (root, pid), starting [`Capture`], the poll loop that feeds
//! capture and the /metrics scraper through the [`Merger`] into the [`TraceSink`], the live status line, the
//! end conditions (stop flag from Ctrl-C/SIGTERM/SIGHUP, duration, target exit, `--max-trace-size`) and the final
//! statistics. The kernel side is all in `capture`; the trace layout is all in `llmprof_trace::perfetto`;
//! llmprof's own cost is in `selfacct`, the overhead budget in `budget`, the size cap in `sizecap` (this loop
//! only calls them).
//!
//! Parts: [`options`] (what a session is given and returns), [`start`] (the steps up to live probes, in
//! order), [`gpu`] (the GPU side), [`costs`] (llmprof's cost: calibration, self-accounting samples, the
//! overhead budget), [`write`] (the trace writes under the size cap), [`summary`] (the closing summary); this
//! file keeps [`run`] and the running session (live loop, finish, close).

/// Writes a line to stderr, ignoring a closed stderr (a caller that stopped reading it must not make a
/// session end abnormally: `eprintln!` panics on EPIPE).
macro_rules! note {
    () => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr());
    }};
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($t)*);
    }};
}

use std::collections::HashSet;
use std::fs::File;
use std::io::{self, IsTerminal};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

mod costs;
pub mod gpu;
mod options;
mod start;
pub mod summary;
mod write;

use costs::{CALIBRATION_WAIT, Costs};
pub use options::{
    AttachError, AttachOptions, AttachReport, END_INTERRUPTED, END_SIZE_LIMIT, END_TARGET_EXITED, Prelude,
    StopReason, TraceMetadata,
};
use start::{
    Inputs, open_inputs, open_sink, preflight, start_capture, start_gpu_kernels, start_python_hooks,
    start_scraper,
};
use write::{output_error, write_all};

use crate::budget::Budget;
use crate::capture::{Calibration, Capture, CaptureConfig, CaptureError, Cidr, EngineProbes};
use crate::cupti::GpuKernels;
use crate::metrics_scrape::{self, Scraper};
use crate::otel::{OtelError, OtelOptions, OtelSink, OtelStats, ResourceInfo};
use crate::proctree::{self, Tree};
use crate::selfacct::{Counters, SelfAccount, Snapshot, TargetCpu};
use crate::sys::procfs;
use gpu::{GpuOptions, GpuReport, GpuSession};
use llmprof_trace::clock::{WallClock, boottime_ns, realtime_ns};
use llmprof_trace::event::{Event, EventBody, ProcessInfo, SessionStats};
use llmprof_trace::merge::{DEFAULT_WINDOW_NS, Merger};
use llmprof_trace::names::marker;
use llmprof_trace::perfetto::{EventCounts, TraceSink};
use llmprof_trace::sizecap::SizeCap;

/// How long one poll of the ring buffer may wait when it is empty (bounds the reaction time to Ctrl-C and
/// the status-line period jitter; the ring is sized so 10 ms of events fit many times over).
const POLL_TIMEOUT: Duration = Duration::from_millis(10);
/// Period of the status line, the syscall-rate counter and the target liveness check.
const TICK: Duration = Duration::from_secs(1);
/// Period of the /proc walk that catches processes of the tree the kernel could not report.
const RESCAN: Duration = Duration::from_secs(5);
/// Capacity of the scraper → session queue (a scrape every 500 ms: this is minutes of slack).
const SAMPLER_QUEUE: usize = 1024;

/// The trace's BOOTTIME/REALTIME snapshot, with the session's one offset ([`WallClock`]); `None` (no snapshot: the
/// UI shows times from the trace start) if the clocks cannot be read.
fn clock_snapshot() -> Option<(u64, u64)> {
    let wall = WallClock::now().ok()?;
    let boot = boottime_ns();
    Some((boot, wall.to_unix_ns(boot)))
}

/// Default trace name: `llmprof-<pid>-<UTC yyyymmdd-hhmmss>.perfetto-trace`.
pub fn default_output(pid: u32) -> PathBuf {
    let (y, m, d, hh, mm, ss) = llmprof_trace::clock::utc_civil(realtime_ns() / 1_000_000_000);
    PathBuf::from(format!(
        "llmprof-{pid}-{y:04}{m:02}{d:02}-{hh:02}{mm:02}{ss:02}.perfetto-trace"
    ))
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Runs one session until `stop` is set, the duration elapsed or the target exited.
///
/// The steps, in order: [`preflight`], [`open_inputs`], [`start_capture`], [`open_sink`],
/// [`Session::write_prelude`], [`start_scraper`] (all in [`Session::start`]), [`Session::live_loop`],
/// [`Session::finish`] and [`Session::close`].
pub fn run(opts: &AttachOptions, stop: &AtomicBool) -> Result<AttachReport, AttachError> {
    let mut session = Session::start(opts)?;
    let end_reason = session.live_loop(stop)?;
    session.finish(end_reason)
}

/// A running session: what feeds it (capture, samplers), what it writes (the trace, spans), the merge between
/// them and the loop's own state.
struct Session<'a> {
    opts: &'a AttachOptions,
    /// `--gpu-kernels`: the CUPTI helper in the target (stopped before the last drain).
    gpu_kernels: GpuKernels,
    /// The Python hooks in the targets (removed before the last drain).
    py_hooks: crate::pyhooks::PyHooks,
    capture: Capture,
    gpu: GpuSession,
    otel: Option<OtelSink>,
    sink: TraceSink<File>,
    /// Samples of the NVML sampler and the /metrics scraper.
    rx: Receiver<Event>,
    scraper: Option<Scraper>,
    metrics_url: Option<String>,
    /// The scraper's queue end, kept while /metrics is still looked for in the tree.
    scraper_tx: Option<SyncSender<Event>>,
    /// (pid, port) pairs /metrics discovery asked already.
    metrics_tried: HashSet<(u32, u16)>,
    /// The traced processes (process trees).
    tree: Tree,
    /// Their CPU time, shared with the self-accounting and the budget.
    targets: TargetCpu,
    /// The last /proc walk for processes of the tree the kernel did not report.
    last_rescan: Instant,
    /// llmprof's cost: self-accounting, calibration, budget.
    costs: Costs,
    engine_probes: EngineProbes,
    attach_latency: Duration,
    /// `--max-trace-size`.
    cap: Option<SizeCap>,
    /// Live events older than this are not written (the prelude covers them).
    floor_ns: u64,
    /// Events lost to `--max-trace-size`.
    not_written: u64,
    merger: Merger,
    /// Events from one poll of the ring.
    polled: Vec<Event>,
    /// Events the merge released, in order, to be written.
    ready: Vec<Event>,
    /// Start of the live loop.
    start: Instant,
    last_tick: Instant,
    /// Syscalls counted at the last tick (for the rate counter).
    last_sys: u64,
    events_total: u64,
    events_at_tick: u64,
    target_exited: bool,
    /// The target's exit came as an event (else the trace gets a `target exited` marker).
    exit_event_seen: bool,
    /// Show the live status line.
    tty: bool,
    /// The first target's name (for the summary).
    target_name: String,
}

impl<'a> Session<'a> {
    /// The counters the self-accounting charges: the capture's and the CUPTI helpers'.
    fn counters(&self) -> crate::selfacct::Counters {
        crate::selfacct::Counters {
            cupti: self.gpu_kernels.counters(),
            python_hooks: self.py_hooks.counters(),
            ..Counters::of(&self.capture)
        }
    }

    /// Steps 1 to 6: checks, inputs, capture, trace file, prelude, scraper; then the probes are live and
    /// the trace is being written.
    fn start(opts: &'a AttachOptions) -> Result<Self, AttachError> {
        let t0 = Instant::now();
        let (cap, mut infos) = preflight(opts)?;
        log::debug!("attach: preflight done at {:?}", t0.elapsed());
        // `--gpu-kernels`: the helper is loaded before anything else (an `on` refusal loads nothing).
        let tree: Vec<u32> = infos.iter().map(|i| i.pid).collect();
        let mut gpu_kernels =
            GpuKernels::prepare(opts.gpu.kernels, &tree).map_err(AttachError::GpuKernels)?;
        log::debug!("attach: GPU kernels prepared at {:?}", t0.elapsed());
        let mut inputs = open_inputs(opts)?;
        log::debug!("attach: inputs open at {:?}", t0.elapsed());
        let mut started = start_capture(opts, t0, &mut inputs, &mut infos)?;
        log::debug!("attach: capture started at {:?}", t0.elapsed());
        let strict = opts.gpu.kernels.strict();
        start_gpu_kernels(strict, &mut gpu_kernels, &mut started.capture)?;
        let (py_hooks, hook_lines) = start_python_hooks(opts, &tree, &mut started.capture)?;
        // A process with Python hooks records on the engine tracks.
        let hooked = py_hooks.hooked_pids();
        for i in infos.iter_mut() {
            i.engine_probes |= hooked.contains(&i.pid);
        }
        let sink = open_sink(opts, &infos)?;
        let pids: Vec<u32> = infos.iter().map(|i| i.pid).collect();
        let Inputs {
            tx,
            rx,
            gpu,
            gpu_markers,
            otel,
        } = inputs;
        let mut session = Session {
            opts,
            gpu_kernels,
            py_hooks,
            capture: started.capture,
            gpu,
            otel,
            sink,
            rx,
            scraper: None,
            metrics_url: None,
            scraper_tx: None,
            metrics_tried: HashSet::new(),
            tree: Tree::new(&pids, opts.follow_children),
            targets: started.targets.clone(),
            last_rescan: Instant::now(),
            costs: Costs::new(started.acct, started.budget),
            engine_probes: started.engine_probes,
            attach_latency: started.attach_latency,
            cap,
            floor_ns: 0,
            not_written: 0,
            merger: Merger::new(DEFAULT_WINDOW_NS),
            polled: Vec::with_capacity(4096),
            ready: Vec::with_capacity(4096),
            start: Instant::now(),
            last_tick: Instant::now(),
            last_sys: 0,
            events_total: 0,
            events_at_tick: 0,
            target_exited: false,
            exit_event_seen: false,
            tty: opts.live_status && io::stderr().is_terminal(),
            target_name: infos.first().map(|i| i.name.clone()).unwrap_or_default(),
        };
        session.write_prelude(started.live_ns)?;
        (session.metrics_url, session.scraper) =
            start_scraper(opts, &pids, &mut session.metrics_tried, tx.clone());
        if session.scraper.is_none() && opts.metrics_url.is_none() && opts.follow_children {
            session.scraper_tx = Some(tx);
        }
        // Children forked between the /proc walk and the moment the targets entered the traced set.
        let late = session.tree.rescan(started.live_ns);
        session.join(late)?;
        session.costs.start_calibration(opts, &session.capture);
        if opts.overhead_budget.is_some() {
            // The budget judges by the costs per hit: it holds from the first window only once they are
            // measured, so a budgeted session has them before it says it is live (the probes already record
            // into the ring meanwhile).
            session.costs.calibration_step(Some(CALIBRATION_WAIT));
        }
        note!(
            "llmprof: probes live after {:.1} ms; writing {}",
            session.attach_latency.as_secs_f64() * 1e3,
            opts.output.display()
        );
        session.start = Instant::now();
        for ev in gpu_markers {
            session.merger.push(ev);
        }
        for line in hook_lines {
            session.push_marker(line);
        }
        session.last_tick = Instant::now();
        session.costs.restart_budget_clock();
        session.last_sys = session.capture.syscall_total();
        Ok(session)
    }

    /// Step 5: with a prelude, writes the history before `live_ns` and starts the live capture there: live events
    /// older than it (seen by both captures while the probes were attaching) are dropped, so the two never
    /// interleave. Then the metadata instant, at `live_ns`.
    fn write_prelude(&mut self, live_ns: u64) -> Result<(), AttachError> {
        let out_err = output_error(&self.opts.output);
        let mut started = live_ns;
        if let Some(p) = &self.opts.prelude {
            let mut history = (p.0)(live_ns);
            started = history
                .iter()
                .map(|e| e.ts_ns)
                .min()
                .unwrap_or(live_ns)
                .min(live_ns);
            write_all(
                &mut self.sink,
                &mut self.otel,
                &mut history,
                0,
                self.cap.as_ref(),
                &mut self.not_written,
            )
            .map_err(&out_err)?;
            self.floor_ns = live_ns;
        }
        // Where the trace's view begins: a request that arrived before it was in flight at attach.
        self.sink
            .marker(started, marker::TRACING_STARTED)
            .map_err(&out_err)?;
        if let Some(m) = &self.opts.metadata {
            self.sink
                .annotation(live_ns, &m.event, &m.args)
                .map_err(out_err)?;
        }
        Ok(())
    }

    /// Step 7: polls capture and the samplers into the merge and writes what it releases, until an end
    /// condition; the `end_reason`.
    fn live_loop(&mut self, stop: &AtomicBool) -> Result<&'static str, AttachError> {
        loop {
            if let Some(reason) = self.end_condition(stop) {
                return Ok(reason);
            }
            if self.costs.calibration_step(None) {
                // The costs per hit on the timeline now, not at the next tick (a short session has none).
                self.overhead_sample();
            }
            self.costs
                .budget_step(&mut self.capture, &self.targets, &mut self.merger)?;
            self.capture.poll(&mut self.polled, POLL_TIMEOUT)?;
            self.take_polled();
            while let Ok(ev) = self.rx.try_recv() {
                self.merger.push(ev);
            }
            if self.last_tick.elapsed() >= TICK {
                self.tick();
            }
            self.merger.drain_at(boottime_ns(), &mut self.ready);
            self.events_total += self.ready.len() as u64;
            if self.write_ready()? {
                return Ok(END_SIZE_LIMIT);
            }
        }
    }

    /// Moves the polled events into the merge, reacting to the process records on the way: a process that
    /// joins the tree or executes a program gets its engine probes (when its image has them) and its libcuda
    /// watched; the last traced process's exit ends the session.
    fn take_polled(&mut self) {
        let mut polled = std::mem::take(&mut self.polled);
        for mut ev in polled.drain(..) {
            let change = self.tree.on_event(&mut ev);
            let ts = ev.ts_ns;
            self.merger.push(ev);
            if let Some(pid) = change.added.or(change.exec) {
                self.new_image(pid, ts, change.exec.is_some());
            }
            if let Some(pid) = change.exited {
                self.gpu.forget_process(pid);
                self.capture.forget_python(pid);
                self.capture.process_left(pid);
                self.targets.remove(pid);
                if self.tree.all_exited() {
                    self.target_exited = true;
                    self.exit_event_seen = true;
                }
            }
        }
        self.polled = polled;
    }

    /// A process joined the session or executed a program (`exec`): engine probes, Python sampling, libcuda
    /// watch.
    fn new_image(&mut self, pid: u32, ts: u64, exec: bool) {
        let engine = proctree::attach_engine(&mut self.capture, pid);
        let python = self.capture.watch_python(pid, exec);
        self.capture.process_joined(pid);
        for text in engine.into_iter().chain(python) {
            self.merger.push(Event {
                ts_ns: ts,
                pid,
                tid: 0,
                body: EventBody::Marker { text },
            });
        }
        self.gpu.watch_process(pid);
        self.targets.add(pid);
    }

    /// Processes found in /proc that the kernel did not report: they join with a synthetic start.
    fn join(&mut self, events: Vec<Event>) -> Result<(), AttachError> {
        let pids: Vec<u32> = events.iter().map(|e| e.pid).collect();
        if pids.is_empty() {
            return Ok(());
        }
        self.capture.trace_pids(&pids)?;
        for ev in events {
            let (pid, ts) = (ev.pid, ev.ts_ns);
            self.merger.push(ev);
            self.new_image(pid, ts, false);
        }
        Ok(())
    }

    /// The Python hooks in the processes of `pids` that want them and were not considered yet; each outcome
    /// said on stderr and as a marker.
    fn hook_python(&mut self, pids: &[u32]) {
        for line in self.py_hooks.start(pids, &mut self.capture) {
            note!("llmprof: {line}");
            self.push_marker(line);
        }
    }

    /// A marker on the first target's track, now.
    fn push_marker(&mut self, text: String) {
        self.merger.push(Event {
            ts_ns: boottime_ns(),
            pid: self.opts.pid,
            tid: 0,
            body: EventBody::Marker { text },
        });
    }

    /// Why the live loop ends now, if it does: the stop flag (with its [`StopReason`]), the duration, the
    /// target's exit.
    fn end_condition(&self, stop: &AtomicBool) -> Option<&'static str> {
        // Acquire: pairs with the Release of whoever set a stop reason before the flag.
        if stop.load(Ordering::Acquire) {
            return Some(self.opts.stop_reason.get().unwrap_or(END_INTERRUPTED));
        }
        if self.opts.duration.is_some_and(|d| self.start.elapsed() >= d) {
            return Some("duration elapsed");
        }
        self.target_exited.then_some(END_TARGET_EXITED)
    }

    /// The self-accounting's sample since the last one, onto the timeline; the estimated overhead %.
    fn overhead_sample(&mut self) -> Option<f64> {
        let counters = self.counters();
        self.costs.overhead_sample(counters, &mut self.merger)
    }

    /// Once per [`TICK`]: the syscall-rate and overhead counters, the target's liveness, a late libcuda, and
    /// the status line.
    fn tick(&mut self) {
        let dt = self.last_tick.elapsed().as_secs_f64();
        self.last_tick = Instant::now();
        let sys = self.capture.syscall_total();
        let per_sec = sys.saturating_sub(self.last_sys) as f64 / dt;
        self.last_sys = sys;
        self.merger.push(Event {
            ts_ns: boottime_ns(),
            pid: self.opts.pid,
            tid: 0,
            body: EventBody::SyscallRate { per_sec },
        });
        self.costs.live_cost_step(self.start.elapsed(), &mut self.capture);
        let est_pct = self.overhead_sample();
        // The kernel picks new processes up itself; the /proc walk (every process's stat) only catches what it
        // could not report (a full map or ring), so it runs every few ticks.
        if self.last_rescan.elapsed() >= RESCAN {
            self.last_rescan = Instant::now();
            let late = self.tree.rescan(boottime_ns());
            if let Err(e) = self.join(late) {
                log::debug!("proctree: {e}");
            }
        } else {
            self.tree.prune();
        }
        if self.tree.all_exited() {
            self.target_exited = true;
        }
        if self.scraper.is_none()
            && let Some(tx) = &self.scraper_tx
        {
            let live: Vec<u32> = self.tree.live().collect();
            if let Some((pid, url)) = metrics_scrape::discover_in(&live, &mut self.metrics_tried) {
                match Scraper::spawn(pid, url.clone(), metrics_scrape::DEFAULT_INTERVAL, tx.clone()) {
                    Ok(s) => {
                        note!("llmprof: scraping {url} (pid {pid})");
                        self.metrics_url = Some(url);
                        self.scraper = Some(s);
                        self.scraper_tx = None;
                    }
                    Err(e) => note!("warning: cannot start the /metrics scraper: {e}"),
                }
            }
        }
        for ev in self.gpu.watch_cuda(&mut self.capture, false) {
            self.merger.push(ev);
        }
        // A process of the tree that loaded CUDA since (vLLM's engine core, PyTorch's lazy init) gets the helper.
        let live: Vec<u32> = self.tree.live().collect();
        if live.iter().filter(|&&p| self.gpu_kernels.adopt(p)).count() > 0 {
            let _ = start_gpu_kernels(false, &mut self.gpu_kernels, &mut self.capture);
        }
        // A Python process of the tree started since (vLLM's engine core) gets the Python hooks.
        self.hook_python(&live);
        // Listening sockets opened since the last tick (a server that binds late) are followed from now on.
        if let Err(e) = self.capture.refresh_http() {
            log::debug!("wire probe: {e}");
        }
        if self.tty {
            let drops: u64 = self.capture.counters().iter().map(|c| c.dropped).sum();
            let rate = (self.events_total - self.events_at_tick) as f64 / dt;
            self.events_at_tick = self.events_total;
            eprint!(
                "\r\x1b[2K[llmprof] {:>6.1}s  {} events ({:.0}/s)  drops {}  est. overhead {}  {:.1} MiB → {}",
                self.start.elapsed().as_secs_f64(),
                self.events_total,
                rate,
                drops,
                est_pct.map_or("-".to_owned(), |p| format!("{p:.2}%")),
                self.sink.bytes() as f64 / (1 << 20) as f64,
                self.opts.output.display()
            );
        }
    }

    /// Writes the events the merge released ([`write_all`]); true when the size cap was reached.
    fn write_ready(&mut self) -> Result<bool, AttachError> {
        write_all(
            &mut self.sink,
            &mut self.otel,
            &mut self.ready,
            self.floor_ns,
            self.cap.as_ref(),
            &mut self.not_written,
        )
        .map_err(output_error(&self.opts.output))
    }

    /// Step 8: the last drain (the ring up to the stop, then everything the merge holds) and the end markers;
    /// then [`Session::close`].
    fn finish(mut self, end_reason: &'static str) -> Result<AttachReport, AttachError> {
        if self.tty {
            note!();
        }
        // A session shorter than its calibration waits for it: the summary charges the measured costs, and
        // the trace's cost counters have a value.
        if self.costs.calibration_step(Some(CALIBRATION_WAIT)) {
            self.overhead_sample();
        }
        // The helper's last chunks (its stop flushes) pass the handoff uprobe before the last drain.
        self.gpu_kernels.stop();
        // Every Python hook removed while its engine uprobes still record: the functions are the originals again.
        for line in self.py_hooks.stop() {
            note!("llmprof: {line}");
            self.push_marker(line);
        }
        self.capture.poll(&mut self.polled, Duration::ZERO)?;
        self.capture.release_held(&mut self.polled);
        self.capture.flush_cuda_counts(&mut self.polled);
        self.take_polled();
        while let Ok(ev) = self.rx.try_recv() {
            self.merger.push(ev);
        }
        self.merger.finish(&mut self.ready);
        self.events_total += self.ready.len() as u64;
        let size_limited = end_reason == END_SIZE_LIMIT || self.write_ready()?;
        if size_limited {
            self.not_written += self.ready.len() as u64;
            self.ready.clear();
        }
        let end_ts = boottime_ns();
        let out_err = output_error(&self.opts.output);
        if size_limited && let Some(c) = &self.cap {
            let text = marker::size_limit_reached(c.limit(), self.not_written);
            self.sink.marker(end_ts, &text).map_err(&out_err)?;
        }
        if end_reason == END_TARGET_EXITED && !self.exit_event_seen {
            self.sink
                .marker(end_ts, marker::TARGET_EXITED)
                .map_err(&out_err)?;
        }
        self.close(end_ts, if size_limited { END_SIZE_LIMIT } else { end_reason })
    }

    /// Step 9: stops the samplers, writes the statistics into the trace's summary and closes the file, detaches
    /// the probes, ends the span export; the session's report.
    fn close(mut self, end_ts: u64, end_reason: &'static str) -> Result<AttachReport, AttachError> {
        let out_err = output_error(&self.opts.output);
        let gpu = self.gpu.finish();
        let user_drops = self.scraper.as_ref().map(Scraper::dropped).unwrap_or(0) + gpu.dropped;
        drop(self.scraper);
        // An engine that appeared in the tree during the session counts as the session's.
        if let Some(e) = self.capture.any_engine() {
            self.engine_probes = e;
        }
        self.costs.finish_live_cost(&mut self.capture);
        let final_counters = crate::selfacct::Counters {
            cupti: self.gpu_kernels.counters(),
            python_hooks: self.py_hooks.counters(),
            ..Counters::of(&self.capture)
        };
        let mut overhead = self.costs.summary(final_counters);
        overhead.size_limit = self.cap.map(|c| c.limit());
        overhead.events_not_written = self.not_written;
        if let Some(s) = self.capture.sampler().map(|s| s.stats())
            && s.samples > 0
        {
            overhead.symbolized_stacks = s.samples;
            overhead.symbolize_ns = s.time.as_nanos() as f64;
            overhead.symbolize_addresses = s.resolved;
            overhead.symbolize_unknown = s.unknown;
            overhead.symbolize_unmapped = s.unmapped;
            overhead.symbolize_resolve_ns = s.resolve_time.as_nanos() as f64;
        }
        let stats = SessionStats {
            overhead: Some(overhead),
            probes: final_counters.probes,
            decode_errors: self.capture.decode_errors(),
            user_drops,
            trace_bytes: 0,
            end_reason: end_reason.to_owned(),
            syscalls: self.capture.syscall_aggregates(),
            gpu: self.capture.gpu_stats(),
            offcpu_not_taken: self.capture.offcpu_not_taken(),
        };
        let mut sink = self.sink;
        sink.flush_cuda().map_err(&out_err)?;
        let counts = sink.counts().clone();
        let cuda = sink.cuda_stats();
        let trace_bytes_before = sink.bytes();
        let file = sink.finish(&stats, Some(end_ts)).map_err(&out_err)?;
        file.sync_all().map_err(&out_err)?;
        let trace_bytes = file.metadata().map(|m| m.len()).unwrap_or(trace_bytes_before);
        // Detach everything before reporting.
        if self.capture.cuda_links() > 0 {
            note!(
                "llmprof: trace written; detaching {} CUDA driver probes (the kernel takes a while per probe)",
                self.capture.cuda_links()
            );
        }
        let wire = self.capture.wire_stats();
        let symbolize = self.capture.sampler().map(|s| s.stats());
        let python_processes = self.capture.python().targets().len();
        drop(self.capture);
        let otel = self.otel.map(OtelSink::finish);
        Ok(AttachReport {
            trace: self.opts.output.clone(),
            trace_bytes,
            stats: SessionStats { trace_bytes, ..stats },
            counts,
            late_events: self.merger.late(),
            attach_latency: self.attach_latency,
            elapsed: self.start.elapsed(),
            engine_probes: self.engine_probes,
            processes: self.tree.total(),
            metrics_url: self.metrics_url,
            otel,
            gpu,
            cuda,
            target: (self.opts.pid, self.target_name),
            wire,
            symbolize,
            python_processes,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests {
    use super::*;

    #[test]
    fn default_name_has_pid_and_utc_timestamp() {
        let n = default_output(42).display().to_string();
        assert!(n.starts_with("llmprof-42-20"), "{n}");
        assert!(n.ends_with(".perfetto-trace"));
        assert_eq!(n.len(), "llmprof-42-20261125-220000.perfetto-trace".len());
    }
}
