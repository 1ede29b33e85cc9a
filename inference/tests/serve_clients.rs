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

/// Runs a Python script with the official OpenAI client against `llmserve` on the tiny model (served as `m`); the
/// script gets the base URL and must print `marker`.
fn run_openai_client(script: &str, marker: &str) {
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
        .args(["-c", script, &format!("http://127.0.0.1:{}/v1", s.port)])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains(marker),
        "openai client failed:\n{stdout}\n{}\nserver:\n{}",
        String::from_utf8_lossy(&out.stderr),
        s.stderr()
    );
}

#[test]
fn official_openai_python_client_streaming_and_not() {
    run_openai_client(OPENAI_SCRIPT, "OPENAI-CLIENT-OK 1");
}

/// What OpenAI-style clients send besides the basics: a seed, `n`, log-probabilities, penalties, vLLM's
/// extra sampling fields through `extra_body`, and a `response_format` llmserve refuses with a 400 naming it.
const OPENAI_FIELDS_SCRIPT: &str = r#"
import sys
import openai
from openai import OpenAI
c = OpenAI(base_url=sys.argv[1], api_key="unused")
msgs = [{"role": "user", "content": "Tell me a story"}]
# A seed makes sampled output reproducible; n choices come back with their indices.
a = c.chat.completions.create(model="m", messages=msgs, max_tokens=8, temperature=1.0, top_p=0.95, seed=42, n=2)
b = c.chat.completions.create(model="m", messages=msgs, max_tokens=8, temperature=1.0, top_p=0.95, seed=42, n=2)
assert [ch.index for ch in a.choices] == [0, 1], a
assert [ch.message.content for ch in a.choices] == [ch.message.content for ch in b.choices], (a, b)
assert a.usage.completion_tokens >= 2
# Log-probabilities, as the client parses them.
r = c.chat.completions.create(model="m", messages=msgs, max_tokens=5, temperature=0, logprobs=True, top_logprobs=4)
lp = r.choices[0].logprobs.content
assert len(lp) == r.usage.completion_tokens, r
for t in lp:
    assert t.logprob <= 0 and len(t.top_logprobs) == 4 and t.top_logprobs[0].token == t.token, t
t = c.completions.create(model="m", prompt="Once upon", max_tokens=4, temperature=0, logprobs=3)
assert len(t.choices[0].logprobs.tokens) == t.usage.completion_tokens, t
assert len(t.choices[0].logprobs.top_logprobs[0]) <= 3, t
# Penalties, and vLLM's fields where the client has no parameter for them.
r = c.chat.completions.create(model="m", messages=msgs, max_tokens=6, temperature=0.8, presence_penalty=0.5,
                              frequency_penalty=0.5, seed=1,
                              extra_body={"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1})
assert r.choices[0].finish_reason in ("stop", "length"), r
# Streaming n = 2 with usage: every chunk names its choice; the usage comes last.
seen, usage = set(), None
for ch in c.chat.completions.create(model="m", messages=msgs, max_tokens=6, temperature=0.7, seed=5, n=2,
                                    stream=True, stream_options={"include_usage": True}):
    if ch.usage is not None:
        usage = ch.usage
    for choice in ch.choices:
        seen.add(choice.index)
assert seen == {0, 1} and usage is not None and usage.completion_tokens >= 2, (seen, usage)
# What llmserve does not do is refused, naming the field.
for kwargs, param in [({"response_format": {"type": "json_object"}}, "response_format"),
                      ({"logit_bias": {"5": 10}}, "logit_bias"),
                      ({"n": 99}, "n")]:
    try:
        c.chat.completions.create(model="m", messages=msgs, max_tokens=4, **kwargs)
        raise SystemExit(f"{kwargs} was accepted")
    except openai.BadRequestError as e:
        assert e.status_code == 400 and e.body["param"] == param, (e, e.body)
print("OPENAI-FIELDS-OK")
"#;

#[test]
fn official_openai_python_client_sends_seed_n_logprobs_and_penalties() {
    run_openai_client(OPENAI_FIELDS_SCRIPT, "OPENAI-FIELDS-OK");
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
