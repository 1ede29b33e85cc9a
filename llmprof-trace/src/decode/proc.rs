//! The process probes' records: a traced process started a process, executed a program, or exited (the
//! command lines are read from `/proc` by capture, never here).

use llmprof_abi::{ProcessExecEvent, ProcessExitEvent, ProcessStartEvent, read_str};

use super::{Record, read};
use crate::event::EventBody;

impl Record for ProcessExitEvent {}
impl Record for ProcessStartEvent {}
impl Record for ProcessExecEvent {}

/// A new process, named by its parent's comm.
pub(super) fn start(b: &[u8]) -> Option<EventBody> {
    let e: ProcessStartEvent = read(b)?;
    Some(EventBody::ProcessStart {
        ppid: e.ppid,
        name: read_str(&e.comm).to_owned(),
        cmdline: String::new(),
    })
}

/// A program executed, named by its file's last component.
pub(super) fn exec(b: &[u8]) -> Option<EventBody> {
    let e: ProcessExecEvent = read(b)?;
    let filename = read_str(&e.filename).to_owned();
    let name = filename.rsplit('/').next().unwrap_or_default().to_owned();
    Some(EventBody::ProcessExec {
        filename,
        name,
        cmdline: String::new(),
    })
}

/// A process exit.
pub(super) fn exit(b: &[u8]) -> Option<EventBody> {
    let e: ProcessExitEvent = read(b)?;
    Some(EventBody::ProcessExit {
        exit_code: e.exit_code,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests panic with the error")]
mod tests {
    use llmprof_abi::{EventKind, PATH_LEN, fill_str};

    use super::super::test_records::{NoMachine, bytes, hdr};
    use super::super::{Decoded, Decoder};
    use super::*;

    #[test]
    fn process_start_and_exec_decode_with_parent_comm_and_file_name() {
        let mut d = Decoder::new(vec![]);
        let start = ProcessStartEvent {
            hdr: hdr(EventKind::ProcessStart),
            ppid: 9,
            parent_tid: 12,
            clone_flags: 17,
            comm: fill_str("launcher"),
        };
        let Decoded::Event(ev) = d.decode(&bytes(&start), &mut NoMachine) else {
            panic!("expected an event");
        };
        assert_eq!(ev.pid, 10);
        assert!(
            matches!(&ev.body, EventBody::ProcessStart { ppid: 9, name, cmdline } if name == "launcher" && cmdline.is_empty()),
            "{ev:?}"
        );
        let exec = ProcessExecEvent {
            hdr: hdr(EventKind::ProcessExec),
            filename: fill_str::<PATH_LEN>("/usr/bin/llmserve"),
        };
        let Decoded::Event(ev) = d.decode(&bytes(&exec), &mut NoMachine) else {
            panic!("expected an event");
        };
        assert!(
            matches!(&ev.body, EventBody::ProcessExec { filename, name, .. } if filename == "/usr/bin/llmserve" && name == "llmserve"),
            "{ev:?}"
        );
    }
}
