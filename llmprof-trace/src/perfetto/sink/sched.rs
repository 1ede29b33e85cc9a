//! Thread states in Perfetto's own ftrace encoding: `sched_switch` and `sched_waking` events in one
//! `FtraceEventBundle` per CPU, from which Perfetto UI draws its native thread-state rows (Running, Runnable,
//! Sleeping, Uninterruptible) and the trace processor fills `thread_state` (with `waker_utid` from the waking
//! events) and `sched` (the CPU tracks).
//!
//! Encoding: Perfetto's `compact_sched` ([`crate::perfetto::compact`]; ~6–10 bytes a switch instead of ~60)
//! wherever its implied sides are right: a switch whose CPU has a recorded current thread (its `prev` is
//! always written as that thread, see `sched_switch`), a waking whose waker is the thread the CPU's last
//! switch put there. A CPU's first switch, and a waking by a thread llmprof did not see go on the CPU (an
//! untraced waker that replaced an untraced thread unseen), are full events that name both sides.
//!
//! Thread identity: a traced thread that appears in these events also gets its thread track descriptor
//! (pid + tid) before its first bundle, so the trace processor files the ftrace thread (known by tid only)
//! under the right process: one `thread` row per tid, shared with the slices llmprof writes on that thread.
//! Threads of other processes (what ran before or after a traced thread on a CPU) appear by tid and comm only.
//!
//! Events wait in a per-CPU buffer of at most [`BUNDLE_EVENTS`] and are written as a bundle when it is full,
//! on [`TraceSink::flush_sched`] and at the end. A `SystemInfo` packet with the kernel release (set with
//! [`TraceSink::note_kernel_release`]) precedes the first bundle: without it the trace processor reads
//! `prev_state` with the rules of a 4.4 kernel; when no release was given, the preempted bit is cleared so the
//! state still reads Runnable.
//!
//! Off-CPU stacks ([`crate::event::stacks::offcpu`]) go in the same bundles as `sched_blocked_reason` events right after
//! the switch-out they belong to, their label interned as a `kernel_symbols` string of the packet sequence:
//! the trace processor's `thread_state.blocked_function`, "Blocked function" in Perfetto UI.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Write};

use super::TraceSink;
use crate::event::Event;
use crate::event::sched::{PREEMPTED, SchedSwitch, SchedWake};
use crate::event::stacks::CpuSample;
use crate::perfetto::compact::CompactBuilder;
use crate::perfetto::schema::{
    FtraceEvent, FtraceEventBundle, InternedData, InternedString, SchedBlockedReasonFtraceEvent,
    SchedSwitchFtraceEvent, SchedWakingFtraceEvent, SystemInfo, TracePacket, Utsname,
};

/// Event-count name of the switches written to mend a switch the kernel did not report (see `sched_switch`).
pub const REPAIRED: &str = "sched_switch_repaired";

/// A `sched_switch` FtraceEvent at `ts` from `prev` (tid, comm, prio) in `prev_state` to `next` (tid, comm, prio).
fn switch_event(ts: u64, prev: (u32, String, i32), prev_state: i64, next: (u32, String, i32)) -> FtraceEvent {
    FtraceEvent {
        timestamp: Some(ts),
        pid: Some(prev.0),
        sched_switch: Some(SchedSwitchFtraceEvent {
            prev_comm: Some(prev.1),
            prev_pid: Some(prev.0 as i32),
            prev_prio: Some(prev.2),
            prev_state: Some(prev_state),
            next_comm: Some(next.1),
            next_pid: Some(next.0 as i32),
            next_prio: Some(next.2),
        }),
        ..Default::default()
    }
}

/// Most events held per CPU before its bundle is written (bounds memory; a bundle of 1024 compact switches is
/// ~8 KB).
pub const BUNDLE_EVENTS: usize = 1024;

/// One CPU's events waiting for their bundle: full events and the compact arrays.
#[derive(Debug, Default)]
struct CpuBuf {
    events: Vec<FtraceEvent>,
    compact: CompactBuilder,
}

impl CpuBuf {
    fn len(&self) -> usize {
        self.events.len() + self.compact.len()
    }
}

/// The thread that went on a CPU at the last recorded switch there: (tid, comm, prio, traced), and when.
type OnCpu = (u32, String, i32, bool, u64);

/// The sink's thread-state state: buffered events per CPU, the untraced thread each CPU last switched to,
/// and whether the system info is out.
#[derive(Debug, Default)]
pub(super) struct SchedState {
    per_cpu: BTreeMap<u32, CpuBuf>,
    on_cpu: BTreeMap<u32, OnCpu>,
    kernel_release: Option<String>,
    system_info_written: bool,
    /// Off-CPU stack labels interned as `kernel_symbols` (label → iid; the sequence's own numbering).
    blocked_labels: HashMap<String, u64>,
    /// Labels interned since the last bundle: they go out with the next bundle written (of any CPU: all
    /// packets share one sequence, and the event naming them is in this or a later bundle).
    pending_labels: Vec<InternedString>,
}

impl<W: Write> TraceSink<W> {
    /// The kernel release of the traced machine (`uname -r`), written before the first thread-state bundle
    /// so the trace processor decodes `prev_state` right.
    pub fn note_kernel_release(&mut self, release: &str) {
        self.sched.kernel_release = Some(release.trim().to_owned());
    }

    /// A context switch: the traced side(s) get their thread track, the event waits in its CPU's bundle.
    ///
    /// Only switches that involve a traced thread are recorded, so between a traced thread's switch-out to an
    /// untraced X and the next switch-in of a traced thread from an untraced Y, other untraced threads may
    /// have run. The trace processor checks that a switch's `prev` is the previous switch's `next` on the
    /// CPU (`mismatched_sched_switch_tids`, an import error otherwise): an untraced `prev` is written as X,
    /// the untraced thread llmprof saw go on that CPU, so the CPU track shows X for the whole interval. When
    /// the kernel skipped a switch of a traced thread (see [`REPAIRED`]), the missing hand-over is written.
    pub(super) fn sched_switch(&mut self, ev: &Event, s: &SchedSwitch) -> io::Result<()> {
        if s.prev_traced {
            // The thread is on the CPU: its comm is current (a new thread is renamed after it starts).
            self.thread_names
                .entry(s.prev_tid)
                .or_insert_with(|| s.prev_comm.clone());
            self.thread_track(s.prev_pid, s.prev_tid)?;
        }
        if s.next_pid != 0 {
            self.thread_track(s.next_pid, s.next_tid)?;
        }
        let ts = ev.ts_ns;
        let (prev_tid, prev_comm, prev_prio) = match self.sched.on_cpu.get(&s.cpu).cloned() {
            Some((tid, comm, prio, false, _)) if !s.prev_traced && tid != s.prev_tid => (tid, comm, prio),
            Some((tid, comm, prio, _, at)) if tid != s.prev_tid => {
                // A switch the kernel did not run the program for (a tracing program is skipped when it would
                // nest in another on that CPU): the traced thread got on the CPU (or off it) unseen. The
                // hand-over is written at the last moment it can have happened, so the trace processor's
                // per-CPU sequence holds and no running time is invented; counted as `sched_switch_repaired`.
                self.count(REPAIRED);
                let _ = (comm, prio);
                let at = ts.saturating_sub(1).max(at);
                let buf = self.sched.per_cpu.entry(s.cpu).or_default();
                buf.compact.switch(at, 0, (s.prev_tid, &s.prev_comm, s.prev_prio));
                (s.prev_tid, s.prev_comm.clone(), s.prev_prio)
            }
            _ => (s.prev_tid, s.prev_comm.clone(), s.prev_prio),
        };
        // The CPU's current thread is known: this switch's prev is it (see above), the compact form implies it.
        let implied = self
            .sched
            .on_cpu
            .insert(
                s.cpu,
                (s.next_tid, s.next_comm.clone(), s.next_prio, s.next_pid != 0, ts),
            )
            .is_some();
        let prev_state = if self.sched.kernel_release.is_some() {
            s.prev_state
        } else {
            s.prev_state & !PREEMPTED
        };
        if implied {
            let buf = self.sched.per_cpu.entry(s.cpu).or_default();
            buf.compact
                .switch(ts, prev_state, (s.next_tid, &s.next_comm, s.next_prio));
            return self.bundle_if_full(s.cpu);
        }
        let next = (s.next_tid, s.next_comm.clone(), s.next_prio);
        let fe = switch_event(ts, (prev_tid, prev_comm, prev_prio), prev_state, next);
        self.buffer_ftrace(s.cpu, fe)
    }

    /// A wakeup of a traced thread (the FtraceEvent's pid is the waker, as the kernel's ftrace writes it).
    pub(super) fn sched_wake(&mut self, ev: &Event, w: &SchedWake) -> io::Result<()> {
        self.thread_track(w.pid, w.tid)?;
        // Compact when the waker is the thread the CPU's last recorded switch put there (what it implies).
        if self.sched.on_cpu.get(&w.cpu).is_some_and(|c| c.0 == w.waker_tid) {
            let buf = self.sched.per_cpu.entry(w.cpu).or_default();
            buf.compact
                .waking(ev.ts_ns, w.tid, &w.comm, w.prio, w.target_cpu, w.common_flags);
            return self.bundle_if_full(w.cpu);
        }
        let fe = FtraceEvent {
            timestamp: Some(ev.ts_ns),
            pid: Some(w.waker_tid),
            common_flags: Some(w.common_flags),
            sched_waking: Some(SchedWakingFtraceEvent {
                comm: Some(w.comm.clone()),
                pid: Some(w.tid as i32),
                prio: Some(w.prio),
                success: Some(1),
                target_cpu: Some(w.target_cpu),
            }),
            ..Default::default()
        };
        self.buffer_ftrace(w.cpu, fe)
    }

    /// The stack of a traced thread that just blocked (it follows the thread's switch-out at the same time):
    /// a `sched_blocked_reason` naming its label ([`crate::event::stacks::offcpu::label`]) after that switch in the CPU's
    /// bundle, so the trace processor sets `blocked_function` on the Sleeping/Uninterruptible row it opened.
    pub(super) fn offcpu_stack(&mut self, ev: &Event, s: &CpuSample) -> io::Result<()> {
        let label = crate::event::stacks::offcpu::label(&s.frames);
        let next = self.sched.blocked_labels.len() as u64 + 1;
        let iid = *self.sched.blocked_labels.entry(label.clone()).or_insert_with(|| {
            self.sched.pending_labels.push(InternedString {
                iid: Some(next),
                name: Some(label),
            });
            next
        });
        let fe = FtraceEvent {
            timestamp: Some(ev.ts_ns),
            pid: Some(ev.tid),
            sched_blocked_reason: Some(SchedBlockedReasonFtraceEvent {
                pid: Some(ev.tid as i32),
                caller: Some(iid),
                io_wait: None,
            }),
            ..Default::default()
        };
        self.buffer_ftrace(s.cpu, fe)
    }

    fn buffer_ftrace(&mut self, cpu: u32, fe: FtraceEvent) -> io::Result<()> {
        self.sched.per_cpu.entry(cpu).or_default().events.push(fe);
        self.bundle_if_full(cpu)
    }

    /// Writes `cpu`'s bundle when it holds [`BUNDLE_EVENTS`].
    fn bundle_if_full(&mut self, cpu: u32) -> io::Result<()> {
        let full = self
            .sched
            .per_cpu
            .get(&cpu)
            .is_some_and(|b| b.len() >= BUNDLE_EVENTS);
        if full && let Some(buf) = self.sched.per_cpu.get_mut(&cpu).map(std::mem::take) {
            self.write_bundle(cpu, buf)?;
        }
        Ok(())
    }

    /// Writes every buffered thread-state event (one bundle per CPU that has some).
    pub fn flush_sched(&mut self) -> io::Result<()> {
        let cpus: Vec<u32> = self.sched.per_cpu.keys().copied().collect();
        for cpu in cpus {
            let buf = self
                .sched
                .per_cpu
                .get_mut(&cpu)
                .map(std::mem::take)
                .unwrap_or_default();
            if buf.len() > 0 {
                self.write_bundle(cpu, buf)?;
            }
        }
        Ok(())
    }

    fn write_bundle(&mut self, cpu: u32, mut buf: CpuBuf) -> io::Result<()> {
        if !self.sched.system_info_written {
            self.sched.system_info_written = true;
            if let Some(release) = self.sched.kernel_release.clone() {
                self.w.write(TracePacket {
                    system_info: Some(SystemInfo {
                        utsname: Some(Utsname {
                            sysname: Some("Linux".to_owned()),
                            release: Some(release),
                        }),
                    }),
                    ..Default::default()
                })?;
            }
        }
        let labels = std::mem::take(&mut self.sched.pending_labels);
        self.w.write(TracePacket {
            ftrace_events: Some(FtraceEventBundle {
                cpu: Some(cpu),
                event: buf.events,
                compact_sched: buf.compact.take(),
            }),
            interned_data: (!labels.is_empty()).then(|| InternedData {
                kernel_symbols: labels,
                ..Default::default()
            }),
            ..Default::default()
        })
    }
}
