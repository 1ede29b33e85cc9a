//! The response bodies of the two generation endpoints: a request's `n` choices collected into one JSON body,
//! or streamed as server-sent events (`data: {chunk}` … `data: [DONE]`), with OpenAI's `logprobs` objects (chat:
//! `{"content": [{token, logprob, bytes, top_logprobs}]}`; completions: `{tokens, token_logprobs, top_logprobs,
//! text_offset}`) and `usage` (prompt tokens once, completion tokens of every choice).
//!
//! Owns only the wire format of the output; it reads the engine's [`Chunk`]s and never talks to the engine
//! otherwise. The choices of one request run as separate engine requests; a choice whose channel closes before
//! its finish (the engine stopped) ends the response with an error.

use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use llmprof_abi::FinishReason;
use serde_json::{Value, json};
use tokio::sync::mpsc::Receiver;

use super::ApiError;
use crate::engine::{Chunk, Finish, LogprobEntry};

/// What every chunk or body of one response repeats.
pub(super) struct Meta {
    /// `chatcmpl-N` or `cmpl-N`.
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// The served model name.
    pub model: String,
    /// Chat (true) or completions (false).
    pub is_chat: bool,
    /// Streams end with a `usage` chunk (`stream_options.include_usage`).
    pub include_usage: bool,
    /// The request asked for log-probabilities.
    pub logprobs: bool,
}

/// The log-probability reported for a token the model gives no chance (OpenAI's floor; JSON has no -∞).
const LOGPROB_FLOOR: f32 = -9999.0;

fn finish_name(f: &Finish) -> &'static str {
    match f.reason {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::Abort => "abort",
        _ => "error",
    }
}

fn usage_json(prompt_tokens: u32, completion_tokens: u32) -> Value {
    json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    })
}

fn lp(v: f32) -> f32 {
    if v.is_finite() { v } else { LOGPROB_FLOOR }
}

fn token_text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Chat's `logprobs` object for `entries`.
fn chat_logprobs(entries: &[LogprobEntry]) -> Value {
    let one = |bytes: &[u8], v: f32| json!({"token": token_text(bytes), "logprob": lp(v), "bytes": bytes});
    let content: Vec<Value> = entries
        .iter()
        .map(|e| {
            let mut v = one(&e.bytes, e.logprob);
            v["top_logprobs"] = e.top.iter().map(|(b, x)| one(b, *x)).collect();
            v
        })
        .collect();
    json!({"content": content, "refusal": null})
}

/// Completions' `logprobs` object for `entries`; `offset` is the text offset of the first one (advanced past
/// them).
fn completion_logprobs(entries: &[LogprobEntry], offset: &mut usize) -> Value {
    let mut tokens = Vec::with_capacity(entries.len());
    let mut values = Vec::with_capacity(entries.len());
    let mut tops = Vec::with_capacity(entries.len());
    let mut offsets = Vec::with_capacity(entries.len());
    for e in entries {
        let t = token_text(&e.bytes);
        offsets.push(*offset);
        *offset += t.chars().count();
        tokens.push(t);
        values.push(lp(e.logprob));
        let top: serde_json::Map<String, Value> = e
            .top
            .iter()
            .map(|(b, x)| (token_text(b), json!(lp(*x))))
            .collect();
        tops.push(Value::Object(top));
    }
    json!({"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets})
}

fn engine_stopped() -> ApiError {
    ApiError {
        status: StatusCode::SERVICE_UNAVAILABLE,
        message: "the engine stopped before the request finished".into(),
        kind: "server_error",
        param: None,
        code: None,
    }
}

/// The JSON body of a non-streamed response: every choice's text (and log-probabilities) to its finish.
pub(super) async fn collect(rxs: Vec<Receiver<Chunk>>, meta: &Meta) -> Result<Value, ApiError> {
    let mut choices = Vec::with_capacity(rxs.len());
    let (mut prompt_tokens, mut completion_tokens) = (0, 0);
    for (index, mut rx) in rxs.into_iter().enumerate() {
        let mut text = String::new();
        let mut entries = Vec::new();
        let fin = loop {
            let c = rx.recv().await.ok_or_else(engine_stopped)?;
            text.push_str(&c.text);
            entries.extend(c.logprobs);
            if let Some(f) = c.finish {
                break f;
            }
        };
        prompt_tokens = fin.prompt_tokens;
        completion_tokens += fin.completion_tokens;
        let logprobs = match (meta.logprobs, meta.is_chat) {
            (false, _) => Value::Null,
            (true, true) => chat_logprobs(&entries),
            (true, false) => completion_logprobs(&entries, &mut 0),
        };
        choices.push(if meta.is_chat {
            json!({"index": index, "message": {"role": "assistant", "content": text}, "logprobs": logprobs, "finish_reason": finish_name(&fin)})
        } else {
            json!({"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_name(&fin)})
        });
    }
    Ok(json!({
        "id": meta.id,
        "object": if meta.is_chat { "chat.completion" } else { "text_completion" },
        "created": meta.created,
        "model": meta.model,
        "choices": choices,
        "usage": usage_json(prompt_tokens, completion_tokens),
    }))
}

/// Streaming state: the choices' text offsets (completions' `text_offset`), how many have finished, the usage.
struct Sse {
    meta: Meta,
    offsets: Vec<usize>,
    open: usize,
    prompt_tokens: u32,
    completion_tokens: u32,
}

impl Sse {
    fn event(&self, choices: Value, usage: Option<Value>) -> String {
        let m = &self.meta;
        let mut v = json!({
            "id": m.id,
            "object": if m.is_chat { "chat.completion.chunk" } else { "text_completion" },
            "created": m.created,
            "model": m.model,
            "choices": choices,
        });
        if m.include_usage {
            v["usage"] = usage.unwrap_or(Value::Null);
        }
        format!("data: {v}\n\n")
    }

    /// One choice's piece: `text` with `entries`' log-probabilities, `finish` on its last.
    fn choice(&mut self, index: usize, text: &str, entries: &[LogprobEntry], finish: Option<&str>) -> Value {
        let logprobs = match (self.meta.logprobs && !entries.is_empty(), self.meta.is_chat) {
            (false, _) => Value::Null,
            (true, true) => chat_logprobs(entries),
            (true, false) => completion_logprobs(entries, &mut self.offsets[index]),
        };
        if self.meta.is_chat {
            let delta = if finish.is_some() && text.is_empty() {
                json!({})
            } else {
                json!({"content": text})
            };
            json!([{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}])
        } else {
            json!([{"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}])
        }
    }

    /// The events for one chunk of choice `index` (`None`: its channel closed before its finish).
    fn on_chunk(&mut self, index: usize, chunk: Option<Chunk>) -> (String, bool) {
        let Some(c) = chunk else {
            // Engine gone: end the stream with an error event the OpenAI clients understand.
            let e = json!({"error": {"message": "the engine stopped", "type": "server_error", "param": null, "code": null}});
            return (format!("data: {e}\n\n"), true);
        };
        let mut out = String::new();
        if !c.text.is_empty() || (self.meta.logprobs && !c.logprobs.is_empty()) {
            let choice = self.choice(index, &c.text, &c.logprobs, None);
            out.push_str(&self.event(choice, None));
        }
        let Some(f) = c.finish else {
            return (out, false);
        };
        let choice = self.choice(index, "", &[], Some(finish_name(&f)));
        out.push_str(&self.event(choice, None));
        self.prompt_tokens = f.prompt_tokens;
        self.completion_tokens += f.completion_tokens;
        self.open -= 1;
        if self.open > 0 {
            return (out, false);
        }
        if self.meta.include_usage {
            let usage = usage_json(self.prompt_tokens, self.completion_tokens);
            out.push_str(&self.event(json!([]), Some(usage)));
        }
        out.push_str("data: [DONE]\n\n");
        (out, true)
    }
}

/// The streamed response: for chat, a first event per choice with the assistant role; then each choice's
/// chunks as they come (choices interleaved, each event naming its `index`); a usage event when asked; `[DONE]`.
pub(super) fn stream(rxs: Vec<Receiver<Chunk>>, meta: Meta) -> Response {
    let n = rxs.len();
    let sse = Sse {
        meta,
        offsets: vec![0; n],
        open: n,
        prompt_tokens: 0,
        completion_tokens: 0,
    };
    let mut first = String::new();
    if sse.meta.is_chat {
        for index in 0..n {
            let delta = json!([{"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]);
            first.push_str(&sse.event(delta, None));
        }
    }
    // Each choice's chunks tagged with its index, ending with `None` if the channel closes before the finish.
    let choices = rxs.into_iter().enumerate().map(|(index, rx)| {
        futures_util::stream::unfold((rx, false), move |(mut rx, ended)| async move {
            if ended {
                return None;
            }
            match rx.recv().await {
                Some(c) => {
                    let last = c.finish.is_some();
                    Some(((index, Some(c)), (rx, last)))
                }
                None => Some(((index, None), (rx, true))),
            }
        })
        .boxed()
    });
    let merged = futures_util::stream::select_all(choices);
    let head =
        futures_util::stream::iter((!first.is_empty()).then(|| Ok::<_, Infallible>(Bytes::from(first))));
    let body = futures_util::stream::unfold((merged, sse, false), |(mut merged, mut sse, done)| async move {
        if done {
            return None;
        }
        let (out, done) = match merged.next().await {
            Some((index, chunk)) => sse.on_chunk(index, chunk),
            None => (String::new(), true),
        };
        Some((Ok(Bytes::from(out)), (merged, sse, done)))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(head.chain(body)))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}
