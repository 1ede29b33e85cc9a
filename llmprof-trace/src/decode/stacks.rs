//! The stack sampler's records (`CpuSampleEvent`): an on-CPU sample of a traced thread, or the stack of one
//! blocking at a context switch (kind `OffCpuStack`), both symbolized by the machine ([`super::Resolve`]).

use llmprof_abi::{CpuSampleEvent, EventKind};

use super::{Record, Resolve, at, read};
use crate::event::{Event, EventBody};

impl Record for CpuSampleEvent {}

/// A native stack record's event (`None`: short record; `Some(None)`: the resolver dropped it).
pub(super) fn native(b: &[u8], resolve: &mut dyn Resolve) -> Option<Option<Event>> {
    let e: CpuSampleEvent = read(b)?;
    let Some(sample) = resolve.native_stack(&e) else {
        return Some(None);
    };
    let sample = Box::new(sample);
    let body = if e.hdr.kind == EventKind::OffCpuStack as u32 {
        EventBody::OffCpuStack(sample)
    } else {
        EventBody::CpuSample(sample)
    };
    Some(Some(at(&e.hdr, body)))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests panic with the error")]
mod tests {
    use std::sync::Arc;

    use llmprof_abi::python::PyStack;
    use llmprof_abi::{KERNEL_STACK_MAX, USER_STACK_MAX};

    use super::super::test_records::{NoMachine, bytes, hdr};
    use super::super::{Decoded, Decoder};
    use super::*;
    use crate::event::python::PyStackSample;
    use crate::event::stacks::{CpuSample, Frame, FrameKind};

    /// Names each user address `u<addr>`, as a symbolizer would; drops the samples of pid 1.
    struct Names;

    impl Resolve for Names {
        fn native_stack(&mut self, rec: &CpuSampleEvent) -> Option<CpuSample> {
            (rec.hdr.pid != 1).then(|| CpuSample {
                cpu: rec.hdr.cpu,
                frames: rec
                    .user_stack()
                    .iter()
                    .map(|a| Arc::new(Frame::named(&format!("u{a}"), "m", FrameKind::Native)))
                    .collect(),
                truncated: false,
            })
        }
        fn python_stack(&mut self, _: u32, _: &PyStack) -> Option<PyStackSample> {
            None
        }
    }

    fn sample(kind: EventKind, pid: u32) -> CpuSampleEvent {
        let mut user = [0u64; USER_STACK_MAX];
        user[..2].copy_from_slice(&[7, 8]);
        CpuSampleEvent {
            hdr: llmprof_abi::EventHeader { pid, ..hdr(kind) },
            user_len: 2,
            kernel_len: 0,
            user,
            kernel: [0; KERNEL_STACK_MAX],
        }
    }

    #[test]
    fn samples_and_off_cpu_stacks_carry_the_resolved_frames() {
        let mut d = Decoder::new(vec![]);
        let Decoded::Stack(ev) = d.decode(&bytes(&sample(EventKind::CpuSample, 10)), &mut Names) else {
            panic!("expected a stack");
        };
        let EventBody::CpuSample(s) = &ev.body else {
            panic!("{ev:?}")
        };
        let names: Vec<&str> = s.frames.iter().map(|f| &*f.function).collect();
        assert_eq!(names, ["u7", "u8"]);
        assert_eq!((ev.pid, ev.tid, ev.ts_ns), (10, 11, 5));
        let Decoded::Stack(ev) = d.decode(&bytes(&sample(EventKind::OffCpuStack, 10)), &mut Names) else {
            panic!("expected a stack");
        };
        assert!(matches!(ev.body, EventBody::OffCpuStack(_)), "{ev:?}");
    }

    #[test]
    fn a_dropped_sample_is_nothing_and_a_short_one_is_invalid() {
        let mut d = Decoder::new(vec![]);
        let b = bytes(&sample(EventKind::CpuSample, 1));
        assert!(matches!(d.decode(&b, &mut Names), Decoded::Nothing));
        assert!(matches!(d.decode(&b, &mut NoMachine), Decoded::Nothing));
        assert!(matches!(
            d.decode(&b[..b.len() - 8], &mut Names),
            Decoded::Invalid
        ));
        assert_eq!(d.undecodable(), 1);
    }
}
