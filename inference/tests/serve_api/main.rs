//! End-to-end tests of the serving side on a tiny generated model: the real `llmserve` binary, driven over HTTP
//! like a client would.

#![allow(clippy::unwrap_used, reason = "tests unwrap to fail loudly")]

#[path = "../serve_common/mod.rs"]
mod serve_common;

use std::time::Duration;

use e2e::http;
use serde_json::{Value, json};
use serve_common::{Server, wait_until};

mod load;
mod openai;
mod ops;

fn chat_body(content: &str, extra: Value) -> Value {
    let mut b =
        json!({"model": "tiny", "messages": [{"role": "user", "content": content}], "temperature": 0});
    merge(&mut b, extra);
    b
}

fn completion_body(prompt: &str, extra: Value) -> Value {
    let mut b = json!({"model": "tiny", "prompt": prompt, "temperature": 0});
    merge(&mut b, extra);
    b
}

fn merge(b: &mut Value, extra: Value) {
    if let (Some(o), Value::Object(e)) = (b.as_object_mut(), extra) {
        o.extend(e);
    }
}

fn start(args: &[&str]) -> Server {
    let model = serve_common::tiny_model();
    let mut a = vec!["--served-model-name", "tiny", "--threads", "1"];
    a.extend_from_slice(args);
    Server::start(&model, &a)
}
