//! The wire-probe tests' common half: the OpenAI Python client as the reference (`tests/py/wire_client.py`),
//! `llmprof report --json`'s per-request rows, and the comparison a user would make between the two (TTFT within
//! max(3 ms, 5 %), ITL p50 within max(1 ms, 5 %), one content event per chunk, cancelled = `abort`).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The children of `pid` (from `/proc/PID/task/*/children`).
pub fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    if let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in dir.flatten() {
            if let Ok(s) = std::fs::read_to_string(t.path().join("children")) {
                out.extend(s.split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
            }
        }
    }
    out
}

/// Whether a test of a third-party server can run: root, the default model, the servers venv's `python` and
/// Perfetto's trace processor (under `CI=true` a missing one fails the test instead, see [`crate::require`]).
pub fn third_party_ready(python: &Path) -> bool {
    crate::require(crate::is_root(), "not root: eBPF probes need root")
        && crate::require(
            crate::default_model().exists(),
            "the default model is missing (`cargo xtask fetch-model`)",
        )
        && crate::require(
            python.exists(),
            "the servers venv is missing (`cargo xtask setup` installs llama-cpp-python, gunicorn and the OpenAI \
             client there)",
        )
        && crate::require(
            crate::trace_processor::available(),
            "Perfetto's trace processor is missing (`cargo xtask setup-tools`)",
        )
}

/// Finds, for each request the client made, the wire request with its `x-request-id` among `wire` and checks
/// it against the client ([`check_against_client`]); returns them in the client's order.
pub fn check_each<'a>(client: &[Value], wire: &[&'a Value]) -> Vec<&'a Value> {
    client
        .iter()
        .map(|c| {
            let xid = c["x_request_id"].as_str().expect("x_request_id");
            let w = *wire
                .iter()
                .find(|r| r["x_request_id"] == xid)
                .unwrap_or_else(|| panic!("no wire request with x-request-id {xid}: {wire:#?}"));
            check_against_client(c, w);
            w
        })
        .collect()
}

/// What the client is asked to send.
pub struct Load<'a> {
    /// Served model name.
    pub model: &'a str,
    /// Recorded requests.
    pub requests: usize,
    /// Index of the request cancelled after 3 chunks.
    pub cancel: usize,
    /// Every K-th request is non-streaming.
    pub json_every: usize,
    /// Sampling temperature (0: greedy).
    pub temperature: f64,
}

/// Runs the OpenAI Python client of the servers venv against `http://127.0.0.1:PORT/v1` (one warm-up request
/// first, not recorded) and returns its per-request rows.
pub fn run_client(python: &Path, port: u16, load: &Load<'_>, out: &Path) -> Vec<Value> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("py/wire_client.py");
    // The client is the reference: run it at a real-time priority (we are root) so its chunk times are when the
    // bytes arrived, not when a busy machine got round to scheduling it.
    let status = Command::new("chrt")
        .args(["-f", "10"])
        .arg(python)
        .arg(&script)
        .args(["--base-url", &format!("http://127.0.0.1:{port}/v1")])
        .args(["--model", load.model])
        .args(["--requests", &load.requests.to_string()])
        .args(["--cancel", &load.cancel.to_string()])
        .args(["--json-every", &load.json_every.to_string()])
        .args(["--temperature", &load.temperature.to_string()])
        // Its first call pays the client's own lazy set-up, which no server sees; it is a wire request all the
        // same.
        .args(["--warmup", "1"])
        .arg("--out")
        .arg(out)
        .status()
        .expect("run the OpenAI client");
    assert!(status.success(), "the OpenAI client failed: {status}");
    let rows: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(out).expect("client output")).expect("client JSON");
    assert_eq!(rows.len(), load.requests);
    rows
}

/// `llmprof report --json TRACE`'s `requests.per_request` and the wire views folded into them
/// (`requests.joined_views`): every view of every request.
pub fn report_rows(trace: &Path) -> Vec<Value> {
    let report = Command::new(crate::bin_path("llmprof"))
        .args(["report", "--json"])
        .arg(trace)
        .output()
        .expect("llmprof report");
    assert!(report.status.success(), "llmprof report failed");
    let report: Value = serde_json::from_slice(&report.stdout).expect("report JSON");
    let mut rows = report["requests"]["per_request"]
        .as_array()
        .expect("per_request")
        .clone();
    rows.extend(
        report["requests"]["joined_views"]
            .as_array()
            .expect("joined_views")
            .iter()
            .cloned(),
    );
    rows
}

/// The lower median (the same definition `llmprof report` uses per request).
pub fn p50(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    (!v.is_empty()).then(|| v[(v.len() - 1) / 2])
}

fn close_enough(wire: f64, client: f64, abs_ms: f64) -> bool {
    (wire - client).abs() <= abs_ms.max(0.05 * client)
}

/// Checks one wire request against what the client measured for it: finish reason (a stream the client closed
/// is `abort`), TTFT within max(3 ms, 5 %), ITL p50 within max(1 ms, 5 %) and one content event per chunk
/// (streams the client read to the end), no TTFT but an end-to-end time for a non-streaming response.
pub fn check_against_client(c: &Value, w: &Value) {
    let what = format!("request {}: client {c}, wire {w}", c["x_request_id"]);
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
        return;
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
        return;
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
