//! Capture end to end against a real traced process (`llmprof-testee`): load, attach, decode, detach.
//!
//! Needs root (loads eBPF programs). Without root the tests skip with a loud message, except under
//! `CI=true`, where they fail.
#![allow(clippy::unwrap_used, reason = "tests panic with the error")]

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use e2e::testee::Testee;
use llmprof::capture::calibrate::{self, CalibrationConfig};
use llmprof::capture::{Capture, CaptureConfig, CaptureError, EngineProbes};
use llmprof_abi::{ABI_VERSION, FileOp, ProbeId, RangeOp, RequestEventKind, StepKind, read_str};
use llmprof_trace::event::{Event, EventBody};

/// x86-64 syscall numbers the slow-syscall check accepts for a 20 ms sleep.
const NR_NANOSLEEP: u64 = 35;
const NR_CLOCK_NANOSLEEP: u64 = 230;
/// Size of the model file the testee reads (not a multiple of its 64 KiB read size).
const GGUF_SIZE: usize = 300_001;

/// Shows llmprof's own debug logs (stage timings of `Capture::start`) with `--nocapture`.
struct StderrLog;
impl log::Log for StderrLog {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, r: &log::Record<'_>) {
        eprintln!("[{}] {}", r.level(), r.args());
    }
    fn flush(&self) {}
}
static LOGGER: StderrLog = StderrLog;

fn have_root() -> bool {
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(log::LevelFilter::Debug);
    }
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    e2e::require(
        root,
        "not root: capture tests need root to load eBPF programs (run `sudo -E cargo test -p llmprof --test capture_probes`)",
    )
}

/// Polls until `stop` says so or `limit` passes.
fn collect(cap: &mut Capture, limit: Duration, stop: impl Fn(&[Event]) -> bool) -> Vec<Event> {
    let t0 = Instant::now();
    let mut out = Vec::new();
    while t0.elapsed() < limit && !stop(&out) {
        cap.poll(&mut out, Duration::from_millis(50)).expect("poll");
    }
    out
}

fn loaded_ids() -> Vec<u32> {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .map(|p| p.id())
        .collect()
}

#[test]
fn captures_engine_records_syscalls_files_and_egress_then_unloads() {
    if !have_root() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("llmprof-capture-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let gguf = dir.join("model.gguf");
    std::fs::write(&gguf, vec![7u8; GGUF_SIZE]).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();

    let mut t = Testee::spawn(&[
        "--gguf",
        gguf.to_str().unwrap(),
        "--connect",
        &format!("127.0.0.1:{port}"),
    ]);
    let pid = t.pid();
    let cfg = CaptureConfig {
        pids: vec![pid],
        egress_allow: vec!["10.0.0.0/8".parse().unwrap()],
        ..CaptureConfig::default()
    };
    let mut cap = Capture::start(&cfg).unwrap_or_else(|e| panic!("Capture::start: {e:?}"));
    eprintln!("attach latency: {:?}", cap.attach_latency());
    assert_eq!(
        cap.engine_probes(pid),
        EngineProbes::Attached {
            abi_version: ABI_VERSION
        }
    );
    let ours = cap.program_ids();
    assert_eq!(
        ours.len(),
        8 + llmprof::capture::sched::SCHED_TRACEPOINTS.len()
            + llmprof::capture::wire::ARRIVAL_TRACEPOINTS.len()
            + llmprof_abi::WIRE_DECODER_PROGRAMS.len(),
        "eight programs loaded (3 syscall/exit tracepoints, 2 process-tree ones, 3 engine uprobes), the \
         thread-state programs, the wire probe's arrival stamps and its decoders"
    );

    t.send("go");
    assert_eq!(t.line(), "done");
    let (_conn, _) = listener.accept().unwrap();
    let sent_while_alive = cap.sent_bytes();
    t.send("exit");
    let status = t.child().wait().unwrap();
    assert_eq!(status.code(), Some(3));

    let events = collect(&mut cap, Duration::from_secs(10), |evs| {
        evs.iter()
            .any(|e| matches!(e.body, EventBody::ProcessExit { .. }))
    });
    assert!(
        events.iter().all(|e| e.pid == pid),
        "only the traced process is recorded"
    );

    // Engine records, verbatim.
    let steps: Vec<_> = events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::Step(s) => Some(s),
            _ => None,
        })
        .collect();
    assert_eq!(steps.len(), 1, "one step record");
    let s = steps[0];
    assert_eq!(
        (s.step_id, StepKind::from_raw(s.kind)),
        (42, Some(StepKind::Decode))
    );
    assert_eq!(
        (s.num_seqs, s.decode_tokens, s.kv_blocks_used, s.kv_blocks_total),
        (2, 2, 5, 100)
    );
    assert_eq!(&s.req_ids[..s.num_req_ids as usize], &[7, 8]);
    assert_eq!(
        &s.req_tokens[..s.num_req_ids as usize],
        &[1, 1],
        "ABI v2 per-request tokens"
    );
    assert_eq!(s.host_end_ns - s.host_start_ns, 1_000);

    let reqs: Vec<_> = events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::Request(r) => Some(r),
            _ => None,
        })
        .collect();
    assert_eq!(reqs.len(), 1);
    let r = reqs[0];
    assert_eq!(
        RequestEventKind::from_raw(r.kind),
        Some(RequestEventKind::Arrived)
    );
    assert_eq!((r.req_id, r.prompt_tokens, r.max_tokens), (7, 11, 32));
    assert_eq!(read_str(&r.x_request_id), "req-7");
    assert_eq!(read_str(&r.model), "smollm2");
    assert_eq!(r.trace_id, [0xab; 16]);

    let ranges: Vec<_> = events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::Range(r) => Some(*r),
            _ => None,
        })
        .collect();
    let ops: Vec<_> = ranges.iter().map(|r| RangeOp::from_raw(r.op)).collect();
    assert_eq!(ops, [Some(RangeOp::Push), Some(RangeOp::Pop)]);
    assert_eq!(read_str(&ranges[0].name), "forward");
    assert_eq!(read_str(&ranges[0].domain), "llmserve");

    // The 20 ms sleep is a slow syscall.
    let slow = events.iter().find_map(|e| match e.body {
        EventBody::SlowSyscall { nr, dur_ns, .. } if nr == NR_NANOSLEEP || nr == NR_CLOCK_NANOSLEEP => {
            Some(dur_ns)
        }
        _ => None,
    });
    let slow = slow.expect("the 20 ms sleep is reported as a slow syscall");
    assert!(slow >= 20_000_000, "slept {slow} ns");

    // The model file: opened, read to the end (bytes == size), closed, all with its path.
    let path = gguf.to_str().unwrap();
    assert!(
        events
            .iter()
            .any(|e| matches!(&e.body, EventBody::FileOpen { path: p, ret, .. } if p == path && *ret >= 0))
    );
    let read_bytes: i64 = events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::FileIo {
                op: FileOp::Read,
                path: Some(p),
                ret,
                ..
            } if p == path => Some(*ret),
            _ => None,
        })
        .sum();
    assert_eq!(read_bytes, GGUF_SIZE as i64, "read bytes equal the file size");
    assert!(
        events.iter().any(
            |e| matches!(&e.body, EventBody::FileIo { op: FileOp::Close, path: Some(p), .. } if p == path)
        )
    );

    // The connect to 127.0.0.1, outside the 10.0.0.0/8 allow list: flagged.
    let conn = events.iter().find_map(|e| match e.body {
        EventBody::Connect {
            addr,
            port: p,
            ret,
            allowed,
            ..
        } if p == port => Some((addr, ret, allowed)),
        _ => None,
    });
    let (addr, ret, allowed) = conn.expect("the connect is reported");
    assert_eq!(addr, IpAddr::V4(Ipv4Addr::LOCALHOST));
    assert!(ret == 0 || ret == -115, "connect returned {ret}");
    assert!(!allowed, "127.0.0.1 is outside 10.0.0.0/8");
    assert!(
        sent_while_alive.iter().any(|&(p, _, b)| p == pid && b == 5),
        "5 bytes sent on the connected socket: {sent_while_alive:?}"
    );

    // The exit, with its status.
    let exit = events.iter().find_map(|e| match e.body {
        EventBody::ProcessExit { exit_code } => Some(exit_code),
        _ => None,
    });
    assert_eq!(exit, Some(3));

    // Counters and aggregates.
    let c = cap.counters();
    assert_eq!(c[ProbeId::Step as usize].emitted, 1);
    assert_eq!(c[ProbeId::Range as usize].emitted, 2);
    assert!(c.iter().all(|p| p.dropped == 0), "no drops: {c:?}");
    assert!(cap.syscall_total() > 10);
    assert!(
        cap.syscall_aggregates()
            .iter()
            .any(|a| a.pid == pid && a.count > 0)
    );
    assert_eq!(cap.decode_errors(), 0);

    drop(cap);
    // A raw-tracepoint link releases its program after an RCU grace period (kernel 6.9+ defers the link's
    // dealloc), so the programs leave the kernel's listing shortly after the drop, not at once.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let still = loop {
        let still: Vec<u32> = loaded_ids().into_iter().filter(|id| ours.contains(id)).collect();
        if still.is_empty() || std::time::Instant::now() > deadline {
            break still;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(still.is_empty(), "programs {still:?} still loaded 5 s after drop");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_plain_process_is_traced_without_engine_probes() {
    if !have_root() {
        return;
    }
    // bash waits for a line, then blocks 300 ms in its own process (read -t: a pselect6), then exits 0.
    let mut child = Command::new("bash")
        .args(["-c", "read x; read -t 0.3 y; exit 0"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let cfg = CaptureConfig {
        pids: vec![pid],
        ..CaptureConfig::default()
    };
    let mut cap = Capture::start(&cfg).unwrap_or_else(|e| panic!("Capture::start: {e:?}"));
    assert_eq!(cap.engine_probes(pid), EngineProbes::NotFound);
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "go").unwrap();
    stdin.flush().unwrap();
    let events = collect(&mut cap, Duration::from_secs(5), |evs| {
        evs.iter()
            .any(|e| matches!(e.body, EventBody::ProcessExit { .. }))
    });
    child.wait().unwrap();
    // The 300 ms sleep is slow; the exit is seen.
    assert!(
        events
            .iter()
            .any(|e| matches!(e.body, EventBody::SlowSyscall { dur_ns, .. } if dur_ns > 200_000_000))
    );
    assert!(
        events
            .iter()
            .any(|e| matches!(e.body, EventBody::ProcessExit { exit_code: 0 }))
    );
}

#[test]
fn a_missing_pid_is_reported() {
    if !have_root() {
        return;
    }
    let cfg = CaptureConfig {
        pids: vec![0x3fff_fff0],
        ..CaptureConfig::default()
    };
    let err = Capture::start(&cfg).expect_err("no such pid");
    assert!(matches!(err, CaptureError::PidNotFound(0x3fff_fff0)), "{err:?}");
    assert!(
        err.to_string().contains("pgrep"),
        "the message says what to do: {err}"
    );
}

/// A burst of engine probe hits far faster than any engine makes them (the testee's `burst`: range records in a
/// tight loop) is accounted for whole: every hit reaches user space as an event or is counted as dropped, none
/// is lost without a count. The pipeline's rate is printed with `--nocapture` (not asserted).
#[test]
fn a_burst_of_probe_hits_is_delivered_or_counted_as_dropped() {
    if !have_root() {
        return;
    }
    const N: u64 = 200_000;
    let mut t = Testee::spawn(&[]);
    let pid = t.pid();
    let cfg = CaptureConfig {
        pids: vec![pid],
        ..CaptureConfig::default()
    };
    let mut cap = Capture::start(&cfg).expect("start");
    let t0 = Instant::now();
    t.send(&format!("burst {N}"));
    let mut got = 0u64;
    let mut out = Vec::with_capacity(1 << 16);
    while got < N && t0.elapsed() < Duration::from_secs(60) {
        out.clear();
        cap.poll(&mut out, Duration::from_millis(50)).expect("poll");
        got += out
            .iter()
            .filter(|e| matches!(e.body, EventBody::Range(_)))
            .count() as u64;
        let c = cap.counters()[ProbeId::Range as usize];
        if got + c.dropped >= N {
            break;
        }
    }
    let dt = t0.elapsed();
    let done = t.line();
    assert!(done.starts_with("burst done "), "testee said {done:?}");
    let c = cap.counters()[ProbeId::Range as usize];
    eprintln!(
        "pipeline: {got} of {N} events in {dt:?} = {:.0} events/s, dropped {}",
        got as f64 / dt.as_secs_f64(),
        c.dropped
    );
    assert_eq!(c.hits, N, "every range call of the burst hit the probe");
    assert_eq!(got + c.dropped, N, "delivered {got}, dropped {}", c.dropped);
    assert_eq!(c.emitted, got, "what went into the ring came out of it");
}

/// The overhead budget's switches on a real capture: with `RangeSampleEvery` = 16 only the ranges of steps
/// 0, 16, 32, ... reach user space and the rest count as hits that were neither emitted nor dropped;
/// after `detach_ranges` the probe no longer fires at all. A calibration run during the session leaves
/// nothing in it: no counts, no events of this process.
#[test]
fn budget_knobs_sample_ranges_and_detach_them() {
    if !have_root() {
        return;
    }
    const N: u64 = 1_600;
    let mut t = Testee::spawn(&[]);
    let pid = t.pid();
    let cfg = CaptureConfig {
        pids: vec![pid],
        measure_untraced: true,
        ..CaptureConfig::default()
    };
    let mut cap = Capture::start(&cfg).expect("start");
    // A calibration while the session runs (as `llmprof attach` runs one beside it): its own instance of
    // the programs, so the session sees none of its probe hits or records.
    let cal = calibrate::run(&CalibrationConfig {
        engine: true,
        untraced: cap.untraced(),
        ..CalibrationConfig::default()
    })
    .expect("calibrated");
    assert!(
        cal.syscall_ns > 0.0 && cal.probe_ns.is_some_and(|p| p > 0.0),
        "{cal:?}"
    );
    assert_eq!(
        cap.counters()[ProbeId::Range as usize].hits,
        0,
        "the calibration's probe hits are its own"
    );
    cap.set_knob(llmprof_abi::Knob::RangeSampleEvery, 16)
        .expect("knob");
    t.send(&format!("burst {N}"));
    assert!(t.line().starts_with("burst done"));
    let ranges = |evs: &[Event]| {
        evs.iter()
            .filter(|e| matches!(e.body, EventBody::Range(_)))
            .count() as u64
    };
    let evs = collect(&mut cap, Duration::from_secs(5), |e| ranges(e) >= N / 16);
    assert!(evs.iter().all(|e| e.pid == pid), "only the target's events");
    assert_eq!(ranges(&evs), N / 16, "steps 0, 16, 32, ... of the burst");
    assert!(evs.iter().all(|e| match &e.body {
        EventBody::Range(r) => r.step_id % 16 == 0,
        _ => true,
    }));
    let c = cap.counters()[ProbeId::Range as usize];
    assert_eq!((c.hits, c.emitted, c.dropped), (N, N / 16, 0));
    assert!(
        cap.detach_ranges().expect("detach"),
        "the range uprobe was attached"
    );
    t.send(&format!("burst {N}"));
    assert!(t.line().starts_with("burst done"));
    assert_eq!(
        cap.counters()[ProbeId::Range as usize].hits,
        N,
        "no hits once detached"
    );
    assert!(cap.detach_syscalls().expect("detach"));
    assert!(!cap.detach_syscalls().expect("second detach"), "already detached");
}
