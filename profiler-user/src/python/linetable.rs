//! Instruction → source line, from a code object's `co_linetable` bytes.
//!
//! Two formats: 3.10's (PEP 626, Objects/lnotab_notes.txt of 3.10: pairs of an unsigned byte-offset delta
//! and a signed line delta, -128 = no line) and the location table of 3.11+ (Objects/locations.md:
//! variable-length entries covering 1–8 code units each). Pure functions of the bytes; never read memory. The
//! bytes come from another process and may be anything (a process mid-exec): arithmetic on them never panics.

/// The line of the instruction at byte offset `addr` (3.10: `2 * f_lasti`) in a 3.10 line table that
/// starts at `firstlineno`. None: the instruction has no line (or lies past the table).
pub fn line_310(table: &[u8], firstlineno: i32, addr: u64) -> Option<i32> {
    let mut line = firstlineno;
    let mut start = 0u64;
    for pair in table.chunks_exact(2) {
        let end = start.saturating_add(u64::from(pair[0]));
        let ldelta = pair[1] as i8;
        let this = if ldelta == -128 {
            None
        } else {
            line = line.wrapping_add(i32::from(ldelta));
            Some(line)
        };
        if addr >= start && addr < end {
            return this;
        }
        start = end;
    }
    None
}

/// Reads an unsigned varint of the location table (6-bit chunks, low first; bit 6 = more).
fn varint(it: &mut std::slice::Iter<'_, u8>) -> Option<u32> {
    let mut v = 0u32;
    let mut shift = 0;
    loop {
        let b = *it.next()?;
        v |= u32::from(b & 63).checked_shl(shift)?;
        shift += 6;
        if b & 64 == 0 {
            return Some(v);
        }
    }
}

/// A signed varint: the unsigned value's low bit is the sign.
fn svarint(it: &mut std::slice::Iter<'_, u8>) -> Option<i32> {
    let u = varint(it)?;
    let mag = (u >> 1) as i32;
    Some(if u & 1 != 0 { -mag } else { mag })
}

/// The line of the instruction at code-unit index `index` in a 3.11+ location table that starts at
/// `firstlineno`. None: no location recorded for it, or a malformed table.
pub fn line_311(table: &[u8], firstlineno: i32, index: u64) -> Option<i32> {
    let mut it = table.iter();
    let mut line = firstlineno;
    let mut start = 0u64;
    while let Some(&first) = it.next() {
        if first & 0x80 == 0 {
            return None;
        }
        let code = (first >> 3) & 15;
        let len = u64::from(first & 7) + 1;
        let this = match code {
            15 => None,
            14 => {
                line = line.wrapping_add(svarint(&mut it)?);
                varint(&mut it)?;
                varint(&mut it)?;
                varint(&mut it)?;
                Some(line)
            }
            13 => {
                line = line.wrapping_add(svarint(&mut it)?);
                Some(line)
            }
            10..=12 => {
                line = line.wrapping_add(i32::from(code) - 10);
                it.next()?;
                it.next()?;
                Some(line)
            }
            _ => {
                it.next()?;
                Some(line)
            }
        };
        if index >= start && index < start.saturating_add(len) {
            return this;
        }
        start = start.saturating_add(len);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_from_another_process_never_panics() {
        // A "long form" entry whose line delta is ~2^30, on a first line of i32::MAX; byte deltas of 255.
        let big = [0xE8, 0x7e, 0x7f, 0x7f, 0x7f, 0x7f, 0x03];
        assert!(line_311(&big, i32::MAX, 0).is_some());
        assert_eq!(line_311(&big, i32::MAX, u64::MAX), None);
        let wide = [255u8, 127].repeat(64);
        assert!(line_310(&wide, i32::MAX, 255).is_some());
        assert_eq!(line_310(&wide, i32::MAX, u64::MAX), None);
    }

    #[test]
    fn lines_of_a_310_table() {
        // 6 bytes on line first+1, 4 bytes without a line, 2 bytes on line first+3.
        let t = [6u8, 1, 4, 0x80, 2, 2];
        assert_eq!(line_310(&t, 10, 0), Some(11));
        assert_eq!(line_310(&t, 10, 5), Some(11));
        assert_eq!(line_310(&t, 10, 6), None);
        assert_eq!(line_310(&t, 10, 10), Some(13));
        assert_eq!(line_310(&t, 10, 12), None);
    }

    #[test]
    fn lines_of_a_311_location_table() {
        // Entry 1: code 13 (no column), 2 units, line delta +1 (svarint 2).
        // Entry 2: code 11 (one line, +1), 3 units, columns 4, 9.
        // Entry 3: code 15 (none), 1 unit.
        // Entry 4: code 14 (long), 1 unit, line delta -1 (svarint 3), end line 0, cols 1, 2.
        // Entry 5: code 0 (short, same line), 1 unit.
        let t = [
            0x80 | (13 << 3) | 1,
            2,
            0x80 | (11 << 3) | 2,
            4,
            9,
            0x80 | (15 << 3),
            0x80 | (14 << 3),
            3,
            0,
            1,
            2,
            0x80,
            0x11,
        ];
        assert_eq!(line_311(&t, 100, 0), Some(101));
        assert_eq!(line_311(&t, 100, 1), Some(101));
        assert_eq!(line_311(&t, 100, 2), Some(102));
        assert_eq!(line_311(&t, 100, 4), Some(102));
        assert_eq!(line_311(&t, 100, 5), None);
        assert_eq!(line_311(&t, 100, 6), Some(101));
        assert_eq!(line_311(&t, 100, 7), Some(101));
        assert_eq!(line_311(&t, 100, 8), None);
    }
}
