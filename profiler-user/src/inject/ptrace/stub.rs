//! The return stub: one read+exec page mapped in the target with its own `mmap`, through which the call
//! returns (its result read at the stub's `getpid`, the thread put back by its `rt_sigreturn`), and unmapped
//! the same way afterwards (see the module doc of [`super`]).

use super::*;

/// Size of the stub page.
pub(super) const STUB_LEN: u64 = 4096;
/// The return stub (see the module doc). Encodings from the Intel SDM: `48 89 c7` mov %rax,%rdi;
/// `b8 imm32` mov $imm,%eax; `0f 05` syscall; `0f 0b` ud2 (never reached).
pub(super) const STUB: [u8; 19] = [
    0x48, 0x89, 0xc7, 0xb8, 39, 0, 0, 0, 0x0f, 0x05, 0xb8, 15, 0, 0, 0, 0x0f, 0x05, 0x0f, 0x0b,
];
/// Offset in the stub of the instruction after its `getpid` (where that syscall's stop reports `rip`).
pub(super) const STUB_AFTER_GETPID: u64 = 10;
/// Offset of the stub's `rt_sigreturn` part.
pub(super) const STUB_SIGRETURN: u64 = 10;
/// Offset of the instruction after the stub's `rt_sigreturn`.
pub(super) const STUB_AFTER_SIGRETURN: u64 = 17;
/// Mapping and unmapping the stub: a few syscalls.
pub(super) const STUB_DEADLINE: Duration = Duration::from_secs(5);

impl Tracer {
    /// Steps 1-2: the frame of the thread's own state, `mmap` of the stub page returning through it, the stub
    /// written. The page's address.
    pub(super) fn map_stub(&mut self, saved: &Saved, layout: &Layout) -> Result<u64, PtraceError> {
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
                            layout.frame + frame::sigframe::SIGMASK,
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
    pub(super) fn call_through_stub(&mut self, layout: &Layout, stub: u64) -> Result<u64, PtraceError> {
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
    pub(super) fn unmap_stub(&mut self, layout: &Layout, stub: u64) {
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
