//! Calling a function inside another process: stop one of its threads with ptrace, run the call there, put
//! everything back.
//!
//! Owns the ptrace mechanics of [`super::inject`] and nothing else: `PTRACE_SEIZE` + `PTRACE_INTERRUPT` of
//! one thread (the other threads keep running), its general registers (`PTRACE_GETREGS`), its x87/SSE state
//! (FXSAVE area, `PTRACE_GETFPREGS`) and, when the kernel gives it, its whole XSAVE area (`NT_X86_XSTATE`
//! read with a buffer larger than any CPU's, written back with exactly the length the kernel returned: a
//! fixed-size buffer is what makes gdb fail on CPUs with AMX state, see DESIGN.md); a call with the SysV
//! ABI: arguments in rdi/rsi/rdx, the stack 16-byte aligned below the thread's 128-byte red zone, a return
//! address of 0 whose fault (SIGSEGV at rip 0) ends the call, `orig_rax = -1` so no syscall restart touches
//! the call; then the saved state restored and the thread detached. A thread that was blocked in a syscall
//! gets it restarted by the kernel as after any signal stop.
//!
//! It never leaves a thread stopped: [`Stopped`] restores and detaches on drop.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

/// `NT_X86_XSTATE` (linux/elf.h).
const NT_X86_XSTATE: libc::c_int = 0x202;
/// Larger than the XSAVE area of any x86 CPU (AMX: ~11 KiB); the kernel says the real length.
const XSTATE_MAX: usize = 64 * 1024;
/// The x86-64 System V red zone below rsp that the interrupted code may still use.
const RED_ZONE: u64 = 128;

/// What went wrong with ptrace.
#[derive(Debug, thiserror::Error)]
pub enum PtraceError {
    /// The kernel refused to let llmprof trace the thread.
    #[error("ptrace refused (EPERM){hint}")]
    Denied {
        /// Why, when known.
        hint: String,
    },
    /// The thread or process is gone.
    #[error("the target exited")]
    Exited,
    /// The called function did not return in time (the thread is put back, the call abandoned).
    #[error("the call did not return within {0:?}")]
    Timeout(Duration),
    /// The called function crashed.
    #[error("the call faulted with signal {signal} at {rip:#x}")]
    Crashed {
        /// The signal.
        signal: i32,
        /// Where.
        rip: u64,
    },
    /// Another ptrace or memory operation failed.
    #[error("{op} failed")]
    Os {
        /// The operation.
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

fn os(op: &'static str) -> PtraceError {
    let source = std::io::Error::last_os_error();
    match source.raw_os_error() {
        Some(libc::ESRCH) => PtraceError::Exited,
        _ => PtraceError::Os { op, source },
    }
}

/// An argument of [`Stopped::call`].
#[derive(Clone, Copy, Debug)]
pub enum Arg {
    /// The address where the call's data bytes were written.
    Data,
    /// A value.
    Val(u64),
}

/// One thread held in a ptrace stop, its state saved.
pub struct Stopped {
    tid: i32,
    mem: File,
    regs: libc::user_regs_struct,
    fp: libc::user_fpregs_struct,
    xstate: Option<Vec<u8>>,
    /// A signal the thread was about to get when it stopped: delivered at detach.
    pending: i32,
    /// The registers above were read (only then are they written back).
    saved: bool,
    done: bool,
}

/// Seizes thread `tid` of process `pid` and stops it (the process's other threads keep running).
pub fn seize(pid: u32, tid: i32, timeout: Duration) -> Result<Stopped, PtraceError> {
    let mem = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/{pid}/mem"))
        .map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => PtraceError::Exited,
            _ => PtraceError::Os {
                op: "open /proc/PID/mem",
                source,
            },
        })?;
    // SAFETY: PTRACE_SEIZE takes no pointers (addr and data 0: no options).
    if unsafe { libc::ptrace(libc::PTRACE_SEIZE, tid, 0usize, 0usize) } != 0 {
        let err = std::io::Error::last_os_error();
        return Err(match err.raw_os_error() {
            Some(libc::EPERM) => PtraceError::Denied { hint: yama_hint() },
            Some(libc::ESRCH) => PtraceError::Exited,
            _ => PtraceError::Os {
                op: "PTRACE_SEIZE",
                source: err,
            },
        });
    }
    let mut s = Stopped {
        tid,
        mem,
        // SAFETY: plain-integer C structs: all-zero is a valid value.
        regs: unsafe { std::mem::zeroed() },
        // SAFETY: as above.
        fp: unsafe { std::mem::zeroed() },
        xstate: None,
        pending: 0,
        saved: false,
        done: false,
    };
    // SAFETY: PTRACE_INTERRUPT of a seized thread takes no pointers.
    if unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0usize, 0usize) } != 0 {
        s.done = true;
        // SAFETY: detaching our own tracee; no pointers.
        unsafe { libc::ptrace(libc::PTRACE_DETACH, tid, 0usize, 0usize) };
        return Err(os("PTRACE_INTERRUPT"));
    }
    let status = match wait(tid, Instant::now() + timeout) {
        Ok(st) => st,
        Err(e) => {
            s.done = true;
            return Err(e);
        }
    };
    if !libc::WIFSTOPPED(status) {
        s.done = true;
        return Err(PtraceError::Exited);
    }
    let sig = libc::WSTOPSIG(status);
    if status >> 16 == 0 && sig != libc::SIGTRAP && sig != libc::SIGSTOP {
        // A signal-delivery stop came before the interrupt's: hold the signal, deliver it at detach.
        s.pending = sig;
    }
    // SAFETY: GETREGS/GETFPREGS write exactly one struct of these types into valid memory.
    unsafe {
        if libc::ptrace(libc::PTRACE_GETREGS, tid, 0usize, &mut s.regs as *mut _) != 0 {
            return Err(os("PTRACE_GETREGS"));
        }
        if libc::ptrace(libc::PTRACE_GETFPREGS, tid, 0usize, &mut s.fp as *mut _) != 0 {
            return Err(os("PTRACE_GETFPREGS"));
        }
    }
    s.saved = true;
    let mut xs = vec![0u8; XSTATE_MAX];
    let mut iov = libc::iovec {
        iov_base: xs.as_mut_ptr().cast(),
        iov_len: xs.len(),
    };
    // SAFETY: the iovec describes `xs`, which outlives the call; the kernel shortens iov_len to what it wrote.
    if unsafe {
        libc::ptrace(
            libc::PTRACE_GETREGSET,
            tid,
            NT_X86_XSTATE as usize,
            &mut iov as *mut _,
        )
    } == 0
    {
        xs.truncate(iov.iov_len);
        s.xstate = Some(xs);
    }
    Ok(s)
}

fn yama_hint() -> String {
    match std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope") {
        Ok(v) if v.trim() != "0" => format!(
            ": Yama's kernel.yama.ptrace_scope is {} (3 forbids attaching; 1-2 need CAP_SYS_PTRACE)",
            v.trim()
        ),
        _ => String::from(
            ": the process may be traced by another debugger, or run under a stricter security policy",
        ),
    }
}

/// waitpid for `tid` until `deadline`.
fn wait(tid: i32, deadline: Instant) -> Result<i32, PtraceError> {
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes one int into `status`.
        let r = unsafe { libc::waitpid(tid, &mut status, libc::__WALL | libc::WNOHANG) };
        if r == tid {
            if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
                return Err(PtraceError::Exited);
            }
            return Ok(status);
        }
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(PtraceError::Exited);
        }
        if Instant::now() >= deadline {
            return Err(PtraceError::Timeout(Duration::ZERO));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

impl Stopped {
    /// Whether the thread was stopped inside a syscall (the injection point the module prefers).
    pub fn in_syscall(&self) -> bool {
        (self.regs.orig_rax as i64) >= 0
    }

    /// Calls `func(args…)` in the thread, with `data` copied below its stack; the function's return value.
    /// The thread's registers are put back afterwards (by [`Stopped::detach`] or on drop).
    pub fn call(
        &mut self,
        func: u64,
        data: &[u8],
        args: &[Arg],
        timeout: Duration,
    ) -> Result<u64, PtraceError> {
        let data_addr = (self.regs.rsp - RED_ZONE - data.len() as u64) & !0xf;
        let sp = data_addr - 8; // (sp + 8) % 16 == 0 at the function's first instruction
        self.mem
            .write_all_at(data, data_addr)
            .and_then(|()| self.mem.write_all_at(&0u64.to_le_bytes(), sp))
            .map_err(|source| PtraceError::Os {
                op: "write the call's stack",
                source,
            })?;
        let mut r = self.regs;
        let vals: Vec<u64> = args
            .iter()
            .map(|a| match a {
                Arg::Data => data_addr,
                Arg::Val(v) => *v,
            })
            .collect();
        let get = |i: usize| vals.get(i).copied().unwrap_or(0);
        r.rdi = get(0);
        r.rsi = get(1);
        r.rdx = get(2);
        r.rcx = get(3);
        r.rax = 0;
        r.rip = func;
        r.rsp = sp;
        r.orig_rax = u64::MAX;
        self.set_regs(&r)?;
        let deadline = Instant::now() + timeout;
        let mut sig = 0;
        loop {
            // SAFETY: continuing our stopped tracee; `sig` is a signal number or 0.
            if unsafe { libc::ptrace(libc::PTRACE_CONT, self.tid, 0usize, sig as usize) } != 0 {
                return Err(os("PTRACE_CONT"));
            }
            let status = match wait(self.tid, deadline) {
                Err(PtraceError::Timeout(_)) => {
                    // Stop the thread again so drop can put it back.
                    // SAFETY: no pointers.
                    unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, self.tid, 0usize, 0usize) };
                    let _ = wait(self.tid, Instant::now() + Duration::from_secs(2));
                    return Err(PtraceError::Timeout(timeout));
                }
                Err(e) => {
                    self.done = true;
                    return Err(e);
                }
                Ok(s) => s,
            };
            sig = 0;
            let stop = libc::WSTOPSIG(status);
            if status >> 16 != 0 {
                continue; // PTRACE_EVENT_STOP (the interrupt, a group stop): go on
            }
            let mut now: libc::user_regs_struct =
                // SAFETY: plain-integer C struct.
                unsafe { std::mem::zeroed() };
            // SAFETY: GETREGS writes one struct into `now`.
            if unsafe { libc::ptrace(libc::PTRACE_GETREGS, self.tid, 0usize, &mut now as *mut _) } != 0 {
                return Err(os("PTRACE_GETREGS"));
            }
            match stop {
                libc::SIGSEGV if now.rip == 0 => return Ok(now.rax),
                libc::SIGSEGV | libc::SIGBUS | libc::SIGILL | libc::SIGFPE | libc::SIGABRT => {
                    return Err(PtraceError::Crashed {
                        signal: stop,
                        rip: now.rip,
                    });
                }
                // Any other signal is the program's: delivered now, as if no call were running.
                s => sig = s,
            }
        }
    }

    fn set_regs(&self, r: &libc::user_regs_struct) -> Result<(), PtraceError> {
        // SAFETY: SETREGS reads one struct from valid memory.
        if unsafe { libc::ptrace(libc::PTRACE_SETREGS, self.tid, 0usize, r as *const _) } != 0 {
            return Err(os("PTRACE_SETREGS"));
        }
        Ok(())
    }

    /// Restores the saved state and lets the thread go.
    pub fn detach(mut self) -> Result<(), PtraceError> {
        self.restore_and_detach()
    }

    fn restore_and_detach(&mut self) -> Result<(), PtraceError> {
        if self.done {
            return Ok(());
        }
        self.done = true;
        if !self.saved {
            // SAFETY: detaching our tracee; nothing was changed in it.
            unsafe { libc::ptrace(libc::PTRACE_DETACH, self.tid, 0usize, self.pending as usize) };
            return Ok(());
        }
        let regs = self.set_regs(&self.regs);
        // SAFETY: SETFPREGS reads one struct from valid memory.
        let fp = unsafe { libc::ptrace(libc::PTRACE_SETFPREGS, self.tid, 0usize, &self.fp as *const _) };
        if let Some(xs) = &mut self.xstate {
            let mut iov = libc::iovec {
                iov_base: xs.as_mut_ptr().cast(),
                iov_len: xs.len(),
            };
            // SAFETY: the iovec describes the buffer GETREGSET filled, with the length the kernel gave.
            // A refusal leaves the FXSAVE part restored above.
            unsafe {
                libc::ptrace(
                    libc::PTRACE_SETREGSET,
                    self.tid,
                    NT_X86_XSTATE as usize,
                    &mut iov as *mut _,
                )
            };
        }
        // SAFETY: detaching our tracee, delivering the signal it was about to get (or none).
        let det = unsafe { libc::ptrace(libc::PTRACE_DETACH, self.tid, 0usize, self.pending as usize) };
        regs?;
        if fp != 0 {
            return Err(os("PTRACE_SETFPREGS"));
        }
        if det != 0 {
            return Err(os("PTRACE_DETACH"));
        }
        Ok(())
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = self.restore_and_detach();
    }
}

/// The thread to stop in `pid`: one blocked in a syscall (the main thread first), else the main thread.
pub fn pick_thread(pid: u32) -> i32 {
    let mut in_syscall = Vec::new();
    if let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for e in rd.flatten() {
            let Some(tid) = e.file_name().to_str().and_then(|t| t.parse::<i32>().ok()) else {
                continue;
            };
            let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).unwrap_or_default();
            let state = stat.rsplit(')').next().and_then(|r| r.split_whitespace().next());
            if !matches!(state, Some("S" | "D")) {
                continue;
            }
            let sc = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall")).unwrap_or_default();
            if sc
                .split_whitespace()
                .next()
                .and_then(|n| n.parse::<i64>().ok())
                .is_some_and(|n| n >= 0)
            {
                in_syscall.push(tid);
            }
        }
    }
    in_syscall.sort_unstable();
    if in_syscall.contains(&(pid as i32)) {
        return pid as i32;
    }
    in_syscall.first().copied().unwrap_or(pid as i32)
}

/// The pid tracing `pid`, when one does (`TracerPid` of /proc/PID/status).
pub fn tracer_of(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let t = status
        .lines()
        .find_map(|l| l.strip_prefix("TracerPid:"))?
        .trim()
        .parse::<u32>()
        .ok()?;
    (t != 0).then_some(t)
}
