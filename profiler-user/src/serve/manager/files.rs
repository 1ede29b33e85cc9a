//! The sessions' trace files: a fresh, safe name for each, and the disk quota's removals (what to remove is
//! the plan of [`super::super::quota`]; here it is carried out on the sessions' state).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use llmprof_trace::clock::{realtime_ns, utc_civil};

use super::super::metrics::Metrics;
use super::super::quota;
use super::{END_DISK_QUOTA, Inner, Manager, State, lock};

/// `alertname` reduced to file-name-safe characters.
pub(super) fn file_stem(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    if s.is_empty() { "alert".into() } else { s }
}

/// `DIR/STEM.perfetto-trace`, or `STEM.2`, `STEM.3`, … when something (a file, a directory, a symlink, even a
/// dangling one) already has the name: a planted file or link makes the session pick the next name, and one
/// planted between this choice and the session's `create_new` fails the session with the reason
/// ([`crate::files::create_trace`]); neither is ever followed or overwritten.
pub(super) fn fresh_path(dir: &Path, stem: &str) -> PathBuf {
    let mut p = dir.join(format!("{stem}{}", quota::TRACE_SUFFIX));
    let mut n: u64 = 2;
    while crate::files::taken(&p) {
        p = dir.join(format!("{stem}.{n}{}", quota::TRACE_SUFFIX));
        n = n.saturating_add(1);
    }
    p
}

impl Manager {
    pub(super) fn trace_path(&self, alertname: &str, id: u64) -> PathBuf {
        let (y, m, d, hh, mm, ss) = utc_civil(realtime_ns() / 1_000_000_000);
        let stem = format!(
            "{}-{y:04}{m:02}{d:02}-{hh:02}{mm:02}{ss:02}-{id}",
            file_stem(alertname)
        );
        fresh_path(&self.cfg.out_dir, &stem)
    }

    /// Applies the disk quota now (see the module docs).
    pub fn enforce_quota(&self) {
        let files = quota::scan(&self.cfg.out_dir);
        let mut inner = lock(&self.inner);
        self.apply_quota(&mut inner, files);
    }

    pub(super) fn apply_quota(&self, inner: &mut Inner, files: std::io::Result<Vec<quota::TraceFile>>) {
        let files = match files {
            Ok(f) => f,
            Err(e) => {
                log::warn!("cannot scan {}: {e}", self.cfg.out_dir.display());
                return;
            }
        };
        // Sizes of running traces, for the sessions list.
        for s in inner
            .sessions
            .values_mut()
            .filter(|s| s.view.state == State::Running)
        {
            if let Some(f) = files
                .iter()
                .find(|f| Some(f.path.display().to_string()) == s.view.trace)
            {
                s.view.bytes = f.bytes;
            }
        }
        let Some(q) = self.cfg.disk_quota else {
            self.disk_bytes
                .store(files.iter().map(|f| f.bytes).sum(), Ordering::Relaxed);
            return;
        };
        let running: HashSet<PathBuf> = inner
            .sessions
            .values()
            .filter(|s| s.view.state == State::Running)
            .filter_map(|s| s.view.trace.as_ref().map(PathBuf::from))
            .collect();
        let plan = quota::plan(&files, &running, q);
        let mut total = plan.total_after;
        for p in &plan.remove {
            match std::fs::remove_file(p) {
                Ok(()) => {
                    Metrics::inc(&self.metrics.traces_removed);
                    eprintln!("llmprof serve: disk quota: removed {}", p.display());
                    let shown = p.display().to_string();
                    for s in inner.sessions.values_mut() {
                        if s.view.trace.as_deref() == Some(shown.as_str()) {
                            s.view.trace_removed = true;
                        }
                    }
                }
                Err(e) => {
                    total += files.iter().find(|f| &f.path == p).map_or(0, |f| f.bytes);
                    log::warn!("disk quota: cannot remove {}: {e}", p.display());
                }
            }
        }
        self.disk_bytes.store(total, Ordering::Relaxed);
        if plan.over_by > 0 {
            // Traces in progress alone are over: stop the newest until the rest fit.
            let mut freed = 0;
            for s in inner.sessions.values_mut().rev() {
                if freed >= plan.over_by {
                    break;
                }
                if s.view.state == State::Running && !s.stop.load(Ordering::Relaxed) {
                    s.stop_reason.set(END_DISK_QUOTA);
                    s.stop.store(true, Ordering::Release);
                    freed += s.view.bytes.max(1);
                    Metrics::inc(&self.metrics.sessions_stopped_quota);
                    eprintln!(
                        "llmprof serve: disk quota: traces in progress exceed it; stopping session {}",
                        s.view.id
                    );
                }
            }
        }
    }
}
