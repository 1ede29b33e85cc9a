//! Requests seen on the wire, checked against the client: llama.cpp's OpenAI server (`llama_cpp.server`, a
//! third-party Python server with no llmprof probes) started by a launcher process, driven by the OpenAI Python
//! client (`tests/py/wire_client.py`: streaming chat completions, one cancelled mid-stream, one non-streaming),
//! traced by the real `llmprof attach`. Per request, `llmprof report`'s wire TTFT (from the request's arrival in
//! the server's socket) and inter-token latency must agree with what the client measured (from its first byte
//! sent), each request must say how long it waited in the socket, the request count must be exact, the
//! cancelled request must be marked so, and Perfetto's trace processor must load the trace cleanly.
//!
//! Needs `cargo xtask setup` (the servers venv with llama-cpp-python) and `cargo xtask fetch-model`.

use std::time::Duration;

use e2e::attach::Attached;
use e2e::llama::start_server;
use e2e::serve::free_port;
use e2e::wire::{Load, check_each, report_rows, run_client, third_party_ready};
use e2e::{servers_python, trace_processor};
use llmprof_trace::names::slice;

/// Requests the client sends: index 2 is cancelled after 3 chunks, index 4 (every 5th) is non-streaming.
const REQUESTS: usize = 5;
const CANCELLED: usize = 2;
const JSON_EVERY: usize = 5;

#[test]
fn llama_cpp_server_requests_match_the_openai_client() {
    let python = servers_python();
    if !third_party_ready(&python) {
        return;
    }
    let port = free_port();
    let server = start_server(&python, port);
    let dir = std::env::temp_dir().join(format!("llmprof-wire-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let trace_path = dir.join("wire.perfetto-trace");
    // Attached through the launcher's pid, as a user types `--pid $(pgrep -f "vllm serve")`: the server is its
    // child, followed as part of the process tree.
    let launcher_pid = server.launcher.id();
    let llmprof = Attached::start(launcher_pid, &[], &trace_path);

    let load = Load {
        model: "default",
        requests: REQUESTS,
        cancel: CANCELLED,
        json_every: JSON_EVERY,
        temperature: 0.0,
    };
    let client = run_client(&python, port, &load, &dir.join("client.json"));
    // Let the server notice the cancelled stream's connection and close it (it does at its next write).
    std::thread::sleep(Duration::from_millis(500));

    llmprof.stop();

    let rows = report_rows(&trace_path);
    let wire: Vec<&serde_json::Value> = rows.iter().filter(|r| r["wire"] == true).collect();
    assert_eq!(
        wire.len(),
        REQUESTS + 1,
        "one wire request per client request (and the warm-up), no more: {wire:#?}"
    );
    let matched = check_each(&client, &wire);
    // The warm-up's request taught the kernel that the port carries HTTP: every later request starts when its
    // bytes reached the server's socket, and says how long they waited there before the server read them.
    for w in &matched {
        let waited = w["socket_wait_ms"].as_f64();
        assert!(
            waited.is_some_and(|ms| (0.0..1000.0).contains(&ms)),
            "a request on a known HTTP port has its wait in the server's socket: {w}"
        );
    }

    let mut tp = trace_processor::load(&trace_path).expect("trace processor loads the trace");
    let errors = tp.import_errors().expect("stats");
    assert!(errors.is_empty(), "import errors: {errors:?}");
    let tracks = tp
        .query_i64(&format!(
            "select count(distinct track_id) from slice where name like '{}%'",
            slice::WIRE_REQUEST_PREFIX
        ))
        .expect("wire request slices");
    assert_eq!(
        tracks,
        REQUESTS as i64 + 1,
        "one track per wire request (and the warm-up's)"
    );
    // The process tree: the launcher and the server are both processes of the trace, the server's named by its
    // command line, and the wire requests belong to the server (the launcher listens on nothing).
    for pid in [launcher_pid, server.pid] {
        let n = tp
            .query_i64(&format!("select count(*) from process where pid = {pid}"))
            .expect("process rows");
        assert_eq!(n, 1, "pid {pid} is a process of the trace");
    }
    let server_named = tp
        .query_i64(&format!(
            "select count(*) from process where pid = {} and (cmdline like '%llama_cpp.server%' or name like '%llama_cpp.server%')",
            server.pid
        ))
        .expect("server process name");
    assert_eq!(
        server_named, 1,
        "the server's process is named by its command line"
    );
    let on_server = tp
        .query_i64(&format!(
            "select count(distinct s.track_id) from slice s join process_track pt on s.track_id = pt.id \
             join process p using (upid) where p.pid = {} and s.name like '{}%'",
            server.pid,
            slice::WIRE_REQUEST_PREFIX
        ))
        .expect("wire requests per process");
    assert_eq!(
        on_server,
        REQUESTS as i64 + 1,
        "the wire requests are the server's"
    );
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
