//! An idle llmserve costs nothing: after serving a request, with two compute threads (so the compute pool has
//! a worker that must park), none of its threads runs over two seconds. Counted from
//! `/proc/PID/task/*/schedstat` (time on CPU and timeslices run: every wake-up from a blocking system call or a
//! `sched_yield` is a timeslice), so a spinning or polling thread is caught whatever calls it makes.

#![allow(clippy::unwrap_used, reason = "tests unwrap to fail loudly")]

mod serve_common;

use std::time::Duration;

use serde_json::json;
use serve_common::Server;

/// (ns on CPU, timeslices run) summed over the threads of `pid`.
fn schedstat(pid: u32) -> (u64, u64) {
    let mut total = (0, 0);
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
        let Ok(s) = std::fs::read_to_string(t.path().join("schedstat")) else {
            continue;
        };
        let f: Vec<u64> = s.split_whitespace().filter_map(|v| v.parse().ok()).collect();
        total.0 += f[0];
        total.1 += f[2];
    }
    total
}

#[test]
fn idle_engine_makes_no_wakeups() {
    let model = serve_common::tiny_model();
    let s = Server::start(&model, &["--threads", "2"]);
    let r = s.post_json(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Hello"}], "temperature": 0, "max_tokens": 16}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    // Let the compute worker park and the engine finish delivering.
    std::thread::sleep(Duration::from_millis(500));
    let pid = s.child.id();
    let before = schedstat(pid);
    std::thread::sleep(Duration::from_secs(2));
    let after = schedstat(pid);
    let (cpu_ns, wakeups) = (after.0 - before.0, after.1 - before.1);
    // The bound is < 10 system calls per second; a thread that spins, yields or polls shows hundreds.
    assert!(
        wakeups < 20,
        "an idle llmserve's threads were scheduled {wakeups} times in 2 s (goal < 10/s)"
    );
    assert!(
        cpu_ns < 20_000_000,
        "an idle llmserve ran {:.1} ms on CPU in 2 s",
        cpu_ns as f64 / 1e6
    );
}
