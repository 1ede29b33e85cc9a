//! The disk quota of the output directory.
//!
//! Owns deciding which trace files to remove so the directory's traces fit the quota: oldest first (by
//! modification time), never a trace still being written. When the traces in progress alone exceed the
//! quota, it says by how much, and the session manager stops the newest running sessions. Only files named
//! `*.perfetto-trace` directly in the directory count and are ever removed.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// Suffix of the files the quota manages.
pub const TRACE_SUFFIX: &str = ".perfetto-trace";

/// A trace file in the directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceFile {
    /// Path.
    pub path: PathBuf,
    /// Size, bytes.
    pub bytes: u64,
    /// Last modification.
    pub modified: SystemTime,
}

/// What to do to fit the quota.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Finished traces to remove, oldest first.
    pub remove: Vec<PathBuf>,
    /// Bytes of the directory after the removals.
    pub total_after: u64,
    /// Bytes still over the quota after removing every finished trace (traces in progress alone exceed it).
    pub over_by: u64,
}

/// The default quota's share of the filesystem holding the output directory.
pub const DEFAULT_SHARE_PERCENT: u64 = 10;
/// The default quota's ceiling.
pub const DEFAULT_CEILING: u64 = 20 << 30;

/// The default quota of `dir` (when `--max-disk` is not given): 10 % of its filesystem's size, at most 20 GiB.
/// None when the filesystem cannot be read.
pub fn default_quota(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: zeroed is a valid statvfs (plain integers).
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `st` a valid out-pointer for the call's duration.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    let size = st.f_blocks.saturating_mul(st.f_frsize);
    Some(default_for(size))
}

/// 10 % of `filesystem_bytes`, at most 20 GiB.
pub fn default_for(filesystem_bytes: u64) -> u64 {
    (filesystem_bytes / 100 * DEFAULT_SHARE_PERCENT).min(DEFAULT_CEILING)
}

/// The trace files directly in `dir`.
pub fn scan(dir: &Path) -> std::io::Result<Vec<TraceFile>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)?.flatten() {
        let path = e.path();
        if !path.to_string_lossy().ends_with(TRACE_SUFFIX) {
            continue;
        }
        let Ok(m) = e.metadata() else { continue };
        if !m.is_file() {
            continue;
        }
        out.push(TraceFile {
            path,
            bytes: m.len(),
            modified: m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
        });
    }
    Ok(out)
}

/// Plans removals so the total fits `quota`; files in `in_progress` are never removed.
pub fn plan(files: &[TraceFile], in_progress: &HashSet<PathBuf>, quota: u64) -> Plan {
    let mut total: u64 = files.iter().map(|f| f.bytes).sum();
    let mut finished: Vec<&TraceFile> = files.iter().filter(|f| !in_progress.contains(&f.path)).collect();
    finished.sort_by(|a, b| a.modified.cmp(&b.modified).then_with(|| a.path.cmp(&b.path)));
    let mut remove = Vec::new();
    for f in finished {
        if total <= quota {
            break;
        }
        total -= f.bytes;
        remove.push(f.path.clone());
    }
    Plan {
        remove,
        total_after: total,
        over_by: total.saturating_sub(quota),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_default_is_a_tenth_of_the_filesystem_at_most_20_gib() {
        assert_eq!(default_for(50 << 30), 5 << 30);
        assert_eq!(default_for(1 << 40), 20 << 30);
        assert_eq!(default_for(0), 0);
        let here = default_quota(&std::env::temp_dir()).unwrap();
        assert!(here > 0 && here <= DEFAULT_CEILING, "{here}");
        assert_eq!(default_quota(Path::new("/nonexistent/dir")), None);
    }

    fn f(name: &str, bytes: u64, age_s: u64) -> TraceFile {
        TraceFile {
            path: PathBuf::from(name),
            bytes,
            modified: SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 - age_s),
        }
    }

    #[test]
    fn removes_oldest_first_until_it_fits() {
        let files = [f("new", 40, 1), f("old", 40, 30), f("mid", 40, 10)];
        let p = plan(&files, &HashSet::new(), 100);
        assert_eq!(p.remove, vec![PathBuf::from("old")]);
        assert_eq!((p.total_after, p.over_by), (80, 0));
        let p = plan(&files, &HashSet::new(), 120);
        assert!(p.remove.is_empty());
    }

    #[test]
    fn never_removes_a_trace_in_progress() {
        let files = [f("running", 90, 100), f("done", 40, 1)];
        let running: HashSet<PathBuf> = [PathBuf::from("running")].into();
        let p = plan(&files, &running, 100);
        assert_eq!(p.remove, vec![PathBuf::from("done")]);
        assert_eq!(p.over_by, 0);
        let p = plan(&files, &running, 50);
        assert_eq!(p.remove, vec![PathBuf::from("done")]);
        assert_eq!(p.over_by, 40, "the running trace alone is over");
    }

    #[test]
    fn scans_only_trace_files() {
        let dir = std::env::temp_dir().join(format!("llmprof-quota-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sub.perfetto-trace")).unwrap();
        std::fs::write(dir.join("a.perfetto-trace"), b"12345").unwrap();
        std::fs::write(dir.join("notes.txt"), b"keep me").unwrap();
        let files = scan(&dir).unwrap();
        assert_eq!(files.len(), 1);
        assert_eq!(files[0].bytes, 5);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
