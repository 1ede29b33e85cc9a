//! Incremental, UTF-8-safe detokenization with stop strings: the [`Detokenizer`] each live request owns.
//!
//! Owns the turn of token bytes into text a client may see: bytes wait until they form whole UTF-8 characters
//! (invalid ones become U+FFFD), text that could still become a stop string is held back, and a stop string cuts
//! the text before it. Knows nothing of tokens, requests or channels: the loop hands it bytes and sends what
//! [`Detokenizer::take`] returns.
//!
//! It must never release text it may have to take back (a prefix of a stop string, half a character), and never
//! panic on any byte sequence a model can produce.

/// Incremental, UTF-8-safe detokenization with stop strings.
///
/// Token bytes accumulate until they form complete UTF-8 characters (invalid bytes become U+FFFD). Text that could
/// be the start of a stop string is held back until it is known not to be one.
#[derive(Debug, Default)]
pub struct Detokenizer {
    pending: Vec<u8>,
    text: String,
    sent: usize,
    stop: Vec<String>,
    hold: usize,
}

fn floor_boundary(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

impl Detokenizer {
    /// A detokenizer stopping at any of `stop` (empty strings ignored).
    pub fn new(stop: Vec<String>) -> Self {
        let stop: Vec<String> = stop.into_iter().filter(|s| !s.is_empty()).collect();
        let hold = stop.iter().map(|s| s.len()).max().unwrap_or(1).saturating_sub(1);
        Self {
            stop,
            hold,
            ..Default::default()
        }
    }

    fn decode_pending(&mut self, flush: bool) {
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    self.text.push_str(s);
                    self.pending.clear();
                    return;
                }
                Err(e) => {
                    let v = e.valid_up_to();
                    self.text.push_str(&String::from_utf8_lossy(&self.pending[..v]));
                    match e.error_len() {
                        Some(n) => {
                            self.text.push('\u{FFFD}');
                            self.pending.drain(..v + n);
                        }
                        None if flush => {
                            self.text.push('\u{FFFD}');
                            self.pending.clear();
                            return;
                        }
                        None => {
                            self.pending.drain(..v);
                            return;
                        }
                    }
                }
            }
        }
    }

    /// Adds a token's bytes. Returns true when a stop string appeared (the text is cut before it).
    pub fn push(&mut self, bytes: &[u8]) -> bool {
        self.pending.extend_from_slice(bytes);
        self.decode_pending(false);
        self.check_stop()
    }

    fn check_stop(&mut self) -> bool {
        if self.stop.is_empty() {
            return false;
        }
        let from = floor_boundary(&self.text, self.sent.saturating_sub(self.hold));
        let hay = &self.text[from..];
        let hit = self.stop.iter().filter_map(|s| hay.find(s.as_str())).min();
        if let Some(p) = hit {
            self.text.truncate(from + p);
            self.pending.clear();
            return true;
        }
        false
    }

    /// Everything released to the client so far (after `take(true)`: the whole completion).
    pub fn released(&self) -> &str {
        &self.text[..self.sent]
    }

    /// Text that is safe to send now (`last`: everything, flushing incomplete bytes).
    pub fn take(&mut self, last: bool) -> String {
        if last {
            self.decode_pending(true);
            if self.check_stop() {
                // The flush completed a stop string: the text is already cut.
            }
        }
        let end = if last {
            self.text.len()
        } else {
            floor_boundary(&self.text, self.text.len().saturating_sub(self.hold))
        };
        if end <= self.sent {
            return String::new();
        }
        let s = self.text[self.sent..end].to_string();
        self.sent = end;
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detokenizer_waits_for_complete_utf8() {
        let mut d = Detokenizer::new(vec![]);
        let e = "é".as_bytes();
        assert!(!d.push(&e[..1]));
        assert_eq!(d.take(false), "");
        d.push(&e[1..]);
        assert_eq!(d.take(false), "é");
        d.push(&[0xff]);
        d.push(b"a");
        assert_eq!(d.take(false), "\u{FFFD}a");
        d.push(&[0xe2, 0x82]);
        assert_eq!(d.take(true), "\u{FFFD}");
    }

    #[test]
    fn detokenizer_stops_across_tokens_and_never_leaks_a_partial_stop() {
        let mut d = Detokenizer::new(vec!["STOP".into()]);
        assert!(!d.push(b"hello S"));
        let a = d.take(false);
        assert!(!d.push(b"TO"));
        let b = d.take(false);
        assert!(d.push(b"P and more"));
        let c = d.take(true);
        assert_eq!(format!("{a}{b}{c}"), "hello ");
        assert!(!a.contains('S') && !b.contains('S'));
    }
}
