//! The Python stack walker's records (`PyStackEvent`): a kernel walk of a thread's Python frames (code object
//! addresses), resolved against the target's memory by the machine ([`super::Resolve`]), and where the
//! resolved stack goes: into the native stack of the same instant, or an event of its own.

use llmprof_abi::python::PyStackEvent;

use super::{Record, Resolve, at, read};
use crate::event::python::splice;
use crate::event::{Event, EventBody};

impl Record for PyStackEvent {}

/// A Python stack record's event (`None`: short record; `Some(None)`: a process not sampled).
pub(super) fn stack(b: &[u8], resolve: &mut dyn Resolve) -> Option<Option<Event>> {
    let rec: PyStackEvent = read(b)?;
    let Some(sample) = resolve.python_stack(rec.hdr.pid, &rec.stack) else {
        return Some(None);
    };
    Some(Some(at(&rec.hdr, EventBody::PyStack(Box::new(sample)))))
}

/// A Python stack written by the native sampler (or with an off-CPU stack) right after its own record of the
/// same instant (same tid, same timestamp) is spliced into that stack's frames, looked for among the samples
/// `held` back (this drain's and the last one's); one without such a record (the stand-alone Python sampler)
/// stays an event of its own, pushed to `out`.
pub fn splice_or_push(ev: Event, held: [&mut Vec<Event>; 2], out: &mut Vec<Event>) {
    if let EventBody::PyStack(py) = &ev.body {
        for h in held {
            if let Some(sample) = h.iter_mut().rev().find_map(|e| match &mut e.body {
                EventBody::CpuSample(s) | EventBody::OffCpuStack(s)
                    if e.tid == ev.tid && e.ts_ns == ev.ts_ns =>
                {
                    Some(s)
                }
                _ => None,
            }) {
                splice(sample, py);
                return;
            }
        }
    }
    out.push(ev);
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests panic with the error")]
mod tests {
    use std::sync::Arc;

    use llmprof_abi::python::{PY_MAX_FRAMES, PyFrameRaw, PyStack};
    use llmprof_abi::{CpuSampleEvent, EventKind};

    use super::super::test_records::{NoMachine, bytes, hdr};
    use super::super::{Decoded, Decoder};
    use super::*;
    use crate::event::python::{PyFrame, PyStackSample, PyStackStatus};
    use crate::event::stacks::{CpuSample, Frame, FrameKind};

    /// Resolves the walks of pid 10 (one frame per code address, named `f<code>`); other pids are not Python.
    struct Py;

    impl Resolve for Py {
        fn native_stack(&mut self, _: &CpuSampleEvent) -> Option<CpuSample> {
            None
        }
        fn python_stack(&mut self, pid: u32, stack: &PyStack) -> Option<PyStackSample> {
            (pid == 10).then(|| PyStackSample {
                frames: stack.frames[..stack.nframes as usize]
                    .iter()
                    .map(|f| PyFrame {
                        function: format!("f{}", f.code),
                        file: "a.py".into(),
                        line: Some(1),
                        entry: true,
                    })
                    .collect(),
                status: PyStackStatus::Complete,
            })
        }
    }

    fn walk(pid: u32) -> PyStackEvent {
        let mut frames = [PyFrameRaw::default(); PY_MAX_FRAMES];
        frames[0].code = 3;
        PyStackEvent {
            hdr: llmprof_abi::EventHeader {
                pid,
                ..hdr(EventKind::PyStack)
            },
            stack: PyStack {
                nframes: 1,
                status: 0,
                entry_mask: 1,
                frames,
            },
        }
    }

    #[test]
    fn a_walk_of_a_sampled_process_resolves_and_others_give_nothing() {
        let mut d = Decoder::new(vec![]);
        let Decoded::PyStack(ev) = d.decode(&bytes(&walk(10)), &mut Py) else {
            panic!("expected a Python stack");
        };
        let EventBody::PyStack(s) = &ev.body else {
            panic!("{ev:?}")
        };
        assert_eq!(s.render(), "f3 (a.py:1)");
        assert!(matches!(d.decode(&bytes(&walk(12)), &mut Py), Decoded::Nothing));
        assert!(matches!(
            d.decode(&bytes(&walk(10)), &mut NoMachine),
            Decoded::Nothing
        ));
        assert!(matches!(
            d.decode(&bytes(&walk(10))[..40], &mut Py),
            Decoded::Invalid
        ));
        assert_eq!(d.undecodable(), 1);
    }

    #[test]
    fn a_python_stack_is_spliced_into_the_held_sample_of_its_instant_or_pushed() {
        let eval = Arc::new(Frame::named(
            "_PyEval_EvalFrameDefault",
            "python3",
            FrameKind::Native,
        ));
        let native = |tid: u32, ts_ns: u64| Event {
            ts_ns,
            pid: 10,
            tid,
            body: EventBody::CpuSample(Box::new(CpuSample {
                cpu: 0,
                frames: vec![eval.clone()],
                truncated: false,
            })),
        };
        let Decoded::PyStack(py) = Decoder::new(vec![]).decode(&bytes(&walk(10)), &mut Py) else {
            panic!("expected a Python stack");
        };
        // Held in the last drain, same tid and time: spliced.
        let mut this = vec![native(11, 6)];
        let mut last = vec![native(11, 5)];
        let mut out = Vec::new();
        splice_or_push(py.clone(), [&mut this, &mut last], &mut out);
        assert!(out.is_empty());
        let EventBody::CpuSample(s) = &last[0].body else {
            panic!()
        };
        assert_eq!(&*s.frames[0].function, "f3");
        assert_eq!(s.frames[0].kind, FrameKind::Interpreted);
        let EventBody::CpuSample(s) = &this[0].body else {
            panic!()
        };
        assert_eq!(
            &*s.frames[0].function, "_PyEval_EvalFrameDefault",
            "another instant: untouched"
        );
        // No sample of its instant: an event of its own.
        splice_or_push(py, [&mut Vec::new(), &mut Vec::new()], &mut out);
        assert_eq!(out.len(), 1);
    }
}
