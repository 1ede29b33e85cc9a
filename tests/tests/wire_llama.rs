//! Requests seen on the wire, checked against the client: llama.cpp's OpenAI server (`llama_cpp.server`, a
//! third-party Python server with no llmprof probes) started by a launcher process, driven by the OpenAI Python
//! client (`tests/py/wire_client.py`: streaming chat completions on one keep-alive connection, one cancelled
//! mid-stream, one non-streaming), traced by the real `llmprof attach`. Per request, `llmprof report`'s wire TTFT
//! and inter-token latency must agree with what the client measured, the request count must be exact, the
//! cancelled request must be marked so, and Perfetto's trace processor must load the trace cleanly.
//!
//! Needs `cargo xtask setup` (the servers venv with llama-cpp-python) and `cargo xtask fetch-model`.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use e2e::attach::wait_probes_live;
use e2e::llama::start_server;
use e2e::{bin_path, default_model, is_root, require, servers_python, trace_processor};
use llmprof_trace::names::slice;

/// Requests the client sends: index 2 is cancelled after 3 chunks, index 4 (every 5th) is non-streaming.
const REQUESTS: usize = 5;
const CANCELLED: usize = 2;
const JSON_EVERY: usize = 5;

/// The lower median (the same definition `llmprof report` uses per request).
fn p50(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    (!v.is_empty()).then(|| v[(v.len() - 1) / 2])
}

fn close_enough(wire: f64, client: f64, abs_ms: f64) -> bool {
    (wire - client).abs() <= abs_ms.max(0.05 * client)
}

#[test]
fn llama_cpp_server_requests_match_the_openai_client() {
    let python = servers_python();
    if !require(is_root(), "not root: eBPF probes need root")
        || !require(
            default_model().exists(),
            "the default model is missing (`cargo xtask fetch-model`)",
        )
        || !require(
            python.exists(),
            "the servers venv is missing (`cargo xtask setup` installs llama-cpp-python there)",
        )
        || !require(
            trace_processor::available(),
            "Perfetto's trace processor is missing (`cargo xtask setup-tools`)",
        )
    {
        return;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let server = start_server(&python, port);
    let dir = std::env::temp_dir().join(format!("llmprof-wire-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let trace_path = dir.join("wire.perfetto-trace");
    // Attached through the launcher's pid, as a user types `--pid $(pgrep -f "vllm serve")`: the server is its
    // child, followed as part of the process tree.
    let launcher_pid = server.launcher.id();
    let mut llmprof = Command::new(bin_path("llmprof"))
        .args([
            "attach",
            "--pid",
            &launcher_pid.to_string(),
            "--gpu-sample-interval",
            "0",
            "-o",
        ])
        .arg(&trace_path)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn llmprof");
    let (_stderr, _) = wait_probes_live(&mut llmprof);

    let client_out = dir.join("client.json");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("py/wire_client.py");
    // The client is the reference: run it at a real-time priority (we are root) so its chunk times are when the
    // bytes arrived, not when a busy machine got round to scheduling it.
    let status = Command::new("chrt")
        .args(["-f", "10"])
        .arg(&python)
        .arg(&script)
        .args(["--base-url", &format!("http://127.0.0.1:{port}/v1")])
        .args(["--requests", &REQUESTS.to_string()])
        .args(["--cancel", &CANCELLED.to_string()])
        .args(["--json-every", &JSON_EVERY.to_string()])
        // One request first, not recorded by the client: its first call pays the client's own lazy set-up,
        // which no server sees. It is a wire request of the trace all the same.
        .args(["--warmup", "1"])
        .arg("--out")
        .arg(&client_out)
        .status()
        .expect("run the OpenAI client");
    assert!(status.success(), "the OpenAI client failed: {status}");
    // Let the server notice the cancelled stream's connection and close it (it does at its next write).
    std::thread::sleep(Duration::from_millis(500));

    // SAFETY: kill(2) with our own child's pid and SIGINT has no memory-safety preconditions.
    unsafe { libc::kill(llmprof.id() as i32, libc::SIGINT) };
    let out = llmprof.wait_with_output().expect("llmprof exit");
    eprintln!("{}", String::from_utf8_lossy(&out.stdout));
    assert!(out.status.success(), "llmprof attach failed: {}", out.status);

    let client: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&client_out).expect("client output"))
            .expect("client JSON");
    assert_eq!(client.len(), REQUESTS);

    let report = Command::new(bin_path("llmprof"))
        .args(["report", "--json"])
        .arg(&trace_path)
        .output()
        .expect("llmprof report");
    assert!(report.status.success(), "llmprof report failed");
    let report: serde_json::Value = serde_json::from_slice(&report.stdout).expect("report JSON");
    let rows = report["requests"]["per_request"]
        .as_array()
        .expect("per_request")
        .clone();
    let wire: Vec<&serde_json::Value> = rows.iter().filter(|r| r["wire"] == true).collect();
    assert_eq!(
        wire.len(),
        REQUESTS + 1,
        "one wire request per client request (and the warm-up), no more: {wire:#?}"
    );
    for c in &client {
        let xid = c["x_request_id"].as_str().expect("x_request_id");
        let w = wire
            .iter()
            .find(|r| r["x_request_id"] == xid)
            .unwrap_or_else(|| panic!("no wire request with x-request-id {xid}: {wire:#?}"));
        let what = format!("request {xid}: client {c}, wire {w}");
        if c["cancelled"] == true {
            assert_eq!(
                w["finish_reason"], "abort",
                "a stream the client closed is cancelled: {what}"
            );
        } else {
            assert_eq!(w["finish_reason"], "stop", "{what}");
        }
        if c["stream"] == false {
            assert!(
                w["ttft_ms"].is_null(),
                "a non-streaming response has no first token: {what}"
            );
            assert!(w["e2e_ms"].as_f64().is_some(), "{what}");
            continue;
        }
        let (ct, wt) = (
            c["ttft_ms"].as_f64().expect("client ttft"),
            w["ttft_ms"].as_f64().expect("wire ttft"),
        );
        assert!(
            close_enough(wt, ct, 3.0),
            "TTFT differs: wire {wt:.2} ms, client {ct:.2} ms; {what}"
        );
        if c["cancelled"] == true {
            // Two gaps before the client went away: too few for a median to compare.
            continue;
        }
        let gaps: Vec<f64> = c["itl_ms"]
            .as_array()
            .expect("itl")
            .iter()
            .filter_map(|g| g.as_f64())
            .collect();
        let ci = p50(&gaps).expect("client gaps");
        let wi = w["itl_p50_ms"].as_f64().expect("wire ITL p50");
        assert!(
            close_enough(wi, ci, 1.0),
            "ITL p50 differs: wire {wi:.2} ms, client {ci:.2} ms; {what}"
        );
        assert_eq!(
            w["output_tokens"].as_u64(),
            c["chunks"].as_u64(),
            "one content event per chunk the client got: {what}"
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
