//! The OpenAI API as clients use it: chat and completions, streamed and not; `max_tokens` and stop strings;
//! errors; `n`, seeds, logprobs and penalties; trace headers and the request id.

use super::*;

/// Text, finish reason and usage of a streamed response; checks the SSE framing on the way.
fn collect_stream(events: &[String], is_chat: bool) -> (String, String, Option<Value>) {
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "stream ends with [DONE]: {events:?}"
    );
    let mut text = String::new();
    let mut finish = String::new();
    let mut usage = None;
    for e in &events[..events.len() - 1] {
        let v: Value = serde_json::from_str(e).unwrap();
        assert_eq!(
            v["object"],
            if is_chat {
                "chat.completion.chunk"
            } else {
                "text_completion"
            }
        );
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            assert_eq!(
                v["choices"].as_array().unwrap().len(),
                0,
                "usage chunk has no choices"
            );
            usage = Some(u.clone());
            continue;
        }
        let c = &v["choices"][0];
        let piece = if is_chat {
            c["delta"]["content"].as_str()
        } else {
            c["text"].as_str()
        };
        text.push_str(piece.unwrap_or(""));
        if let Some(f) = c["finish_reason"].as_str() {
            finish = f.to_string();
        }
    }
    (text, finish, usage)
}

fn check_usage(u: &Value, max_tokens: u64, finish: &str) {
    let (p, c, t) = (
        u["prompt_tokens"].as_u64().unwrap(),
        u["completion_tokens"].as_u64().unwrap(),
        u["total_tokens"].as_u64().unwrap(),
    );
    assert!(p > 0);
    assert_eq!(t, p + c);
    assert!(c >= 1 && c <= max_tokens);
    if finish == "length" {
        assert_eq!(c, max_tokens, "length means max_tokens were generated");
    } else {
        assert_eq!(finish, "stop");
    }
}

#[test]
fn chat_and_completions_streaming_and_not_agree() {
    let s = start(&[]);
    assert_eq!(s.get("/health").status, 200);
    let models = s.get("/v1/models").json();
    assert_eq!(models["data"][0]["id"], "tiny");

    for is_chat in [true, false] {
        let (path, body) = if is_chat {
            (
                "/v1/chat/completions",
                chat_body("Hello there", json!({"max_tokens": 12})),
            )
        } else {
            (
                "/v1/completions",
                completion_body("Once upon a time", json!({"max_tokens": 12})),
            )
        };
        let r = s.post_json(path, &body);
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        let c = &v["choices"][0];
        let text = if is_chat {
            assert_eq!(v["object"], "chat.completion");
            assert_eq!(c["message"]["role"], "assistant");
            c["message"]["content"].as_str().unwrap().to_string()
        } else {
            assert_eq!(v["object"], "text_completion");
            c["text"].as_str().unwrap().to_string()
        };
        let finish = c["finish_reason"].as_str().unwrap().to_string();
        check_usage(&v["usage"], 12, &finish);

        let mut sb = body.clone();
        merge(
            &mut sb,
            json!({"stream": true, "stream_options": {"include_usage": true}}),
        );
        let r = s.post_json(path, &sb);
        assert_eq!(r.status, 200);
        assert!(r.header("content-type").unwrap().starts_with("text/event-stream"));
        let (stext, sfinish, usage) = collect_stream(&r.sse_events(), is_chat);
        assert_eq!(stext, text, "greedy streaming and non-streaming outputs agree");
        assert_eq!(sfinish, finish);
        assert_eq!(usage.expect("include_usage sends a usage chunk"), v["usage"]);

        // Without include_usage there is no usage chunk.
        let mut sb = body.clone();
        merge(&mut sb, json!({"stream": true}));
        let (_, _, usage) = collect_stream(&s.post_json(path, &sb).sse_events(), is_chat);
        assert!(usage.is_none());
    }
}

#[test]
fn max_tokens_gives_length_and_stop_strings_cut_the_output() {
    let s = start(&[]);
    let r = s
        .post_json(
            "/v1/completions",
            &completion_body("The quick brown fox", json!({"max_tokens": 24})),
        )
        .json();
    let text = r["choices"][0]["text"].as_str().unwrap().to_string();
    let chars: Vec<char> = text.chars().collect();
    if r["choices"][0]["finish_reason"] == "length" {
        assert_eq!(r["usage"]["completion_tokens"], 24);
    }
    assert!(
        chars.len() >= 6,
        "tiny model produced too little text to test stop strings: {text:?}"
    );
    let stop: String = chars[3..5].iter().collect();
    let expected = &text[..text.find(&stop).unwrap()];
    for stream in [false, true] {
        let body = completion_body(
            "The quick brown fox",
            json!({"max_tokens": 24, "stop": [stop.clone(), "\u{1}never"], "stream": stream}),
        );
        let r = s.post_json("/v1/completions", &body);
        let (t, f) = if stream {
            let (t, f, _) = collect_stream(&r.sse_events(), false);
            (t, f)
        } else {
            let v = r.json();
            (
                v["choices"][0]["text"].as_str().unwrap().to_string(),
                v["choices"][0]["finish_reason"].as_str().unwrap().to_string(),
            )
        };
        assert_eq!(t, expected, "output ends before the stop string {stop:?}");
        assert_eq!(f, "stop");
    }
    // A single string works too.
    let v = s
        .post_json(
            "/v1/completions",
            &completion_body("The quick brown fox", json!({"max_tokens": 24, "stop": stop})),
        )
        .json();
    assert_eq!(v["choices"][0]["text"], expected);
}

#[test]
fn bad_requests_get_openai_style_errors() {
    let s = start(&[]);
    let cases: Vec<(&str, Vec<u8>, u16, Option<&str>)> = vec![
        ("/v1/chat/completions", b"{not json".to_vec(), 400, None),
        ("/v1/chat/completions", b"[1,2]".to_vec(), 400, None),
        (
            "/v1/chat/completions",
            json!({"messages": "hi"}).to_string().into_bytes(),
            400,
            None,
        ),
        (
            "/v1/chat/completions",
            json!({"messages": []}).to_string().into_bytes(),
            400,
            Some("messages"),
        ),
        (
            "/v1/chat/completions",
            chat_body("hi", json!({"temperature": "hot"}))
                .to_string()
                .into_bytes(),
            400,
            None,
        ),
        (
            "/v1/chat/completions",
            chat_body("hi", json!({"temperature": 7}))
                .to_string()
                .into_bytes(),
            400,
            Some("temperature"),
        ),
        (
            "/v1/chat/completions",
            chat_body("hi", json!({"max_tokens": -1}))
                .to_string()
                .into_bytes(),
            400,
            None,
        ),
        (
            "/v1/chat/completions",
            chat_body("hi", json!({"stop": 5})).to_string().into_bytes(),
            400,
            None,
        ),
        (
            "/v1/chat/completions",
            chat_body("hi", json!({"model": "gpt-9"}))
                .to_string()
                .into_bytes(),
            404,
            Some("model"),
        ),
        (
            "/v1/completions",
            json!({"prompt": 12}).to_string().into_bytes(),
            400,
            None,
        ),
        (
            "/v1/completions",
            json!({"prompt": [4000000000u64]}).to_string().into_bytes(),
            400,
            None,
        ),
        (
            "/v1/completions",
            json!({"prompt": "word ".repeat(5000)}).to_string().into_bytes(),
            400,
            Some("prompt"),
        ),
        (
            "/v1/completions",
            json!({"prompt": ""}).to_string().into_bytes(),
            400,
            Some("prompt"),
        ),
        ("/v1/nothing", b"{}".to_vec(), 404, None),
    ];
    // The fields OpenAI clients send that llmserve refuses, or gets out of range: each named in `param`.
    let chat = |extra: Value| chat_body("hi", extra).to_string().into_bytes();
    let completion = |extra: Value| completion_body("hi", extra).to_string().into_bytes();
    let mut cases = cases;
    for (body, param) in [
        (
            chat(json!({"response_format": {"type": "json_object"}})),
            "response_format",
        ),
        (
            chat(
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}),
            ),
            "response_format",
        ),
        (chat(json!({"logit_bias": {"5": 10}})), "logit_bias"),
        (
            chat(json!({"tools": [{"type": "function", "function": {"name": "f"}}]})),
            "tools",
        ),
        (chat(json!({"tool_choice": "required"})), "tool_choice"),
        (chat(json!({"top_logprobs": 3})), "top_logprobs"),
        (
            chat(json!({"logprobs": true, "top_logprobs": 21})),
            "top_logprobs",
        ),
        (chat(json!({"logprobs": 3})), "logprobs"),
        (completion(json!({"logprobs": 21})), "logprobs"),
        (completion(json!({"logprobs": true})), "logprobs"),
        (completion(json!({"top_logprobs": 2})), "top_logprobs"),
        (completion(json!({"echo": true})), "echo"),
        (completion(json!({"best_of": 3})), "best_of"),
        (chat(json!({"n": 0})), "n"),
        (chat(json!({"n": 17})), "n"),
        (chat(json!({"presence_penalty": 3})), "presence_penalty"),
        (chat(json!({"frequency_penalty": -2.5})), "frequency_penalty"),
        (chat(json!({"repetition_penalty": 0})), "repetition_penalty"),
        (chat(json!({"top_k": -5})), "top_k"),
        (chat(json!({"min_p": 1.5})), "min_p"),
        (chat(json!({"top_p": 0})), "top_p"),
    ] {
        let path = if String::from_utf8_lossy(&body).contains("messages") {
            "/v1/chat/completions"
        } else {
            "/v1/completions"
        };
        cases.push((path, body, 400, Some(param)));
    }
    for (path, body, status, param) in cases {
        let r = s.post_raw(path, &[("content-type", "application/json")], &body);
        assert_eq!(
            r.status,
            status,
            "{path} {}: {}",
            String::from_utf8_lossy(&body)
                .chars()
                .take(80)
                .collect::<String>(),
            r.text()
        );
        let v = r.json();
        let e = &v["error"];
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        assert!(e["type"].is_string());
        assert!(e.get("param").is_some() && e.get("code").is_some(), "{v}");
        if let Some(p) = param {
            assert_eq!(e["param"], p, "{v}");
        }
    }
    let r = s.post_raw(
        "/v1/completions",
        &[],
        json!({"prompt": "word ".repeat(5000)}).to_string().as_bytes(),
    );
    assert_eq!(r.json()["error"]["code"], "context_length_exceeded");
    // Still serving; what clients send by default is accepted.
    assert_eq!(
        s.post_json(
            "/v1/completions",
            &completion_body("ok", json!({"max_tokens": 2}))
        )
        .status,
        200
    );
    let defaults = json!({"max_tokens": 2, "n": 1, "response_format": {"type": "text"}, "logit_bias": {},
        "tools": null, "tool_choice": "none", "presence_penalty": 0, "frequency_penalty": 0, "top_k": -1,
        "user": "u1", "logprobs": false, "top_logprobs": 0});
    let r = s.post_json("/v1/chat/completions", &chat_body("ok", defaults));
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.json()["choices"][0]["logprobs"].is_null());
}

/// The choices of a response: (index, text, finish) of each, from a JSON body or an SSE stream.
fn choices_of(v: &Value, is_chat: bool) -> Vec<(u64, String, String)> {
    v["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let text = if is_chat {
                &c["message"]["content"]
            } else {
                &c["text"]
            };
            (
                c["index"].as_u64().unwrap(),
                text.as_str().unwrap().to_string(),
                c["finish_reason"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn n_choices_seeds_logprobs_and_penalties_as_openai_clients_send_them() {
    let s = start(&[]);
    // n = 3 with a seed: three choices, reproducible, told apart by their seeds; usage counts every choice.
    let body = chat_body(
        "Tell me a story",
        json!({"max_tokens": 10, "temperature": 1.0, "n": 3, "seed": 7}),
    );
    let a = s.post_json("/v1/chat/completions", &body).json();
    let b = s.post_json("/v1/chat/completions", &body).json();
    let (ca, cb) = (choices_of(&a, true), choices_of(&b, true));
    assert_eq!(ca.iter().map(|c| c.0).collect::<Vec<_>>(), [0, 1, 2], "{a}");
    assert_eq!(ca, cb, "a seed gives the same choices every time");
    assert!(
        ca[0].1 != ca[1].1 || ca[1].1 != ca[2].1,
        "the choices draw with different seeds: {ca:?}"
    );
    let completion: u64 = ca.iter().map(|c| c.1.len() as u64).sum();
    assert!(completion > 0);
    let u = &a["usage"];
    assert_eq!(
        u["total_tokens"].as_u64(),
        Some(u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap())
    );
    let other = s
        .post_json(
            "/v1/chat/completions",
            &chat_body(
                "Tell me a story",
                json!({"max_tokens": 10, "temperature": 1.0, "n": 3, "seed": 8}),
            ),
        )
        .json();
    assert_ne!(choices_of(&other, true), ca, "another seed, other draws");

    // Chat logprobs: one entry per token, the alternatives sorted, the greedy token the most likely one.
    let r = s
        .post_json(
            "/v1/chat/completions",
            &chat_body(
                "Hello",
                json!({"max_tokens": 6, "logprobs": true, "top_logprobs": 3}),
            ),
        )
        .json();
    let content = r["choices"][0]["logprobs"]["content"].as_array().unwrap().clone();
    assert_eq!(
        content.len() as u64,
        r["usage"]["completion_tokens"].as_u64().unwrap(),
        "{r}"
    );
    for e in &content {
        let lp = e["logprob"].as_f64().unwrap();
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3, "{e}");
        assert!(
            lp <= 0.0 && e["bytes"].is_array() && e["token"].is_string(),
            "{e}"
        );
        let tops: Vec<f64> = top.iter().map(|t| t["logprob"].as_f64().unwrap()).collect();
        assert!(tops.windows(2).all(|w| w[0] >= w[1]), "{tops:?}");
        assert_eq!(
            top[0]["token"], e["token"],
            "greedy picks the most likely token: {e}"
        );
        assert!((tops[0] - lp).abs() < 1e-6);
        let mass: f64 = tops.iter().map(|x| x.exp()).sum();
        assert!(mass <= 1.0 + 1e-4, "{tops:?}");
    }
    // Completions logprobs: tokens, their logprobs, the alternatives and the offsets.
    let r = s
        .post_json(
            "/v1/completions",
            &completion_body("Once upon", json!({"max_tokens": 5, "logprobs": 2})),
        )
        .json();
    let lp = &r["choices"][0]["logprobs"];
    let n = r["usage"]["completion_tokens"].as_u64().unwrap() as usize;
    assert_eq!(lp["tokens"].as_array().unwrap().len(), n, "{r}");
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), n);
    assert!(
        lp["top_logprobs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t.as_object().unwrap().len() <= 2)
    );
    let offsets: Vec<u64> = lp["text_offset"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_u64().unwrap())
        .collect();
    assert!(
        offsets.first() == Some(&0) && offsets.windows(2).all(|w| w[0] <= w[1]),
        "{offsets:?}"
    );

    // Streamed, n = 2 with logprobs: every event names its choice, each choice finishes once, one usage event.
    let mut sb = chat_body(
        "Hello",
        json!({"max_tokens": 6, "n": 2, "temperature": 0.8, "seed": 3, "logprobs": true, "stream": true,
               "stream_options": {"include_usage": true}}),
    );
    let events = s.post_json("/v1/chat/completions", &sb).sse_events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let (mut texts, mut finishes, mut lps, mut usage) = (vec![String::new(); 2], [0; 2], [0u64; 2], None);
    for e in &events[..events.len() - 1] {
        let v: Value = serde_json::from_str(e).unwrap();
        if v["choices"].as_array().unwrap().is_empty() {
            usage = Some(v["usage"].clone());
            continue;
        }
        let c = &v["choices"][0];
        let i = c["index"].as_u64().unwrap() as usize;
        texts[i].push_str(c["delta"]["content"].as_str().unwrap_or(""));
        finishes[i] += usize::from(c["finish_reason"].is_string());
        lps[i] += c["logprobs"]["content"].as_array().map_or(0, |a| a.len() as u64);
    }
    assert_eq!(finishes, [1, 1], "{events:?}");
    let usage = usage.expect("a usage event");
    assert_eq!(
        lps[0] + lps[1],
        usage["completion_tokens"].as_u64().unwrap(),
        "{events:?}"
    );
    // The same request not streamed: the same choices (the seeds decide).
    merge(&mut sb, json!({"stream": false}));
    let v = s.post_json("/v1/chat/completions", &sb).json();
    let plain: Vec<String> = choices_of(&v, true).into_iter().map(|c| c.1).collect();
    assert_eq!(plain, texts);

    // Penalties move greedy decoding off a repeated token; they are accepted with every sampler option.
    let greedy = |extra: Value| {
        let mut b = completion_body("the the the the the", json!({"max_tokens": 12}));
        merge(&mut b, extra);
        let r = s.post_json("/v1/completions", &b);
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["choices"][0]["text"].as_str().unwrap().to_string()
    };
    let plain = greedy(json!({}));
    assert_eq!(
        plain,
        greedy(json!({"frequency_penalty": 0})),
        "zero penalties change nothing"
    );
    assert_ne!(plain, greedy(json!({"repetition_penalty": 5.0})), "{plain:?}");
    greedy(
        json!({"temperature": 0.7, "top_k": 20, "top_p": 0.9, "min_p": 0.05, "presence_penalty": 1.0,
                  "frequency_penalty": 0.5, "repetition_penalty": 1.2, "seed": 1}),
    );
}

#[test]
fn trace_headers_are_kept_and_request_id_echoed() {
    let s = start(&[]);
    let body = completion_body("hi", json!({"max_tokens": 2}));
    let r = s.post_raw(
        "/v1/completions",
        &[
            (
                "traceparent",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            ),
            ("x-request-id", "req-42"),
        ],
        body.to_string().as_bytes(),
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-request-id"), Some("req-42"));
}
