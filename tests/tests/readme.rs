//! README's examples, run as a newcomer would type them: the commands are taken from README.md's own code
//! blocks at test time, so README and this test cannot drift apart.
//!
//! The blocks run are the engine's (`cargo run ... -p inference -- ...` and its `curl`) and the first one
//! (`sudo llmprof attach --pid $(pgrep -n llmserve) ...`, `llmprof report`, `llmprof open`). Each command runs
//! as written, in `sh`, with three mappings a checkout needs and nothing else: `llmprof` and `llmserve` are the
//! binaries this workspace built (first in `PATH`), `cargo run --release -p inference --` is that `llmserve`
//! (the test does not build a release), and `sudo`, when not installed, runs its command as is (the test runs
//! as root). Everything runs in a network namespace of its own, so README's fixed ports (8000 for the engine,
//! 9001 for `llmprof open`) are free whatever else the machine runs.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use e2e::{bin_path, default_model, is_root, require};

/// README's fenced code blocks, in order.
fn code_blocks(readme: &str) -> Vec<Vec<String>> {
    let mut blocks = Vec::new();
    let mut cur: Option<Vec<String>> = None;
    for line in readme.lines() {
        if line.trim_start().starts_with("```") {
            match cur.take() {
                Some(b) => blocks.push(b),
                None => cur = Some(Vec::new()),
            }
        } else if let Some(b) = cur.as_mut() {
            b.push(line.to_owned());
        }
    }
    blocks
}

/// The shell commands of a block: continuation lines joined, `# comments` after a command removed.
fn commands(block: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for line in block {
        let line = strip_comment(line);
        if let Some(head) = line.trim_end().strip_suffix('\\') {
            cur.push_str(head);
            continue;
        }
        cur.push_str(&line);
        if !cur.trim().is_empty() {
            out.push(cur.trim().to_owned());
        }
        cur.clear();
    }
    out
}

/// `line` without a trailing `# comment` (a `#` outside quotes, after a space).
fn strip_comment(line: &str) -> String {
    let (mut single, mut double) = (false, false);
    let mut prev = ' ';
    for (i, c) in line.char_indices() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '#' if !single && !double && prev.is_whitespace() => return line[..i].trim_end().to_owned(),
            _ => {}
        }
        prev = c;
    }
    line.to_owned()
}

fn block_with(blocks: &[Vec<String>], needle: &str) -> Vec<String> {
    let b = blocks
        .iter()
        .find(|b| b.iter().any(|l| l.contains(needle)))
        .unwrap_or_else(|| panic!("README has no code block with {needle:?}"));
    commands(b)
}

/// A directory that puts the workspace's binaries (and `sudo`, when missing) first in `PATH`.
fn bin_dir(dir: &Path) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).expect("bin dir");
    for name in ["llmprof", "llmserve"] {
        let _ = std::fs::remove_file(bin.join(name));
        std::os::unix::fs::symlink(bin_path(name), bin.join(name)).expect("symlink");
    }
    if Command::new("sh")
        .args(["-c", "command -v sudo"])
        .output()
        .is_ok_and(|o| !o.status.success())
    {
        std::fs::write(bin.join("sudo"), "#!/bin/sh\nexec \"$@\"\n").expect("sudo");
        Command::new("chmod")
            .args(["+x"])
            .arg(bin.join("sudo"))
            .status()
            .expect("chmod");
    }
    bin
}

#[test]
fn readme_commands_run_as_written() {
    let model = default_model();
    if !require(
        is_root(),
        "the README's attach needs root (and a network namespace)",
    ) || !require(model.exists(), "the default model (cargo xtask fetch-model)")
    {
        return;
    }
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md")).expect("README");
    let blocks = code_blocks(&readme);
    let engine = block_with(&blocks, "-p inference");
    let first = block_with(&blocks, "pgrep -n llmserve");
    assert_eq!(engine.len(), 2, "the engine block: start it, ask it: {engine:?}");
    assert!(first.iter().any(|c| c.starts_with("llmprof report")), "{first:?}");

    let dir = std::env::temp_dir().join(format!("llmprof-readme-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let bin = bin_dir(&dir);
    let start_engine = engine[0].replacen("cargo run --release -p inference --", "llmserve", 1);
    assert_ne!(
        start_engine, engine[0],
        "README starts the engine with cargo run: {engine:?}"
    );
    let attach = first
        .iter()
        .find(|c| c.contains("llmprof attach"))
        .expect("attach");
    let report = first
        .iter()
        .find(|c| c.starts_with("llmprof report"))
        .expect("report");
    let open = first
        .iter()
        .find(|c| c.starts_with("llmprof open"))
        .expect("open");
    // The engine in the background, the README's question once it answers, the README's attach while a
    // second question is asked, then the report, and `open` until the trace is fetched from it.
    let script = format!(
        r#"set -e
ip link set lo up
{start_engine} > engine.log 2>&1 &
engine=$!
for i in $(seq 1 600); do curl -s -o /dev/null localhost:8000/v1/models && break; sleep 0.2; done
{curl} > answer.json
( sleep 8; {curl} > answer2.json ) &
{attach} > attach.txt 2> attach.err
{report} > report.txt
{open} > open.txt 2>&1 &
open=$!
for i in $(seq 1 100); do grep -q "127.0.0.1:9001/" open.txt 2>/dev/null && break; sleep 0.1; done
curl -s -o fetched.perfetto-trace "$(grep -o 'http://127.0.0.1:9001/[^ ]*' open.txt | tail -1)"
wait $open || true
kill $engine
"#,
        curl = engine[1],
    );
    let out: Output = Command::new("unshare")
        .args(["--net", "sh", "-c", &script])
        .current_dir(&dir)
        .env(
            "PATH",
            format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default()),
        )
        .env("LLMSERVE_MODEL", &model)
        .output()
        .expect("unshare");
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
    let logs = format!(
        "{}\n{}\nattach: {}{}\nengine: {}\nopen: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        read("attach.txt"),
        read("attach.err"),
        read("engine.log"),
        read("open.txt")
    );
    assert!(out.status.success(), "{logs}");
    let answer = read("answer.json");
    assert!(
        answer.contains("Paris"),
        "the README's question gets its answer: {answer}\n{logs}"
    );
    assert!(!answer.contains("model_not_found"), "{answer}");
    let summary = read("attach.txt");
    assert!(
        summary.contains("llmprof report incident.perfetto-trace"),
        "{summary}"
    );
    let report_text = read("report.txt");
    assert!(
        report_text.contains("Requests: 1 (1 finished)"),
        "{report_text}\n{logs}"
    );
    let fetched = std::fs::metadata(dir.join("fetched.perfetto-trace"))
        .map(|m| m.len())
        .unwrap_or(0);
    let written = std::fs::metadata(dir.join("incident.perfetto-trace"))
        .map(|m| m.len())
        .unwrap_or(0);
    assert!(
        fetched > 0 && fetched == written,
        "`llmprof open` serves the trace: {fetched} of {written} bytes\n{logs}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn readme_blocks_are_read_as_a_shell_would() {
    let b: Vec<String> = [
        "cmd one --flag x   # a comment",
        "curl -s url -H 'a: b' \\",
        "  -d '{\"k\":\"# not a comment\"}'",
        "",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    assert_eq!(
        commands(&b),
        [
            "cmd one --flag x",
            "curl -s url -H 'a: b'   -d '{\"k\":\"# not a comment\"}'"
        ]
    );
}
