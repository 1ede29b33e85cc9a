//! Decoding ring-buffer records (the `llmprof_abi` layouts) into [`Event`]s.
//!
//! Owns the record → event conversion and the little state it needs: the path of each tracked model-file
//! fd (from its open) and the egress allow list. Pure code: tested from bytes built in the tests, no kernel.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use llmprof_abi::{
    ConnectEvent, ContentEvent, ContentKind, CudaCallEvent, CudaFunc, CudaVariant, EventHeader, EventKind,
    FileIoEvent, FileOp, FileOpenEvent, ProcessExecEvent, ProcessExitEvent, ProcessStartEvent, RangeEvent,
    RequestEvent, SlowSyscallEvent, StepEvent, read_str,
};

use super::cidr::Cidr;
use llmprof_abi::sched::{SchedSwitchEvent, SchedWakeEvent};
use llmprof_trace::event::{Event, EventBody};

/// AF_INET6 (include/linux/socket.h).
const AF_INET6: u16 = 10;

/// Turns ring records into events; counts what it cannot decode.
#[derive(Debug, Default)]
pub struct Decoder {
    paths: HashMap<(u32, i32), String>,
    allow: Vec<Cidr>,
    undecodable: u64,
}

/// Marker for the `#[repr(C)]` record types of `llmprof_abi`: integers, floats and arrays of them only,
/// so every bit pattern is a valid value.
pub(crate) trait Record: Copy {}
impl Record for EventHeader {}
impl Record for StepEvent {}
impl Record for RequestEvent {}
impl Record for RangeEvent {}
impl Record for SlowSyscallEvent {}
impl Record for FileOpenEvent {}
impl Record for FileIoEvent {}
impl Record for ConnectEvent {}
impl Record for ProcessExitEvent {}
impl Record for ProcessStartEvent {}
impl Record for ProcessExecEvent {}
impl Record for ContentEvent {}
impl Record for CudaCallEvent {}
impl Record for llmprof_abi::cudacount::CudaCountEvent {}
impl Record for llmprof_abi::GpuChunkEvent {}
impl Record for SchedSwitchEvent {}
impl Record for SchedWakeEvent {}
impl Record for llmprof_abi::CpuSampleEvent {}
impl Record for llmprof_abi::HttpEvent {}
impl Record for llmprof_abi::HttpHeadEvent {}

/// The record `T` at the start of `b` (None: too short); the one reader of ring records.
pub(crate) fn read<T: Record>(b: &[u8]) -> Option<T> {
    if b.len() < std::mem::size_of::<T>() {
        return None;
    }
    // SAFETY: the slice holds at least size_of::<T>() bytes, the read is unaligned-safe, and `T: Record`
    // is plain data for which every bit pattern is valid.
    Some(unsafe { std::ptr::read_unaligned(b.as_ptr().cast::<T>()) })
}

/// The kind of a ring record, from its header (None: short record or unknown kind).
pub fn kind(b: &[u8]) -> Option<EventKind> {
    EventKind::from_raw(read::<EventHeader>(b)?.kind)
}

impl Decoder {
    /// A decoder flagging connects outside `allow`.
    pub fn new(allow: Vec<Cidr>) -> Self {
        Self {
            allow,
            ..Self::default()
        }
    }

    /// Counts a record decoded elsewhere (the wire probe's) that was not valid.
    pub fn count_undecodable(&mut self) {
        self.undecodable += 1;
    }

    /// Records that could not be decoded so far (unknown kind, short record).
    pub fn undecodable(&self) -> u64 {
        self.undecodable
    }

    /// Decodes one record; `None` (and counted) if it is not a valid record.
    pub fn decode(&mut self, b: &[u8]) -> Option<Event> {
        let ev = self.decode_inner(b);
        if ev.is_none() {
            self.undecodable += 1;
        }
        ev
    }

    fn decode_inner(&mut self, b: &[u8]) -> Option<Event> {
        let hdr: EventHeader = read(b)?;
        let body = match EventKind::from_raw(hdr.kind)? {
            EventKind::Step => EventBody::Step(Box::new(read::<StepEvent>(b)?.rec)),
            EventKind::Request => EventBody::Request(Box::new(read::<RequestEvent>(b)?.rec)),
            EventKind::Range => EventBody::Range(read::<RangeEvent>(b)?.rec),
            EventKind::SlowSyscall => {
                let e: SlowSyscallEvent = read(b)?;
                EventBody::SlowSyscall {
                    nr: e.nr,
                    ret: e.ret,
                    dur_ns: e.dur_ns,
                }
            }
            EventKind::FileOpen => {
                let e: FileOpenEvent = read(b)?;
                let path = read_str(&e.path).to_string();
                if e.ret >= 0 {
                    self.paths.insert((hdr.pid, e.ret as i32), path.clone());
                }
                EventBody::FileOpen {
                    path,
                    ret: e.ret,
                    dur_ns: e.dur_ns,
                }
            }
            EventKind::FileIo => {
                let e: FileIoEvent = read(b)?;
                let op = FileOp::from_raw(e.op)?;
                let key = (hdr.pid, e.fd);
                let path = if op == FileOp::Close {
                    self.paths.remove(&key)
                } else {
                    self.paths.get(&key).cloned()
                };
                EventBody::FileIo {
                    op,
                    fd: e.fd,
                    path,
                    ret: e.ret,
                    len: e.len,
                    dur_ns: e.dur_ns,
                }
            }
            EventKind::Connect => {
                let e: ConnectEvent = read(b)?;
                let addr = if e.family == AF_INET6 {
                    IpAddr::V6(Ipv6Addr::from(e.addr))
                } else {
                    IpAddr::V4(Ipv4Addr::new(e.addr[0], e.addr[1], e.addr[2], e.addr[3]))
                };
                let allowed = self.allow.iter().any(|c| c.contains(&addr));
                EventBody::Connect {
                    addr,
                    port: e.port,
                    ret: e.ret,
                    dur_ns: e.dur_ns,
                    allowed,
                }
            }
            EventKind::Content => {
                let e: ContentEvent = read(b)?;
                let n = (e.copied as usize).min(e.data.len());
                EventBody::Content {
                    kind: ContentKind::from_raw(e.rec.kind)?,
                    req_id: e.rec.req_id,
                    text: String::from_utf8_lossy(&e.data[..n]).into_owned(),
                    len: e.rec.len,
                }
            }
            // Symbolized by the sampler (`capture::sampling`), never here.
            EventKind::CpuSample | EventKind::OffCpuStack => return None,
            EventKind::ProcessExit => {
                let e: ProcessExitEvent = read(b)?;
                self.paths.retain(|(pid, _), _| *pid != hdr.pid);
                EventBody::ProcessExit {
                    exit_code: e.exit_code,
                }
            }
            EventKind::ProcessStart => {
                let e: ProcessStartEvent = read(b)?;
                EventBody::ProcessStart {
                    ppid: e.ppid,
                    name: read_str(&e.comm).to_owned(),
                    cmdline: String::new(),
                }
            }
            EventKind::ProcessExec => {
                let e: ProcessExecEvent = read(b)?;
                // The old image's fds stay open unless close-on-exec; their paths are forgotten either way
                // (a later read of a kept fd is still shown, without its path).
                self.paths.retain(|(pid, _), _| *pid != hdr.pid);
                let filename = read_str(&e.filename).to_owned();
                let name = filename.rsplit('/').next().unwrap_or_default().to_owned();
                EventBody::ProcessExec {
                    filename,
                    name,
                    cmdline: String::new(),
                }
            }
            EventKind::CudaCall => {
                let e: CudaCallEvent = read(b)?;
                EventBody::CudaCall {
                    func: CudaFunc::from_raw(e.func)?,
                    variant: CudaVariant::from_raw(e.variant)?,
                    dur_ns: e.dur_ns,
                    arg: e.arg,
                    result: e.result,
                }
            }
            EventKind::CudaCount => {
                let e: llmprof_abi::cudacount::CudaCountEvent = read(b)?;
                EventBody::CudaCount {
                    last_ns: e.last_ns,
                    calls: e.calls,
                    bytes: e.bytes,
                }
            }
            // Needs the target's memory to resolve: `Capture` hands these to `pysample` instead.
            EventKind::PyStack => return None,
            // Chunks of GPU activity go to `gpu_activity` (one record, many events).
            EventKind::GpuChunk => return None,
            // The wire probe's records go to `super::http` and the request reconstruction, never here.
            EventKind::Http | EventKind::HttpHead => return None,
            EventKind::SchedSwitch | EventKind::SchedWake => {
                let (pid, tid, body) = if hdr.kind == EventKind::SchedSwitch as u32 {
                    super::sched::switch_event(&read::<SchedSwitchEvent>(b)?)
                } else {
                    super::sched::wake_event(&read::<SchedWakeEvent>(b)?)
                };
                return Some(Event {
                    ts_ns: hdr.ts_ns,
                    pid,
                    tid,
                    body,
                });
            }
        };
        Some(Event {
            ts_ns: hdr.ts_ns,
            pid: hdr.pid,
            tid: hdr.tid,
            body,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests panic with the error")]
mod tests {
    use super::*;
    use llmprof_abi::{PATH_LEN, fill_str};

    fn bytes<T: Record>(v: &T) -> Vec<u8> {
        // SAFETY: reading the bytes of a plain-data value.
        unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>()) }.to_vec()
    }

    fn hdr(kind: EventKind) -> EventHeader {
        EventHeader {
            kind: kind as u32,
            cpu: 0,
            ts_ns: 5,
            pid: 10,
            tid: 11,
        }
    }

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
        let ev = d.decode(&bytes(&start)).unwrap();
        assert_eq!(ev.pid, 10);
        assert!(
            matches!(&ev.body, EventBody::ProcessStart { ppid: 9, name, cmdline } if name == "launcher" && cmdline.is_empty()),
            "{ev:?}"
        );
        let exec = ProcessExecEvent {
            hdr: hdr(EventKind::ProcessExec),
            filename: fill_str::<PATH_LEN>("/usr/bin/llmserve"),
        };
        let ev = d.decode(&bytes(&exec)).unwrap();
        assert!(
            matches!(&ev.body, EventBody::ProcessExec { filename, name, .. } if filename == "/usr/bin/llmserve" && name == "llmserve"),
            "{ev:?}"
        );
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
        let ev = d.decode(&bytes(&open)).unwrap();
        assert!(matches!(ev.body, EventBody::FileOpen { ref path, .. } if path == "/m/a.gguf"));
        let io = |op| FileIoEvent {
            hdr: hdr(EventKind::FileIo),
            op: op as u32,
            fd: 7,
            ret: 4096,
            len: 4096,
            dur_ns: 9,
        };
        let ev = d.decode(&bytes(&io(FileOp::Read))).unwrap();
        assert!(
            matches!(ev.body, EventBody::FileIo { ref path, ret: 4096, .. } if path.as_deref() == Some("/m/a.gguf"))
        );
        d.decode(&bytes(&io(FileOp::Close))).unwrap();
        let ev = d.decode(&bytes(&io(FileOp::Read))).unwrap();
        assert!(matches!(ev.body, EventBody::FileIo { path: None, .. }));
    }

    #[test]
    fn connect_is_flagged_outside_the_allow_list() {
        let mut d = Decoder::new(vec!["10.0.0.0/8".parse().unwrap()]);
        let mut addr = [0u8; 16];
        addr[..4].copy_from_slice(&[127, 0, 0, 1]);
        let c = ConnectEvent {
            hdr: hdr(EventKind::Connect),
            ret: 0,
            dur_ns: 3,
            fd: 4,
            family: 2,
            port: 8080,
            addr,
            allowed: 0,
            _pad: [0; 7],
        };
        let ev = d.decode(&bytes(&c)).unwrap();
        match ev.body {
            EventBody::Connect {
                addr, port, allowed, ..
            } => {
                assert_eq!(addr, IpAddr::V4(Ipv4Addr::LOCALHOST));
                assert_eq!(port, 8080);
                assert!(!allowed);
            }
            other => panic!("expected a connect, got {other:?}"),
        }
        assert_eq!((ev.pid, ev.tid, ev.ts_ns), (10, 11, 5));
    }

    #[test]
    fn cuda_calls_decode_and_unknown_functions_are_counted() {
        let mut d = Decoder::new(vec![]);
        let mut c = CudaCallEvent {
            hdr: hdr(EventKind::CudaCall),
            func: CudaFunc::MemcpyDtoH as u32,
            variant: CudaVariant::V2 as u32,
            dur_ns: 1234,
            arg: 4096,
            result: 0,
            _pad: 0,
        };
        let ev = d.decode(&bytes(&c)).unwrap();
        assert!(matches!(
            ev.body,
            EventBody::CudaCall {
                func: CudaFunc::MemcpyDtoH,
                variant: CudaVariant::V2,
                dur_ns: 1234,
                arg: 4096,
                result: 0
            }
        ));
        c.func = 200;
        assert!(d.decode(&bytes(&c)).is_none());
        assert_eq!(d.undecodable(), 1);
    }

    #[test]
    fn garbage_is_counted_not_decoded() {
        let mut d = Decoder::new(vec![]);
        assert!(d.decode(&[1, 2, 3]).is_none());
        let mut h = bytes(&hdr(EventKind::Step));
        assert!(d.decode(&h).is_none(), "a step header without its record");
        h[0] = 99;
        assert!(d.decode(&h).is_none());
        assert_eq!(d.undecodable(), 3);
    }
}
