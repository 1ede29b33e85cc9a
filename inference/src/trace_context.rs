//! W3C Trace Context (`traceparent`, https://www.w3.org/TR/trace-context/#traceparent-header) and `x-request-id`.
//!
//! Owns parsing of the caller's trace context so it can travel with the request into the probe records. Invalid
//! headers are ignored (as the spec asks), never an error for the client.

/// Longest `x-request-id` kept (the probe record holds [`llmprof_abi::REQUEST_ID_LEN`] bytes; we keep a little
/// more for logs and the response header).
pub const MAX_REQUEST_ID_LEN: usize = 128;

/// A parsed `traceparent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TraceContext {
    /// 16-byte trace id.
    pub trace_id: [u8; 16],
    /// 8-byte parent span id.
    pub parent_span_id: [u8; 8],
    /// Trace flags (bit 0: sampled).
    pub flags: u8,
}

fn hex_into(s: &str, out: &mut [u8]) -> Option<()> {
    if s.len() != out.len() * 2 {
        return None;
    }
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(())
}

impl TraceContext {
    /// Parses `version-traceid-parentid-flags`. Accepts future versions (more fields) as the spec says; rejects
    /// version `ff`, all-zero ids, upper-case hex and wrong lengths.
    pub fn parse(header: &str) -> Option<Self> {
        let h = header.trim();
        if h.bytes().any(|b| b.is_ascii_uppercase()) {
            return None;
        }
        let mut parts = h.split('-');
        let version = parts.next()?;
        let trace = parts.next()?;
        let parent = parts.next()?;
        let flags = parts.next()?;
        if version.len() != 2 || version == "ff" || u8::from_str_radix(version, 16).is_err() {
            return None;
        }
        if version == "00" && parts.next().is_some() {
            return None;
        }
        let mut tc = TraceContext::default();
        hex_into(trace, &mut tc.trace_id)?;
        hex_into(parent, &mut tc.parent_span_id)?;
        let mut f = [0u8; 1];
        hex_into(flags, &mut f)?;
        tc.flags = f[0];
        if tc.trace_id == [0; 16] || tc.parent_span_id == [0; 8] {
            return None;
        }
        Some(tc)
    }
}

/// Keeps an `x-request-id` if it is printable ASCII, truncated to [`MAX_REQUEST_ID_LEN`].
pub fn sanitize_request_id(v: &str) -> Option<String> {
    let v = v.trim();
    if v.is_empty() || !v.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return None;
    }
    Some(v.chars().take(MAX_REQUEST_ID_LEN).collect())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests unwrap to fail loudly")]
mod tests {
    use super::*;

    #[test]
    fn parses_the_spec_example() {
        let tc = TraceContext::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        assert_eq!(tc.trace_id[0], 0x4b);
        assert_eq!(tc.trace_id[15], 0x36);
        assert_eq!(
            tc.parent_span_id,
            [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]
        );
        assert_eq!(tc.flags, 1);
    }

    #[test]
    fn rejects_invalid_headers() {
        for h in [
            "",
            "garbage",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-zz",
        ] {
            assert!(TraceContext::parse(h).is_none(), "{h}");
        }
        assert!(
            TraceContext::parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-future").is_some()
        );
    }

    #[test]
    fn request_ids_are_sanitized() {
        assert_eq!(sanitize_request_id(" abc-1 ").as_deref(), Some("abc-1"));
        assert_eq!(sanitize_request_id("a\u{1}b"), None);
        assert_eq!(
            sanitize_request_id(&"x".repeat(500)).unwrap().len(),
            MAX_REQUEST_ID_LEN
        );
    }
}
