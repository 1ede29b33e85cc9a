//! The injector itself (`llmprof::inject`) on `regs_testee.c`: the thread it borrows gets every register back
//! whether the call returns, crashes, outlives its deadline, or its injector is killed; a constructor past the
//! deadline leaves the loader usable.

use super::*;

/// Root (ptrace) and gcc (the fixtures), or a loud skip.
fn root_and_gcc() -> bool {
    e2e::require(e2e::is_root(), "not root: cannot ptrace")
        && e2e::require(have_gcc(), "gcc not installed (apt-get install gcc)")
}

/// `regs_testee.c` built and started, and whether it checks the AVX-512 registers too (its `ready` line says).
fn regs_testee(dir: &Path) -> (Testee, bool) {
    let bin = dir.join("regs_testee");
    e2e::fixtures::gcc(&["-O1", "-Wall", "-Werror", "-mavx512f"], "regs_testee.c", &bin);
    let t = Testee::start(&mut Command::new(&bin));
    let avx512 = t.ready().ends_with("avx512");
    (t, avx512)
}

/// Waits until `pid`'s main thread is blocked in `read` and nobody traces it.
fn blocked_in_read(pid: u32) {
    let until = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let sc = std::fs::read_to_string(format!("/proc/{pid}/syscall")).unwrap_or_default();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        if sc.starts_with("0 ") && status.contains("TracerPid:\t0\n") {
            return;
        }
        assert!(
            std::time::Instant::now() < until,
            "pid {pid} never blocked in read: {sc:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// One line to the testee, its verdict on the registers it kept across the read.
fn verdict(t: &mut Testee) -> String {
    t.ask("check")
}

fn libc_fn(pid: u32, name: &'static str) -> u64 {
    inject::symbol_in(pid, |b| b.starts_with("libc.so"), name).unwrap()
}

/// The thread llmprof borrows for a call (one blocked in a syscall, here a raw `read` with known values in
/// its general, AVX2 / AVX-512 and mask registers and a non-default MXCSR) gets every register back, whether
/// the call returns, crashes, or outlives its deadline and finishes on its own later.
#[test]
fn a_borrowed_thread_gets_every_register_back() {
    if !root_and_gcc() {
        return;
    }
    let dir = scratch("regs");
    let (mut t, avx512) = regs_testee(&dir);
    let pid = t.pid();
    let getpid = libc_fn(pid, "getpid");
    let sleep = libc_fn(pid, "sleep");
    // Each read alternates between the register sets when the CPU has AVX-512: both get each kind of call.
    for _ in 0..if avx512 { 2 } else { 1 } {
        blocked_in_read(pid);
        let v = inject::call_function(pid, getpid, &[], &[], Duration::from_secs(10)).unwrap();
        assert_eq!(v, u64::from(pid));
        assert_eq!(verdict(&mut t), "ok", "after a call that returned");

        blocked_in_read(pid);
        let e = inject::call_function(pid, 0x10, &[], &[], Duration::from_secs(10)).unwrap_err();
        assert!(e.to_string().contains("pid"), "{e}");
        assert!(
            format!("{e:?}").contains("Crashed"),
            "a call to an unmapped address faults: {e:?}"
        );
        assert_eq!(verdict(&mut t), "ok", "after a call that crashed");

        blocked_in_read(pid);
        let t0 = std::time::Instant::now();
        let e = inject::call_function(
            pid,
            sleep,
            &[],
            &[llmprof::inject::Arg::Val(1)],
            Duration::from_millis(200),
        )
        .unwrap_err();
        assert!(format!("{e:?}").contains("Timeout"), "{e:?}");
        assert!(
            t0.elapsed() < Duration::from_secs(1),
            "the caller waited for the call"
        );
        // The sleep finishes on its own, the read starts again, the registers are the thread's.
        assert_eq!(verdict(&mut t), "ok", "after a call that outlived its deadline");
        assert!(t0.elapsed() >= Duration::from_secs(1));
    }
    assert!(t.close().success());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A library whose constructor runs past the call's deadline: llmprof does not put the thread back in the
/// middle of `dlopen` (which would leave the loader's lock held forever); the constructor finishes, the
/// thread returns to its read with its registers, and a later `dlopen` in the process works.
#[test]
fn a_constructor_that_runs_past_the_deadline_finishes_and_the_loader_stays_usable() {
    if !root_and_gcc() {
        return;
    }
    let dir = scratch("ctor");
    let slow = dir.join("libslow.so");
    let quick = dir.join("libquick.so");
    for (lib, body) in [
        (
            &slow,
            "#include <unistd.h>\n__attribute__((constructor)) static void c(void) { sleep(2); }\nint slow_loaded = 1;\n",
        ),
        (&quick, "int quick_loaded = 1;\n"),
    ] {
        let src = lib.with_extension("c");
        std::fs::write(&src, body).unwrap();
        let o = Command::new("gcc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(lib)
            .arg(&src)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let (mut t, _) = regs_testee(&dir);
    let pid = t.pid();
    let dlopen = libc_fn(pid, "dlopen");
    let mut path = slow.to_str().unwrap().as_bytes().to_vec();
    path.push(0);
    use llmprof::inject::Arg;
    blocked_in_read(pid);
    let t0 = std::time::Instant::now();
    let e = inject::call_function(
        pid,
        dlopen,
        &path,
        &[Arg::Data, Arg::Val(2)],
        Duration::from_millis(300),
    )
    .unwrap_err();
    assert!(format!("{e:?}").contains("Timeout"), "{e:?}");
    assert!(t0.elapsed() < Duration::from_secs(2));
    // The constructor finishes: the library is mapped, the thread back in its read with its registers.
    assert_eq!(verdict(&mut t), "ok");
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert!(maps.contains("libslow.so"), "{maps}");
    // The loader's lock was released: another dlopen returns at once.
    blocked_in_read(pid);
    let mut path = quick.to_str().unwrap().as_bytes().to_vec();
    path.push(0);
    let h = inject::call_function(
        pid,
        dlopen,
        &path,
        &[Arg::Data, Arg::Val(2)],
        Duration::from_secs(5),
    )
    .unwrap();
    assert_ne!(h, 0);
    assert_eq!(verdict(&mut t), "ok");
    assert!(t.close().success());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The injector for [`an_injector_killed_during_the_call_leaves_the_target_running`]: run in its own process
/// (this test binary again), it calls `sleep(2)` in `LLMPROF_TEST_INJECT_PID` and is killed meanwhile.
#[test]
#[ignore = "run by an_injector_killed_during_the_call_leaves_the_target_running in a process it kills"]
fn injector_killed_by_the_test() {
    let Ok(pid) = std::env::var("LLMPROF_TEST_INJECT_PID") else {
        return;
    };
    let pid: u32 = pid.parse().unwrap();
    let sleep = libc_fn(pid, "sleep");
    let _ = inject::call_function(
        pid,
        sleep,
        &[],
        &[llmprof::inject::Arg::Val(2)],
        Duration::from_secs(60),
    );
    panic!("the call returned before the test killed this process");
}

/// SIGKILL of llmprof while its call runs in the target: the kernel lets the thread go (no
/// `PTRACE_O_EXITKILL`), the call finishes and returns through its stub, the target keeps running with its
/// registers.
#[test]
fn an_injector_killed_during_the_call_leaves_the_target_running() {
    if !root_and_gcc() {
        return;
    }
    let dir = scratch("kill");
    let (mut t, _) = regs_testee(&dir);
    let pid = t.pid();
    blocked_in_read(pid);
    let mut injector = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "ptrace::injector_killed_by_the_test",
            "--ignored",
            "--nocapture",
        ])
        .env("LLMPROF_TEST_INJECT_PID", pid.to_string())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    // Until the injector's call runs: the thread traced and inside the sleep (a nanosleep).
    let until = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let sc = std::fs::read_to_string(format!("/proc/{pid}/syscall")).unwrap_or_default();
        if sc.starts_with("230 ") || sc.starts_with("35 ") {
            break;
        }
        assert!(
            std::time::Instant::now() < until,
            "the call never started: {sc:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    injector.kill().unwrap();
    injector.wait().unwrap();
    // The target survives, its call ends, it reads again with its registers intact.
    assert_eq!(verdict(&mut t), "ok");
    assert!(t.child().try_wait().unwrap().is_none(), "the target is alive");
    assert!(t.close().success());
    std::fs::remove_dir_all(&dir).unwrap();
}
