//! The engine under load: a full queue, a flood of bad and cancelled requests, a KV cache small enough to
//! preempt, greedy and sampled requests in one batch.

use super::*;

/// POSTs every body to `/v1/completions` from its own thread, released together (so the engine batches them);
/// the responses in the order of `bodies`.
fn post_completions_together(port: u16, bodies: &[Value]) -> Vec<http::Response> {
    let go = std::sync::Arc::new(std::sync::Barrier::new(bodies.len()));
    let handles: Vec<_> = bodies
        .iter()
        .map(|body| {
            let (go, body) = (go.clone(), body.to_string());
            std::thread::spawn(move || {
                go.wait();
                http::request(port, "POST", "/v1/completions", &[], Some(body.as_bytes()))
                    .expect("POST /v1/completions")
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn full_queue_answers_429_and_accepted_requests_complete() {
    let s = start(&["--max-queue", "2", "--max-num-seqs", "1"]);
    let port = s.port;
    let handles: Vec<_> = (0..10)
        .map(|i| {
            std::thread::spawn(move || {
                let body = completion_body(&format!("request {i}"), json!({"max_tokens": 40}));
                http::request(
                    port,
                    "POST",
                    "/v1/completions",
                    &[],
                    Some(body.to_string().as_bytes()),
                )
                .expect("POST /v1/completions")
            })
        })
        .collect();
    let rs: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let n429 = rs.iter().filter(|r| r.status == 429).count();
    let n200 = rs.iter().filter(|r| r.status == 200).count();
    assert!(
        n429 >= 1,
        "some requests were refused: {:?}",
        rs.iter().map(|r| r.status).collect::<Vec<_>>()
    );
    assert_eq!(n429 + n200, 10);
    for r in rs.iter().filter(|r| r.status == 429) {
        let v = r.json();
        assert_eq!(v["error"]["code"], "rate_limit_exceeded");
    }
}

#[test]
fn flood_of_bad_and_cancelled_requests_leaks_no_kv_blocks() {
    let s = start(&["--num-kv-blocks", "64", "--block-size", "4"]);
    let port = s.port;
    let mut threads = Vec::new();
    for i in 0..24 {
        threads.push(std::thread::spawn(move || match i % 4 {
            // Streaming, disconnected after the first bytes.
            0 => drop(
                http::open_stream(
                    port,
                    "/v1/chat/completions",
                    &chat_body("tell me a story", json!({"max_tokens": 200, "stream": true})).to_string(),
                    200,
                )
                .expect("open a stream"),
            ),
            // Non-streaming, disconnected before the answer.
            1 => drop(
                http::open_stream(
                    port,
                    "/v1/completions",
                    &completion_body("a long one", json!({"max_tokens": 200})).to_string(),
                    0,
                )
                .expect("open a stream"),
            ),
            // Garbage.
            2 => {
                let r = http::request(
                    port,
                    "POST",
                    "/v1/chat/completions",
                    &[],
                    Some(&[0xff, 0xfe, b'{', 0, 1]),
                )
                .expect("POST /v1/chat/completions");
                assert_eq!(r.status, 400);
            }
            // A normal request.
            _ => {
                let body = completion_body(
                    "fine",
                    json!({"max_tokens": 8, "temperature": 0.8, "top_p": 0.9, "seed": i}),
                );
                let r = http::request(
                    port,
                    "POST",
                    "/v1/completions",
                    &[],
                    Some(body.to_string().as_bytes()),
                )
                .expect("POST /v1/completions");
                assert_eq!(r.status, 200, "{}", r.text());
            }
        }));
    }
    for t in threads {
        t.join().unwrap();
    }
    let idle = wait_until(Duration::from_secs(60), || {
        s.metric("vllm:num_requests_running{") == 0.0
            && s.metric("vllm:num_requests_waiting{") == 0.0
            && s.metric("vllm:kv_cache_usage_perc{") == 0.0
    });
    assert!(idle, "engine did not drain:\n{}", s.get("/metrics").text());
    assert!(s.metric("vllm:request_success_total{model_name=\"tiny\",finished_reason=\"abort\"}") >= 1.0);
    assert_eq!(
        s.post_json(
            "/v1/completions",
            &completion_body("still alive", json!({"max_tokens": 4}))
        )
        .status,
        200
    );
}

#[test]
fn tiny_kv_cache_preempts_and_every_request_still_gets_its_exact_answer() {
    const MAX: u64 = 40;
    let prompts: Vec<String> = (0..6).map(|i| format!("p{i} x")).collect();
    // Reference answers, one at a time on a roomy cache.
    let reference: Vec<String> = {
        let s = start(&[]);
        prompts
            .iter()
            .map(|p| {
                s.post_json("/v1/completions", &completion_body(p, json!({"max_tokens": MAX})))
                    .json()["choices"][0]["text"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect()
    };
    // 16 blocks x 4 tokens = 64 slots for 6 sequences of up to ~45 tokens each: they cannot all fit, so
    // concurrent sequences are preempted as they grow.
    let s = start(&[
        "--num-kv-blocks",
        "16",
        "--block-size",
        "4",
        "--max-num-seqs",
        "6",
    ]);
    let bodies: Vec<Value> = prompts
        .iter()
        .map(|p| completion_body(p, json!({"max_tokens": MAX})))
        .collect();
    for (r, want) in post_completions_together(s.port, &bodies).iter().zip(&reference) {
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(
            r.json()["choices"][0]["text"].as_str().unwrap(),
            want,
            "recompute after preemption gives the same greedy output"
        );
    }
    assert!(
        s.metric("vllm:num_preemptions_total{") > 0.0,
        "{}",
        s.get("/metrics").text()
    );
    assert!(wait_until(Duration::from_secs(10), || s
        .metric("vllm:kv_cache_usage_perc{")
        == 0.0));
}

/// Greedy requests (the backend returns only their argmax) and seeded sampled ones (the backend returns their
/// logits) sharing decode steps: each gets the answer it gets alone, so every sequence's token came from its own
/// row whatever the mix of argmax-only and full rows in the step.
#[test]
fn greedy_and_seeded_sampled_requests_in_one_batch_get_their_own_answers() {
    const MAX: u64 = 16;
    let bodies: Vec<Value> = vec![
        completion_body("g0 x", json!({"max_tokens": MAX})),
        completion_body("s0 x", json!({"max_tokens": MAX, "temperature": 0.9, "seed": 5})),
        completion_body("g1 y", json!({"max_tokens": MAX})),
        completion_body(
            "s1 y",
            json!({"max_tokens": MAX, "temperature": 1.3, "top_p": 0.8, "seed": 9}),
        ),
    ];
    let text = |r: &http::Response| r.json()["choices"][0]["text"].as_str().unwrap().to_string();
    let s = start(&[]);
    let alone: Vec<String> = bodies
        .iter()
        .map(|b| text(&s.post_json("/v1/completions", b)))
        .collect();
    let together = post_completions_together(s.port, &bodies);
    for (i, (r, want)) in together.iter().zip(&alone).enumerate() {
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(
            &text(r),
            want,
            "request {i}: batched answer differs from its answer alone"
        );
    }
    assert_ne!(alone[0], alone[2], "distinct prompts, distinct answers");
}
