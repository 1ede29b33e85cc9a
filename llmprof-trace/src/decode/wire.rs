//! The wire probe's records (`HttpEvent`, `HttpHeadEvent`): decoded into [`WireRecord`]s for the request
//! reconstruction ([`crate::decode::wire::requests::Reconstructor`]), which keeps only what it needs of the head bytes.

pub mod requests;

use llmprof_abi::{EventHeader, EventKind, HTTP_HEAD_MAX, HttpEvent, HttpHeadEvent, HttpOp};

use super::{Record, read};
use crate::decode::wire::requests::WireRecord;

impl Record for HttpEvent {}
impl Record for HttpHeadEvent {}

/// A wire-probe record (`None`: short, or not the wire probe's kind).
pub(super) fn record(b: &[u8]) -> Option<WireRecord> {
    let hdr: EventHeader = read(b)?;
    let base = WireRecord {
        ts_ns: hdr.ts_ns,
        pid: hdr.pid,
        tid: hdr.tid,
        ..WireRecord::default()
    };
    match EventKind::from_raw(hdr.kind)? {
        EventKind::Http => {
            let e: HttpEvent = read(b)?;
            Some(WireRecord {
                fd: e.fd,
                conn: e.conn,
                op: HttpOp::from_raw(e.op),
                flags: e.flags,
                status: e.status,
                events: e.events,
                content_events: e.content_events,
                ret: e.ret,
                ..base
            })
        }
        EventKind::HttpHead => {
            let e: HttpHeadEvent = read(b)?;
            let n = (e.len as usize).min(HTTP_HEAD_MAX);
            Some(WireRecord {
                fd: e.fd,
                conn: e.conn,
                op: HttpOp::from_raw(e.op),
                flags: e.flags,
                ret: e.ret,
                arrival_ns: e.arrival_ns,
                head: e.data[..n].to_vec(),
                ..base
            })
        }
        _ => None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests panic with the error")]
mod tests {
    use super::super::test_records::{NoMachine, bytes, hdr};
    use super::super::{Decoded, Decoder};
    use super::*;

    fn wire(b: &[u8]) -> WireRecord {
        match Decoder::new(vec![]).decode(b, &mut NoMachine) {
            Decoded::Wire(r) => r,
            other => panic!("expected a wire record, got {other:?}"),
        }
    }

    #[test]
    fn a_head_keeps_the_bytes_the_kernel_copied_and_its_arrival() {
        let mut data = [0u8; HTTP_HEAD_MAX];
        let head = b"POST /v1/chat/completions HTTP/1.1\r\n\r\n";
        data[..head.len()].copy_from_slice(head);
        let e = HttpHeadEvent {
            hdr: hdr(EventKind::HttpHead),
            fd: 7,
            op: HttpOp::RequestStart as u32,
            conn: 3,
            flags: 0,
            len: head.len() as u32,
            ret: head.len() as i64,
            arrival_ns: 4,
            data,
        };
        let r = wire(&bytes(&e));
        assert_eq!(
            (r.ts_ns, r.pid, r.tid, r.fd, r.conn, r.arrival_ns),
            (5, 10, 11, 7, 3, 4)
        );
        assert_eq!(r.op, Some(HttpOp::RequestStart));
        assert_eq!(r.head, head);
        // A length past the buffer is cut to it.
        let r = wire(&bytes(&HttpHeadEvent { len: u32::MAX, ..e }));
        assert_eq!(r.head.len(), HTTP_HEAD_MAX);
    }

    #[test]
    fn a_response_record_keeps_status_and_events_and_a_short_one_is_invalid() {
        let e = HttpEvent {
            hdr: hdr(EventKind::Http),
            fd: 7,
            op: HttpOp::ResponseStart as u32,
            conn: 3,
            flags: 0,
            status: 200,
            events: 2,
            content_events: 1,
            ret: 99,
        };
        let b = bytes(&e);
        let r = wire(&b);
        assert_eq!((r.status, r.events, r.content_events, r.ret), (200, 2, 1, 99));
        assert_eq!(r.op, Some(HttpOp::ResponseStart));
        let mut d = Decoder::new(vec![]);
        assert!(matches!(
            d.decode(&b[..b.len() - 1], &mut NoMachine),
            Decoded::Invalid
        ));
        assert_eq!(d.undecodable(), 1);
    }
}
