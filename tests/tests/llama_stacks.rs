//! Python and native frames in one stack sample, on a real third-party server: llama.cpp's OpenAI server
//! (`llama_cpp.server`, Python over libllama/libggml built with frame pointers by `cargo xtask setup`) started
//! by a launcher, streaming chat completions from the OpenAI Python client, traced by the real `llmprof attach`
//! (default settings: 99 Hz stack samples with Python frames). In Perfetto's trace processor, some sample of
//! the server must hold a Python frame of `llama_cpp/llama.py` (the generation loop) and, below it, llama.cpp's
//! native `llama_decode` or a `ggml_*` compute frame: a flame graph reads from the Python call to the kernel.
//!
//! Needs `cargo xtask setup` (the servers venv) and `cargo xtask fetch-model`.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use e2e::attach::wait_probes_live;
use e2e::llama::start_server;
use e2e::{bin_path, default_model, is_root, require, servers_python, trace_processor};

/// Streamed requests the client sends (each up to the client's default 24 tokens).
const REQUESTS: usize = 6;

/// Python functions of llama-cpp-python's generation loop (`llama_cpp/llama.py`), by qualified name as
/// llmprof names Python frames.
const PY_FUNCTIONS: &str = "'Llama.generate', 'Llama.eval', 'Llama._create_completion', \
                            'Llama.create_completion', 'Llama.create_chat_completion'";

#[test]
fn llama_cpp_server_samples_hold_python_and_native_frames_together() {
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
    let dir = std::env::temp_dir().join(format!("llmprof-llama-stacks-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let trace_path = dir.join("llama.perfetto-trace");
    let mut llmprof = Command::new(bin_path("llmprof"))
        .args([
            "attach",
            "--pid",
            &server.launcher.id().to_string(),
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
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("py/wire_client.py");
    let status = Command::new(&python)
        .arg(&script)
        .args(["--base-url", &format!("http://127.0.0.1:{port}/v1")])
        .args(["--requests", &REQUESTS.to_string()])
        .arg("--out")
        .arg(dir.join("client.json"))
        .status()
        .expect("run the OpenAI client");
    assert!(status.success(), "the OpenAI client failed: {status}");
    // Ended while the server still runs: its stacks are symbolized from its live maps.
    // SAFETY: kill(2) with our own child's pid and SIGINT has no memory-safety preconditions.
    unsafe { libc::kill(llmprof.id() as i32, libc::SIGINT) };
    let out = llmprof.wait_with_output().expect("llmprof exit");
    let summary = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "llmprof attach failed: {summary}");

    let mut tp = trace_processor::load(&trace_path).expect("trace processor loads the trace");
    let errors = tp.import_errors().expect("stats");
    assert!(errors.is_empty(), "import errors: {errors:?}");
    // Every frame on the stack of each sample of the server process (ancestors of its callsite).
    let frames_of_samples = format!(
        "with recursive anc(sid, cs) as ( \
           select s.id, s.callsite_id from perf_sample s join thread t using(utid) join process p using(upid) \
             where p.pid = {} \
           union all \
           select anc.sid, c.parent_id from anc join stack_profile_callsite c on c.id = anc.cs \
             where c.parent_id is not null) \
         select anc.sid as sid, f.name as fname, m.name as module, c.depth as depth from anc \
           join stack_profile_callsite c on c.id = anc.cs join stack_profile_frame f on f.id = c.frame_id \
           join stack_profile_mapping m on m.id = f.mapping",
        server.pid
    );
    let py_in = |t: &str| format!("{t}module like '%llama_cpp/llama.py' and {t}fname in ({PY_FUNCTIONS})");
    let native_in = |t: &str| format!("({t}fname like 'llama_decode%' or {t}fname like 'ggml_%')");
    let (py, native) = (py_in(""), native_in(""));
    let count = |tp: &mut trace_processor::Trace, cond: &str| {
        tp.query_i64(&format!(
            "with fr as ({frames_of_samples}) select count(distinct sid) from fr where {cond}"
        ))
        .unwrap_or_else(|e| panic!("{e}"))
    };
    let all = count(&mut tp, "1");
    let with_py = count(&mut tp, &py);
    let with_native = count(&mut tp, &native);
    // Both in one sample, the native frame deeper (called from the Python one: callsite depth grows inwards).
    let both = tp
        .query_i64(&format!(
            "with fr as ({frames_of_samples}) select count(distinct p.sid) from fr p join fr n on n.sid = p.sid \
             where {} and {} and n.depth > p.depth",
            py_in("p."),
            native_in("n.")
        ))
        .unwrap_or_else(|e| panic!("{e}"));
    let top_native = tp
        .query(&format!(
            "with fr as ({frames_of_samples}) select fname, module, count(distinct sid) as n from fr \
             group by fname, module order by n desc limit 25"
        ))
        .expect("frames");
    assert!(
        both > 0,
        "{both} of {all} samples of the server hold a llama.py frame ({with_py}) and a native llama.cpp \
         frame ({with_native}) together; most frequent frames: {top_native:#?}\n{summary}"
    );
    drop(tp);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
