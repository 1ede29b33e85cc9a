//! The session manager: turns alerts into tracing sessions and keeps the output directory within its quota.
//!
//! Owns the rules (all decided under one lock, so concurrent posts cannot race past them):
//! - dedupe: a firing alert whose fingerprint has a running session, or a failed one less than `cooldown` ago,
//!   starts nothing (Alertmanager re-sends the same alert on every group change and repeat);
//! - cooldown: a target with a running session, or one that ended less than `cooldown` ago, gets no new one;
//! - cap: at most `max_sessions` run at once; alerts over the cap start nothing (a later re-send may);
//! - an alert that resolves to no process is a failed session with the reason (so is one with a bad
//!   `llmprof_duration`, which the HTTP layer rejects before it gets here); a `resolved` alert stops its running
//!   session early;
//! - quota: after each session and every second, the oldest finished traces are removed until the directory
//!   fits; a trace in progress is never removed (if those alone exceed the quota, the newest sessions stop).
//!
//! Each session runs `attach::run` on its own thread (the same capture as `llmprof attach`), with the alert in
//! the trace's metadata and, when a flight recorder watches the target, its history as the trace's prelude.
//! The HTTP layer never waits for a session. A session still running past its duration plus
//! [`crate::watchdog`]'s grace is asked to stop, and past the end grace too it is abandoned: failed with the
//! reason, its slot freed (its thread, stuck on something the target set up, is left behind).
//!
//! A batch of alerts (one webhook, one poll) is resolved against one look at `/proc`
//! ([`target::Snapshot`]); at most [`MAX_ALERTS_PER_BATCH`] alerts of a batch are handled, the rest counted
//! (`llmprof_serve_alerts_over_cap_total`) and reported; per-alert log lines are rate-limited
//! ([`super::say`]).
//!
//! The rules share one lock and one state, so they stay in this file where a reviewer reads them together;
//! beside it: `session` (what a session is and what `GET /v1/sessions` shows), `files` (trace file names and
//! the quota's removals), `watchdog` (sessions past their duration).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::attach::{self, AttachOptions, Prelude, StopReason, TraceMetadata};
use llmprof_trace::clock::{realtime_ns, rfc3339};
use llmprof_trace::names::{arg, marker};

use super::allow::AllowList;
use super::flight::FlightRecorder;
use super::metrics::{Gauges, Metrics};
use super::quota;
use super::say;
use super::target::{self, ResolveConfig, Snapshot};
use super::webhook::{Alert, AlertStatus};

mod files;
mod session;
mod watchdog;

use session::Session;
pub use session::{Outcome, SessionView, State, TraceLookupError};

pub use super::webhook::DURATION_ANNOTATION;
/// `end_reason` (API and trace) of a session stopped by its alert's `resolved` notification.
pub const END_RESOLVED: &str = "alert resolved";
/// `end_reason` of a session stopped because the traces in progress exceed `--max-disk`.
pub const END_DISK_QUOTA: &str = "disk quota";
/// `end_reason` of a session stopped by serve's own shutdown (SIGTERM/SIGHUP/Ctrl-C).
pub const END_SHUTDOWN: &str = "llmprof serve stopped";
/// `end_reason` of a session the watchdog gave up on.
pub const END_ABANDONED: &str = "did not end within its duration and grace";
/// Most alerts of one webhook or poll that are handled (Alertmanager's groups are far smaller; a larger batch
/// is a storm or an attack, and each alert costs a look at `/proc`).
pub const MAX_ALERTS_PER_BATCH: usize = 500;
/// Sessions remembered for `GET /v1/sessions` (oldest finished ones are forgotten first; files stay).
pub const MAX_HISTORY: usize = 1000;
/// Memory the session history may hold (labels and annotations come from the network: up to `--max-body`
/// each); the oldest ended sessions are forgotten first, running ones never.
pub const MAX_HISTORY_BYTES: usize = 8 << 20;

/// How sessions are run.
#[derive(Clone, Debug)]
pub struct ManagerConfig {
    /// Where traces go.
    pub out_dir: PathBuf,
    /// How alert labels are read (the default target and the `pid` label's namespace).
    pub resolve: ResolveConfig,
    /// What alerts may trace.
    pub allow: AllowList,
    /// Session length without a `llmprof_duration` annotation.
    pub default_duration: Duration,
    /// Longest session an annotation may ask for.
    pub max_duration: Duration,
    /// Most sessions at once.
    pub max_sessions: usize,
    /// Per target (and per failed fingerprint): quiet time after a session.
    pub cooldown: Duration,
    /// Bytes of traces the directory may hold (None: unbounded).
    pub disk_quota: Option<u64>,
    /// The capture options of every session (pid, duration, output, metadata and prelude are set per session).
    pub template: AttachOptions,
}

struct Inner {
    sessions: BTreeMap<u64, Session>,
    next_id: u64,
}

/// The manager (shared by the HTTP handlers and the session threads).
pub struct Manager {
    cfg: ManagerConfig,
    inner: Mutex<Inner>,
    recorders: Vec<FlightRecorder>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    metrics: Arc<Metrics>,
    disk_bytes: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn now_rfc3339() -> String {
    rfc3339(realtime_ns() / 1_000_000_000)
}

impl Manager {
    /// A manager; `recorders` are the flight recorders of the watched targets.
    pub fn new(cfg: ManagerConfig, recorders: Vec<FlightRecorder>, metrics: Arc<Metrics>) -> Manager {
        Manager {
            cfg,
            inner: Mutex::new(Inner {
                sessions: BTreeMap::new(),
                next_id: 1,
            }),
            recorders,
            threads: Mutex::new(Vec::new()),
            metrics,
            disk_bytes: AtomicU64::new(0),
        }
    }

    /// The flight recorders.
    pub fn recorders(&self) -> &[FlightRecorder] {
        &self.recorders
    }

    /// The session this firing alert repeats: running, or failed without a trace within the cooldown.
    fn deduped(inner: &Inner, fingerprint: &str, cooldown: Duration) -> Option<Outcome> {
        inner
            .sessions
            .values()
            .rev()
            .find(|s| {
                s.view.fingerprint == fingerprint
                    && (s.view.state == State::Running
                        || (s.view.state == State::Failed
                            && s.view.trace.is_none()
                            && s.created.elapsed() < cooldown))
            })
            .map(|s| Outcome::Deduped {
                fingerprint: fingerprint.to_owned(),
                session: s.view.id,
            })
    }

    /// One look at `/proc` for a batch of alerts ([`Manager::handle_in`], [`Manager::is_local`]).
    pub fn snapshot(&self) -> Snapshot {
        Snapshot::take(&self.cfg.resolve.port_netns)
    }

    /// Fleet mode ([`super::pull`]): whether this node would trace the alert — its target resolves here and
    /// the allow-list lets it be traced — by the same rules as [`Manager::handle`], without a session.
    pub fn is_local(&self, alert: &Alert, snap: &mut Snapshot) -> bool {
        target::resolve_alert_in(alert, &self.cfg.resolve, snap)
            .is_ok_and(|t| self.cfg.allow.check(t.pid, snap).is_ok())
    }

    /// Handles one alert (a batch of one).
    pub fn handle(self: &Arc<Self>, alert: &Alert) -> Outcome {
        self.handle_in(alert, &mut self.snapshot())
    }

    /// Counts and says the alerts of a batch left out by [`MAX_ALERTS_PER_BATCH`].
    pub fn over_cap(&self, what: &str, left_out: usize) {
        if left_out == 0 {
            return;
        }
        self.metrics
            .alerts_over_cap
            .fetch_add(left_out as u64, Ordering::Relaxed);
        say::line(&format!(
            "{what}: {left_out} alerts beyond the first {MAX_ALERTS_PER_BATCH} not handled"
        ));
    }

    /// Handles one alert of a batch, with the batch's look at `/proc`.
    pub fn handle_in(self: &Arc<Self>, alert: &Alert, snap: &mut Snapshot) -> Outcome {
        let fingerprint = alert.fingerprint.clone();
        let mut inner = lock(&self.inner);
        if alert.status == AlertStatus::Resolved {
            Metrics::inc(&self.metrics.alerts_resolved);
            let running = inner
                .sessions
                .values_mut()
                .find(|s| s.view.state == State::Running && s.view.fingerprint == fingerprint);
            return match running {
                Some(s) => {
                    s.stop_reason.set(END_RESOLVED);
                    s.stop.store(true, Ordering::Release);
                    Metrics::inc(&self.metrics.sessions_resolved_early);
                    Outcome::Stopped {
                        fingerprint,
                        session: s.view.id,
                    }
                }
                None => Outcome::Ignored { fingerprint },
            };
        }
        Metrics::inc(&self.metrics.alerts_firing);
        let cooldown = self.cfg.cooldown;
        if let Some(o) = Self::deduped(&inner, &fingerprint, cooldown) {
            Metrics::inc(&self.metrics.sessions_deduped);
            return o;
        }
        drop(inner);
        // /proc walks (and a host name lookup) without the lock: the API's handlers and gauges take it.
        let resolved = match target::resolve_alert_in(alert, &self.cfg.resolve, snap) {
            Ok(t) => match self.cfg.allow.check(t.pid, snap) {
                Ok(()) => Ok(t),
                Err(refusal) => {
                    Metrics::inc(&self.metrics.sessions_refused);
                    Err((Some(t), refusal.to_string()))
                }
            },
            Err(e) => Err((None, e.to_string())),
        };
        let mut inner = lock(&self.inner);
        // Another copy of this alert may have started a session meanwhile.
        if let Some(o) = Self::deduped(&inner, &fingerprint, cooldown) {
            Metrics::inc(&self.metrics.sessions_deduped);
            return o;
        }
        // The HTTP layer rejects a bad annotation before handling the payload; a caller that did not check it
        // gets a failed session with the reason.
        let duration = alert
            .requested_duration()
            .map(|d| d.map_or(self.cfg.default_duration, |d| d.min(self.cfg.max_duration)))
            .map_err(|e| e.to_string());
        let id = inner.next_id;
        let mut view = SessionView {
            id,
            alert: alert.name().to_owned(),
            fingerprint: fingerprint.clone(),
            labels: alert.labels.clone(),
            annotations: alert.annotations.clone(),
            target_pid: None,
            target: None,
            state: State::Failed,
            reason: None,
            end_reason: None,
            trace: None,
            trace_removed: false,
            bytes: 0,
            drops: 0,
            prelude_events: 0,
            duration_s: duration.as_ref().map_or(0.0, Duration::as_secs_f64),
            created_at: now_rfc3339(),
            ended_at: None,
        };
        let (target, duration) = match (resolved, duration) {
            (Ok(t), Ok(d)) => (t, d),
            (Err((t, e)), _) => {
                if let Some(t) = t {
                    view.target_pid = Some(t.pid);
                    view.target = Some(t.how);
                }
                return self.fail(&mut inner, view, e);
            }
            (Ok(t), Err(e)) => {
                view.target_pid = Some(t.pid);
                view.target = Some(t.how);
                return self.fail(&mut inner, view, e);
            }
        };
        view.target_pid = Some(target.pid);
        view.target = Some(target.how.clone());
        // Cooldown per target.
        if let Some(s) = inner.sessions.values().rev().find(|s| {
            s.view.target_pid == Some(target.pid)
                && (s.view.state == State::Running || s.ended.is_some_and(|e| e.elapsed() < cooldown))
                && s.view.trace.is_some()
        }) {
            Metrics::inc(&self.metrics.skipped_cooldown);
            let reason = if s.view.state == State::Running {
                format!("session {} is already tracing pid {}", s.view.id, target.pid)
            } else {
                format!(
                    "pid {} is in its cooldown ({:?} after session {})",
                    target.pid, cooldown, s.view.id
                )
            };
            return Outcome::Skipped { fingerprint, reason };
        }
        let running = inner
            .sessions
            .values()
            .filter(|s| s.view.state == State::Running)
            .count();
        if running >= self.cfg.max_sessions {
            Metrics::inc(&self.metrics.skipped_cap);
            return Outcome::Skipped {
                fingerprint,
                reason: format!(
                    "{running} sessions running (--max-sessions {})",
                    self.cfg.max_sessions
                ),
            };
        }
        inner.next_id += 1;
        let trace = self.trace_path(alert.name(), id);
        view.trace = Some(trace.display().to_string());
        view.state = State::Running;
        let stop = Arc::new(AtomicBool::new(false));
        let prelude_events = Arc::new(AtomicU64::new(0));
        let mut opts = self.cfg.template.clone();
        opts.pid = target.pid;
        opts.duration = Some(duration);
        opts.output = trace.clone();
        opts.live_status = false;
        opts.metadata = Some(self.metadata(alert, &view, &target.how));
        opts.prelude = self.prelude(target.pid, &prelude_events);
        let stop_reason = StopReason::default();
        opts.stop_reason = stop_reason.clone();
        inner.sessions.insert(
            id,
            Session {
                view,
                stop: stop.clone(),
                prelude_events: prelude_events.clone(),
                created: Instant::now(),
                ended: None,
                stop_reason,
            },
        );
        Self::forget_old(&mut inner);
        drop(inner);
        Metrics::inc(&self.metrics.sessions_started);
        say::line(&format!(
            "session {id}: {} ({fingerprint}) → {} for {:?} → {}",
            alert.name(),
            target.how,
            duration,
            trace.display()
        ));
        let me = self.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("llmprof-session-{id}"))
            .spawn(move || {
                // A panic in a session must not leave it "running" forever (it would hold a slot of the cap).
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| attach::run(&opts, &stop)))
                    .unwrap_or_else(|_| {
                        Err(attach::AttachError::Output {
                            path: opts.output.clone(),
                            source: std::io::Error::other("the session panicked (see stderr)"),
                        })
                    });
                me.finish(id, r);
            });
        match spawned {
            Ok(h) => lock(&self.threads).push(h),
            Err(e) => self.finish(
                id,
                Err(attach::AttachError::Output {
                    path: trace.clone(),
                    source: e,
                }),
            ),
        }
        Outcome::Started {
            fingerprint,
            session: id,
            trace: trace.display().to_string(),
        }
    }

    fn fail(&self, inner: &mut Inner, mut view: SessionView, reason: String) -> Outcome {
        let id = inner.next_id;
        inner.next_id += 1;
        view.id = id;
        view.reason = Some(reason.clone());
        view.ended_at = Some(now_rfc3339());
        say::line(&format!(
            "session {id}: {} ({}) failed: {reason}",
            view.alert, view.fingerprint
        ));
        let fingerprint = view.fingerprint.clone();
        inner.sessions.insert(
            id,
            Session {
                view,
                stop: Arc::new(AtomicBool::new(true)),
                prelude_events: Arc::new(AtomicU64::new(0)),
                created: Instant::now(),
                ended: Some(Instant::now()),
                stop_reason: StopReason::default(),
            },
        );
        Self::forget_old(inner);
        Metrics::inc(&self.metrics.sessions_failed);
        Outcome::Failed {
            fingerprint,
            session: id,
            reason,
        }
    }

    fn forget_old(inner: &mut Inner) {
        let mut bytes: usize = inner.sessions.values().map(|s| s.view.approx_bytes()).sum();
        while inner.sessions.len() > MAX_HISTORY || bytes > MAX_HISTORY_BYTES {
            let Some(id) = inner
                .sessions
                .values()
                .find(|s| s.view.state != State::Running)
                .map(|s| s.view.id)
            else {
                break;
            };
            if let Some(s) = inner.sessions.remove(&id) {
                bytes = bytes.saturating_sub(s.view.approx_bytes());
            }
        }
    }

    fn metadata(&self, alert: &Alert, view: &SessionView, how: &str) -> TraceMetadata {
        let json = |m: &BTreeMap<String, String>| serde_json::to_string(m).unwrap_or_default();
        let recorder = match self.recorder_for(view.target_pid.unwrap_or(0)) {
            Some(r) => format!("{:?} of history before the alert", r.window()),
            None => "off for this target".to_owned(),
        };
        TraceMetadata {
            event: marker::alert_fired(alert.name()),
            args: vec![
                (arg::ALERTNAME, alert.name().to_owned()),
                (arg::FINGERPRINT, alert.fingerprint.clone()),
                (arg::STATUS, "firing".to_owned()),
                (arg::STARTS_AT, alert.starts_at.clone()),
                (arg::LABELS, json(&alert.labels)),
                (arg::ANNOTATIONS, json(&alert.annotations)),
                (arg::GENERATOR_URL, alert.generator_url.clone()),
                (arg::SESSION_ID, view.id.to_string()),
                (arg::TARGET, how.to_owned()),
                (arg::FLIGHT_RECORDER, recorder),
                (arg::TRIGGER, "llmprof serve (Alertmanager webhook)".to_owned()),
            ],
        }
    }

    fn recorder_for(&self, pid: u32) -> Option<&FlightRecorder> {
        self.recorders.iter().find(|r| r.pid() == Some(pid))
    }

    fn prelude(&self, pid: u32, count: &Arc<AtomicU64>) -> Option<Prelude> {
        let inner = self.recorder_for(pid)?.prelude(pid);
        let count = count.clone();
        Some(Prelude(Arc::new(move |cut| {
            let events = (inner.0)(cut);
            count.store(events.len() as u64, Ordering::Relaxed);
            events
        })))
    }

    /// Records the end of session `id` and applies the quota in the same critical section, so nobody sees
    /// the session finished while the directory is still over the quota.
    fn finish(&self, id: u64, r: Result<attach::AttachReport, attach::AttachError>) {
        let files = quota::scan(&self.cfg.out_dir);
        {
            let mut inner = lock(&self.inner);
            let Some(s) = inner.sessions.get_mut(&id) else {
                return;
            };
            if s.view.state != State::Running {
                // Abandoned by the watchdog: it already ended.
                return;
            }
            s.ended = Some(Instant::now());
            s.view.ended_at = Some(now_rfc3339());
            s.view.prelude_events = s.prelude_events.load(Ordering::Relaxed);
            match r {
                Ok(rep) => {
                    s.view.state = State::Finished;
                    s.view.bytes = rep.trace_bytes;
                    s.view.drops = rep.stats.total_dropped();
                    // The trace's own reason: the one a stop from outside handed to the session, or what
                    // ended it first (the duration may elapse just before a resolved alert arrives).
                    s.view.end_reason = Some(rep.stats.end_reason.clone());
                    self.metrics
                        .bytes_written
                        .fetch_add(rep.trace_bytes, Ordering::Relaxed);
                    eprintln!(
                        "llmprof serve: session {id} finished ({}): {} bytes, {} dropped, {} events before the alert",
                        s.view.end_reason.as_deref().unwrap_or(""),
                        rep.trace_bytes,
                        s.view.drops,
                        s.view.prelude_events
                    );
                }
                Err(e) => {
                    s.view.state = State::Failed;
                    let reason = crate::causes::one_line(&e);
                    eprintln!("llmprof serve: session {id} failed: {reason}");
                    s.view.reason = Some(reason);
                    if let Some(t) = &s.view.trace
                        && let Ok(m) = std::fs::metadata(t)
                    {
                        s.view.bytes = m.len();
                    } else {
                        s.view.trace = None;
                    }
                    Metrics::inc(&self.metrics.sessions_failed);
                }
            }
            self.apply_quota(&mut inner, files);
        }
    }

    /// Every session, oldest first.
    pub fn sessions(&self) -> Vec<SessionView> {
        lock(&self.inner)
            .sessions
            .values()
            .map(|s| s.view.clone())
            .collect()
    }

    /// One session.
    pub fn session(&self, id: u64) -> Option<SessionView> {
        lock(&self.inner).sessions.get(&id).map(|s| s.view.clone())
    }

    /// The trace file of a finished session.
    pub fn trace_of(&self, id: u64) -> Result<PathBuf, TraceLookupError> {
        let inner = lock(&self.inner);
        let s = inner.sessions.get(&id).ok_or(TraceLookupError::NotFound(id))?;
        if s.view.state == State::Running {
            return Err(TraceLookupError::Running(id));
        }
        if s.view.trace_removed {
            return Err(TraceLookupError::Removed(id));
        }
        match &s.view.trace {
            Some(t) if Path::new(t).exists() => Ok(PathBuf::from(t)),
            Some(_) => Err(TraceLookupError::Removed(id)),
            None => Err(TraceLookupError::NoTrace(
                id,
                s.view.reason.clone().unwrap_or_else(|| "none written".into()),
            )),
        }
    }

    /// Gauges for `/metrics`.
    pub fn gauges(&self) -> Gauges {
        Gauges {
            running: self.running() as u64,
            disk_bytes: self.disk_bytes.load(Ordering::Relaxed),
            disk_quota: self.cfg.disk_quota.unwrap_or(0),
            recorders: self.recorders.iter().map(FlightRecorder::status).collect(),
        }
    }

    /// Sessions running now.
    pub fn running(&self) -> usize {
        lock(&self.inner)
            .sessions
            .values()
            .filter(|s| s.view.state == State::Running)
            .count()
    }

    /// Stops every running session and waits (at most `wait`) for their traces to be finished.
    pub fn shutdown(&self, wait: Duration) {
        for s in lock(&self.inner).sessions.values_mut() {
            if s.view.state == State::Running {
                s.stop_reason.set(END_SHUTDOWN);
                s.stop.store(true, Ordering::Release);
            }
        }
        let deadline = Instant::now() + wait;
        let threads = std::mem::take(&mut *lock(&self.threads));
        for h in threads {
            while !h.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            if h.is_finished() {
                let _ = h.join();
            }
        }
    }

    /// Joins the threads of sessions that have ended (keeps the handle list short).
    pub fn reap(&self) {
        self.watchdog();
        let mut threads = lock(&self.threads);
        let (done, live): (Vec<_>, Vec<_>) = threads.drain(..).partition(|h| h.is_finished());
        *threads = live;
        drop(threads);
        for h in done {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests;
