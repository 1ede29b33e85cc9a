//! The CUDA driver probes' records: a timed call (`cuMemcpy*`, `cuStreamSynchronize`, ...) and a window of
//! a thread's counted launch-type calls.

use llmprof_abi::cudacount::CudaCountEvent;
use llmprof_abi::{CudaCallEvent, CudaFunc, CudaVariant};

use super::{Record, read};
use crate::event::EventBody;

impl Record for CudaCallEvent {}
impl Record for CudaCountEvent {}

/// A timed driver call (`None`: unknown function or variant).
pub(super) fn call(b: &[u8]) -> Option<EventBody> {
    let e: CudaCallEvent = read(b)?;
    Some(EventBody::CudaCall {
        func: CudaFunc::from_raw(e.func)?,
        variant: CudaVariant::from_raw(e.variant)?,
        dur_ns: e.dur_ns,
        arg: e.arg,
        result: e.result,
    })
}

/// A window of counted calls.
pub(super) fn count(b: &[u8]) -> Option<EventBody> {
    let e: CudaCountEvent = read(b)?;
    Some(EventBody::CudaCount {
        last_ns: e.last_ns,
        calls: e.calls,
        bytes: e.bytes,
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
        let Decoded::Event(ev) = d.decode(&bytes(&c), &mut NoMachine) else {
            panic!("expected an event");
        };
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
        assert!(matches!(d.decode(&bytes(&c), &mut NoMachine), Decoded::Invalid));
        assert_eq!(d.undecodable(), 1);
    }

    #[test]
    fn a_count_window_keeps_its_calls_and_bytes() {
        let mut d = Decoder::new(vec![]);
        let c = CudaCountEvent {
            hdr: hdr(EventKind::CudaCount),
            last_ns: 99,
            bytes: 1 << 20,
            calls: [1, 2, 3, 4, 5, 6, 7, 8],
            end: 0,
            pad: 0,
        };
        let Decoded::Event(ev) = d.decode(&bytes(&c), &mut NoMachine) else {
            panic!("expected an event");
        };
        assert!(
            matches!(
                ev.body,
                EventBody::CudaCount {
                    last_ns: 99,
                    bytes: 1_048_576,
                    calls: [1, 2, 3, 4, 5, 6, 7, 8]
                }
            ),
            "{ev:?}"
        );
    }
}
