//! The signal frame every call returns through: the thread's registers, signal mask and FPU/XSAVE state
//! written below its stack's red zone as a `struct rt_sigframe`, so that `rt_sigreturn` puts the thread back
//! exactly as it was (see the module doc of [`super`]).

use super::*;

/// `struct rt_sigframe` (arch/x86/include/asm/sigframe.h) offsets: the return address, then `struct
/// ucontext` (flags, link, `stack_t`, `struct sigcontext`, the signal mask), then `struct siginfo`.
pub(super) mod sigframe {
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

/// The thread's state, read at the interrupt stop.
pub(super) struct Saved {
    pub(super) regs: libc::user_regs_struct,
    pub(super) fp: libc::user_fpregs_struct,
    pub(super) xstate: Option<Vec<u8>>,
}

/// Where the frame and the call's data go on the thread's stack.
#[derive(Clone, Copy, Debug)]
pub(super) struct Layout {
    /// `struct rt_sigframe` (8 mod 16: the called function's `rsp` at entry).
    pub(super) frame: u64,
    /// Its FPU state (64-byte aligned).
    pub(super) fpstate: u64,
    /// The call's data.
    pub(super) data: u64,
}

impl Tracer {
    pub(super) fn save(&self) -> Result<Saved, PtraceError> {
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
    pub(super) fn layout(&self, saved: &Saved) -> Result<Layout, PtraceError> {
        let rsp = saved.regs.rsp;
        let fp_len = saved.xstate.as_ref().map_or(512, Vec::len) as u64 + 4;
        let data = rsp.saturating_sub(RED_ZONE + self.job.data.len() as u64) & !0xf;
        let fpstate = data.saturating_sub(fp_len) & !63;
        let frame = (fpstate.saturating_sub(sigframe::LEN) & !0xf).saturating_sub(8);
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
    pub(super) fn resume_regs(r: &libc::user_regs_struct) -> libc::user_regs_struct {
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
    pub(super) fn write_frame(
        &self,
        layout: &Layout,
        regs: &libc::user_regs_struct,
        fp: &libc::user_fpregs_struct,
        xstate: Option<&[u8]>,
        mask: u64,
        ret: u64,
    ) -> Result<(), PtraceError> {
        let mut f = vec![0u8; sigframe::LEN as usize];
        let put = |f: &mut Vec<u8>, off: u64, v: u64| {
            f[off as usize..off as usize + 8].copy_from_slice(&v.to_le_bytes());
        };
        put(&mut f, 0, ret);
        put(
            &mut f,
            sigframe::UC_FLAGS,
            if xstate.is_some() {
                sigframe::FLAGS_XSTATE
            } else {
                sigframe::FLAGS_FX
            },
        );
        f[sigframe::SS_FLAGS as usize..sigframe::SS_FLAGS as usize + 4]
            .copy_from_slice(&sigframe::SS_KEEP.to_le_bytes());
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
            put(&mut f, sigframe::MCONTEXT + 8 * i as u64, *v);
        }
        // cs, gs, fs, ss (u16 each) after the 18 registers.
        let segs = sigframe::MCONTEXT as usize + 144;
        f[segs..segs + 2].copy_from_slice(&(regs.cs as u16).to_le_bytes());
        f[segs + 6..segs + 8].copy_from_slice(&(regs.ss as u16).to_le_bytes());
        // fpstate pointer (after err, trapno, oldmask, cr2).
        put(&mut f, sigframe::MCONTEXT + 184, layout.fpstate);
        put(&mut f, sigframe::SIGMASK, mask);
        self.write(layout.frame, &f, "write the signal frame")?;
        self.write(layout.fpstate, &fpstate_bytes(fp, xstate), "write the FPU state")
    }

    /// `SigBlk` of the thread (its blocked signals) from `/proc/PID/task/TID/status`.
    pub(super) fn blocked(&self) -> Result<u64, PtraceError> {
        let status = std::fs::read_to_string(format!("/proc/{}/task/{}/status", self.job.pid, self.tid()))
            .map_err(|_| PtraceError::Exited)?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("SigBlk:"))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .ok_or_else(|| PtraceError::Unsuitable("no SigBlk in the thread's status".into()))
    }
}

/// The FPU state as a signal frame carries it: the XSAVE area up to the thread's own size with the
/// `FP_XSTATE_MAGIC` markers (arch/x86/kernel/fpu/signal.c `check_xstate_in_sigframe`), or the FXSAVE area
/// alone when the kernel gave no XSAVE area.
pub(super) fn fpstate_bytes(fp: &libc::user_fpregs_struct, xstate: Option<&[u8]>) -> Vec<u8> {
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
    out[464..468].copy_from_slice(&sigframe::MAGIC1.to_le_bytes());
    out[468..472].copy_from_slice(&(size as u32 + 4).to_le_bytes());
    out[472..480].copy_from_slice(&features.to_le_bytes());
    out[480..484].copy_from_slice(&(size as u32).to_le_bytes());
    out[484..512].fill(0);
    out.extend_from_slice(&sigframe::MAGIC2.to_le_bytes());
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
