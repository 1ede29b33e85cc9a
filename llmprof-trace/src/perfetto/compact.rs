//! Perfetto's `compact_sched` encoding of thread states, both ways: [`CompactBuilder`] packs one CPU's
//! sched_switch and sched_waking events into a [`CompactSched`] (what the sink writes), [`Expander`] turns a
//! bundle back into full [`FtraceEvent`]s (what `llmprof report` reads), with the trace processor's rules.
//!
//! The compact form has no `prev` side of a switch and no waker of a waking: the trace processor takes both
//! from the previous switch on that CPU (the thread it put there). A compact event is therefore only right when
//! that previous switch is in the trace and its `next` is who really ran — which the sink guarantees for the
//! switches it writes (each `prev` is the previous switch's `next` on the CPU, untraced hand-overs included) and
//! checks for each waking (compact only when the waker is the thread its last switch put on that CPU; a full
//! event otherwise, and for a CPU's first switch). A switch costs ~6–10 bytes instead of ~60, a waking ~8
//! instead of ~45.

use std::collections::HashMap;

use super::schema::{
    CompactSched, FtraceEvent, FtraceEventBundle, SchedSwitchFtraceEvent, SchedWakingFtraceEvent,
};

/// One CPU's events being packed: the arrays and the comm intern table.
#[derive(Debug, Default)]
pub struct CompactBuilder {
    out: CompactSched,
    comms: HashMap<String, u32>,
    last_switch_ts: u64,
    last_waking_ts: u64,
}

impl CompactBuilder {
    fn comm(&mut self, comm: &str) -> u32 {
        if let Some(&i) = self.comms.get(comm) {
            return i;
        }
        let i = self.out.intern_table.len() as u32;
        self.out.intern_table.push(comm.to_owned());
        self.comms.insert(comm.to_owned(), i);
        i
    }

    /// A switch at `ts` (not before the previous one) from the CPU's current thread, in `prev_state`, to `next`
    /// (tid, comm, prio).
    pub fn switch(&mut self, ts: u64, prev_state: i64, next: (u32, &str, i32)) {
        let c = self.comm(next.1);
        let o = &mut self.out;
        o.switch_timestamp.push(ts.saturating_sub(self.last_switch_ts));
        o.switch_prev_state.push(prev_state);
        o.switch_next_pid.push(next.0 as i32);
        o.switch_next_prio.push(next.2);
        o.switch_next_comm_index.push(c);
        self.last_switch_ts = ts;
    }

    /// A waking at `ts` (not before the previous one) by the CPU's current thread of `tid` (comm, prio) towards
    /// `target_cpu`.
    pub fn waking(&mut self, ts: u64, tid: u32, comm: &str, prio: i32, target_cpu: i32, common_flags: u32) {
        let c = self.comm(comm);
        let o = &mut self.out;
        o.waking_timestamp.push(ts.saturating_sub(self.last_waking_ts));
        o.waking_pid.push(tid as i32);
        o.waking_target_cpu.push(target_cpu);
        o.waking_prio.push(prio);
        o.waking_comm_index.push(c);
        o.waking_common_flags.push(common_flags);
        self.last_waking_ts = ts;
    }

    /// Events packed so far.
    pub fn len(&self) -> usize {
        self.out.switch_timestamp.len() + self.out.waking_timestamp.len()
    }

    /// Whether nothing is packed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The packed events (`None` when there are none); the builder starts over.
    pub fn take(&mut self) -> Option<CompactSched> {
        let out = std::mem::take(self).out;
        (!out.switch_timestamp.is_empty() || !out.waking_timestamp.is_empty()).then_some(out)
    }
}

/// The thread a CPU's last switch put there: (tid, comm, prio).
type Current = (i32, String, i32);

/// Expands bundles back into full events, CPU by CPU in file order (bundles of one CPU are written in time
/// order), keeping each CPU's current thread as the trace processor does.
#[derive(Debug, Default)]
pub struct Expander {
    current: HashMap<u32, Current>,
}

impl Expander {
    /// The events of `bundle` (CPU `cpu`), full ones and expanded compact ones, in time order. A compact waking
    /// on a CPU with no switch seen yet is dropped, as the trace processor drops it.
    pub fn expand(&mut self, cpu: u32, bundle: FtraceEventBundle) -> Vec<FtraceEvent> {
        let mut items: Vec<(u64, u8, FtraceEvent)> = Vec::new();
        let mut full = bundle.event;
        full.sort_by_key(|e| e.timestamp.unwrap_or(0));
        let c = bundle.compact_sched.unwrap_or_default();
        let comm = |i: u32| c.intern_table.get(i as usize).cloned().unwrap_or_default();
        // Compact events carry no prev/waker: they are resolved below, in time order with the full ones.
        let mut ts = 0u64;
        for i in 0..c.switch_timestamp.len() {
            ts = ts.saturating_add(c.switch_timestamp[i]);
            let e = FtraceEvent {
                timestamp: Some(ts),
                sched_switch: Some(SchedSwitchFtraceEvent {
                    prev_state: c.switch_prev_state.get(i).copied(),
                    next_pid: c.switch_next_pid.get(i).copied(),
                    next_prio: c.switch_next_prio.get(i).copied(),
                    next_comm: c.switch_next_comm_index.get(i).map(|&x| comm(x)),
                    ..Default::default()
                }),
                ..Default::default()
            };
            items.push((ts, 1, e));
        }
        let mut ts = 0u64;
        for i in 0..c.waking_timestamp.len() {
            ts = ts.saturating_add(c.waking_timestamp[i]);
            let e = FtraceEvent {
                timestamp: Some(ts),
                common_flags: c.waking_common_flags.get(i).copied(),
                sched_waking: Some(SchedWakingFtraceEvent {
                    pid: c.waking_pid.get(i).copied(),
                    prio: c.waking_prio.get(i).copied(),
                    target_cpu: c.waking_target_cpu.get(i).copied(),
                    comm: c.waking_comm_index.get(i).map(|&x| comm(x)),
                    success: Some(1),
                }),
                ..Default::default()
            };
            items.push((ts, 1, e));
        }
        items.extend(full.into_iter().map(|e| (e.timestamp.unwrap_or(0), 0, e)));
        // Stable: at one instant a full event (the sink writes a CPU's first switch full) comes first.
        items.sort_by_key(|(ts, compact, _)| (*ts, *compact));
        let mut out = Vec::with_capacity(items.len());
        for (_, compact, mut e) in items {
            let cur = self.current.get(&cpu).cloned();
            if let Some(s) = e.sched_switch.as_mut() {
                if compact == 1 {
                    let Some((pid, comm, prio)) = cur else {
                        // The CPU's first switch, compact: its prev is unknown (the trace processor starts the
                        // CPU there too).
                        self.current.insert(cpu, next_of(s));
                        continue;
                    };
                    s.prev_pid = Some(pid);
                    s.prev_comm = Some(comm);
                    s.prev_prio = Some(prio);
                    e.pid = Some(pid as u32);
                }
                self.current.insert(cpu, next_of(s));
            } else if e.sched_waking.is_some() && compact == 1 {
                let Some((pid, _, _)) = cur else { continue };
                e.pid = Some(pid as u32);
            }
            out.push(e);
        }
        out
    }
}

fn next_of(s: &SchedSwitchFtraceEvent) -> Current {
    (
        s.next_pid.unwrap_or(0),
        s.next_comm.clone().unwrap_or_default(),
        s.next_prio.unwrap_or(0),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests {
    use prost::Message;

    use super::*;

    fn full_switch(ts: u64, prev: i32, next: i32, next_comm: &str) -> FtraceEvent {
        FtraceEvent {
            timestamp: Some(ts),
            pid: Some(prev as u32),
            sched_switch: Some(SchedSwitchFtraceEvent {
                prev_comm: Some("swapper/0".into()),
                prev_pid: Some(prev),
                prev_prio: Some(120),
                prev_state: Some(0),
                next_comm: Some(next_comm.into()),
                next_pid: Some(next),
                next_prio: Some(120),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn packed_events_read_back_with_prev_and_waker_from_the_cpus_last_switch() {
        let mut b = CompactBuilder::default();
        b.switch(1_000_100, 1, (11, "python", 120));
        b.waking(1_000_150, 12, "python", 120, 1, 4);
        b.switch(1_000_300, 0, (12, "python", 120));
        b.switch(1_002_000, 1, (0, "swapper/1", 120));
        assert_eq!(b.len(), 4);
        let compact = b.take().unwrap();
        assert!(b.is_empty());
        assert_eq!(compact.intern_table, ["python", "swapper/1"]);
        // Deltas: the first from 0, then from the previous switch.
        assert_eq!(compact.switch_timestamp, [1_000_100, 200, 1_700]);
        let bundle = FtraceEventBundle {
            cpu: Some(1),
            // The CPU's first switch is a full event: 5 → 10.
            event: vec![full_switch(1_000_000, 5, 10, "engine")],
            compact_sched: Some(compact),
        };
        let bytes = bundle.encode_to_vec();
        let mut x = Expander::default();
        let evs = x.expand(1, FtraceEventBundle::decode(bytes.as_slice()).unwrap());
        let sw: Vec<(i32, i32)> = evs
            .iter()
            .filter_map(|e| e.sched_switch.as_ref())
            .map(|s| (s.prev_pid.unwrap(), s.next_pid.unwrap()))
            .collect();
        assert_eq!(sw, [(5, 10), (10, 11), (11, 12), (12, 0)]);
        let waking = evs.iter().find(|e| e.sched_waking.is_some()).unwrap();
        assert_eq!(waking.pid, Some(11), "the waker is the thread on the CPU");
        assert_eq!(waking.timestamp, Some(1_000_150));
        assert_eq!(waking.common_flags, Some(4));
        // The next bundle of this CPU continues from its last switch.
        let mut b = CompactBuilder::default();
        b.switch(1_003_000, 0, (13, "python", 120));
        let evs = x.expand(
            1,
            FtraceEventBundle {
                cpu: Some(1),
                event: Vec::new(),
                compact_sched: b.take(),
            },
        );
        let s = evs[0].sched_switch.as_ref().unwrap();
        assert_eq!((s.prev_pid, s.prev_comm.as_deref()), (Some(0), Some("swapper/1")));
        // A compact waking on a CPU never switched is dropped, as the trace processor drops it.
        let mut b = CompactBuilder::default();
        b.waking(5, 1, "x", 120, 0, 0);
        let evs = x.expand(
            0,
            FtraceEventBundle {
                cpu: Some(0),
                event: Vec::new(),
                compact_sched: b.take(),
            },
        );
        assert!(evs.is_empty());
    }
}
