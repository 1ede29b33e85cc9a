//! The command line of `cargo xtask`: every task, its arguments and its `--help`.
//!
//! Owns parsing only: a parsed [`Task`] is handed to its module by `main`. Parsing never does any of a task's
//! work, so `--help`, `-h` and `help` (`cargo xtask help bench engine`, `cargo xtask bench help engine`,
//! `cargo xtask demo help`) print usage on stdout and exit 0 for every task, and a wrong argument is one
//! `error:` line, the usage, and exit status 2.

use std::ffi::OsString;

use clap::{CommandFactory, Parser, Subcommand};

/// What `cargo xtask` without a task prints before the list of tasks.
const ABOUT: &str = "Project tasks: setup of everything the demo and the tests need, the eBPF build, the demo, \
                     the test flow, benchmarks.";

/// Examples printed under the list of tasks.
const EXAMPLES: &str = "Examples:
  sudo -E cargo xtask demo 30          engine + load + llmprof attach for 30 s -> a Perfetto trace
  cargo xtask test                     every test, as CI runs them
  cargo xtask test -p llmprof -- --nocapture
  cargo xtask build-ebpf --check       fail when the committed eBPF object differs from its source
  cargo xtask help bench engine        the options of one bench";

/// `cargo xtask`.
#[derive(Parser, Debug)]
#[command(name = "cargo xtask", bin_name = "cargo xtask", about = ABOUT, after_help = EXAMPLES)]
pub struct Cli {
    /// The task; none prints this help.
    #[command(subcommand)]
    pub task: Option<Task>,
}

/// One task of `cargo xtask`.
#[derive(Subcommand, Debug)]
pub enum Task {
    /// The main job: engine on the default model + load + llmprof attach -> a Perfetto trace (root).
    #[command(after_help = "Example: sudo -E cargo xtask demo 30")]
    Demo {
        /// How long llmprof records.
        #[arg(value_name = "SECONDS", default_value_t = 20)]
        seconds: u64,
    },
    /// Every test, as CI runs them: setup, eBPF object check, fmt, clippy, build, `cargo test --workspace`.
    #[command(
        after_help = "Examples:\n  cargo xtask test\n  cargo xtask test -p llmprof --test cli_attach -- --nocapture"
    )]
    Test(TestArgs),
    /// Install everything the demo and the tests need (model, test tools, the servers venv, eBPF build chain).
    Setup {
        /// Download the model again even when it is present.
        #[arg(long)]
        force: bool,
    },
    /// Fetch the default GGUF (SmolLM2-135M-Instruct Q4_1) into the model cache.
    FetchModel {
        /// Download it again even when it is present.
        #[arg(long)]
        force: bool,
    },
    /// Install the eBPF build chain (a compiler able to build core for bpfel, bpf-linker).
    SetupEbpf,
    /// Rebuild the committed eBPF object from profiler-ebpf/.
    BuildEbpf {
        /// Fail when the committed object differs from a fresh build, write nothing (CI).
        #[arg(long)]
        check: bool,
    },
    /// Install the test tools (Perfetto trace processor, Prometheus, Alertmanager, OpenAI client, rotel).
    SetupTools,
    /// Install the rotel OTLP collector only.
    SetupOtelTools,
    /// `cargo install --locked --path profiler-user` into a temporary root, then that binary's --version,
    /// doctor --json and a short attach (root).
    InstallCheck {
        /// Install the dev profile (what `cargo build` built: nothing compiled again) instead of release.
        #[arg(long)]
        debug: bool,
    },
    /// Release artefacts in target/dist/: tarball (binary, completions, man pages, deploy/), .deb, SHA256SUMS.
    Dist {
        /// Package the dev-profile binary (CI: reuses the test build) instead of building release.
        #[arg(long)]
        debug: bool,
        /// Then install the .deb (dpkg -i), run it and serve's configuration check, and purge it (root).
        #[arg(long)]
        check: bool,
    },
    /// The DaemonSet's image (deploy/image/Containerfile, FROM scratch) built by buildah, tagged with the crate version.
    Image {
        /// Put the dev-profile binary in it (CI: reuses the test build) instead of building release.
        #[arg(long)]
        debug: bool,
        /// Then mount it and run its llmprof --version and doctor by chroot, and validate deploy/kubernetes
        /// against Kubernetes' schemas (root).
        #[arg(long)]
        check: bool,
    },
    /// Benchmarks of the engine and of what llmprof costs it.
    Bench {
        /// Which bench.
        #[command(subcommand)]
        kind: crate::bench::Kind,
    },
}

/// What `cargo xtask test` passes on to `cargo test`.
#[derive(clap::Args, Debug)]
pub struct TestArgs {
    /// Passed on to `cargo test --workspace --no-fail-fast` (e.g. `-p llmprof`, a test name filter).
    #[arg(value_name = "CARGO_TEST_ARGS", allow_hyphen_values = true)]
    cargo_args: Vec<String>,
    /// Passed on to the test binaries, after `--` (e.g. `--nocapture`).
    #[arg(value_name = "TEST_BINARY_ARGS", last = true)]
    binary_args: Vec<String>,
}

impl TestArgs {
    /// The arguments for `cargo test --workspace --no-fail-fast` as they were given, `--` included (clap
    /// takes a `--` that comes first as the start of [`TestArgs::binary_args`]; a later one stays in
    /// `cargo_args`).
    pub fn forwarded(self) -> Vec<String> {
        let mut args = self.cargo_args;
        if !self.binary_args.is_empty() {
            args.push("--".into());
            args.extend(self.binary_args);
        }
        args
    }
}

/// Parses the process's arguments; on `--help` or a usage error, prints and exits (0 and 2).
pub fn parse() -> Cli {
    Cli::parse_from(help_word_as_flag(std::env::args_os().collect()))
}

/// `cargo xtask demo help` reads as `cargo xtask demo --help`. clap's own `help` subcommand covers the tasks
/// with subcommands (`cargo xtask help demo`, `cargo xtask bench help engine`); a task without subcommands
/// would take the word as a value (`test` would even pass it to cargo test as a filter).
pub fn help_word_as_flag(mut args: Vec<OsString>) -> Vec<OsString> {
    let root = Cli::command();
    let mut cmd = &root;
    // Past the program name: the words that name (sub)commands, then the first other word.
    for (depth, arg) in args.iter_mut().enumerate().skip(1) {
        let Some(word) = arg.to_str() else { break };
        if let Some(sub) = cmd.find_subcommand(word) {
            cmd = sub;
            continue;
        }
        if word == "help" && depth > 1 && cmd.get_subcommands().next().is_none() {
            *arg = "--help".into();
        }
        break;
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        let args = std::iter::once("cargo xtask")
            .chain(args.iter().copied())
            .map(OsString::from);
        Cli::try_parse_from(help_word_as_flag(args.collect()))
    }

    fn test_args(args: &[&str]) -> Vec<String> {
        match parse(args).expect("parses").task {
            Some(Task::Test(t)) => t.forwarded(),
            other => panic!("not the test task: {other:?}"),
        }
    }

    #[test]
    fn the_command_tree_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn test_forwards_its_arguments_to_cargo_test_as_given() {
        assert!(test_args(&["test"]).is_empty());
        assert_eq!(test_args(&["test", "-p", "llmprof"]), ["-p", "llmprof"]);
        assert_eq!(test_args(&["test", "--", "--nocapture"]), ["--", "--nocapture"]);
        assert_eq!(
            test_args(&[
                "test",
                "-p",
                "llmprof",
                "--",
                "--nocapture",
                "--test-threads",
                "1"
            ]),
            ["-p", "llmprof", "--", "--nocapture", "--test-threads", "1"]
        );
        assert_eq!(
            test_args(&["test", "--release", "perfetto"]),
            ["--release", "perfetto"]
        );
    }

    #[test]
    fn every_spelling_of_help_is_help() {
        for args in [
            &["--help"][..],
            &["help"],
            &["test", "--help"],
            &["test", "-h"],
            &["test", "help"],
            &["help", "test"],
            &["demo", "help"],
            &["setup", "help"],
            &["bench", "help"],
            &["bench", "engine", "help"],
            &["bench", "help", "syscalls"],
            &["help", "bench", "syscalls"],
        ] {
            let e = parse(args).expect_err("help is an early exit");
            assert_eq!(e.kind(), clap::error::ErrorKind::DisplayHelp, "{args:?}");
            assert_eq!(e.exit_code(), 0, "{args:?}");
        }
    }

    #[test]
    fn help_is_only_the_word_right_after_the_task() {
        assert_eq!(test_args(&["test", "-p", "help"]), ["-p", "help"]);
        assert_eq!(test_args(&["test", "--", "help"]), ["--", "help"]);
    }

    #[test]
    fn wrong_arguments_are_usage_errors() {
        for args in [
            &["nope"][..],
            &["setup", "--nope"],
            &["demo", "ten"],
            &["build-ebpf", "--chek"],
            &["bench"],
            &["bench", "nope"],
            &["bench", "engine", "--levels", "1,x"],
            &["bench", "syscalls", "--model", "m.gguf"],
        ] {
            let e = parse(args).expect_err("a usage error");
            assert_eq!(e.exit_code(), 2, "{args:?}: {e}");
        }
    }

    #[test]
    fn options_parse_to_their_values() {
        match parse(&["bench", "attach", "--levels", "4", "--max-tokens", "16"])
            .expect("parses")
            .task
        {
            Some(Task::Bench {
                kind: crate::bench::Kind::Attach(o),
            }) => {
                assert_eq!(o.levels, Some(vec![4]));
                assert_eq!(o.max_tokens, 16);
            }
            other => panic!("not bench attach: {other:?}"),
        }
        assert!(matches!(
            parse(&["build-ebpf", "--check"]).expect("parses").task,
            Some(Task::BuildEbpf { check: true })
        ));
        assert!(matches!(
            parse(&["demo"]).expect("parses").task,
            Some(Task::Demo { seconds: 20 })
        ));
    }
}
