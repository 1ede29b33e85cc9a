//! Calling a function inside another process: borrow one of its threads with ptrace, run the call there, give
//! the thread back exactly as it was — and never leave it in a state that only llmprof can repair.
//!
//! Owns the ptrace mechanics of [`super::inject`] and nothing else. The design rule: at every instant, if
//! llmprof stopped tracing (it gave up, or was killed: the kernel then detaches its tracees, as llmprof never
//! sets `PTRACE_O_EXITKILL`), the thread would still finish what it runs and return to its own code with its
//! own registers. So nothing is ever restored by llmprof after the fact; every call returns through the
//! kernel's own full restore, `rt_sigreturn`:
//!
//! 1. `PTRACE_SEIZE` + `PTRACE_INTERRUPT` of one thread (the process's other threads keep running). Its
//!    general registers, x87/SSE state and whole XSAVE area (`NT_X86_XSTATE`, read with a buffer larger than
//!    any CPU's: a fixed-size buffer is what makes gdb fail on CPUs with AMX state, see DESIGN.md) are read,
//!    and written below its stack's red zone as a signal frame (`struct rt_sigframe`: the registers, the
//!    signal mask, the FPU state with its `FP_XSTATE_MAGIC` markers). A syscall the stop interrupted is set up
//!    to run again, as the kernel does after a signal without a handler.
//! 2. The return stub: the target's own `mmap` is called to map one read+exec page, its return address is
//!    libc's `__restore_rt` (`mov $15, %rax; syscall`: `rt_sigreturn` of that frame). The page gets the stub
//!    (written through `/proc/PID/task/TID/mem`, as a debugger writes a breakpoint):
//!    `mov %rax, %rdi; mov $39, %eax; syscall` (`getpid`, harmless, with the call's result in `rdi`) then
//!    `mov $15, %eax; syscall` (`rt_sigreturn`).
//! 3. The call: `rip` = the function, arguments in rdi/rsi/rdx/rcx, `rsp` = the frame, whose first word (the
//!    return address) is the stub. llmprof follows it with `PTRACE_SYSCALL` and takes the result at the
//!    stub's `getpid`; the stub's `rt_sigreturn` then puts the thread back. A fault in the called function
//!    (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT) is kept from the process and the thread is sent to the
//!    stub's `rt_sigreturn` instead; any other signal is the program's and is delivered.
//! 4. The stub page is unmapped the same way as it was mapped (`munmap`, returning through `__restore_rt`),
//!    and the thread detached.
//!
//! Deadlines: the ptrace work runs on a thread of its own (ptrace requests must come from the tracing thread).
//! The caller waits for its answer at most its deadline; past it the caller gets [`PtraceError::Timeout`]
//! and the worker lets go of the thread as soon as the kernel lets it — at its next stop, without changing
//! anything: a call still running (a library constructor that takes minutes) finishes on its own and
//! returns through the stub, which then stays mapped (one page). A thread that never stops (uninterruptible
//! sleep) keeps the worker waiting, never the caller.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::mpsc;
use std::time::{Duration, Instant};

mod frame;
mod stub;

use frame::{Layout, Saved};
use stub::STUB_DEADLINE;

/// `NT_X86_XSTATE` (linux/elf.h).
const NT_X86_XSTATE: libc::c_int = 0x202;
/// Larger than the XSAVE area of any x86 CPU (AMX: ~11 KiB); the kernel says the real length.
const XSTATE_MAX: usize = 64 * 1024;
/// The x86-64 System V red zone below rsp that the interrupted code may still use.
const RED_ZONE: u64 = 128;
/// Stack the called function may use below the frame (dlopen and library constructors).
const CALL_STACK: u64 = 128 << 10;
/// Code segment selector of 64-bit user mode (a thread in 32-bit mode is refused).
const USER64_CS: u64 = 0x33;
/// x86-64 syscall numbers (arch/x86/entry/syscalls/syscall_64.tbl).
const SYS_MMAP: u64 = 9;
/// See [`SYS_MMAP`].
const SYS_RT_SIGRETURN: u64 = 15;
/// See [`SYS_MMAP`].
const SYS_GETPID: u64 = 39;
/// `-ERESTARTSYS`, `-ERESTARTNOINTR`, `-ERESTARTNOHAND`, `-ERESTART_RESTARTBLOCK` (include/linux/errno.h).
const RESTART_CODES: [i64; 4] = [-512, -513, -514, -516];
/// `DF` in rflags: clear at every function entry (System V ABI).
const FLAG_DF: u64 = 0x400;
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
    /// The thread did not stop, or the call did not return, in time.
    #[error("{what} within {after:?}; {left}")]
    Timeout {
        /// What did not happen.
        what: &'static str,
        /// The deadline.
        after: Duration,
        /// What was left to the target.
        left: &'static str,
    },
    /// The called function crashed (the signal was kept from the process, the thread put back).
    #[error(
        "the call faulted with signal {signal} at {rip:#x} (the thread was put back; the process did not get the signal)"
    )]
    Crashed {
        /// The signal.
        signal: i32,
        /// Where.
        rip: u64,
    },
    /// The thread cannot take a call safely.
    #[error("{0}")]
    Unsuitable(String),
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

/// An argument of a call.
#[derive(Clone, Copy, Debug)]
pub enum Arg {
    /// The address where the call's data bytes were written.
    Data,
    /// A value.
    Val(u64),
}

/// Addresses in the target's libc that every call needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LibcFns {
    /// `mmap`.
    pub mmap: u64,
    /// `munmap`.
    pub munmap: u64,
    /// `__restore_rt` (`mov $15, %rax; syscall`).
    pub restore_rt: u64,
}

/// How long each part of a call may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadlines {
    /// Stopping the thread.
    pub stop: Duration,
    /// The called function.
    pub call: Duration,
}

/// Calls `func(args…)` in one thread of `pid` (`tid`), with `data` copied to the thread's stack; the
/// function's return value. See the module doc for what happens on every path.
pub fn call(
    pid: u32,
    tid: i32,
    libc_fns: LibcFns,
    func: u64,
    data: &[u8],
    args: &[Arg],
    deadlines: Deadlines,
) -> Result<u64, PtraceError> {
    let (tx, rx) = mpsc::sync_channel(1);
    let job = Job {
        pid,
        tid,
        libc_fns,
        func,
        data: data.to_vec(),
        args: args.to_vec(),
        deadlines,
    };
    std::thread::Builder::new()
        .name(format!("llmprof-ptrace-{tid}"))
        .spawn(move || {
            let mut t = Tracer::new(job, tx);
            let r = t.run();
            t.answer(r);
        })
        .map_err(|source| PtraceError::Os {
            op: "start the ptrace thread",
            source,
        })?;
    // The worker answers by its own deadlines; this one only guards against a worker stuck in the kernel
    // (a write to the target's memory that faults on a hung filesystem).
    let guard = deadlines.stop + deadlines.call + 2 * STUB_DEADLINE + Duration::from_secs(5);
    rx.recv_timeout(guard).unwrap_or(Err(PtraceError::Timeout {
        what: "the ptrace worker did not answer",
        after: guard,
        left: "it lets go of the thread as soon as the kernel lets it",
    }))
}

/// One call to make.
struct Job {
    pid: u32,
    tid: i32,
    libc_fns: LibcFns,
    func: u64,
    data: Vec<u8>,
    args: Vec<Arg>,
    deadlines: Deadlines,
}

/// A stop of the traced thread, decoded from `waitpid`'s status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    /// A syscall entry or exit (`PTRACE_SYSCALL` with `PTRACE_O_TRACESYSGOOD`).
    Syscall,
    /// `PTRACE_EVENT_STOP`: the interrupt (SIGTRAP) or a group stop (the stop signal).
    Event(i32),
    /// A signal about to be delivered.
    Signal(i32),
}

/// The worker: owns the tracing of one thread for one call.
struct Tracer {
    job: Job,
    tx: Option<mpsc::SyncSender<Result<u64, PtraceError>>>,
    /// When the caller stops waiting for the thread to stop / for the call.
    stop_deadline: Instant,
    mem: Option<File>,
    /// Seized (and not detached yet).
    seized: bool,
    /// The stop the thread is in, when it is in one (a signal of a signal-delivery stop is delivered at
    /// detach).
    at: std::cell::Cell<Option<Stop>>,
}

impl Tracer {
    fn new(job: Job, tx: mpsc::SyncSender<Result<u64, PtraceError>>) -> Self {
        let stop_deadline = Instant::now() + job.deadlines.stop;
        Tracer {
            job,
            tx: Some(tx),
            stop_deadline,
            mem: None,
            seized: false,
            at: std::cell::Cell::new(None),
        }
    }

    /// Sends the caller its answer (once; later answers are dropped).
    fn answer(&mut self, r: Result<u64, PtraceError>) {
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(r);
        }
    }

    fn tid(&self) -> i32 {
        self.job.tid
    }

    fn ptrace(&self, req: libc::c_uint, addr: usize, data: usize) -> libc::c_long {
        // SAFETY: every caller passes a request whose `addr`/`data` are integers or pointers to memory valid
        // for the request (documented at each call site).
        unsafe { libc::ptrace(req, self.tid(), addr, data) }
    }

    /// `waitpid` for the thread: blocking when `until` is None, else polling until then (None on timeout).
    fn wait(&self, until: Option<Instant>) -> Result<Option<Stop>, PtraceError> {
        let mut polls: u64 = 0;
        loop {
            let mut status = 0;
            let flags = libc::__WALL | if until.is_some() { libc::WNOHANG } else { 0 };
            // SAFETY: waitpid writes one int into `status`.
            let r = unsafe { libc::waitpid(self.tid(), &mut status, flags) };
            if r == self.tid() {
                if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
                    return Err(PtraceError::Exited);
                }
                let sig = libc::WSTOPSIG(status);
                let stop = if sig == libc::SIGTRAP | 0x80 {
                    Stop::Syscall
                } else if status >> 16 == libc::PTRACE_EVENT_STOP {
                    Stop::Event(sig)
                } else {
                    Stop::Signal(sig)
                };
                self.at.set(Some(stop));
                return Ok(Some(stop));
            }
            if r < 0 {
                if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                return Err(PtraceError::Exited);
            }
            if until.is_some_and(|u| Instant::now() >= u) {
                return Ok(None);
            }
            // Most stops come within microseconds of a resume (a syscall of the call): poll fast at first.
            polls += 1;
            if polls < 64 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros((polls - 63).min(20) * 50));
            }
        }
    }

    fn resume(&self, req: libc::c_uint, sig: i32) -> Result<(), PtraceError> {
        // Continuing a stopped tracee; `sig` is a signal number or 0.
        if self.ptrace(req, 0, sig as usize) != 0 {
            return Err(os("PTRACE_CONT/SYSCALL"));
        }
        self.at.set(None);
        Ok(())
    }

    /// Lets the thread go as it is now (delivering `sig`, the signal of a signal-delivery stop, or 0).
    fn detach(&mut self, sig: i32) {
        if self.seized {
            self.seized = false;
            self.at.set(None);
            // Detaching our own stopped tracee.
            self.ptrace(libc::PTRACE_DETACH, 0, sig as usize);
        }
    }

    /// Lets the thread go as it is, changing nothing: at once when it is in a stop, else at its next stop.
    fn interrupt_and_detach(&mut self) {
        if !self.seized {
            return;
        }
        match self.at.get() {
            Some(Stop::Signal(sig)) => return self.detach(sig),
            Some(_) => return self.detach(0),
            None => {}
        }
        self.ptrace(libc::PTRACE_INTERRUPT, 0, 0);
        loop {
            match self.wait(None) {
                Ok(Some(Stop::Signal(sig))) => return self.detach(sig),
                Ok(Some(_)) => return self.detach(0),
                Ok(None) => {}
                Err(_) => {
                    self.seized = false;
                    return;
                }
            }
        }
    }

    fn regs(&self) -> Result<libc::user_regs_struct, PtraceError> {
        // SAFETY: an all-zero `user_regs_struct` is a valid value of this plain C struct.
        let mut r: libc::user_regs_struct = unsafe { std::mem::zeroed() };
        // GETREGS writes one struct into `r`.
        if self.ptrace(libc::PTRACE_GETREGS, 0, &mut r as *mut _ as usize) != 0 {
            return Err(os("PTRACE_GETREGS"));
        }
        Ok(r)
    }

    fn set_regs(&self, r: &libc::user_regs_struct) -> Result<(), PtraceError> {
        // SETREGS reads one struct from valid memory.
        if self.ptrace(libc::PTRACE_SETREGS, 0, r as *const _ as usize) != 0 {
            return Err(os("PTRACE_SETREGS"));
        }
        Ok(())
    }

    fn syscall_info(&self) -> Result<libc::ptrace_syscall_info, PtraceError> {
        // SAFETY: an all-zero `ptrace_syscall_info` is a valid value of this plain C struct.
        let mut info: libc::ptrace_syscall_info = unsafe { std::mem::zeroed() };
        // GET_SYSCALL_INFO writes at most `addr` bytes into `data`.
        let n = self.ptrace(
            libc::PTRACE_GET_SYSCALL_INFO,
            std::mem::size_of::<libc::ptrace_syscall_info>(),
            &mut info as *mut _ as usize,
        );
        if n <= 0 {
            return Err(os("PTRACE_GET_SYSCALL_INFO"));
        }
        Ok(info)
    }

    fn write(&self, addr: u64, bytes: &[u8], what: &'static str) -> Result<(), PtraceError> {
        let mem = self.mem.as_ref().ok_or(PtraceError::Exited)?;
        mem.write_all_at(bytes, addr)
            .map_err(|source| PtraceError::Os { op: what, source })
    }

    /// The whole call; the thread is let go on every path before this returns (or left to the kernel when
    /// it exited).
    fn run(&mut self) -> Result<u64, PtraceError> {
        let r = self.run_seized();
        if self.seized {
            self.interrupt_and_detach();
        }
        r
    }

    fn run_seized(&mut self) -> Result<u64, PtraceError> {
        let (pid, tid) = (self.job.pid, self.tid());
        self.mem = Some(
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(format!("/proc/{pid}/task/{tid}/mem"))
                .map_err(|source| match source.kind() {
                    std::io::ErrorKind::NotFound => PtraceError::Exited,
                    _ => PtraceError::Os {
                        op: "open /proc/PID/task/TID/mem",
                        source,
                    },
                })?,
        );
        // No PTRACE_O_EXITKILL: should llmprof die, the kernel lets the thread go and it finishes on its own.
        if self.ptrace(libc::PTRACE_SEIZE, 0, libc::PTRACE_O_TRACESYSGOOD as usize) != 0 {
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
        self.seized = true;
        if self.ptrace(libc::PTRACE_INTERRUPT, 0, 0) != 0 {
            return Err(os("PTRACE_INTERRUPT"));
        }
        self.wait_for_interrupt()?;
        let saved = self.save()?;
        if saved.regs.cs != USER64_CS {
            return Err(PtraceError::Unsuitable(format!(
                "thread {tid} runs 32-bit code (cs {:#x}): llmprof calls into 64-bit code only",
                saved.regs.cs
            )));
        }
        let layout = self.layout(&saved)?;
        // 1-2: the stub page.
        let stub = self.map_stub(&saved, &layout)?;
        // 3: the call; 4: the stub unmapped (also after a crash).
        let r = self.call_through_stub(&layout, stub);
        if matches!(r, Err(PtraceError::Timeout { .. }) | Err(PtraceError::Exited)) {
            return r;
        }
        self.unmap_stub(&layout, stub);
        r
    }

    /// Waits (up to the stop deadline, then in the background) for the interrupt's stop; signals that come
    /// first are delivered.
    fn wait_for_interrupt(&mut self) -> Result<(), PtraceError> {
        let mut answered = false;
        loop {
            let until = (!answered).then_some(self.stop_deadline);
            let stop = match self.wait(until)? {
                Some(s) => s,
                None => {
                    // Past the caller's deadline: answer now, keep waiting to let the thread go untouched.
                    self.answer(Err(PtraceError::Timeout {
                        what: "the thread did not stop",
                        after: self.job.deadlines.stop,
                        left: "it is let go, untouched, as soon as it stops",
                    }));
                    answered = true;
                    continue;
                }
            };
            match stop {
                Stop::Event(libc::SIGTRAP) if !answered => return Ok(()),
                Stop::Event(libc::SIGTRAP) => {
                    self.detach(0);
                    return Err(PtraceError::Exited);
                }
                Stop::Event(sig) => {
                    // A group stop: the process is stopped by job control; leave it so.
                    self.detach(0);
                    return Err(PtraceError::Unsuitable(format!(
                        "the process is stopped (signal {sig}): resume it first"
                    )));
                }
                // A signal that came before the interrupt: delivered now, as without llmprof.
                Stop::Signal(sig) => self.resume(libc::PTRACE_CONT, sig)?,
                Stop::Syscall => self.resume(libc::PTRACE_CONT, 0)?,
            }
        }
    }

    /// Registers for calling `func(args)` with `rsp` = the frame.
    fn call_regs(
        &self,
        base: &libc::user_regs_struct,
        layout: &Layout,
        func: u64,
        args: &[u64],
    ) -> libc::user_regs_struct {
        let mut r = *base;
        let get = |i: usize| args.get(i).copied().unwrap_or(0);
        r.rdi = get(0);
        r.rsi = get(1);
        r.rdx = get(2);
        r.rcx = get(3);
        r.r8 = get(4);
        r.r9 = get(5);
        r.rax = 0;
        r.rip = func;
        r.rsp = layout.frame;
        r.orig_rax = u64::MAX;
        r.eflags &= !FLAG_DF;
        r
    }

    /// Resumes the thread with `PTRACE_SYSCALL` until its next syscall stop, delivering the program's signals on
    /// the way; that stop's information. None when `until` passed first.
    fn next_syscall(&self, until: Instant) -> Result<Option<libc::ptrace_syscall_info>, PtraceError> {
        let mut sig = 0;
        loop {
            self.resume(libc::PTRACE_SYSCALL, sig)?;
            sig = 0;
            let Some(stop) = self.wait(Some(until))? else {
                return Ok(None);
            };
            match stop {
                Stop::Signal(s) => sig = s,
                Stop::Event(_) => {}
                Stop::Syscall => return self.syscall_info().map(Some),
            }
        }
    }

    /// Runs the thread until the `rt_sigreturn` of the frame at `layout` has put it back (its exit stop). False
    /// when `until` passed first.
    fn until_sigreturn(&self, layout: &Layout, until: Instant) -> Result<bool, PtraceError> {
        let mut ours = false;
        while let Some(info) = self.next_syscall(until)? {
            if info.op == libc::PTRACE_SYSCALL_INFO_ENTRY {
                // SAFETY: `op` says the `entry` member is the one the kernel filled.
                let nr = unsafe { info.u.entry.nr };
                ours = nr == SYS_RT_SIGRETURN && info.stack_pointer == layout.frame + 8;
            } else if info.op == libc::PTRACE_SYSCALL_INFO_EXIT && ours {
                return Ok(true);
            }
        }
        Ok(false)
    }
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

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests {
    use super::frame::{fpstate_bytes, sigframe};
    use super::stub::{STUB, STUB_AFTER_GETPID, STUB_AFTER_SIGRETURN, STUB_SIGRETURN};
    use super::*;

    #[test]
    fn the_stub_is_what_its_comment_says() {
        assert_eq!(
            STUB,
            [
                0x48, 0x89, 0xc7, // mov %rax,%rdi
                0xb8, 39, 0, 0, 0, // mov $39,%eax
                0x0f, 0x05, // syscall
                0xb8, 15, 0, 0, 0, // mov $15,%eax
                0x0f, 0x05, // syscall
                0x0f, 0x0b, // ud2
            ]
        );
        assert_eq!(STUB[STUB_SIGRETURN as usize], 0xb8);
        assert_eq!(
            &STUB[STUB_AFTER_GETPID as usize - 2..STUB_AFTER_GETPID as usize],
            &[0x0f, 0x05]
        );
        assert_eq!(
            &STUB[STUB_AFTER_SIGRETURN as usize - 2..STUB_AFTER_SIGRETURN as usize],
            &[0x0f, 0x05]
        );
    }

    #[test]
    fn an_interrupted_syscall_is_set_to_run_again_and_a_finished_one_is_not() {
        // SAFETY: plain-integer C struct.
        let mut r: libc::user_regs_struct = unsafe { std::mem::zeroed() };
        r.orig_rax = 7; // poll
        r.rax = (-514i64) as u64; // -ERESTARTNOHAND
        r.rip = 0x1002;
        let back = Tracer::resume_regs(&r);
        assert_eq!((back.rax, back.rip, back.orig_rax), (7, 0x1000, u64::MAX));
        r.rax = 3; // it returned 3
        let back = Tracer::resume_regs(&r);
        assert_eq!((back.rax, back.rip), (3, 0x1002));
        r.orig_rax = u64::MAX; // not in a syscall
        r.rax = (-512i64) as u64;
        assert_eq!(Tracer::resume_regs(&r).rip, 0x1002);
    }

    #[test]
    fn the_fpu_state_carries_the_kernels_markers_and_the_threads_size() {
        // SAFETY: plain-integer C struct.
        let fp: libc::user_fpregs_struct = unsafe { std::mem::zeroed() };
        let fx = fpstate_bytes(&fp, None);
        assert_eq!(fx.len(), 512);
        assert!(fx[464..512].iter().all(|b| *b == 0));
        // An XSAVE area as the kernel gives it: legacy + header (XSTATE_BV = x87|SSE) + components.
        let mut xs = vec![0u8; 4096];
        xs[512] = 0x3;
        let out = fpstate_bytes(&fp, Some(&xs));
        let size = u32::from_le_bytes(out[480..484].try_into().unwrap()) as usize;
        assert_eq!(out.len(), size + 4);
        assert_eq!(
            u32::from_le_bytes(out[464..468].try_into().unwrap()),
            sigframe::MAGIC1
        );
        assert_eq!(
            u32::from_le_bytes(out[size..size + 4].try_into().unwrap()),
            sigframe::MAGIC2
        );
        let features = u64::from_le_bytes(out[472..480].try_into().unwrap());
        assert_eq!(features & 0x3, 0x3, "x87 and SSE are always there");
        assert_eq!(
            features & (1 << 18),
            0,
            "no AMX tile data when the thread does not use it"
        );
    }
}
