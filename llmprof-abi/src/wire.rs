//! The `wire` family: the HTTP/1.1 wire probe, requests and responses of any server, seen in its socket syscalls.
//!
//! The kernel (`profiler-ebpf/src/wire.rs`) follows the connections accepted on the traced processes' listening
//! sockets (the `HTTP_LISTEN` map, filled by user space, keyed by [`crate::SockKey`]) and writes:
//! - [`HttpHeadEvent`] at a request's first bytes (and while its head continues over several reads): the head
//!   (request line and headers), cut in the kernel at the blank line `\r\n\r\n`, so no body byte leaves the
//!   kernel. User space keeps only the method, the path, `traceparent` and `x-request-id`.
//! - [`HttpEvent`] for the response: its status line, the SSE events each write carried (how many, and how
//!   many carried generated content, decided in the kernel), its end, and the connection's close or reset.
//!
//! The programs are tail-called decoders and socket tracepoints; the syscalls are the `syscalls` family's, whose
//! exit hands a followed connection's read or write to a decoder ([`WIRE_DECODERS_MAP`]).

use crate::{EventHeader, Family};

mod scan;
pub use scan::{counting_body, finish_write, scan_byte, start_response, Scan, WriteOutcome};

/// sock:sk_data_ready: stamps when the first unread bytes of an HTTP socket arrived.
pub const SKREADY_PROGRAM: &str = "llmprof_skready";
/// sock:sock_recv_length: moves a followed connection's arrival stamp into its state.
pub const SKRECV_PROGRAM: &str = "llmprof_skrecv";
/// tcp:tcp_destroy_sock: forgets a destroyed socket's stamp.
pub const SKGONE_PROGRAM: &str = "llmprof_skgone";
/// The read-side decoder (request heads), tail-called from the `syscalls` exit ([`WIRE_DECODE_READ`]).
pub const WIRERD_PROGRAM: &str = "llmprof_wirerd";
/// The write-side decoder (responses), tail-called from the `syscalls` exit ([`WIRE_DECODE_WRITE`]).
pub const WIREWR_PROGRAM: &str = "llmprof_wirewr";
/// Listening sockets whose accepted connections are followed, by `SockKey`; written by user space.
pub const HTTP_LISTEN_MAP: &str = "HTTP_LISTEN";
/// Followed connections ([`HttpConnState`]), by `SockKey`; user space seeds the established ones.
pub const HTTP_CONNS_MAP: &str = "HTTP_CONNS";
/// Local ports known to carry HTTP to a traced process ([`HTTP_PORTS_MAX`]).
pub const HTTP_PORTS_MAP: &str = "HTTP_PORTS";
/// `struct sock` address → arrival of its first unread bytes (LRU, [`HTTP_ARRIVALS_MAX`]).
pub const HTTP_ARRIVALS_MAP: &str = "HTTP_ARRIVALS";
/// Per-CPU scratch of the decoders (the bytes being scanned).
pub const HTTP_SCRATCH_MAP: &str = "HTTP_SCRATCH";
/// The decoders' program array, by slot ([`WIRE_DECODER_PROGRAMS`]); filled by user space.
pub const WIRE_DECODERS_MAP: &str = "WIRE_DECODERS";
/// Per-CPU handover of a syscall exit from the `syscalls` exit to a decoder.
pub const WIRE_EXIT_MAP: &str = "WIRE_EXIT";
/// Every program of the family.
pub const PROGRAMS: [&str; 5] = [
    SKREADY_PROGRAM,
    SKRECV_PROGRAM,
    SKGONE_PROGRAM,
    WIRERD_PROGRAM,
    WIREWR_PROGRAM,
];
/// Every map of the family.
pub const MAPS: [&str; 7] = [
    HTTP_LISTEN_MAP,
    HTTP_CONNS_MAP,
    HTTP_PORTS_MAP,
    HTTP_ARRIVALS_MAP,
    HTTP_SCRATCH_MAP,
    WIRE_DECODERS_MAP,
    WIRE_EXIT_MAP,
];
/// The family's kernel names.
pub const FAMILY: Family = Family {
    name: "wire",
    programs: &PROGRAMS,
    maps: &MAPS,
};

/// Slots of the wire decoders' program array (the `WIRE_DECODERS` map): `llmprof_sysexit` tail-calls the read-side
/// decoder ([`WIRE_DECODE_READ`]) or the write-side one ([`WIRE_DECODE_WRITE`]) for a followed connection.
/// Each is its own program, verified on its own: verified inside the exit program, the two state machines
/// multiplied each other's paths (~0.7 s of verifier time at every attach, against ~0.04 s apart).
pub const WIRE_DECODER_SLOTS: u32 = 2;
/// Slot of the read-side decoder (read, readv, recvfrom, recvmsg).
pub const WIRE_DECODE_READ: u32 = 0;
/// Slot of the write-side decoder (write, writev, sendto, sendmsg).
pub const WIRE_DECODE_WRITE: u32 = 1;
/// Program names of the decoders, by slot (user space loads them into the `WIRE_DECODERS` map).
pub const WIRE_DECODER_PROGRAMS: [&str; WIRE_DECODER_SLOTS as usize] = [WIRERD_PROGRAM, WIREWR_PROGRAM];

/// Bytes of a request head one [`HttpHeadEvent`] carries (a longer head continues in further records while
/// the kernel's per-read copy lasts; what does not fit is cut and flagged [`HTTP_FLAG_HEAD_CUT`]).
pub const HTTP_HEAD_MAX: usize = 1024;

/// What an [`HttpEvent`] / [`HttpHeadEvent`] says happened on a connection.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HttpOp {
    /// The first bytes of a request were read ([`HttpHeadEvent`]; the header's time is the read's exit).
    RequestStart = 1,
    /// More of a request's head, read after its first bytes ([`HttpHeadEvent`]).
    RequestHead = 2,
    /// The response's status line was written ([`HttpEvent::status`]).
    ResponseStart = 3,
    /// A write carried SSE events ([`HttpEvent::events`], [`HttpEvent::content_events`]).
    Sse = 4,
    /// The response is complete ([`HttpEvent::flags`]: which end was seen).
    ResponseEnd = 5,
    /// The server closed the connection (`close` of its fd).
    Close = 6,
    /// The peer went away: a read returned 0 (EOF) or a call failed with a reset / broken pipe.
    Reset = 7,
    /// The first bytes of the connection are a TLS record (`0x16 0x03`): nothing more is decoded on it.
    Tls = 8,
    /// The first bytes of the connection are the HTTP/2 preface (`PRI * HTTP/2.0`): not decoded.
    Http2 = 9,
}

impl HttpOp {
    /// Decodes [`HttpEvent::op`].
    pub fn from_raw(v: u32) -> Option<Self> {
        Some(match v {
            1 => Self::RequestStart,
            2 => Self::RequestHead,
            3 => Self::ResponseStart,
            4 => Self::Sse,
            5 => Self::ResponseEnd,
            6 => Self::Close,
            7 => Self::Reset,
            8 => Self::Tls,
            9 => Self::Http2,
            _ => return None,
        })
    }
}

/// [`HttpOp::ResponseEnd`]: the `Content-Length` bytes were written.
pub const HTTP_END_LENGTH: u32 = 1;
/// [`HttpOp::ResponseEnd`]: the chunked terminator `0\r\n\r\n` was written.
pub const HTTP_END_CHUNKED: u32 = 2;
/// [`HttpOp::ResponseEnd`]: an SSE `data: [DONE]` event was written.
pub const HTTP_END_DONE: u32 = 4;
/// [`HttpHeadEvent`]: the blank line ending the head was found (the head is complete).
pub const HTTP_FLAG_HEAD_DONE: u32 = 1;
/// [`HttpConnState::phase`] of a connection followed provisionally (see `Knob::HttpAcceptAll`): nothing read
/// yet; its first bytes decide whether it is HTTP/1.x ([`is_http_request_start`]).
pub const HTTP_PHASE_PROBE: u32 = 6;

/// Whether the first four bytes a server read on a connection start an HTTP/1.x request line (a method and a
/// space, or the first four letters of a longer method).
pub fn is_http_request_start(b: &[u8; 4]) -> bool {
    matches!(
        b,
        b"GET " | b"PUT " | b"POST" | b"HEAD" | b"DELE" | b"PATC" | b"OPTI" | b"CONN" | b"TRAC"
    )
}
/// [`HttpHeadEvent`]: the read held more head bytes than [`HTTP_HEAD_MAX`]; the rest was not copied.
pub const HTTP_FLAG_HEAD_CUT: u32 = 2;
/// [`HttpEvent`] (`Sse`): the write was longer than the kernel scans; events past the scanned part are missed.
pub const HTTP_FLAG_SCAN_CUT: u32 = 8;
/// [`HttpEvent`] (`Sse`): one of the write's content events is the response's first.
pub const HTTP_FLAG_FIRST_CONTENT: u32 = 16;

/// One response-side happening on a followed connection.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HttpEvent {
    /// Header ([`crate::EventKind::Http`]); `ts_ns` is the syscall's exit.
    pub hdr: EventHeader,
    /// The connection's fd in the process.
    pub fd: i32,
    /// [`HttpOp`] as u32.
    pub op: u32,
    /// Connection id, unique in the session (the kernel's counter; user-space seeded connections count down
    /// from `u64::MAX`).
    pub conn: u64,
    /// `HTTP_END_*` / `HTTP_FLAG_*` bits.
    pub flags: u32,
    /// The response's status code (`ResponseStart`), 0 otherwise.
    pub status: u32,
    /// SSE events the write ended (`Sse`).
    pub events: u32,
    /// Of those, the events that carried generated content (a non-empty `content`, `text`, `reasoning`,
    /// `reasoning_content`, `arguments` string or a non-empty `tool_calls` array); role-only and empty
    /// chunks do not count.
    pub content_events: u32,
    /// The syscall's result (bytes written, or -errno for `Reset`).
    pub ret: i64,
}

/// A request's head bytes, as read.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HttpHeadEvent {
    /// Header ([`crate::EventKind::HttpHead`]); `ts_ns` is the read's exit.
    pub hdr: EventHeader,
    /// The connection's fd in the process.
    pub fd: i32,
    /// [`HttpOp::RequestStart`] or [`HttpOp::RequestHead`].
    pub op: u32,
    /// Connection id (see [`HttpEvent::conn`]).
    pub conn: u64,
    /// `HTTP_FLAG_HEAD_*` bits.
    pub flags: u32,
    /// Bytes of `data` that are head bytes (at most [`HTTP_HEAD_MAX`]; nothing after the blank line).
    pub len: u32,
    /// Bytes the read returned.
    pub ret: i64,
    /// [`HttpOp::RequestStart`]: when the request's first bytes arrived in the server's socket
    /// (`sock:sk_data_ready`, CLOCK_BOOTTIME ns), before the server read them; 0 when not seen (the port was
    /// not yet known to carry HTTP, a kernel without the tracepoints, a Unix socket).
    pub arrival_ns: u64,
    /// The head bytes.
    pub data: [u8; HTTP_HEAD_MAX],
}

/// Per-connection state the kernel keeps (value of its connection map; user space writes fresh ones, all zero
/// but [`HttpConnState::conn`], for the connections already established at attach). Every field but `conn` is
/// the kernel's own bookkeeping.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct HttpConnState {
    /// Connection id (see [`HttpEvent::conn`]).
    pub conn: u64,
    /// Where the exchange is (0: waiting for a request; values in `profiler-ebpf/src/wire.rs`).
    pub phase: u32,
    /// Scanner bits (`profiler-ebpf/src/wire.rs`).
    pub bits: u32,
    /// Characters of the current line, `\r` not counted.
    pub line_len: u32,
    /// Hash of the JSON string being read / last read (key detection).
    pub hash: u32,
    /// The last JSON string's hash.
    pub last_hash: u32,
    /// Response status code being parsed.
    pub status: u32,
    /// `Content-Length` being parsed.
    pub content_length: u64,
    /// Response body bytes still to come (-1: unknown).
    pub remaining: i64,
    /// Characters of `\r\n\r\n` matched at the end of the request head bytes read so far.
    pub head_match: u32,
    /// Whether the connection's local port was put into the kernel's HTTP ports map (1) — once per connection.
    pub port_noted: u32,
    /// The connection's `struct sock` address (learned at its first read, `sock:sock_recv_length`; 0 before).
    pub sk: u64,
    /// When the bytes the current read consumes started arriving (see [`HttpHeadEvent::arrival_ns`]); 0: not
    /// seen. Written by the read's `sock_recv_length`, consumed by its exit.
    pub arrival_ns: u64,
}

/// Offsets into the kernel's `struct sock_common` (the first member of every `struct sock`; a layout unchanged
/// since Linux 2.6.33) the arrival stamp reads: the local port (`skc_num`, host order), the address family
/// (`skc_family`, compared with the tracepoint's own `family` field, so a different layout reads as a mismatch
/// and records nothing) and the TCP state (`skc_state`).
pub const SOCK_NUM_OFFSET: u64 = 14;
/// See [`SOCK_NUM_OFFSET`].
pub const SOCK_FAMILY_OFFSET: u64 = 16;
/// See [`SOCK_NUM_OFFSET`].
pub const SOCK_STATE_OFFSET: u64 = 18;
/// `TCP_ESTABLISHED` (include/net/tcp_states.h).
pub const TCP_STATE_ESTABLISHED: u8 = 1;
/// Sockets whose first unread bytes' arrival is kept (an LRU map: a socket never read by a traced process
/// and never destroyed is evicted, not counted).
pub const HTTP_ARRIVALS_MAX: u32 = 8192;
/// Local ports known to carry HTTP to a traced process (learned at a request's start on a followed
/// connection; `--http-port`'s ports from the start).
pub const HTTP_PORTS_MAX: u32 = 1024;

const _: () = {
    assert!(core::mem::size_of::<HttpEvent>() == 64);
    assert!(core::mem::size_of::<HttpHeadEvent>() == 64 + HTTP_HEAD_MAX);
    assert!(core::mem::size_of::<HttpConnState>() == 72);
};

#[cfg(feature = "user")]
mod pod {
    // SAFETY: #[repr(C)], Copy, integers only; every bit pattern is valid.
    unsafe impl aya::Pod for super::HttpConnState {}
}

#[cfg(test)]
mod tests {
    use super::is_http_request_start;

    #[test]
    fn http_request_lines_are_told_from_other_protocols() {
        for line in [
            "GET / HTTP/1.1",
            "POST /v1/chat/completions HTTP/1.1",
            "PUT /x HTTP/1.1",
            "HEAD / HTTP/1.0",
            "DELETE /x HTTP/1.1",
            "PATCH /x HTTP/1.1",
            "OPTIONS * HTTP/1.1",
        ] {
            let b: [u8; 4] = line.as_bytes()[..4].try_into().unwrap_or_default();
            assert!(is_http_request_start(&b), "{line}");
        }
        // A ZMTP greeting, a TLS ClientHello, the HTTP/2 preface, a lower-case method, a Redis command.
        for b in [
            [0xff, 0, 0, 0],
            [0x16, 0x03, 0x01, 0x02],
            *b"PRI ",
            *b"get ",
            *b"*1\r\n",
        ] {
            assert!(!is_http_request_start(&b), "{b:?}");
        }
    }
}
