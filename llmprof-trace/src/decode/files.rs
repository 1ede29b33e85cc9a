//! The model-file probes' records: opens of files matching the patterns and the I/O on their fds, each I/O
//! with the path its fd was opened with.

use std::collections::HashMap;

use llmprof_abi::{FileIoEvent, FileOp, FileOpenEvent, read_str};

use super::{Record, read};
use crate::event::EventBody;

impl Record for FileOpenEvent {}
impl Record for FileIoEvent {}

/// The path of each tracked fd, from its open until its close (or its process's exec or exit).
#[derive(Debug, Default)]
pub(super) struct Paths(HashMap<(u32, i32), String>);

impl Paths {
    /// An open by process `pid`: a successful one remembers its fd's path.
    pub(super) fn open(&mut self, pid: u32, b: &[u8]) -> Option<EventBody> {
        let e: FileOpenEvent = read(b)?;
        let path = read_str(&e.path).to_string();
        if e.ret >= 0 {
            self.0.insert((pid, e.ret as i32), path.clone());
        }
        Some(EventBody::FileOpen {
            path,
            ret: e.ret,
            dur_ns: e.dur_ns,
        })
    }

    /// An I/O by process `pid` on a tracked fd, with the fd's path; a close forgets it.
    pub(super) fn io(&mut self, pid: u32, b: &[u8]) -> Option<EventBody> {
        let e: FileIoEvent = read(b)?;
        let op = FileOp::from_raw(e.op)?;
        let key = (pid, e.fd);
        let path = if op == FileOp::Close {
            self.0.remove(&key)
        } else {
            self.0.get(&key).cloned()
        };
        Some(EventBody::FileIo {
            op,
            fd: e.fd,
            path,
            ret: e.ret,
            len: e.len,
            dur_ns: e.dur_ns,
        })
    }

    /// Process `pid` executed a new program or exited: its paths go.
    pub(super) fn forget(&mut self, pid: u32) {
        self.0.retain(|(p, _), _| *p != pid);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests panic with the error")]
mod tests {
    use llmprof_abi::{EventKind, PATH_LEN, ProcessExitEvent, fill_str};

    use super::super::test_records::{NoMachine, bytes, hdr};
    use super::super::{Decoded, Decoder};
    use super::*;

    fn event(d: &mut Decoder, b: &[u8]) -> EventBody {
        match d.decode(b, &mut NoMachine) {
            Decoded::Event(e) => e.body,
            other => panic!("expected an event, got {other:?}"),
        }
    }

    #[test]
    fn file_io_carries_the_path_of_its_open_until_close() {
        let mut d = Decoder::new(vec![]);
        let open = FileOpenEvent {
            hdr: hdr(EventKind::FileOpen),
            ret: 7,
            dur_ns: 1,
            flags: 0,
            _pad: 0,
            path: fill_str::<PATH_LEN>("/m/a.gguf"),
        };
        let ev = event(&mut d, &bytes(&open));
        assert!(matches!(ev, EventBody::FileOpen { ref path, .. } if path == "/m/a.gguf"));
        let io = |op| FileIoEvent {
            hdr: hdr(EventKind::FileIo),
            op: op as u32,
            fd: 7,
            ret: 4096,
            len: 4096,
            dur_ns: 9,
        };
        let ev = event(&mut d, &bytes(&io(FileOp::Read)));
        assert!(
            matches!(ev, EventBody::FileIo { ref path, ret: 4096, .. } if path.as_deref() == Some("/m/a.gguf"))
        );
        event(&mut d, &bytes(&io(FileOp::Close)));
        let ev = event(&mut d, &bytes(&io(FileOp::Read)));
        assert!(matches!(ev, EventBody::FileIo { path: None, .. }));
    }

    #[test]
    fn a_process_exit_forgets_its_paths_and_an_unknown_op_is_invalid() {
        let mut d = Decoder::new(vec![]);
        let open = FileOpenEvent {
            hdr: hdr(EventKind::FileOpen),
            ret: 3,
            dur_ns: 1,
            flags: 0,
            _pad: 0,
            path: fill_str::<PATH_LEN>("/m/b.gguf"),
        };
        event(&mut d, &bytes(&open));
        let exit = ProcessExitEvent {
            hdr: hdr(EventKind::ProcessExit),
            exit_code: 0,
        };
        assert!(matches!(
            event(&mut d, &bytes(&exit)),
            EventBody::ProcessExit { exit_code: 0 }
        ));
        let mut io = FileIoEvent {
            hdr: hdr(EventKind::FileIo),
            op: FileOp::Read as u32,
            fd: 3,
            ret: 1,
            len: 1,
            dur_ns: 1,
        };
        assert!(matches!(
            event(&mut d, &bytes(&io)),
            EventBody::FileIo { path: None, .. }
        ));
        io.op = 77;
        assert!(matches!(d.decode(&bytes(&io), &mut NoMachine), Decoded::Invalid));
        assert_eq!(d.undecodable(), 1);
    }
}
