//! The CLI's documentation cannot drift from the binary.
//!
//! - `llmprof --help` and `llmprof <subcommand> --help`, run on the real binary, must equal the snapshots in
//!   `tests/cmd/*.trycmd` (trycmd's format: a `$ command` line, then its output), one per subcommand. After an
//!   intended change of the help, rewrite them with `TRYCMD=overwrite cargo test -p llmprof --test cli_docs` and
//!   review the diff.
//! - Every `llmprof ...` command line shown in README.md and docs/*.md, and every example in the help texts, is
//!   parsed by the real CLI definition ([`Cli::try_parse_from`]); a failure names the file and line.
//!
//! Hand-rolled rather than trycmd: trycmd and snapbox add ~30 crates (rustix, toml_edit, ...) to the test
//! build on 2-core machines, for what is a file comparison. The snapshot files keep trycmd's format, so
//! `trycmd::TestCases::new().case("tests/cmd/*.trycmd")` reads them as they are.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser};
use llmprof::cli::Cli;

/// The snapshot folder.
fn cmd_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cmd")
}

/// The repository root (README.md, docs/).
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// trycmd's switch for rewriting snapshots.
fn overwrite() -> bool {
    std::env::var("TRYCMD").is_ok_and(|v| v == "overwrite")
}

/// `tests/cmd/NAME.trycmd`, for messages.
fn shown_path(file: &Path) -> String {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    file.strip_prefix(crate_dir).unwrap_or(file).display().to_string()
}

/// One snapshot: the command (without the `$ ` prompt) and its expected output.
struct Case {
    file: PathBuf,
    command: String,
    expected: String,
}

fn read_case(file: &Path) -> Case {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let (first, expected) = text.split_once('\n').unwrap_or((&text, ""));
    let command = first
        .strip_prefix("$ ")
        .unwrap_or_else(|| panic!("{}: the first line must be `$ llmprof ...`", file.display()));
    Case {
        file: file.to_owned(),
        command: command.to_owned(),
        expected: expected.to_owned(),
    }
}

/// Runs `llmprof ARGS` as a person's terminal would, minus what varies between machines: no colours (a pipe
/// gets none anyway; forcing variables are removed). stdout then stderr, as trycmd joins them.
fn run_llmprof(command: &str) -> String {
    let mut words = command.split_whitespace();
    assert_eq!(words.next(), Some("llmprof"), "snapshots run llmprof: {command}");
    let out = Command::new(env!("CARGO_BIN_EXE_llmprof"))
        .args(words)
        .env_remove("CLICOLOR_FORCE")
        .env_remove("CLICOLOR")
        .env_remove("COLUMNS")
        .env("NO_COLOR", "1")
        .output()
        .unwrap_or_else(|e| panic!("running {command}: {e}"));
    assert!(out.status.success(), "{command} failed: {:?}", out.status);
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    text
}

/// The first line where `got` differs from `want`, for the failure message.
fn first_difference(want: &str, got: &str) -> String {
    let (w, g): (Vec<&str>, Vec<&str>) = (want.lines().collect(), got.lines().collect());
    for i in 0..w.len().max(g.len()) {
        if w.get(i) != g.get(i) {
            return format!(
                "line {}: snapshot {:?}, binary {:?}",
                i + 2,
                w.get(i).unwrap_or(&"<end>"),
                g.get(i).unwrap_or(&"<end>")
            );
        }
    }
    "trailing newline".to_owned()
}

#[test]
fn help_of_every_subcommand_matches_its_snapshot() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(cmd_dir())
        .expect("tests/cmd exists")
        .map(|e| e.expect("tests/cmd is readable").path())
        .filter(|p| p.extension().is_some_and(|x| x == "trycmd"))
        .collect();
    files.sort();
    let mut cases: Vec<Case> = files.iter().map(|f| read_case(f)).collect();
    // Every subcommand has its snapshot: a new one cannot go undocumented.
    let cli = Cli::command();
    let wanted = std::iter::once(("llmprof".to_owned(), "llmprof --help".to_owned())).chain(
        cli.get_subcommands().map(|s| {
            (
                s.get_name().to_owned(),
                format!("llmprof {} --help", s.get_name()),
            )
        }),
    );
    for (stem, command) in wanted {
        if !cases.iter().any(|c| c.command == command) {
            cases.push(Case {
                file: cmd_dir().join(format!("{stem}.trycmd")),
                command,
                expected: String::new(),
            });
        }
    }
    let mut failures = String::new();
    for c in &cases {
        let got = run_llmprof(&c.command);
        if got == c.expected {
            continue;
        }
        if overwrite() {
            std::fs::write(&c.file, format!("$ {}\n{got}", c.command))
                .unwrap_or_else(|e| panic!("{}: {e}", c.file.display()));
            eprintln!("rewrote {}", c.file.display());
        } else if c.expected.is_empty() && !c.file.exists() {
            let _ = writeln!(
                failures,
                "`{}` has no snapshot ({})",
                c.command,
                shown_path(&c.file)
            );
        } else {
            let _ = writeln!(
                failures,
                "{}: `{}` differs from the snapshot, {}",
                shown_path(&c.file),
                c.command,
                first_difference(&c.expected, &got)
            );
        }
    }
    assert!(
        failures.is_empty(),
        "{failures}If the change is intended: TRYCMD=overwrite cargo test -p llmprof --test cli_docs, and review the diff"
    );
}

#[test]
fn snapshots_hold_nothing_that_varies() {
    let version = env!("CARGO_PKG_VERSION");
    for e in std::fs::read_dir(cmd_dir()).expect("tests/cmd exists") {
        let path = e.expect("tests/cmd is readable").path();
        let text = std::fs::read_to_string(&path).expect("snapshot is UTF-8");
        assert!(
            !text.contains(version),
            "{}: holds the version {version}",
            path.display()
        );
        assert!(
            !text.contains(env!("CARGO_MANIFEST_DIR")),
            "{}: holds an absolute path",
            path.display()
        );
        assert!(
            !text.contains('\x1b'),
            "{}: holds terminal escapes",
            path.display()
        );
    }
}

/// Where a command line was found and how completely it is written.
#[derive(Debug)]
struct Shown {
    /// `README.md:70`, `llmprof attach --help`, ...
    place: String,
    /// The line as written.
    text: String,
    /// A whole command (code block, help example) or a fragment quoted in prose (`llmprof attach -d 15s`), which
    /// may leave out required options.
    fragment: bool,
}

/// Quoted in prose with a subcommand after `llmprof` but not commands: values the trace holds (an `end_reason`).
const NOT_COMMANDS: &[&str] = &["llmprof serve stopped"];

/// Placeholders of the synopses (`--pid N`), replaced with a value of their type.
const PLACEHOLDERS: &[(&str, &str)] = &[
    ("N", "1234"),
    ("PID", "1234"),
    ("pid:N", "pid:1234"),
    ("port:N", "port:8000"),
];

/// The `llmprof` command lines of a markdown file: lines of code blocks (with `\` continuations) and inline code
/// spans of the prose.
fn commands_in_markdown(name: &str, text: &str) -> Vec<Shown> {
    let mut out = Vec::new();
    let mut in_block = false;
    let mut pending: Option<(usize, String)> = None;
    let mut prose = String::new();
    let mut prose_lines = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
            continue;
        }
        if !in_block {
            prose.push_str(line);
            prose.push('\n');
            prose_lines.push((prose.len(), n));
            continue;
        }
        let (start, mut joined) = pending.take().unwrap_or((n, String::new()));
        joined.push_str(line.trim_start().trim_start_matches("$ "));
        if let Some(head) = joined.strip_suffix('\\') {
            pending = Some((start, format!("{} ", head.trim_end())));
            continue;
        }
        if is_llmprof_line(&joined) {
            out.push(Shown {
                place: format!("{name}:{start}"),
                text: joined,
                fragment: false,
            });
        }
    }
    // Inline code spans, which may wrap across lines.
    let line_of = |offset: usize| {
        prose_lines
            .iter()
            .find(|(end, _)| offset < *end)
            .map_or(0, |(_, n)| *n)
    };
    let mut rest = prose.as_str();
    let mut offset = 0;
    while let Some(open) = rest.find('`') {
        let after = &rest[open + 1..];
        let Some(close) = after.find('`') else { break };
        let span = after[..close].replace('\n', " ");
        if is_llmprof_span(&span) && !NOT_COMMANDS.contains(&span.as_str()) {
            out.push(Shown {
                place: format!("{name}:{}", line_of(offset + open)),
                text: span,
                fragment: true,
            });
        }
        offset += open + 1 + close + 1;
        rest = &after[close + 1..];
    }
    out
}

/// The word after `llmprof` (run directly or with sudo), when the line starts with `llmprof `.
fn after_llmprof(line: &str) -> Option<&str> {
    let line = line.trim();
    let rest = line
        .strip_prefix("sudo ")
        .unwrap_or(line)
        .strip_prefix("llmprof ")?;
    Some(rest.split_whitespace().next().unwrap_or(""))
}

/// A line of a code block runs llmprof when a subcommand-like word or an option follows it: this leaves out
/// diagrams such as `llmprof (profiler-user/)` and keeps misspelt subcommands, which then fail to parse.
fn is_llmprof_line(line: &str) -> bool {
    after_llmprof(line).is_some_and(|next| {
        next.starts_with('-')
            || (!next.is_empty() && next.chars().all(|c| c.is_ascii_lowercase() || c == '-'))
    })
}

/// Code quoted in prose is a command when a subcommand or an option follows `llmprof`; other spans name things
/// of the trace (`llmprof summary`, `llmprof cost per hit: syscall`).
fn is_llmprof_span(span: &str) -> bool {
    after_llmprof(span).is_some_and(|next| {
        next.starts_with('-') || Cli::command().get_subcommands().any(|s| s.get_name() == next)
    })
}

/// The examples of the help texts (`after_help` of llmprof and of each subcommand).
fn commands_in_help() -> Vec<Shown> {
    let cli = Cli::command();
    let mut out = Vec::new();
    let helps = std::iter::once((
        "llmprof --help".to_owned(),
        cli.get_after_help().map(|h| h.to_string()),
    ))
    .chain(cli.get_subcommands().map(|s| {
        (
            format!("llmprof {} --help", s.get_name()),
            s.get_after_help().map(|h| h.to_string()),
        )
    }));
    for (place, help) in helps {
        for line in help.unwrap_or_default().lines() {
            if is_llmprof_line(line) {
                out.push(Shown {
                    place: place.clone(),
                    text: line.trim().to_owned(),
                    fragment: false,
                });
            }
        }
    }
    out
}

/// Replaces each `$(...)` (a shell substitution, e.g. `$(pgrep llmserve)`) with a pid.
fn substitute(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(i) = rest.find("$(") {
        out.push_str(&rest[..i]);
        let mut depth = 0;
        let mut end = rest.len();
        for (j, c) in rest[i + 1..].char_indices() {
            match c {
                '(' => depth += 1,
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        end = i + 1 + j + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        out.push_str("1234");
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// The words a shell would pass to llmprof: quotes and backslashes as in sh; the command ends at a comment,
/// a pipe, a redirection (`>`), `&`, `&&` or `;`. Usage synopses read as their fullest form: unquoted `[` `]` and a trailing `...` are
/// dropped, of `a|b` the first alternative is kept, and placeholders get a value.
fn shell_words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut skip_rest_of_word = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c.is_whitespace() {
            if in_word {
                out.push(std::mem::take(&mut cur));
            }
            in_word = false;
            skip_rest_of_word = false;
            continue;
        }
        match c {
            '#' | '|' | '&' | ';' | '>' if !in_word => break,
            '|' => skip_rest_of_word = true,
            _ if skip_rest_of_word => {}
            '\'' => {
                in_word = true;
                for q in chars.by_ref() {
                    if q == '\'' {
                        break;
                    }
                    cur.push(q);
                }
            }
            '"' => {
                in_word = true;
                while let Some(q) = chars.next() {
                    match q {
                        '"' => break,
                        '\\' => cur.extend(chars.next()),
                        _ => cur.push(q),
                    }
                }
            }
            '\\' => {
                in_word = true;
                cur.extend(chars.next());
            }
            '[' | ']' => {}
            _ => {
                in_word = true;
                cur.push(c);
            }
        }
    }
    if in_word {
        out.push(cur);
    }
    out.into_iter()
        .map(|w| w.strip_suffix("...").map_or(w.clone(), str::to_owned))
        .filter(|w| !w.is_empty())
        .map(|w| {
            PLACEHOLDERS
                .iter()
                .find(|(p, _)| *p == w)
                .map_or(w, |(_, v)| (*v).to_owned())
        })
        .collect()
}

/// Why `shown` does not parse, if it does not.
fn parse_error(shown: &Shown) -> Option<String> {
    let mut words = shell_words(&substitute(&shown.text));
    if words.first().is_some_and(|w| w == "sudo") {
        words.remove(0);
    }
    let e = Cli::try_parse_from(&words).err()?;
    let fine = matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion)
        || (shown.fragment && e.kind() == ErrorKind::MissingRequiredArgument);
    (!fine).then(|| format!("{}: `{}` (as {words:?}): {}", shown.place, shown.text, e.render()))
}

#[test]
fn every_command_in_the_readme_docs_and_help_parses() {
    let mut shown = Vec::new();
    let mut files = vec![repo_root().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(repo_root().join("docs"))
        .expect("docs/ exists")
        .map(|e| e.expect("docs/ is readable").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let name = f.strip_prefix(repo_root()).unwrap_or(f).display().to_string();
        shown.extend(commands_in_markdown(&name, &text));
    }
    shown.extend(commands_in_help());
    // The extraction itself works: the README's first example and the synopsis are among them.
    assert!(
        shown
            .iter()
            .any(|s| s.text.starts_with("sudo llmprof attach --pid $(pgrep llmserve)")),
        "{shown:#?}"
    );
    assert!(
        shown
            .iter()
            .any(|s| s.text.contains("[--otlp-protocol grpc|http]")),
        "{shown:#?}"
    );
    assert!(shown.iter().filter(|s| !s.fragment).count() >= 20, "{shown:#?}");
    let failures: Vec<String> = shown.iter().filter_map(parse_error).collect();
    assert!(
        failures.is_empty(),
        "documented command lines the CLI no longer accepts:\n{}",
        failures.join("\n")
    );
}

#[test]
fn command_lines_are_read_like_a_shell_and_a_synopsis() {
    assert_eq!(
        shell_words(&substitute(
            "sudo llmprof attach --pid $(pgrep -f vllm) --model-path '/models/*'  # any CUDA process"
        )),
        [
            "sudo",
            "llmprof",
            "attach",
            "--pid",
            "1234",
            "--model-path",
            "/models/*"
        ]
    );
    assert_eq!(
        shell_words("llmprof report t --json | jq '.requests.ttft_ms'"),
        ["llmprof", "report", "t", "--json"]
    );
    assert_eq!(
        shell_words("llmprof attach --pid N [--model-path '*.gguf']... [--otlp-protocol grpc|http]]"),
        [
            "llmprof",
            "attach",
            "--pid",
            "1234",
            "--model-path",
            "*.gguf",
            "--otlp-protocol",
            "grpc"
        ]
    );
    let bad = Shown {
        place: "x.md:1".into(),
        text: "llmprof attach --pid 1 --no-such-option".into(),
        fragment: true,
    };
    assert!(parse_error(&bad).is_some_and(|e| e.contains("x.md:1")));
    let fragment = Shown {
        place: "x.md:2".into(),
        text: "llmprof attach -d 15s".into(),
        fragment: true,
    };
    assert_eq!(
        parse_error(&fragment),
        None,
        "a fragment in prose may leave out --pid"
    );
    let whole = Shown {
        fragment: false,
        ..fragment
    };
    assert!(parse_error(&whole).is_some(), "a command in a code block may not");
}

#[test]
fn commands_are_found_in_code_blocks_and_prose() {
    let md = "Run `llmprof attach\n--pid 1` or `llmprof summary`; ends `llmprof serve stopped`.\n\
              ```\n$ sudo llmprof serve --out-dir t \\\n     --watch port:8000\nllmprof (profiler-user/) diagram\n\
              llmprof atach --pid 1\n```\n";
    let found: Vec<(String, String, bool)> = commands_in_markdown("x.md", md)
        .into_iter()
        .map(|s| (s.place, s.text, s.fragment))
        .collect();
    assert_eq!(
        found,
        [
            (
                "x.md:4".into(),
                "sudo llmprof serve --out-dir t --watch port:8000".into(),
                false
            ),
            ("x.md:7".into(), "llmprof atach --pid 1".into(), false),
            ("x.md:1".into(), "llmprof attach --pid 1".into(), true),
        ]
    );
}
