//! `llmprof-testee`: the process the capture tests trace. Not for users.
//!
//! Owns a fixed, known sequence of observable actions: engine probe records (through the real
//! `llmprof-probes` functions), a slow syscall, a model-file read, an outbound connect. It prints `ready PID`,
//! then for each stdin line: `go` runs the sequence and prints `done`; `burst N` emits N range marks and
//! prints `burst done NS` (the loop's duration); `syscalls N WORK [SLEEP_EVERY]` makes N `getppid` calls,
//! each after WORK rounds of integer busy work (the knob that sets the syscall rate: `cargo xtask bench
//! syscalls` picks it for ~500k calls/s), plus a 2 ms sleep (a slow syscall) every SLEEP_EVERY calls, and
//! prints `syscalls done NS`; `exit` (or EOF) exits with status 3.
//!
//! Usage: `llmprof-testee --gguf PATH --connect 127.0.0.1:PORT`

use std::io::{BufRead, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use llmprof_abi::{RangeOp, RangeRecord, RequestEventKind, RequestRecord, StepKind, StepRecord, fill_str};

/// Exit status the tests expect from the ProcessExit record.
const EXIT_STATUS: i32 = 3;
/// The deliberately slow syscall (a nanosleep), well above the default 1 ms threshold.
const SLOW_SLEEP: Duration = Duration::from_millis(20);

fn main() {
    if let Err(e) = run() {
        eprintln!("llmprof-testee: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let mut gguf = None;
    let mut connect = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--gguf" => gguf = args.next(),
            "--connect" => connect = args.next(),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    llmprof_probes::keep();
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready {}", std::process::id()).map_err(|e| e.to_string())?;
    out.flush().map_err(|e| e.to_string())?;
    for line in std::io::stdin().lock().lines() {
        let line = line.map_err(|e| e.to_string())?;
        let mut words = line.split_whitespace();
        match words.next() {
            Some("go") => {
                sequence(gguf.as_deref(), connect.as_deref())?;
                writeln!(out, "done").map_err(|e| e.to_string())?;
            }
            Some("burst") => {
                let n: u64 = words.next().and_then(|w| w.parse().ok()).unwrap_or(1000);
                let t0 = std::time::Instant::now();
                burst(n);
                let ns = t0.elapsed().as_nanos();
                writeln!(out, "burst done {ns}").map_err(|e| e.to_string())?;
            }
            Some("syscalls") => {
                let mut num = || words.next().and_then(|w| w.parse::<u64>().ok());
                let (n, work, sleep_every) = (num().unwrap_or(1000), num().unwrap_or(0), num().unwrap_or(0));
                let t0 = std::time::Instant::now();
                syscalls(n, work, sleep_every);
                let ns = t0.elapsed().as_nanos();
                writeln!(out, "syscalls done {ns}").map_err(|e| e.to_string())?;
            }
            Some("exit") => break,
            _ => {}
        }
        out.flush().map_err(|e| e.to_string())?;
    }
    std::process::exit(EXIT_STATUS);
}

fn sequence(gguf: Option<&str>, connect: Option<&str>) -> Result<(), String> {
    let now = llmprof_probes::boottime_ns();
    let request = RequestRecord {
        trace_id: [0xab; 16],
        parent_span_id: [0xcd; 8],
        has_trace_context: 1,
        trace_flags: 1,
        is_chat: 1,
        prompt_tokens: 11,
        max_tokens: 32,
        temperature: 0.5,
        top_p: 0.9,
        x_request_id: fill_str("req-7"),
        model: fill_str("smollm2"),
        ..RequestRecord::new(RequestEventKind::Arrived, 7, now)
    };
    llmprof_probes::request(&request);
    let range = |op: RangeOp| RangeRecord::new(op, llmprof_probes::boottime_ns(), 42, "llmserve", "forward");
    llmprof_probes::range(&range(RangeOp::Push));
    llmprof_probes::range(&range(RangeOp::Pop));
    let step = StepRecord {
        host_start_ns: now,
        host_end_ns: now + 1_000,
        device_start_ns: now + 10,
        device_end_ns: now + 990,
        decode_tokens: 2,
        kv_blocks_used: 5,
        kv_blocks_total: 100,
        num_waiting: 1,
        ..StepRecord::new(StepKind::Decode, 42, &[7, 8])
    };
    llmprof_probes::step(&step);

    std::thread::sleep(SLOW_SLEEP);

    if let Some(path) = gguf {
        let mut f = std::fs::File::open(path).map_err(|e| format!("open {path}: {e}"))?;
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = f.read(&mut buf).map_err(|e| format!("read {path}: {e}"))?;
            if n == 0 {
                break;
            }
        }
    }

    if let Some(addr) = connect {
        let addr: SocketAddr = addr.parse().map_err(|e| format!("--connect {addr}: {e}"))?;
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
            .map_err(|e| format!("connect {addr}: {e}"))?;
        s.write_all(b"hello").map_err(|e| format!("write: {e}"))?;
    }
    Ok(())
}

fn burst(n: u64) {
    let mut rec = RangeRecord::new(RangeOp::Mark, 0, 0, "bench", "mark");
    for i in 0..n {
        rec.step_id = i;
        llmprof_probes::range(&rec);
    }
}

/// A slow syscall for the `syscalls` command: above llmprof's default 1 ms threshold.
const SYSCALLS_SLEEP: Duration = Duration::from_millis(2);

fn syscalls(n: u64, work: u64, sleep_every: u64) {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for i in 0..n {
        for _ in 0..work {
            x = std::hint::black_box(x.rotate_left(5) ^ 0x2545_f491_4f6c_dd1d).wrapping_mul(3);
        }
        // SAFETY: getppid takes no arguments, cannot fail and touches no memory of ours.
        std::hint::black_box(unsafe { libc::syscall(libc::SYS_getppid) });
        if sleep_every > 0 && i % sleep_every == sleep_every - 1 {
            std::thread::sleep(SYSCALLS_SLEEP);
        }
    }
    std::hint::black_box(x);
}
