//! `llmprof serve`'s own Prometheus metrics (`GET /metrics`).
//!
//! Owns the counter names and the text exposition. Counters are atomics bumped by the HTTP handlers and the
//! session manager; gauges (sessions running, disk bytes, flight-recorder rings) are read at scrape time.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use super::flight::RecorderStatus;

/// HTTP status codes counted per webhook (`llmprof_serve_webhooks_total{code}`).
const CODES: [u16; 6] = [200, 400, 401, 413, 415, 500];

/// The counters.
#[derive(Debug, Default)]
pub struct Metrics {
    webhooks: [AtomicU64; CODES.len()],
    /// Firing alerts received.
    pub alerts_firing: AtomicU64,
    /// Resolved alerts received.
    pub alerts_resolved: AtomicU64,
    /// Sessions started (a capture began).
    pub sessions_started: AtomicU64,
    /// Sessions that failed (no process, bad annotation, capture error).
    pub sessions_failed: AtomicU64,
    /// Firing alerts folded into a running (or recently failed) session of the same fingerprint.
    pub sessions_deduped: AtomicU64,
    /// Firing alerts whose process the allow-list refused (a failed session with the reason).
    pub sessions_refused: AtomicU64,
    /// Firing alerts not started because of the target's cooldown.
    pub skipped_cooldown: AtomicU64,
    /// Firing alerts not started because the concurrent-session cap was reached.
    pub skipped_cap: AtomicU64,
    /// Sessions ended early by a `resolved` alert.
    pub sessions_resolved_early: AtomicU64,
    /// Sessions stopped because the traces in progress alone exceeded the disk quota.
    pub sessions_stopped_quota: AtomicU64,
    /// Trace bytes written by finished sessions.
    pub bytes_written: AtomicU64,
    /// Traces removed by the disk quota.
    pub traces_removed: AtomicU64,
    /// Connections closed at once: over the connection caps.
    pub connections_refused: AtomicU64,
    /// Connections closed for a handshake, request head or idle time over its deadline.
    pub connections_timed_out: AtomicU64,
    /// Alerts of a webhook or poll beyond the per-batch cap, not handled.
    pub alerts_over_cap: AtomicU64,
    /// Sessions the watchdog gave up on (not ended within their duration and grace).
    pub sessions_abandoned: AtomicU64,
}

/// Values read at scrape time.
#[derive(Debug, Default)]
pub struct Gauges {
    /// Sessions running now.
    pub running: u64,
    /// Bytes of traces in the output directory.
    pub disk_bytes: u64,
    /// Disk quota (0: none).
    pub disk_quota: u64,
    /// Flight recorders.
    pub recorders: Vec<RecorderStatus>,
}

fn add(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl Metrics {
    /// Counts a webhook answered with `code`.
    pub fn webhook(&self, code: u16) {
        let i = CODES.iter().position(|&c| c == code).unwrap_or(CODES.len() - 1);
        add(&self.webhooks[i]);
    }

    /// Webhooks answered with `code` so far.
    pub fn webhooks(&self, code: u16) -> u64 {
        CODES
            .iter()
            .position(|&c| c == code)
            .map_or(0, |i| self.webhooks[i].load(Ordering::Relaxed))
    }

    /// Bumps a counter.
    pub fn inc(c: &AtomicU64) {
        add(c);
    }

    /// The Prometheus text exposition.
    pub fn render(&self, g: &Gauges) -> String {
        let mut s = String::new();
        let v = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let _ = writeln!(
            s,
            "# HELP llmprof_serve_webhooks_total Webhook posts to /v1/alerts by HTTP status.\n\
             # TYPE llmprof_serve_webhooks_total counter"
        );
        for (i, code) in CODES.iter().enumerate() {
            let _ = writeln!(
                s,
                "llmprof_serve_webhooks_total{{code=\"{code}\"}} {}",
                v(&self.webhooks[i])
            );
        }
        let _ = writeln!(
            s,
            "# HELP llmprof_serve_alerts_total Alerts received, by status.\n\
             # TYPE llmprof_serve_alerts_total counter\n\
             llmprof_serve_alerts_total{{status=\"firing\"}} {}\n\
             llmprof_serve_alerts_total{{status=\"resolved\"}} {}",
            v(&self.alerts_firing),
            v(&self.alerts_resolved)
        );
        let counters: [(&str, &str, &AtomicU64); 12] = [
            (
                "sessions_started_total",
                "Sessions started (a capture began).",
                &self.sessions_started,
            ),
            (
                "sessions_failed_total",
                "Sessions that failed, with the reason in /v1/sessions.",
                &self.sessions_failed,
            ),
            (
                "sessions_deduped_total",
                "Firing alerts folded into a session of the same fingerprint.",
                &self.sessions_deduped,
            ),
            (
                "sessions_refused_total",
                "Firing alerts whose process is not allowed (pid 1, serve, outside --allow-target).",
                &self.sessions_refused,
            ),
            (
                "sessions_resolved_early_total",
                "Sessions ended early by a resolved alert.",
                &self.sessions_resolved_early,
            ),
            (
                "sessions_stopped_quota_total",
                "Sessions stopped because traces in progress exceeded the disk quota.",
                &self.sessions_stopped_quota,
            ),
            (
                "bytes_written_total",
                "Trace bytes written by finished sessions.",
                &self.bytes_written,
            ),
            (
                "traces_removed_total",
                "Traces removed by the disk quota, oldest first.",
                &self.traces_removed,
            ),
            (
                "connections_refused_total",
                "Connections closed at once because serve had too many open (in all or from that address).",
                &self.connections_refused,
            ),
            (
                "connections_timed_out_total",
                "Connections closed for a TLS handshake, request head or idle time over its deadline.",
                &self.connections_timed_out,
            ),
            (
                "alerts_over_cap_total",
                "Alerts of one webhook or poll beyond the per-batch cap, not handled.",
                &self.alerts_over_cap,
            ),
            (
                "sessions_abandoned_total",
                "Sessions that did not end within their duration and grace: their slot was freed.",
                &self.sessions_abandoned,
            ),
        ];
        for (name, help, c) in counters {
            let _ = writeln!(
                s,
                "# HELP llmprof_serve_{name} {help}\n# TYPE llmprof_serve_{name} counter\nllmprof_serve_{name} {}",
                v(c)
            );
        }
        let _ = writeln!(
            s,
            "# HELP llmprof_serve_alerts_skipped_total Firing alerts that started no session, by reason.\n\
             # TYPE llmprof_serve_alerts_skipped_total counter\n\
             llmprof_serve_alerts_skipped_total{{reason=\"cooldown\"}} {}\n\
             llmprof_serve_alerts_skipped_total{{reason=\"cap\"}} {}",
            v(&self.skipped_cooldown),
            v(&self.skipped_cap)
        );
        let _ = writeln!(
            s,
            "# HELP llmprof_serve_sessions_running Sessions capturing now.\n\
             # TYPE llmprof_serve_sessions_running gauge\nllmprof_serve_sessions_running {}\n\
             # HELP llmprof_serve_disk_bytes Bytes of traces in the output directory.\n\
             # TYPE llmprof_serve_disk_bytes gauge\nllmprof_serve_disk_bytes {}\n\
             # HELP llmprof_serve_disk_quota_bytes Disk quota of the output directory (0: none).\n\
             # TYPE llmprof_serve_disk_quota_bytes gauge\nllmprof_serve_disk_quota_bytes {}",
            g.running, g.disk_bytes, g.disk_quota
        );
        if !g.recorders.is_empty() {
            let _ = writeln!(
                s,
                "# HELP llmprof_serve_flight_recorder_bytes Bytes held by a flight recorder's ring.\n\
                 # TYPE llmprof_serve_flight_recorder_bytes gauge"
            );
            for r in &g.recorders {
                let _ = writeln!(
                    s,
                    "llmprof_serve_flight_recorder_bytes{{target=\"{}\"}} {}",
                    r.target, r.bytes
                );
            }
            let _ = writeln!(
                s,
                "# HELP llmprof_serve_flight_recorder_events Events held by a flight recorder's ring.\n\
                 # TYPE llmprof_serve_flight_recorder_events gauge"
            );
            for r in &g.recorders {
                let _ = writeln!(
                    s,
                    "llmprof_serve_flight_recorder_events{{target=\"{}\"}} {}",
                    r.target, r.events
                );
            }
            let _ = writeln!(
                s,
                "# HELP llmprof_serve_flight_recorder_dropped_total Events a flight recorder lost (ring budget or kernel ring).\n\
                 # TYPE llmprof_serve_flight_recorder_dropped_total counter"
            );
            for r in &g.recorders {
                let _ = writeln!(
                    s,
                    "llmprof_serve_flight_recorder_dropped_total{{target=\"{}\"}} {}",
                    r.target,
                    r.dropped + r.kernel_dropped
                );
            }
        }
        s
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_and_gauges() {
        let m = Metrics::default();
        m.webhook(401);
        m.webhook(401);
        m.webhook(999);
        Metrics::inc(&m.sessions_started);
        let text = m.render(&Gauges {
            running: 1,
            disk_bytes: 10,
            disk_quota: 100,
            recorders: Vec::new(),
        });
        assert!(
            text.contains("llmprof_serve_webhooks_total{code=\"401\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("llmprof_serve_webhooks_total{code=\"500\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("llmprof_serve_sessions_started_total 1\n"),
            "{text}"
        );
        assert!(text.contains("llmprof_serve_sessions_running 1\n"), "{text}");
        assert_eq!(m.webhooks(401), 2);
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (_, v) = line.rsplit_once(' ').unwrap();
            v.parse::<f64>().unwrap();
        }
    }
}
