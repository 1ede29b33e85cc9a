//! The vertical slice, end to end, as an SRE would check it: the real engine on the default model, the real
//! `llmprof attach` (real eBPF), real requests (concurrent, one with a W3C traceparent), a weight reload, an outbound
//! connect outside the allow list; then the trace is loaded into Perfetto's own trace processor and checked against
//! what the engine itself says happened.

use std::net::TcpListener;
use std::process::Command;
use std::time::{Duration, Instant};

use e2e::attach::Attached;
use e2e::engine::Engine;
use e2e::{bin_path, default_model, http, is_root, require, trace_processor};
use llmprof_abi::{FileOp, StepKind};
use llmprof_trace::names::{arg, marker, slice, tp_arg, track};

/// `s.name in ('prefill', 'decode', 'mixed')`: the step slices of every known kind.
fn step_kinds() -> String {
    let [p, d, m] = [StepKind::Prefill, StepKind::Decode, StepKind::Mixed].map(StepKind::name);
    format!("s.name in ('{p}', '{d}', '{m}')")
}

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_SPAN: &str = "00f067aa0ba902b7";

/// Waits until the engine has nothing running or waiting.
fn wait_idle(engine: &Engine) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let m = engine.metrics();
        let running = http::metric(&m, "vllm:num_requests_running", "").unwrap_or(-1.0);
        let waiting = http::metric(&m, "vllm:num_requests_waiting", "").unwrap_or(-1.0);
        if running == 0.0 && waiting == 0.0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "engine not idle after 120 s: running {running}, waiting {waiting}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn steps_total(engine: &Engine) -> f64 {
    let m = engine.metrics();
    ["prefill", "decode", "mixed"]
        .iter()
        .map(|k| http::metric(&m, "llmserve:engine_steps_total", &format!("kind=\"{k}\"")).unwrap_or(0.0))
        .sum()
}

#[derive(Debug)]
struct Usage {
    prompt: i64,
    completion: i64,
}

fn chat(port: u16, content: &str, max_tokens: u32, headers: &[(&str, &str)]) -> Usage {
    let body = format!(
        r#"{{"model":"smollm2","messages":[{{"role":"user","content":"{content}"}}],"max_tokens":{max_tokens},"temperature":0}}"#
    );
    let r = http::post_json(port, "/v1/chat/completions", headers, &body).expect("chat request");
    assert_eq!(r.status, 200, "chat failed: {}", r.text());
    let v: serde_json::Value = serde_json::from_slice(&r.body).expect("chat response is JSON");
    Usage {
        prompt: v["usage"]["prompt_tokens"].as_i64().expect("usage.prompt_tokens"),
        completion: v["usage"]["completion_tokens"]
            .as_i64()
            .expect("usage.completion_tokens"),
    }
}

#[test]
fn attach_to_the_engine_and_check_the_trace() {
    let model = default_model();
    if !require(is_root(), "not root: eBPF probes need root")
        || !require(
            model.exists(),
            "the default model is missing (run `cargo xtask fetch-model`)",
        )
        || !require(
            trace_processor::available(),
            "Perfetto's trace processor is missing (`cargo xtask setup-tools`)",
        )
    {
        return;
    }
    // An "unexpected" outbound destination on loopback: the engine's usage-stats reporter posts there. The attach
    // allows only 10.0.0.0/8, so this connect must be flagged.
    let sink = TcpListener::bind("127.0.0.1:0").expect("bind sink");
    let sink_port = sink.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for mut s in sink.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let _ = std::io::Read::read(&mut s, &mut buf);
            let _ =
                std::io::Write::write_all(&mut s, b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n");
        }
    });
    let usage_url = format!("http://127.0.0.1:{sink_port}/usage");
    let engine = Engine::spawn(
        &model,
        &[
            "--max-num-seqs",
            "4",
            "--usage-stats-url",
            &usage_url,
            "--usage-stats-interval",
            "1s",
        ],
    );
    let model_size = std::fs::metadata(&model).expect("model metadata").len() as i64;
    wait_idle(&engine);

    let dir = std::env::temp_dir().join(format!("llmprof-e2e-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let trace_path = dir.join("attach.perfetto-trace");
    let llmprof = Attached::start(engine.pid, &["--egress-allow", "10.0.0.0/8"], &trace_path);
    wait_idle(&engine);
    let steps_before = steps_total(&engine);

    // Concurrent requests, one of them carrying the caller's trace context.
    let port = engine.port;
    let traced = std::thread::spawn(move || {
        let tp = format!("00-{TRACE_ID}-{PARENT_SPAN}-01");
        chat(
            port,
            "What is the capital of France?",
            12,
            &[("traceparent", &tp), ("x-request-id", "e2e-traced")],
        )
    });
    let others: Vec<_> = (0..3)
        .map(|i| std::thread::spawn(move || chat(port, &format!("Count to {}.", i + 3), 16, &[])))
        .collect();
    let traced_usage = traced.join().expect("traced request");
    let other_usage: Vec<Usage> = others.into_iter().map(|h| h.join().expect("request")).collect();

    // Swap the weights from disk while serving (llmprof's model-file probes watch the read).
    let r = http::post_json(port, "/admin/reload", &[], "{}").expect("reload");
    assert_eq!(r.status, 200, "reload failed: {}", r.text());
    // Give the usage-stats reporter a chance to connect during the window.
    std::thread::sleep(Duration::from_millis(2500));
    wait_idle(&engine);
    let steps_after = steps_total(&engine);

    // Stop the session like a user would (Ctrl-C).
    llmprof.stop();

    let mut tp = trace_processor::load(&trace_path).expect("trace processor loads the trace");
    assert_eq!(
        tp.import_errors().expect("stats"),
        Vec::<serde_json::Value>::new(),
        "import errors in the trace"
    );
    assert_eq!(
        tp.unterminated_slices().expect("slices"),
        Vec::<serde_json::Value>::new(),
        "unterminated slices"
    );

    // Thread states: the engine loop thread ran (Running rows in the trace processor's thread_state, the
    // table Perfetto UI draws its thread-state rows from), is one thread of the engine's process, and was
    // blocked between requests; `llmprof report` counts the same CPU time.
    // Threads of other processes that ran next to a traced one on a CPU appear by tid and comm only (no
    // process): another llmserve on the machine has an engine thread of the same name, left out here.
    let engine_thread = "llmserve-engine";
    let rows = tp
        .query(&format!(
            "select t.tid, p.pid, count(*) as n, sum(s.dur) as running from thread_state s join thread t using(utid) \
             left join process p using(upid) where t.name = '{engine_thread}' and s.state = 'Running' \
             and p.pid is not null group by t.utid"
        ))
        .expect("thread_state query");
    assert_eq!(rows.len(), 1, "one engine thread with Running rows: {rows:?}");
    assert_eq!(rows[0]["pid"].as_i64(), Some(i64::from(engine.pid)), "{rows:?}");
    assert!(rows[0]["n"].as_i64().unwrap_or(0) > 0, "{rows:?}");
    let running_ms = rows[0]["running"].as_f64().unwrap_or(0.0) / 1e6;
    let out = Command::new(bin_path("llmprof"))
        .args(["report", "--json"])
        .arg(&trace_path)
        .output()
        .expect("llmprof report");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("report JSON");
    let group = report["thread_states"]["groups"]
        .as_array()
        .expect("thread_states.groups")
        .iter()
        .find(|g| g["name"] == engine_thread)
        .unwrap_or_else(|| panic!("no {engine_thread} group in {}", report["thread_states"]));
    let cpu_ms = group["cpu_ms"].as_f64().expect("cpu_ms");
    assert!(
        (cpu_ms - running_ms).abs() < 0.01 * running_ms.max(1.0),
        "report cpu_ms {cpu_ms} vs thread_state Running {running_ms} ms"
    );
    assert!(group["sleeping_ms"].as_f64().unwrap_or(0.0) > 0.0, "{group}");

    // Every engine step of the window is a slice on the engine-steps track.
    let steps = tp
        .query_i64(&format!(
            "select count(*) from slice s join track t on s.track_id = t.id where t.name = '{}' and {}",
            track::STEPS,
            step_kinds()
        ))
        .expect("step query");
    assert!(steps_after > steps_before, "the engine ran no step in the window");
    assert_eq!(
        steps as f64,
        steps_after - steps_before,
        "step slices vs the engine's own step counter"
    );

    // Each step's per-request token shares (ABI v2; an array arg, `debug.req_tokens[i]`) add up to the tokens
    // the step computed.
    let shares = tp
        .query(&format!(
            "select extract_arg(s.arg_set_id, '{}') + extract_arg(s.arg_set_id, '{}') as total, \
                    (select coalesce(sum(a.int_value), 0) from args a \
                     where a.arg_set_id = s.arg_set_id and a.flat_key = '{}') as shares \
             from slice s join track t on s.track_id = t.id where t.name = '{}' and {}",
            tp_arg(arg::PREFILL_TOKENS),
            tp_arg(arg::DECODE_TOKENS),
            tp_arg(arg::REQ_TOKENS),
            track::STEPS,
            step_kinds()
        ))
        .expect("step shares query");
    assert_eq!(shares.len() as i64, steps);
    for row in &shares {
        assert_eq!(
            row["shares"].as_i64(),
            row["total"].as_i64(),
            "per-request shares vs step totals: {row:?}"
        );
    }

    // Each request has its track with the right token counts; the traced one keeps its trace id.
    let extract = |key: &str| format!("extract_arg(arg_set_id, '{}')", tp_arg(key));
    let rows = tp
        .query(&format!(
            "select {} as prompt, {} as output, {} as trace_id, {} as xid \
             from slice where name like '{}%' and depth = 0",
            extract(arg::PROMPT_TOKENS),
            extract(arg::OUTPUT_TOKENS),
            extract(arg::TRACE_ID),
            extract(arg::X_REQUEST_ID),
            slice::REQUEST_PREFIX
        ))
        .expect("request query");
    assert_eq!(rows.len(), 4, "one request track per request: {rows:?}");
    let traced_row = rows
        .iter()
        .find(|r| r["xid"] == "e2e-traced")
        .unwrap_or_else(|| panic!("the traced request is missing: {rows:?}"));
    assert_eq!(traced_row["trace_id"], TRACE_ID);
    assert_eq!(traced_row["prompt"], traced_usage.prompt);
    // The same request seen on the wire (the HTTP probe): its own track, joined to the engine's by x-request-id,
    // with the caller's trace context read from the request head, and its end.
    let wire = tp
        .query(&format!(
            "select {} as trace_id, {} as xid, {} as finish, ts, dur \
             from slice where name like '{}%' and depth = 0",
            extract(arg::TRACE_ID),
            extract(arg::X_REQUEST_ID),
            extract(arg::FINISH_REASON),
            slice::WIRE_REQUEST_PREFIX
        ))
        .expect("wire request query");
    let traced_wire = wire
        .iter()
        .find(|r| r["xid"] == "e2e-traced")
        .unwrap_or_else(|| panic!("the traced request is missing on the wire: {wire:?}"));
    assert_eq!(traced_wire["trace_id"], TRACE_ID, "{traced_wire:?}");
    assert_eq!(traced_wire["finish"], "stop", "{traced_wire:?}");
    for xid in rows
        .iter()
        .filter_map(|r| r["xid"].as_str())
        .filter(|x| !x.is_empty())
    {
        assert!(
            wire.iter().any(|w| w["xid"] == xid),
            "engine request {xid} has no wire view: {wire:?}"
        );
    }
    assert_eq!(traced_row["output"], traced_usage.completion);
    let mut want: Vec<(i64, i64)> = other_usage.iter().map(|u| (u.prompt, u.completion)).collect();
    want.push((traced_usage.prompt, traced_usage.completion));
    want.sort();
    let mut got: Vec<(i64, i64)> = rows
        .iter()
        .map(|r| {
            (
                r["prompt"].as_i64().unwrap_or(-1),
                r["output"].as_i64().unwrap_or(-1),
            )
        })
        .collect();
    got.sort();
    assert_eq!(got, want, "token counts per request (prompt, output)");

    // The reload read the whole model file.
    let model_path = model.canonicalize().expect("canonical model path");
    let read_bytes = tp
        .query_i64(&format!(
            "select coalesce(sum({}), 0) from slice where name in ('{}', '{}', '{}') and {} in ('{}', '{}')",
            extract(arg::BYTES),
            slice::model_file(FileOp::Read.name()),
            slice::model_file(FileOp::Pread.name()),
            slice::model_file(FileOp::Readv.name()),
            extract(arg::PATH),
            model.display(),
            model_path.display()
        ))
        .expect("file read query");
    assert_eq!(
        read_bytes, model_size,
        "bytes read from the model file during the reload"
    );

    // The usage-stats connect to loopback, outside 10.0.0.0/8, is flagged with its port.
    let flagged = tp
        .query_i64(&format!(
            "select count(*) from slice where name = '{}' and {} = {sink_port}",
            slice::CONNECT_FLAGGED,
            extract(arg::PORT)
        ))
        .expect("connect query");
    assert!(flagged >= 1, "no flagged connect to port {sink_port}");

    // Idle engine threads block in the kernel for longer than 1 ms: slow syscalls are there, on named threads.
    let slow = tp
        .query_i64(&format!(
            "select count(*) from slice where name like '{}%'",
            slice::SYSCALL_PREFIX
        ))
        .expect("syscall query");
    assert!(slow > 0, "no slow syscall in the trace");

    // The session says what it lost.
    let summary_rows = tp
        .query_i64(&format!(
            "select count(*) from slice where name = '{}'",
            marker::SUMMARY
        ))
        .expect("summary");
    assert_eq!(summary_rows, 1, "the final llmprof summary is in the trace");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn attach_to_a_missing_pid_fails_clearly() {
    // Pid 0x3fffffff is above pid_max on Linux: never a process.
    let out = Command::new(bin_path("llmprof"))
        .args([
            "attach",
            "--pid",
            "1073741823",
            "-d",
            "1s",
            "-o",
            "/tmp/never.perfetto-trace",
        ])
        .output()
        .expect("run llmprof");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("1073741823"), "the error names the pid: {err}");
    assert!(
        !std::path::Path::new("/tmp/never.perfetto-trace").exists(),
        "no trace file for a failed attach"
    );
}
