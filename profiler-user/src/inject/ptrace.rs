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
/// Size of the stub page.
const STUB_LEN: u64 = 4096;
/// The return stub (see the module doc). Encodings from the Intel SDM: `48 89 c7` mov %rax,%rdi;
/// `b8 imm32` mov $imm,%eax; `0f 05` syscall; `0f 0b` ud2 (never reached).
const STUB: [u8; 19] = [
    0x48, 0x89, 0xc7, 0xb8, 39, 0, 0, 0, 0x0f, 0x05, 0xb8, 15, 0, 0, 0, 0x0f, 0x05, 0x0f, 0x0b,
];
/// Offset in the stub of the instruction after its `getpid` (where that syscall's stop reports `rip`).
const STUB_AFTER_GETPID: u64 = 10;
/// Offset of the stub's `rt_sigreturn` part.
const STUB_SIGRETURN: u64 = 10;
/// Offset of the instruction after the stub's `rt_sigreturn`.
const STUB_AFTER_SIGRETURN: u64 = 17;

/// `struct rt_sigframe` (arch/x86/include/asm/sigframe.h) offsets: the return address, then `struct
/// ucontext` (flags, link, `stack_t`, `struct sigcontext`, the signal mask), then `struct siginfo`.
mod frame {
    /// `uc_flags`.
    pub const UC_FLAGS: u64 = 8;
    /// `uc_stack.ss_flags`.
    pub const SS_FLAGS: u64 = 32;
    /// `uc_mcontext` (`struct sigcontext`).
    pub const MCONTEXT: u64 = 48;
    /// `uc_sigmask`.
    pub const SIGMASK: u64 = 304;
    /// The whole frame (with its `siginfo`, unused here).
    pub const LEN: u64 = 440;
    /// `UC_FP_XSTATE | UC_SIGCONTEXT_SS | UC_STRICT_RESTORE_SS` (uapi/asm/ucontext.h).
    pub const FLAGS_XSTATE: u64 = 0x7;
    /// The same without `UC_FP_XSTATE`.
    pub const FLAGS_FX: u64 = 0x6;
    /// An `ss_flags` mode `sigaltstack` refuses, so that `rt_sigreturn` leaves the thread's alternate signal
    /// stack as it is (kernel/signal.c `restore_altstack` ignores every error but EFAULT).
    pub const SS_KEEP: u32 = 0x7;
    /// `FP_XSTATE_MAGIC1`, `FP_XSTATE_MAGIC2` (uapi/asm/sigcontext.h).
    pub const MAGIC1: u32 = 0x4650_5853;
    /// See [`MAGIC1`].
    pub const MAGIC2: u32 = 0x4650_5845;
}

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

/// Mapping and unmapping the stub: a few syscalls.
const STUB_DEADLINE: Duration = Duration::from_secs(5);

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

/// The thread's state, read at the interrupt stop.
struct Saved {
    regs: libc::user_regs_struct,
    fp: libc::user_fpregs_struct,
    xstate: Option<Vec<u8>>,
}

/// Where the frame and the call's data go on the thread's stack.
#[derive(Clone, Copy, Debug)]
struct Layout {
    /// `struct rt_sigframe` (8 mod 16: the called function's `rsp` at entry).
    frame: u64,
    /// Its FPU state (64-byte aligned).
    fpstate: u64,
    /// The call's data.
    data: u64,
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

    fn save(&self) -> Result<Saved, PtraceError> {
        let regs = self.regs()?;
        // SAFETY: an all-zero `user_fpregs_struct` is a valid value of this plain C struct.
        let mut fp: libc::user_fpregs_struct = unsafe { std::mem::zeroed() };
        // GETFPREGS writes one struct into `fp`.
        if self.ptrace(libc::PTRACE_GETFPREGS, 0, &mut fp as *mut _ as usize) != 0 {
            return Err(os("PTRACE_GETFPREGS"));
        }
        let mut xs = vec![0u8; XSTATE_MAX];
        let mut iov = libc::iovec {
            iov_base: xs.as_mut_ptr().cast(),
            iov_len: xs.len(),
        };
        // GETREGSET with an iovec describing `xs` (alive for the call); the kernel shortens iov_len.
        let xstate = (self.ptrace(
            libc::PTRACE_GETREGSET,
            NT_X86_XSTATE as usize,
            &mut iov as *mut _ as usize,
        ) == 0)
            .then(|| {
                xs.truncate(iov.iov_len);
                xs
            });
        Ok(Saved { regs, fp, xstate })
    }

    /// Places the frame, its FPU state and the call's data below the red zone, and checks that the thread's
    /// stack has room for them and for the call.
    fn layout(&self, saved: &Saved) -> Result<Layout, PtraceError> {
        let rsp = saved.regs.rsp;
        let fp_len = saved.xstate.as_ref().map_or(512, Vec::len) as u64 + 4;
        let data = rsp.saturating_sub(RED_ZONE + self.job.data.len() as u64) & !0xf;
        let fpstate = data.saturating_sub(fp_len) & !63;
        let frame = (fpstate.saturating_sub(frame::LEN) & !0xf).saturating_sub(8);
        let needed = frame.saturating_sub(CALL_STACK);
        let maps = std::fs::read_to_string(format!("/proc/{}/maps", self.job.pid))
            .map_err(|_| PtraceError::Exited)?;
        let vma = maps
            .lines()
            .filter_map(crate::sys::maps::MapsLine::parse)
            .find(|m| m.start <= rsp && rsp < m.end);
        match vma {
            // The main thread's stack grows on demand.
            Some(m) if m.path == "[stack]" || needed >= m.start => Ok(Layout { frame, fpstate, data }),
            _ => Err(PtraceError::Unsuitable(format!(
                "thread {} has less than {} KiB of stack left below {rsp:#x}: no room for a call",
                self.tid(),
                (rsp - needed) >> 10
            ))),
        }
    }

    /// The registers the thread must get back: the stopped ones, with an interrupted syscall set to run
    /// again (arch/x86/kernel/signal.c does the same after a signal without a handler; a syscall that would
    /// have continued through `restart_syscall` is run again from the start: `rt_sigreturn` resets the
    /// restart block).
    fn resume_regs(r: &libc::user_regs_struct) -> libc::user_regs_struct {
        let mut out = *r;
        if (r.orig_rax as i64) >= 0 && RESTART_CODES.contains(&(r.rax as i64)) {
            out.rax = r.orig_rax;
            out.rip = r.rip.wrapping_sub(2);
        }
        out.orig_rax = u64::MAX;
        out
    }

    /// Writes the signal frame that puts the thread back into `regs` with `fp`/`xstate` and the mask `mask`;
    /// `ret` is its return address slot (the address the called function returns to).
    fn write_frame(
        &self,
        layout: &Layout,
        regs: &libc::user_regs_struct,
        fp: &libc::user_fpregs_struct,
        xstate: Option<&[u8]>,
        mask: u64,
        ret: u64,
    ) -> Result<(), PtraceError> {
        let mut f = vec![0u8; frame::LEN as usize];
        let put = |f: &mut Vec<u8>, off: u64, v: u64| {
            f[off as usize..off as usize + 8].copy_from_slice(&v.to_le_bytes());
        };
        put(&mut f, 0, ret);
        put(
            &mut f,
            frame::UC_FLAGS,
            if xstate.is_some() {
                frame::FLAGS_XSTATE
            } else {
                frame::FLAGS_FX
            },
        );
        f[frame::SS_FLAGS as usize..frame::SS_FLAGS as usize + 4]
            .copy_from_slice(&frame::SS_KEEP.to_le_bytes());
        let sc = [
            regs.r8,
            regs.r9,
            regs.r10,
            regs.r11,
            regs.r12,
            regs.r13,
            regs.r14,
            regs.r15,
            regs.rdi,
            regs.rsi,
            regs.rbp,
            regs.rbx,
            regs.rdx,
            regs.rax,
            regs.rcx,
            regs.rsp,
            regs.rip,
            regs.eflags,
        ];
        for (i, v) in sc.iter().enumerate() {
            put(&mut f, frame::MCONTEXT + 8 * i as u64, *v);
        }
        // cs, gs, fs, ss (u16 each) after the 18 registers.
        let segs = frame::MCONTEXT as usize + 144;
        f[segs..segs + 2].copy_from_slice(&(regs.cs as u16).to_le_bytes());
        f[segs + 6..segs + 8].copy_from_slice(&(regs.ss as u16).to_le_bytes());
        // fpstate pointer (after err, trapno, oldmask, cr2).
        put(&mut f, frame::MCONTEXT + 184, layout.fpstate);
        put(&mut f, frame::SIGMASK, mask);
        self.write(layout.frame, &f, "write the signal frame")?;
        self.write(layout.fpstate, &fpstate_bytes(fp, xstate), "write the FPU state")
    }

    /// `SigBlk` of the thread (its blocked signals) from `/proc/PID/task/TID/status`.
    fn blocked(&self) -> Result<u64, PtraceError> {
        let status = std::fs::read_to_string(format!("/proc/{}/task/{}/status", self.job.pid, self.tid()))
            .map_err(|_| PtraceError::Exited)?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("SigBlk:"))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .ok_or_else(|| PtraceError::Unsuitable("no SigBlk in the thread's status".into()))
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

    /// Steps 1-2: the frame of the thread's own state, `mmap` of the stub page returning through it, the stub
    /// written. The page's address.
    fn map_stub(&mut self, saved: &Saved, layout: &Layout) -> Result<u64, PtraceError> {
        let resume = Self::resume_regs(&saved.regs);
        let fns = self.job.libc_fns;
        // The mask is read again once the thread left the stop (see below): a syscall like ppoll swaps in a
        // temporary mask that the kernel undoes only then.
        let mask = self.blocked()?;
        self.write_frame(
            layout,
            &resume,
            &saved.fp,
            saved.xstate.as_deref(),
            mask,
            fns.restore_rt,
        )?;
        let prot = (libc::PROT_READ | libc::PROT_EXEC) as u64;
        let flags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64;
        let regs = self.call_regs(
            &saved.regs,
            layout,
            fns.mmap,
            &[0, STUB_LEN, prot, flags, u64::MAX, 0],
        );
        self.set_regs(&regs)?;
        let until = Instant::now() + STUB_DEADLINE;
        let mut mapped: Option<i64> = None;
        let mut waiting_exit = false;
        let mut mask_err = None;
        // Up to mmap's exit: its result.
        while mapped.is_none() {
            let Some(info) = self.next_syscall(until)? else {
                return Err(stub_timeout());
            };
            if info.op == libc::PTRACE_SYSCALL_INFO_ENTRY {
                // SAFETY: `op` says the `entry` member is the one the kernel filled.
                let e = unsafe { info.u.entry };
                waiting_exit = e.nr == SYS_MMAP && e.args[1] == STUB_LEN && e.args[2] == prot;
                if waiting_exit {
                    // The thread has left the stop: its real mask now.
                    match self.blocked() {
                        Ok(m) => self.write(
                            layout.frame + frame::SIGMASK,
                            &m.to_le_bytes(),
                            "write the signal mask",
                        )?,
                        Err(e) => mask_err = Some(e),
                    }
                }
            } else if info.op == libc::PTRACE_SYSCALL_INFO_EXIT && waiting_exit {
                // SAFETY: `op` says the `exit` member is the one the kernel filled.
                mapped = Some(unsafe { info.u.exit.sval });
            }
        }
        // mmap returns through __restore_rt: the thread is back in its own state.
        if !self.until_sigreturn(layout, until)? {
            return Err(stub_timeout());
        }
        if let Some(e) = mask_err {
            return Err(e);
        }
        let page = match mapped {
            Some(a) if a >= 0 => a as u64,
            Some(e) => {
                return Err(PtraceError::Unsuitable(format!(
                    "the target refused to map a page for the return stub: {}",
                    std::io::Error::from_raw_os_error(-e as i32)
                )));
            }
            None => return Err(PtraceError::Exited),
        };
        if let Err(e) = self.write(page, &STUB, "write the return stub") {
            self.unmap_stub(layout, page);
            return Err(e);
        }
        Ok(page)
    }

    /// Step 3: the call, returning through the stub.
    fn call_through_stub(&mut self, layout: &Layout, stub: u64) -> Result<u64, PtraceError> {
        // The thread is at the exit of the stub-mapping rt_sigreturn: its registers are its own again.
        let now = self.regs()?;
        let saved = self.save()?;
        let mask = self.blocked()?;
        let data_addr = layout.data;
        self.write(data_addr, &self.job.data, "write the call's data")?;
        self.write_frame(layout, &now, &saved.fp, saved.xstate.as_deref(), mask, stub)?;
        let args: Vec<u64> = self
            .job
            .args
            .iter()
            .map(|a| match a {
                Arg::Data => data_addr,
                Arg::Val(v) => *v,
            })
            .collect();
        let regs = self.call_regs(&now, layout, self.job.func, &args);
        self.set_regs(&regs)?;
        let until = Instant::now() + self.job.deadlines.call;
        let mut sig = 0;
        let mut result: Option<Result<u64, PtraceError>> = None;
        loop {
            self.resume(libc::PTRACE_SYSCALL, sig)?;
            sig = 0;
            let Some(stop) = self.wait(Some(until))? else {
                // Past the deadline: the call is left to finish on its own; the thread is let go now.
                let timeout = || PtraceError::Timeout {
                    what: "the call did not return",
                    after: self.job.deadlines.call,
                    left: "it was left to finish on its own; the thread goes back to its own code when it \
                           returns (one page of the target stays mapped)",
                };
                let e = timeout();
                self.answer(Err(timeout()));
                self.interrupt_and_detach();
                return Err(e);
            };
            match stop {
                Stop::Event(_) => {}
                Stop::Signal(s) => {
                    let crash = matches!(
                        s,
                        libc::SIGSEGV | libc::SIGBUS | libc::SIGILL | libc::SIGFPE | libc::SIGABRT
                    );
                    if !crash || result.is_some() {
                        sig = s;
                        continue;
                    }
                    // The call crashed: the signal is kept from the process, the thread goes back through
                    // the stub's rt_sigreturn.
                    let mut r = self.regs()?;
                    result = Some(Err(PtraceError::Crashed {
                        signal: s,
                        rip: r.rip,
                    }));
                    r.rip = stub + STUB_SIGRETURN;
                    r.rsp = layout.frame + 8;
                    r.orig_rax = u64::MAX;
                    self.set_regs(&r)?;
                }
                Stop::Syscall => {
                    let info = self.syscall_info()?;
                    if info.op == libc::PTRACE_SYSCALL_INFO_ENTRY {
                        // SAFETY: `op` says the `entry` member is the one the kernel filled.
                        let e = unsafe { info.u.entry };
                        let at_stub = info.stack_pointer == layout.frame + 8;
                        if at_stub
                            && e.nr == SYS_GETPID
                            && info.instruction_pointer == stub + STUB_AFTER_GETPID
                        {
                            result.get_or_insert(Ok(e.args[0]));
                        }
                        if at_stub
                            && e.nr == SYS_RT_SIGRETURN
                            && info.instruction_pointer == stub + STUB_AFTER_SIGRETURN
                        {
                            // Its exit stop is the thread back in its own state.
                            self.resume(libc::PTRACE_SYSCALL, 0)?;
                            match self.wait(Some(until + STUB_DEADLINE))? {
                                Some(Stop::Syscall) => {}
                                Some(Stop::Signal(s)) => {
                                    // The frame was refused (the kernel's SIGSEGV): should not happen.
                                    self.detach(s);
                                    return Err(PtraceError::Unsuitable(
                                        "the kernel refused the return frame".into(),
                                    ));
                                }
                                _ => return Err(PtraceError::Exited),
                            }
                            return result.unwrap_or(Err(PtraceError::Exited));
                        }
                    }
                }
            }
        }
    }

    /// Step 4: `munmap` of the stub page, returning through `__restore_rt` to the thread's own state. A
    /// failure leaves the page mapped (one page), said once.
    fn unmap_stub(&mut self, layout: &Layout, stub: u64) {
        let r = (|| -> Result<bool, PtraceError> {
            let now = self.regs()?;
            let saved = self.save()?;
            let mask = self.blocked()?;
            let fns = self.job.libc_fns;
            self.write_frame(
                layout,
                &Self::resume_regs(&now),
                &saved.fp,
                saved.xstate.as_deref(),
                mask,
                fns.restore_rt,
            )?;
            let regs = self.call_regs(&now, layout, fns.munmap, &[stub, STUB_LEN]);
            self.set_regs(&regs)?;
            self.until_sigreturn(layout, Instant::now() + STUB_DEADLINE)
        })();
        if !matches!(r, Ok(true)) {
            log::warn!(
                "gpu: pid {}: the return stub at {stub:#x} could not be unmapped ({}); one page stays mapped",
                self.job.pid,
                r.err()
                    .map_or_else(|| "it did not finish in time".to_owned(), |e| e.to_string())
            );
        }
    }
}

/// Mapping the stub took longer than [`STUB_DEADLINE`].
fn stub_timeout() -> PtraceError {
    PtraceError::Timeout {
        what: "mapping the return stub did not finish",
        after: STUB_DEADLINE,
        left: "the thread returns to its own code when it does",
    }
}

/// The FPU state as a signal frame carries it: the XSAVE area up to the thread's own size with the
/// `FP_XSTATE_MAGIC` markers (arch/x86/kernel/fpu/signal.c `check_xstate_in_sigframe`), or the FXSAVE area
/// alone when the kernel gave no XSAVE area.
fn fpstate_bytes(fp: &libc::user_fpregs_struct, xstate: Option<&[u8]>) -> Vec<u8> {
    let Some(xs) = xstate.filter(|x| x.len() >= 576) else {
        // SAFETY: `user_fpregs_struct` is the 512-byte FXSAVE layout, plain integers; read as bytes.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                (fp as *const libc::user_fpregs_struct).cast::<u8>(),
                std::mem::size_of::<libc::user_fpregs_struct>(),
            )
        };
        let mut out = bytes.to_vec();
        // No magic: the kernel restores the legacy x87/SSE state only.
        out[464..512].fill(0);
        return out;
    };
    let xstate_bv = u64::from_le_bytes(xs[512..520].try_into().unwrap_or_default());
    let (features, size) = user_xstate(xstate_bv);
    let size = size.min(xs.len());
    let mut out = xs[..size].to_vec();
    out[464..468].copy_from_slice(&frame::MAGIC1.to_le_bytes());
    out[468..472].copy_from_slice(&(size as u32 + 4).to_le_bytes());
    out[472..480].copy_from_slice(&features.to_le_bytes());
    out[480..484].copy_from_slice(&(size as u32).to_le_bytes());
    out[484..512].fill(0);
    out.extend_from_slice(&frame::MAGIC2.to_le_bytes());
    out
}

/// The XSAVE features and size (standard format) of a thread's signal frames: what XCR0 enables, AMX tile
/// data only when the thread uses it (`xstate_bv` bit 18; the kernel sizes a thread's FPU state that way).
fn user_xstate(xstate_bv: u64) -> (u64, usize) {
    const XTILEDATA: u64 = 1 << 18;
    let xcr0 = xgetbv0();
    let features = (xcr0 & !XTILEDATA) | (xstate_bv & XTILEDATA);
    let mut size = 576usize;
    for i in 2..64u32 {
        if features & (1 << i) == 0 {
            continue;
        }
        // Leaf 0xD exists on every CPU with XSAVE, which XCR0 being readable implies.
        let c = std::arch::x86_64::__cpuid_count(0xd, i);
        size = size.max((c.ebx + c.eax) as usize);
    }
    (features, size)
}

/// XCR0 (the XSAVE features the OS enabled).
fn xgetbv0() -> u64 {
    let (lo, hi): (u32, u32);
    // SAFETY: XGETBV with ECX = 0 reads XCR0; it is allowed in user mode when CR4.OSXSAVE is set, which the
    // kernel giving an NT_X86_XSTATE area implies (callers only get here with one).
    unsafe {
        std::arch::asm!("xgetbv", in("ecx") 0u32, out("eax") lo, out("edx") hi, options(nomem, nostack));
    }
    (u64::from(hi) << 32) | u64::from(lo)
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
            frame::MAGIC1
        );
        assert_eq!(
            u32::from_le_bytes(out[size..size + 4].try_into().unwrap()),
            frame::MAGIC2
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
