//! Stack samples of the real engine under load, as a user reads them: `llmprof attach` (default settings:
//! 99 Hz) on llmserve serving 4 concurrent requests; in Perfetto's trace processor the samples taken inside
//! `decode` engine-step slices (joined by time and process, as the UI does for a selected slice) name the
//! engine's matmul kernels (`inference::quant::…matmul_rows`), and the trace loads with no import error.

use e2e::attach::Attached;
use e2e::engine::Engine;
use e2e::{default_model, http, is_root, require, trace_processor};
use llmprof_abi::StepKind;
use llmprof_trace::names::track;

fn chat(port: u16, content: &str, max_tokens: u32) {
    let body = format!(
        r#"{{"model":"smollm2","messages":[{{"role":"user","content":"{content}"}}],"max_tokens":{max_tokens},"temperature":0}}"#
    );
    let r = http::post_json(port, "/v1/chat/completions", &[], &body).expect("chat request");
    assert_eq!(r.status, 200, "chat failed: {}", r.text());
}

#[test]
fn samples_inside_decode_steps_name_the_matmul_kernels() {
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
    let engine = Engine::spawn(&model, &["--max-num-seqs", "4"]);
    let dir = std::env::temp_dir().join(format!("llmprof-e2e-samples-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let trace_path = dir.join("samples.perfetto-trace");
    let llmprof = Attached::start(engine.pid, &[], &trace_path);
    let port = engine.port;
    let reqs: Vec<_> = (0..4)
        .map(|i| std::thread::spawn(move || chat(port, &format!("Write a story about the number {i}."), 48)))
        .collect();
    for r in reqs {
        r.join().expect("request");
    }
    llmprof.stop();

    let mut tp = trace_processor::load(&trace_path).expect("trace processor loads the trace");
    assert_eq!(
        tp.import_errors().expect("stats"),
        Vec::<serde_json::Value>::new()
    );
    // Samples of the engine's process taken inside decode step slices, and among them those with a matmul
    // kernel anywhere on the stack (the kernel runs on the compute pool's threads and the engine thread).
    let sql = |want: &str| {
        format!(
            "with recursive inside(sid, cs) as (
               select p.id, p.callsite_id from perf_sample p join thread t using(utid)
                 join process pr using(upid)
                 join slice s on p.ts >= s.ts and p.ts < s.ts + s.dur
                 join track tr on tr.id = s.track_id
               where pr.pid = {pid} and tr.name = '{steps}' and s.name = '{decode}'),
             anc(sid, cs) as (
               select sid, cs from inside
               union all
               select anc.sid, c.parent_id from anc join stack_profile_callsite c on c.id = anc.cs
               where c.parent_id is not null)
             select count(distinct anc.sid) from anc join stack_profile_callsite c on c.id = anc.cs
               join stack_profile_frame f on f.id = c.frame_id where {want}",
            pid = engine.pid,
            steps = track::STEPS,
            decode = StepKind::Decode.name(),
        )
    };
    let in_decode = tp.query_i64(&sql("1 = 1")).expect("samples query");
    let matmul = tp
        .query_i64(&sql("f.name like '%matmul_rows%'"))
        .expect("matmul query");
    eprintln!("samples inside decode steps: {in_decode}, with matmul_rows on the stack: {matmul}");
    assert!(in_decode > 0, "no sample inside a decode step");
    // Decode on CPU is matrix-vector work: most of a decode step's samples are in the kernels.
    assert!(
        matmul * 2 > in_decode,
        "only {matmul} of {in_decode} samples inside decode steps have matmul_rows on the stack"
    );
    std::fs::remove_dir_all(&dir).ok();
}
