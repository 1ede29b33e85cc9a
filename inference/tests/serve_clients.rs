//! End-to-end tests with real clients and the real model: the official OpenAI Python client (streaming and not)
//! against `llmserve`, and the default model (SmolLM2-135M-Instruct Q4_1) answering a factual question.
//! Missing prerequisites (the model file, the `openai` package) skip loudly, and fail under `CI=true`.

#![allow(clippy::unwrap_used, reason = "tests unwrap to fail loudly")]

mod serve_common;

use e2e::require;
use serde_json::json;
use serve_common::Server;

const OPENAI_SCRIPT: &str = r#"
import sys
from openai import OpenAI
c = OpenAI(base_url=sys.argv[1], api_key="unused")
r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "Say hi"}], max_tokens=8, temperature=0)
assert r.choices[0].finish_reason in ("stop", "length"), r
assert r.usage.completion_tokens >= 1 and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
full = r.choices[0].message.content
parts, usage = [], None
for ch in c.chat.completions.create(model="m", messages=[{"role": "user", "content": "Say hi"}], max_tokens=8,
                                    temperature=0, stream=True, stream_options={"include_usage": True}):
    if ch.usage is not None:
        usage = ch.usage
    for choice in ch.choices:
        if choice.delta.content:
            parts.append(choice.delta.content)
assert "".join(parts) == full, ("".join(parts), full)
assert usage is not None and usage.completion_tokens == r.usage.completion_tokens
t = c.completions.create(model="m", prompt="Hello", max_tokens=5, temperature=0)
assert t.choices[0].finish_reason in ("stop", "length")
s = "".join(x.choices[0].text for x in c.completions.create(model="m", prompt="Hello", max_tokens=5, temperature=0, stream=True))
assert s == t.choices[0].text, (s, t.choices[0].text)
try:
    c.chat.completions.create(model="m", messages=[], max_tokens=4)
    raise SystemExit("empty messages were accepted")
except Exception as e:
    assert getattr(e, "status_code", None) == 400, e
print("OPENAI-CLIENT-OK", len(models := c.models.list().data))
"#;

#[test]
fn official_openai_python_client_streaming_and_not() {
    let have = std::process::Command::new("python3")
        .args(["-c", "import openai"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !require(
        have,
        "the OpenAI Python client is not installed (pip install openai)",
    ) {
        return;
    }
    let model = serve_common::tiny_model();
    let s = Server::start(&model, &["--served-model-name", "m"]);
    let out = std::process::Command::new("python3")
        .args(["-c", OPENAI_SCRIPT, &format!("http://127.0.0.1:{}/v1", s.port)])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("OPENAI-CLIENT-OK 1"),
        "openai client failed:\n{stdout}\n{}\nserver:\n{}",
        String::from_utf8_lossy(&out.stderr),
        s.stderr()
    );
}

#[test]
fn default_model_knows_the_capital_of_france() {
    let path = inference::model::default_model_path();
    if !require(
        path.exists(),
        &format!(
            "the default model {} is missing (cargo xtask fetch-model)",
            path.display()
        ),
    ) {
        return;
    }
    let s = Server::start(&path, &[]);
    let r = s.post_json(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "What is the capital of France?"}], "temperature": 0, "max_tokens": 32}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let text = r.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(text.contains("Paris"), "answer: {text:?}");
}
