//! Network and pid namespaces as `/proc` shows them, for resolving an alert's labels to a local process.
//!
//! Owns grouping processes by network namespace, the local addresses of each namespace (IPv4 from
//! `/proc/PID/net/fib_trie`'s LOCAL host routes, IPv6 from `/proc/PID/net/if_inet6`) and translating a pid of
//! another pid namespace to serve's own (`NSpid` of `/proc/PID/status`). Only the network namespaces owned by
//! serve's own user namespace count ([`all`]): any user may create a user namespace and a network namespace in
//! it, give it any address and listen on any port there. Namespace ids are read through [`crate::sys::ns`].
//! Read-only.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::sys::ns;

/// One network namespace: its processes and its local addresses.
#[derive(Clone, Debug, Default)]
pub struct NetNs {
    /// `net:[INODE]` as `/proc/PID/ns/net` reads.
    pub id: String,
    /// Its processes, ascending.
    pub pids: Vec<u32>,
    /// Its local addresses (loopback included).
    pub addrs: Vec<IpAddr>,
}

/// Every network namespace that has a process and that serve's own user namespace owns, with its addresses.
pub fn all() -> Vec<NetNs> {
    let ours = ns::own_user_ns();
    let mut by_id: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Some(id) = ns::id_of(pid, ns::Kind::Net) else {
            continue;
        };
        by_id.entry(id).or_default().push(pid);
    }
    by_id
        .into_iter()
        .filter(|(_, pids)| pids.iter().take(3).find_map(|&p| ns::net_owner(p)) == ours)
        .map(|(id, mut pids)| {
            pids.sort_unstable();
            let addrs = pids
                .iter()
                .take(3)
                .map(|&p| addresses_of(p))
                .find(|a| !a.is_empty())
                .unwrap_or_default();
            NetNs { id, pids, addrs }
        })
        .collect()
}

/// Local addresses of the network namespace `pid` is in.
fn addresses_of(pid: u32) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = std::fs::read_to_string(format!("/proc/{pid}/net/fib_trie"))
        .map(|t| fib_trie_local(&t).into_iter().map(IpAddr::V4).collect())
        .unwrap_or_default();
    if let Ok(t) = std::fs::read_to_string(format!("/proc/{pid}/net/if_inet6")) {
        out.extend(if_inet6(&t).into_iter().map(IpAddr::V6));
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// The IPv4 addresses with a `/32 host LOCAL` route in a `fib_trie` dump (the namespace's own addresses).
pub fn fib_trie_local(text: &str) -> Vec<Ipv4Addr> {
    let mut out = Vec::new();
    let mut last: Option<Ipv4Addr> = None;
    for line in text.lines() {
        let t = line.trim_start_matches([' ', '|', '+', '-']).trim();
        if let Ok(a) = t.parse::<Ipv4Addr>() {
            last = Some(a);
        } else if t.starts_with("/32 host LOCAL")
            && let Some(a) = last
            && !out.contains(&a)
        {
            out.push(a);
        }
    }
    out
}

/// The addresses of an `if_inet6` table (32 hex digits first on each line).
pub fn if_inet6(text: &str) -> Vec<Ipv6Addr> {
    text.lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter_map(|h| u128::from_str_radix(h, 16).ok().filter(|_| h.len() == 32))
        .map(Ipv6Addr::from)
        .collect()
}

/// The pid, in serve's pid namespace, of the process that is `pid` in the pid namespace `ns_id`
/// (`pid:[INODE]`); None when no such process is visible.
pub fn translate_pid(ns_id: &str, pid: u32) -> Option<u32> {
    let dir = std::fs::read_dir("/proc").ok()?;
    for e in dir.flatten() {
        let Some(host_pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if ns::id_of(host_pid, ns::Kind::Pid).as_deref() != Some(ns_id) {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(format!("/proc/{host_pid}/status")) else {
            continue;
        };
        if innermost_nspid(&status) == Some(pid) {
            return Some(host_pid);
        }
    }
    None
}

/// The last `NSpid:` value of a `/proc/PID/status` (the pid in the process's own pid namespace).
pub fn innermost_nspid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .and_then(|v| v.split_whitespace().last())
        .and_then(|v| v.parse().ok())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests {
    use super::*;

    const FIB: &str = "Main:
  +-- 0.0.0.0/0 3 0 5
     |-- 0.0.0.0
        /0 universe UNICAST
     +-- 10.0.2.0/24 2 0 2
        |-- 10.0.2.0
           /24 link UNICAST
        |-- 10.0.2.15
           /32 host LOCAL
  +-- 127.0.0.0/8 2 0 2
     |-- 127.0.0.1
        /32 host LOCAL
Local:
     |-- 10.0.2.15
        /32 host LOCAL
";

    #[test]
    fn reads_local_addresses() {
        assert_eq!(
            fib_trie_local(FIB),
            vec![Ipv4Addr::new(10, 0, 2, 15), Ipv4Addr::LOCALHOST]
        );
        let v6 = "00000000000000000000000000000001 01 80 10 80       lo\nfe800000000000000000000000000001 02 40 20 80 eth0\nbad\n";
        assert_eq!(
            if_inet6(v6),
            vec![Ipv6Addr::LOCALHOST, "fe80::1".parse::<Ipv6Addr>().unwrap()]
        );
        assert_eq!(innermost_nspid("Name:\tx\nNSpid:\t4242\t7\n"), Some(7));
        assert_eq!(innermost_nspid("Name:\tx\n"), None);
    }

    #[test]
    fn our_namespace_has_loopback_and_us() {
        let me = std::process::id();
        let mine = ns::id_of(me, ns::Kind::Net).unwrap();
        let ns = all();
        let ours = ns.iter().find(|n| n.id == mine).unwrap();
        assert!(ours.pids.contains(&me));
        assert!(
            ours.addrs.contains(&IpAddr::V4(Ipv4Addr::LOCALHOST)),
            "{:?}",
            ours.addrs
        );
        // Our own pid namespace maps our pid to itself.
        let pidns = std::fs::read_link(format!("/proc/{me}/ns/pid")).unwrap();
        assert_eq!(translate_pid(&pidns.to_string_lossy(), me), Some(me));
    }
}
