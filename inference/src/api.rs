//! The OpenAI-compatible HTTP API (axum): `/v1/chat/completions`, `/v1/completions`, `/v1/models`, `/health`,
//! `/metrics`, `/admin/reload`.
//!
//! Owns request validation, tokenization (range `tokenize`), the trace context headers (`traceparent`,
//! `x-request-id`, echoed back) and the OpenAI-style error body `{"error":{"message","type","param","code"}}` for
//! every failure: 400 for malformed or ill-typed input, prompts that do not fit and fields llmserve does not honour
//! (each named in `param`: `response_format` other than text, `logit_bias`, tools), 404 for unknown models and
//! routes, 429 when the queue is full. The sampling fields OpenAI clients send are honoured (`temperature`,
//! `top_p`, `presence_penalty`, `frequency_penalty`, `seed`, `n` up to [`MAX_N`], `logprobs`/`top_logprobs`,
//! `stop`, `stream_options.include_usage`), and vLLM's `top_k`, `min_p` and `repetition_penalty`. The response
//! bodies (JSON and SSE with `data: [DONE]`) are written by `output`.
//! It never runs model compute and never blocks a runtime thread on the engine; dropping a response (client gone)
//! drops its output channel, which the engine sees as a cancellation.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::engine::{EngineHandle, GenRequest, Range, Reloaded, SubmitError};
use crate::sampling::{MAX_TOP_LOGPROBS, SamplingParams};
use crate::trace_context::{TraceContext, sanitize_request_id};

mod output;

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

/// Fields shared by both endpoints (`logprobs` differs in type: a boolean in chat, a number in completions).
#[derive(Deserialize)]
struct Common {
    model: Option<String>,
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i64>,
    min_p: Option<f32>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    repetition_penalty: Option<f32>,
    seed: Option<i64>,
    stop: Option<StopSpec>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    n: Option<i64>,
    logprobs: Option<Value>,
    top_logprobs: Option<Value>,
    response_format: Option<Value>,
    logit_bias: Option<Value>,
    tools: Option<Value>,
    tool_choice: Option<Value>,
    functions: Option<Value>,
    echo: Option<bool>,
    best_of: Option<i64>,
    suffix: Option<String>,
}

/// Most choices one request may ask for (`n`).
pub const MAX_N: usize = 16;

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
    /// Choices to generate (`n`).
    n: usize,
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
    let n = c.n.unwrap_or(1);
    if !(1..=MAX_N as i64).contains(&n) {
        return Err(ApiError::bad(
            format!("n must be between 1 and {MAX_N}, got {n}"),
            Some("n"),
        ));
    }
    refuse_unsupported(c, is_chat)?;
    let sampling = sampling_params(c)?;
    let logprobs = logprobs_of(c, is_chat)?;
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
            sampling,
            seed: c.seed.map(|s| s as u64),
            logprobs,
            stop,
            trace,
            x_request_id: x_request_id.clone(),
            is_chat,
            arrival: Instant::now(),
        },
        n: n as usize,
        stream: c.stream.unwrap_or(false),
        include_usage: c
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
        x_request_id,
    })
}

/// A number field in `[lo, hi]` (`None` when absent).
fn in_range(v: Option<f32>, lo: f32, hi: f32, name: &'static str) -> Result<Option<f32>, ApiError> {
    match v {
        Some(x) if !(lo..=hi).contains(&x) => Err(ApiError::bad(
            format!("{name} must be between {lo} and {hi}, got {x}"),
            Some(name),
        )),
        v => Ok(v),
    }
}

/// The sampling fields: OpenAI's (`temperature`, `top_p`, `presence_penalty`, `frequency_penalty`) and vLLM's
/// (`top_k`: -1 or 0 disables; `min_p`; `repetition_penalty`), each checked against its range.
fn sampling_params(c: &Common) -> Result<SamplingParams, ApiError> {
    let d = SamplingParams::default();
    let top_p = c.top_p.unwrap_or(d.top_p);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::bad(
            format!("top_p must be in (0, 1], got {top_p}"),
            Some("top_p"),
        ));
    }
    let top_k = match c.top_k {
        None | Some(-1) | Some(0) => 0,
        Some(k) if k > 0 => u32::try_from(k).unwrap_or(u32::MAX),
        Some(k) => {
            return Err(ApiError::bad(
                format!("top_k must be -1 (off) or at least 1, got {k}"),
                Some("top_k"),
            ));
        }
    };
    let repetition_penalty = c.repetition_penalty.unwrap_or(d.repetition_penalty);
    if !(repetition_penalty > 0.0 && repetition_penalty.is_finite()) {
        return Err(ApiError::bad(
            format!("repetition_penalty must be a positive number, got {repetition_penalty}"),
            Some("repetition_penalty"),
        ));
    }
    Ok(SamplingParams {
        temperature: in_range(c.temperature, 0.0, 2.0, "temperature")?.unwrap_or(d.temperature),
        top_p,
        top_k,
        min_p: in_range(c.min_p, 0.0, 1.0, "min_p")?.unwrap_or(d.min_p),
        presence_penalty: in_range(c.presence_penalty, -2.0, 2.0, "presence_penalty")?
            .unwrap_or(d.presence_penalty),
        frequency_penalty: in_range(c.frequency_penalty, -2.0, 2.0, "frequency_penalty")?
            .unwrap_or(d.frequency_penalty),
        repetition_penalty,
    })
}

/// `logprobs` and `top_logprobs`: in chat `logprobs` is a boolean and `top_logprobs` (0 to 20, only with
/// `logprobs: true`) the alternatives per token; in completions `logprobs` is the number of alternatives (0 to
/// 20). `None`: no log-probabilities.
fn logprobs_of(c: &Common, is_chat: bool) -> Result<Option<u8>, ApiError> {
    let count = |v: &Value, name: &'static str| -> Result<u8, ApiError> {
        v.as_u64()
            .filter(|&n| n as usize <= MAX_TOP_LOGPROBS)
            .map(|n| n as u8)
            .ok_or_else(|| {
                ApiError::bad(
                    format!("{name} must be an integer between 0 and {MAX_TOP_LOGPROBS}, got {v}"),
                    Some(name),
                )
            })
    };
    let top = c.top_logprobs.as_ref().filter(|v| !v.is_null());
    if !is_chat {
        if top.is_some() {
            return Err(ApiError::bad(
                "top_logprobs belongs to chat completions; in completions, logprobs is the number of alternatives",
                Some("top_logprobs"),
            ));
        }
        return match c.logprobs.as_ref().filter(|v| !v.is_null()) {
            None => Ok(None),
            Some(v) => count(v, "logprobs").map(Some),
        };
    }
    let on = match c.logprobs.as_ref().filter(|v| !v.is_null()) {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => {
            return Err(ApiError::bad(
                format!("logprobs must be true or false in chat completions, got {v}"),
                Some("logprobs"),
            ));
        }
    };
    match (on, top) {
        (false, None) => Ok(None),
        (false, Some(v)) if v.as_u64() == Some(0) => Ok(None),
        (false, Some(_)) => Err(ApiError::bad(
            "top_logprobs needs logprobs: true",
            Some("top_logprobs"),
        )),
        (true, None) => Ok(Some(0)),
        (true, Some(v)) => count(v, "top_logprobs").map(Some),
    }
}

/// Refuses, naming the field, what llmserve does not do: structured output (`response_format` other than
/// text), `logit_bias`, tools and functions, and in completions `echo`, `best_of` > 1 and `suffix`.
fn refuse_unsupported(c: &Common, is_chat: bool) -> Result<(), ApiError> {
    if let Some(rf) = c.response_format.as_ref().filter(|v| !v.is_null()) {
        let kind = rf.get("type").and_then(Value::as_str);
        if kind != Some("text") {
            return Err(ApiError::bad(
                format!(
                    "response_format {} is not supported: llmserve generates free text only \
                     ({{\"type\": \"text\"}}); there is no JSON mode or schema-constrained decoding",
                    kind.map_or_else(|| rf.to_string(), |k| format!("{k:?}"))
                ),
                Some("response_format"),
            ));
        }
    }
    let non_empty = |v: &Option<Value>| {
        v.as_ref().is_some_and(|v| match v {
            Value::Null => false,
            Value::Array(a) => !a.is_empty(),
            Value::Object(o) => !o.is_empty(),
            _ => true,
        })
    };
    if non_empty(&c.logit_bias) {
        return Err(ApiError::bad("logit_bias is not supported", Some("logit_bias")));
    }
    for (v, name) in [(&c.tools, "tools"), (&c.functions, "functions")] {
        if non_empty(v) {
            return Err(ApiError::bad(
                format!("{name} are not supported: llmserve does not call tools"),
                Some(name),
            ));
        }
    }
    if c.tool_choice
        .as_ref()
        .is_some_and(|v| !v.is_null() && v.as_str() != Some("none"))
    {
        return Err(ApiError::bad(
            "tool_choice is not supported: llmserve does not call tools",
            Some("tool_choice"),
        ));
    }
    if !is_chat {
        if c.echo == Some(true) {
            return Err(ApiError::bad("echo is not supported", Some("echo")));
        }
        if c.best_of.is_some_and(|b| b != 1 && Some(b) != c.n) {
            return Err(ApiError::bad(
                "best_of is not supported (only best_of = n)",
                Some("best_of"),
            ));
        }
        if c.suffix.as_ref().is_some_and(|s| !s.is_empty()) {
            return Err(ApiError::bad("suffix is not supported", Some("suffix")));
        }
    }
    Ok(())
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
    // Each choice is an engine request of its own; with a seed, choice i draws with seed + i (vLLM's way), so
    // the choices differ and the response is reproducible. Refusing one drops the others (a cancellation).
    let mut rxs = Vec::with_capacity(p.n);
    let mut first_id = 0;
    for i in 0..p.n {
        let mut r = req.clone();
        r.seed = req.seed.map(|s| s.wrapping_add(i as u64));
        let sub = st.engine.submit(r).map_err(|e| submit_error(e, param))?;
        if i == 0 {
            first_id = sub.id;
        }
        rxs.push(sub.rx);
    }
    let meta = output::Meta {
        id: format!("{}-{first_id}", if is_chat { "chatcmpl" } else { "cmpl" }),
        created: now_unix(),
        model: st.served_model_name.clone(),
        is_chat,
        include_usage: p.include_usage,
        logprobs: req.logprobs.is_some(),
    };
    let mut resp = if p.stream {
        output::stream(rxs, meta)
    } else {
        axum::Json(output::collect(rxs, &meta).await?).into_response()
    };
    if let Some(x) = p.x_request_id.and_then(|x| HeaderValue::from_str(&x).ok()) {
        resp.headers_mut().insert("x-request-id", x);
    }
    Ok(resp)
}
