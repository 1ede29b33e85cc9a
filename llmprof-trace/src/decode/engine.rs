//! The engine probes' records (`llmprof_probe_step`, `_request`, `_range`, `_content`): steps, request
//! transitions, ranges and, with `--capture-content`, prompt and completion text.

use llmprof_abi::{ContentEvent, ContentKind, RangeEvent, RequestEvent, StepEvent};

use super::{Record, read};
use crate::event::EventBody;

impl Record for StepEvent {}
impl Record for RequestEvent {}
impl Record for RangeEvent {}
impl Record for ContentEvent {}

/// A step record.
pub(super) fn step(b: &[u8]) -> Option<EventBody> {
    Some(EventBody::Step(Box::new(read::<StepEvent>(b)?.rec)))
}

/// A request transition record.
pub(super) fn request(b: &[u8]) -> Option<EventBody> {
    Some(EventBody::Request(Box::new(read::<RequestEvent>(b)?.rec)))
}

/// A range push, pop or mark.
pub(super) fn range(b: &[u8]) -> Option<EventBody> {
    Some(EventBody::Range(read::<RangeEvent>(b)?.rec))
}

/// A prompt or completion text: the bytes the kernel copied (a character cut at the end becomes U+FFFD).
pub(super) fn content(b: &[u8]) -> Option<EventBody> {
    let e: ContentEvent = read(b)?;
    let n = (e.copied as usize).min(e.data.len());
    Some(EventBody::Content {
        kind: ContentKind::from_raw(e.rec.kind)?,
        req_id: e.rec.req_id,
        text: String::from_utf8_lossy(&e.data[..n]).into_owned(),
        len: e.rec.len,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests panic with the error")]
mod tests {
    use llmprof_abi::{CONTENT_MAX, ContentRecord, EventKind};

    use super::super::test_records::{NoMachine, bytes, hdr};
    use super::super::{Decoded, Decoder};
    use super::*;
    use crate::event::Event;

    fn decode(b: &[u8]) -> Decoded {
        Decoder::new(vec![]).decode(b, &mut NoMachine)
    }

    fn event(b: &[u8]) -> Event {
        match decode(b) {
            Decoded::Event(e) => e,
            other => panic!("expected an event, got {other:?}"),
        }
    }

    #[test]
    fn a_step_keeps_the_engine_record_as_it_came() {
        let mut e: StepEvent = read(&[0; std::mem::size_of::<StepEvent>()]).unwrap();
        e.hdr = hdr(EventKind::Step);
        e.rec.step_id = 42;
        e.rec.num_seqs = 3;
        let ev = event(&bytes(&e));
        assert_eq!((ev.pid, ev.tid, ev.ts_ns), (10, 11, 5));
        let EventBody::Step(s) = &ev.body else {
            panic!("{ev:?}")
        };
        assert_eq!((s.step_id, s.num_seqs), (42, 3));
    }

    fn content(kind: u32, text: &[u8], len: u64) -> ContentEvent {
        let mut data = [0u8; CONTENT_MAX];
        data[..text.len()].copy_from_slice(text);
        ContentEvent {
            hdr: hdr(EventKind::Content),
            rec: ContentRecord {
                abi_version: 1,
                kind,
                req_id: 7,
                ptr: 0xdead,
                len,
            },
            copied: text.len() as u32,
            _pad: 0,
            data,
        }
    }

    #[test]
    fn content_keeps_the_copied_text_and_a_cut_character_becomes_a_replacement() {
        let ev = event(&bytes(&content(ContentKind::Prompt as u32, b"hello", 5)));
        assert!(
            matches!(&ev.body, EventBody::Content { kind: ContentKind::Prompt, req_id: 7, text, len: 5 } if text == "hello"),
            "{ev:?}"
        );
        // "é" is two bytes; the kernel copied the first only of a longer text.
        let ev = event(&bytes(&content(
            ContentKind::Completion as u32,
            &"aé".as_bytes()[..2],
            99,
        )));
        assert!(
            matches!(&ev.body, EventBody::Content { kind: ContentKind::Completion, text, len: 99, .. } if text == "a\u{fffd}"),
            "{ev:?}"
        );
        let mut e = content(ContentKind::Prompt as u32, b"x", 1);
        e.copied = u32::MAX;
        let ev = event(&bytes(&e));
        assert!(
            matches!(&ev.body, EventBody::Content { text, .. } if text.len() == CONTENT_MAX),
            "a copied count past the buffer is cut to it"
        );
        assert!(matches!(decode(&bytes(&content(9, b"x", 1))), Decoded::Invalid));
    }
}
