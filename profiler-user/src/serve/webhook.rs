//! The Alertmanager webhook payload (version 4) and its validation.
//!
//! Owns the wire format of `POST /v1/alerts` as Alertmanager 0.25 sends it (`notify/webhook/webhook.go`:
//! `version, groupKey, truncatedAlerts, status, receiver, groupLabels, commonLabels, commonAnnotations,
//! externalURL, alerts[]` with `status, labels, annotations, startsAt, endsAt, generatorURL, fingerprint`).
//! Every malformed input becomes a [`PayloadError`] whose message says what is wrong; nothing here panics.
//! Also owns the annotations llmprof reads ([`DURATION_ANNOTATION`]) and their validation ([`check_annotations`],
//! run on the whole payload before any alert of it is handled).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

/// The only payload version Alertmanager has ever sent, and the one this parser speaks.
pub const PAYLOAD_VERSION: &str = "4";

/// Why a payload is rejected (HTTP 400 with this message).
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PayloadError {
    /// Not JSON at all.
    #[error("the body is not JSON: {0}")]
    NotJson(String),
    /// No `version` field.
    #[error(
        "the payload has no \"version\": llmprof serve expects Alertmanager webhook payloads (version 4)"
    )]
    NoVersion,
    /// Another payload version.
    #[error("unsupported payload version {0}: llmprof serve speaks Alertmanager webhook version 4")]
    Version(String),
    /// JSON, version 4, but not the documented shape.
    #[error("invalid Alertmanager payload: {0}")]
    Shape(String),
    /// An alert without a fingerprint (dedupe needs it; Alertmanager always sends one).
    #[error("alert {0} has no fingerprint")]
    NoFingerprint(usize),
}

/// A webhook notification.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Payload {
    /// Always "4".
    pub version: String,
    /// Alertmanager's key of the alert group.
    #[serde(default)]
    pub group_key: String,
    /// Alerts left out by `max_alerts`.
    #[serde(default)]
    pub truncated_alerts: u64,
    /// `firing` when any alert of the group fires.
    #[serde(default)]
    pub status: String,
    /// The receiver's name in the Alertmanager config.
    #[serde(default)]
    pub receiver: String,
    /// Alertmanager's URL.
    #[serde(default, rename = "externalURL")]
    pub external_url: String,
    /// The alerts.
    pub alerts: Vec<Alert>,
}

/// Whether an alert fires or has resolved.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum AlertStatus {
    /// Firing: start a session.
    Firing,
    /// Resolved: end its session early.
    Resolved,
}

/// One alert of a notification.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Alert {
    /// Firing or resolved.
    pub status: AlertStatus,
    /// Labels (`alertname`, `instance`, `pid`, ...).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Annotations (`summary`, `llmprof_duration`, ...).
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// RFC 3339 start.
    #[serde(default)]
    pub starts_at: String,
    /// RFC 3339 end (`0001-01-01T00:00:00Z` while firing).
    #[serde(default)]
    pub ends_at: String,
    /// Link to the expression in Prometheus.
    #[serde(default, rename = "generatorURL")]
    pub generator_url: String,
    /// Alertmanager's identity of the alert (hash of its labels).
    #[serde(default)]
    pub fingerprint: String,
}

/// Label of the alert's name.
pub const ALERTNAME: &str = "alertname";
/// Annotation giving a session's duration (e.g. `30s`), parsed like `attach --duration` (`llmprof_units`).
pub const DURATION_ANNOTATION: &str = "llmprof_duration";
/// Characters of an alert's name or fingerprint quoted in an error (labels can be long).
const MAX_QUOTED_CHARS: usize = 64;

/// Why an annotation llmprof reads cannot be used (the alert is rejected: HTTP 400 with this reason).
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum AnnotationError {
    /// `llmprof_duration` is not a duration (or too large to be one).
    #[error("annotation {DURATION_ANNOTATION}: {0}")]
    Duration(llmprof_units::UnitsError),
    /// `llmprof_duration` is zero.
    #[error("annotation {DURATION_ANNOTATION} is zero: give the session a length, e.g. 30s")]
    ZeroDuration,
}

impl Alert {
    /// `alertname`, or `alert` when missing.
    pub fn name(&self) -> &str {
        self.labels.get(ALERTNAME).map_or("alert", String::as_str)
    }

    /// The session length the `llmprof_duration` annotation asks for (None: no annotation).
    pub fn requested_duration(&self) -> Result<Option<Duration>, AnnotationError> {
        let Some(text) = self.annotations.get(DURATION_ANNOTATION) else {
            return Ok(None);
        };
        match llmprof_units::parse_duration(text) {
            Ok(d) if d.is_zero() => Err(AnnotationError::ZeroDuration),
            Ok(d) => Ok(Some(d)),
            Err(e) => Err(AnnotationError::Duration(e)),
        }
    }

    /// `alert N (NAME, fingerprint FP)`, each cut to 64 characters, for error messages.
    pub fn describe(&self, index: usize) -> String {
        let cut = |s: &str| s.chars().take(MAX_QUOTED_CHARS).collect::<String>();
        format!(
            "alert {index} ({}, fingerprint {})",
            cut(self.name()),
            cut(&self.fingerprint)
        )
    }
}

/// The firing alerts of `payload` whose annotations cannot be used, by index, with the reason. Resolved alerts
/// are not checked (they only end a session). Pure: runs before any alert of the payload is handled.
pub fn check_annotations(payload: &Payload) -> Vec<(usize, AnnotationError)> {
    payload
        .alerts
        .iter()
        .enumerate()
        .filter(|(_, a)| a.status == AlertStatus::Firing)
        .filter_map(|(i, a)| a.requested_duration().err().map(|e| (i, e)))
        .collect()
}

/// Parses and validates a body.
pub fn parse(body: &[u8]) -> Result<Payload, PayloadError> {
    let v: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| PayloadError::NotJson(e.to_string()))?;
    match v.get("version") {
        None => return Err(PayloadError::NoVersion),
        Some(serde_json::Value::String(s)) if s == PAYLOAD_VERSION => {}
        Some(serde_json::Value::String(s)) => return Err(PayloadError::Version(format!("{s:?}"))),
        Some(other) => return Err(PayloadError::Version(other.to_string())),
    }
    let p: Payload = serde_json::from_value(v).map_err(|e| PayloadError::Shape(e.to_string()))?;
    if let Some(i) = p.alerts.iter().position(|a| a.fingerprint.trim().is_empty()) {
        return Err(PayloadError::NoFingerprint(i));
    }
    Ok(p)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests {
    use super::*;

    /// A notification as Alertmanager 0.25 sends it (captured from a real one, values shortened).
    pub const SAMPLE: &str = r#"{"receiver":"llmprof","status":"firing","alerts":[{"status":"firing",
"labels":{"alertname":"LLMQueueBacklog","instance":"127.0.0.1:8000","job":"llmserve","severity":"warning"},
"annotations":{"summary":"queue backlog","llmprof_duration":"20s"},"startsAt":"2026-11-26T01:00:00.000Z",
"endsAt":"0001-01-01T00:00:00Z","generatorURL":"http://prom/graph","fingerprint":"9e4d9b7b8a1c2d3e"}],
"groupLabels":{"alertname":"LLMQueueBacklog"},"commonLabels":{},"commonAnnotations":{},
"externalURL":"http://am:9093","version":"4","groupKey":"{}:{alertname=\"LLMQueueBacklog\"}","truncatedAlerts":0}"#;

    #[test]
    fn parses_alertmanager_payloads() {
        let p = parse(SAMPLE.as_bytes()).unwrap();
        assert_eq!(p.receiver, "llmprof");
        assert_eq!(p.alerts.len(), 1);
        let a = &p.alerts[0];
        assert_eq!(a.status, AlertStatus::Firing);
        assert_eq!(a.name(), "LLMQueueBacklog");
        assert_eq!(a.labels["instance"], "127.0.0.1:8000");
        assert_eq!(a.annotations["llmprof_duration"], "20s");
        assert_eq!(a.fingerprint, "9e4d9b7b8a1c2d3e");
    }

    #[test]
    fn rejects_bad_input_with_a_reason() {
        assert!(matches!(parse(b"{not json"), Err(PayloadError::NotJson(_))));
        assert_eq!(parse(b"{}"), Err(PayloadError::NoVersion));
        assert_eq!(
            parse(br#"{"version":"3","alerts":[]}"#),
            Err(PayloadError::Version("\"3\"".into()))
        );
        assert_eq!(
            parse(br#"{"version":4,"alerts":[]}"#),
            Err(PayloadError::Version("4".into()))
        );
        assert!(matches!(
            parse(br#"{"version":"4"}"#),
            Err(PayloadError::Shape(_))
        ));
        assert!(matches!(
            parse(br#"{"version":"4","alerts":[{"status":"burning"}]}"#),
            Err(PayloadError::Shape(_))
        ));
        assert!(matches!(
            parse(br#"{"version":"4","alerts":[{"status":"firing","labels":{"a":1}}]}"#),
            Err(PayloadError::Shape(_))
        ));
        assert_eq!(
            parse(br#"{"version":"4","alerts":[{"status":"firing"}]}"#),
            Err(PayloadError::NoFingerprint(0))
        );
        let msg = parse(b"[1,2]").unwrap_err().to_string();
        assert!(msg.contains("version"), "{msg}");
    }

    #[test]
    fn bad_duration_annotations_of_firing_alerts_are_found_before_handling() {
        let body = |d: &str, status: &str| {
            format!(
                r#"{{"version":"4","alerts":[
                {{"status":"firing","fingerprint":"ok","annotations":{{"llmprof_duration":"20s"}}}},
                {{"status":"{status}","fingerprint":"bad","labels":{{"alertname":"X"}},
                  "annotations":{{"llmprof_duration":"{d}"}}}}]}}"#
            )
        };
        let p = parse(body("100000000000000000000", "firing").as_bytes()).unwrap();
        let bad = check_annotations(&p);
        assert_eq!(bad.len(), 1, "{bad:?}");
        assert_eq!(bad[0].0, 1);
        let msg = bad[0].1.to_string();
        assert!(
            msg.starts_with("annotation llmprof_duration: duration too large"),
            "{msg}"
        );
        assert_eq!(p.alerts[1].describe(1), "alert 1 (X, fingerprint bad)");
        for d in ["soon", "-1s", "1e400", "NaN", ""] {
            let p = parse(body(d, "firing").as_bytes()).unwrap();
            assert!(
                matches!(check_annotations(&p)[..], [(1, AnnotationError::Duration(_))]),
                "{d}"
            );
        }
        let p = parse(body("0s", "firing").as_bytes()).unwrap();
        assert_eq!(check_annotations(&p), vec![(1, AnnotationError::ZeroDuration)]);
        // A resolved alert only ends a session: its annotations are not checked.
        let p = parse(body("soon", "resolved").as_bytes()).unwrap();
        assert!(check_annotations(&p).is_empty());
        assert_eq!(
            p.alerts[0].requested_duration(),
            Ok(Some(Duration::from_secs(20)))
        );
    }
}
