//! Process trees, end to end, as a user attached to a launcher would check them: `llmprof attach --pid` of a
//! launcher process (`llmprof-testee`) follows what the launcher starts after the attach. A forked child whose
//! very first action is opening a model file (it exits 20 ms later) shows that open in the trace, which only the
//! kernel's own pickup at fork can catch; a child that executes `llmserve` gets its engine probes, so its steps
//! and requests appear, and its /metrics is found; every process is its own track named by its command line with
//! start/exec/exit instants. `--no-children` leaves children out. Every trace loads in Perfetto's trace
//! processor with 0 import errors.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use e2e::attach::Attached;
use e2e::engine::SERVED_NAME;
use e2e::serve::free_port;
use e2e::testee::Testee;
use e2e::{bin_path, default_model, http, is_root, require, trace_processor};
use llmprof_trace::names::{arg, slice, tp_arg, track};

fn ready() -> bool {
    require(is_root(), "not root: eBPF probes need root")
        && require(
            trace_processor::available(),
            "Perfetto's trace processor is missing (`cargo xtask setup-tools`)",
        )
}

fn tmp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("llmprof-proctree-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("tmp dir");
    dir
}

/// Ctrl-C, then the trace loaded with 0 import errors.
fn stop(llmprof: Attached, trace: &Path) -> trace_processor::Trace {
    llmprof.stop();
    let mut tp = trace_processor::load(trace).expect("trace processor loads the trace");
    assert_eq!(
        tp.import_errors().expect("stats"),
        Vec::<serde_json::Value>::new(),
        "import errors in the trace"
    );
    tp
}

/// `extract_arg` of the slice `s`'s arg `key`.
fn extract(key: &str) -> String {
    format!("extract_arg(s.arg_set_id, '{}')", tp_arg(key))
}

/// Model-file opens of `path` on a thread of process `pid`.
fn opens_by(tp: &mut trace_processor::Trace, pid: u32, path: &Path) -> i64 {
    tp.query_i64(&format!(
        "select count(*) from slice s join thread_track tt on s.track_id = tt.id join thread using(utid) \
         join process using(upid) where process.pid = {pid} and s.name = '{}' and {} = '{}'",
        slice::model_file(slice::FILE_OPEN),
        extract(arg::PATH),
        path.display()
    ))
    .expect("open query")
}

/// Instants named `name` on process `pid`'s own track.
fn instants(tp: &mut trace_processor::Trace, pid: u32, name: &str) -> Vec<serde_json::Value> {
    tp.query(&format!(
        "select s.ts, {} as exit_code, {} as ppid from slice s join process_track pt on s.track_id = pt.id \
         join process using(upid) where process.pid = {pid} and s.name = '{name}'",
        extract(arg::EXIT_CODE),
        extract(arg::PPID),
    ))
    .expect("instant query")
}

fn process_name(tp: &mut trace_processor::Trace, pid: u32) -> String {
    let rows = tp
        .query(&format!("select name from process where pid = {pid}"))
        .expect("process query");
    rows.first()
        .and_then(|r| r["name"].as_str())
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn children_started_after_attach_are_traced_from_their_first_syscall_and_get_engine_probes() {
    let model = default_model();
    if !ready()
        || !require(
            model.exists(),
            "the default model is missing (run `cargo xtask fetch-model`)",
        )
    {
        return;
    }
    let dir = tmp_dir("tree");
    let weights = dir.join("child.gguf");
    std::fs::write(&weights, b"GGUF").expect("write the child's model file");
    let trace = dir.join("tree.perfetto-trace");
    let mut launcher = Testee::spawn(&[]);
    let llmprof = Attached::start(launcher.pid(), &[], &trace);

    // A child forked after the attach whose first syscall opens a model file, and which is gone 20 ms later.
    let forked: u32 = launcher
        .reply(&format!("fork-open {}", weights.display()), "forked ")
        .parse()
        .expect("forked PID");

    // A child that executes llmserve.
    let port = free_port();
    let llmserve = bin_path("llmserve");
    let cmd = format!(
        "spawn {} --model {} --host 127.0.0.1 --port {port} --served-model-name {SERVED_NAME}",
        llmserve.display(),
        model.display()
    );
    let served: u32 = launcher.reply(&cmd, "spawned ").parse().expect("spawned PID");
    let deadline = Instant::now() + Duration::from_secs(120);
    while !http::get(port, "/v1/models").is_ok_and(|r| r.status == 200) {
        assert!(
            Instant::now() < deadline,
            "llmserve (child) did not answer within 120 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let body = format!(
        r#"{{"model":"{SERVED_NAME}","messages":[{{"role":"user","content":"Say hi."}}],"max_tokens":8,"temperature":0}}"#
    );
    let r = http::post_json(port, "/v1/chat/completions", &[], &body).expect("chat request");
    assert_eq!(r.status, 200, "chat failed: {}", r.text());
    // /metrics discovery runs on the session's 1 s tick over the tree.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !llmprof.log().contains(&format!("127.0.0.1:{port}/metrics")) {
        assert!(
            Instant::now() < deadline,
            "llmprof did not find the child's /metrics within 10 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // SAFETY: kill(2) of a process this test started (through the launcher) with SIGTERM.
    unsafe { libc::kill(served as i32, libc::SIGTERM) };
    assert_eq!(launcher.reply("reap", "reaped "), "1");
    let mut tp = stop(llmprof, &trace);

    // In-kernel pickup: the forked child's first syscall is in the trace.
    assert_eq!(
        opens_by(&mut tp, forked, &weights),
        1,
        "the forked child's first syscall (open of {}) is missing",
        weights.display()
    );
    let starts = instants(&mut tp, forked, slice::PROCESS_START);
    assert_eq!(
        starts.len(),
        1,
        "one process start instant for the forked child: {starts:?}"
    );
    assert_eq!(starts[0]["ppid"].as_i64(), Some(i64::from(launcher.pid())));
    let exits = instants(&mut tp, forked, slice::PROCESS_EXIT);
    assert_eq!(
        exits.len(),
        1,
        "one process exit instant for the forked child: {exits:?}"
    );
    assert_eq!(
        exits[0]["exit_code"].as_i64(),
        Some(5),
        "the status the child passed to _exit"
    );

    // The exec'd engine: its own process track named by its command line, its probes' steps and requests.
    let name = process_name(&mut tp, served);
    assert!(
        name.contains("llmserve") && name.contains("--served-model-name"),
        "the engine's track is named by its command line: {name:?}"
    );
    assert!(
        process_name(&mut tp, launcher.pid()).contains("llmprof-testee"),
        "the launcher's track is named by its command line"
    );
    assert_eq!(instants(&mut tp, served, slice::PROCESS_START).len(), 1);
    assert_eq!(instants(&mut tp, served, slice::PROCESS_EXEC).len(), 1);
    assert_eq!(instants(&mut tp, served, slice::PROCESS_EXIT).len(), 1);
    let steps = tp
        .query_i64(&format!(
            "select count(*) from slice s join track t on s.track_id = t.id where t.name = '{}'",
            track::STEPS
        ))
        .expect("step query");
    assert!(steps > 0, "the exec'd llmserve's engine steps are missing");
    let requests = tp
        .query_i64(&format!(
            "select count(*) from slice where name like '{}%' and depth = 0",
            slice::REQUEST_PREFIX
        ))
        .expect("request query");
    assert_eq!(requests, 1, "the one chat request to the exec'd llmserve");
    drop(tp);

    // `llmprof report` reads a trace of several processes.
    let out = Command::new(bin_path("llmprof"))
        .args(["report", "--json"])
        .arg(&trace)
        .output()
        .expect("llmprof report");
    assert!(
        out.status.success(),
        "llmprof report failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("report JSON");
    let mut rows = v["requests"]["per_request"]
        .as_array()
        .expect("per_request")
        .clone();
    // The chat's wire view is folded into the engine's request: one request, two views.
    rows.extend(
        v["requests"]["joined_views"]
            .as_array()
            .expect("joined_views")
            .iter()
            .cloned(),
    );
    let engine: Vec<_> = rows.iter().filter(|r| r["wire"] == false).collect();
    assert_eq!(engine.len(), 1, "the engine's one request: {rows:#?}");
    assert_ne!(engine[0]["finish_reason"], "unfinished", "{rows:#?}");
    // The child's HTTP server started after attach: the wire probe follows its connections from the first
    // accept, so the chat is also a wire request of that process, as long as the engine's view of it.
    let e2e = engine[0]["e2e_ms"].as_f64().expect("engine e2e");
    assert!(
        rows.iter().any(|r| r["wire"] == true
            && r["pid"] == engine[0]["pid"]
            && r["e2e_ms"].as_f64().is_some_and(|w| w >= e2e)),
        "the chat seen on the wire of the late child: {rows:#?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn no_children_traces_only_the_target() {
    if !ready() {
        return;
    }
    let dir = tmp_dir("single");
    let own = dir.join("own.gguf");
    let childs = dir.join("child.gguf");
    for f in [&own, &childs] {
        std::fs::write(f, b"GGUF").expect("write a model file");
    }
    let trace = dir.join("single.perfetto-trace");
    let own_arg = own.display().to_string();
    let mut launcher = Testee::spawn(&["--gguf", &own_arg]);
    let llmprof = Attached::start(launcher.pid(), &["--no-children"], &trace);
    let forked: u32 = launcher
        .reply(&format!("fork-open {}", childs.display()), "forked ")
        .parse()
        .expect("forked PID");
    launcher.reply("go", "done");
    let mut tp = stop(llmprof, &trace);
    assert!(
        opens_by(&mut tp, launcher.pid(), &own) >= 1,
        "the target's own model-file open is traced"
    );
    assert_eq!(
        opens_by(&mut tp, forked, &childs),
        0,
        "--no-children: the child's open is not traced"
    );
    let n = tp
        .query_i64(&format!("select count(*) from process where pid = {forked}"))
        .expect("process query");
    assert_eq!(n, 0, "--no-children: the child has no process in the trace");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn descendants_alive_at_attach_are_traced() {
    if !ready() {
        return;
    }
    let dir = tmp_dir("existing");
    let weights = dir.join("existing.gguf");
    std::fs::write(&weights, b"GGUF").expect("write a model file");
    let trace = dir.join("existing.perfetto-trace");
    let mut launcher = Testee::spawn(&[]);
    // A child that exists before the attach and opens a model file itself (a shell redirection, no fork)
    // 3 s later, after the probes are live (the launcher splits its command on spaces: `${IFS}` inside).
    let cmd = format!(
        "spawn /bin/sh -c sleep${{IFS}}3;exec${{IFS}}3<{}",
        weights.display()
    );
    let shell: u32 = launcher.reply(&cmd, "spawned ").parse().expect("spawned PID");
    let llmprof = Attached::start(launcher.pid(), &[], &trace);
    assert_eq!(launcher.reply("reap", "reaped "), "1");
    let mut tp = stop(llmprof, &trace);
    assert_eq!(
        opens_by(&mut tp, shell, &weights),
        1,
        "the open by a child that existed at attach is missing"
    );
    assert!(
        process_name(&mut tp, shell).starts_with("sh -c"),
        "the child's track is named by its command line: {:?}",
        process_name(&mut tp, shell)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// An alert for `pid` whose session lasts `secs` seconds.
fn alert(pid: u32, secs: u32) -> String {
    format!(
        r#"{{"version":"4","groupKey":"{{}}:{{alertname=\"Tree\"}}","truncatedAlerts":0,"status":"firing","receiver":"llmprof","groupLabels":{{}},"commonLabels":{{}},"commonAnnotations":{{}},"externalURL":"http://am","alerts":[{{"status":"firing","labels":{{"alertname":"Tree","pid":"{pid}"}},"annotations":{{"llmprof_duration":"{secs}s"}},"startsAt":"2026-11-26T00:00:00Z","endsAt":"0001-01-01T00:00:00Z","generatorURL":"http://prom","fingerprint":"tree1"}}]}}"#
    )
}

#[test]
fn serve_sessions_and_the_flight_recorder_follow_the_tree() {
    if !ready() {
        return;
    }
    let dir = tmp_dir("serve");
    let before = dir.join("before.gguf");
    let during = dir.join("during.gguf");
    for f in [&before, &during] {
        std::fs::write(f, b"GGUF").expect("write a model file");
    }
    let mut launcher = Testee::spawn(&[]);
    let watch = format!("pid:{}", launcher.pid());
    let srv = e2e::serve::Serve::spawn(
        &dir,
        &["--watch", &watch, "--flight-recorder", "30s", "--cooldown", "10m"],
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while srv.healthz()["flight_recorders"][0]["state"] != "recording" {
        assert!(
            Instant::now() < deadline,
            "flight recorder not recording: {}",
            srv.healthz()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Before the alert: a child only the flight recorder sees.
    let forked_before: u32 = launcher
        .reply(&format!("fork-open {}", before.display()), "forked ")
        .parse()
        .expect("forked PID");
    std::thread::sleep(Duration::from_millis(500));
    let r = srv.post_alerts(&alert(launcher.pid(), 4), Some(e2e::serve::TOKEN));
    assert_eq!(r.status, 200, "alert refused: {}", r.text());
    srv.wait_session(Duration::from_secs(60), "running", |s| s["state"] == "running");
    // During the session: a child the session's own capture picks up.
    let forked_during: u32 = launcher
        .reply(&format!("fork-open {}", during.display()), "forked ")
        .parse()
        .expect("forked PID");
    let done = srv.wait_session(Duration::from_secs(60), "finished", |s| s["state"] != "running");
    assert_eq!(done["state"], "finished", "the session failed: {done:#}");
    let mut tp = trace_processor::load(done["trace"].as_str().expect("trace path")).expect("trace loads");
    assert_eq!(
        tp.import_errors().expect("stats"),
        Vec::<serde_json::Value>::new(),
        "import errors in the trace"
    );
    assert_eq!(
        opens_by(&mut tp, forked_before, &before),
        1,
        "the flight recorder's history holds the child started before the alert"
    );
    assert_eq!(
        opens_by(&mut tp, forked_during, &during),
        1,
        "the session follows a child started during it"
    );
    drop(srv);
    let _ = std::fs::remove_dir_all(&dir);
}
