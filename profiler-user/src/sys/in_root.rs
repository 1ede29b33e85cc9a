//! Opening, creating and removing files inside another process's root directory (a container's filesystem),
//! with every path component resolved as that process would resolve it.
//!
//! A plain `open("/proc/PID/root/tmp/x")` enters the target's root at `/proc/PID/root` but then follows an
//! absolute symlink (`tmp -> /etc`) against llmprof's own root: a user who owns a directory in a chroot or a
//! container could steer root's writes into the host. Here every lookup is `openat2(2)` relative to an
//! `O_PATH` descriptor of `/proc/PID/root` with `RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS`: `..` and absolute
//! symlinks stop at the target's root and `/proc/.../fd` style magic links are refused. A kernel without
//! `openat2` (before Linux 5.6) gets a refusal, never a fallback to the unsafe open.
//!
//! Owns nothing but these lookups; what is read or written, and its limits, is the caller's
//! ([`super::target_file`] for reads, [`crate::inject`] for a library's copy).

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// How lookups below a root are resolved: inside it, no magic links.
const RESOLVE: u64 = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS;

/// An `O_PATH` descriptor of `pid`'s root directory (`/proc/PID/root`), the base of every lookup here.
pub fn open_root(pid: u32) -> io::Result<OwnedFd> {
    let path = CString::new(format!("/proc/{pid}/root"))
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: a valid NUL-terminated path; the flags take no mode.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by open and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `openat2(dir, path, flags, mode)` resolved inside the root `dir` stands for (or below `dir` for a relative
/// path: `RESOLVE_IN_ROOT` treats `dir` as `/` either way). `O_CLOEXEC` is always added.
pub fn openat(dir: BorrowedFd<'_>, path: &str, flags: libc::c_int, mode: u32) -> io::Result<OwnedFd> {
    let c = CString::new(path).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: an all-zero `open_how` is a valid value of this plain C struct (and what the kernel wants in
    // any field not set).
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC) as u64;
    if flags & (libc::O_CREAT | libc::O_TMPFILE) != 0 {
        how.mode = u64::from(mode);
    }
    how.resolve = RESOLVE;
    // SAFETY: openat2 reads `how` (its size passed) and the NUL-terminated path, both valid for the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            c.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENOSYS) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "this kernel has no openat2 (Linux 5.6+): llmprof does not open files inside another \
                 process's root without it",
            ));
        }
        return Err(e);
    }
    // SAFETY: `fd` was just returned by openat2 and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// The directory holding `path` (resolved inside `root`) as an `O_PATH` descriptor, and `path`'s last
/// component (never empty, `.` or `..`).
pub fn parent_of<'p>(root: BorrowedFd<'_>, path: &'p str) -> io::Result<(OwnedFd, &'p str)> {
    let trimmed = path.trim_end_matches('/');
    let (dir, name) = trimmed.rsplit_once('/').unwrap_or(("", trimmed));
    if name.is_empty() || name == "." || name == ".." {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    let dir = if dir.is_empty() { "/" } else { dir };
    let fd = openat(root, dir, libc::O_PATH | libc::O_DIRECTORY, 0)?;
    Ok((fd, name))
}

/// `mkdirat(dir, name, mode)`: a new directory; never follows a symlink at `name` (one there is `EEXIST`).
pub fn mkdirat(dir: BorrowedFd<'_>, name: &str, mode: u32) -> io::Result<()> {
    let c = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: a valid directory descriptor and NUL-terminated name.
    if unsafe { libc::mkdirat(dir.as_raw_fd(), c.as_ptr(), mode as libc::mode_t) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `unlinkat(dir, name, flags)` (`libc::AT_REMOVEDIR` for a directory): removes the entry itself, never what
/// a symlink there points to.
pub fn unlinkat(dir: BorrowedFd<'_>, name: &str, flags: libc::c_int) -> io::Result<()> {
    let c = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: a valid directory descriptor and NUL-terminated name.
    if unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), flags) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `fstat` of a descriptor.
pub fn fstat(fd: BorrowedFd<'_>) -> io::Result<libc::stat> {
    // SAFETY: an all-zero `stat` is a valid value of this plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes one `stat` into valid memory.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn tmp(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("llmprof-in-root-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn absolute_symlinks_and_dotdot_stay_inside_the_root() {
        // A fake "root" with `tmp -> /` and `up -> ../../..`: resolved inside it, both land on the root itself.
        let d = tmp("escape");
        std::fs::create_dir_all(d.join("real")).unwrap();
        std::fs::write(d.join("real/file"), "inside").unwrap();
        std::os::unix::fs::symlink("/", d.join("tmp")).unwrap();
        std::os::unix::fs::symlink("../../..", d.join("up")).unwrap();
        let root = std::fs::File::open(&d).unwrap();
        let root = root.as_fd();
        for p in ["/tmp/real/file", "up/real/file", "/../../real/file"] {
            let fd = openat(root, p, libc::O_RDONLY, 0).unwrap_or_else(|e| panic!("{p}: {e}"));
            let text = std::fs::read_to_string(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap();
            assert_eq!(text, "inside", "{p}");
        }
        // The host's /etc/hostname is not reachable through `tmp -> /`.
        assert!(openat(root, "/tmp/etc/hostname", libc::O_RDONLY, 0).is_err());
        // A magic link is refused.
        std::os::unix::fs::symlink("/proc/self/root", d.join("magic")).unwrap();
        assert!(openat(root, "/magic/etc/hostname", libc::O_RDONLY, 0).is_err());
        // Creating goes inside too, and never through a symlink at the last component.
        let (dir, name) = parent_of(root, "/tmp/new-dir").unwrap();
        mkdirat(dir.as_fd(), name, 0o700).unwrap();
        assert!(d.join("new-dir").is_dir());
        std::os::unix::fs::symlink(d.join("real/file"), d.join("link")).unwrap();
        let (dir, name) = parent_of(root, "/link").unwrap();
        assert!(mkdirat(dir.as_fd(), name, 0o700).is_err());
        unlinkat(dir.as_fd(), name, 0).unwrap();
        assert_eq!(std::fs::read_to_string(d.join("real/file")).unwrap(), "inside");
        assert!(parent_of(root, "/..").is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
