//! The one test harness of the workspace: locating the workspace's binaries, the traced test processes
//! ([`testee`]), the fixtures they are built from ([`fixtures`]: stand-in CUDA libraries, scratch folders;
//! [`gguf`]: tiny models), spawning the real engine ([`engine`]) and `llmprof attach` ([`attach`]), the one HTTP
//! client of the workspace's tests ([`http`]), Perfetto's trace processor ([`trace_processor`]), `llmprof
//! serve` with real Prometheus and Alertmanager around it ([`serve`]), and the one prerequisite policy of every
//! test crate ([`require`], [`in_ci`]: tests that need root, a model or a tool skip loudly when it is missing, but
//! fail under CI). Event and record builders of the pure side stay in `llmprof_trace::testing`.
//!
//! The tests here drive the real `llmserve` and the real `llmprof` binaries; `cargo xtask test` builds them first.
//! `llmprof`'s and the engine's own tests use this crate too (a dev-dependency: the engine's tests may depend on
//! this crate although it depends on the engine, as cargo allows dev-dependency cycles for test targets).

pub mod attach;
pub mod engine;
pub mod fixtures;
pub mod gguf;
pub mod http;
pub mod llama;
pub mod serve;
pub mod testee;
pub mod trace_processor;
pub mod vllm;
pub mod wire;

use std::io::Write;
use std::path::PathBuf;

/// True when running under CI: `CI` is set to anything but empty, `0` or `false` (GitHub Actions, GitLab and
/// most others set `CI=true`). Tests that need root, the model or a tool must then fail, not skip.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| ci_value_means_ci(&v))
}

/// Whether a value of `CI` turns CI mode on (see [`in_ci`]).
fn ci_value_means_ci(v: &str) -> bool {
    let v = v.trim();
    !(v.is_empty() || v == "0" || v.eq_ignore_ascii_case("false"))
}

/// The one way a test checks a prerequisite (root, the model file, an installed tool): returns `ok`; when it is
/// false, panics under CI (see [`in_ci`]) and otherwise prints a loud SKIPPED line and returns false, so the
/// test returns early. `missing` says what is missing and how to get it, e.g.
/// `"promtool not installed (apt-get install prometheus)"`.
///
/// ```no_run
/// # fn have_promtool() -> bool { true }
/// if !e2e::require(have_promtool(), "promtool not installed (apt-get install prometheus)") {
///     return;
/// }
/// ```
pub fn require(ok: bool, missing: &str) -> bool {
    if ok {
        return true;
    }
    if in_ci() {
        panic!("{missing}: CI is set, so a missing prerequisite fails this test (outside CI it skips)");
    }
    // Written to the stderr handle, not eprintln!, so libtest's output capture does not hide the skip.
    let _ = writeln!(
        std::io::stderr(),
        "\n!!! SKIPPED: {missing} (set CI=true to make this a failure)\n"
    );
    false
}

/// True when the effective uid is 0.
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

/// The directory of the running test's profile, where cargo puts the workspace's binaries.
pub fn profile_dir() -> PathBuf {
    // The test executable lives in <target>/<profile>/deps/; binaries in <target>/<profile>/.
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent()
        .and_then(|d| d.parent())
        .expect("test binary is in <target>/<profile>/deps")
        .to_path_buf()
}

/// Path of a binary built from this workspace (same profile as the running test).
pub fn bin_path(name: &str) -> PathBuf {
    let p = profile_dir().join(name);
    assert!(
        p.exists(),
        "{} not found: build the workspace's binaries first (`cargo build --workspace --bins`, or run `cargo xtask test`)",
        p.display()
    );
    p
}

/// Path of the default model: the engine's own default (`$LLMSERVE_MODEL`, or the cache written by
/// `cargo xtask fetch-model`).
pub fn default_model() -> PathBuf {
    inference::model::default_model_path()
}

/// The project cache `cargo xtask setup` fills: `$XDG_CACHE_HOME/llmprof` (or `~/.cache/llmprof`).
pub fn llmprof_cache() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/root/.cache"))
        .join("llmprof")
}

/// The Python of the servers venv `cargo xtask setup` installs (llama-cpp-python's server, the OpenAI client,
/// uvicorn, gunicorn): `$XDG_CACHE_HOME/llmprof/venvs/servers/bin/python` (or under `~/.cache`).
pub fn servers_python() -> PathBuf {
    llmprof_cache().join("venvs/servers/bin/python")
}

/// The `python3` interpreter itself (its `sys.executable`), not a version manager's shim: pyenv's `python3` is a
/// bash script that runs helper processes before it execs the interpreter, so a test that attaches to a freshly
/// spawned `python3` would trace those helpers as the target's descendants, some of the time. Falls back to
/// `python3` when the interpreter cannot be asked.
pub fn python3() -> PathBuf {
    std::process::Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| PathBuf::from(s.trim()))
        .filter(|p| p.is_absolute())
        .unwrap_or_else(|| PathBuf::from("python3"))
}

#[cfg(test)]
mod tests {
    use super::ci_value_means_ci;

    #[test]
    fn ci_is_on_for_any_value_but_empty_zero_or_false() {
        for on in ["true", "1", "yes", "TRUE", "gitlab"] {
            assert!(ci_value_means_ci(on), "CI={on:?}");
        }
        for off in ["", "0", "false", "False", " "] {
            assert!(!ci_value_means_ci(off), "CI={off:?}");
        }
    }
}
