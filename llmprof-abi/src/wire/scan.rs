//! The response scanner of the HTTP wire probe: a byte-at-a-time state machine the kernel runs over every
//! response byte it looks at (`profiler-ebpf/src/wire.rs`), kept here, beside the state it carries
//! ([`HttpConnState`]), so the same code is unit-tested in user space.
//!
//! It reads the status line and `Content-Length` of the response head, the SSE `data:` lines and, inside their
//! JSON, whether a content key (`content`, `text`, `reasoning`, `reasoning_content`, `arguments`) has a
//! non-empty string value or `tool_calls` a non-empty array (a role-only first chunk, `"delta": {"role":
//! "assistant", "content": ""}`, is not content). Ends: the chunk terminator `0\r\n\r\n` and `data: [DONE]`
//! (the `Content-Length` end is counted by [`finish_write`]). The state lives across calls, so an event split
//! over writes and several events in one write both work. No allocation, no loop: the kernel calls it from
//! `bpf_loop`.

use super::{HttpConnState, HTTP_END_CHUNKED, HTTP_END_DONE, HTTP_END_LENGTH, HTTP_FLAG_FIRST_CONTENT};

// Scanner bits (`HttpConnState::bits`).
pub(crate) const B_IN_HEAD: u32 = 1 << 0;
pub(crate) const B_STATUS_LINE: u32 = 1 << 1;
pub(crate) const B_PREFIX_BAD: u32 = 1 << 2;
pub(crate) const B_DATA_LINE: u32 = 1 << 3;
pub(crate) const B_CL_LINE: u32 = 1 << 4;
pub(crate) const B_CL_SEEN: u32 = 1 << 5;
pub(crate) const B_EV_DATA: u32 = 1 << 6;
pub(crate) const B_EV_CONTENT: u32 = 1 << 7;
pub(crate) const B_EV_DONE: u32 = 1 << 8;
pub(crate) const B_IN_STR: u32 = 1 << 9;
pub(crate) const B_ESC: u32 = 1 << 10;
pub(crate) const B_AFTER_STR: u32 = 1 << 11;
pub(crate) const B_EXPECT: u32 = 1 << 12;
pub(crate) const B_VAL_STR: u32 = 1 << 13;
pub(crate) const B_VAL_ARR: u32 = 1 << 14;
pub(crate) const B_SEEN_BRACE: u32 = 1 << 15;
pub(crate) const B_LAST_ZERO: u32 = 1 << 16;
pub(crate) const B_ZERO_LINE: u32 = 1 << 17;
pub(crate) const B_FIRST_SENT: u32 = 1 << 18;
/// Bits that live for one line only.
const LINE_BITS: u32 = B_PREFIX_BAD
    | B_DATA_LINE
    | B_CL_LINE
    | B_IN_STR
    | B_ESC
    | B_AFTER_STR
    | B_EXPECT
    | B_VAL_STR
    | B_VAL_ARR
    | B_SEEN_BRACE
    | B_LAST_ZERO
    | B_STATUS_LINE;

/// `data:` (padded to a power of two: indexes are masked).
const DATA_PREFIX: &[u8; 8] = b"data:\0\0\0";
const DATA_LEN: u32 = 5;
/// `content-length:`, lower case (padded likewise).
const CL_PREFIX: &[u8; 16] = b"content-length:\0";
const CL_LEN: u32 = 15;

/// The JSON string hash the scanner computes (`h = h * 31 + byte`, wrapping).
const fn key_hash(s: &[u8]) -> u32 {
    let mut h: u32 = 0;
    let mut i = 0;
    while i < s.len() {
        h = h.wrapping_mul(31).wrapping_add(s[i] as u32);
        i += 1;
    }
    h
}

const K_CONTENT: u32 = key_hash(b"content");
const K_TEXT: u32 = key_hash(b"text");
const K_REASONING: u32 = key_hash(b"reasoning");
const K_REASONING_CONTENT: u32 = key_hash(b"reasoning_content");
const K_ARGUMENTS: u32 = key_hash(b"arguments");
const K_TOOL_CALLS: u32 = key_hash(b"tool_calls");

#[inline(always)]
fn content_key(h: u32) -> bool {
    h == K_CONTENT
        || h == K_TEXT
        || h == K_REASONING
        || h == K_REASONING_CONTENT
        || h == K_ARGUMENTS
        || h == K_TOOL_CALLS
}

/// A response scan: the connection's carried state and what the bytes scanned so far in one call found.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Scan {
    /// The connection's state (copied in before the call, back out after).
    pub st: HttpConnState,
    /// Offset of the buffer being scanned in the call's data.
    pub base: u64,
    /// SSE events ended.
    pub events: u32,
    /// Of those, events with generated content.
    pub content: u32,
    /// `HTTP_END_*` bits seen.
    pub end: u32,
    /// Offset just past the response head's blank line, + 1 (0: the head did not end in this call).
    pub head_end: u64,
}

/// One byte (`i`: its offset in the buffer) through the response scanner.
#[inline(always)]
pub fn scan_byte(c: u8, i: u64, x: &mut Scan) {
    let mut b = x.st.bits;
    if c == b'\n' {
        if x.st.line_len == 0 {
            if b & B_IN_HEAD != 0 {
                b &= !B_IN_HEAD;
                x.head_end = x.base + i + 2;
            } else if b & B_EV_DATA != 0 {
                x.events += 1;
                if b & B_EV_CONTENT != 0 {
                    x.content += 1;
                }
                if b & B_EV_DONE != 0 {
                    x.end |= HTTP_END_DONE;
                }
                b &= !(B_EV_DATA | B_EV_CONTENT | B_EV_DONE);
            } else if b & B_ZERO_LINE != 0 {
                x.end |= HTTP_END_CHUNKED;
            }
            b &= !B_ZERO_LINE;
        } else {
            if x.st.line_len == 1 && b & B_LAST_ZERO != 0 {
                b |= B_ZERO_LINE;
            } else {
                b &= !B_ZERO_LINE;
            }
            if b & B_DATA_LINE != 0 {
                b |= B_EV_DATA;
            }
        }
        x.st.line_len = 0;
        x.st.bits = b & !LINE_BITS;
        return;
    }
    if c == b'\r' {
        return;
    }
    let pos = x.st.line_len;
    x.st.line_len = pos.saturating_add(1);
    if b & B_IN_HEAD != 0 {
        if b & B_STATUS_LINE != 0 {
            if (9..=11).contains(&pos) && c.is_ascii_digit() {
                x.st.status = x.st.status * 10 + (c - b'0') as u32;
            }
        } else if pos < CL_LEN {
            if b & B_PREFIX_BAD == 0 && c.to_ascii_lowercase() == CL_PREFIX[(pos as usize) & 15] {
                if pos + 1 == CL_LEN {
                    b |= B_CL_LINE | B_CL_SEEN;
                    x.st.content_length = 0;
                }
            } else {
                b |= B_PREFIX_BAD;
            }
        } else if b & B_CL_LINE != 0 && c.is_ascii_digit() {
            x.st.content_length = x.st.content_length * 10 + (c - b'0') as u64;
        }
        x.st.bits = b;
        return;
    }
    if pos < DATA_LEN {
        if pos == 0 && c == b'0' {
            b |= B_LAST_ZERO;
        }
        if b & B_PREFIX_BAD == 0 && c == DATA_PREFIX[(pos as usize) & 7] {
            if pos + 1 == DATA_LEN {
                b |= B_DATA_LINE;
            }
        } else {
            b |= B_PREFIX_BAD;
        }
        x.st.bits = b;
        return;
    }
    if b & B_DATA_LINE == 0 {
        return;
    }
    // JSON of a data line.
    if b & B_IN_STR != 0 {
        if b & B_VAL_STR != 0 {
            b &= !B_VAL_STR;
            if c != b'"' {
                b |= B_EV_CONTENT;
            }
        }
        if b & B_ESC != 0 {
            b &= !B_ESC;
            x.st.hash = x.st.hash.wrapping_mul(31).wrapping_add(c as u32);
        } else if c == b'\\' {
            b |= B_ESC;
        } else if c == b'"' {
            b = (b & !B_IN_STR) | B_AFTER_STR;
            x.st.last_hash = x.st.hash;
        } else {
            x.st.hash = x.st.hash.wrapping_mul(31).wrapping_add(c as u32);
        }
        x.st.bits = b;
        return;
    }
    if c == b' ' || c == b'\t' {
        return;
    }
    if b & B_VAL_ARR != 0 {
        b &= !B_VAL_ARR;
        if c != b']' && c != b'}' {
            b |= B_EV_CONTENT;
        }
    }
    if c == b'"' {
        b |= B_IN_STR;
        x.st.hash = 0;
        if b & B_EXPECT != 0 {
            b = (b & !B_EXPECT) | B_VAL_STR;
        }
        b &= !B_AFTER_STR;
    } else if c == b':' {
        if b & B_AFTER_STR != 0 && content_key(x.st.last_hash) {
            b |= B_EXPECT;
        }
        b &= !B_AFTER_STR;
    } else {
        if b & B_EXPECT != 0 {
            b &= !B_EXPECT;
            if c == b'[' || c == b'{' {
                b |= B_VAL_ARR;
            }
        }
        if c == b'[' && b & B_SEEN_BRACE == 0 {
            b |= B_EV_DONE;
        }
        if c == b'{' {
            b |= B_SEEN_BRACE;
        }
        b &= !B_AFTER_STR;
    }
    x.st.bits = b;
}

/// Starts a response on a connection: the next bytes are its head.
#[inline(always)]
pub fn start_response(st: &mut HttpConnState) {
    st.bits = B_IN_HEAD | B_STATUS_LINE;
    st.line_len = 0;
    st.status = 0;
    st.content_length = 0;
    st.remaining = -1;
}

/// Whether the rest of the response is a `Content-Length` body still being counted (not scanned).
#[inline(always)]
pub fn counting_body(st: &HttpConnState) -> bool {
    st.remaining > 0
}

/// What one write of a response amounted to, after its bytes went through [`scan_byte`] (or were counted).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteOutcome {
    /// The response head ended in this write (status in `status`).
    pub response_start: bool,
    /// The status code, when `response_start`.
    pub status: u32,
    /// SSE events ended in the write, and how many carried content.
    pub events: u32,
    /// See `events`.
    pub content: u32,
    /// [`HTTP_FLAG_FIRST_CONTENT`] when one of them is the response's first content event.
    pub flags: u32,
    /// `HTTP_END_*` bits: the response ended.
    pub end: u32,
}

/// Settles a write of `ret` bytes: `Content-Length` accounting, the first content event, the end. `scanned`:
/// whether the bytes went through [`scan_byte`] (else they were a counted body).
#[inline(always)]
pub fn finish_write(x: &mut Scan, ret: u64, scanned: bool) -> WriteOutcome {
    let mut o = WriteOutcome {
        end: x.end,
        ..WriteOutcome::default()
    };
    if !scanned {
        x.st.remaining -= ret as i64;
        if x.st.remaining <= 0 {
            o.end |= HTTP_END_LENGTH;
        }
    }
    if x.head_end > 0 {
        o.response_start = true;
        o.status = x.st.status;
        if x.st.bits & B_CL_SEEN != 0 {
            let body = ret.saturating_sub(x.head_end - 1) as i64;
            x.st.remaining = x.st.content_length as i64 - body;
            if x.st.remaining <= 0 {
                o.end |= HTTP_END_LENGTH;
            }
        }
    }
    o.events = x.events;
    o.content = x.content;
    if x.content > 0 && x.st.bits & B_FIRST_SENT == 0 {
        x.st.bits |= B_FIRST_SENT;
        o.flags |= HTTP_FLAG_FIRST_CONTENT;
    }
    o
}
