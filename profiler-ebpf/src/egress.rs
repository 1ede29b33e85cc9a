//! The `egress` family (`llmprof_abi::egress`): connects of a traced process and the bytes it sends on the
//! sockets it connected, decoded at the exit of the `syscalls` programs (no program of its own). Connected
//! sockets are kept in `CONNECTED` until their close, the bytes sent per socket in `SENT` (kept after the close
//! so totals survive). Whether a destination is allowed is user space's decision, at decode time.

use aya_ebpf::{
    bindings::BPF_RB_NO_WAKEUP, cty::c_void, helpers::generated::bpf_probe_read_user, macros::map,
    maps::HashMap,
};
use llmprof_abi::{ConnectEvent, EventKind, ProbeId, SockKey};

use crate::{EVENTS, count, header, syscalls::Inflight};

/// Sockets the target connected, by (pid, fd); removed at close.
#[map]
static CONNECTED: HashMap<SockKey, u8> = HashMap::with_max_entries(4096, 0);

/// Bytes sent per connected socket, by (pid, fd); kept after close so totals survive.
#[map]
static SENT: HashMap<SockKey, u64> = HashMap::with_max_entries(4096, 0);

/// include/uapi/asm-generic/errno.h
const EINPROGRESS: i64 = 115;
/// include/linux/socket.h
const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;

/// sockaddr_in / sockaddr_in6 prefix: family, port (network order), then the address
/// (IPv4 at offset 4; IPv6 at offset 8 after the flow info).
#[repr(C)]
#[derive(Clone, Copy)]
struct SockAddr {
    family: u16,
    port_be: u16,
    v4_or_flow: [u8; 4],
    v6: [u8; 16],
}

#[inline(always)]
pub(crate) fn connect(pid_tgid: u64, inf: &Inflight, ret: i64, dur: u64) {
    let addrlen = inf.args[2];
    if addrlen < 8 {
        return;
    }
    let mut sa = SockAddr {
        family: 0,
        port_be: 0,
        v4_or_flow: [0; 4],
        v6: [0; 16],
    };
    let want = if addrlen >= 24 { 24 } else { 8 };
    // SAFETY: reads `want` (<= size_of::<SockAddr>()) bytes of user memory into a stack value.
    let rc = unsafe {
        bpf_probe_read_user(
            (&mut sa as *mut SockAddr).cast::<c_void>(),
            want,
            inf.args[1] as *const c_void,
        )
    };
    if rc != 0 || (sa.family != AF_INET && sa.family != AF_INET6) {
        return;
    }
    let mut addr = [0u8; 16];
    if sa.family == AF_INET {
        addr[..4].copy_from_slice(&sa.v4_or_flow);
    } else {
        addr = sa.v6;
    }
    let fd = inf.args[0] as i32;
    let Some(mut e) = EVENTS.reserve::<ConnectEvent>(0) else {
        count(ProbeId::Connect, 1, 0, 1);
        return;
    };
    e.write(ConnectEvent {
        hdr: header(EventKind::Connect, inf.ts_ns, pid_tgid),
        ret,
        dur_ns: dur,
        fd,
        family: sa.family,
        port: u16::from_be(sa.port_be),
        addr,
        allowed: 0,
        _pad: [0; 7],
    });
    e.submit(BPF_RB_NO_WAKEUP as u64);
    count(ProbeId::Connect, 1, 1, 0);
    if ret == 0 || ret == -EINPROGRESS {
        let key = SockKey {
            pid: (pid_tgid >> 32) as u32,
            fd,
        };
        let _ = CONNECTED.insert(&key, &1, 0);
        let _ = SENT.insert(&key, &0, 0);
    }
}

#[inline(always)]
pub(crate) fn sent(tgid: u32, inf: &Inflight, ret: i64) {
    if ret <= 0 {
        return;
    }
    let key = SockKey {
        pid: tgid,
        fd: inf.args[0] as i32,
    };
    // SAFETY: presence test only.
    if unsafe { CONNECTED.get(&key) }.is_none() {
        return;
    }
    if let Some(p) = SENT.get_ptr_mut(&key) {
        // SAFETY: a valid map value. Not atomic (the bpfel target has no atomic RMW in `core`): two
        // threads sending on one socket at the same instant may lose one addition.
        unsafe { *p += ret as u64 };
        count(ProbeId::Send, 1, 0, 0);
    }
}

/// The socket `inf.args[0]` of `pid_tgid`'s process is closed: it is no longer a connected one.
#[inline(always)]
pub(crate) fn forget(pid_tgid: u64, inf: &Inflight) {
    let key = SockKey {
        pid: (pid_tgid >> 32) as u32,
        fd: inf.args[0] as i32,
    };
    let _ = CONNECTED.remove(&key);
}
