//! The probe points survive `strip` (they are in the dynamic symbol table of `llmserve`), and what a detached
//! probe call costs (an ignored microbenchmark: `cargo test -p inference --release --test serve_probes -- --ignored --nocapture`).

#![allow(clippy::unwrap_used, reason = "tests unwrap to fail loudly")]

use std::process::Command;
use std::time::Instant;

use llmprof_abi::{
    ABI_VERSION, ENGINE_PROBES, MAX_STEP_REQS, RangeOp, RangeRecord, RequestRecord, StepRecord,
};

fn dynamic_symbols(path: &std::path::Path) -> String {
    let out = Command::new("nm")
        .arg("-D")
        .arg("--defined-only")
        .arg(path)
        .output()
        .expect("nm (binutils) runs");
    assert!(
        out.status.success(),
        "nm -D failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn probe_symbols_survive_strip() {
    let bin = std::path::PathBuf::from(env!("CARGO_BIN_EXE_llmserve"));
    let dir = std::env::temp_dir().join(format!("llmserve-strip-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let stripped = dir.join("llmserve");
    std::fs::copy(&bin, &stripped).unwrap();
    let st = Command::new("strip")
        .arg(&stripped)
        .status()
        .expect("strip (binutils) runs");
    assert!(st.success());
    let before = std::fs::metadata(&bin).unwrap().len();
    let after = std::fs::metadata(&stripped).unwrap().len();
    assert!(
        after < before,
        "strip removed something ({before} -> {after} bytes)"
    );
    let syms = dynamic_symbols(&stripped);
    for name in ENGINE_PROBES.iter().chain([&llmprof_abi::ABI_VERSION_SYMBOL]) {
        assert!(
            syms.lines().any(|l| l.split_whitespace().last() == Some(name)),
            "{name} missing from the dynamic symbols of the stripped binary:\n{syms}"
        );
    }
    // And the code at the symbol starts with the 5-byte NOP: read it from the stripped ELF.
    let out = Command::new("objdump")
        .args(["-d", "--no-show-raw-insn"])
        .arg(format!("--disassemble={}", llmprof_abi::PROBE_STEP))
        .arg(&stripped)
        .output();
    if let Ok(out) = out {
        let d = String::from_utf8_lossy(&out.stdout);
        if d.contains(llmprof_abi::PROBE_STEP) {
            assert!(d.contains("nop"), "probe starts with a NOP:\n{d}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "microbenchmark; run with --ignored --nocapture (release)"]
fn detached_probe_cost() {
    const N: u64 = 10_000_000;
    let step = StepRecord {
        abi_version: ABI_VERSION,
        kind: 1,
        step_id: 1,
        host_start_ns: 0,
        host_end_ns: 0,
        device_start_ns: 0,
        device_end_ns: 0,
        device_clock: 0,
        num_seqs: 1,
        prefill_tokens: 0,
        decode_tokens: 1,
        kv_blocks_used: 0,
        kv_blocks_total: 0,
        num_waiting: 0,
        num_preempted: 0,
        num_req_ids: 0,
        req_ids_truncated: 0,
        req_ids: [0; MAX_STEP_REQS],
    };
    let t = Instant::now();
    for i in 0..N {
        let mut r = step;
        r.step_id = i;
        llmprof_probes::step(std::hint::black_box(&r));
    }
    let step_ns = t.elapsed().as_nanos() as f64 / N as f64;

    let rec: RequestRecord = request_record();
    let t = Instant::now();
    for _ in 0..N {
        llmprof_probes::request(std::hint::black_box(&rec));
    }
    let req_ns = t.elapsed().as_nanos() as f64 / N as f64;

    let t = Instant::now();
    for i in 0..N {
        inference::engine::emit_range(RangeOp::Push, "forward", i);
    }
    let range_ns = t.elapsed().as_nanos() as f64 / N as f64;
    let t = Instant::now();
    for _ in 0..N {
        std::hint::black_box(llmprof_probes::boottime_ns());
    }
    let clock_ns = t.elapsed().as_nanos() as f64 / N as f64;
    let _ = RangeRecord {
        abi_version: 0,
        op: 0,
        ts_ns: 0,
        step_id: 0,
        domain: [0; 16],
        name: [0; 48],
    };
    println!(
        "detached probe cost: step {step_ns:.2} ns/call, request {req_ns:.2} ns/call, range (incl. clock read + record) {range_ns:.2} ns/call, boottime clock read {clock_ns:.2} ns"
    );
}

fn request_record() -> RequestRecord {
    RequestRecord {
        abi_version: ABI_VERSION,
        kind: 0,
        req_id: 1,
        ts_ns: 0,
        trace_id: [0; 16],
        parent_span_id: [0; 8],
        has_trace_context: 0,
        trace_flags: 0,
        is_chat: 0,
        _pad: 0,
        finish_reason: 0,
        prompt_tokens: 0,
        output_tokens: 0,
        max_tokens: 0,
        temperature: 0.0,
        top_p: 1.0,
        num_preemptions: 0,
        x_request_id: [0; llmprof_abi::REQUEST_ID_LEN],
        model: [0; llmprof_abi::MODEL_LEN],
    }
}
