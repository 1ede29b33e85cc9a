//! `--py-range` and `--python-hooks` on a real CPython process (`llmprof attach`, the real binary, real eBPF,
//! the helper loaded by ptrace): a plain `http.server` whose handler method gets a range.
//!
//! What a user checks: one slice per call on the calling thread, the target's function is its original object
//! again after the session (the target itself answers `is`), `--python-hooks off` never loads anything into the
//! target, and a `--py-range` nothing can take is refused with its exit code and the reason.
//!
//! Needs root (eBPF, ptrace): skips loudly without, fails under `CI=true`.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]

use std::path::PathBuf;
use std::process::Command;

use e2e::attach::Attached;
use e2e::testee::Testee;

const LLMPROF: &str = env!("CARGO_BIN_EXE_llmprof");
/// The range the tests ask for: `H.do_GET` of the script below, run as `__main__`.
const RANGE: &str = "__main__:H.do_GET";
/// Its slice's name (`domain::name`).
const SLICE: &str = "__main__::H.do_GET";
/// A /metrics URL nothing answers.
const NO_METRICS: &str = "http://127.0.0.1:9/metrics";

/// A threaded HTTP server whose handler's `do_GET` is the function hooked; each stdin line is answered with
/// `same` when `H.do_GET` is the original function object, `hooked` otherwise.
const SERVER: &str = "import http.server, sys, threading\n\
class H(http.server.BaseHTTPRequestHandler):\n\
\x20   def do_GET(self):\n\
\x20       self.send_response(200)\n\
\x20       self.send_header('Content-Length', '2')\n\
\x20       self.end_headers()\n\
\x20       self.wfile.write(b'hi')\n\
\x20   def log_message(self, *a):\n\
\x20       pass\n\
async def coro():\n\
\x20   pass\n\
orig = H.__dict__['do_GET']\n\
s = http.server.ThreadingHTTPServer(('127.0.0.1', 0), H)\n\
threading.Thread(target=s.serve_forever, daemon=True).start()\n\
print('ready', s.server_address[1], flush=True)\n\
for line in sys.stdin:\n\
\x20   print('same' if H.__dict__.get('do_GET') is orig else 'hooked', flush=True)\n";

fn preconditions() -> bool {
    e2e::require(e2e::is_root(), "needs root (eBPF, ptrace)")
}

fn tmp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("llmprof-pyhooks-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn server() -> (Testee, u16) {
    let t = Testee::start(Command::new(e2e::python3()).arg("-c").arg(SERVER));
    let port = t.ready().parse().unwrap();
    (t, port)
}

fn get(port: u16, n: usize) {
    for _ in 0..n {
        let r = e2e::http::request(port, "GET", "/x", &[], None).unwrap();
        assert_eq!(r.status, 200);
    }
}

fn maps_helper(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap_or_default()
        .contains("libllmprof_pyhooks.so")
}

#[test]
fn a_py_range_is_one_slice_per_call_and_the_original_is_back_after_the_session() {
    if !preconditions() {
        return;
    }
    let dir = tmp("range");
    let (mut t, port) = server();
    assert_eq!(t.ask("check"), "same");
    let trace = dir.join("range.perfetto-trace");
    // Another /metrics URL: llmprof's own discovery GETs on the server's port would be calls of do_GET too.
    let a = Attached::start(
        t.pid(),
        &[
            "--py-range",
            RANGE,
            "--no-sample",
            "-v",
            "--metrics-url",
            NO_METRICS,
        ],
        &trace,
    );
    let log = a.log();
    assert!(
        log.contains("Python hooks: pid") && log.contains("range __main__:H.do_GET"),
        "{log}"
    );
    assert_eq!(t.ask("check"), "hooked", "the range's wrapper is in place");
    get(port, 5);
    let out = a.stop();
    assert_eq!(t.ask("check"), "same", "H.do_GET is the original function again");
    assert!(
        out.contains("Python hooks"),
        "the estimate charges the hooks: {out}"
    );
    let mut tp = e2e::trace_processor::load(&trace).unwrap();
    assert_eq!(tp.import_errors().unwrap(), Vec::<serde_json::Value>::new());
    assert_eq!(
        tp.query_i64(&format!("select count(*) from slice where name = '{SLICE}'"))
            .unwrap(),
        5,
        "one range per call"
    );
    // Each range lies on a thread of the server (its handler threads), not on a process track.
    assert_eq!(
        tp.query_i64(&format!(
            "select count(*) from slice join thread_track on slice.track_id = thread_track.id \
             join thread using (utid) where slice.name = '{SLICE}' and thread.upid = \
             (select upid from process where pid = {})",
            t.pid()
        ))
        .unwrap(),
        5
    );
    drop(tp);
    t.exit();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn python_hooks_off_never_touches_the_target() {
    if !preconditions() {
        return;
    }
    let dir = tmp("off");
    let (mut t, port) = server();
    let trace = dir.join("off.perfetto-trace");
    let a = Attached::start(
        t.pid(),
        &["--python-hooks", "off", "--py-range", RANGE, "--no-sample"],
        &trace,
    );
    assert_eq!(t.ask("check"), "same");
    assert!(!maps_helper(t.pid()), "nothing loaded into the target");
    get(port, 2);
    let _ = a.stop();
    assert!(!maps_helper(t.pid()));
    let mut tp = e2e::trace_processor::load(&trace).unwrap();
    assert_eq!(
        tp.query_i64(&format!("select count(*) from slice where name = '{SLICE}'"))
            .unwrap(),
        0
    );
    drop(tp);
    t.exit();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--py-range` that no process can take ends the attach with exit code 10 and each process's reason: a
/// coroutine function (its calls interleave on one thread), a module the target never imported, a target that
/// is not Python at all. Nothing is left hooked.
#[test]
fn a_py_range_nothing_can_take_is_refused_with_the_reason() {
    if !preconditions() {
        return;
    }
    let dir = tmp("refused");
    let (mut t, _) = server();
    let run = |pid: u32, range: &str| {
        let out = Command::new(LLMPROF)
            .args([
                "attach",
                "--pid",
                &pid.to_string(),
                "-d",
                "2s",
                "--py-range",
                range,
            ])
            .arg("-o")
            .arg(dir.join("refused.perfetto-trace"))
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = run(t.pid(), "__main__:coro");
    assert_eq!(code, Some(10), "{err}");
    assert!(err.contains("coroutine"), "{err}");
    assert_eq!(t.ask("check"), "same");
    let (code, err) = run(t.pid(), "no_such_module:f");
    assert_eq!(code, Some(10), "{err}");
    assert!(err.contains("no_such_module is not imported"), "{err}");
    let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
    let (code, err) = run(sleeper.id(), RANGE);
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    assert_eq!(code, Some(10), "{err}");
    assert!(err.contains("CPython"), "{err}");
    assert!(!maps_helper(sleeper.id()));
    t.exit();
    std::fs::remove_dir_all(&dir).unwrap();
}
