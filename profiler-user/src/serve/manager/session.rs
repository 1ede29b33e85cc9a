//! What a session is: its record in the manager ([`Session`]), what `GET /v1/sessions` shows of it
//! ([`SessionView`]), what became of an alert ([`Outcome`]) and why a trace cannot be downloaded
//! ([`TraceLookupError`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::Instant;

use serde::Serialize;

use crate::attach::StopReason;

/// A session's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// Capturing.
    Running,
    /// The trace is complete.
    Finished,
    /// No trace (or a partial one): see `reason`.
    Failed,
}

/// A session as `GET /v1/sessions` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct SessionView {
    /// Id (in this run of serve).
    pub id: u64,
    /// `alertname`.
    pub alert: String,
    /// Alertmanager's fingerprint.
    pub fingerprint: String,
    /// The alert's labels.
    pub labels: BTreeMap<String, String>,
    /// The alert's annotations.
    pub annotations: BTreeMap<String, String>,
    /// The traced process.
    pub target_pid: Option<u32>,
    /// How the process was found.
    pub target: Option<String>,
    /// State.
    pub state: State,
    /// Why it failed.
    pub reason: Option<String>,
    /// Why capture ended.
    pub end_reason: Option<String>,
    /// The trace file.
    pub trace: Option<String>,
    /// Whether the disk quota removed the trace.
    pub trace_removed: bool,
    /// Trace size so far, bytes.
    pub bytes: u64,
    /// Events lost (kernel ring and user space), known when finished.
    pub drops: u64,
    /// Flight-recorder events written before the alert.
    pub prelude_events: u64,
    /// Requested capture length, seconds.
    pub duration_s: f64,
    /// When the session was created (RFC 3339 UTC).
    pub created_at: String,
    /// When it ended.
    pub ended_at: Option<String>,
}

impl SessionView {
    /// Roughly the memory this entry holds: its strings plus a fixed part.
    pub(super) fn approx_bytes(&self) -> usize {
        let map = |m: &BTreeMap<String, String>| m.iter().map(|(k, v)| k.len() + v.len() + 48).sum::<usize>();
        let opt = |o: &Option<String>| o.as_ref().map_or(0, String::len);
        256 + self.alert.len()
            + self.fingerprint.len()
            + map(&self.labels)
            + map(&self.annotations)
            + opt(&self.target)
            + opt(&self.reason)
            + opt(&self.end_reason)
            + opt(&self.trace)
            + self.created_at.len()
            + opt(&self.ended_at)
    }
}

pub(super) struct Session {
    pub(super) view: SessionView,
    pub(super) stop: Arc<AtomicBool>,
    pub(super) prelude_events: Arc<AtomicU64>,
    pub(super) created: Instant,
    pub(super) ended: Option<Instant>,
    /// Why the session was stopped from outside (resolved alert, quota, shutdown); shared with the session,
    /// whose trace ends with it as `end_reason`. Set before `stop`.
    pub(super) stop_reason: StopReason,
}

/// What became of one alert of a webhook (the response body lists them).
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    /// A session started.
    Started {
        /// Fingerprint.
        fingerprint: String,
        /// Session id.
        session: u64,
        /// Trace path.
        trace: String,
    },
    /// Folded into an existing session.
    Deduped {
        /// Fingerprint.
        fingerprint: String,
        /// The existing session.
        session: u64,
    },
    /// Recorded as a failed session.
    Failed {
        /// Fingerprint.
        fingerprint: String,
        /// Session id.
        session: u64,
        /// Why.
        reason: String,
    },
    /// Nothing started (cooldown or cap).
    Skipped {
        /// Fingerprint.
        fingerprint: String,
        /// Why.
        reason: String,
    },
    /// A resolved alert stopped its running session.
    Stopped {
        /// Fingerprint.
        fingerprint: String,
        /// Session id.
        session: u64,
    },
    /// A resolved alert without a running session.
    Ignored {
        /// Fingerprint.
        fingerprint: String,
    },
    /// Not handled: an annotation it carries is unusable (the webhook is answered 400, the payload's other
    /// alerts are handled).
    Rejected {
        /// Fingerprint.
        fingerprint: String,
        /// Why.
        reason: String,
    },
}

/// Why a trace cannot be downloaded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TraceLookupError {
    /// No such session.
    #[error("no session {0}")]
    NotFound(u64),
    /// Still capturing.
    #[error("session {0} is still running: download its trace when it has finished")]
    Running(u64),
    /// The session has no trace.
    #[error("session {0} has no trace: {1}")]
    NoTrace(u64, String),
    /// The quota removed it.
    #[error("the trace of session {0} was removed by the disk quota")]
    Removed(u64),
}
