//! `llmprof-testee`: the process the capture tests trace. Not for users.
//!
//! Owns a fixed, known sequence of observable actions: engine probe records (through the real
//! `llmprof-probes` functions), a slow syscall, a model-file read, an outbound connect. It prints `ready PID`,
//! then for each stdin line: `go` runs the sequence and prints `done`; `burst N` emits N range marks and
//! prints `burst done NS` (the loop's duration); `syscalls N WORK [SLEEP_EVERY]` makes N `getppid` calls,
//! each after WORK rounds of integer busy work (the knob that sets the syscall rate: `cargo xtask bench
//! syscalls` picks it for ~500k calls/s), plus a 2 ms sleep (a slow syscall) every SLEEP_EVERY calls, and
//! prints `syscalls done NS`; `burn MS` spins MS ms of CPU in the non-inlined chain `llmprof_testee_burn_a` →
//! `llmprof_testee_burn_b` → `llmprof_testee_burn_c` (the stack-sampling tests' known call chain) and prints
//! `burn done`; `sysburn MS` spends MS ms in 64 KiB reads of /dev/zero inside `llmprof_testee_sysburn` (a
//! syscall-heavy loop: its samples have kernel frames) and prints `sysburn done`; `exit` (or EOF) exits with
//! status 3.
//!
//! Process trees: `fork-open PATH` forks a child whose first action is `open(PATH)` (a raw syscall, nothing
//! before it), then a 20 ms sleep (a slow syscall), then `_exit(5)`; the parent reaps it and prints
//! `forked PID`. `spawn PROGRAM ARGS...` starts PROGRAM as a child (fork + exec, stdout discarded, stderr
//! inherited) and prints `spawned PID`; `reap` waits for every spawned child and prints `reaped N`.
//!
//! CUDA driver calls, against a stand-in libcuda (`profiler-user/tests/fixtures/fake_libcuda.c`, compiled by
//! the tests): `--libcuda PATH` `dlopen`s it at start; `cuda-load PATH` does so later (printing `cuda loaded`);
//! `cuda STEPS LAUNCHES` runs STEPS engine steps, each `LAUNCHES` × `cuLaunchKernel` (in turn the exported
//! symbol, `_ptsz`, and the pointer `cuGetProcAddress_v2` hands out) inside a
//! `llmserve::forward` range, then `cuMemcpyDtoH_v2` (4096 bytes) and `cuStreamSynchronize`, ended by a step
//! record (ids 1..=STEPS); then, outside any step, cuMemAlloc_v2 (1 MiB), cuMemFree_v2,
//! cuMemcpyHtoDAsync_v2 (256 bytes), cuMemcpyAsync_ptsz, cuLaunchKernelEx, cuGraphLaunch, cuCtxSynchronize,
//! cuEventSynchronize and a failing cuEventSynchronize_ptsz; prints `cuda done`. `launches N` makes N kernel
//! launches and nothing else (the three entry points in turn), printing `launches done` (`cargo xtask bench
//! cuda`: the per-call cost of each probe mode).
//!
//! GPU kernels (llmprof's injected CUPTI helper): `cuda-loop THREADS` starts THREADS threads (named
//! `launcher`) that each call cuLaunchKernel in a loop, 1 ms apart (a nanosleep: a syscall boundary), checking
//! every result (the CUresult, and a floating-point sum computed across the sleep against its known value), and
//! prints `cuda-loop started`; `cuda-loop-stop` stops and joins them and prints `cuda-loop done LAUNCHES ERRORS`.
//!
//! Thread states: `sleeper N MS` runs a thread named `sleeper` that sleeps N × MS ms in `nanosleep` (in
//! `llmprof_testee_nap`), printing
//! `sleeper TID` when it starts and `sleeper done` at the end; `contend CPU MS` runs a thread named `contended`
//! pinned to CPU that computes for MS ms of wall time, printing `contend TID` and `contend done CPU_NS` (its
//! own CPU time); `spin CPU MS` pins the main thread to CPU and computes for MS ms (the competitor, run in a
//! second testee), printing `spin done`.
//!
//! Usage: `llmprof-testee [--gguf PATH] [--connect 127.0.0.1:PORT] [--libcuda PATH]`

use std::ffi::c_void;
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
    let mut cuda = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--gguf" => gguf = args.next(),
            "--connect" => connect = args.next(),
            "--libcuda" => {
                let path = args.next().ok_or("--libcuda needs a path")?;
                cuda = Some(FakeCuda::load(&path)?);
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    llmprof_probes::keep();
    let mut spawned: Vec<std::process::Child> = Vec::new();
    let mut launchers: Option<Launchers> = None;
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
            Some("cuda-load") => {
                let path = words.next().ok_or("cuda-load needs a path")?;
                cuda = Some(FakeCuda::load(path)?);
                writeln!(out, "cuda loaded").map_err(|e| e.to_string())?;
            }
            Some("cuda") => {
                let steps: u64 = words.next().and_then(|w| w.parse().ok()).unwrap_or(3);
                let launches: u64 = words.next().and_then(|w| w.parse().ok()).unwrap_or(100);
                let c = cuda
                    .as_ref()
                    .ok_or("cuda: no libcuda loaded (--libcuda or cuda-load)")?;
                c.run(steps, launches);
                writeln!(out, "cuda done").map_err(|e| e.to_string())?;
            }
            Some("launches") => {
                let n: u64 = words.next().and_then(|w| w.parse().ok()).unwrap_or(1000);
                let c = cuda
                    .as_ref()
                    .ok_or("launches: no libcuda loaded (--libcuda or cuda-load)")?;
                c.launches(n);
                writeln!(out, "launches done").map_err(|e| e.to_string())?;
            }
            Some("syscalls") => {
                let mut num = || words.next().and_then(|w| w.parse::<u64>().ok());
                let (n, work, sleep_every) = (num().unwrap_or(1000), num().unwrap_or(0), num().unwrap_or(0));
                let t0 = std::time::Instant::now();
                syscalls(n, work, sleep_every);
                let ns = t0.elapsed().as_nanos();
                writeln!(out, "syscalls done {ns}").map_err(|e| e.to_string())?;
            }
            Some("fork-open") => {
                let path = words.next().ok_or("fork-open needs a path")?;
                let pid = fork_open(path)?;
                writeln!(out, "forked {pid}").map_err(|e| e.to_string())?;
            }
            Some("spawn") => {
                let prog = words.next().ok_or("spawn needs a program")?;
                let child = std::process::Command::new(prog)
                    .args(words)
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .spawn()
                    .map_err(|e| format!("spawn {prog}: {e}"))?;
                writeln!(out, "spawned {}", child.id()).map_err(|e| e.to_string())?;
                spawned.push(child);
            }
            Some("reap") => {
                let n = spawned.len();
                for mut c in spawned.drain(..) {
                    let _ = c.wait();
                }
                writeln!(out, "reaped {n}").map_err(|e| e.to_string())?;
            }
            Some("sleeper") => {
                let mut num = || words.next().and_then(|w| w.parse::<u64>().ok());
                let (n, ms) = (num().unwrap_or(10), num().unwrap_or(20));
                let (tx, rx) = std::sync::mpsc::channel();
                let h = std::thread::Builder::new()
                    .name("sleeper".into())
                    .spawn(move || {
                        let _ = tx.send(gettid());
                        for _ in 0..n {
                            llmprof_testee_nap(ms);
                        }
                    })
                    .map_err(|e| e.to_string())?;
                let tid = rx.recv().map_err(|e| e.to_string())?;
                writeln!(out, "sleeper {tid}").map_err(|e| e.to_string())?;
                out.flush().map_err(|e| e.to_string())?;
                h.join().map_err(|_| "sleeper panicked")?;
                writeln!(out, "sleeper done").map_err(|e| e.to_string())?;
            }
            Some("contend") => {
                let mut num = || words.next().and_then(|w| w.parse::<u64>().ok());
                let (cpu, ms) = (num().unwrap_or(0), num().unwrap_or(500));
                let (tx, rx) = std::sync::mpsc::channel();
                let h = std::thread::Builder::new()
                    .name("contended".into())
                    .spawn(move || {
                        pin_to(cpu as usize);
                        let _ = tx.send(gettid());
                        spin_for(Duration::from_millis(ms));
                        thread_cpu_ns()
                    })
                    .map_err(|e| e.to_string())?;
                let tid = rx.recv().map_err(|e| e.to_string())?;
                writeln!(out, "contend {tid}").map_err(|e| e.to_string())?;
                out.flush().map_err(|e| e.to_string())?;
                let cpu_ns = h.join().map_err(|_| "contended thread panicked")?;
                writeln!(out, "contend done {cpu_ns}").map_err(|e| e.to_string())?;
            }
            Some("spin") => {
                let mut num = || words.next().and_then(|w| w.parse::<u64>().ok());
                let (cpu, ms) = (num().unwrap_or(0), num().unwrap_or(500));
                pin_to(cpu as usize);
                spin_for(Duration::from_millis(ms));
                writeln!(out, "spin done").map_err(|e| e.to_string())?;
            }
            Some("burn") => {
                let ms: u64 = words.next().and_then(|w| w.parse().ok()).unwrap_or(500);
                std::hint::black_box(llmprof_testee_burn_a(ms));
                writeln!(out, "burn done").map_err(|e| e.to_string())?;
            }
            Some("sysburn") => {
                let ms: u64 = words.next().and_then(|w| w.parse().ok()).unwrap_or(500);
                llmprof_testee_sysburn(ms)?;
                writeln!(out, "sysburn done").map_err(|e| e.to_string())?;
            }
            Some("cuda-loop") => {
                let threads: u64 = words.next().and_then(|w| w.parse().ok()).unwrap_or(4);
                let c = cuda
                    .as_ref()
                    .ok_or("cuda-loop: no libcuda loaded (--libcuda or cuda-load)")?;
                launchers = Some(Launchers::start(c.launch, threads)?);
                writeln!(out, "cuda-loop started").map_err(|e| e.to_string())?;
            }
            Some("cuda-loop-stop") => {
                let (n, errors) = launchers.take().map(Launchers::stop).unwrap_or((0, 0));
                writeln!(out, "cuda-loop done {n} {errors}").map_err(|e| e.to_string())?;
            }
            Some("exit") => break,
            _ => {}
        }
        out.flush().map_err(|e| e.to_string())?;
    }
    std::process::exit(EXIT_STATUS);
}

/// Forks a child whose first action is `open(path)` (then a slow sleep, then `_exit(5)`); reaps it. Its pid.
fn fork_open(path: &str) -> Result<i32, String> {
    let c = std::ffi::CString::new(path).map_err(|e| e.to_string())?;
    let ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: SLOW_SLEEP.as_nanos() as libc::c_long,
    };
    // SAFETY: fork has no preconditions; the child calls only async-signal-safe functions (open, nanosleep,
    // _exit) on memory prepared before the fork.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(format!("fork: {}", std::io::Error::last_os_error()));
    }
    if pid == 0 {
        // SAFETY: see above; `c` and `ts` are valid for the calls.
        unsafe {
            libc::open(c.as_ptr(), libc::O_RDONLY);
            libc::nanosleep(&ts, std::ptr::null_mut());
            libc::_exit(5);
        }
    }
    let mut status = 0;
    // SAFETY: waits for our own child; `status` is a valid out pointer.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    Ok(pid)
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
    }
    .with_req_tokens([1, 1]);
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

type CuResult = i32;
type LaunchFn = unsafe extern "C" fn(
    *mut c_void,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    *mut c_void,
    *mut *mut c_void,
    *mut *mut c_void,
) -> CuResult;
type LaunchExFn =
    unsafe extern "C" fn(*const c_void, *mut c_void, *mut *mut c_void, *mut *mut c_void) -> CuResult;
type GraphLaunchFn = unsafe extern "C" fn(*mut c_void, *mut c_void) -> CuResult;
type HtoDAsyncFn = unsafe extern "C" fn(u64, *const c_void, usize, *mut c_void) -> CuResult;
type DtoHFn = unsafe extern "C" fn(*mut c_void, u64, usize) -> CuResult;
type DtoDAsyncFn = unsafe extern "C" fn(u64, u64, usize, *mut c_void) -> CuResult;
type AllocFn = unsafe extern "C" fn(*mut u64, usize) -> CuResult;
type FreeFn = unsafe extern "C" fn(u64) -> CuResult;
type HandleFn = unsafe extern "C" fn(*mut c_void) -> CuResult;
type CtxSyncFn = unsafe extern "C" fn() -> CuResult;

/// `cuda-loop`: threads launching kernels until stopped, each checking its own results.
struct Launchers {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<(u64, u64)>>,
}

impl Launchers {
    fn start(launch: LaunchFn, n: u64) -> Result<Self, String> {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut threads = Vec::new();
        for t in 0..n {
            let stop = stop.clone();
            let h = std::thread::Builder::new()
                .name("launcher".into())
                .spawn(move || {
                    let (mut launches, mut errors) = (0u64, 0u64);
                    let null = std::ptr::null_mut::<c_void>();
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let x = std::hint::black_box(1.5f64 + t as f64);
                        let before = (x * x).sqrt() + x.ln_1p();
                        // SAFETY: the stand-in ignores its pointers (only adds their values).
                        let rc = unsafe {
                            launch(
                                null,
                                2,
                                1,
                                1,
                                64,
                                1,
                                1,
                                0,
                                (t + 1) as *mut c_void,
                                null.cast(),
                                null.cast(),
                            )
                        };
                        std::thread::sleep(Duration::from_millis(1));
                        let after = (x * x).sqrt() + x.ln_1p();
                        launches += 1;
                        if rc != 0
                            || before.to_bits() != after.to_bits()
                            || (before - (x + x.ln_1p())).abs() > 1e-12
                        {
                            errors += 1;
                        }
                    }
                    (launches, errors)
                })
                .map_err(|e| e.to_string())?;
            threads.push(h);
        }
        Ok(Self { stop, threads })
    }

    fn stop(self) -> (u64, u64) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.threads
            .into_iter()
            .map(|h| h.join().unwrap_or((0, 1)))
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    }
}

/// The stand-in libcuda's entry points, resolved with `dlsym` (the library stays loaded for the process).
struct FakeCuda {
    launch: LaunchFn,
    /// cuLaunchKernel as `cuGetProcAddress_v2` hands it out (how cudart calls the driver).
    launch_proc: LaunchFn,
    launch_ptsz: LaunchFn,
    launch_ex: LaunchExFn,
    graph_launch: GraphLaunchFn,
    htod_async: HtoDAsyncFn,
    dtoh: DtoHFn,
    memcpy_async: DtoDAsyncFn,
    alloc: AllocFn,
    free: FreeFn,
    stream_sync: HandleFn,
    ctx_sync: CtxSyncFn,
    event_sync: HandleFn,
    event_sync_ptsz: HandleFn,
}

impl FakeCuda {
    fn load(path: &str) -> Result<Self, String> {
        let c = std::ffi::CString::new(path).map_err(|e| e.to_string())?;
        // SAFETY: a valid NUL-terminated path; the handle is never closed, so resolved symbols stay valid.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if h.is_null() {
            return Err(format!("dlopen {path} failed"));
        }
        let sym = |name: &str| -> Result<*mut c_void, String> {
            let n = std::ffi::CString::new(name).map_err(|e| e.to_string())?;
            // SAFETY: `h` is a live handle and `n` a valid NUL-terminated symbol name.
            let p = unsafe { libc::dlsym(h, n.as_ptr()) };
            if p.is_null() {
                Err(format!("{path} has no {name}"))
            } else {
                Ok(p)
            }
        };
        type GetProcFn =
            unsafe extern "C" fn(*const std::ffi::c_char, *mut *mut c_void, i32, u64, *mut i32) -> CuResult;
        // SAFETY: the stand-in's cuGetProcAddress_v2 has this signature (cuda.h); the name is NUL-terminated.
        let launch_proc = unsafe {
            let get = std::mem::transmute::<*mut c_void, GetProcFn>(sym("cuGetProcAddress_v2")?);
            let mut pfn = std::ptr::null_mut();
            let mut status = 0;
            let rc = get(c"cuLaunchKernel".as_ptr(), &mut pfn, 12_000, 0, &mut status);
            if rc != 0 || pfn.is_null() {
                return Err(format!("cuGetProcAddress_v2(cuLaunchKernel) failed: {rc}"));
            }
            std::mem::transmute::<*mut c_void, LaunchFn>(pfn)
        };
        // SAFETY: each symbol is a function of the stand-in library with exactly this C signature
        // (tests/fixtures/fake_libcuda.c, the CUDA driver API's argument order).
        unsafe {
            Ok(Self {
                launch_proc,
                launch: std::mem::transmute::<*mut c_void, LaunchFn>(sym("cuLaunchKernel")?),
                launch_ptsz: std::mem::transmute::<*mut c_void, LaunchFn>(sym("cuLaunchKernel_ptsz")?),
                launch_ex: std::mem::transmute::<*mut c_void, LaunchExFn>(sym("cuLaunchKernelEx")?),
                graph_launch: std::mem::transmute::<*mut c_void, GraphLaunchFn>(sym("cuGraphLaunch")?),
                htod_async: std::mem::transmute::<*mut c_void, HtoDAsyncFn>(sym("cuMemcpyHtoDAsync_v2")?),
                dtoh: std::mem::transmute::<*mut c_void, DtoHFn>(sym("cuMemcpyDtoH_v2")?),
                memcpy_async: std::mem::transmute::<*mut c_void, DtoDAsyncFn>(sym("cuMemcpyAsync_ptsz")?),
                alloc: std::mem::transmute::<*mut c_void, AllocFn>(sym("cuMemAlloc_v2")?),
                free: std::mem::transmute::<*mut c_void, FreeFn>(sym("cuMemFree_v2")?),
                stream_sync: std::mem::transmute::<*mut c_void, HandleFn>(sym("cuStreamSynchronize")?),
                ctx_sync: std::mem::transmute::<*mut c_void, CtxSyncFn>(sym("cuCtxSynchronize")?),
                event_sync: std::mem::transmute::<*mut c_void, HandleFn>(sym("cuEventSynchronize")?),
                event_sync_ptsz: std::mem::transmute::<*mut c_void, HandleFn>(sym(
                    "cuEventSynchronize_ptsz",
                )?),
            })
        }
    }

    /// `n` kernel launches, the exported symbol, `_ptsz` and the `cuGetProcAddress_v2` pointer in turn.
    fn launches(&self, n: u64) {
        let null = std::ptr::null_mut::<c_void>();
        let stream = 0x5usize as *mut c_void;
        for i in 0..n {
            let f = match i % 3 {
                0 => self.launch,
                1 => self.launch_ptsz,
                _ => self.launch_proc,
            };
            // SAFETY: the stand-in ignores its pointers (only adds their values).
            unsafe { f(null, 1, 1, 1, 32, 1, 1, 0, stream, null.cast(), null.cast()) };
        }
    }

    fn run(&self, steps: u64, launches: u64) {
        let null = std::ptr::null_mut::<c_void>();
        let stream = 0x5usize as *mut c_void;
        let mut host = vec![0u8; 4096];
        for step_id in 1..=steps {
            let start = llmprof_probes::boottime_ns();
            let range =
                |op| RangeRecord::new(op, llmprof_probes::boottime_ns(), step_id, "llmserve", "forward");
            llmprof_probes::range(&range(RangeOp::Push));
            self.launches(launches);
            llmprof_probes::range(&range(RangeOp::Pop));
            // SAFETY: `host` is a valid 4096-byte buffer; the stand-in does not write it.
            unsafe { (self.dtoh)(host.as_mut_ptr().cast(), 0x1000, host.len()) };
            // SAFETY: the stand-in only reads the handle's value.
            unsafe { (self.stream_sync)(stream) };
            let rec = StepRecord {
                host_start_ns: start,
                host_end_ns: llmprof_probes::boottime_ns(),
                decode_tokens: 1,
                ..StepRecord::new(StepKind::Decode, step_id, &[1])
            };
            llmprof_probes::step(&rec);
        }
        let mut dptr = 0u64;
        // SAFETY: the stand-in writes one u64 through `dptr` and reads nothing else.
        unsafe {
            (self.alloc)(&mut dptr, 1 << 20);
            (self.free)(dptr);
            (self.htod_async)(0x2000, host.as_ptr().cast(), 256, stream);
            (self.memcpy_async)(0x2000, 0x3000, 512, stream);
            (self.launch_ex)(std::ptr::null(), null, null.cast(), null.cast());
            (self.graph_launch)(null, stream);
            (self.ctx_sync)();
            (self.event_sync)(0x7usize as *mut c_void);
            (self.event_sync_ptsz)(null);
        }
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

/// The calling thread's id.
fn gettid() -> u32 {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::gettid() as u32 }
}

/// Pins the calling thread to `cpu` (ignored when the machine has no such CPU).
fn pin_to(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET stays inside it for cpu < CPU_SETSIZE, and
    // sched_setaffinity(0, ...) reads the set for the calling thread only.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if cpu < libc::CPU_SETSIZE as usize {
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
    }
}

/// Computes until `d` of wall time has passed (checking the clock every 4096 rounds).
fn spin_for(d: Duration) {
    let t0 = std::time::Instant::now();
    let mut x = 1u64;
    while t0.elapsed() < d {
        for _ in 0..4096 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
}

/// CPU time of the calling thread, ns.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec the call writes.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// `sleeper`'s sleep: `ms` ms in `nanosleep` (through std), so an off-CPU stack of the thread names this
/// function (tests look it up by this name).
#[inline(never)]
#[unsafe(no_mangle)]
pub extern "C" fn llmprof_testee_nap(ms: u64) {
    std::thread::sleep(Duration::from_millis(std::hint::black_box(ms)));
}

/// Outermost function of the known call chain (see the module doc): never inlined, unmangled, so samples
/// name it exactly.
#[inline(never)]
#[unsafe(no_mangle)]
pub extern "C" fn llmprof_testee_burn_a(ms: u64) -> u64 {
    std::hint::black_box(llmprof_testee_burn_b(ms)) ^ 1
}

/// Middle of the known call chain.
#[inline(never)]
#[unsafe(no_mangle)]
pub extern "C" fn llmprof_testee_burn_b(ms: u64) -> u64 {
    std::hint::black_box(llmprof_testee_burn_c(ms)) ^ 2
}

/// Innermost of the known call chain: integer busy work for `ms` ms (the clock is read every 4096 rounds).
#[inline(never)]
#[unsafe(no_mangle)]
pub extern "C" fn llmprof_testee_burn_c(ms: u64) -> u64 {
    let end = std::time::Instant::now() + Duration::from_millis(ms);
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    while std::time::Instant::now() < end {
        for _ in 0..4096 {
            x = std::hint::black_box(x.rotate_left(5) ^ 0x2545_f491_4f6c_dd1d).wrapping_mul(3);
        }
    }
    x
}

/// A syscall-heavy loop: 64 KiB reads of /dev/zero for `ms` ms (the kernel clears the buffer: most of the
/// time is in the kernel).
#[inline(never)]
#[unsafe(no_mangle)]
pub fn llmprof_testee_sysburn(ms: u64) -> Result<(), String> {
    let mut f = std::fs::File::open("/dev/zero").map_err(|e| format!("/dev/zero: {e}"))?;
    let mut buf = vec![0u8; 64 << 10];
    let end = std::time::Instant::now() + Duration::from_millis(ms);
    while std::time::Instant::now() < end {
        f.read_exact(&mut buf)
            .map_err(|e| format!("reading /dev/zero: {e}"))?;
        std::hint::black_box(&buf);
    }
    Ok(())
}
