//! The HTTP API of `llmprof serve` (axum on a small tokio runtime).
//!
//! Owns the routes, authentication and the mapping of every outcome to a status code with a JSON reason:
//! - `POST /v1/alerts` (auth): an Alertmanager webhook; 200 with what became of each alert (at most
//!   [`MAX_ALERTS_PER_BATCH`] are handled; `not_handled` counts the rest), 400 for malformed JSON, an unknown
//!   payload version or an alert with an unusable annotation (the others are still handled), 401 without the
//!   bearer token, 408 for a body not received within [`BODY_TIMEOUT`], 413 over the body limit;
//! - `GET /v1/sessions`, `GET /v1/sessions/{id}` (auth): sessions as JSON;
//! - `GET /v1/sessions/{id}/trace` (auth): the trace file (409 while running, 410 once the quota removed it);
//! - `GET /healthz`: open, `{"status":"ok"}` only; with the token (or when serve has none) also the sessions
//!   running, the disk use and the flight recorders (targets and pids);
//! - `GET /metrics`: counters, open (no trace data).
//!
//! The session decisions run on tokio's blocking pool (they read /proc), and so does every look at the
//! manager (its lock is a std mutex); no handler waits for a capture. Trace downloads are streamed from the
//! open file in 256 KiB chunks with their length known up front.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use tokio::io::AsyncReadExt;
use tokio_util::io::ReaderStream;

use super::auth::Token;
use super::manager::{MAX_ALERTS_PER_BATCH, Manager, Outcome, TraceLookupError};
use super::metrics::Metrics;
use super::webhook;

/// Bytes read from disk per chunk of a trace download.
const DOWNLOAD_CHUNK: usize = 256 << 10;
/// Longest a webhook's body may take to arrive (Alertmanager sends it at once; a client that trickles it
/// holds a connection no longer).
pub const BODY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// What the handlers share.
pub struct App {
    /// Sessions.
    pub manager: Arc<Manager>,
    /// Counters.
    pub metrics: Arc<Metrics>,
    /// Bearer token (None: no authentication, loopback only).
    pub token: Option<Token>,
    /// Largest accepted body, bytes.
    pub max_body: usize,
}

/// The router.
pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/v1/alerts", post(alerts))
        .route("/v1/sessions", get(sessions))
        .route("/v1/sessions/{id}", get(session))
        .route("/v1/sessions/{id}/trace", get(trace))
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .with_state(app)
}

fn json(code: StatusCode, v: &serde_json::Value) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))],
        format!("{v}\n"),
    )
        .into_response()
}

fn error(code: StatusCode, msg: &str) -> Response {
    json(code, &serde_json::json!({ "error": msg }))
}

/// Runs `f` on the blocking pool: the manager's lock is a std mutex that a session start may hold, and the
/// runtime has one thread; nothing on it may wait for that lock.
async fn off_runtime<T: Send + 'static>(
    app: &Arc<App>,
    f: impl FnOnce(&Manager) -> T + Send + 'static,
) -> Result<T, Response> {
    let manager = app.manager.clone();
    tokio::task::spawn_blocking(move || f(&manager))
        .await
        .map_err(|e| error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()))
}

fn authorized(app: &App, req: &axum::http::request::Parts) -> bool {
    match &app.token {
        None => true,
        Some(t) => t.check_header(req.headers.get(header::AUTHORIZATION).map(HeaderValue::as_bytes)),
    }
}

fn unauthorized() -> Response {
    let mut r = error(
        StatusCode::UNAUTHORIZED,
        "missing or wrong bearer token (Alertmanager: http_config.authorization.credentials_file)",
    );
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"llmprof\""),
    );
    r
}

async fn alerts(State(app): State<Arc<App>>, req: Request) -> Response {
    let r = alerts_inner(&app, req).await;
    app.metrics.webhook(r.status().as_u16());
    r
}

async fn alerts_inner(app: &Arc<App>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    if !authorized(app, &parts) {
        return unauthorized();
    }
    let bytes = match tokio::time::timeout(BODY_TIMEOUT, axum::body::to_bytes(body, app.max_body)).await {
        Ok(Ok(b)) => b,
        Ok(Err(_)) => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!("body over the {} byte limit (--max-body)", app.max_body),
            );
        }
        Err(_) => {
            return error(
                StatusCode::REQUEST_TIMEOUT,
                &format!("the body did not arrive within {BODY_TIMEOUT:?}"),
            );
        }
    };
    handle_body(app, &bytes).await
}

/// Handles an authenticated webhook body of at most `--max-body` bytes: 200 with each alert's outcome, or 400
/// with the reason. Every annotation is checked before any alert is handled; the alerts with a bad one are
/// `rejected` (400 naming the first), the payload's other alerts are still handled and listed in the answer.
pub async fn handle_body(app: &Arc<App>, bytes: &[u8]) -> Response {
    let payload = match webhook::parse(bytes) {
        Ok(p) => p,
        Err(e) => return error(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    let rejected = webhook::check_annotations(&payload);
    let first_error = rejected
        .first()
        .and_then(|(i, e)| payload.alerts.get(*i).map(|a| format!("{}: {e}", a.describe(*i))));
    let manager = app.manager.clone();
    let not_handled = payload.alerts.len().saturating_sub(MAX_ALERTS_PER_BATCH);
    let outcomes = tokio::task::spawn_blocking(move || {
        // One look at /proc for the whole webhook.
        let mut snap = manager.snapshot();
        let mut rejected = rejected.into_iter().peekable();
        let mut out = Vec::with_capacity(payload.alerts.len().min(MAX_ALERTS_PER_BATCH));
        for (i, a) in payload.alerts.iter().enumerate().take(MAX_ALERTS_PER_BATCH) {
            match rejected.next_if(|(r, _)| *r == i) {
                Some((_, e)) => out.push(Outcome::Rejected {
                    fingerprint: a.fingerprint.clone(),
                    reason: e.to_string(),
                }),
                None => out.push(manager.handle_in(a, &mut snap)),
            }
        }
        manager.over_cap("webhook", not_handled);
        out
    })
    .await;
    match (outcomes, first_error) {
        (Ok(o), None) => json(
            StatusCode::OK,
            &serde_json::json!({ "alerts": o, "not_handled": not_handled }),
        ),
        (Ok(o), Some(e)) => json(
            StatusCode::BAD_REQUEST,
            &serde_json::json!({ "error": e, "alerts": o, "not_handled": not_handled }),
        ),
        (Err(e), _) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("alert handling failed: {e}"),
        ),
    }
}

async fn sessions(State(app): State<Arc<App>>, req: Request) -> Response {
    let (parts, _) = req.into_parts();
    if !authorized(&app, &parts) {
        return unauthorized();
    }
    match off_runtime(&app, |m| m.sessions()).await {
        Ok(s) => json(StatusCode::OK, &serde_json::json!(s)),
        Err(r) => r,
    }
}

async fn session(State(app): State<Arc<App>>, Path(id): Path<u64>, req: Request) -> Response {
    let (parts, _) = req.into_parts();
    if !authorized(&app, &parts) {
        return unauthorized();
    }
    match off_runtime(&app, move |m| m.session(id)).await {
        Ok(Some(s)) => json(StatusCode::OK, &serde_json::json!(s)),
        Ok(None) => error(StatusCode::NOT_FOUND, &format!("no session {id}")),
        Err(r) => r,
    }
}

async fn trace(State(app): State<Arc<App>>, Path(id): Path<u64>, req: Request) -> Response {
    let (parts, _) = req.into_parts();
    if !authorized(&app, &parts) {
        return unauthorized();
    }
    let looked_up = match off_runtime(&app, move |m| m.trace_of(id)).await {
        Ok(l) => l,
        Err(r) => return r,
    };
    let path = match looked_up {
        Ok(p) => p,
        Err(e) => {
            let code = match e {
                TraceLookupError::NotFound(_) | TraceLookupError::NoTrace(..) => StatusCode::NOT_FOUND,
                TraceLookupError::Running(_) => StatusCode::CONFLICT,
                TraceLookupError::Removed(_) => StatusCode::GONE,
            };
            return error(code, &e.to_string());
        }
    };
    // Streamed from disk in chunks: a download costs a buffer, not the trace's size in memory.
    let file = match tokio::fs::File::open(&path).await {
        Ok(f) => f,
        Err(e) => return error(StatusCode::GONE, &format!("cannot read {}: {e}", path.display())),
    };
    let len = match file.metadata().await {
        Ok(m) => m.len(),
        Err(e) => return error(StatusCode::GONE, &format!("cannot read {}: {e}", path.display())),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let disposition = HeaderValue::from_str(&format!("attachment; filename=\"{name}\""))
        .unwrap_or_else(|_| HeaderValue::from_static("attachment"));
    // The open file keeps its bytes even if the quota removes the name meanwhile; the length is fixed now.
    let body = Body::from_stream(ReaderStream::with_capacity(file.take(len), DOWNLOAD_CHUNK));
    (
        StatusCode::OK,
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            ),
            (header::CONTENT_DISPOSITION, disposition),
            (header::CONTENT_LENGTH, HeaderValue::from(len)),
        ],
        body,
    )
        .into_response()
}

async fn healthz(State(app): State<Arc<App>>, req: Request) -> Response {
    let (parts, _) = req.into_parts();
    if !authorized(&app, &parts) {
        // Open to probes: healthy or not, nothing about the targets.
        return json(StatusCode::OK, &serde_json::json!({ "status": "ok" }));
    }
    let g = match off_runtime(&app, |m| m.gauges()).await {
        Ok(g) => g,
        Err(r) => return r,
    };
    json(
        StatusCode::OK,
        &serde_json::json!({
            "status": "ok",
            "sessions_running": g.running,
            "disk_bytes": g.disk_bytes,
            "flight_recorders": g.recorders,
        }),
    )
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    let g = match off_runtime(&app, |m| m.gauges()).await {
        Ok(g) => g,
        Err(r) => return r,
    };
    let text = app.metrics.render(&g);
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        text,
    )
        .into_response()
}

async fn not_found() -> Response {
    error(
        StatusCode::NOT_FOUND,
        "no such endpoint (POST /v1/alerts, GET /v1/sessions, /v1/sessions/{id}, /v1/sessions/{id}/trace, /healthz, /metrics)",
    )
}
