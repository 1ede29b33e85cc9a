//! `--help`, `-h` and `help` of every task print its usage and do none of its work; a wrong argument is a
//! usage error. Runs the built xtask binary the way a person would, in an environment where any work would
//! show: an empty cache directory that must stay empty and an empty PATH (no cargo, apt-get, pip, rustup to
//! start), with `RUST_BACKTRACE=1` so anyhow's backtrace noise would show too.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Every task and bench kind, as typed after `cargo xtask`.
const COMMANDS: &[&[&str]] = &[
    &["demo"],
    &["test"],
    &["setup"],
    &["fetch-model"],
    &["setup-ebpf"],
    &["build-ebpf"],
    &["setup-tools"],
    &["setup-otel-tools"],
    &["bench"],
    &["bench", "engine"],
    &["bench", "attach"],
    &["bench", "serve"],
    &["bench", "syscalls"],
    &["bench", "kernels"],
    &["bench", "decode"],
    &["bench", "probes"],
    &["bench", "trace"],
];

/// A fresh, empty directory for one run's `$HOME` and `$XDG_CACHE_HOME`.
fn scratch_dir() -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "xtask-help-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("creating a scratch directory");
    dir
}

/// Runs xtask with `args` in the sandbox; the output, and whether the sandbox stayed empty.
fn xtask(args: &[&str]) -> (Output, bool) {
    let dir = scratch_dir();
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(args)
        .current_dir(&dir)
        .env_clear()
        .env("PATH", "")
        .env("HOME", &dir)
        .env("XDG_CACHE_HOME", &dir)
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("running xtask");
    let untouched = is_empty(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    (out, untouched)
}

fn is_empty(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_none())
}

/// The ways to ask for `cmd`'s help.
fn help_spellings(cmd: &[&str]) -> Vec<Vec<String>> {
    let words = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let mut out = vec![
        words(&[cmd, &["--help"]].concat()),
        words(&[cmd, &["-h"]].concat()),
        words(&[cmd, &["help"]].concat()),
        words(&[&["help"], cmd].concat()),
    ];
    if let [parent, kind] = cmd {
        out.push(words(&[parent, "help", kind]));
    }
    out
}

#[test]
fn every_task_prints_its_usage_and_does_nothing_else() {
    for cmd in COMMANDS {
        let usage = format!("Usage: cargo xtask {}", cmd.join(" "));
        for args in help_spellings(cmd) {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let (out, untouched) = xtask(&args);
            let stdout = String::from_utf8_lossy(&out.stdout);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                out.status.success(),
                "`cargo xtask {}` exited with {}:\n{stdout}{stderr}",
                args.join(" "),
                out.status
            );
            assert!(
                stdout.contains(&usage),
                "`cargo xtask {}` did not print {usage:?}:\n{stdout}",
                args.join(" ")
            );
            assert!(
                stderr.is_empty(),
                "`cargo xtask {}` wrote to stderr (it did some work?):\n{stderr}",
                args.join(" ")
            );
            assert!(
                untouched,
                "`cargo xtask {}` wrote into the cache directory",
                args.join(" ")
            );
        }
    }
}

#[test]
fn no_task_lists_every_task() {
    for args in [&[][..], &["--help"], &["help"]] {
        let (out, untouched) = xtask(args);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "`cargo xtask {}`: {}",
            args.join(" "),
            out.status
        );
        assert!(stdout.contains("Usage: cargo xtask"), "{stdout}");
        for cmd in COMMANDS.iter().filter(|c| c.len() == 1) {
            assert!(
                stdout.contains(&format!("\n  {} ", cmd[0])),
                "{} not listed:\n{stdout}",
                cmd[0]
            );
        }
        assert!(untouched);
    }
}

#[test]
fn a_wrong_argument_is_one_error_line_and_the_usage() {
    // (arguments, whether clap prints the usage line: it does for unknown words, and points at --help for a
    // bad or missing value)
    for (args, usage) in [
        (&["nope"][..], true),
        (&["test-ebpf"], true),
        (&["setup", "--nope"], true),
        (&["setup-ebpf", "now"], true),
        (&["build-ebpf", "--chek"], true),
        (&["bench", "nope"], true),
        (&["bench", "engine", "--levls", "8"], true),
        (&["bench", "syscalls", "--model", "m.gguf"], true),
        (&["bench", "syscalls", "--rounds"], false),
        (&["bench", "engine", "--levels", "1,x"], false),
        (&["demo", "ten"], false),
    ] {
        let (out, untouched) = xtask(args);
        let cmd = args.join(" ");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "`cargo xtask {cmd}`:\n{stderr}");
        assert!(out.stdout.is_empty(), "`cargo xtask {cmd}` wrote to stdout");
        assert!(
            stderr.starts_with("error: ") && stderr.lines().filter(|l| l.starts_with("error")).count() == 1,
            "`cargo xtask {cmd}`: not one error line:\n{stderr}"
        );
        assert!(
            !stderr.contains("backtrace") && !stderr.contains("Caused by"),
            "`cargo xtask {cmd}`: anyhow noise:\n{stderr}"
        );
        assert!(
            stderr.contains("--help"),
            "`cargo xtask {cmd}`: no pointer to the usage:\n{stderr}"
        );
        if usage {
            assert!(
                stderr.contains("Usage: cargo xtask"),
                "`cargo xtask {cmd}`: no usage:\n{stderr}"
            );
        }
        assert!(untouched, "`cargo xtask {cmd}` wrote into the cache directory");
    }
}
