//! Copies of a library in a target's own root, for a target in another mount namespace (a container): the
//! path llmprof loads from does not exist there.
//!
//! Owns creating the copy (a new root-owned directory and file in the target's `/tmp` or `/dev/shm`, made
//! through [`crate::sys::in_root`] so that no symlink of the target's tree leads the write out of its root,
//! never with more permissions than the source) and removing it, as well as the copies an earlier, killed
//! llmprof left. Never writes outside the target's root, never through a link.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;

use super::InjectError;
use crate::sys::{in_root, ns};

/// One line on stderr, ignoring a closed stderr.
fn say(msg: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "llmprof: inject: {msg}");
}

/// A copy of a library in a target's own root, removed once loaded.
#[derive(Debug)]
pub(super) struct Copy {
    pid: u32,
    /// The library's file name.
    name: String,
    /// `/tmp` or `/dev/shm`, in the target's root.
    parent: &'static str,
    /// The directory made there.
    dir: String,
}

impl Copy {
    /// The copy's path as the target sees it.
    pub(super) fn target_path(&self) -> String {
        format!("{}/{}/{}", self.parent, self.dir, self.name)
    }

    /// Removes the file and its directory (resolved inside the target's root; never through a link).
    pub(super) fn remove(&self) {
        if let Err(e) = remove_copy(self.pid, self.parent, &self.dir, &self.name) {
            say(&format!(
                "could not remove the copy {} in pid {}'s root: {e}",
                self.target_path(),
                self.pid
            ));
        }
    }
}

fn remove_copy(pid: u32, parent: &str, dir: &str, name: &str) -> std::io::Result<()> {
    let root = in_root::open_root(pid)?;
    let parent_fd = in_root::openat(root.as_fd(), parent, libc::O_PATH | libc::O_DIRECTORY, 0)?;
    let dir_fd = in_root::openat(
        parent_fd.as_fd(),
        dir,
        libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        0,
    )?;
    match in_root::unlinkat(dir_fd.as_fd(), name, 0) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    in_root::unlinkat(parent_fd.as_fd(), dir, libc::AT_REMOVEDIR)
}

/// Removes the copies of library `name` left in `parent` (`/tmp`, `/dev/shm` of the target's root) by an
/// llmprof that is gone (killed before it could remove them) or by this one: only root's directories named
/// `PREFIXPID-…`, whose PID is not another running llmprof. A target that still maps such a copy keeps it
/// mapped.
fn remove_stale_copies(pid: u32, root: &OwnedFd, parent: &'static str, prefix: &str, name: &str) {
    let Ok(dir) = in_root::openat(root.as_fd(), parent, libc::O_RDONLY | libc::O_DIRECTORY, 0) else {
        return;
    };
    let Ok(entries) = std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd())) else {
        return;
    };
    let me = std::process::id();
    for e in entries.flatten().take(10_000) {
        let e_name = e.file_name().to_string_lossy().into_owned();
        let Some(owner) = e_name
            .strip_prefix(prefix)
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let alive_llmprof = owner != me
            && std::fs::read_to_string(format!("/proc/{owner}/comm")).is_ok_and(|c| c.trim() == "llmprof");
        if alive_llmprof {
            continue;
        }
        let Ok(d) = in_root::openat(
            dir.as_fd(),
            &e_name,
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW,
            0,
        ) else {
            continue;
        };
        if in_root::fstat(d.as_fd()).is_ok_and(|st| st.st_uid == 0)
            && remove_copy(pid, parent, &e_name, name).is_ok()
        {
            say(&format!(
                "removed {parent}/{e_name} in pid {pid}'s root, a copy an earlier llmprof left"
            ));
        }
    }
}

/// The path the target can open: the library itself when the target shares llmprof's mount namespace, else a
/// copy in the target's own /tmp (or /dev/shm), in a directory named `prefix` + llmprof's pid + a time: a new
/// root-owned directory and file, created inside the target's root ([`in_root`]), with the source's
/// permissions at most (and never more than 0755).
pub(super) fn reachable_path(
    pid: u32,
    lib: &Path,
    prefix: &'static str,
) -> Result<Option<Copy>, InjectError> {
    use std::io::Write as _;
    use std::os::unix::fs::PermissionsExt;
    if ns::same_as_own(pid, ns::Kind::Mount) {
        return Ok(None);
    }
    let name = lib
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let file_err = |what: &'static str, path: String, e: &dyn std::fmt::Display| InjectError::File {
        what,
        path,
        detail: e.to_string(),
    };
    let bytes = std::fs::read(lib).map_err(|e| file_err("cannot read", lib.display().to_string(), &e))?;
    let mode = std::fs::metadata(lib)
        .map(|m| m.permissions().mode() & 0o755)
        .map_err(|e| file_err("cannot read", lib.display().to_string(), &e))?;
    let root =
        in_root::open_root(pid).map_err(|e| file_err("cannot open the root of", format!("pid {pid}"), &e))?;
    let dir = format!(
        "{prefix}{}-{}",
        std::process::id(),
        llmprof_trace::clock::boottime_ns()
    );
    let mut last = String::new();
    for parent in ["/tmp", "/dev/shm"] {
        remove_stale_copies(pid, &root, parent, prefix, &name);
        let made = (|| -> std::io::Result<()> {
            let parent_fd = in_root::openat(root.as_fd(), parent, libc::O_PATH | libc::O_DIRECTORY, 0)?;
            in_root::mkdirat(parent_fd.as_fd(), &dir, mode | 0o700)?;
            let dir_fd = in_root::openat(
                parent_fd.as_fd(),
                &dir,
                libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW,
                0,
            )?;
            let fd = in_root::openat(
                dir_fd.as_fd(),
                &name,
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
                mode,
            )?;
            let mut f = std::fs::File::from(fd);
            f.write_all(&bytes)?;
            // The umask may have removed bits; the target's user must still read (and map) it.
            f.set_permissions(std::fs::Permissions::from_mode(mode))
        })();
        match made {
            Ok(()) => {
                return Ok(Some(Copy {
                    pid,
                    name,
                    parent,
                    dir: dir.clone(),
                }));
            }
            Err(e) => {
                let _ = remove_copy(pid, parent, &dir, &name);
                last = format!("{parent}: {e}");
            }
        }
    }
    Err(InjectError::File {
        what: "cannot copy the library into the target's mount namespace at",
        path: format!("pid {pid}'s /tmp or /dev/shm"),
        detail: last,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests panic with the error")]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The copies' prefix in these tests.
    const PREFIX: &str = "llmprof-test-copy-";

    fn is_root() -> bool {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() == 0 }
    }

    /// A process in its own mount namespace whose root is `root` (a static `pause` made by gcc).
    fn rooted_pause(root: &Path) -> std::process::Child {
        let src = root.join("pause.c");
        std::fs::write(
            &src,
            "#include <unistd.h>\nint main(void) { for (;;) pause(); }\n",
        )
        .unwrap();
        std::fs::create_dir_all(root.join("bin")).unwrap();
        let o = std::process::Command::new("gcc")
            .args(["-static", "-O1", "-o"])
            .arg(root.join("bin/pause"))
            .arg(&src)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let child = std::process::Command::new("unshare")
            .arg("-m")
            .arg(format!("--root={}", root.display()))
            .arg("/bin/pause")
            .spawn()
            .unwrap();
        let pid = child.id();
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while std::fs::read_link(format!("/proc/{pid}/exe")).map_or(true, |e| !e.ends_with("bin/pause")) {
            assert!(std::time::Instant::now() < until, "unshare --root did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
        child
    }

    #[test]
    fn the_copy_stays_inside_the_targets_root_and_is_removed() {
        if !is_root() {
            return;
        }
        let have = |p: &str| {
            std::process::Command::new(p)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        };
        if !have("gcc") || !have("unshare") {
            return;
        }
        let base = std::env::temp_dir().join(format!("llmprof-inject-root-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let root = base.join("root");
        let victim = base.join("victim");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&victim).unwrap();
        // The target's /tmp is an absolute symlink to a directory of the host; it has no /dev/shm.
        std::os::unix::fs::symlink(&victim, root.join("tmp")).unwrap();
        let helper = base.join("libhelper.so");
        std::fs::write(&helper, b"not really a library").unwrap();
        let mut child = rooted_pause(&root);
        let pid = child.id();
        assert!(!ns::same_as_own(pid, ns::Kind::Mount));
        let e = reachable_path(pid, &helper, PREFIX).unwrap_err();
        assert!(e.to_string().contains("cannot copy"), "{e}");
        assert_eq!(
            std::fs::read_dir(&victim).unwrap().count(),
            0,
            "nothing written through the symlink"
        );
        // With a /dev/shm of its own, the copy goes there, with the source's mode at most, and goes away.
        std::fs::create_dir_all(root.join("dev/shm")).unwrap();
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&helper, std::fs::Permissions::from_mode(0o640)).unwrap();
        }
        let copy = reachable_path(pid, &helper, PREFIX).unwrap().unwrap();
        let inside = root.join(copy.target_path().trim_start_matches('/'));
        assert!(
            copy.target_path().starts_with("/dev/shm/llmprof-test-copy-"),
            "{}",
            copy.target_path()
        );
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&inside).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o640, "never wider than the source");
        }
        copy.remove();
        assert_eq!(std::fs::read_dir(root.join("dev/shm")).unwrap().count(), 0);
        // A copy a killed llmprof left (a pid that is not a running llmprof) is removed by the next one.
        let stale = root.join("dev/shm/llmprof-test-copy-999999999-1");
        std::fs::create_dir_all(&stale).unwrap();
        std::fs::write(stale.join("libhelper.so"), b"old").unwrap();
        let copy = reachable_path(pid, &helper, PREFIX).unwrap().unwrap();
        assert!(!stale.exists(), "the stale copy was removed");
        copy.remove();
        let _ = child.kill();
        let _ = child.wait();
        std::fs::remove_dir_all(&base).unwrap();
    }
}
