//! Property test of the command line: every value-taking flag of every subcommand, fed hostile and random
//! values (huge, negative, NaN, overflowing units, fullwidth digits, NULs, random bytes), must parse to a
//! value or a clean clap error — never a panic — and a serve command line that parses must turn into
//! options or a usage error (`ServeOptions::from_config`), never a panic. Numbers that parse are bounded by
//! the one parser (`llmprof-units`), whose own tests cover its arithmetic.

use std::panic::{AssertUnwindSafe, catch_unwind};

use clap::{CommandFactory, Parser};

use super::{Cli, Command};

/// Values every flag is tried with.
const HOSTILE: &[&str] = &[
    "",
    " ",
    "-1",
    "-1s",
    "0",
    "0s",
    "0ms",
    "1",
    "1s",
    "1e400",
    "1e400s",
    "NaN",
    "nans",
    "inf",
    "infs",
    "-inf",
    "18446744073709551615",
    "18446744073709551616",
    "18446744073709551615s",
    "18446744073709551615h",
    "100000000000000000000",
    "99999999999999999999999h",
    "1.5.5s",
    "1_000s",
    "\u{ff11}s",
    "1\u{ff53}",
    "\u{0}",
    "1s\u{0}",
    "0x10",
    "1 s",
    "s",
    "KiB",
    "16EiB",
    "17EiB",
    "18446744073709551615KiB",
    "1.00000000000000000000000000000001s",
    "999999999999999999999999999999ms",
    "4294967296",
    "65536",
    "%n%n%s",
    "pid:0",
    "port:99999",
    "exe:",
    "http://[::1",
    "1%",
    "101%",
    "-5%",
    "1e-400%",
];

/// Arguments that make each subcommand's command line complete apart from the flag under test.
fn base(sub: &str) -> Vec<&'static str> {
    match sub {
        "attach" => vec!["attach", "--pid", "1"],
        "serve" => vec!["serve", "--out-dir", "/nonexistent/llmprof-fuzz"],
        "report" => vec!["report", "/nonexistent/trace.perfetto-trace"],
        "open" => vec!["open", "/nonexistent/trace.perfetto-trace"],
        "doctor" => vec!["doctor"],
        "calibrate-probes" => vec!["calibrate-probes"],
        other => panic!("subcommand {other} has no base command line here: add one"),
    }
}

/// A small deterministic generator (xorshift) for random values: no dependency, same cases on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Number-and-unit shaped strings, and some plain random bytes.
    fn value(&mut self) -> String {
        const UNITS: &[&str] = &[
            "", "ns", "us", "µs", "ms", "s", "m", "h", "d", "B", "K", "KB", "KiB", "M", "MiB", "G", "GiB",
            "T", "TiB", "P", "E", "EiB", "%", "x",
        ];
        match self.next() % 4 {
            0 => {
                let len = (self.next() % 12) as usize;
                (0..len)
                    .map(|_| char::from_u32((self.next() % 0x2fff) as u32).unwrap_or('?'))
                    .collect()
            }
            _ => {
                let digits = 1 + (self.next() % 30) as usize;
                let mut s: String = (0..digits)
                    .map(|_| char::from(b'0' + (self.next() % 10) as u8))
                    .collect();
                if self.next().is_multiple_of(3) {
                    s.push('.');
                    let frac = (self.next() % 25) as usize;
                    s.extend((0..frac).map(|_| char::from(b'0' + (self.next() % 10) as u8)));
                }
                if self.next().is_multiple_of(5) {
                    s.insert(0, '-');
                }
                s.push_str(UNITS[(self.next() as usize) % UNITS.len()]);
                s
            }
        }
    }
}

/// Parses `argv`; for serve, builds the options too. Panics are what the test looks for.
fn exercise(argv: &[String]) -> Result<(), String> {
    let run = catch_unwind(AssertUnwindSafe(|| {
        let Ok(cli) = Cli::try_parse_from(argv) else {
            return;
        };
        if let Command::Serve(s) = cli.command {
            let _ = crate::serve::ServeOptions::from_config((*s).into());
        }
    }));
    run.map_err(|p| {
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_default()
    })
}

#[test]
fn no_flag_value_makes_the_command_line_panic() {
    // Quiet: every caught panic would print its message and a backtrace.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut tried = 0usize;
    let mut flags = 0usize;
    let mut failures = Vec::new();
    let cmd = Cli::command();
    for sub in cmd.get_subcommands() {
        let name = sub.get_name();
        if name == "help" {
            continue;
        }
        for arg in sub.get_arguments() {
            if !arg.get_action().takes_values() {
                continue;
            }
            let Some(flag) = arg.get_long().map(|l| format!("--{l}")) else {
                continue;
            };
            flags += 1;
            let randoms: Vec<String> = (0..40).map(|_| rng.value()).collect();
            for v in HOSTILE.iter().map(|s| (*s).to_owned()).chain(randoms) {
                let argv: Vec<String> = std::iter::once("llmprof".to_owned())
                    .chain(base(name).into_iter().map(str::to_owned))
                    .chain([flag.clone(), v.clone()])
                    .collect();
                tried += 1;
                if let Err(msg) = exercise(&argv) {
                    failures.push(format!("{name} {flag} {v:?}: {msg}"));
                }
            }
        }
    }
    std::panic::set_hook(hook);
    assert!(
        flags >= 30,
        "only {flags} value flags found: the introspection is broken"
    );
    assert!(
        failures.is_empty(),
        "{} of {tried} command lines panicked:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
