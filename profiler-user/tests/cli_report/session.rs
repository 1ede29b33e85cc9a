//! The engine session's numbers: `--json` against what the fixture did, against Perfetto's trace processor,
//! self-accounting and the overhead budget; a trace cut mid-packet; files that are not llmprof traces.

use super::*;

#[test]
fn report_json_has_the_numbers_of_the_session() {
    let path = write_trace("ok.perfetto-trace");
    let j = report_json(&path);
    assert_eq!(j["format"], "llmprof-report/1");
    // The documented top-level layout (profiler-user/src/report.rs), in order.
    let keys: Vec<&str> = j.as_object().unwrap().keys().map(String::as_str).collect();
    let mut want_keys = [
        "format",
        "trace",
        "truncated",
        "has_summary",
        "end_reason",
        "requests",
        "steps",
        "counters",
        "syscalls",
        "model_files",
        "egress",
        "drops",
        "overhead",
        "gpu",
        "thread_states",
        "cpu_samples",
        "kernels",
    ];
    want_keys.sort_unstable();
    let mut keys_sorted = keys.clone();
    keys_sorted.sort_unstable();
    assert_eq!(keys_sorted, want_keys);
    assert_eq!(j["truncated"], false);
    assert_eq!(j["has_summary"], true);
    assert_eq!(j["end_reason"], "duration elapsed");

    // Requests and their TTFT decomposition.
    let r = &j["requests"];
    assert_eq!(r["count"], 4);
    assert_eq!(r["finished"], 3);
    assert_eq!(r["unfinished"], 1);
    let per: Vec<&Value> = r["per_request"].as_array().unwrap().iter().collect();
    let want = [
        // (id, queue, prefill, ttft, first decode step, finish)
        (1, 0.2, 1.0, 1.2, 0.5, "stop"),
        (2, 0.1, 1.0, 1.1, 0.5, "unfinished"),
        (3, 0.5, 0.5, 1.0, 0.3, "stop"),
    ];
    assert_eq!(per.len(), want.len() + 1);
    for (q, (id, queue, prefill, ttft, first, finish)) in per.iter().zip(want) {
        assert_eq!(q["req_id"], id);
        assert_eq!(q["x_request_id"], format!("xr-{id}"));
        assert_ms(&q["queue_ms"], queue);
        assert_ms(&q["prefill_ms"], prefill);
        assert_ms(&q["ttft_ms"], ttft);
        assert_ms(&q["first_decode_step_ms"], first);
        assert_eq!(q["finish_reason"], finish, "request {id}");
    }
    assert_eq!(per[1]["preemptions"], 1);
    assert_eq!(per[3]["attached_mid_request"], true);
    assert_eq!(per[3]["ttft_ms"], Value::Null, "arrival not seen");
    assert_eq!(per[3]["queue_ms"], Value::Null);
    assert_eq!(r["ttft_ms"]["count"], 3);
    assert_ms(&r["ttft_ms"]["p50"], 1.1);
    assert_ms(&r["ttft_ms"]["max"], 1.2);
    assert_ms(&r["queue_ms"]["p99"], 0.5);
    // ITL: 0.6, 0.7 for requests 1 and 2, 0.4, 0.5 for request 3, 1.0 for request 4.
    assert_eq!(r["itl_ms"]["count"], 7);
    assert_ms(&r["itl_ms"]["p50"], 0.6);
    assert_ms(&r["itl_ms"]["p95"], 1.0);

    // Steps by kind and batch size.
    let s = &j["steps"];
    assert_eq!(s["count"], 6);
    assert_eq!(s["by_kind"]["prefill"]["count"], 2);
    assert_eq!(s["by_kind"]["decode"]["count"], 3);
    assert_eq!(s["by_kind"]["mixed"]["count"], 1);
    assert_ms(&s["by_kind"]["prefill"]["max"], 1.0);
    let buckets = s["by_batch_size"].as_array().unwrap();
    assert_eq!(buckets.len(), 2);
    assert_eq!(buckets[0]["bucket"], "1");
    assert_eq!(buckets[0]["stats"]["count"], 3);
    assert_eq!(buckets[1]["bucket"], "2");
    assert_eq!(buckets[1]["stats"]["count"], 3);
    // Steps 5 and 6 replayed a graph (0.3 and 0.4 ms); step 2 (two requests) was launched eagerly.
    assert_eq!(s["graph_replayed"]["count"], 2);
    assert_ms(&s["graph_replayed"]["max"], 0.4);

    // KV cache and queue.
    let c = &j["counters"];
    assert_eq!(c["kv_cache_usage"]["samples"], 3);
    assert_ms(&c["kv_cache_usage"]["max"], 0.1);
    assert_ms(&c["kv_cache_usage"]["mean"], 0.05);
    assert_ms(&c["requests_waiting"]["max"], 2.0);
    assert_ms(&c["requests_waiting"]["mean"], 1.0);
    assert_ms(&c["preemptions_total"], 1.0);

    // Syscalls: the slow slices and the kernel aggregates (summed over threads), by total time.
    let slow = &j["syscalls"]["slow_syscall_slices"][0];
    assert_eq!(slow["name"], "nanosleep");
    assert_eq!(slow["count"], 2);
    assert_ms(&slow["total_ms"], 6.0);
    assert_ms(&slow["max_ms"], 4.0);
    let agg = j["syscalls"]["kernel_aggregates"].as_array().unwrap();
    assert_eq!(agg[0]["name"], "nanosleep");
    assert_eq!(agg[0]["count"], 5);
    assert_ms(&agg[0]["total_ms"], 9.0);
    assert_eq!(agg[1]["name"], "read");
    assert_eq!(agg[1]["count"], 50);

    // Model file: 1000 bytes in 0.1 ms = 10 MB/s.
    let m = &j["model_files"][0];
    assert_eq!(m["path"], "/models/m.gguf");
    assert_eq!(m["reads"], 1);
    assert_eq!(m["bytes"], 1000);
    assert_eq!(m["opens"], 1);
    assert_ms(&m["mb_per_s"], 10.0);

    // Egress: one allowed destination, one flagged (twice, both refused).
    let e = j["egress"].as_array().unwrap();
    assert_eq!(e.len(), 2);
    let flagged: Vec<&Value> = e.iter().filter(|d| d["verdict"] == "flagged").collect();
    assert_eq!(flagged.len(), 1);
    assert_eq!(flagged[0]["address"], "203.0.113.7");
    assert_eq!(flagged[0]["port"], 443);
    assert_eq!(flagged[0]["connects"], 2);
    assert_eq!(flagged[0]["failed"], 2);
    assert_eq!(flagged[0]["allowed"], false);

    // Drops, from the summary.
    let d = &j["drops"];
    assert_eq!(d["source"], "summary");
    assert_eq!(d["total_dropped"], 7);
    assert_eq!(d["user_drops"], 2);
    let sys = d["probes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["probe"] == "syscalls")
        .unwrap();
    assert_eq!(
        (&sys["hits"], &sys["emitted"], &sys["dropped"]),
        (&100.into(), &95.into(), &5.into())
    );

    // The terminal report says the same things in words.
    let out = llmprof(&["report"], &path);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "Requests: 4 (3 finished, 1 still running at the end)",
        "FLAGGED  203.0.113.7:443",
        "nanosleep",
        "/models/m.gguf",
        "Dropped: 7 total",
    ] {
        assert!(text.contains(needle), "{needle:?} missing from:\n{text}");
    }
    let _ = std::fs::remove_file(&path);
}

#[test]
fn a_trace_cut_mid_packet_is_reported_from_its_valid_prefix() {
    let full_path = write_trace("full.perfetto-trace");
    let full = std::fs::read(&full_path).unwrap();
    let _ = std::fs::remove_file(&full_path);
    let path = write_file("cut.perfetto-trace", &full[..full.len() - 7]);
    let j = report_json(&path);
    assert_eq!(j["truncated"], true);
    assert_eq!(j["has_summary"], false, "the summary is the last packet");
    assert_eq!(j["drops"]["source"], "drop_counters");
    assert_eq!(j["requests"]["count"], 4);
    let _ = std::fs::remove_file(&path);
}

#[test]
fn files_that_are_not_llmprof_traces_fail_clearly() {
    // A Perfetto trace with only a process descriptor: valid protobuf, no llmprof tracks.
    let mut foreign = vec![TRACE_PACKET_TAG];
    TracePacket {
        track_descriptor: Some(TrackDescriptor {
            uuid: Some(1),
            process: Some(ProcessDescriptor {
                pid: Some(1),
                process_name: Some("init".into()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_length_delimited(&mut foreign)
    .unwrap();
    let random: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let cases: [(&str, &[u8], &str); 3] = [
        ("empty", &[], "is empty"),
        ("random", &random, "is not a Perfetto trace"),
        ("foreign", &foreign, "not one llmprof wrote"),
    ];
    for (name, bytes, msg) in cases {
        let path = write_file(name, bytes);
        for args in [&["report"][..], &["report", "--json"][..]] {
            let out = llmprof(args, &path);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{name} {args:?}: {err}");
            assert!(err.contains(msg), "{name}: stderr {err:?} lacks {msg:?}");
            assert!(out.stdout.is_empty(), "{name}: nothing on stdout");
        }
        let _ = std::fs::remove_file(&path);
    }
    let out = llmprof(&["report"], Path::new("/nonexistent/x.perfetto-trace"));
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read"));
}

#[test]
fn report_agrees_with_perfetto_trace_processor() {
    if !e2e::require(
        e2e::trace_processor::available(),
        "Perfetto trace processor not installed (cargo xtask setup-tools)",
    ) {
        return;
    }
    let path = write_trace("tp.perfetto-trace");
    let j = report_json(&path);
    let mut tp = e2e::trace_processor::load(&path).expect("trace loads");
    // TTFT: the sink's own `ttft_ms` on each `first token` instant, in request order.
    let rows = tp
        .query(&format!(
            "select cast(substr(t.name, {}) as int) as id, extract_arg(s.arg_set_id, '{}') as v \
             from slice s join track t on s.track_id = t.id where s.name = '{}' order by id",
            track::REQUEST_PREFIX.len() + 1,
            tp_arg(arg::TTFT_MS),
            slice::FIRST_TOKEN
        ))
        .unwrap();
    let ours: Vec<&Value> = j["requests"]["per_request"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|q| !q["ttft_ms"].is_null())
        .collect();
    let theirs: Vec<&Value> = rows.iter().filter(|r| r["id"] != 4).collect();
    assert_eq!(ours.len(), theirs.len());
    for (q, r) in ours.iter().zip(theirs) {
        assert_eq!(q["req_id"], r["id"]);
        assert!(close(&q["ttft_ms"], r["v"].as_f64().unwrap()), "{q} vs {r}");
    }
    // Steps by kind, and the slow syscall total.
    for kind in [StepKind::Prefill, StepKind::Decode, StepKind::Mixed].map(StepKind::name) {
        let n = tp
            .query_i64(&format!(
                "select count(*) from slice s join track t on s.track_id = t.id \
                 where t.name = '{}' and s.name = '{kind}'",
                track::STEPS
            ))
            .unwrap();
        assert_eq!(j["steps"]["by_kind"][kind]["count"], n, "{kind}");
    }
    let total = tp
        .query(&format!(
            "select sum(dur) / 1e6 as v from slice where name = '{}'",
            slice::syscall("nanosleep")
        ))
        .unwrap();
    assert!(close(
        &j["syscalls"]["slow_syscall_slices"][0]["total_ms"],
        total[0]["v"].as_f64().unwrap()
    ));
    drop(tp);
    let _ = std::fs::remove_file(&path);
}

/// Self-accounting and the overhead budget's steps, as `attach` writes them, come back out of `report`.
#[test]
fn report_shows_self_accounting_and_the_budget_steps() {
    let sample = OverheadSample {
        interval_ns: 1_000_000_000,
        est_added_ns: 30e6,
        target_cpu_ns: Some(530e6),
        est_overhead_pct: Some(6.0),
        llmprof_cpu_ns: 12e6,
        llmprof_rss_bytes: 20 << 20,
        cost_syscall_ns: 700.0,
        cost_syscall_decoded_ns: Some(900.0),
        cost_probe_ns: Some(1_800.0),
        cost_cuda_ns: Some(4_500.0),
        level: 0,
    };
    let step = Degradation {
        level: 1,
        name: "syscall_events_off",
        change: "individual syscall events off".into(),
        overhead_pct: 6.0,
        budget_pct: 1.0,
        syscalls_counted: 4_000,
    };
    let extra = [
        testing::event(PID, 0, at(10), EventBody::Overhead(Box::new(sample))),
        testing::event(PID, 0, at(20), EventBody::Degraded(step.clone())),
    ];
    let mut st = stats();
    st.overhead = Some(OverheadSummary {
        elapsed_ns: 2_000_000_000,
        est_added_ns: 40e6,
        est_added_by_probe_ns: vec![0.0, 0.0, 0.0, 40e6, 0.0, 0.0, 0.0, 0.0, 0.0],
        target_cpu_ns: Some(1_040e6),
        est_overhead_pct: Some(4.0),
        llmprof_cpu_ns: 20e6,
        llmprof_max_rss_bytes: 24 << 20,
        llmprof_max_private_bytes: 20 << 20,
        calibration: Some(Calibration {
            syscall_ns: 700.0,
            syscall_decoded_ns: Some(900.0),
            probe_ns: Some(1_800.0),
            probe_entry: Some(0xe8),
            cuda_call_ns: Some(4_500.0),
            sample_ns: Some(1_500.0),
            ..Calibration::default()
        }),
        budget_pct: Some(1.0),
        degradations: vec![step],
        size_limit: None,
        events_not_written: 0,
        symbolized_stacks: 120,
        symbolize_ns: 6e6,
        ..Default::default()
    });
    let trace = write_trace_with("overhead.perfetto-trace", &extra, &st);
    let j = report_json(&trace);
    let o = &j["overhead"];
    assert_ms(&o["est_target_cpu_ms"], 40.0);
    assert_ms(&o["est_target_pct"], 4.0);
    assert_ms(&o["cost_ns"]["syscall"], 700.0);
    assert_ms(&o["cost_ns"]["syscall_decoded"], 900.0);
    assert_ms(&o["cost_ns"]["engine_probe"], 1_800.0);
    assert_ms(&o["cost_ns"]["cuda_call"], 4_500.0);
    assert_ms(&o["cost_ns"]["sample"], 1_500.0);
    assert_eq!(o["symbolized_stacks"], 120, "{o}");
    assert_ms(&o["symbolize_ms"], 6.0);
    assert_ms(&o["llmprof_max_rss_mib"], 24.0);
    assert_ms(&o["llmprof_max_private_mib"], 20.0);
    assert_ms(&o["by_probe_ms"]["syscalls"], 40.0);
    assert_eq!(o["probe_entry"], "call (optimized)");
    assert_ms(&o["budget_pct"], 1.0);
    assert_eq!(o["degradations"][0]["step"], "syscall_events_off");
    assert_eq!(o["degradations"][0]["syscalls_counted"], 4_000);
    assert_ms(&o["degradations"][0]["at_s"], 0.001);
    assert_eq!(o["size_limit_reached"], false);
    let out = llmprof(&["report"], &trace);
    let text = String::from_utf8_lossy(&out.stdout);
    for want in [
        "llmprof overhead",
        "cost per hit: syscall 700 ns (decoded 900 ns)",
        "CUDA call 4500 ns",
        "syscall_events_off",
        "peak RSS 24.0 MiB (20.0 MiB its own)",
    ] {
        assert!(text.contains(want), "report lacks {want:?}:\n{text}");
    }
    // A trace without self-accounting says nothing about it.
    assert_eq!(
        report_json(&write_trace("plain.perfetto-trace"))["overhead"],
        Value::Null
    );
}
