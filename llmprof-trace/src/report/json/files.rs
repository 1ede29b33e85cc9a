//! `model_files` of the `--json` document.

use serde::Serialize;

use super::{Num, opt};
use crate::report::ModelFileRow;

/// One `model_files` entry.
#[derive(Serialize)]
pub(super) struct ModelFile<'a> {
    path: &'a str,
    reads: u64,
    bytes: u64,
    read_ms: Num,
    mb_per_s: Option<Num>,
    opens: u64,
    mmaps: u64,
}

impl<'a> ModelFile<'a> {
    pub(super) fn of(f: &'a ModelFileRow) -> Self {
        Self {
            path: &f.path,
            reads: f.reads,
            bytes: f.bytes,
            read_ms: Num(f.read_ms),
            mb_per_s: opt(f.mb_per_s),
            opens: f.opens,
            mmaps: f.mmaps,
        }
    }
}
