//! The model-file table of `llmprof report` (the files family): per model file, its opens, reads (count,
//! bytes, time, throughput) and mmaps.

use std::collections::BTreeMap;

use super::ModelFileRow;
use super::analyze::ms;
use super::read::{Decoded, arg_f, arg_s};
use crate::names::{arg, slice};
use llmprof_abi::FileOp;

/// One row per model file (by path), in path order.
pub(super) fn section(d: &Decoded) -> Vec<ModelFileRow> {
    let mut files: BTreeMap<String, ModelFileRow> = BTreeMap::new();
    for t in d.tracks.values() {
        for s in &t.slices {
            if let Some(op) = s.name.strip_prefix(slice::MODEL_FILE_PREFIX) {
                let path = arg_s(&s.args, arg::PATH).unwrap_or("(unknown fd)").to_owned();
                let row = files.entry(path.clone()).or_insert_with(|| ModelFileRow {
                    path,
                    ..Default::default()
                });
                let is = |o: FileOp| o.name() == op;
                if is(FileOp::Read) || is(FileOp::Pread) || is(FileOp::Readv) {
                    row.reads += 1;
                    row.bytes += arg_f(&s.args, arg::BYTES).unwrap_or(0.0).max(0.0) as u64;
                    row.read_ms += ms(s.dur);
                } else if op == slice::FILE_OPEN {
                    row.opens += 1;
                } else if is(FileOp::Mmap) {
                    row.mmaps += 1;
                }
            }
        }
    }
    files
        .into_values()
        .map(|mut f| {
            f.mb_per_s = (f.read_ms > 0.0).then(|| f.bytes as f64 / 1e6 / (f.read_ms / 1e3));
            f
        })
        .collect()
}
