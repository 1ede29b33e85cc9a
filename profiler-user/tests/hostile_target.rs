//! A traced process is untrusted input: `llmprof attach` (the real binary, real eBPF) against targets that
//! plant what a hostile process can, each of which hung llmprof or bloated it before `sys::target_file`:
//! - the CUDA driver library it mapped, deleted and replaced by a FIFO at the same path;
//! - a 2 GiB sparse file named `libcuda.so.1` that it maps (llmprof's peak RSS stays far below it);
//! - a FIFO as its JIT perf map (`/tmp/perf-PID.map`), with Python 3.12's perf trampolines running so the
//!   symbolizer looks for it.
//!
//! Each session must end on its own shortly after its duration, with its trace written. A session that is
//! still running long after is killed and the test fails (a hang detector, not a timing assertion).
//!
//! Needs root (eBPF) and gcc; the perf-map case needs pyenv's Python 3.12: skips loudly without them, fails
//! under `CI=true`.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]

use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use e2e::testee::Testee;

const LLMPROF: &str = env!("CARGO_BIN_EXE_llmprof");
/// Far beyond any 2 s session on a loaded machine: past it the session is taken as hung.
const HUNG: Duration = Duration::from_secs(120);

fn tmp(tag: &str) -> PathBuf {
    e2e::fixtures::scratch_dir(&format!("llmprof-hostile-{tag}"))
}

/// Runs `llmprof attach --pid PID -d 2s EXTRA -o TRACE` to its end: (stdout + stderr, peak RSS in KiB). Fails
/// the test when it is still running after [`HUNG`].
#[allow(
    clippy::zombie_processes,
    reason = "reaped by wait4, which also gives its peak RSS"
)]
fn attach(pid: u32, extra: &[&str], trace: &Path) -> (String, u64) {
    let mut child = Command::new(LLMPROF)
        .args(["attach", "--pid", &pid.to_string(), "-d", "2s"])
        .args(extra)
        .arg("-o")
        .arg(trace)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (out, err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let read = |r: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = BufReader::new(r).read_to_string(&mut s);
            s
        })
    };
    let (out, err) = (read(Box::new(out)), read(Box::new(err)));
    let t0 = Instant::now();
    let (status, maxrss) = loop {
        let mut status = 0;
        // SAFETY: an all-zero rusage is a valid value of this plain C struct.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: wait4 on our own child writes one int and one rusage.
        let r = unsafe { libc::wait4(child.id() as i32, &mut status, libc::WNOHANG, &mut ru) };
        if r == child.id() as i32 {
            break (status, ru.ru_maxrss as u64);
        }
        if t0.elapsed() > HUNG {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "llmprof attach hung: still running {HUNG:?} after a 2 s session\n{}",
                err.join().unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = format!("{}{}", out.join().unwrap(), err.join().unwrap());
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{text}"
    );
    assert!(
        trace.metadata().is_ok_and(|m| m.len() > 0),
        "no trace written\n{text}"
    );
    (text, maxrss)
}

fn preconditions() -> bool {
    e2e::require(e2e::is_root(), "not root: cannot load eBPF programs")
        && e2e::require(
            e2e::fixtures::have_gcc(),
            "gcc not installed (apt-get install gcc)",
        )
}

#[test]
fn a_deleted_libcuda_replaced_by_a_fifo_is_read_from_the_mapping() {
    if !preconditions() {
        return;
    }
    let dir = tmp("fifo-libcuda");
    let lib = e2e::fixtures::stand_in_libcuda(&dir);
    let t = Testee::spawn(&["--libcuda", lib.to_str().unwrap()]);
    std::fs::remove_file(&lib).unwrap();
    e2e::fixtures::mkfifo(&lib);
    let (text, _) = attach(t.pid(), &["--no-sample", "-v"], &dir.join("t.perfetto-trace"));
    // The CUDA driver probes went on the library the target maps (its symbols read from the mapping).
    assert!(
        text.contains("CUDA driver calls:") && text.contains("entry points of"),
        "{text}"
    );
    drop(t);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_sparse_giant_named_libcuda_costs_llmprof_no_memory() {
    if !preconditions() {
        return;
    }
    let dir = tmp("sparse");
    let giant = dir.join("libcuda.so.1");
    std::fs::File::create(&giant).unwrap().set_len(2 << 30).unwrap();
    let t = Testee::start(Command::new(e2e::python3()).arg("-c").arg(format!(
        "import mmap, time\nf = open({:?}, 'rb')\nm = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)\n\
         print('ready', flush=True)\ntime.sleep(300)\n",
        giant.display()
    )));
    let (text, maxrss_kib) = attach(t.pid(), &["--no-sample"], &dir.join("t.perfetto-trace"));
    assert!(
        maxrss_kib < 512 << 10,
        "llmprof's peak RSS {maxrss_kib} KiB with a 2 GiB sparse libcuda.so.1 mapped by the target\n{text}"
    );
    drop(t);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_fifo_as_the_perf_map_does_not_hang_the_symbolizer() {
    let python = PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
        .join(".pyenv/versions/3.12.1/bin/python3.12");
    if !preconditions()
        || !e2e::require(
            python.exists(),
            "pyenv's Python 3.12.1 is not installed (its -X perf writes a perf map)",
        )
    {
        return;
    }
    let dir = tmp("perfmap");
    // Python's perf trampolines run from anonymous memory: the symbolizer looks their addresses up in the
    // perf map.
    let t = Testee::start(Command::new(&python).args(["-X", "perf", "-c"]).arg(
        "import sys\nprint('ready', flush=True)\ndef f(n):\n    return n + 1\nx = 0\n\
         while True:\n    x = f(x)\n",
    ));
    let map = PathBuf::from(format!("/tmp/perf-{}.map", t.pid()));
    let _ = std::fs::remove_file(&map);
    e2e::fixtures::mkfifo(&map);
    let (text, _) = attach(t.pid(), &[], &dir.join("t.perfetto-trace"));
    assert!(text.contains("trace:"), "{text}");
    drop(t);
    let _ = std::fs::remove_file(&map);
    std::fs::remove_dir_all(&dir).unwrap();
    let _ = std::io::stdout().flush();
}

/// A client cannot hide its requests from the wire view by sending llmprof's `User-Agent`; llmprof's own
/// /metrics scrapes (every 500 ms during the session) are left out by the connection they came on.
#[test]
fn a_client_with_llmprofs_user_agent_is_seen_and_llmprofs_scrapes_are_not() {
    if !preconditions() {
        return;
    }
    let dir = tmp("ua");
    // A small HTTP/1.0 server with a vLLM-looking /metrics (so llmprof scrapes it).
    let script = "import http.server, sys\n\
        class H(http.server.BaseHTTPRequestHandler):\n\
        \x20   def do_GET(self):\n\
        \x20       body = b'vllm:num_requests_running 1\\n' if self.path == '/metrics' else b'hi'\n\
        \x20       self.send_response(200)\n\
        \x20       self.send_header('Content-Length', str(len(body)))\n\
        \x20       self.end_headers()\n\
        \x20       self.wfile.write(body)\n\
        \x20   def log_message(self, *a):\n\
        \x20       pass\n\
        s = http.server.HTTPServer(('127.0.0.1', 0), H)\n\
        print('ready', s.server_address[1], flush=True)\n\
        s.serve_forever()\n";
    let t = Testee::start(Command::new(e2e::python3()).arg("-c").arg(script));
    let port: u16 = t.ready().parse().unwrap();
    let trace = dir.join("ua.perfetto-trace");
    let a = e2e::attach::Attached::start(t.pid(), &["--no-sample", "-v"], &trace);
    for i in 0..3 {
        let xid = format!("ua-{i}");
        let r = e2e::http::request(
            port,
            "GET",
            "/x",
            &[("User-Agent", "llmprof"), ("x-request-id", xid.as_str())],
            None,
        )
        .unwrap();
        assert_eq!(r.status, 200);
        std::thread::sleep(Duration::from_millis(400));
    }
    // A few more scrapes.
    std::thread::sleep(Duration::from_millis(1500));
    let out = a.stop();
    assert!(
        out.contains("metrics: http://127.0.0.1"),
        "llmprof scraped the server: {out}"
    );
    let v = e2e::attach::report_json(&trace);
    let rows = v["requests"]["per_request"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let ids: Vec<&str> = rows.iter().filter_map(|r| r["x_request_id"].as_str()).collect();
    assert_eq!(
        ids,
        ["ua-0", "ua-1", "ua-2"],
        "exactly the client's requests: {rows:#?}"
    );
    drop(t);
    std::fs::remove_dir_all(&dir).unwrap();
}
