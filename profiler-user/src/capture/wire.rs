//! The HTTP wire probe's user-space half: which sockets the kernel follows, and its records decoded.
//!
//! Owns finding the traced processes' TCP listening sockets (LISTEN entries of `/proc/PID/net/tcp{,6}` whose
//! inode is one of the process's fds, [`crate::sys::tcp`]) and the connections already established on those
//! ports at attach, and writing them into the kernel's `HTTP_LISTEN` / `HTTP_CONNS` maps (by default the kernel
//! follows every accepted connection provisionally and keeps the HTTP/1.x ones, so `HTTP_LISTEN` is only
//! written for `--http-port`). Its records are decoded by `llmprof_trace::decode::wire`. Also attaches the
//! arrival stamps ([`attach_arrivals`]): a request starts when its bytes reached the server's socket, not when
//! the server read them. [`Wire`] is the capture's part: the ports followed per process and the requests
//! rebuilt from the decoded records. Never reads a connection's bytes itself: the kernel decoders do.

use std::collections::{BTreeSet, HashMap as StdHashMap};
use std::sync::Arc;

use aya::Ebpf;
use aya::maps::{HashMap, ProgramArray};
use aya::programs::RawTracePoint;
use llmprof_abi::{
    HTTP_CONNS_MAP, HTTP_LISTEN_MAP, HTTP_PHASE_PROBE, HTTP_PORTS_MAP, HttpConnState, SKGONE_PROGRAM,
    SKREADY_PROGRAM, SKRECV_PROGRAM, SockKey, WIRE_DECODER_PROGRAMS, WIRE_DECODERS_MAP,
};
use llmprof_trace::decode::wire::requests::{OwnConns, Reconstructor, WireRecord, WireStats};
use llmprof_trace::event::Event;

use super::error::CaptureError;
use super::object::{attach_tracepoints, map_err, map_mut, program};
use super::tracefs::tracepoint_dir;
use crate::sys::tcp;

/// The arrival-stamp programs (`profiler-ebpf/src/wire.rs`): (category, name, program), the forgetting one
/// first so no stamp outlives its socket.
pub const ARRIVAL_TRACEPOINTS: [(&str, &str, &str); 3] = [
    ("tcp", "tcp_destroy_sock", SKGONE_PROGRAM),
    ("sock", "sock_recv_length", SKRECV_PROGRAM),
    ("sock", "sk_data_ready", SKREADY_PROGRAM),
];

/// Loads the wire decoders (`llmprof_abi::WIRE_DECODER_PROGRAMS`) into the `WIRE_DECODERS` program array that
/// `llmprof_sysexit` tail-calls for followed connections. Without them (`--no-http`) the tail calls fail and
/// the exit program does nothing more for those calls; loading them costs ~10 ms of verifier time.
pub fn load_decoders(ebpf: &mut Ebpf) -> Result<(), CaptureError> {
    let mut fds = Vec::with_capacity(WIRE_DECODER_PROGRAMS.len());
    for name in WIRE_DECODER_PROGRAMS {
        let p: &mut RawTracePoint = program(ebpf, name)?;
        let perr = |source| CaptureError::Program {
            program: name.to_owned(),
            source,
        };
        p.load().map_err(perr)?;
        fds.push(
            p.fd()
                .map_err(perr)?
                .try_clone()
                .map_err(|e| CaptureError::Program {
                    program: name.to_owned(),
                    source: aya::programs::ProgramError::from(e),
                })?,
        );
    }
    let mut slots: ProgramArray<_> = map_mut(ebpf, WIRE_DECODERS_MAP)?;
    for (slot, fd) in (0u32..).zip(&fds) {
        slots.set(slot, fd, 0).map_err(map_err(WIRE_DECODERS_MAP))?;
    }
    Ok(())
}

/// Attaches [`ARRIVAL_TRACEPOINTS`] and puts `--http-port`'s ports into the kernel's HTTP ports map (with
/// [`HttpPorts::All`] the kernel learns them at each port's first request). `Ok(Err(why))` when the kernel
/// lacks one of the tracepoints (`sock:sk_data_ready` is Linux 6.6+): wire requests then start when the
/// server reads them.
pub fn attach_arrivals(ebpf: &mut Ebpf, ports: &HttpPorts) -> Result<Result<(), String>, CaptureError> {
    let missing: Vec<String> = ARRIVAL_TRACEPOINTS
        .iter()
        .filter(|(c, n, _)| !tracepoint_dir(c, n).exists())
        .map(|(c, n, _)| format!("{c}:{n}"))
        .collect();
    if !missing.is_empty() {
        return Ok(Err(format!(
            "the kernel has no tracepoint {}",
            missing.join(", ")
        )));
    }
    if let HttpPorts::Only(only) = ports {
        let mut known: HashMap<_, u16, u8> = map_mut(ebpf, HTTP_PORTS_MAP)?;
        for &p in only {
            known.insert(p, 1, 0).map_err(map_err(HTTP_PORTS_MAP))?;
        }
    }
    attach_tracepoints(ebpf, &ARRIVAL_TRACEPOINTS)?;
    Ok(Ok(()))
}

/// The wire probe of a capture: the ports followed and the requests rebuilt from its records.
pub(super) struct Wire {
    /// Requests rebuilt from the probe's records.
    requests: Reconstructor,
    /// Which ports the probe follows.
    ports: HttpPorts,
    /// Ports followed so far, per traced process.
    followed: StdHashMap<u32, Vec<u16>>,
    /// Last id given to a connection seeded from /proc (counts down from `u64::MAX`).
    seeded: u64,
    /// Processes that joined the session after the start (process trees): their sockets are followed too.
    joined: BTreeSet<u32>,
}

impl Wire {
    /// Follows `ports` (nothing is written to the kernel before [`Wire::refresh`]).
    pub(super) fn new(ports: &HttpPorts) -> Self {
        Wire {
            requests: Reconstructor::with_own(own_conns()),
            ports: ports.clone(),
            followed: StdHashMap::new(),
            seeded: u64::MAX,
            joined: BTreeSet::new(),
        }
    }

    /// A process joined the session after the start: its sockets are followed from the next refresh.
    pub(super) fn process_joined(&mut self, pid: u32) {
        self.joined.insert(pid);
    }

    /// A process left the session.
    pub(super) fn process_left(&mut self, pid: u32) {
        self.joined.remove(&pid);
        self.followed.remove(&pid);
    }

    /// Finds the listening sockets of `targets` and of the processes that joined (and connections established
    /// on them) and has the kernel follow them. Returns the ports followed per process.
    pub(super) fn refresh(
        &mut self,
        ebpf: &mut Ebpf,
        targets: &[u32],
    ) -> Result<&StdHashMap<u32, Vec<u16>>, CaptureError> {
        let pids: Vec<u32> = targets.iter().chain(&self.joined).copied().collect();
        for pid in pids {
            let socks = discover(pid, &self.ports);
            if socks.listening.is_empty() {
                continue;
            }
            let ports = fill(ebpf, pid, &socks, &self.ports, &mut self.seeded)?;
            let known = self.followed.entry(pid).or_default();
            if *known != ports {
                log::info!("wire probe: following HTTP on port(s) {ports:?} of pid {pid}");
                *known = ports;
            }
        }
        Ok(&self.followed)
    }

    /// A decoded wire record: the requests it completes go to `out`.
    pub(super) fn push(&mut self, r: WireRecord, out: &mut Vec<Event>) {
        self.requests.push(r, out);
    }

    /// An engine record of a traced process: what a wire request of its process may have carried.
    pub(super) fn engine(&mut self, ev: &Event) {
        self.requests.engine(ev);
    }

    /// What the reconstruction saw so far.
    pub(super) fn stats(&self) -> WireStats {
        self.requests.stats
    }
}

/// llmprof's own connections to traced servers (its /metrics GETs), one registry per llmprof process: every
/// session's wire view reads it ([`llmprof_trace::decode::wire::requests::OwnConns`]) and leaves their requests out.
pub fn own_conns() -> Arc<OwnConns> {
    static OWN: std::sync::OnceLock<Arc<OwnConns>> = std::sync::OnceLock::new();
    OWN.get_or_init(|| Arc::new(OwnConns::default())).clone()
}

/// Which listening ports of the traced processes the wire probe follows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum HttpPorts {
    /// Every TCP port they listen on (the default).
    #[default]
    All,
    /// Only these (`--http-port`).
    Only(Vec<u16>),
    /// None (`--no-http`).
    Off,
}

/// A process's TCP sockets on the ports to follow: listening fds (with their port) and established ones.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Sockets {
    /// (fd, local port) of the listening sockets.
    pub listening: Vec<(i32, u16)>,
    /// fds of connections established on those ports.
    pub established: Vec<i32>,
}

/// The sockets of `pid` to follow, from `fds` (inode → fd) and its namespace's sockets.
pub fn select(fds: &StdHashMap<u64, i32>, rows: &[tcp::TcpRow], ports: &HttpPorts) -> Sockets {
    let mut s = Sockets::default();
    let wanted = |p: u16| match ports {
        HttpPorts::All => true,
        HttpPorts::Only(v) => v.contains(&p),
        HttpPorts::Off => false,
    };
    for r in rows {
        if r.state == tcp::LISTEN
            && wanted(r.local.port())
            && let Some(&fd) = fds.get(&r.inode)
        {
            s.listening.push((fd, r.local.port()));
        }
    }
    for r in rows {
        if r.state == tcp::ESTABLISHED
            && s.listening.iter().any(|(_, p)| *p == r.local.port())
            && let Some(&fd) = fds.get(&r.inode)
        {
            s.established.push(fd);
        }
    }
    s.listening.sort_unstable();
    s.listening.dedup();
    s.established.sort_unstable();
    s.established.dedup();
    s
}

/// The sockets of `pid` to follow: its namespace's listeners (and connections, only when it holds one of
/// them) matched against its fds.
pub fn discover(pid: u32, ports: &HttpPorts) -> Sockets {
    if *ports == HttpPorts::Off {
        return Sockets::default();
    }
    let fds = tcp::socket_fds(pid);
    let listeners = tcp::sockets(Some(pid), tcp::Want::Listening);
    if !listeners.iter().any(|r| fds.contains_key(&r.inode)) {
        return Sockets::default();
    }
    select(
        &fds,
        &tcp::sockets(Some(pid), tcp::Want::ListeningAndEstablished),
        ports,
    )
}

/// Writes `pid`'s sockets into the kernel maps: listening fds to follow (with [`HttpPorts::Only`]; with
/// [`HttpPorts::All`] the kernel probes every accepted connection itself, `Knob::HttpAcceptAll`), established
/// connections as fresh connections (ids counted down from `u64::MAX` by `seeded`; provisional with `All`, so
/// that a non-HTTP port's connection is dropped at its next read). Returns the listening ports.
pub fn fill(
    ebpf: &mut Ebpf,
    pid: u32,
    s: &Sockets,
    ports: &HttpPorts,
    seeded: &mut u64,
) -> Result<Vec<u16>, CaptureError> {
    let all = *ports == HttpPorts::All;
    if !all {
        let mut listen: HashMap<_, SockKey, u8> = map_mut(ebpf, HTTP_LISTEN_MAP)?;
        for &(fd, _) in &s.listening {
            listen
                .insert(SockKey { pid, fd }, 1, 0)
                .map_err(map_err(HTTP_LISTEN_MAP))?;
        }
    }
    let mut conns: HashMap<_, SockKey, HttpConnState> = map_mut(ebpf, HTTP_CONNS_MAP)?;
    for &fd in &s.established {
        let key = SockKey { pid, fd };
        if conns.get(&key, 0).is_ok() {
            continue;
        }
        *seeded -= 1;
        let st = HttpConnState {
            conn: *seeded,
            phase: if all { HTTP_PHASE_PROBE } else { 0 },
            remaining: -1,
            ..HttpConnState::default()
        };
        conns.insert(key, st, 0).map_err(map_err(HTTP_CONNS_MAP))?;
    }
    let mut ports: Vec<u16> = s.listening.iter().map(|(_, p)| *p).collect();
    ports.sort_unstable();
    ports.dedup();
    Ok(ports)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests {
    use super::*;

    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1001 1 0 100 0 0 10 0
   1: 0100007F:1F90 0100007F:D2F0 01 00000000:00000000 00:00000000 00000000     0        0 1002 1 0 20 4 30 10 -1
   2: 0100007F:1F91 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1003 1 0 100 0 0 10 0
   3: 0100007F:D2F0 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 1004 1 0 20 4 30 10 -1
";

    #[test]
    fn listening_and_established_sockets_of_the_chosen_ports() {
        let fds: StdHashMap<u64, i32> = [(1001, 5), (1002, 9), (1003, 6)].into_iter().collect();
        let t: Vec<tcp::TcpRow> = tcp::rows(TCP).collect();
        let all = select(&fds, &t, &HttpPorts::All);
        assert_eq!(all.listening, vec![(5, 8080), (6, 8081)]);
        // 1004 is the client side of the connection (another process's fd here): not ours.
        assert_eq!(all.established, vec![9]);
        let only = select(&fds, &t, &HttpPorts::Only(vec![8081]));
        assert_eq!(only.listening, vec![(6, 8081)]);
        assert!(only.established.is_empty());
        assert_eq!(select(&fds, &t, &HttpPorts::Off), Sockets::default());
    }
}
