//! How llmprof creates the files and directories it writes: traces readable by their owner only, never through
//! a link an attacker planted, never over an existing file.
//!
//! Owns the one way `attach` and `serve` create a trace ([`create_trace`]: `O_CREAT | O_EXCL | O_NOFOLLOW`,
//! mode 0600) and a directory ([`create_private_dir`]: each missing component 0700). llmprof runs as root and
//! a trace holds command lines, thread names, file paths and connect destinations of the traced process: a
//! predictable name in a shared directory must not let another user redirect the write (a symlink) or read the
//! result (a 0644 file). Must never follow a symlink at the final component, truncate or chmod an existing file.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

/// Mode of a trace file: read and write for its owner (root) only.
pub const TRACE_MODE: u32 = 0o600;
/// Mode of a directory llmprof creates: its owner only.
pub const DIR_MODE: u32 = 0o700;

/// Creates `path` for a new trace: fails (`AlreadyExists`) when anything, a symlink included, is there; the
/// file is created 0600 (before the umask, which can only remove bits).
pub fn create_trace(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(TRACE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| explain(path, e))
}

/// Whether a trace could be created at `path`: `Ok` when nothing is there, else an `AlreadyExists` error that
/// names what is (a file, a directory, a symlink, even a dangling one).
pub fn check_trace_path(path: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(_) => Err(explain(path, io::Error::from(io::ErrorKind::AlreadyExists))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Whether something (a file, a directory, a symlink, even a dangling one) is at `path`.
pub fn taken(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok()
}

/// Creates `dir` and its missing parents, each 0700; an existing directory is left as it is.
pub fn create_private_dir(dir: &Path) -> io::Result<()> {
    DirBuilder::new().recursive(true).mode(DIR_MODE).create(dir)
}

/// An `AlreadyExists` error that says what is in the way and what to do.
fn explain(path: &Path, e: io::Error) -> io::Error {
    // O_NOFOLLOW on a symlink whose target is missing can also answer ELOOP.
    let exists = e.kind() == io::ErrorKind::AlreadyExists || e.raw_os_error() == Some(libc::ELOOP);
    if !exists {
        return e;
    }
    let what = match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => "a symlink",
        Ok(m) if m.is_dir() => "a directory",
        _ => "a file",
    };
    io::Error::new(
        io::ErrorKind::AlreadyExists,
        format!(
            "{what} is already there: llmprof never overwrites a file or follows a link at the trace path; \
             remove it or choose another name"
        ),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;

    fn tmp(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("llmprof-files-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn traces_are_new_files_only_their_owner_reads() {
        let d = tmp("new");
        create_private_dir(&d.join("a/b")).unwrap();
        for p in [d.clone(), d.join("a"), d.join("a/b")] {
            let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, DIR_MODE, "{}", p.display());
        }
        let t = d.join("a/b/x.perfetto-trace");
        check_trace_path(&t).unwrap();
        create_trace(&t).unwrap().write_all(b"trace").unwrap();
        let mode = std::fs::metadata(&t).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, TRACE_MODE);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_planted_symlink_or_file_is_neither_followed_nor_overwritten() {
        let d = tmp("planted");
        create_private_dir(&d).unwrap();
        let victim = d.join("victim");
        std::fs::write(&victim, "precious").unwrap();
        // A symlink to an existing file, a dangling one, and a plain file at the trace path.
        let link = d.join("link.perfetto-trace");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        let dangling = d.join("dangling.perfetto-trace");
        std::os::unix::fs::symlink(d.join("nowhere"), &dangling).unwrap();
        let file = d.join("file.perfetto-trace");
        std::fs::write(&file, "old trace").unwrap();
        for (p, what) in [(&link, "a symlink"), (&dangling, "a symlink"), (&file, "a file")] {
            let e = create_trace(p).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::AlreadyExists, "{}: {e}", p.display());
            assert!(e.to_string().contains(what), "{e}");
            assert!(e.to_string().contains("choose another name"), "{e}");
            assert!(check_trace_path(p).is_err());
            assert!(taken(p));
        }
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "old trace");
        assert!(
            !d.join("nowhere").exists(),
            "the dangling link's target was not created"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }
}
