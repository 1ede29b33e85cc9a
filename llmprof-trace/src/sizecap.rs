//! `--max-trace-size`: a hard cap on the trace file.
//!
//! Owns the decision "may one more event be written?". The trace must still end cleanly when the cap is
//! reached (open slices closed, drop counters, summary), and that ending takes bytes too: the cap keeps a
//! reserve for it, [`RESERVE_BASE`] plus [`RESERVE_PER_OPEN`] per slice still open, so the finished file is
//! never larger than the cap. The smallest cap accepted is [`MIN_LIMIT`]: below it, the reserve would leave
//! no room for events.

/// Bytes kept for the end of the trace: the summary (with its top syscalls and self-accounting), the
/// per-probe drop counters and the size marker are ~3–6 KiB; twice the worst seen, rounded up.
pub const RESERVE_BASE: u64 = 16 << 10;
/// Bytes kept per slice still open (a slice end with its `closed_by` arg is < 40 bytes).
pub const RESERVE_PER_OPEN: u64 = 64;
/// Smallest `--max-trace-size`.
pub const MIN_LIMIT: u64 = 64 << 10;

/// The cap of one session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SizeCap {
    limit: u64,
}

impl SizeCap {
    /// A cap of `limit` bytes; a clear error below [`MIN_LIMIT`].
    pub fn new(limit: u64) -> Result<Self, String> {
        if limit < MIN_LIMIT {
            return Err(format!(
                "--max-trace-size {limit} bytes is too small: at least {} KiB (the end of the trace needs ~{} KiB)",
                MIN_LIMIT >> 10,
                RESERVE_BASE >> 10
            ));
        }
        Ok(SizeCap { limit })
    }

    /// The cap, bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Whether writing must stop, with `written` bytes so far and `open` slices still to close.
    pub fn reached(&self, written: u64, open: usize) -> bool {
        written + RESERVE_BASE + RESERVE_PER_OPEN * open as u64 >= self.limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_grows_with_what_is_open() {
        let c = SizeCap::new(1 << 20).expect("1 MiB is a valid cap");
        assert!(!c.reached(0, 0));
        assert!(c.reached((1 << 20) - RESERVE_BASE, 0));
        assert!(!c.reached((1 << 20) - RESERVE_BASE - 1, 0));
        assert!(c.reached((1 << 20) - RESERVE_BASE - 64, 1));
        assert!(SizeCap::new(1000).unwrap_err().contains("too small"));
    }
}
