//! The scheduler probes' records: a context switch involving a traced thread, and a wakeup of one.

use llmprof_abi::sched::{
    SchedSwitchEvent, SchedWakeEvent, TRACE_FLAG_HARDIRQ, TRACE_FLAG_SOFTIRQ, WAKE_NEW,
};

use super::{Record, read};
use crate::event::sched::comm_str;
use crate::event::{Event, EventBody, SchedSwitch, SchedWake};

impl Record for SchedSwitchEvent {}
impl Record for SchedWakeEvent {}

/// A switch record's event; its pid/tid are the traced process's and thread's (prev when traced, else next).
pub(super) fn switch(b: &[u8]) -> Option<Event> {
    let e: SchedSwitchEvent = read(b)?;
    let hdr = &e.hdr;
    let prev_traced = e.prev_traced != 0;
    let (pid, tid) = if prev_traced {
        (hdr.pid, hdr.tid)
    } else {
        (e.next_pid, e.next_tid)
    };
    let body = EventBody::SchedSwitch(Box::new(SchedSwitch {
        cpu: hdr.cpu,
        prev_tid: hdr.tid,
        prev_pid: hdr.pid,
        prev_traced,
        prev_comm: comm_str(&e.prev_comm),
        prev_prio: e.prev_prio,
        prev_state: e.prev_state,
        next_tid: e.next_tid,
        next_pid: e.next_pid,
        next_comm: comm_str(&e.next_comm),
        next_prio: e.next_prio,
        stack_id: (e.stack_id >= 0).then_some(e.stack_id),
    }));
    Some(Event {
        ts_ns: hdr.ts_ns,
        pid,
        tid,
        body,
    })
}

/// A wakeup record's event; its pid/tid are the woken thread's (the waker is in the body).
pub(super) fn wake(b: &[u8]) -> Option<Event> {
    let e: SchedWakeEvent = read(b)?;
    let body = EventBody::SchedWake(Box::new(SchedWake {
        cpu: e.hdr.cpu,
        waker_tid: e.hdr.tid,
        waker_pid: e.hdr.pid,
        tid: e.tid,
        pid: e.pid,
        comm: comm_str(&e.comm),
        prio: e.prio,
        target_cpu: e.target_cpu,
        new_task: e.flags & WAKE_NEW != 0,
        in_interrupt: e.common_flags & (TRACE_FLAG_HARDIRQ | TRACE_FLAG_SOFTIRQ) != 0,
        common_flags: e.common_flags,
    }));
    Some(Event {
        ts_ns: e.hdr.ts_ns,
        pid: e.pid,
        tid: e.tid,
        body,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests panic with the error")]
mod tests {
    use llmprof_abi::sched::NO_STACK;
    use llmprof_abi::{EventKind, fill_str};

    use super::super::Decoder;
    use super::super::test_records::{bytes, event, hdr};
    use super::*;

    fn switch_from(prev_traced: u32) -> SchedSwitchEvent {
        SchedSwitchEvent {
            hdr: hdr(EventKind::SchedSwitch),
            prev_state: 2,
            next_tid: 21,
            next_pid: 20,
            prev_prio: 120,
            next_prio: 100,
            prev_comm: fill_str("worker"),
            next_comm: fill_str("other"),
            stack_id: NO_STACK,
            prev_traced,
            _pad: 0,
        }
    }

    #[test]
    fn a_switch_belongs_to_the_traced_side() {
        let ev = event(&mut Decoder::new(vec![]), &bytes(&switch_from(1)));
        assert_eq!((ev.pid, ev.tid, ev.ts_ns), (10, 11, 5));
        let EventBody::SchedSwitch(s) = &ev.body else {
            panic!("{ev:?}")
        };
        assert!(s.prev_traced && s.prev_comm == "worker" && s.next_comm == "other" && s.prev_state == 2);
        assert_eq!((s.prev_pid, s.prev_tid, s.next_pid, s.next_tid), (10, 11, 20, 21));
        assert_eq!(s.stack_id, None);
        let ev = event(&mut Decoder::new(vec![]), &bytes(&switch_from(0)));
        assert_eq!(
            (ev.pid, ev.tid),
            (20, 21),
            "the thread coming on is the traced one"
        );
    }

    #[test]
    fn a_wakeup_belongs_to_the_woken_thread() {
        let w = SchedWakeEvent {
            hdr: hdr(EventKind::SchedWake),
            tid: 31,
            pid: 30,
            prio: 120,
            target_cpu: 3,
            comm: fill_str("sleeper"),
            flags: WAKE_NEW,
            common_flags: TRACE_FLAG_SOFTIRQ,
        };
        let ev = event(&mut Decoder::new(vec![]), &bytes(&w));
        assert_eq!((ev.pid, ev.tid), (30, 31));
        let EventBody::SchedWake(s) = &ev.body else {
            panic!("{ev:?}")
        };
        assert!(s.new_task && s.in_interrupt && s.comm == "sleeper");
        assert_eq!((s.waker_pid, s.waker_tid, s.target_cpu), (10, 11, 3));
    }
}
