//! `thread_states` of the `--json` document: the JSON objects of the thread-state section
//! ([`crate::report::sched`]), in the documented key order.

use serde::Serialize;

use crate::report::ThreadStates;

/// `thread_states` of the `--json` document.
#[derive(Serialize)]
pub(super) struct ThreadStatesJson<'a> {
    events: u64,
    groups: Vec<GroupJson<'a>>,
}

#[derive(Serialize)]
struct GroupJson<'a> {
    name: &'a str,
    threads: usize,
    cpu_ms: f64,
    runnable_ms: f64,
    sleeping_ms: f64,
    uninterruptible_ms: f64,
    idle_ms: f64,
    switches: u64,
    runnable_wait_ms: super::StatsJson,
    wakers: Vec<WakerJson<'a>>,
    blocked_on: Vec<BlockedJson<'a>>,
    per_thread: Vec<ThreadJson>,
}

#[derive(Serialize)]
struct BlockedJson<'a> {
    stack: &'a str,
    blocked_ms: f64,
    count: u64,
}

#[derive(Serialize)]
struct WakerJson<'a> {
    waker: &'a str,
    wakeups: u64,
}

#[derive(Serialize)]
struct ThreadJson {
    tid: u32,
    pid: u32,
    cpu_ms: f64,
    runnable_ms: f64,
    sleeping_ms: f64,
    uninterruptible_ms: f64,
    idle_ms: f64,
    switches: u64,
}

/// Rounded to 1e-6 ms (1 fs): what the rest of the document does with its floats.
fn r6(v: f64) -> f64 {
    (v * 1e6).round() / 1e6
}

impl<'a> ThreadStatesJson<'a> {
    pub(super) fn of(t: &'a ThreadStates) -> Self {
        Self {
            events: t.events,
            groups: t
                .groups
                .iter()
                .map(|g| GroupJson {
                    name: &g.name,
                    threads: g.threads.len(),
                    cpu_ms: r6(g.total.cpu_ms),
                    runnable_ms: r6(g.total.runnable_ms),
                    sleeping_ms: r6(g.total.sleeping_ms),
                    uninterruptible_ms: r6(g.total.uninterruptible_ms),
                    idle_ms: r6(g.total.idle_ms),
                    switches: g.total.switches,
                    runnable_wait_ms: super::StatsJson::of(&g.runnable_waits),
                    wakers: g
                        .wakers
                        .iter()
                        .map(|(w, n)| WakerJson {
                            waker: w,
                            wakeups: *n,
                        })
                        .collect(),
                    blocked_on: g
                        .blocked_on
                        .iter()
                        .map(|b| BlockedJson {
                            stack: &b.stack,
                            blocked_ms: r6(b.blocked_ms),
                            count: b.count,
                        })
                        .collect(),
                    per_thread: g
                        .threads
                        .iter()
                        .map(|t| ThreadJson {
                            tid: t.tid,
                            pid: t.pid,
                            cpu_ms: r6(t.cpu_ms),
                            runnable_ms: r6(t.runnable_ms),
                            sleeping_ms: r6(t.sleeping_ms),
                            uninterruptible_ms: r6(t.uninterruptible_ms),
                            idle_ms: r6(t.idle_ms),
                            switches: t.switches,
                        })
                        .collect(),
                })
                .collect(),
        }
    }
}
