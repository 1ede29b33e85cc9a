//! Durations and sizes as people type them: `30s`, `500ms`, `1.5s`, `2m`; `64MiB`, `512KiB`, `4096`.
//!
//! One owner for each parser: every binary of the workspace parses durations and sizes here (llmserve's
//! `--usage-stats-interval`; llmprof's `--duration`, `--ring-size`, `--max-trace-size`, … and the
//! `llmprof_duration` alert annotation), so a form one flag accepts every flag accepts, and every refusal names
//! the accepted forms.
//!
//! - [`parse_duration`]: a number (`30`, `1.5`, `.5`) and a unit, `ns`, `us` (or `µs`), `ms`, `s`, `m` (or `min`),
//!   `h`; a bare number is seconds. Exact decimal arithmetic, rounded to the nearest nanosecond.
//! - [`parse_size`] (and [`parse_size_usize`]): a whole number of bytes and a unit, `b`, `k`/`kb`/`kib`,
//!   `m`/`mb`/`mib`, `g`/`gb`/`gib` in any case, all binary multiples (`1M` = `1MiB` = 1,048,576 bytes); a
//!   bare number is bytes.
//!
//! Both ignore whitespace around the input and between the number and the unit, and both are total: any string
//! gives a value or a [`UnitsError`] that says what was wrong and what is accepted, never a panic (negative,
//! non-numeric, `inf`, `NaN`, exponents and values past `Duration::MAX` or `u64::MAX` bytes are errors).
//!
//! They fit clap's `value_parser` as they are: `#[arg(long, value_parser = llmprof_units::parse_duration)]`.
//!
//! ```
//! use std::time::Duration;
//! use llmprof_units::{parse_duration, parse_size};
//!
//! assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
//! assert_eq!(parse_duration("250 µs"), Ok(Duration::from_micros(250)));
//! assert_eq!(parse_size("64MiB"), Ok(64 << 20));
//! let e = parse_duration("100000000000000000000").unwrap_err();
//! assert!(e.to_string().starts_with("duration too large"));
//! ```
//!
//! This crate must never depend on anything (both the engine and the profiler link it) nor grow a second way to
//! spell a unit that only one binary understands.

use std::fmt;
use std::time::Duration;

/// Nanoseconds per unit of a duration (`""` is seconds).
const DURATION_UNITS: &[(&str, u128)] = &[
    ("ns", 1),
    ("us", 1_000),
    // U+00B5 MICRO SIGN and U+03BC GREEK SMALL LETTER MU: both are typed for "micro".
    ("\u{b5}s", 1_000),
    ("\u{3bc}s", 1_000),
    ("ms", 1_000_000),
    ("", NANOS_PER_SEC),
    ("s", NANOS_PER_SEC),
    ("m", 60 * NANOS_PER_SEC),
    ("min", 60 * NANOS_PER_SEC),
    ("h", 3_600 * NANOS_PER_SEC),
];

/// Bytes per unit of a size, matched case-insensitively (binary multiples, as the kernel's ring-buffer sizes).
const SIZE_UNITS: &[(&str, u64)] = &[
    ("", 1),
    ("b", 1),
    ("k", 1 << 10),
    ("kb", 1 << 10),
    ("kib", 1 << 10),
    ("m", 1 << 20),
    ("mb", 1 << 20),
    ("mib", 1 << 20),
    ("g", 1 << 30),
    ("gb", 1 << 30),
    ("gib", 1 << 30),
];

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// Fractional digits of a duration that can still matter: past 20 digits, a fraction of the largest unit (an
/// hour, 3.6e12 ns) moves the result by less than a nanosecond. Also keeps `fraction × unit` within `u128`.
const MAX_FRACTION_DIGITS: usize = 20;

/// Characters of the input quoted in an error (an alert annotation can be long).
const MAX_SHOWN_CHARS: usize = 64;

/// What was being parsed, for the error message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quantity {
    /// A duration ([`parse_duration`]).
    Duration,
    /// A size in bytes ([`parse_size`], [`parse_size_usize`]).
    Size,
}

impl Quantity {
    /// The accepted forms, as the error messages state them.
    pub fn accepted_forms(self) -> &'static str {
        match self {
            Quantity::Duration => {
                "a number and a unit: ns, us (or µs), ms, s, m (or min), h, e.g. 30s, 500ms, 1.5s, 2m; \
                 a bare number is seconds"
            }
            Quantity::Size => {
                "a whole number and a unit: b, k/kb/kib, m/mb/mib, g/gb/gib (binary multiples, any case), \
                 e.g. 64MiB, 512KiB, 1GiB; a bare number is bytes"
            }
        }
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Quantity::Duration => "duration",
            Quantity::Size => "size",
        })
    }
}

/// Why a duration or size was refused. Each message names the accepted forms.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum UnitsError {
    /// Nothing (or only whitespace) was given.
    Empty {
        /// Duration or size.
        quantity: Quantity,
    },
    /// The input does not start with a number: `fast`, `inf`, `NaN`, `+5s`, `1.2.3s`, or a fraction in a size.
    InvalidNumber {
        /// Duration or size.
        quantity: Quantity,
        /// The input (cut to 64 characters).
        input: String,
    },
    /// The input starts with a minus sign; durations and sizes are zero or more.
    Negative {
        /// Duration or size.
        quantity: Quantity,
        /// The input (cut to 64 characters).
        input: String,
    },
    /// The text after the number is not a known unit (`3 days`, `1e400`, `5 parsecs`).
    UnknownUnit {
        /// Duration or size.
        quantity: Quantity,
        /// The text after the number (cut to 64 characters).
        unit: String,
        /// The input (cut to 64 characters).
        input: String,
    },
    /// The value is past the largest one the result holds.
    TooLarge {
        /// Duration or size.
        quantity: Quantity,
        /// The input (cut to 64 characters).
        input: String,
        /// The largest value: whole seconds for a duration, bytes for a size.
        max: u64,
    },
}

impl fmt::Display for UnitsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UnitsError::Empty { quantity } => {
                write!(f, "empty {quantity}: give {}", quantity.accepted_forms())
            }
            UnitsError::InvalidNumber { quantity, input } => {
                write!(
                    f,
                    "invalid {quantity} {input:?}: give {}",
                    quantity.accepted_forms()
                )
            }
            UnitsError::Negative { quantity, input } => write!(
                f,
                "negative {quantity} {input:?}: a {quantity} is zero or more; give {}",
                quantity.accepted_forms()
            ),
            UnitsError::UnknownUnit {
                quantity,
                unit,
                input,
            } => write!(
                f,
                "unknown {quantity} unit {unit:?} in {input:?}: give {}",
                quantity.accepted_forms()
            ),
            UnitsError::TooLarge {
                quantity: Quantity::Duration,
                input,
                max,
            } => write!(
                f,
                "duration too large: {input:?}; at most {max}s (about 584 billion years)"
            ),
            UnitsError::TooLarge {
                quantity: Quantity::Size,
                input,
                max,
            } => write!(f, "size too large: {input:?}; at most {max} bytes"),
        }
    }
}

impl std::error::Error for UnitsError {}

/// Parses a duration: `30s`, `500ms`, `250us` (or `µs`), `100ns`, `2m` (or `min`), `1h`, `1.5s`, or a bare
/// number of seconds (`7`). See the [crate] docs for the grammar.
///
/// # Errors
/// [`UnitsError`] for an empty, negative or non-numeric input, an unknown unit, or a value past
/// [`Duration::MAX`].
pub fn parse_duration(input: &str) -> Result<Duration, UnitsError> {
    const Q: Quantity = Quantity::Duration;
    let (number, unit) = split(input, Q)?;
    let Some(&(_, unit_ns)) = DURATION_UNITS.iter().find(|(u, _)| *u == unit) else {
        return Err(unknown_unit(Q, unit, input));
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
        return Err(invalid_number(Q, input));
    }
    let too_large = || UnitsError::TooLarge {
        quantity: Q,
        input: shown(input),
        max: u64::MAX,
    };
    let whole_ns = digits_value(whole)
        .and_then(|w| w.checked_mul(unit_ns))
        .ok_or_else(too_large)?;
    let fraction = &fraction[..fraction.len().min(MAX_FRACTION_DIGITS)];
    let fraction_ns = match (digits_value(fraction), 10u128.checked_pow(fraction.len() as u32)) {
        // Rounded to the nearest nanosecond: (f × unit + scale / 2) / scale. Cannot overflow: f < 10^20 and
        // unit ≤ 3.6e12, so f × unit < 3.6e32 < u128::MAX (3.4e38).
        (Some(f), Some(scale)) => (f * unit_ns + scale / 2) / scale,
        _ => return Err(invalid_number(Q, input)),
    };
    let total_ns = whole_ns.checked_add(fraction_ns).ok_or_else(too_large)?;
    let secs = u64::try_from(total_ns / NANOS_PER_SEC).map_err(|_| too_large())?;
    // The remainder is below 10^9, so it fits u32 and `Duration::new` carries nothing into the seconds.
    let nanos = (total_ns % NANOS_PER_SEC) as u32;
    Ok(Duration::new(secs, nanos))
}

/// Parses a size in bytes: `64MiB`, `1M`, `512KiB`, `1GiB`, `8k`, `100b`, or a bare number of bytes (`4096`).
/// Every multiple is binary (`1M` = `1MiB` = 1,048,576); units match in any case.
///
/// # Errors
/// [`UnitsError`] for an empty, negative, fractional or non-numeric input, an unknown unit, or more than
/// `u64::MAX` bytes.
pub fn parse_size(input: &str) -> Result<u64, UnitsError> {
    const Q: Quantity = Quantity::Size;
    let (number, unit) = split(input, Q)?;
    if number.is_empty() || number.contains('.') {
        return Err(invalid_number(Q, input));
    }
    let lower = unit.to_ascii_lowercase();
    let Some(&(_, unit_bytes)) = SIZE_UNITS.iter().find(|(u, _)| *u == lower) else {
        return Err(unknown_unit(Q, unit, input));
    };
    digits_value(number)
        .and_then(|n| u64::try_from(n).ok())
        .and_then(|n| n.checked_mul(unit_bytes))
        .ok_or_else(|| UnitsError::TooLarge {
            quantity: Q,
            input: shown(input),
            max: u64::MAX,
        })
}

/// [`parse_size`] for a `usize` (buffer lengths, clap fields of type `usize`).
///
/// # Errors
/// As [`parse_size`], and [`UnitsError::TooLarge`] past `usize::MAX` on this platform.
pub fn parse_size_usize(input: &str) -> Result<usize, UnitsError> {
    let bytes = parse_size(input)?;
    usize::try_from(bytes).map_err(|_| UnitsError::TooLarge {
        quantity: Quantity::Size,
        input: shown(input),
        max: u64::try_from(usize::MAX).unwrap_or(u64::MAX),
    })
}

/// Splits the trimmed input into its leading number (ASCII digits and dots) and its unit (whitespace between
/// them dropped). Refuses empty and negative inputs.
fn split(input: &str, quantity: Quantity) -> Result<(&str, &str), UnitsError> {
    let s = input.trim();
    if s.is_empty() {
        return Err(UnitsError::Empty { quantity });
    }
    if s.starts_with('-') {
        return Err(UnitsError::Negative {
            quantity,
            input: shown(input),
        });
    }
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(end);
    if number.is_empty() {
        return Err(invalid_number(quantity, input));
    }
    Ok((number, unit.trim_start()))
}

/// The value of a string of ASCII digits (`Some(0)` for none); `None` past `u128::MAX`.
fn digits_value(digits: &str) -> Option<u128> {
    digits.bytes().try_fold(0u128, |acc, b| {
        acc.checked_mul(10)?.checked_add(u128::from(b.wrapping_sub(b'0')))
    })
}

fn invalid_number(quantity: Quantity, input: &str) -> UnitsError {
    UnitsError::InvalidNumber {
        quantity,
        input: shown(input),
    }
}

fn unknown_unit(quantity: Quantity, unit: &str, input: &str) -> UnitsError {
    UnitsError::UnknownUnit {
        quantity,
        unit: shown(unit),
        input: shown(input),
    }
}

/// The input as quoted in an error: its first 64 characters, `…` when cut.
fn shown(input: &str) -> String {
    let mut chars = input.chars();
    let mut s: String = chars.by_ref().take(MAX_SHOWN_CHARS).collect();
    if chars.next().is_some() {
        s.push('…');
    }
    s
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests unwrap to fail loudly")]
mod tests {
    use super::*;

    fn err(r: Result<impl fmt::Debug, UnitsError>) -> UnitsError {
        match r {
            Ok(v) => panic!("expected an error, got {v:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn durations_in_every_unit() {
        let ok = |s: &str| parse_duration(s).unwrap_or_else(|e| panic!("{s:?}: {e}"));
        assert_eq!(ok("30s"), Duration::from_secs(30));
        assert_eq!(ok("500ms"), Duration::from_millis(500));
        assert_eq!(ok("250us"), Duration::from_micros(250));
        assert_eq!(ok("250µs"), Duration::from_micros(250));
        assert_eq!(ok("250μs"), Duration::from_micros(250), "Greek mu");
        assert_eq!(ok("100ns"), Duration::from_nanos(100));
        assert_eq!(ok("2m"), Duration::from_secs(120));
        assert_eq!(ok("2min"), Duration::from_secs(120));
        assert_eq!(ok("1h"), Duration::from_secs(3600));
        assert_eq!(ok("1.5s"), Duration::from_millis(1500));
        assert_eq!(ok("7"), Duration::from_secs(7), "a bare number is seconds");
        assert_eq!(ok("0.25"), Duration::from_millis(250));
        assert_eq!(ok(".5s"), Duration::from_millis(500));
        assert_eq!(ok("5.s"), Duration::from_secs(5));
        assert_eq!(ok("0"), Duration::ZERO);
        assert_eq!(ok("0ms"), Duration::ZERO);
        assert_eq!(
            ok("0.1s"),
            Duration::from_millis(100),
            "exact, no binary floating point"
        );
        assert_eq!(ok("1.5h"), Duration::from_secs(5400));
        assert_eq!(ok("2.5us"), Duration::from_nanos(2500));
    }

    #[test]
    fn durations_ignore_surrounding_and_inner_whitespace() {
        assert_eq!(parse_duration(" 30s "), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("30 s"), Ok(Duration::from_secs(30)));
        assert_eq!(
            parse_duration("\t500\u{3000}ms\n"),
            Ok(Duration::from_millis(500))
        );
    }

    #[test]
    fn durations_round_to_the_nearest_nanosecond() {
        assert_eq!(parse_duration("1.4ns"), Ok(Duration::from_nanos(1)));
        assert_eq!(parse_duration("1.5ns"), Ok(Duration::from_nanos(2)));
        assert_eq!(parse_duration("0.0000000004s"), Ok(Duration::ZERO));
        assert_eq!(
            parse_duration("0.123456789s"),
            Ok(Duration::from_nanos(123_456_789))
        );
        // Digits past the 20th cannot change the result and are not an error.
        let long = format!("1.{}s", "3".repeat(500));
        assert_eq!(parse_duration(&long), Ok(Duration::new(1, 333_333_333)));
    }

    #[test]
    fn the_longest_duration_parses_and_one_nanosecond_more_does_not() {
        let max_secs = u64::MAX;
        assert_eq!(
            parse_duration(&format!("{max_secs}")),
            Ok(Duration::from_secs(max_secs))
        );
        assert_eq!(
            parse_duration(&format!("{max_secs}.999999999")),
            Ok(Duration::MAX)
        );
        assert!(matches!(
            parse_duration(&format!("{max_secs}.9999999995")),
            Err(UnitsError::TooLarge { .. })
        ));
        assert!(matches!(
            parse_duration(&format!("{}", u128::from(max_secs) + 1)),
            Err(UnitsError::TooLarge { .. })
        ));
    }

    #[test]
    fn duration_errors_say_what_is_wrong_and_what_is_accepted() {
        let e = err(parse_duration("100000000000000000000"));
        assert!(matches!(e, UnitsError::TooLarge { .. }), "{e:?}");
        assert!(e.to_string().starts_with("duration too large"), "{e}");
        assert!(e.to_string().contains("18446744073709551615s"), "{e}");
        for huge in ["99999999999999999999999h", &"9".repeat(400), "1e400"] {
            let e = err(parse_duration(huge));
            assert!(
                matches!(e, UnitsError::TooLarge { .. } | UnitsError::UnknownUnit { .. }),
                "{huge}: {e:?}"
            );
        }
        assert_eq!(
            err(parse_duration("1e400")),
            UnitsError::UnknownUnit {
                quantity: Quantity::Duration,
                unit: "e400".into(),
                input: "1e400".into()
            }
        );
        for bad in ["inf", "NaN", "fast", "+5s", "1.2.3s", ".", "..s", "s", "µs", "e5"] {
            let e = err(parse_duration(bad));
            assert!(matches!(e, UnitsError::InvalidNumber { .. }), "{bad}: {e:?}");
            assert!(e.to_string().contains("e.g. 30s, 500ms"), "{e}");
        }
        for neg in ["-1", "-0.5s", " -3m"] {
            let e = err(parse_duration(neg));
            assert!(matches!(e, UnitsError::Negative { .. }), "{neg}: {e:?}");
            assert!(e.to_string().starts_with("negative duration"), "{e}");
        }
        for empty in ["", "   ", "\n\t"] {
            assert_eq!(
                err(parse_duration(empty)),
                UnitsError::Empty {
                    quantity: Quantity::Duration
                }
            );
        }
        for unit in ["3 days", "5S", "1hr", "2 m s", "10sec"] {
            let e = err(parse_duration(unit));
            assert!(matches!(e, UnitsError::UnknownUnit { .. }), "{unit}: {e:?}");
            assert!(
                e.to_string().contains("ns, us (or µs), ms, s, m (or min), h"),
                "{e}"
            );
        }
    }

    #[test]
    fn sizes_in_every_unit() {
        let ok = |s: &str| parse_size(s).unwrap_or_else(|e| panic!("{s:?}: {e}"));
        assert_eq!(ok("4096"), 4096);
        assert_eq!(ok("100b"), 100);
        assert_eq!(ok("100B"), 100);
        for k in ["8k", "8kb", "8KiB", "8K", "8KB", "8kib"] {
            assert_eq!(ok(k), 8 << 10, "{k}");
        }
        for m in ["64m", "64MB", "64MiB", "64M", "64mib"] {
            assert_eq!(ok(m), 64 << 20, "{m}");
        }
        for g in ["1g", "1GB", "1GiB", "1G"] {
            assert_eq!(ok(g), 1 << 30, "{g}");
        }
        assert_eq!(ok("512KiB"), 512 << 10);
        assert_eq!(ok(" 1 MiB "), 1 << 20);
        assert_eq!(ok("0"), 0);
        assert_eq!(ok(&u64::MAX.to_string()), u64::MAX);
        assert_eq!(parse_size_usize("64MiB"), Ok(64 << 20));
    }

    #[test]
    fn size_errors_say_what_is_wrong_and_what_is_accepted() {
        for bad in ["lots", "1.5GiB", "inf", "NaN", "+1k", "MiB", ".5k"] {
            let e = err(parse_size(bad));
            assert!(matches!(e, UnitsError::InvalidNumber { .. }), "{bad}: {e:?}");
            assert!(e.to_string().contains("e.g. 64MiB"), "{e}");
        }
        for unit in ["1TiB", "5 parsecs", "1e9", "10 k b"] {
            let e = err(parse_size(unit));
            assert!(matches!(e, UnitsError::UnknownUnit { .. }), "{unit}: {e:?}");
            assert!(e.to_string().contains("k/kb/kib"), "{e}");
        }
        for huge in ["18446744073709551616", "17179869184GiB", &"9".repeat(300)] {
            let e = err(parse_size(huge));
            assert!(matches!(e, UnitsError::TooLarge { .. }), "{huge}: {e:?}");
            assert!(e.to_string().starts_with("size too large"), "{e}");
        }
        assert!(matches!(err(parse_size("-1")), UnitsError::Negative { .. }));
        assert!(matches!(err(parse_size_usize("-1")), UnitsError::Negative { .. }));
        assert_eq!(
            err(parse_size(" ")),
            UnitsError::Empty {
                quantity: Quantity::Size
            }
        );
    }

    #[test]
    fn errors_quote_a_long_input_cut_short() {
        let long = format!("{}x", "1".repeat(1000));
        let msg = err(parse_duration(&long)).to_string();
        assert!(msg.len() < 400, "{msg}");
        assert!(msg.contains('…'), "{msg}");
    }

    /// The signature clap's `value_parser` takes for a function (`TypedValueParser for F where F: Fn(&str) ->
    /// Result<T, E>, E: Into<Box<dyn Error + Send + Sync + 'static>>`, T: Clone + Send + Sync + 'static).
    fn takes_a_clap_value_parser<T, E>(_: fn(&str) -> Result<T, E>)
    where
        T: Clone + Send + Sync + 'static,
        E: Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    {
    }

    #[test]
    fn parsers_fit_clap_value_parser() {
        takes_a_clap_value_parser(parse_duration);
        takes_a_clap_value_parser(parse_size);
        takes_a_clap_value_parser(parse_size_usize);
        let boxed: Box<dyn std::error::Error + Send + Sync> = err(parse_duration("3 days")).into();
        assert!(
            boxed.to_string().starts_with("unknown duration unit \"days\""),
            "{boxed}"
        );
    }

    /// A small deterministic generator (xorshift64*), so the property tests need no dependency.
    struct Gen(u64);

    impl Gen {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
        fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
            xs[self.below(xs.len())]
        }
    }

    /// Pieces odd strings are made of: numbers of every length, signs, dots, exponents, every unit of both
    /// parsers in several cases, words, unicode (multi-byte, combining, zero-width, NUL) and whitespace.
    const PIECES: &[&str] = &[
        "0",
        "1",
        "7",
        "42",
        "999",
        "18446744073709551615",
        "18446744073709551616",
        "340282366920938463463374607431768211456",
        ".",
        "..",
        "-",
        "+",
        "e",
        "E",
        "e400",
        "e-9",
        "inf",
        "NaN",
        "infinity",
        "0x10",
        "1_000",
        "ns",
        "us",
        "µs",
        "μs",
        "ms",
        "s",
        "m",
        "min",
        "h",
        "S",
        "H",
        "MS",
        "d",
        "days",
        "b",
        "k",
        "kb",
        "kib",
        "KiB",
        "M",
        "MB",
        "MiB",
        "g",
        "GB",
        "GiB",
        "TiB",
        " ",
        "\t",
        "\n",
        "\u{3000}",
        "\u{200b}",
        "\u{0}",
        "é",
        "中",
        "\u{301}",
        "🦀",
        "١٢٣",
        "½",
    ];

    fn odd_string(g: &mut Gen) -> String {
        let mut s = String::new();
        for _ in 0..g.below(7) {
            match g.below(10) {
                // Long digit runs: past u64, u128 and f64's range.
                0 => s.push_str(&"9".repeat(g.below(500))),
                1 => s.push_str(&g.next().to_string()),
                _ => s.push_str(g.pick(PIECES)),
            }
        }
        s
    }

    #[test]
    fn thousands_of_odd_strings_never_panic_and_every_error_explains_itself() {
        let mut g = Gen(0x9E37_79B9_7F4A_7C15);
        let mut oks = 0;
        for _ in 0..5_000 {
            let s = odd_string(&mut g);
            for r in [
                parse_duration(&s).map(|_| ()),
                parse_size(&s).map(|_| ()),
                parse_size_usize(&s).map(|_| ()),
            ] {
                match r {
                    Ok(()) => oks += 1,
                    Err(e) => {
                        let msg = e.to_string();
                        assert!(msg.contains("e.g.") || msg.contains("too large"), "{s:?}: {msg}");
                    }
                }
            }
        }
        assert!(oks > 100, "the generator also makes valid inputs ({oks})");
    }

    #[test]
    fn generated_values_in_every_unit_parse_exactly() {
        let mut g = Gen(12345);
        for _ in 0..5_000 {
            let n = g.next() >> g.below(64);
            let (unit, ns) = DURATION_UNITS[g.below(DURATION_UNITS.len())];
            let want = u128::from(n).checked_mul(ns).and_then(|t| {
                let secs = u64::try_from(t / NANOS_PER_SEC).ok()?;
                Some(Duration::new(secs, (t % NANOS_PER_SEC) as u32))
            });
            let got = parse_duration(&format!("{n}{unit}"));
            match want {
                Some(d) => assert_eq!(got, Ok(d), "{n}{unit}"),
                None => assert!(
                    matches!(got, Err(UnitsError::TooLarge { .. })),
                    "{n}{unit}: {got:?}"
                ),
            }

            let (unit, bytes) = SIZE_UNITS[g.below(SIZE_UNITS.len())];
            let unit = if g.below(2) == 0 {
                unit.to_ascii_uppercase()
            } else {
                unit.to_string()
            };
            let got = parse_size(&format!("{n}{unit}"));
            match n.checked_mul(bytes) {
                Some(b) => assert_eq!(got, Ok(b), "{n}{unit}"),
                None => assert!(
                    matches!(got, Err(UnitsError::TooLarge { .. })),
                    "{n}{unit}: {got:?}"
                ),
            }
        }
    }
}
