//! The egress table of `llmprof report` (the egress family): per destination address and port, the connect
//! attempts, the failed ones, and whether the destination was inside the allowed CIDRs.

use std::collections::BTreeMap;

use super::EgressRow;
use super::read::{Decoded, Val, arg_f, arg_s};
use crate::names::{arg, slice};

/// One row per (address, port), in that order.
pub(super) fn section(d: &Decoded) -> Vec<EgressRow> {
    let mut egress: BTreeMap<(String, u64), EgressRow> = BTreeMap::new();
    for t in d.tracks.values() {
        for i in &t.instants {
            if i.name == slice::CONNECT || i.name == slice::CONNECT_FLAGGED {
                let address = arg_s(&i.args, arg::ADDRESS).unwrap_or("?").to_owned();
                let port = arg_f(&i.args, arg::PORT).unwrap_or(0.0) as u64;
                let allowed = match i.args.get(arg::ALLOWED) {
                    Some(Val::B(b)) => *b,
                    _ => i.name == slice::CONNECT,
                };
                let row = egress
                    .entry((address.clone(), port))
                    .or_insert_with(|| EgressRow {
                        address,
                        port,
                        allowed,
                        ..Default::default()
                    });
                row.connects += 1;
                if arg_f(&i.args, arg::RET).is_some_and(|v| v < 0.0) {
                    row.failed += 1;
                }
            }
        }
    }
    egress.into_values().collect()
}
