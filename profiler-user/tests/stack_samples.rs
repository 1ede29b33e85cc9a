//! On-CPU stack samples end to end: the real `llmprof attach` (real eBPF, a perf_event per CPU) on
//! `llmprof-testee`, which burns CPU in a known non-inlined call chain and in a syscall-heavy loop; Perfetto's
//! trace processor loads the trace with no import error and its stack-sample tables (`perf_sample`,
//! `stack_profile_callsite`, `stack_profile_frame`, `stack_profile_mapping`) hold that chain and kernel
//! frames under the syscall loop; `llmprof report --json` ranks the chain's innermost function first.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]

use std::process::{Command, Stdio};

use e2e::testee::Testee;

const LLMPROF: &str = env!("CARGO_BIN_EXE_llmprof");

/// Samples (of thread `tid`) with a frame named `name` somewhere in their stack, and whose innermost frame
/// satisfies `leaf` (an SQL condition on `lf` = its frame, `lm` = its mapping).
fn samples_with(tp: &mut e2e::trace_processor::Trace, tid: u32, name: &str, leaf: &str) -> i64 {
    let sql = format!(
        "with recursive anc(sid, cs) as (
           select s.id, s.callsite_id from perf_sample s join thread t using(utid)
             join stack_profile_callsite lc on lc.id = s.callsite_id
             join stack_profile_frame lf on lf.id = lc.frame_id
             join stack_profile_mapping lm on lm.id = lf.mapping
           where t.tid = {tid} and ({leaf})
           union all
           select anc.sid, c.parent_id from anc join stack_profile_callsite c on c.id = anc.cs
           where c.parent_id is not null)
         select count(distinct anc.sid) from anc join stack_profile_callsite c on c.id = anc.cs
           join stack_profile_frame f on f.id = c.frame_id where f.name = '{name}'"
    );
    tp.query_i64(&sql).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn samples_show_the_whole_known_call_chain_and_kernel_frames_of_a_syscall_loop() {
    if !e2e::require(e2e::is_root(), "not root: cannot load eBPF programs") {
        return;
    }
    if !e2e::require(
        e2e::trace_processor::available(),
        "Perfetto trace processor not installed (cargo xtask setup-tools)",
    ) {
        return;
    }
    let mut testee = Testee::spawn(&[]);
    let pid = testee.pid();
    let dir = std::env::temp_dir().join(format!("llmprof-stack-samples-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("t.perfetto-trace");
    let mut attach = Command::new(LLMPROF)
        .args([
            "attach",
            "--pid",
            &pid.to_string(),
            "-d",
            "60s",
            "--sample-rate",
            "199",
            "-o",
        ])
        .arg(&trace)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (_stderr, _) = e2e::attach::wait_probes_live(&mut attach);
    for (cmd, done) in [("burn 1500", "burn done"), ("sysburn 1500", "sysburn done")] {
        testee.cmd(cmd, done);
    }
    testee.exit();
    let out = attach.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "attach failed: {stdout}");

    let mut tp = e2e::trace_processor::load(&trace).unwrap();
    assert_eq!(tp.import_errors().unwrap(), Vec::<serde_json::Value>::new());
    let samples = tp
        .query_i64(&format!(
            "select count(*) from perf_sample join thread using(utid) where thread.tid = {pid}"
        ))
        .unwrap();
    // 1.5 s of burning at 199 Hz is ~300 samples; allow for a loaded machine.
    assert!(samples >= 50, "only {samples} samples of the testee");
    // The known chain, whole: every frame of a → b → c, in that order from the root.
    let chain = tp
        .query_i64(
            "select count(*) from stack_profile_callsite c
               join stack_profile_frame f on f.id = c.frame_id
               join stack_profile_callsite c1 on c1.id = c.parent_id
               join stack_profile_frame f1 on f1.id = c1.frame_id
               join stack_profile_callsite c2 on c2.id = c1.parent_id
               join stack_profile_frame f2 on f2.id = c2.frame_id
             where f.name = 'llmprof_testee_burn_c' and f1.name = 'llmprof_testee_burn_b'
               and f2.name = 'llmprof_testee_burn_a'",
        )
        .unwrap();
    assert!(chain >= 1, "no callsite c → b → a");
    // Most of the burn's samples are inside c (its own code or what is inlined into it).
    let in_c = samples_with(&mut tp, pid, "llmprof_testee_burn_c", "1 = 1");
    assert!(in_c >= 20, "only {in_c} samples inside burn_c");
    // The syscall loop: samples whose innermost frame is in the kernel, under the testee's loop function.
    let kernel = samples_with(
        &mut tp,
        pid,
        "llmprof_testee_sysburn",
        "lm.name like '%[kernel]%'",
    );
    assert!(
        kernel >= 20,
        "only {kernel} kernel-leaf samples under llmprof_testee_sysburn"
    );
    let read_path = tp
        .query_i64(
            "select count(*) from stack_profile_frame f join stack_profile_mapping m on m.id = f.mapping
             where m.name like '%[kernel]%' and (f.name like '%sys_read%' or f.name like '%read_zero%' or f.name like '%vfs_read%')",
        )
        .unwrap();
    assert!(read_path >= 1, "no kernel read-path frame named");
    drop(tp);

    // The report, per thread: the chain's functions are on top by total samples (c's own code and what is
    // inlined into it share its samples), and the self column names where the CPU was.
    let v = e2e::attach::report_json(&trace);
    let threads = v["cpu_samples"]["threads"]
        .as_array()
        .unwrap_or_else(|| panic!("no cpu_samples.threads: {v}"));
    let testee_thread = threads
        .iter()
        .find(|t| {
            t["tids"]
                .as_array()
                .is_some_and(|a| a.iter().any(|t| t == &serde_json::json!(pid)))
        })
        .unwrap_or_else(|| panic!("no testee thread in {threads:?}"));
    let total = testee_thread["top_total"].as_array().unwrap();
    for f in [
        "llmprof_testee_burn_a",
        "llmprof_testee_burn_b",
        "llmprof_testee_burn_c",
    ] {
        let n = total
            .iter()
            .find(|r| r["function"] == f)
            .map(|r| r["samples"].as_u64().unwrap())
            .unwrap_or(0);
        assert!(n >= 20, "{f}: {n} total samples in the report: {total:?}");
    }
    assert!(testee_thread["top_self"][0]["samples"].as_u64().unwrap() > 0);
    std::fs::remove_dir_all(&dir).unwrap();
}
