//! The thread-state section of `llmprof report`: where each traced thread's time went — on a CPU, waiting
//! for one (runnable), or blocked — grouped by thread name (the engine loop, the HTTP workers, a compute
//! pool are each one name), with the waits for a CPU as percentiles (the noisy-neighbour figure) and who
//! woke the threads.
//!
//! Owns reading the ftrace bundles of the trace back ([`SchedLog`], filled by `read`) and replaying them per
//! thread, with the one `prev_state` decoding of [`crate::event::sched`]: Running from a switch-in to the
//! switch-out; then Runnable (preempted) until the next switch-in — one wait sample — or blocked (Sleeping,
//! Uninterruptible, Idle) until a waking makes it Runnable. Threads are the traced ones: those with a
//! thread track in the trace. Off-CPU stacks (`sched_blocked_reason` events after a switch-out, their labels
//! interned as `kernel_symbols`) say where a thread blocked: each blocked interval's time goes to the label
//! that came with it ("time blocked and on what").

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use serde::Serialize;

use super::Stats;
use crate::event::sched::BlockState;
use crate::perfetto::schema::FtraceEvent;

/// How many wakers a group lists.
pub const TOP_WAKERS: usize = 5;
/// How many off-CPU stacks a group lists (by blocked time).
pub const TOP_BLOCKED: usize = 5;
/// `TRACE_FLAG_HARDIRQ | TRACE_FLAG_SOFTIRQ` (kernel/trace/trace.h): a waking recorded in interrupt context.
const IRQ_FLAGS: u32 = 0x08 | 0x10;
/// The waker name of a wakeup from interrupt context (a timer, a device) rather than a task.
pub const WAKER_INTERRUPT: &str = "(interrupt)";

/// The scheduler events of a trace, as `read` finds them.
#[derive(Debug, Default)]
pub(super) struct SchedLog {
    /// (cpu, event) in file order.
    pub(super) events: Vec<(u32, FtraceEvent)>,
    /// Traced threads: tid → (pid, name from the thread track).
    pub(super) threads: BTreeMap<u32, (u32, Option<String>)>,
    /// Off-CPU stack labels (`sched_blocked_reason.caller` → label, the trace's `kernel_symbols`).
    pub(super) blocked_labels: HashMap<u64, String>,
}

/// One thread's time, ms.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ThreadRow {
    /// Thread id.
    pub tid: u32,
    /// Process id.
    pub pid: u32,
    /// On a CPU.
    pub cpu_ms: f64,
    /// Runnable, waiting for a CPU.
    pub runnable_ms: f64,
    /// Interruptible sleep (S).
    pub sleeping_ms: f64,
    /// Uninterruptible sleep (D).
    pub uninterruptible_ms: f64,
    /// Idle kernel wait (I).
    pub idle_ms: f64,
    /// Context switches out.
    pub switches: u64,
}

/// The threads of one name.
#[derive(Clone, Debug, Default)]
pub struct ThreadGroup {
    /// The thread name (`comm`).
    pub name: String,
    /// Its threads, by tid.
    pub threads: Vec<ThreadRow>,
    /// Sum over the threads.
    pub total: ThreadRow,
    /// Each wait for a CPU (runnable → running), ms.
    pub runnable_waits: Stats,
    /// Who woke these threads: (waker name, wakeups), most first.
    pub wakers: Vec<(String, u64)>,
    /// Where these threads blocked: off-CPU stacks ([`crate::event::stacks::offcpu::label`]) weighted by the time blocked
    /// after each (until the thread was woken), most first.
    pub blocked_on: Vec<BlockedOn>,
}

/// One off-CPU stack of a thread group and the time its threads spent blocked there.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct BlockedOn {
    /// The stack's label, innermost first (`do_nanosleep ← … ← main`).
    pub stack: String,
    /// Blocked time after taking this stack, ms (Sleeping + Uninterruptible until woken).
    pub blocked_ms: f64,
    /// How many times the threads blocked there.
    pub count: u64,
}

/// The section: groups by total CPU time, descending.
#[derive(Clone, Debug, Default)]
pub struct ThreadStates {
    /// Per thread name.
    pub groups: Vec<ThreadGroup>,
    /// Scheduler events read.
    pub events: u64,
}

#[derive(Clone, Copy, Debug)]
enum State {
    Running,
    Runnable,
    Blocked(BlockState),
}

#[derive(Default)]
struct Acc {
    row: ThreadRow,
    state: Option<(State, u64)>,
    waits: Vec<f64>,
    wakers: HashMap<String, u64>,
    comm: Option<String>,
    /// The off-CPU stack of the current blocked state, when one came after its switch-out.
    blocked_label: Option<String>,
    /// Label → (blocked ms, count).
    blocked: HashMap<String, (f64, u64)>,
}

impl Acc {
    fn close(&mut self, ts: u64) {
        let Some((st, since)) = self.state else { return };
        let ms = ts.saturating_sub(since) as f64 / 1e6;
        if let (State::Blocked(_), Some(label)) = (st, self.blocked_label.take()) {
            let b = self.blocked.entry(label).or_default();
            b.0 += ms;
            b.1 += 1;
        }
        match st {
            State::Running => self.row.cpu_ms += ms,
            State::Runnable => self.row.runnable_ms += ms,
            State::Blocked(BlockState::Uninterruptible) => self.row.uninterruptible_ms += ms,
            State::Blocked(BlockState::Idle) => self.row.idle_ms += ms,
            State::Blocked(BlockState::Sleeping) => self.row.sleeping_ms += ms,
            // Stopped, traced or dead: not waiting for anything this report names.
            State::Blocked(_) => {}
        }
    }
}

/// Replays the log; `None` when the trace has no scheduler events.
pub(super) fn analyze(log: &SchedLog) -> Option<ThreadStates> {
    if log.events.is_empty() {
        return None;
    }
    let mut evs: Vec<&(u32, FtraceEvent)> = log.events.iter().collect();
    // A blocked reason carries its switch-out's time: after that switch whatever order the file holds them in
    // (compact switches are expanded after the bundle's full events).
    evs.sort_by_key(|(cpu, e)| (e.timestamp.unwrap_or(0), *cpu, e.sched_blocked_reason.is_some()));
    let mut acc: BTreeMap<u32, Acc> = log.threads.keys().map(|&t| (t, Acc::default())).collect();
    let mut comms: HashMap<u32, String> = HashMap::new();
    let mut last = 0;
    for (_, e) in evs {
        let ts = e.timestamp.unwrap_or(0);
        last = last.max(ts);
        if let Some(s) = &e.sched_switch {
            let prev = s.prev_pid.unwrap_or(0) as u32;
            let next = s.next_pid.unwrap_or(0) as u32;
            if let Some(c) = &s.prev_comm {
                comms.insert(prev, c.clone());
            }
            if let Some(c) = &s.next_comm {
                comms.insert(next, c.clone());
            }
            if let Some(a) = acc.get_mut(&prev) {
                a.close(ts);
                a.row.switches += 1;
                a.comm = s.prev_comm.clone().or(a.comm.take());
                let b = BlockState::from_prev_state(s.prev_state.unwrap_or(0));
                let st = if b == BlockState::Runnable {
                    State::Runnable
                } else {
                    State::Blocked(b)
                };
                a.state = Some((st, ts));
            }
            if let Some(a) = acc.get_mut(&next) {
                if let Some((State::Runnable, since)) = a.state {
                    a.waits.push(ts.saturating_sub(since) as f64 / 1e6);
                }
                a.close(ts);
                a.state = Some((State::Running, ts));
            }
        } else if let Some(r) = &e.sched_blocked_reason {
            let tid = r.pid.unwrap_or(0) as u32;
            if let Some(a) = acc.get_mut(&tid)
                && let Some((State::Blocked(_), _)) = a.state
            {
                let iid = r.caller.unwrap_or(0);
                a.blocked_label = Some(
                    log.blocked_labels
                        .get(&iid)
                        .cloned()
                        .unwrap_or_else(|| format!("(stack {iid} not in the trace)")),
                );
            }
        } else if let Some(w) = &e.sched_waking {
            let tid = w.pid.unwrap_or(0) as u32;
            let Some(a) = acc.get_mut(&tid) else { continue };
            if let Some((State::Blocked(_), _)) = a.state {
                a.close(ts);
                a.state = Some((State::Runnable, ts));
            } else if a.state.is_some() {
                continue;
            } else {
                a.state = Some((State::Runnable, ts));
            }
            let waker = e.pid.unwrap_or(0);
            let name = if e.common_flags.unwrap_or(0) & IRQ_FLAGS != 0 {
                WAKER_INTERRUPT.to_owned()
            } else if waker == 0 {
                "swapper (idle)".to_owned()
            } else {
                let n = log
                    .threads
                    .get(&waker)
                    .and_then(|(_, n)| n.clone())
                    .or_else(|| comms.get(&waker).cloned())
                    .unwrap_or_else(|| "?".to_owned());
                format!("{n} ({waker})")
            };
            *a.wakers.entry(name).or_default() += 1;
        }
    }
    let mut groups: BTreeMap<String, ThreadGroup> = BTreeMap::new();
    let mut waits: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut wakers: BTreeMap<String, HashMap<String, u64>> = BTreeMap::new();
    let mut blocked: BTreeMap<String, HashMap<String, (f64, u64)>> = BTreeMap::new();
    for (tid, mut a) in acc {
        if a.state.is_none() {
            continue;
        }
        a.close(last);
        let (pid, track_name) = log.threads.get(&tid).cloned().unwrap_or((0, None));
        let name = a.comm.clone().or(track_name).unwrap_or_else(|| tid.to_string());
        let row = ThreadRow { tid, pid, ..a.row };
        let g = groups.entry(name.clone()).or_insert_with(|| ThreadGroup {
            name: name.clone(),
            ..Default::default()
        });
        g.total.cpu_ms += row.cpu_ms;
        g.total.runnable_ms += row.runnable_ms;
        g.total.sleeping_ms += row.sleeping_ms;
        g.total.uninterruptible_ms += row.uninterruptible_ms;
        g.total.idle_ms += row.idle_ms;
        g.total.switches += row.switches;
        g.threads.push(row);
        waits.entry(name.clone()).or_default().extend(a.waits);
        let b = blocked.entry(name.clone()).or_default();
        for (k, (ms, n)) in a.blocked {
            let e = b.entry(k).or_default();
            e.0 += ms;
            e.1 += n;
        }
        let w = wakers.entry(name).or_default();
        for (k, n) in a.wakers {
            *w.entry(k).or_default() += n;
        }
    }
    let mut out: Vec<ThreadGroup> = groups
        .into_values()
        .map(|mut g| {
            g.runnable_waits = Stats::of(waits.get(&g.name).map_or(&[][..], Vec::as_slice));
            let mut w: Vec<(String, u64)> = wakers.remove(&g.name).unwrap_or_default().into_iter().collect();
            w.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            w.truncate(TOP_WAKERS);
            g.wakers = w;
            let mut b: Vec<BlockedOn> = blocked
                .remove(&g.name)
                .unwrap_or_default()
                .into_iter()
                .map(|(stack, (blocked_ms, count))| BlockedOn {
                    stack,
                    blocked_ms,
                    count,
                })
                .collect();
            b.sort_by(|x, y| {
                y.blocked_ms
                    .total_cmp(&x.blocked_ms)
                    .then_with(|| x.stack.cmp(&y.stack))
            });
            b.truncate(TOP_BLOCKED);
            g.blocked_on = b;
            g
        })
        .collect();
    out.sort_by(|a, b| {
        b.total
            .cpu_ms
            .total_cmp(&a.total.cpu_ms)
            .then_with(|| a.name.cmp(&b.name))
    });
    Some(ThreadStates {
        groups: out,
        events: log.events.len() as u64,
    })
}

/// The terminal table: one row per thread name (at most `rows`), then its top wakers.
pub(super) fn text(out: &mut String, t: &ThreadStates, rows: usize) {
    let _ = writeln!(
        out,
        "\nthread states ({} scheduler events; ms; wait = runnable → running):",
        t.events
    );
    let _ = writeln!(
        out,
        "  {:<18} {:>4} {:>10} {:>10} {:>9} {:>9} {:>10} {:>10}",
        "thread", "n", "cpu", "runnable", "wait p50", "wait p99", "sleeping", "uninterr."
    );
    let f = |v: Option<f64>| v.map_or("-".to_owned(), |x| format!("{x:.3}"));
    for g in t.groups.iter().take(rows) {
        let _ = writeln!(
            out,
            "  {:<18} {:>4} {:>10.1} {:>10.1} {:>9} {:>9} {:>10.1} {:>10.1}",
            g.name,
            g.threads.len(),
            g.total.cpu_ms,
            g.total.runnable_ms,
            f(g.runnable_waits.p50),
            f(g.runnable_waits.p99),
            g.total.sleeping_ms,
            g.total.uninterruptible_ms
        );
        if !g.wakers.is_empty() {
            let w: Vec<String> = g.wakers.iter().map(|(n, c)| format!("{n} ×{c}")).collect();
            let _ = writeln!(out, "  {:<18} woken by: {}", "", w.join(", "));
        }
        for b in &g.blocked_on {
            let _ = writeln!(
                out,
                "  {:<18} blocked {:.1} ms ×{} in: {}",
                "", b.blocked_ms, b.count, b.stack
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perfetto::schema::{
        SchedBlockedReasonFtraceEvent, SchedSwitchFtraceEvent, SchedWakingFtraceEvent,
    };

    fn sw(ts: u64, prev: i32, state: i64, next: i32) -> (u32, FtraceEvent) {
        let comm = |t: i32| {
            Some(if t == 7 {
                "engine".to_owned()
            } else {
                format!("other{t}")
            })
        };
        (
            0,
            FtraceEvent {
                timestamp: Some(ts),
                pid: Some(prev as u32),
                sched_switch: Some(SchedSwitchFtraceEvent {
                    prev_comm: comm(prev),
                    prev_pid: Some(prev),
                    prev_state: Some(state),
                    next_comm: comm(next),
                    next_pid: Some(next),
                    ..Default::default()
                }),
                ..Default::default()
            },
        )
    }

    fn wake(ts: u64, waker: u32, tid: i32, flags: u32) -> (u32, FtraceEvent) {
        (
            0,
            FtraceEvent {
                timestamp: Some(ts),
                pid: Some(waker),
                common_flags: Some(flags),
                sched_waking: Some(SchedWakingFtraceEvent {
                    pid: Some(tid),
                    ..Default::default()
                }),
                ..Default::default()
            },
        )
    }

    #[test]
    fn a_thread_runs_sleeps_waits_and_is_woken() {
        let ms = 1_000_000;
        let log = SchedLog {
            events: vec![
                sw(0, 9, 0, 7),       // engine on CPU
                sw(10 * ms, 7, 1, 9), // sleeps (S) after 10 ms
                (
                    0,
                    FtraceEvent {
                        timestamp: Some(10 * ms),
                        pid: Some(7),
                        sched_blocked_reason: Some(SchedBlockedReasonFtraceEvent {
                            pid: Some(7),
                            caller: Some(1),
                            io_wait: None,
                        }),
                        ..Default::default()
                    },
                ),
                wake(30 * ms, 9, 7, 0),         // woken by other9 after 20 ms
                sw(32 * ms, 9, 0x100, 7),       // runs after a 2 ms wait
                sw(40 * ms, 7, 0x100, 9),       // preempted after 8 ms
                sw(44 * ms, 9, 0, 7),           // back after 4 ms
                sw(45 * ms, 7, 2, 0),           // D
                wake(50 * ms, 0, 7, IRQ_FLAGS), // an interrupt wakes it
            ],
            threads: [(7, (70, Some("engine".to_owned())))].into(),
            blocked_labels: [(1, "do_nanosleep ← nap".to_owned())].into(),
        };
        let t = analyze(&log).unwrap();
        assert_eq!(t.groups.len(), 1);
        let g = &t.groups[0];
        assert_eq!(g.name, "engine");
        assert_eq!(g.total.cpu_ms, 10.0 + 8.0 + 1.0);
        assert_eq!(g.total.sleeping_ms, 20.0);
        assert_eq!(g.total.uninterruptible_ms, 5.0);
        assert_eq!(
            g.total.runnable_ms,
            2.0 + 4.0,
            "the last state ends at the last event"
        );
        assert_eq!(g.runnable_waits.count, 2);
        assert_eq!(g.runnable_waits.max, Some(4.0));
        assert_eq!(g.total.switches, 3);
        assert_eq!(
            g.wakers,
            vec![("(interrupt)".to_owned(), 1), ("other9 (9)".to_owned(), 1)]
        );
        assert_eq!(
            g.blocked_on,
            vec![BlockedOn {
                stack: "do_nanosleep ← nap".to_owned(),
                blocked_ms: 20.0,
                count: 1
            }],
            "the sleep's 20 ms go to its stack; the D state without a stack to none"
        );
        assert!(analyze(&SchedLog::default()).is_none());
    }
}
