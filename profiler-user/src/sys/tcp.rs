//! TCP sockets of a network namespace: which sockets listen or are connected, by the kernel's sock_diag
//! (netlink, what `ss` uses) or, where that is refused, by the one parser of `/proc/net/tcp{,6}`; and the one
//! reader of which of a process's fds are sockets.
//!
//! Owns querying a network namespace's sockets (llmprof's own, or a process's: the netlink socket is opened
//! in that namespace by a short-lived thread that enters it), parsing the answers and the tables' rows
//! ([`TcpRow`]: addresses, state, socket inode) and mapping socket inodes to a process's fds
//! (`/proc/PID/fd/N -> socket:[INODE]`). Why not `/proc/net/tcp` first: reading it walks every bucket of the
//! kernel's established hash (262,144 on a 24 GiB machine): ~7 ms of llmprof's CPU per table, per process,
//! per second of a session; a sock_diag query for listeners walks only the listening hash (~30 µs), and a
//! connection is one hashed lookup by its addresses. Every answer is bounded ([`MAX_SOCKETS`], a receive
//! timeout); a namespace that cannot be queried falls back to its tables (each at most [`MAX_TABLE_BYTES`]).
//! Who uses which socket (the wire probe's followed connections, the /metrics scraper's ports, serve's
//! listeners) is the callers'. Read-only.

use std::collections::HashMap;
use std::io::{self, Read};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use netlink_packet_core::{NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload};
use netlink_packet_sock_diag::SockDiagMessage;
use netlink_packet_sock_diag::constants::{AF_INET, AF_INET6, IPPROTO_TCP};
use netlink_packet_sock_diag::inet::{ExtensionFlags, InetRequest, SocketId, StateFlags};
use netlink_sys::protocols::NETLINK_SOCK_DIAG;

/// Most bytes of one table read (~150 bytes a socket: some 400,000 sockets).
pub const MAX_TABLE_BYTES: u64 = 64 << 20;
/// Most sockets one sock_diag query returns (as many as [`MAX_TABLE_BYTES`] of table).
pub const MAX_SOCKETS: usize = 400_000;
/// Longest a sock_diag answer may take to arrive (the kernel answers at once; this only bounds a stall).
const DIAG_TIMEOUT: Duration = Duration::from_secs(1);

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
#[cfg(test)]
fn listening(table: &str) -> Vec<(u16, u64)> {
    rows(table)
        .filter(|r| r.state == LISTEN)
        .map(|r| (r.local.port(), r.inode))
        .collect()
}

/// Which sockets a query returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    /// Listening sockets only (the kernel walks its listening hash only).
    Listening,
    /// Listening and established sockets.
    ListeningAndEstablished,
}

impl Want {
    fn states(self) -> StateFlags {
        match self {
            Want::Listening => StateFlags::LISTEN,
            Want::ListeningAndEstablished => StateFlags::LISTEN | StateFlags::ESTABLISHED,
        }
    }

    fn keeps(self, state: u8) -> bool {
        state == LISTEN || (self == Want::ListeningAndEstablished && state == ESTABLISHED)
    }
}

/// The TCP sockets (IPv4 and IPv6) of llmprof's own network namespace (`pid` None) or of `pid`'s that `want`
/// names; empty when neither sock_diag nor the tables can be read (the process is gone).
pub fn sockets(pid: Option<u32>, want: Want) -> Vec<TcpRow> {
    match diag::socket_in(pid).and_then(|s| diag::dump(&s, want.states())) {
        Ok(rows) => rows,
        Err(e) => {
            log::debug!("sock_diag refused ({e}); reading the TCP tables");
            tables(pid)
                .iter()
                .flat_map(|t| rows(t))
                .filter(|r| want.keeps(r.state))
                .collect()
        }
    }
}

/// The listening sockets of llmprof's namespace (`pid` None) or of `pid`'s: (local port, socket inode).
pub fn listeners(pid: Option<u32>) -> Vec<(u16, u64)> {
    sockets(pid, Want::Listening)
        .into_iter()
        .map(|r| (r.local.port(), r.inode))
        .collect()
}

/// The inode of the connection with local address `local` and remote address `remote` in llmprof's namespace
/// (`pid` None) or `pid`'s: None when there is none, or none accepted yet (a connection in the listener's
/// queue has no inode).
pub fn connection(pid: Option<u32>, local: SocketAddr, remote: SocketAddr) -> Option<u64> {
    match diag::socket_in(pid).and_then(|s| diag::lookup(&s, local, remote)) {
        Ok(found) => found.filter(|&inode| inode != 0),
        Err(e) => {
            log::debug!("sock_diag refused ({e}); reading the TCP tables");
            tables(pid).iter().find_map(|t| inode_of(t, local, remote))
        }
    }
}

/// The tables (IPv4, IPv6) of llmprof's own network namespace (`pid` None) or of `pid`'s; a table that
/// cannot be read is left out.
fn tables(pid: Option<u32>) -> Vec<String> {
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
fn inode_of(table: &str, local: SocketAddr, remote: SocketAddr) -> Option<u64> {
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

/// The kernel's sock_diag over netlink (`NETLINK_SOCK_DIAG`, `inet_diag_req_v2`).
mod diag {
    use std::os::fd::{AsFd, AsRawFd};

    use super::*;
    use netlink_sys::{Socket, SocketAddr as NlAddr};

    /// A sock_diag socket in llmprof's network namespace (`pid` None or in it) or in `pid`'s: opened by a
    /// thread that enters that namespace and ends, so llmprof's own threads never change namespace.
    pub(super) fn socket_in(pid: Option<u32>) -> io::Result<Socket> {
        let Some(pid) = pid.filter(|&p| !crate::sys::ns::same_as_own(p, crate::sys::ns::Kind::Net)) else {
            return open();
        };
        let ns = std::fs::File::open(format!("/proc/{pid}/ns/net"))?;
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    // SAFETY: `ns` is an open namespace file for the whole call; setns changes only this
                    // thread's network namespace (CLONE_NEWNET), and the thread ends after opening the socket.
                    if unsafe { libc::setns(ns.as_fd().as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                        return Err(io::Error::last_os_error());
                    }
                    open()
                })
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("the namespace thread panicked")))
        })
    }

    fn open() -> io::Result<Socket> {
        let mut s = Socket::new(NETLINK_SOCK_DIAG)?;
        s.bind_auto()?;
        s.connect(&NlAddr::new(0, 0))?;
        let tv = libc::timeval {
            tv_sec: DIAG_TIMEOUT.as_secs() as libc::time_t,
            tv_usec: 0,
        };
        // SAFETY: `tv` is a valid timeval that outlives the call, and its size is passed with it.
        let rc = unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(s)
    }

    fn send(s: &Socket, flags: u16, family: u8, states: StateFlags, socket_id: SocketId) -> io::Result<()> {
        let mut header = NetlinkHeader::default();
        header.flags = flags;
        let mut msg = NetlinkMessage::new(
            header,
            SockDiagMessage::InetRequest(InetRequest {
                family,
                protocol: IPPROTO_TCP,
                extensions: ExtensionFlags::empty(),
                states,
                socket_id,
            })
            .into(),
        );
        msg.finalize();
        let mut buf = vec![0; msg.buffer_len()];
        msg.serialize(&mut buf);
        s.send(&buf, 0)?;
        Ok(())
    }

    /// Reads answers until the dump's end (or, for a lookup, the first answer), each socket given to `each`.
    fn receive(s: &Socket, dump: bool, mut each: impl FnMut(TcpRow)) -> io::Result<()> {
        let mut buf = vec![0u8; 64 << 10];
        let mut seen = 0usize;
        loop {
            let n = s.recv(&mut &mut buf[..], 0)?;
            if n == 0 {
                return Err(io::Error::other("sock_diag closed"));
            }
            let mut at = 0;
            while at < n {
                let msg = NetlinkMessage::<SockDiagMessage>::deserialize(&buf[at..n])
                    .map_err(|e| io::Error::other(format!("sock_diag answer: {e}")))?;
                let len = msg.header.length as usize;
                match msg.payload {
                    NetlinkPayload::Done(_) => return Ok(()),
                    NetlinkPayload::Error(e) if e.code.is_some() => return Err(e.to_io()),
                    NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(r)) => {
                        seen += 1;
                        if seen > MAX_SOCKETS {
                            return Err(io::Error::other(format!("more than {MAX_SOCKETS} sockets")));
                        }
                        let id = &r.header.socket_id;
                        each(TcpRow {
                            local: SocketAddr::new(id.source_address, id.source_port),
                            remote: SocketAddr::new(id.destination_address, id.destination_port),
                            state: r.header.state,
                            inode: u64::from(r.header.inode),
                        });
                        if !dump {
                            return Ok(());
                        }
                    }
                    _ => {}
                }
                if len == 0 {
                    break;
                }
                at += (len + 3) & !3;
            }
        }
    }

    /// Every socket of both families in `states`.
    pub(super) fn dump(s: &Socket, states: StateFlags) -> io::Result<Vec<TcpRow>> {
        let mut out = Vec::new();
        for (family, id) in [(AF_INET, SocketId::new_v4()), (AF_INET6, SocketId::new_v6())] {
            send(s, NLM_F_REQUEST | NLM_F_DUMP, family, states.clone(), id)?;
            receive(s, true, |r| out.push(r))?;
        }
        Ok(out)
    }

    /// The inode of the socket with these addresses (None: no such socket).
    pub(super) fn lookup(s: &Socket, local: SocketAddr, remote: SocketAddr) -> io::Result<Option<u64>> {
        let (l, r) = (local.ip().to_canonical(), remote.ip().to_canonical());
        let family = if l.is_ipv4() && r.is_ipv4() {
            AF_INET
        } else {
            AF_INET6
        };
        let v6 = |ip: IpAddr| match ip {
            IpAddr::V4(v4) => IpAddr::V6(v4.to_ipv6_mapped()),
            v6 => v6,
        };
        let (sa, da) = if family == AF_INET { (l, r) } else { (v6(l), v6(r)) };
        let id = SocketId {
            source_port: local.port(),
            destination_port: remote.port(),
            source_address: sa,
            destination_address: da,
            interface_id: 0,
            // INET_DIAG_NOCOOKIE: any socket with these addresses.
            cookie: [0xff; 8],
        };
        send(s, NLM_F_REQUEST, family, StateFlags::all(), id)?;
        let mut inode = None;
        // The kernel's lookup falls back to a listener on the local address: only the connection counts.
        let this = |row: &TcpRow| row.state != LISTEN && row.remote.port() == remote.port();
        match receive(s, false, |row| inode = Some(row.inode).filter(|_| this(&row))) {
            Ok(()) => Ok(inode),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(e),
        }
    }
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
        let found = listeners(None).into_iter().find(|(p, _)| *p == port).unwrap();
        assert_eq!(mine.get(&found.1), Some(&l.as_raw_fd()));
        // The same socket through the tables: both readers agree.
        let in_tables = tables(None)
            .iter()
            .flat_map(|t| listening(t))
            .find(|(p, _)| *p == port)
            .unwrap();
        assert_eq!(in_tables, found);
    }

    #[test]
    fn a_connection_is_found_by_its_addresses_once_accepted() {
        use std::os::fd::AsRawFd;
        for host in ["127.0.0.1:0", "[::1]:0"] {
            let l = std::net::TcpListener::bind(host).unwrap();
            let server = l.local_addr().unwrap();
            let c = std::net::TcpStream::connect(server).unwrap();
            let client = c.local_addr().unwrap();
            // Not accepted yet: the connection has no inode.
            assert_eq!(connection(None, server, client), None);
            let (a, _) = l.accept().unwrap();
            let inode = connection(None, server, client).unwrap();
            assert_eq!(socket_fds(std::process::id()).get(&inode), Some(&a.as_raw_fd()));
            // Both ends are there, each under its own local address.
            let rows = sockets(None, Want::ListeningAndEstablished);
            assert!(
                rows.iter()
                    .any(|r| r.inode == inode && r.state == ESTABLISHED && r.local == server)
            );
            assert!(connection(None, client, server).is_some());
            assert_eq!(connection(None, server, "127.0.0.1:9".parse().unwrap()), None);
        }
    }

    #[test]
    fn another_namespace_is_queried_in_that_namespace() {
        // A process's own namespace through /proc/PID: the same answer as llmprof's.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        assert!(
            listeners(Some(std::process::id()))
                .iter()
                .any(|(p, _)| *p == port)
        );
        assert!(listeners(Some(u32::MAX)).is_empty());
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped the other namespace: entering one needs root");
            return;
        }
        // A listener in a network namespace of its own: found through its pid, not in llmprof's.
        let mut child = std::process::Command::new("unshare")
            .args(["--net", "python3", "-c"])
            .arg("import socket,sys; s=socket.socket(); s.bind(('0.0.0.0',0)); s.listen(); print(s.getsockname()[1], flush=True); sys.stdin.read()")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let port: u16 = line.trim().parse().unwrap();
        let theirs = listeners(Some(child.id()));
        let (_, inode) = *theirs.iter().find(|(p, _)| *p == port).unwrap();
        assert!(socket_fds(child.id()).contains_key(&inode));
        assert!(!listeners(None).iter().any(|(_, i)| *i == inode));
        drop(child.stdin.take());
        child.wait().unwrap();
    }
}
