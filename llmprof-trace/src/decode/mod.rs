//! Ring-buffer records (the `llmprof_abi` layouts) decoded into [`Event`]s: one file per probe family, and
//! [`Decoder`] dispatching each record to its family by the [`EventKind`] in its header.
//!
//! Owns the bytes → event conversion of every family and the state it needs (the path of each tracked
//! model-file fd, the egress allow list, the GPU chunks' per-process names), and the count of records it
//! could not decode. Pure: capture hands it each record's bytes; what only the machine can add (the symbols of
//! a native stack, the Python frames read from a target's memory) comes in through [`Resolve`]. Tested from
//! records built with the ABI types, without root.

pub mod cuda;
pub mod cupti;
pub mod egress;
pub mod engine;
pub mod files;
pub mod proc;
pub mod python;
pub mod sched;
pub mod stacks;
pub mod syscalls;
pub mod wire;

use llmprof_abi::python::PyStack;
use llmprof_abi::{CpuSampleEvent, EventHeader, EventKind};

use crate::decode::wire::requests::WireRecord;
use crate::event::cupti::GpuStats;
use crate::event::python::PyStackSample;
use crate::event::stacks::CpuSample;
use crate::event::{Event, EventBody};
use egress::Cidr;

/// Marker for the `#[repr(C)]` record types of `llmprof_abi`: integers, floats and arrays of them only, so
/// every bit pattern is a valid value (each family's file marks its own records).
pub(crate) trait Record: Copy {}
impl Record for EventHeader {}

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

/// What only the machine running the capture can add to a record (capture implements it).
pub trait Resolve {
    /// The symbolized frames of a native stack record (an on-CPU sample or an off-CPU stack); `None` drops
    /// the record (no sampler runs, or the sample is llmprof's own).
    fn native_stack(&mut self, rec: &CpuSampleEvent) -> Option<CpuSample>;
    /// The Python frames of a kernel walk of process `pid`'s stack, read from its memory; `None` when `pid` is
    /// not a sampled Python process.
    fn python_stack(&mut self, pid: u32, stack: &PyStack) -> Option<PyStackSample>;
}

/// What one record became.
#[derive(Debug)]
pub enum Decoded {
    /// An event to hand out as it is.
    Event(Event),
    /// A native stack (an on-CPU sample or an off-CPU stack): the Python stack the kernel writes for the same
    /// instant comes in a later record and is spliced into its frames ([`python::splice_or_push`]).
    Stack(Event),
    /// A Python stack: spliced into the native stack of the same instant, or an event of its own.
    PyStack(Event),
    /// The events of one GPU activity chunk.
    Events(Vec<Event>),
    /// A record of the wire probe, for the request reconstruction ([`crate::decode::wire::requests::Reconstructor`]).
    Wire(WireRecord),
    /// A valid record that gives nothing: a stack the resolver dropped, a Python walk of a process not sampled.
    Nothing,
    /// Not a valid record (short, unknown kind, unknown value in a field): counted in
    /// [`Decoder::undecodable`].
    Invalid,
}

/// Turns ring records into events; counts what it cannot decode.
#[derive(Debug, Default)]
pub struct Decoder {
    files: files::Paths,
    allow: Vec<Cidr>,
    cupti: cupti::GpuDecoder,
    undecodable: u64,
}

impl Decoder {
    /// A decoder flagging connects outside `allow`.
    pub fn new(allow: Vec<Cidr>) -> Self {
        Self {
            allow,
            ..Self::default()
        }
    }

    /// Records that could not be decoded so far (unknown kind, short record, unknown value in a field).
    pub fn undecodable(&self) -> u64 {
        self.undecodable
    }

    /// What the GPU activity chunks held and lost so far.
    pub fn cupti_stats(&self) -> &GpuStats {
        self.cupti.stats()
    }

    /// Decodes one record; an invalid one is counted.
    pub fn decode(&mut self, b: &[u8], resolve: &mut dyn Resolve) -> Decoded {
        let d = self.dispatch(b, resolve).unwrap_or(Decoded::Invalid);
        if matches!(d, Decoded::Invalid) {
            self.undecodable += 1;
        }
        d
    }

    /// The record's family decodes it (`None`: invalid).
    fn dispatch(&mut self, b: &[u8], resolve: &mut dyn Resolve) -> Option<Decoded> {
        let hdr: EventHeader = read(b)?;
        let event = |body| Some(Decoded::Event(at(&hdr, body)));
        match EventKind::from_raw(hdr.kind)? {
            EventKind::Step => event(engine::step(b)?),
            EventKind::Request => event(engine::request(b)?),
            EventKind::Range => event(engine::range(b)?),
            EventKind::Content => event(engine::content(b)?),
            EventKind::SlowSyscall => event(syscalls::slow(b)?),
            EventKind::FileOpen => event(self.files.open(hdr.pid, b)?),
            EventKind::FileIo => event(self.files.io(hdr.pid, b)?),
            EventKind::Connect => event(egress::connect(b, &self.allow)?),
            EventKind::ProcessStart => event(proc::start(b)?),
            EventKind::ProcessExec => {
                let body = proc::exec(b)?;
                // The old image's fds stay open unless close-on-exec; their paths are forgotten either way
                // (a later read of a kept fd is still shown, without its path).
                self.files.forget(hdr.pid);
                event(body)
            }
            EventKind::ProcessExit => {
                let body = proc::exit(b)?;
                self.files.forget(hdr.pid);
                self.cupti.forget(hdr.pid);
                event(body)
            }
            EventKind::CudaCall => event(cuda::call(b)?),
            EventKind::CudaCount => event(cuda::count(b)?),
            EventKind::GpuChunk => Some(Decoded::Events(cupti::record(&mut self.cupti, b)?)),
            EventKind::Http | EventKind::HttpHead => Some(Decoded::Wire(wire::record(b)?)),
            EventKind::SchedSwitch => Some(Decoded::Event(sched::switch(b)?)),
            EventKind::SchedWake => Some(Decoded::Event(sched::wake(b)?)),
            EventKind::CpuSample | EventKind::OffCpuStack => {
                Some(stacks::native(b, resolve)?.map_or(Decoded::Nothing, Decoded::Stack))
            }
            EventKind::PyStack => Some(python::stack(b, resolve)?.map_or(Decoded::Nothing, Decoded::PyStack)),
        }
    }
}

/// An event with `hdr`'s time, process and thread.
fn at(hdr: &EventHeader, body: EventBody) -> Event {
    Event {
        ts_ns: hdr.ts_ns,
        pid: hdr.pid,
        tid: hdr.tid,
        body,
    }
}

/// Builders of record bytes for the decoders' tests.
#[cfg(test)]
pub(crate) mod test_records {
    use llmprof_abi::{EventHeader, EventKind};

    use super::Record;

    /// The bytes of a record, as the ring hands them over.
    pub(crate) fn bytes<T: Record>(v: &T) -> Vec<u8> {
        // SAFETY: reading the bytes of a plain-data value (`T: Record`), within its size.
        unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>()) }.to_vec()
    }

    /// A header of `kind` at 5 ns, pid 10, tid 11.
    pub(crate) fn hdr(kind: EventKind) -> EventHeader {
        EventHeader {
            kind: kind as u32,
            cpu: 0,
            ts_ns: 5,
            pid: 10,
            tid: 11,
        }
    }

    /// The event `b` decodes to with `d` and no machine (panics on anything else).
    pub(crate) fn event(d: &mut super::Decoder, b: &[u8]) -> crate::event::Event {
        match d.decode(b, &mut NoMachine) {
            super::Decoded::Event(e) => e,
            other => panic!("expected an event, got {other:?}"),
        }
    }

    /// A resolver with no sampler and no Python process: drops every stack.
    pub(crate) struct NoMachine;

    impl super::Resolve for NoMachine {
        fn native_stack(
            &mut self,
            _: &llmprof_abi::CpuSampleEvent,
        ) -> Option<crate::event::stacks::CpuSample> {
            None
        }
        fn python_stack(
            &mut self,
            _: u32,
            _: &llmprof_abi::python::PyStack,
        ) -> Option<crate::event::python::PyStackSample> {
            None
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests panic with the error")]
mod tests {
    use super::test_records::{NoMachine, bytes, hdr};
    use super::*;

    #[test]
    fn garbage_is_counted_not_decoded() {
        let mut d = Decoder::new(vec![]);
        assert!(matches!(d.decode(&[1, 2, 3], &mut NoMachine), Decoded::Invalid));
        let mut h = bytes(&hdr(EventKind::Step));
        assert!(
            matches!(d.decode(&h, &mut NoMachine), Decoded::Invalid),
            "a step header without its record"
        );
        h[0] = 99;
        assert!(matches!(d.decode(&h, &mut NoMachine), Decoded::Invalid));
        assert_eq!(d.undecodable(), 3);
        assert_eq!(kind(&h), None);
        assert_eq!(kind(&bytes(&hdr(EventKind::Http))), Some(EventKind::Http));
    }
}
