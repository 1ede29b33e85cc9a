//! The slow-syscall table of `llmprof report` (the syscalls family): per syscall name, how many calls were
//! slower than the threshold, their total and longest time.

use std::collections::BTreeMap;

use super::SyscallRow;
use super::analyze::ms;
use super::read::Decoded;
use crate::names::slice;

/// One row per syscall name, the longest total time first.
pub(super) fn section(d: &Decoded) -> Vec<SyscallRow> {
    let mut sys: BTreeMap<String, SyscallRow> = BTreeMap::new();
    for t in d.tracks.values() {
        for s in &t.slices {
            if let Some(name) = s.name.strip_prefix(slice::SYSCALL_PREFIX) {
                let row = sys.entry(name.to_owned()).or_insert_with(|| SyscallRow {
                    name: name.to_owned(),
                    ..Default::default()
                });
                row.count += 1;
                row.total_ms += ms(s.dur);
                row.max_ms = Some(row.max_ms.unwrap_or(0.0).max(ms(s.dur)));
            }
        }
    }
    let mut rows: Vec<SyscallRow> = sys.into_values().collect();
    rows.sort_by(|a, b| b.total_ms.total_cmp(&a.total_ms));
    rows
}
