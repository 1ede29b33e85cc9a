//! The OpenAI-compatible HTTP API (axum): `/v1/chat/completions`, `/v1/completions`, `/v1/models`, `/health`,
//! `/metrics`, `/admin/reload`.
//!
//! Owns request validation, tokenization (range `tokenize`), the wire format (JSON and SSE with `data: [DONE]`,
//! `stream_options.include_usage`), the trace context headers (`traceparent`, `x-request-id`, echoed back) and the
//! OpenAI-style error body `{"error":{"message","type","param","code"}}` for every failure: 400 for malformed or
//! ill-typed input and prompts that do not fit, 404 for unknown models and routes, 429 when the queue is full.
//! It never runs model compute and never blocks a runtime thread on the engine; dropping a response (client gone)
//! drops its output channel, which the engine sees as a cancellation.

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use llmprof_abi::FinishReason;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::engine::{Chunk, EngineHandle, Finish, GenRequest, Range, Reloaded, SubmitError};
use crate::sampling::SamplingParams;
use crate::trace_context::{TraceContext, sanitize_request_id};

/// Default `max_tokens` of `/v1/completions` (OpenAI's documented default).
pub const DEFAULT_COMPLETION_MAX_TOKENS: usize = 16;
/// Largest request body accepted (bytes).
pub const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

/// Loads a model file off the engine thread into a ready-to-swap [`Reloaded`].
pub type Loader = Arc<dyn Fn(PathBuf) -> Result<Reloaded, String> + Send + Sync>;

/// Shared state of the HTTP handlers.
pub struct AppState {
    /// The engine.
    pub engine: Arc<EngineHandle>,
    /// Name clients use in `model`.
    pub served_model_name: String,
    /// Model loader for `/admin/reload`.
    pub loader: Loader,
    /// Path of the current model (reload default).
    pub model_path: tokio::sync::Mutex<PathBuf>,
    /// Start time (the `created` of `/v1/models`).
    pub created: u64,
}

/// An OpenAI-style error.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
    kind: &'static str,
    param: Option<&'static str>,
    code: Option<&'static str>,
}

impl ApiError {
    fn bad(message: impl Into<String>, param: Option<&'static str>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param,
            code: None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}});
        (
            self.status,
            [(header::CONTENT_TYPE, "application/json")],
            body.to_string(),
        )
            .into_response()
    }
}

/// Builds the router.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/admin/reload", post(reload))
        .fallback(not_found)
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

async fn not_found() -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        message: "no such route; see /v1/chat/completions, /v1/completions, /v1/models, /health, /metrics, /admin/reload"
            .into(),
        kind: "invalid_request_error",
        param: None,
        code: Some("not_found"),
    }
}

async fn health() -> StatusCode {
    StatusCode::OK
}

async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        st.engine.metrics().render(),
    )
        .into_response()
}

async fn models(State(st): State<Arc<AppState>>) -> Response {
    axum::Json(json!({
        "object": "list",
        "data": [{
            "id": st.served_model_name,
            "object": "model",
            "created": st.created,
            "owned_by": "llmserve",
            "root": st.engine.model().name(),
            "max_model_len": st.engine.max_seq_tokens(),
        }]
    }))
    .into_response()
}

#[derive(Deserialize)]
struct ReloadBody {
    path: Option<PathBuf>,
}

async fn reload(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body.map_err(|e| ApiError::bad(format!("cannot read the body: {e}"), None))?;
    let req: ReloadBody = if body.iter().all(u8::is_ascii_whitespace) {
        ReloadBody { path: None }
    } else {
        serde_json::from_slice(&body).map_err(|e| ApiError::bad(format!("invalid JSON body: {e}"), None))?
    };
    // One reload at a time; requests keep being served meanwhile.
    let mut cur = st.model_path.lock().await;
    let path = req.path.unwrap_or_else(|| cur.clone());
    let t0 = Instant::now();
    let loader = st.loader.clone();
    let p = path.clone();
    let loaded = tokio::task::spawn_blocking(move || loader(p))
        .await
        .map_err(|e| ApiError::bad(format!("the loader thread failed: {e}"), Some("path")))?
        .map_err(|e| ApiError::bad(format!("cannot load {}: {e}", path.display()), Some("path")))?;
    let load_s = t0.elapsed().as_secs_f64();
    // A swap fails when the new file does not fit the running engine (another KV geometry): the client's file
    // is the problem, and the old weights keep serving.
    let name = st
        .engine
        .reload(loaded)
        .await
        .map_err(|e| ApiError::bad(e, Some("path")))?;
    *cur = path.clone();
    Ok(axum::Json(json!({
        "status": "ok",
        "model": name,
        "path": path.display().to_string(),
        "load_seconds": load_s,
        "total_seconds": t0.elapsed().as_secs_f64(),
    }))
    .into_response())
}

/// `stop`: a string or a list of strings.
#[derive(Deserialize)]
#[serde(untagged)]
enum StopSpec {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize, Default)]
struct StreamOptions {
    include_usage: Option<bool>,
}

/// Message content: a string, or a list of parts of which the text ones are used.
#[derive(Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Deserialize)]
struct ContentPart {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

#[derive(Deserialize)]
struct ChatMessageIn {
    role: String,
    content: Option<Content>,
}

/// Fields shared by both endpoints.
#[derive(Deserialize)]
struct Common {
    model: Option<String>,
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    seed: Option<i64>,
    stop: Option<StopSpec>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    n: Option<u32>,
}

#[derive(Deserialize)]
struct ChatBody {
    messages: Vec<ChatMessageIn>,
    #[serde(flatten)]
    common: Common,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum PromptSpec {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
}

#[derive(Deserialize)]
struct CompletionBody {
    prompt: PromptSpec,
    #[serde(flatten)]
    common: Common,
}

/// The request as the handlers need it, after validation.
struct Prepared {
    req: GenRequest,
    stream: bool,
    include_usage: bool,
    x_request_id: Option<String>,
}

fn parse_body<T: for<'de> Deserialize<'de>>(body: Result<Bytes, BytesRejection>) -> Result<T, ApiError> {
    let body = body.map_err(|e| ApiError::bad(format!("cannot read the request body: {e}"), None))?;
    // Check syntax first so malformed JSON and ill-typed fields get distinct messages.
    let v: Value =
        serde_json::from_slice(&body).map_err(|e| ApiError::bad(format!("malformed JSON: {e}"), None))?;
    if !v.is_object() {
        return Err(ApiError::bad("the request body must be a JSON object", None));
    }
    serde_json::from_value(v).map_err(|e| ApiError::bad(format!("invalid request: {e}"), None))
}

fn validate_common(
    st: &AppState,
    c: &Common,
    headers: &HeaderMap,
    is_chat: bool,
) -> Result<Prepared, ApiError> {
    if let Some(m) = &c.model
        && m != &st.served_model_name
    {
        return Err(ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!(
                "The model `{m}` does not exist. Available: `{}`.",
                st.served_model_name
            ),
            kind: "invalid_request_error",
            param: Some("model"),
            code: Some("model_not_found"),
        });
    }
    if c.n.is_some_and(|n| n != 1) {
        return Err(ApiError::bad("only n = 1 is supported", Some("n")));
    }
    let temperature = c.temperature.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::bad(
            format!("temperature must be between 0 and 2, got {temperature}"),
            Some("temperature"),
        ));
    }
    let top_p = c.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::bad(
            format!("top_p must be in (0, 1], got {top_p}"),
            Some("top_p"),
        ));
    }
    let max_tokens = c.max_completion_tokens.or(c.max_tokens);
    if max_tokens == Some(0) {
        return Err(ApiError::bad("max_tokens must be at least 1", Some("max_tokens")));
    }
    let stop = match &c.stop {
        None => Vec::new(),
        Some(StopSpec::One(s)) => vec![s.clone()],
        Some(StopSpec::Many(v)) => v.clone(),
    };
    if stop.len() > 4 {
        return Err(ApiError::bad(
            "at most 4 stop sequences are allowed",
            Some("stop"),
        ));
    }
    let trace = headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .and_then(TraceContext::parse);
    let x_request_id = headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .and_then(sanitize_request_id);
    Ok(Prepared {
        req: GenRequest {
            prompt: Vec::new(),
            max_tokens: max_tokens.map_or(usize::MAX, |m| m.min(u32::MAX as u64) as usize),
            sampling: SamplingParams { temperature, top_p },
            seed: c.seed.map(|s| s as u64),
            stop,
            trace,
            x_request_id: x_request_id.clone(),
            is_chat,
            arrival: Instant::now(),
        },
        stream: c.stream.unwrap_or(false),
        include_usage: c
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
        x_request_id,
    })
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn submit_error(e: SubmitError, param: &'static str) -> ApiError {
    match e {
        SubmitError::QueueFull(_) => ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: e.to_string(),
            kind: "rate_limit_error",
            param: None,
            code: Some("rate_limit_exceeded"),
        },
        SubmitError::PromptTooLong { .. } => ApiError {
            status: StatusCode::BAD_REQUEST,
            message: e.to_string(),
            kind: "invalid_request_error",
            param: Some(param),
            code: Some("context_length_exceeded"),
        },
        SubmitError::EmptyPrompt => ApiError::bad(e.to_string(), Some(param)),
        SubmitError::ShuttingDown => ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: e.to_string(),
            kind: "server_error",
            param: None,
            code: None,
        },
    }
}

async fn chat(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let b: ChatBody = parse_body(body)?;
    if b.messages.is_empty() {
        return Err(ApiError::bad("messages must not be empty", Some("messages")));
    }
    let mut p = validate_common(&st, &b.common, &headers, true)?;
    let msgs: Vec<(String, String)> = b
        .messages
        .into_iter()
        .map(|m| {
            let text = match m.content {
                None => String::new(),
                Some(Content::Text(t)) => t,
                Some(Content::Parts(parts)) => parts
                    .into_iter()
                    .filter(|p| p.kind == "text")
                    .filter_map(|p| p.text)
                    .collect::<Vec<_>>()
                    .join(""),
            };
            (m.role, text)
        })
        .collect();
    let chars: usize = msgs.iter().map(|(r, c)| r.len() + c.len()).sum();
    check_prompt_bytes(&st, chars, "messages")?;
    let model = st.engine.model();
    p.req.prompt = tokenize(move || {
        let text = model
            .render_chat(&msgs)
            .map_err(|e| ApiError::bad(e, Some("messages")))?;
        Ok(model.encode_chat(&text))
    })
    .await?;
    run(st, p, true, "messages").await
}

async fn completions(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let b: CompletionBody = parse_body(body)?;
    let mut p = validate_common(&st, &b.common, &headers, false)?;
    let model = st.engine.model();
    p.req.prompt = match b.prompt {
        PromptSpec::Text(t) => {
            check_prompt_bytes(&st, t.len(), "prompt")?;
            tokenize(move || Ok(model.encode_prompt(&t))).await?
        }
        PromptSpec::Texts(v) if v.len() == 1 => {
            check_prompt_bytes(&st, v[0].len(), "prompt")?;
            tokenize(move || Ok(model.encode_prompt(&v[0]))).await?
        }
        PromptSpec::Texts(_) => {
            return Err(ApiError::bad(
                "only one prompt per request is supported",
                Some("prompt"),
            ));
        }
        PromptSpec::Tokens(ids) => {
            let vocab = model_vocab_guard(&ids, &*model)?;
            vocab.to_vec()
        }
    };
    if p.req.max_tokens == usize::MAX {
        p.req.max_tokens = DEFAULT_COMPLETION_MAX_TOKENS;
    }
    run(st, p, false, "prompt").await
}

/// Most prompt bytes per token of capacity: a token is rarely longer than a few bytes, so a prompt with more
/// bytes than this times the sequence capacity cannot fit and is refused before the (costly) tokenization.
pub const MAX_PROMPT_BYTES_PER_TOKEN: usize = 32;

fn check_prompt_bytes(st: &AppState, bytes: usize, param: &'static str) -> Result<(), ApiError> {
    let max_tokens = st.engine.max_seq_tokens();
    if bytes > max_tokens.saturating_mul(MAX_PROMPT_BYTES_PER_TOKEN) {
        return Err(ApiError {
            status: StatusCode::BAD_REQUEST,
            message: format!(
                "the prompt has {bytes} bytes, far more than the {max_tokens} tokens that fit; shorten the prompt"
            ),
            kind: "invalid_request_error",
            param: Some(param),
            code: Some("context_length_exceeded"),
        });
    }
    Ok(())
}

/// Tokenizes on the blocking pool (range `tokenize`), so long prompts never stall the HTTP workers.
async fn tokenize(
    f: impl FnOnce() -> Result<Vec<u32>, ApiError> + Send + 'static,
) -> Result<Vec<u32>, ApiError> {
    tokio::task::spawn_blocking(move || {
        let _r = Range::push("tokenize", 0);
        f()
    })
    .await
    .map_err(|e| ApiError {
        status: StatusCode::INTERNAL_SERVER_ERROR,
        message: format!("tokenization failed: {e}"),
        kind: "server_error",
        param: None,
        code: None,
    })?
}

/// Rejects token ids the model does not know.
fn model_vocab_guard<'a>(
    ids: &'a [u32],
    model: &dyn crate::engine::ModelHandle,
) -> Result<&'a [u32], ApiError> {
    if let Some(bad) = ids
        .iter()
        .find(|&&t| model.token_bytes(t).is_empty() && !model.is_special(t))
    {
        return Err(ApiError::bad(
            format!("token id {bad} is outside the vocabulary"),
            Some("prompt"),
        ));
    }
    Ok(ids)
}

fn finish_name(f: &Finish) -> &'static str {
    match f.reason {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::Abort => "abort",
        _ => "error",
    }
}

fn usage_json(f: &Finish) -> Value {
    json!({
        "prompt_tokens": f.prompt_tokens,
        "completion_tokens": f.completion_tokens,
        "total_tokens": f.prompt_tokens + f.completion_tokens,
    })
}

async fn run(
    st: Arc<AppState>,
    p: Prepared,
    is_chat: bool,
    param: &'static str,
) -> Result<Response, ApiError> {
    let mut req = p.req;
    let prompt_len = req.prompt.len();
    // Output is capped at the sequence capacity; max_tokens beyond it ends with finish_reason "length".
    req.max_tokens = req
        .max_tokens
        .min(st.engine.max_seq_tokens().saturating_sub(prompt_len).max(1));
    let sub = st.engine.submit(req).map_err(|e| submit_error(e, param))?;
    let id = format!("{}-{}", if is_chat { "chatcmpl" } else { "cmpl" }, sub.id);
    let created = now_unix();
    let model = st.served_model_name.clone();
    let mut resp = if p.stream {
        stream_response(sub.rx, id, created, model, is_chat, p.include_usage)
    } else {
        let mut rx = sub.rx;
        let mut text = String::new();
        let fin = loop {
            match rx.recv().await {
                Some(Chunk { text: t, finish, .. }) => {
                    text.push_str(&t);
                    if let Some(f) = finish {
                        break f;
                    }
                }
                None => {
                    return Err(ApiError {
                        status: StatusCode::SERVICE_UNAVAILABLE,
                        message: "the engine stopped before the request finished".into(),
                        kind: "server_error",
                        param: None,
                        code: None,
                    });
                }
            }
        };
        let choice = if is_chat {
            json!({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": null, "finish_reason": finish_name(&fin)})
        } else {
            json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish_name(&fin)})
        };
        let body = json!({
            "id": id,
            "object": if is_chat { "chat.completion" } else { "text_completion" },
            "created": created,
            "model": model,
            "choices": [choice],
            "usage": usage_json(&fin),
        });
        axum::Json(body).into_response()
    };
    if let Some(x) = p.x_request_id.and_then(|x| HeaderValue::from_str(&x).ok()) {
        resp.headers_mut().insert("x-request-id", x);
    }
    Ok(resp)
}

struct SseState {
    rx: tokio::sync::mpsc::Receiver<Chunk>,
    id: String,
    created: u64,
    model: String,
    is_chat: bool,
    include_usage: bool,
    sent_role: bool,
    done: bool,
}

impl SseState {
    fn chunk(&self, choices: Value, usage: Option<Value>) -> String {
        let mut v = json!({
            "id": self.id,
            "object": if self.is_chat { "chat.completion.chunk" } else { "text_completion" },
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        if self.include_usage {
            v["usage"] = usage.unwrap_or(Value::Null);
        }
        format!("data: {v}\n\n")
    }

    fn choice(&self, text: &str, finish: Option<&str>, role: bool) -> Value {
        if self.is_chat {
            let delta = match (role, finish.is_some() && text.is_empty()) {
                (true, _) => json!({"role": "assistant", "content": text}),
                (false, true) => json!({}),
                (false, false) => json!({"content": text}),
            };
            json!([{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}])
        } else {
            json!([{"index": 0, "text": text, "logprobs": null, "finish_reason": finish}])
        }
    }
}

fn stream_response(
    rx: tokio::sync::mpsc::Receiver<Chunk>,
    id: String,
    created: u64,
    model: String,
    is_chat: bool,
    include_usage: bool,
) -> Response {
    let st = SseState {
        rx,
        id,
        created,
        model,
        is_chat,
        include_usage,
        sent_role: false,
        done: false,
    };
    let stream = futures_util::stream::unfold(st, |mut st| async move {
        if st.done {
            return None;
        }
        let mut out = String::new();
        if st.is_chat && !st.sent_role {
            st.sent_role = true;
            out.push_str(&st.chunk(st.choice("", None, true), None));
            return Some((Ok::<_, Infallible>(Bytes::from(out)), st));
        }
        match st.rx.recv().await {
            Some(c) => {
                if !c.text.is_empty() {
                    out.push_str(&st.chunk(st.choice(&c.text, None, false), None));
                }
                if let Some(f) = c.finish {
                    out.push_str(&st.chunk(st.choice("", Some(finish_name(&f)), false), None));
                    if st.include_usage {
                        out.push_str(&st.chunk(json!([]), Some(usage_json(&f))));
                    }
                    out.push_str("data: [DONE]\n\n");
                    st.done = true;
                }
            }
            None => {
                // Engine gone: end the stream with an error event the OpenAI clients understand.
                let e = json!({"error": {"message": "the engine stopped", "type": "server_error", "param": null, "code": null}});
                out.push_str(&format!("data: {e}\n\n"));
                st.done = true;
            }
        }
        Some((Ok(Bytes::from(out)), st))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}
