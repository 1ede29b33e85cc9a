//! The `egress` family: the connections a traced process opens and the bytes it sends on them, decoded at the
//! exit of the `syscalls` family's programs (no program of its own). Whether a destination is allowed
//! (`--egress-allow`) is decided in user space, at decode time.

use crate::{EventHeader, Family};

/// Sockets a traced process connected, by `SockKey` (tgid, fd); removed at close.
pub const CONNECTED_MAP: &str = "CONNECTED";
/// Bytes sent per connected socket, by `SockKey`; kept after close so totals survive.
pub const SENT_MAP: &str = "SENT";
/// Every program of the family.
pub const PROGRAMS: [&str; 0] = [];
/// Every map of the family.
pub const MAPS: [&str; 2] = [CONNECTED_MAP, SENT_MAP];
/// The family's kernel names.
pub const FAMILY: Family = Family {
    name: "egress",
    programs: &PROGRAMS,
    maps: &MAPS,
};

/// A connect(2) attempt.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ConnectEvent {
    /// Header ([`crate::EventKind::Connect`]); `ts_ns` is the entry time.
    pub hdr: EventHeader,
    /// Return value (0, or -errno such as -EINPROGRESS / -ECONNREFUSED).
    pub ret: i64,
    /// Duration, ns.
    pub dur_ns: u64,
    /// Socket fd.
    pub fd: i32,
    /// AF_INET (2) or AF_INET6 (10).
    pub family: u16,
    /// Destination port, host byte order.
    pub port: u16,
    /// Destination address: IPv4 in the first 4 bytes, or IPv6.
    pub addr: [u8; 16],
    /// 1 when the destination is inside an allowed CIDR. The kernel writes 0; llmprof decides it at
    /// decode time against `--egress-allow` (no kernel state to keep in sync).
    pub allowed: u8,
    /// Reserved, zero.
    pub _pad: [u8; 7],
}

const _: () = assert!(core::mem::size_of::<ConnectEvent>() == 72);
