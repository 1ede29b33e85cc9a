//! `egress` of the `--json` document.

use serde::Serialize;

use crate::report::EgressRow;

/// One `egress` entry.
#[derive(Serialize)]
pub(super) struct Egress<'a> {
    address: &'a str,
    port: u64,
    connects: u64,
    failed: u64,
    allowed: bool,
    verdict: &'static str,
}

impl<'a> Egress<'a> {
    pub(super) fn of(e: &'a EgressRow) -> Self {
        Self {
            address: &e.address,
            port: e.port,
            connects: e.connects,
            failed: e.failed,
            allowed: e.allowed,
            verdict: if e.allowed { "allowed" } else { "flagged" },
        }
    }
}
