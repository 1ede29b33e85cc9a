//! The syscall probe's records: a syscall slower than the threshold (the others are counted in the kernel).

use llmprof_abi::SlowSyscallEvent;

use super::{Record, read};
use crate::event::EventBody;

impl Record for SlowSyscallEvent {}

/// A slow syscall.
pub(super) fn slow(b: &[u8]) -> Option<EventBody> {
    let e: SlowSyscallEvent = read(b)?;
    Some(EventBody::SlowSyscall {
        nr: e.nr,
        ret: e.ret,
        dur_ns: e.dur_ns,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests panic with the error")]
mod tests {
    use llmprof_abi::EventKind;

    use super::super::test_records::{NoMachine, bytes, hdr};
    use super::super::{Decoded, Decoder};
    use super::*;

    #[test]
    fn a_slow_syscall_keeps_number_result_and_duration() {
        let e = SlowSyscallEvent {
            hdr: hdr(EventKind::SlowSyscall),
            nr: 0,
            ret: -11,
            dur_ns: 2_000_000,
        };
        let mut d = Decoder::new(vec![]);
        let Decoded::Event(ev) = d.decode(&bytes(&e), &mut NoMachine) else {
            panic!("expected an event");
        };
        assert_eq!((ev.pid, ev.tid, ev.ts_ns), (10, 11, 5));
        assert!(
            matches!(
                ev.body,
                EventBody::SlowSyscall {
                    nr: 0,
                    ret: -11,
                    dur_ns: 2_000_000
                }
            ),
            "{ev:?}"
        );
        let b = bytes(&e);
        assert!(matches!(
            d.decode(&b[..b.len() - 1], &mut NoMachine),
            Decoded::Invalid
        ));
    }
}
