//! The engine's side of the llmprof probe ABI (see `llmprof_abi` and docs/probe-abi.md).
//!
//! Owns the exported probe functions and nothing else. Each is a naked function whose first instruction is
//! the 5-byte NOP [`llmprof_abi::PROBE_NOP5`] followed by `ret`: detached it costs a call (~2 ns); attached,
//! llmprof's uprobe sits on the NOP (the optimized uprobe path on kernels that have it) and copies the
//! record the first argument points to. These functions must never do work, allocate or block.
//!
//! A binary using them must keep the symbols in its dynamic symbol table so `strip` does not remove them:
//! add to its build script
//! `println!("cargo:rustc-link-arg-bins=-Wl,--export-dynamic-symbol=llmprof_*");`
//! and reference [`keep`] once from `main` so the linker keeps the object.

use llmprof_abi::{ContentRecord, RangeRecord, RequestRecord, StepRecord};

/// The engine's probe ABI version, read by llmprof from the binary before attaching.
#[unsafe(no_mangle)]
#[used]
pub static llmprof_abi_version: u32 = llmprof_abi::ABI_VERSION;

/// Probe: one engine step. `rec` must point to a valid [`StepRecord`] for the duration of the call.
#[unsafe(no_mangle)]
#[unsafe(naked)]
pub extern "C" fn llmprof_probe_step(rec: *const StepRecord) {
    core::arch::naked_asm!(".byte 0x0f, 0x1f, 0x44, 0x00, 0x00", "ret")
}

/// Probe: one request lifecycle event. `rec` must point to a valid [`RequestRecord`].
#[unsafe(no_mangle)]
#[unsafe(naked)]
pub extern "C" fn llmprof_probe_request(rec: *const RequestRecord) {
    core::arch::naked_asm!(".byte 0x0f, 0x1f, 0x44, 0x00, 0x00", "ret")
}

/// Probe: an NVTX-style push/pop/mark. `rec` must point to a valid [`RangeRecord`].
#[unsafe(no_mangle)]
#[unsafe(naked)]
pub extern "C" fn llmprof_probe_range(rec: *const RangeRecord) {
    core::arch::naked_asm!(".byte 0x0f, 0x1f, 0x44, 0x00, 0x00", "ret")
}

/// The engine's text of a request; attached only by `llmprof attach --capture-content`.
#[unsafe(no_mangle)]
#[unsafe(naked)]
pub extern "C" fn llmprof_probe_content(rec: *const ContentRecord) {
    core::arch::naked_asm!(".byte 0x0f, 0x1f, 0x44, 0x00, 0x00", "ret")
}

/// True while a uprobe sits on [`llmprof_probe_content`]: its first byte is then no longer the NOP's `0x0f`
/// (the kernel patched this process's copy of the page to an int3 or a call). Lets the engine render text
/// only while someone asked for it.
#[inline]
pub fn content_attached() -> bool {
    // SAFETY: the function's code is mapped readable (r-x) for the life of the process; a volatile one-byte
    // read of its first instruction has no side effect.
    unsafe { core::ptr::read_volatile(llmprof_probe_content as *const u8) != llmprof_abi::PROBE_NOP5[0] }
}

/// Emits a content record (call only when [`content_attached`]; `rec` points into a live string).
#[inline]
pub fn content(rec: &ContentRecord) {
    llmprof_probe_content(rec);
}

/// Emits a step record.
#[inline]
pub fn step(rec: &StepRecord) {
    llmprof_probe_step(rec);
}

/// Emits a request lifecycle record.
#[inline]
pub fn request(rec: &RequestRecord) {
    llmprof_probe_request(rec);
}

/// Emits a range record.
#[inline]
pub fn range(rec: &RangeRecord) {
    llmprof_probe_range(rec);
}

/// Keeps the probe symbols (and the ABI version static) alive in the final binary. Call once from `main`.
#[inline(never)]
pub fn keep() -> u32 {
    // SAFETY: reading a plain immutable static through a volatile read only defeats constant folding,
    // so the linker and optimizer keep the symbol.
    let v = unsafe { core::ptr::read_volatile(&raw const llmprof_abi_version) };
    core::hint::black_box(llmprof_probe_step as *const ());
    core::hint::black_box(llmprof_probe_request as *const ());
    core::hint::black_box(llmprof_probe_range as *const ());
    core::hint::black_box(llmprof_probe_content as *const ());
    v
}

/// Current CLOCK_BOOTTIME in nanoseconds (the clock of every record).
pub fn boottime_ns() -> u64 {
    let mut ts = libc_timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes a timespec into the valid, properly aligned `ts`.
    let rc = unsafe { clock_gettime(CLOCK_BOOTTIME, &mut ts) };
    if rc != 0 {
        return 0;
    }
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

const CLOCK_BOOTTIME: i32 = 7;

#[repr(C)]
struct libc_timespec {
    tv_sec: i64,
    tv_nsec: i64,
}

unsafe extern "C" {
    fn clock_gettime(clk: i32, ts: *mut libc_timespec) -> i32;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_begin_with_nop5_and_return() {
        for f in [
            llmprof_probe_step as *const u8,
            llmprof_probe_request as *const u8,
            llmprof_probe_range as *const u8,
        ] {
            // SAFETY: the functions are at least 6 bytes of readable code (NOP5 + ret).
            let bytes = unsafe { core::slice::from_raw_parts(f, 6) };
            assert_eq!(&bytes[..5], &llmprof_abi::PROBE_NOP5);
            assert_eq!(bytes[5], 0xc3, "ret after the NOP");
        }
    }

    #[test]
    fn boottime_advances() {
        let a = boottime_ns();
        let b = boottime_ns();
        assert!(a > 0 && b >= a);
        assert_eq!(keep(), llmprof_abi::ABI_VERSION);
    }
}
