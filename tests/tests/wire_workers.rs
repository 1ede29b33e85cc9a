//! Requests on the wire of processes that did not exist at attach: a gunicorn gateway (2 forked gthread workers,
//! `tests/py/proxy_app.py`) in front of `llmserve`, started by a launcher (`tests/py/late_workers.py`) only after
//! `llmprof attach --pid LAUNCHER` is live — so the gateway's master, its workers and their listening socket all
//! appear during the session, and the workers' connections must be followed from the kernel with no user-space
//! round trip. The engine is a child of the same launcher, present at attach. Driven by the OpenAI Python
//! client (`tests/py/wire_client.py`): per request, the gateway's wire TTFT and ITL agree with the client's, the
//! count is exact, the cancelled stream is an abort, and the engine's own view of the same request (joined by
//! `x-request-id`) says how much of the TTFT was spent outside the engine. Perfetto's trace processor loads the
//! trace with no import errors and holds the whole process tree.
//!
//! Needs `cargo xtask setup` (the servers venv: gunicorn, the OpenAI client) and `cargo xtask fetch-model`.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use e2e::attach::Attached;
use e2e::engine::SERVED_NAME;
use e2e::serve::free_port;
use e2e::wire::{Load, check_each, children, report_rows, run_client, third_party_ready};
use e2e::{bin_path, default_model, http, servers_python, trace_processor};
use llmprof_trace::names::slice;

/// Requests the client sends: index 1 is cancelled after 3 chunks, index 3 (every 4th) is non-streaming.
const REQUESTS: usize = 4;
const CANCELLED: usize = 1;
const JSON_EVERY: usize = 4;

/// Kills the launcher's whole tree when the test ends, whatever happens.
struct Tree {
    launcher: Child,
}

impl Drop for Tree {
    fn drop(&mut self) {
        let mut pids = vec![self.launcher.id()];
        let mut i = 0;
        while i < pids.len() {
            let more = children(pids[i]);
            pids.extend(more);
            i += 1;
        }
        for pid in pids.into_iter().rev() {
            // SAFETY: kill(2) on pids of the tree this test started; no memory-safety preconditions.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        let _ = self.launcher.wait();
    }
}

/// Whether something accepts TCP connections on `port` (a bare connect: no request, so no wire request).
fn accepting(port: u16) -> bool {
    std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
}

fn wait_until(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !ok() {
        assert!(Instant::now() < deadline, "{what} within 120 s");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn workers_forked_after_attach_have_their_requests_followed() {
    let python = servers_python();
    if !third_party_ready(&python) {
        return;
    }
    let dir = std::env::temp_dir().join(format!("llmprof-workers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let go = dir.join("go");
    let (gateway_port, engine_port) = (free_port(), free_port());
    let py = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("py");
    let launcher = Command::new(&python)
        .arg(py.join("late_workers.py"))
        .arg(&go)
        .args([gateway_port.to_string(), engine_port.to_string()])
        .arg("--")
        .arg(bin_path("llmserve"))
        .arg("--model")
        .arg(default_model())
        .args(["--host", "127.0.0.1", "--port", &engine_port.to_string()])
        .args(["--served-model-name", SERVED_NAME])
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn the launcher");
    let launcher_pid = launcher.id();
    let tree = Tree { launcher };
    wait_until("llmserve answers", || {
        http::get(engine_port, "/v1/models").is_ok_and(|r| r.status == 200)
    });
    let trace_path = dir.join("workers.perfetto-trace");
    let llmprof = Attached::start(launcher_pid, &[], &trace_path);
    // Only now the gateway comes into being: master, 2 forked workers, the listening socket.
    std::fs::write(&go, b"").expect("go file");
    wait_until("the gateway accepts connections", || accepting(gateway_port));
    let gateway: Vec<u32> = children(launcher_pid)
        .into_iter()
        .filter(|&p| {
            std::fs::read_to_string(format!("/proc/{p}/cmdline")).is_ok_and(|c| c.contains("gunicorn"))
        })
        .collect();
    assert_eq!(gateway.len(), 1, "one gunicorn master under the launcher");
    let master = gateway[0];
    wait_until("gunicorn forks its 2 workers", || children(master).len() == 2);
    let workers = children(master);

    let load = Load {
        model: SERVED_NAME,
        requests: REQUESTS,
        cancel: CANCELLED,
        json_every: JSON_EVERY,
        temperature: 0.0,
    };
    let client = run_client(&python, gateway_port, &load, &dir.join("client.json"));
    // Let the gateway and the engine notice the cancelled stream's connection (at their next write).
    std::thread::sleep(Duration::from_millis(500));
    llmprof.stop();

    let rows = report_rows(&trace_path);
    let on = |pids: &[u32]| -> Vec<&serde_json::Value> {
        rows.iter()
            .filter(|r| r["wire"] == true && pids.contains(&(r["pid"].as_u64().unwrap_or(0) as u32)))
            .collect()
    };
    let at_gateway = on(&workers);
    assert_eq!(
        at_gateway.len(),
        REQUESTS + 1,
        "one wire request per client request (and the warm-up) in the gateway's workers: {rows:#?}"
    );
    let engine_pid = children(launcher_pid)
        .into_iter()
        .find(|p| !gateway.contains(p))
        .expect("the engine under the launcher");
    let at_engine = on(&[engine_pid]);
    assert_eq!(
        at_engine.len(),
        REQUESTS + 1,
        "the engine's HTTP server saw each forwarded request: {rows:#?}"
    );
    let gateway_views = check_each(&client, &at_gateway);
    for (c, w) in client.iter().zip(gateway_views) {
        let xid = c["x_request_id"].as_str().expect("x_request_id");
        // The engine's own view of the same request (its probes), joined by x-request-id: the gateway's TTFT
        // minus the engine's is the time outside the engine (HTTP, the proxy hop, streaming back).
        if c["stream"] == true {
            let e = rows
                .iter()
                .find(|r| r["wire"] == false && r["x_request_id"] == xid)
                .unwrap_or_else(|| panic!("no engine request with x-request-id {xid}: {rows:#?}"));
            let (wt, et) = (
                w["ttft_ms"].as_f64().expect("gateway TTFT"),
                e["ttft_ms"].as_f64().expect("engine TTFT"),
            );
            assert_eq!(
                e["wire_ttft_ms"].as_f64(),
                Some(wt),
                "joined to the gateway's view: {e}"
            );
            let outside = e["outside_engine_ttft_ms"]
                .as_f64()
                .expect("time outside the engine");
            assert!(
                (outside - (wt - et)).abs() < 1e-6 && outside > 0.0,
                "the gateway sees the first token after the engine made it: {e}"
            );
        }
    }

    let mut tp = trace_processor::load(&trace_path).expect("trace processor loads the trace");
    let errors = tp.import_errors().expect("stats");
    assert!(errors.is_empty(), "import errors: {errors:?}");
    // The whole tree is in the trace: launcher, engine, gateway master and both workers, each a process named
    // by its command line, the late ones with their start.
    for pid in [launcher_pid, engine_pid, master].iter().chain(&workers) {
        let n = tp
            .query_i64(&format!("select count(*) from process where pid = {pid}"))
            .expect("process rows");
        assert_eq!(n, 1, "pid {pid} is a process of the trace");
    }
    let named = tp
        .query_i64(&format!(
            "select count(*) from process where pid in ({}) and coalesce(cmdline, name) like '%gunicorn%'",
            workers
                .iter()
                .chain([&master])
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(",")
        ))
        .expect("gateway process names");
    assert_eq!(
        named, 3,
        "the gateway's processes are named by their command line"
    );
    // The wire probe's cost was calibrated at start-up and charged: the summary says what a followed SSE write
    // costs and how much the probe added in all.
    let mut summary = |key: &str| {
        tp.query(&format!(
            "select extract_arg(arg_set_id, 'debug.{key}') as v from slice where name = '{}'",
            llmprof_trace::names::marker::SUMMARY
        ))
        .expect("summary")
        .first()
        .map(|r| r["v"].clone())
        .unwrap_or_default()
    };
    let per_write = summary(llmprof_trace::names::arg::COST_NS_HTTP_SSE_WRITE);
    assert!(
        per_write.as_f64().is_some_and(|ns| ns > 0.0),
        "calibrated cost per SSE write: {per_write}"
    );
    let by_probe = summary(llmprof_trace::names::arg::OVERHEAD_BY_PROBE_MS);
    assert!(
        by_probe.as_str().is_some_and(|s| s.contains("http=")),
        "the wire probe's cost is in the self-accounting: {by_probe}"
    );
    let tracks = tp
        .query_i64(&format!(
            "select count(distinct track_id) from slice where name like '{}%'",
            slice::WIRE_REQUEST_PREFIX
        ))
        .expect("wire request slices");
    assert_eq!(
        tracks,
        2 * (REQUESTS as i64 + 1),
        "one track per wire request, at the gateway and at the engine"
    );
    drop(tree);
    let _ = std::fs::remove_dir_all(&dir);
}
