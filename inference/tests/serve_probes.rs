//! The probe points survive `strip` (they are in the dynamic symbol table of `llmserve`), and what a detached
//! probe call costs (an ignored microbenchmark: `cargo test -p inference --release --test serve_probes -- --ignored --nocapture`).

#![allow(clippy::unwrap_used, reason = "tests unwrap to fail loudly")]

use std::process::Command;
use std::time::Instant;

use llmprof_abi::{ENGINE_PROBES, RangeOp, RequestEventKind, RequestRecord, StepKind, StepRecord};

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
        num_seqs: 1,
        decode_tokens: 1,
        ..StepRecord::new(StepKind::Decode, 1, &[])
    };
    let t = Instant::now();
    for i in 0..N {
        let mut r = step;
        r.step_id = i;
        llmprof_probes::step(std::hint::black_box(&r));
    }
    let step_ns = t.elapsed().as_nanos() as f64 / N as f64;

    let rec = RequestRecord::new(RequestEventKind::Arrived, 1, 0);
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
    println!(
        "detached probe cost: step {step_ns:.2} ns/call, request {req_ns:.2} ns/call, range (incl. clock read + record) {range_ns:.2} ns/call, boottime clock read {clock_ns:.2} ns"
    );
}
