//! The egress family's user half: the bytes the targets sent on each socket they connected (`SENT`).
//!
//! The family has no program of its own: the syscalls exit program records connects (`CONNECTED`) and
//! counts what is sent on them; the connect records are decoded by `llmprof_trace::decode::egress`, which
//! owns the allow list ([`Cidr`]). Owns reading `SENT`; never writes it.

use aya::Ebpf;
use aya::maps::HashMap;
use llmprof_abi::{SENT_MAP, SockKey};

pub use llmprof_trace::decode::egress::{Cidr, CidrError};

/// Bytes sent on each socket the targets connected: (pid, fd, bytes).
pub(super) fn sent_bytes(ebpf: &Ebpf) -> Vec<(u32, i32, u64)> {
    let Some(map) = ebpf.map(SENT_MAP) else {
        return Vec::new();
    };
    let Ok(m) = HashMap::<_, SockKey, u64>::try_from(map) else {
        return Vec::new();
    };
    m.iter()
        .filter_map(Result::ok)
        .map(|(k, v)| (k.pid, k.fd, v))
        .collect()
}
