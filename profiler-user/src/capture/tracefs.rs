//! Where tracefs is and how a tracepoint is found in it.
//!
//! Owns the tracefs path and mounting it when it is missing. Never attaches anything: the family parts do.

use std::path::{Path, PathBuf};

/// Where tracefs lives on current kernels; mounted by [`mount_if_missing`] when missing.
pub const TRACEFS: &str = "/sys/kernel/tracing";

/// The tracefs directory of tracepoint `category:name` (it exists when the kernel has the tracepoint).
pub fn tracepoint_dir(category: &str, name: &str) -> PathBuf {
    Path::new(TRACEFS).join("events").join(category).join(name)
}

/// Mounts tracefs at [`TRACEFS`] unless its `events` directory is already there (needs root).
pub(super) fn mount_if_missing() -> std::io::Result<()> {
    let events = Path::new(TRACEFS).join("events");
    if events.is_dir() {
        return Ok(());
    }
    let c = |s: &str| std::ffi::CString::new(s).map_err(std::io::Error::from);
    let (src, target, fstype) = (c("nodev")?, c(TRACEFS)?, c("tracefs")?);
    // SAFETY: all pointers are valid NUL-terminated strings for the duration of the call; data is null.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
