//! Thread states through the Perfetto sink, without root: scheduler events built in code (a thread that runs, is
//! preempted by a neighbour, sleeps, is woken by another traced thread, blocks uninterruptibly and is woken by an
//! interrupt), written by the sink, loaded by Perfetto's own trace processor (its `thread_state` table, what the UI
//! draws) and read back by `llmprof report`.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]

use llmprof_trace::event::{Event, EventBody, ProcessInfo, SchedSwitch, SchedWake, SessionStats, ThreadInfo};
use llmprof_trace::perfetto::TraceSink;
use llmprof_trace::testing;

const PID: u32 = 4242;
const ENGINE: u32 = 4243;
const WORKER: u32 = 4244;
const NOISY: u32 = 900;
const OTHER: u32 = 901;
const MS: u64 = 1_000_000;
const T0: u64 = 1_000_000 * MS;

fn name(tid: u32) -> String {
    match tid {
        ENGINE => "engine".into(),
        WORKER => "worker".into(),
        NOISY => "noisy".into(),
        OTHER => "other".into(),
        0 => "swapper/0".into(),
        t => t.to_string(),
    }
}

/// A switch on CPU 0 at `ms`.
fn switch(ms: u64, prev: u32, state: i64, next: u32) -> Event {
    let traced = |t: u32| matches!(t, ENGINE | WORKER);
    let body = EventBody::SchedSwitch(Box::new(SchedSwitch {
        cpu: 0,
        prev_tid: prev,
        prev_pid: if traced(prev) { PID } else { prev },
        prev_traced: traced(prev),
        prev_comm: name(prev),
        prev_prio: 120,
        prev_state: state,
        next_tid: next,
        next_pid: if traced(next) { PID } else { 0 },
        next_comm: name(next),
        next_prio: 120,
        stack_id: None,
    }));
    testing::event(PID, prev, T0 + ms * MS, body)
}

/// `waker` wakes the engine at `ms` (`irq`: from an interrupt).
fn wake(ms: u64, waker: u32, irq: bool) -> Event {
    let body = EventBody::SchedWake(Box::new(SchedWake {
        cpu: 1,
        waker_tid: waker,
        waker_pid: if waker == WORKER { PID } else { 0 },
        tid: ENGINE,
        pid: PID,
        comm: name(ENGINE),
        prio: 120,
        target_cpu: 0,
        new_task: false,
        in_interrupt: irq,
        common_flags: if irq { 0x08 } else { 0 },
    }));
    testing::event(PID, ENGINE, T0 + ms * MS, body)
}

fn fixture() -> Vec<Event> {
    vec![
        switch(0, NOISY, 0, ENGINE),      // engine runs
        switch(10, ENGINE, 0x100, NOISY), // preempted by the neighbour: R+ 10 → 14
        // Another untraced thread ran after `noisy` (not recorded): written as `noisy`.
        switch(14, OTHER, 0, ENGINE),
        switch(20, ENGINE, 1, 0), // sleeps: S 20 → 50
        wake(50, WORKER, false),  // the worker wakes it: R 50 → 52
        switch(52, 0, 0, ENGINE),
        switch(60, ENGINE, 2, 0), // D 60 → 70
        wake(70, 0, true),        // an interrupt wakes it
        switch(71, 0, 0, ENGINE),
        switch(80, ENGINE, 1, 0),
        // The kernel skipped the switch that put it back on the CPU: the sink writes the hand-over.
        switch(85, ENGINE, 0x100, NOISY),
    ]
}

fn write(path: &std::path::Path, release: Option<&str>) {
    let info = ProcessInfo {
        pid: PID,
        name: "llmserve".into(),
        cmdline: "llmserve".into(),
        threads: vec![ThreadInfo {
            tid: WORKER,
            name: "worker".into(),
        }],
        engine_probes: true,
    };
    let file = std::fs::File::create(path).unwrap();
    let mut sink = TraceSink::new(file, &[info], Some((T0, 1_700_000_000 * 1_000 * MS))).unwrap();
    if let Some(r) = release {
        sink.note_kernel_release(r);
    }
    for ev in fixture() {
        sink.push(&ev).unwrap();
    }
    assert_eq!(
        sink.counts().by_kind.get("sched_switch_repaired"),
        Some(&1),
        "one missed switch-in mended"
    );
    sink.finish(&SessionStats::default(), Some(T0 + 90 * MS)).unwrap();
}

#[test]
fn thread_states_load_as_perfettos_own_rows_and_the_report_agrees() {
    if !e2e::require(
        e2e::trace_processor::available(),
        "Perfetto trace processor not installed (cargo xtask setup-tools)",
    ) {
        return;
    }
    let dir = std::env::temp_dir().join(format!("llmprof-perfetto-sched-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("sched.perfetto-trace");
    write(&path, Some("6.18.0"));
    let mut tp = e2e::trace_processor::load(&path).unwrap();
    assert_eq!(tp.import_errors().unwrap(), Vec::<serde_json::Value>::new());
    let rows = tp
        .query(&format!(
            "select s.ts - {T0} as t, s.dur, s.state, w.tid as waker from thread_state s join thread t using(utid) \
             left join thread w on s.waker_utid = w.utid where t.tid = {ENGINE} order by s.ts"
        ))
        .unwrap();
    let got: Vec<(i64, i64, String, Option<i64>)> = rows
        .iter()
        .map(|r| {
            (
                r["t"].as_i64().unwrap() / MS as i64,
                r["dur"].as_i64().unwrap() / MS as i64,
                r["state"].as_str().unwrap().to_owned(),
                r["waker"].as_i64(),
            )
        })
        .collect();
    let w = Some(i64::from(WORKER));
    assert_eq!(
        got[..9],
        [
            (0, 10, "Running".to_owned(), None),
            (10, 4, "R+".to_owned(), None),
            (14, 6, "Running".to_owned(), None),
            (20, 30, "S".to_owned(), None),
            (50, 2, "R".to_owned(), w),
            (52, 8, "Running".to_owned(), None),
            (60, 10, "D".to_owned(), None),
            (70, 1, "R".to_owned(), Some(0)),
            (71, 9, "Running".to_owned(), None),
        ],
        "{rows:?}"
    );
    // One thread row per traced tid, under the traced process; the neighbour by tid and comm only.
    let q = |tp: &mut e2e::trace_processor::Trace, sql: &str| tp.query_i64(sql).unwrap();
    assert_eq!(
        q(
            &mut tp,
            &format!(
                "select count(*) from thread t join process p using(upid) where t.tid = {ENGINE} and p.pid = {PID}"
            )
        ),
        1
    );
    assert_eq!(
        q(
            &mut tp,
            &format!("select count(*) from thread where tid = {ENGINE}")
        ),
        1
    );
    assert_eq!(
        q(
            &mut tp,
            &format!("select count(*) from thread where tid = {WORKER}")
        ),
        1
    );
    drop(tp);

    let r = llmprof_trace::report::load(&path).unwrap();
    let t = r.thread_states.as_ref().unwrap();
    let g = t.groups.iter().find(|g| g.name == "engine").unwrap();
    let close = |a: f64, b: f64| (a - b).abs() < 1e-3;
    assert!(close(g.total.cpu_ms, 10.0 + 6.0 + 8.0 + 9.0), "{g:?}");
    assert!(close(g.total.runnable_ms, 4.0 + 2.0 + 1.0), "{g:?}");
    // Asleep from 80 ms until the mended switch-in just before 85 ms.
    assert!(close(g.total.sleeping_ms, 30.0 + 5.0), "{g:?}");
    assert!(close(g.total.uninterruptible_ms, 10.0), "{g:?}");
    assert_eq!(g.runnable_waits.count, 3);
    assert_eq!(
        g.wakers,
        vec![("(interrupt)".to_owned(), 1), ("worker (4244)".to_owned(), 1)]
    );
    let json: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
    assert_eq!(json["thread_states"]["groups"][0]["name"], "engine");
    assert!(r.to_text().contains("thread states"));

    // Without a kernel release the preempted bit is dropped: still Runnable, never misread as another state.
    write(&path, None);
    let mut tp = e2e::trace_processor::load(&path).unwrap();
    assert_eq!(tp.import_errors().unwrap(), Vec::<serde_json::Value>::new());
    assert_eq!(
        q(
            &mut tp,
            &format!(
                "select count(*) from thread_state s join thread t using(utid) where t.tid = {ENGINE} and s.state = 'R' and s.dur = {}",
                4 * MS
            )
        ),
        1
    );
    drop(tp);
    std::fs::remove_dir_all(&dir).unwrap();
}
