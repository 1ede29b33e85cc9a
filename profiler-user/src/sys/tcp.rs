//! TCP sockets as `/proc` shows them: the one parser of `/proc/net/tcp{,6}` tables and the one reader of which
//! of a process's fds are sockets.
//!
//! Owns reading a network namespace's tables (llmprof's own, `/proc/net/tcp{,6}`, or a process's,
//! `/proc/PID/net/tcp{,6}`; each at most [`MAX_TABLE_BYTES`]), parsing their rows ([`TcpRow`]: addresses,
//! state, socket inode) and mapping socket inodes to a process's fds (`/proc/PID/fd/N -> socket:[INODE]`).
//! Who uses which socket (the wire probe's followed connections, the /metrics scraper's ports, serve's
//! listeners) is the callers'. Read-only.

use std::collections::HashMap;
use std::io::Read;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Most bytes of one table read (~150 bytes a socket: some 400,000 sockets).
pub const MAX_TABLE_BYTES: u64 = 64 << 20;

/// `TCP_ESTABLISHED` (include/net/tcp_states.h).
pub const ESTABLISHED: u8 = 0x01;
/// `TCP_LISTEN` (include/net/tcp_states.h).
pub const LISTEN: u8 = 0x0A;

/// One row of a `/proc/net/tcp{,6}` table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpRow {
    /// Local address.
    pub local: SocketAddr,
    /// Remote address (unspecified for a listener).
    pub remote: SocketAddr,
    /// TCP state ([`ESTABLISHED`], [`LISTEN`], ...).
    pub state: u8,
    /// The socket's inode (what `/proc/PID/fd/N` links to).
    pub inode: u64,
}

/// The rows of one table's text (the header line and any malformed row skipped).
pub fn rows(table: &str) -> impl Iterator<Item = TcpRow> + '_ {
    table.lines().skip(1).filter_map(|line| {
        // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 10 {
            return None;
        }
        Some(TcpRow {
            local: address(f[1])?,
            remote: address(f[2])?,
            state: u8::from_str_radix(f[3], 16).ok()?,
            inode: f[9].parse().ok()?,
        })
    })
}

/// An address of a table row (`0100007F:1F90`; IPv6 as four little-endian words).
fn address(field: &str) -> Option<SocketAddr> {
    let (ip, port) = field.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let ip = match ip.len() {
        8 => IpAddr::V4(Ipv4Addr::from(u32::from_str_radix(ip, 16).ok()?.swap_bytes())),
        32 => {
            let mut b = [0u8; 16];
            for (w, chunk) in b.chunks_mut(4).enumerate() {
                let word = u32::from_str_radix(ip.get(w * 8..w * 8 + 8)?, 16)
                    .ok()?
                    .swap_bytes();
                chunk.copy_from_slice(&word.to_be_bytes());
            }
            IpAddr::V6(Ipv6Addr::from(b))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// The LISTEN sockets of one table: (local port, socket inode).
pub fn listening(table: &str) -> Vec<(u16, u64)> {
    rows(table)
        .filter(|r| r.state == LISTEN)
        .map(|r| (r.local.port(), r.inode))
        .collect()
}

/// The tables (IPv4, IPv6) of llmprof's own network namespace (`pid` None) or of `pid`'s; a table that
/// cannot be read is left out.
pub fn tables(pid: Option<u32>) -> Vec<String> {
    let dir = pid.map_or_else(|| "/proc/net".to_owned(), |p| format!("/proc/{p}/net"));
    ["tcp", "tcp6"]
        .iter()
        .filter_map(|t| {
            let mut bytes = Vec::new();
            std::fs::File::open(format!("{dir}/{t}"))
                .ok()?
                .take(MAX_TABLE_BYTES)
                .read_to_end(&mut bytes)
                .ok()?;
            Some(String::from_utf8_lossy(&bytes).into_owned())
        })
        .collect()
}

/// The inode of the socket with local address `local` and remote address `remote` in a table (None when
/// there is none yet, e.g. a connection not accepted).
pub fn inode_of(table: &str, local: SocketAddr, remote: SocketAddr) -> Option<u64> {
    let same =
        |a: SocketAddr, b: SocketAddr| a.port() == b.port() && a.ip().to_canonical() == b.ip().to_canonical();
    rows(table)
        .find(|r| r.inode != 0 && same(r.local, local) && same(r.remote, remote))
        .map(|r| r.inode)
}

/// Socket inode → fd, for the sockets among `pid`'s fds (empty when the process is gone).
pub fn socket_fds(pid: u32) -> HashMap<u64, i32> {
    let mut out = HashMap::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return out;
    };
    for e in dir.flatten() {
        let Some(fd) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if let Ok(target) = std::fs::read_link(e.path())
            && let Some(inode) = target
                .to_str()
                .and_then(|t| t.strip_prefix("socket:["))
                .and_then(|s| s.strip_suffix(']'))
                .and_then(|s| s.parse().ok())
        {
            out.insert(inode, fd);
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests {
    use super::*;

    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1001 1 0 100 0 0 10 0
   1: 0100007F:1F90 0100007F:D2F0 01 00000000:00000000 00:00000000 00000000     0        0 1002 1 0 20 4 30 10 -1
   2: broken row
";
    const TCP6: &str = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:1F91 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2001 1 0 100 0 0 10 0
";

    #[test]
    fn rows_carry_addresses_state_and_inode() {
        let r: Vec<TcpRow> = rows(TCP).collect();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].local, "127.0.0.1:8080".parse().unwrap());
        assert_eq!((r[0].state, r[0].inode), (LISTEN, 1001));
        assert_eq!(r[1].remote, "127.0.0.1:54000".parse().unwrap());
        assert_eq!(listening(TCP), vec![(8080, 1001)]);
        assert_eq!(listening(TCP6), vec![(8081, 2001)]);
        let six: Vec<TcpRow> = rows(TCP6).collect();
        assert_eq!(six[0].local, "[::1]:8081".parse().unwrap());
        assert_eq!(
            inode_of(
                TCP,
                "127.0.0.1:8080".parse().unwrap(),
                "127.0.0.1:54000".parse().unwrap()
            ),
            Some(1002)
        );
    }

    #[test]
    fn a_listener_of_ours_is_in_our_tables_and_among_our_fds() {
        use std::os::fd::AsRawFd;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let mine = socket_fds(std::process::id());
        let found = tables(None)
            .iter()
            .flat_map(|t| listening(t))
            .find(|(p, _)| *p == port)
            .unwrap();
        assert_eq!(mine.get(&found.1), Some(&l.as_raw_fd()));
    }
}
