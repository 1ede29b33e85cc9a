use super::*;

#[test]
fn this_process_has_a_dlopen_and_no_libcuda() {
    let pid = std::process::id();
    let m = loaded_files(pid).unwrap();
    let libc = find_libc(pid, &m).unwrap();
    // The addresses are libc's as this process's loader resolves them.
    for (name, addr) in [
        (c"dlopen", libc.dlopen.0),
        (c"mmap", libc.fns.mmap),
        (c"munmap", libc.fns.munmap),
    ] {
        // SAFETY: dlsym with a valid handle constant and a NUL-terminated name.
        let here = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) } as u64;
        assert_eq!(addr, here, "{name:?}");
    }
    // __restore_rt is what sigaction installs as the return path of a signal handler.
    extern "C" fn nothing(_: libc::c_int) {}
    // SAFETY: an all-zero sigaction is valid; installing a handler for SIGUSR2, which this test owns, and
    // reading it back.
    let restorer = unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = nothing as *const () as usize;
        libc::sigaction(libc::SIGUSR2, &sa, std::ptr::null_mut());
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGUSR2, std::ptr::null(), &mut old);
        old.sa_restorer
    };
    if let Some(r) = restorer {
        assert_eq!(libc.fns.restore_rt, r as usize as u64);
    }
    assert!(!m.iter().any(|m| basename(m).starts_with("libcuda.so")));
    assert!(crate::sys::ns::same_as_own(pid, crate::sys::ns::Kind::Mount));
}

/// `cat` reading a pipe, and a way to check it still echoes.
struct Cat {
    child: std::process::Child,
}

impl Cat {
    fn spawn() -> Cat {
        let child = std::process::Command::new("cat")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Until it blocks in its read.
        let pid = child.id();
        for _ in 0..200 {
            let sc = std::fs::read_to_string(format!("/proc/{pid}/syscall")).unwrap_or_default();
            if sc.starts_with("0 ") {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Cat { child }
    }

    fn echoes(&mut self, line: &str) -> bool {
        use std::io::{BufRead, Write};
        let stdin = self.child.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
        let mut out = String::new();
        std::io::BufReader::new(self.child.stdout.as_mut().unwrap())
            .read_line(&mut out)
            .unwrap();
        out.trim_end() == line
    }
}

impl Drop for Cat {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_call_returns_its_value_and_the_thread_goes_back_to_its_read() {
    let mut cat = Cat::spawn();
    let pid = cat.child.id();
    let getpid = symbol_in(pid, |b| b.starts_with("libc.so"), "getpid").unwrap();
    assert_eq!(
        call_function(pid, getpid, &[], &[], Duration::from_secs(10)).unwrap(),
        u64::from(pid)
    );
    // Data on its stack, read back by the target: atoi("12345").
    let atoi = symbol_in(pid, |b| b.starts_with("libc.so"), "atoi").unwrap();
    let n = call_function(pid, atoi, b"12345\0", &[Arg::Data], Duration::from_secs(10)).unwrap();
    assert_eq!(n, 12345);
    assert!(cat.echoes("still reading"));
    // No stub page left behind: the call's page was unmapped.
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let stub = maps
        .lines()
        .filter_map(crate::sys::maps::MapsLine::parse)
        .any(|m| m.perms == "r-xp" && m.path.is_empty());
    assert!(!stub, "{maps}");
}

#[test]
fn a_library_is_loaded_and_its_exports_called_written_and_read() {
    let mut cat = Cat::spawn();
    let pid = cat.child.id();
    // libm: not mapped by `cat`, exports functions and data.
    let Some(libm) = [
        "/lib/x86_64-linux-gnu/libm.so.6",
        "/usr/lib/x86_64-linux-gnu/libm.so.6",
        "/lib64/libm.so.6",
    ]
    .iter()
    .map(Path::new)
    .find(|p| p.is_file()) else {
        return;
    };
    let libm = std::fs::canonicalize(libm).unwrap();
    let loaded = inject(pid, &libm, "llmprof-inject-test-", Duration::from_secs(10)).unwrap();
    assert_eq!(loaded.pid, pid);
    assert!(
        std::fs::read_to_string(format!("/proc/{pid}/maps"))
            .unwrap()
            .contains(&*libm.to_string_lossy()),
        "not mapped"
    );
    assert!(matches!(
        loaded.call_export("no_such_function", &[], Duration::from_secs(10)),
        Err(InjectError::Symbol { .. })
    ));
    // signgam: libm's exported int.
    loaded.write_export("signgam", &7i32.to_le_bytes()).unwrap();
    let mut back = [0u8; 4];
    loaded.read_export("signgam", &mut back).unwrap();
    assert_eq!(i32::from_le_bytes(back), 7);
    assert!(
        loaded.write_export("signgam", &[0u8; 64]).is_err(),
        "past the symbol's size"
    );
    // Functions with integer arguments: libc's, loaded again (dlopen of a mapped library is its handle).
    let libc_path = loaded_files(pid)
        .unwrap()
        .into_iter()
        .find(|m| basename(m).starts_with("libc.so"))
        .unwrap()
        .path;
    let libc = inject(pid, &libc_path, "llmprof-inject-test-", Duration::from_secs(10)).unwrap();
    let t = Duration::from_secs(10);
    assert_eq!(libc.call_export("getpid", &[], t).unwrap(), u64::from(pid));
    assert_eq!(libc.call_export("abs", &[(-5i64) as u64], t).unwrap() as u32, 5);
    assert!(cat.echoes("still reading"));
}

#[test]
fn a_crashing_call_is_undone_without_the_signal() {
    let mut cat = Cat::spawn();
    let pid = cat.child.id();
    let e = call_function(pid, 0x10, &[], &[], Duration::from_secs(10)).unwrap_err();
    assert!(
        matches!(
            e,
            InjectError::Call {
                source: PtraceError::Crashed {
                    signal: libc::SIGSEGV,
                    ..
                },
                ..
            }
        ),
        "{e}"
    );
    assert!(cat.echoes("survived"));
}

#[test]
fn a_call_past_its_deadline_is_left_to_finish_and_the_thread_comes_back() {
    let mut cat = Cat::spawn();
    let pid = cat.child.id();
    let sleep = symbol_in(pid, |b| b.starts_with("libc.so"), "sleep").unwrap();
    let t0 = std::time::Instant::now();
    let e = call_function(pid, sleep, &[], &[Arg::Val(2)], Duration::from_millis(300)).unwrap_err();
    assert!(
        matches!(
            e,
            InjectError::Call {
                source: PtraceError::Timeout { .. },
                ..
            }
        ),
        "{e}"
    );
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "the caller was not held by the call"
    );
    // The thread is not traced any more and finishes the sleep on its own, then reads again.
    let until = std::time::Instant::now() + Duration::from_secs(5);
    while ptrace::tracer_of(pid).is_some() && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(ptrace::tracer_of(pid), None);
    assert!(cat.echoes("after the sleep"));
    assert!(t0.elapsed() >= Duration::from_secs(2));
}

#[test]
fn the_thread_picked_is_one_of_the_targets() {
    let pid = std::process::id();
    let tid = ptrace::pick_thread(pid);
    assert!(std::path::Path::new(&format!("/proc/{pid}/task/{tid}")).exists());
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A process in its own mount namespace whose root is `root` (a static `pause` made by gcc).
#[test]
fn a_thread_that_does_not_stop_in_time_is_let_go_when_it_does() {
    // A parent waiting for its vfork child is in an uninterruptible wait: a ptrace stop waits for the child.
    let have_gcc = std::process::Command::new("gcc")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !is_root() || !have_gcc {
        return;
    }
    let base = std::env::temp_dir().join(format!("llmprof-inject-vfork-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();
    let src = base.join("vfork.c");
    std::fs::write(
        &src,
        "#define _GNU_SOURCE\n#include <sched.h>\n#include <sys/syscall.h>\n#include <time.h>\n\
         #include <unistd.h>\nint main(void) { sleep(1); if (vfork() == 0) { struct timespec t = {3, 0}; \
         syscall(SYS_nanosleep, &t, 0); _exit(0); } return 7; }\n",
    )
    .unwrap();
    let bin = base.join("vfork");
    let o = std::process::Command::new("gcc")
        .args(["-O1", "-o"])
        .arg(&bin)
        .arg(&src)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let child = std::process::Command::new(&bin).spawn().unwrap();
    let pid = child.id();
    let state = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| s.rsplit(')').next()?.split_whitespace().next().map(str::to_owned))
    };
    let until = std::time::Instant::now() + Duration::from_secs(5);
    while state().as_deref() != Some("D") {
        assert!(
            std::time::Instant::now() < until,
            "never waited for its vfork child"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let mapped = loaded_files(pid).unwrap();
    let libc = find_libc(pid, &mapped).unwrap();
    let getpid = lookup(mapped.iter().find(libc_like).unwrap(), &["getpid"], false)
        .unwrap()
        .addr(0)
        .unwrap();
    let deadlines = Deadlines {
        stop: Duration::from_millis(300),
        call: Duration::from_secs(5),
    };
    let e = ptrace::call(pid, pid as i32, libc.fns, getpid, &[], &[], deadlines).unwrap_err();
    assert!(
        matches!(
            e,
            PtraceError::Timeout {
                what: "the thread did not stop",
                ..
            }
        ),
        "{e}"
    );
    // When its child exits, the parent stops for the tracer, is let go untouched, and exits as it would.
    // (Its exit only: this test thread's wait must not take the stop meant for the tracing thread.)
    // SAFETY: an all-zero siginfo_t is a valid value; waitid writes one into it.
    let (r, code) = unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let r = libc::waitid(libc::P_PID, pid, &mut info, libc::WEXITED | libc::__WNOTHREAD);
        (r, info.si_status())
    };
    assert_eq!((r, code), (0, 7));
    drop(child);
    std::fs::remove_dir_all(&base).unwrap();
}

#[test]
fn a_helper_others_could_swap_is_not_trusted() {
    let base = std::env::temp_dir().join(format!("llmprof-inject-trust-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();
    let lib = base.join("lib.so");
    std::fs::write(&lib, b"x").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o666)).unwrap();
    let e = trusted_path(&lib, &[]).unwrap_err();
    assert!(e.contains("writable by its group or others"), "{e}");
    std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o644)).unwrap();
    // The system's temporary directory is writable by everyone: nothing under it is trusted.
    let tmp_world_writable = std::env::temp_dir() == Path::new("/tmp");
    if is_root() && tmp_world_writable {
        assert!(trusted_path(&lib, &[]).is_err());
    }
    assert!(trusted_path(Path::new("/usr/bin/env"), &[]).is_ok() || !is_root());
    // Another owner is trusted only when named (the owner of the running llmprof, for files next to it).
    if is_root() {
        let dir = base.join("user");
        std::fs::create_dir_all(&dir).unwrap();
        let lib = dir.join("lib.so");
        std::fs::write(&lib, b"x").unwrap();
        std::os::unix::fs::chown(&lib, Some(65534), None).unwrap();
        let e = trusted_path(&lib, &[]).unwrap_err();
        assert!(e.contains("uid 65534"), "{e}");
    }
    std::fs::remove_dir_all(&base).unwrap();
}
