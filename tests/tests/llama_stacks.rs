//! Python and native frames in one stack sample, on a real third-party server: llama.cpp's OpenAI server
//! (`llama_cpp.server`, Python over libllama/libggml built with frame pointers by `cargo xtask setup`) started
//! by a launcher, streaming chat completions from the OpenAI Python client, traced by the real `llmprof attach`
//! (default settings: 99 Hz stack samples with Python frames). In Perfetto's trace processor, some sample of
//! the server must hold a Python frame of `llama_cpp/llama.py` (the generation loop) and, below it, llama.cpp's
//! native `llama_decode` or a `ggml_*` compute frame: a flame graph reads from the Python call to the kernel.
//!
//! Needs `cargo xtask setup` (the servers venv) and `cargo xtask fetch-model`.

use std::time::{Duration, Instant};

use e2e::attach::Attached;
use e2e::llama::start_server;
use e2e::serve::free_port;
use e2e::wire::{Load, run_client, third_party_ready};
use e2e::{servers_python, trace_processor};

/// Streamed requests the client sends per round (each up to the client's default 24 tokens).
const REQUESTS: usize = 6;

/// Rounds of requests go on until llmprof's probes have been live this long: it measures the sampler's cost on
/// the targets from 2 s into a session for 3 s (`LIVE_COST_FROM`, `LIVE_COST_FOR` in profiler-user/src/attach.rs,
/// looked at once a second), and a window needs 20 on-CPU samples of the server to give a figure. One round took
/// under 3 s on a fast machine: the session ended before the window had its samples.
const LOAD_AT_LEAST: Duration = Duration::from_secs(6);

/// Python functions of llama-cpp-python's generation loop (`llama_cpp/llama.py`), by qualified name as
/// llmprof names Python frames.
const PY_FUNCTIONS: &str = "'Llama.generate', 'Llama.eval', 'Llama._create_completion', \
                            'Llama.create_completion', 'Llama.create_chat_completion'";

#[test]
fn llama_cpp_server_samples_hold_python_and_native_frames_together() {
    let python = servers_python();
    if !third_party_ready(&python) {
        return;
    }
    let port = free_port();
    let server = start_server(&python, port);
    let dir = std::env::temp_dir().join(format!("llmprof-llama-stacks-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let trace_path = dir.join("llama.perfetto-trace");
    let llmprof = Attached::start(server.launcher.id(), &[], &trace_path);
    let load = Load {
        model: "default",
        requests: REQUESTS,
        cancel: usize::MAX,
        json_every: 0,
        temperature: 0.0,
    };
    let live = Instant::now();
    while live.elapsed() < LOAD_AT_LEAST {
        run_client(&python, port, &load, &dir.join("client.json"));
    }
    // Ended while the server still runs: its stacks are symbolized from its live maps.
    let summary = llmprof.stop();

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
    // The sampler's cost was measured on the server itself (its Python stacks included) and charged.
    let live = tp
        .query_f64(&format!(
            "select extract_arg(arg_set_id, 'debug.{}') from slice where name = '{}'",
            llmprof_trace::names::arg::COST_NS_SAMPLE_LIVE,
            llmprof_trace::names::marker::SUMMARY
        ))
        .unwrap_or_else(|e| panic!("no live sampler cost in the summary: {e}\n{summary}"));
    assert!(live > 0.0, "sampler cost on the server: {live} ns\n{summary}");
    drop(tp);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
