//! The `wire` family (`llmprof_abi::wire`): the HTTP/1.1 wire probe, requests and responses of any server,
//! reconstructed from its socket syscalls.
//!
//! Hooked into the dispatch of `llmprof_sysexit` (`syscalls`): accept/accept4 on a listening socket user space named in
//! `HTTP_LISTEN` starts following the new connection in `HTTP_CONNS` (bounded; a full map is a counted drop).
//! On a followed connection:
//! - reads (read, recvfrom, readv, recvmsg) with data while no request is open start a request: its head is
//!   copied, cut at the blank line `\r\n\r\n` so no body byte leaves the kernel (`HttpHeadEvent`); a head
//!   longer than one read continues in further records. The first bytes also tell TLS and HTTP/2 apart, which
//!   are reported once and not followed.
//! - writes (write, sendto, writev, sendmsg) after a request are the response: every scanned byte goes
//!   through a small state machine (`step`) kept per connection, so an event split across writes and several
//!   events in one write both work. It reads the status line and `Content-Length` of the head, the SSE `data:`
//!   lines and, inside their JSON, whether a content key (`content`, `text`, `reasoning`, `reasoning_content`,
//!   `arguments`) has a non-empty string value or `tool_calls` a non-empty array: a role-only first chunk is
//!   not content. Ends: `Content-Length` bytes written, the chunk terminator `0\r\n\r\n`, `data: [DONE]`.
//! - a read of 0 bytes (EOF) or a reset is the peer going away; close of the fd ends the connection.
//!
//! A request starts when its first bytes reached the server's socket, not when the server got round to reading
//! them (a busy event loop, a full accept queue): `llmprof_skready` (sock:sk_data_ready, in whatever context
//! queued the data) stamps the first unread bytes of established TCP sockets on ports known to carry HTTP to a
//! traced process (`HTTP_PORTS`: learned at a followed connection's first request, or `--http-port`'s) into
//! `HTTP_ARRIVALS`; `llmprof_skrecv` (sock:sock_recv_length, inside the traced thread's read) moves the stamp
//! of the socket it read into the connection's state; the read's exit puts it into the request's start record.
//! `llmprof_skgone` (tcp:tcp_destroy_sock) forgets a destroyed socket, so a reused address never inherits
//! a stamp.
//!
//! Bytes are scanned with `bpf_loop` (one verified callback, any count up to the bound) from a per-CPU
//! scratch copy: at most `SCAN_MAX` bytes per buffer and `MAX_IOV` buffers per call (more is flagged).
//! Only counts and flags leave the kernel for responses; nothing of the body.

use aya_ebpf::{
    bindings::{BPF_NOEXIST, BPF_RB_NO_WAKEUP},
    cty::c_void,
    helpers::{
        bpf_get_current_pid_tgid, bpf_probe_read_kernel as read_kernel,
        generated::{bpf_loop, bpf_probe_read_kernel, bpf_probe_read_user},
    },
    macros::{map, raw_tracepoint, tracepoint},
    maps::{HashMap, LruHashMap, PerCpuArray, ProgramArray},
    programs::{RawTracePointContext, TracePointContext},
};
use llmprof_abi::{
    EventKind, HTTP_ARRIVALS_MAX, HTTP_FLAG_FIRST_CONTENT, HTTP_FLAG_HEAD_CUT, HTTP_FLAG_HEAD_DONE,
    HTTP_FLAG_SCAN_CUT, HTTP_HEAD_MAX, HTTP_PHASE_PROBE, HTTP_PORTS_MAX, HttpConnState, HttpEvent,
    HttpHeadEvent, HttpOp, Knob, ProbeId, SOCK_FAMILY_OFFSET, SOCK_NUM_OFFSET, SOCK_STATE_OFFSET, Scan,
    SockKey, TCP_STATE_ESTABLISHED, WIRE_DECODER_SLOTS, counting_body, finish_write, is_http_request_start,
    scan_byte, start_response,
    syscalls::{NR_READ, NR_READV, NR_RECVFROM, NR_RECVMSG},
};

use crate::{
    EVENTS, count, header, knob, now,
    syscalls::{Inflight, slot_of},
    tp_field as tp,
};

/// Bytes of one buffer the response scanner looks at (a power of two: indexes are masked).
const SCAN_MAX: usize = 4096;
/// Buffers of one writev/sendmsg/readv/recvmsg looked at.
const MAX_IOV: usize = 8;

/// Listening sockets of traced processes whose accepted connections are followed, by (tgid, fd); written by
/// user space.
#[map]
static HTTP_LISTEN: HashMap<SockKey, u8> = HashMap::with_max_entries(256, 0);

/// Followed connections, by (tgid, fd); removed at close.
#[map]
static HTTP_CONNS: HashMap<SockKey, HttpConnState> = HashMap::with_max_entries(8192, 0);

/// Local ports known to carry HTTP to a traced process (value unused); see the module docs.
#[map]
static HTTP_PORTS: HashMap<u16, u8> = HashMap::with_max_entries(HTTP_PORTS_MAX, 0);

/// `struct sock` address → when its first unread bytes arrived (BOOTTIME ns); see the module docs.
#[map]
static HTTP_ARRIVALS: LruHashMap<u64, u64> = LruHashMap::with_max_entries(HTTP_ARRIVALS_MAX, 0);

// Field offsets of the tracepoints' formats (/sys/kernel/tracing/events/{sock,tcp}/*/format, a stable ABI).
const TP_SK: usize = 8;
const TP_FAMILY: usize = 16;
const TP_PROTOCOL: usize = 18;
const TP_RECV_RET: usize = 20;
const TP_RECV_FLAGS: usize = 24;
const TP_DESTROY_SPORT: usize = 16;
const IPPROTO_TCP: u16 = 6;
const MSG_PEEK: i32 = 2;
const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;

/// A field of the kernel's `struct sock_common` at `sk + off` (0 when unreadable).
#[inline(always)]
fn sock_field<T: Copy + Default>(sk: u64, off: u64) -> T {
    // SAFETY: a fault-checked kernel read of a plain integer field; a failed read leaves the default.
    unsafe { read_kernel((sk + off) as *const T) }.unwrap_or_default()
}

/// sock:sk_data_ready — bytes were queued on a socket: stamp the first unread ones of an established TCP
/// socket on an HTTP port of a traced process.
#[tracepoint]
pub fn llmprof_skready(ctx: TracePointContext) -> u32 {
    if tp::<u16>(&ctx, TP_PROTOCOL) != IPPROTO_TCP {
        return 0;
    }
    let sk: u64 = tp(&ctx, TP_SK);
    let port: u16 = sock_field(sk, SOCK_NUM_OFFSET);
    // SAFETY: presence test only.
    if unsafe { HTTP_PORTS.get(&port) }.is_none() {
        return 0;
    }
    // The layout check: the family the tracepoint names is the one at our offset (else nothing is stamped).
    if sock_field::<u16>(sk, SOCK_FAMILY_OFFSET) != tp::<u16>(&ctx, TP_FAMILY)
        || sock_field::<u8>(sk, SOCK_STATE_OFFSET) != TCP_STATE_ESTABLISHED
    {
        return 0;
    }
    // The first stamp since the last read stays.
    let _ = HTTP_ARRIVALS.insert(&sk, &now(), BPF_NOEXIST as u64);
    0
}

/// sock:sock_recv_length — inside a read of a traced thread: when the socket is a followed connection, its
/// address is noted and the stamp of the bytes this read consumed moves into the connection's state.
#[tracepoint]
pub fn llmprof_skrecv(ctx: TracePointContext) -> u32 {
    let ret: i32 = tp(&ctx, TP_RECV_RET);
    if ret <= 0 || tp::<i32>(&ctx, TP_RECV_FLAGS) & MSG_PEEK != 0 {
        return 0;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let Some(slot) = slot_of(pid_tgid as u32) else {
        return 0;
    };
    // SAFETY: the current thread's own slot (see `slot_of`), read only.
    let (nr, fd) = unsafe { ((*slot).nr, (*slot).args[0]) };
    if !matches!(nr, NR_READ | NR_READV | NR_RECVFROM | NR_RECVMSG) {
        return 0;
    }
    let key = SockKey {
        pid: (pid_tgid >> 32) as u32,
        fd: fd as i32,
    };
    let Some(st) = HTTP_CONNS.get_ptr_mut(&key) else {
        return 0;
    };
    let sk: u64 = tp(&ctx, TP_SK);
    // SAFETY: copied out at once.
    let arrival = unsafe { HTTP_ARRIVALS.get(&sk) }.copied().unwrap_or(0);
    if arrival != 0 {
        let _ = HTTP_ARRIVALS.remove(&sk);
    }
    // SAFETY: a valid map value; the connection's reader is this thread.
    unsafe {
        (*st).sk = sk;
        (*st).arrival_ns = arrival;
    }
    0
}

/// tcp:tcp_destroy_sock — a TCP socket on an HTTP port is gone: its stamp (if any) with it.
#[tracepoint]
pub fn llmprof_skgone(ctx: TracePointContext) -> u32 {
    let port: u16 = tp(&ctx, TP_DESTROY_SPORT);
    // SAFETY: presence test only.
    if unsafe { HTTP_PORTS.get(&port) }.is_some() {
        let sk: u64 = tp(&ctx, TP_SK);
        let _ = HTTP_ARRIVALS.remove(&sk);
    }
    0
}

/// Per-CPU copy of the bytes being scanned, and the scan's state. The state lives in the map value, not on the
/// stack, on purpose: the verifier then sees every load of it as an unknown scalar, so the `bpf_loop`
/// callback is verified once instead of once per combination of the state machine's values (which exceeds
/// its jump-history limit).
#[repr(C)]
struct Scratch {
    buf: [u8; SCAN_MAX],
    /// Bytes of `buf` to scan (response) or holding head bytes (request; shrinks to the blank line).
    n: u64,
    scan: Scan,
    /// Request head: characters of `\r\n\r\n` matched so far, and whether all four were.
    matched: u32,
    done: u32,
    /// Response write: the call's buffers ([`write_buf_cb`] takes one per index), the bytes of the call not
    /// yet scanned, and the `HTTP_FLAG_SCAN_CUT` bit when a buffer was cut.
    bufs: Bufs,
    left: u64,
    flags: u32,
    pad: u32,
}

#[map]
static HTTP_SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);

// Phases of a connection.
const PH_IDLE: u32 = 0;
const PH_REQ_HEAD: u32 = 1;
const PH_REQ_BODY: u32 = 2;
const PH_RESP: u32 = 3;
const PH_RESP_DONE: u32 = 4;
const PH_GONE: u32 = 5;

/// The `bpf_loop` context (the helper wants a stack pointer): the scratch map value.
#[repr(C)]
struct LoopCtx {
    s: *mut Scratch,
}

/// Runs `cb` over indexes `0..n` with the scratch value `s`.
#[inline(always)]
fn run_loop(n: u32, cb: extern "C" fn(u64, *mut c_void) -> i64, s: *mut Scratch) {
    let mut lc = LoopCtx { s };
    // SAFETY: the callback is a verified subprogram; `lc` outlives the call.
    unsafe {
        bpf_loop(
            n,
            cb as *mut c_void,
            (&mut lc as *mut LoopCtx).cast::<c_void>(),
            0,
        )
    };
}

/// `bpf_loop` callback: byte `i` of the scan.
extern "C" fn scan_cb(i: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `ctx` is the caller's `LoopCtx` (bpf_loop passes it through unchanged), holding the per-CPU
    // scratch map value (checked non-null by the caller); the index is masked into the array.
    let x = unsafe { &mut *(*ctx.cast::<LoopCtx>()).s };
    if i >= x.n {
        return 1;
    }
    let c = x.buf[(i as usize) & (SCAN_MAX - 1)];
    scan_byte(c, i, &mut x.scan);
    0
}

/// `bpf_loop` callback: buffer `k` of a response write (copied into the scratch buffer, then scanned). A
/// callback rather than a loop in the decoder: its state lives in the scratch value, so the verifier checks
/// one buffer once instead of every combination of up to [`MAX_IOV`] of them (~0.4 s at each attach).
extern "C" fn write_buf_cb(k: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: as in `scan_cb`.
    let s = unsafe { (*ctx.cast::<LoopCtx>()).s };
    // SAFETY: see above.
    let x = unsafe { &mut *s };
    if x.left == 0 {
        return 1;
    }
    let Some((addr, len)) = buf_at(&x.bufs, k) else {
        return 1;
    };
    let take = len.min(x.left);
    x.left -= take;
    let n = take.min(SCAN_MAX as u64);
    if n < take {
        x.flags |= HTTP_FLAG_SCAN_CUT;
    }
    // SAFETY: reads at most SCAN_MAX bytes of the user's buffer into the scratch array.
    let rc = unsafe {
        bpf_probe_read_user(
            x.buf.as_mut_ptr().cast::<c_void>(),
            (n as u32) & (SCAN_MAX as u32 * 2 - 1),
            addr as *const c_void,
        )
    };
    if rc == 0 {
        x.n = n;
        run_loop(SCAN_MAX as u32, scan_cb, s);
    }
    x.scan.base += take;
    0
}

/// `bpf_loop` callback: byte `i` of a request head; bytes past the blank line (or past the read) are zeroed.
extern "C" fn head_cb(i: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: as in `scan_cb`.
    let x = unsafe { &mut *(*ctx.cast::<LoopCtx>()).s };
    let idx = (i as usize) & (SCAN_MAX - 1);
    if i >= x.n {
        x.buf[idx] = 0;
        return 0;
    }
    let c = x.buf[idx];
    let want = if x.matched & 1 == 0 { b'\r' } else { b'\n' };
    if c == want {
        x.matched += 1;
    } else {
        x.matched = if c == b'\r' { 1 } else { 0 };
    }
    if x.matched >= 4 {
        x.n = i + 1;
        x.done = 1;
    }
    0
}

/// One buffer of a call: its user address and length.
#[inline(always)]
fn read_iov(iov_ptr: u64, k: u64) -> Option<(u64, u64)> {
    let mut iov = [0u64; 2];
    // SAFETY: reads one `struct iovec` (base, len) of user memory into a stack array; faults fail cleanly.
    let rc = unsafe {
        bpf_probe_read_user(
            iov.as_mut_ptr().cast::<c_void>(),
            16,
            (iov_ptr + k * 16) as *const c_void,
        )
    };
    (rc == 0).then_some((iov[0], iov[1]))
}

/// The buffers of a syscall: an iovec array (`iov`, `iovcnt`), or, when `iov` is 0, the single buffer
/// (`addr`, `len`). Plain integers, every field always written: the value is stored in a map.
#[repr(C)]
#[derive(Clone, Copy)]
struct Bufs {
    addr: u64,
    len: u64,
    iov: u64,
    iovcnt: u64,
}

/// The buffers `inf` names for syscall `nr` (`msghdr`: `msg_iov` at offset 16, `msg_iovlen` at 24).
#[inline(always)]
fn bufs(nr: u64, inf: &Inflight) -> Option<Bufs> {
    use llmprof_abi::syscalls::{NR_SENDMSG, NR_SENDTO, NR_WRITE, NR_WRITEV};
    match nr {
        NR_READ | NR_WRITE | NR_RECVFROM | NR_SENDTO => Some(Bufs {
            addr: inf.args[1],
            len: inf.args[2],
            iov: 0,
            iovcnt: 0,
        }),
        NR_READV | NR_WRITEV => Some(Bufs {
            addr: 0,
            len: 0,
            iov: inf.args[1],
            iovcnt: inf.args[2],
        }),
        NR_RECVMSG | NR_SENDMSG => {
            let mut m = [0u64; 2];
            // SAFETY: reads msg_iov and msg_iovlen of the user's `struct msghdr`; faults fail cleanly.
            let rc = unsafe {
                bpf_probe_read_user(
                    m.as_mut_ptr().cast::<c_void>(),
                    16,
                    (inf.args[1] + 16) as *const c_void,
                )
            };
            (rc == 0 && m[0] != 0).then_some(Bufs {
                addr: 0,
                len: 0,
                iov: m[0],
                iovcnt: m[1],
            })
        }
        _ => None,
    }
}

#[inline(always)]
fn buf_at(b: &Bufs, k: u64) -> Option<(u64, u64)> {
    match b.iov {
        0 => (k == 0).then_some((b.addr, b.len)),
        iov if k < b.iovcnt => read_iov(iov, k),
        _ => None,
    }
}

/// accept/accept4 returned `ret` on listening fd `lfd`: follow the connection when the socket is one of ours
/// (`HTTP_LISTEN`), or provisionally, whatever the socket, when `Knob::HttpAcceptAll` is on: the process is
/// traced (the caller filters), so a worker that got its listening socket after attach (forked, or passed over
/// a unix socket) is followed from its first accept, with no user-space round trip.
#[inline(never)]
pub(crate) fn on_accept(tgid: u32, lfd: u64, ret: i64) -> u32 {
    if ret < 0 {
        return 0;
    }
    let lkey = SockKey {
        pid: tgid,
        fd: lfd as i32,
    };
    // SAFETY: presence test only.
    let listed = unsafe { HTTP_LISTEN.get(&lkey) }.is_some();
    if !listed && knob(Knob::HttpAcceptAll) == 0 {
        return 0;
    }
    let st = HttpConnState {
        conn: now(),
        phase: if listed { PH_IDLE } else { HTTP_PHASE_PROBE },
        remaining: -1,
        ..HttpConnState::default()
    };
    let key = SockKey {
        pid: tgid,
        fd: ret as i32,
    };
    if HTTP_CONNS.insert(&key, &st, 0).is_err() {
        count(ProbeId::Http, 0, 0, 1);
    }
    0
}

/// close(fd): a followed connection ends.
#[inline(never)]
pub(crate) fn on_close(pid_tgid: u64, fd: u64) -> u32 {
    let key = SockKey {
        pid: (pid_tgid >> 32) as u32,
        fd: fd as i32,
    };
    // SAFETY: copied out before removal.
    let Some((conn, phase)) = (unsafe { HTTP_CONNS.get(&key) }).map(|s| (s.conn, s.phase)) else {
        return 0;
    };
    let _ = HTTP_CONNS.remove(&key);
    if phase == HTTP_PHASE_PROBE {
        return 0;
    }
    emit(pid_tgid, key.fd, conn, HttpOp::Close, 0, 0, 0, 0, 0);
    0
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn emit(
    pid_tgid: u64,
    fd: i32,
    conn: u64,
    op: HttpOp,
    flags: u32,
    status: u32,
    events: u32,
    content: u32,
    ret: i64,
) {
    let Some(mut e) = EVENTS.reserve::<HttpEvent>(0) else {
        count(ProbeId::Http, 0, 0, 1);
        return;
    };
    e.write(HttpEvent {
        hdr: header(EventKind::Http, now(), pid_tgid),
        fd,
        op: op as u32,
        conn,
        flags,
        status,
        events,
        content_events: content,
        ret,
    });
    e.submit(BPF_RB_NO_WAKEUP as u64);
    count(ProbeId::Http, 0, 1, 0);
}

/// The wire decoders, by slot (`llmprof_abi::WIRE_DECODE_READ` / `WIRE_DECODE_WRITE`), filled by user space.
#[map]
static WIRE_DECODERS: ProgramArray = ProgramArray::with_max_entries(WIRE_DECODER_SLOTS, 0);

/// What `llmprof_sysexit` hands to a decoder: a tail call starts from the bare context, so the call's saved
/// entry, its number and its result travel in this per-CPU slot (a tail call runs on its caller's CPU, and
/// sys_exit programs do not nest on a CPU).
#[repr(C)]
#[derive(Clone, Copy)]
struct WireExit {
    pid_tgid: u64,
    ret: i64,
    inf: Inflight,
}

#[map]
static WIRE_EXIT: PerCpuArray<WireExit> = PerCpuArray::with_max_entries(1, 0);

/// From `llmprof_sysexit`, last: when `fd` is a followed connection, the decoder in `slot` takes the call
/// over (this does not return then). Other fds cost one hash lookup; with no decoder loaded (`--http off`)
/// the tail call fails and nothing happens.
#[inline(always)]
pub(crate) fn decode_exit(ctx: &RawTracePointContext, slot: u32, pid_tgid: u64, inf: &Inflight, ret: i64) {
    let key = SockKey {
        pid: (pid_tgid >> 32) as u32,
        fd: inf.args[0] as i32,
    };
    // SAFETY: presence test only.
    if unsafe { HTTP_CONNS.get(&key) }.is_none() {
        return;
    }
    let Some(x) = WIRE_EXIT.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's slot; nothing else runs on this CPU between this store and the decoder's load.
    unsafe {
        *x = WireExit {
            pid_tgid,
            ret,
            inf: *inf,
        };
        WIRE_DECODERS.tail_call(ctx, slot);
    }
}

/// The call `llmprof_sysexit` handed over, copied out of [`WIRE_EXIT`].
#[inline(always)]
fn handed_over() -> Option<WireExit> {
    // SAFETY: this CPU's slot, written by the tail caller just before.
    WIRE_EXIT.get_ptr(0).map(|x| unsafe { *x })
}

/// Read-side decoder (tail-called from `llmprof_sysexit`, never attached): [`on_read`].
#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn llmprof_wirerd(_ctx: RawTracePointContext) -> i32 {
    if let Some(x) = handed_over() {
        on_read(x.pid_tgid, x.inf.nr, &x.inf, x.ret);
    }
    0
}

/// Write-side decoder (tail-called from `llmprof_sysexit`, never attached): [`on_write`].
#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn llmprof_wirewr(_ctx: RawTracePointContext) -> i32 {
    if let Some(x) = handed_over() {
        on_write(x.pid_tgid, x.inf.nr, &x.inf, x.ret);
    }
    0
}

/// A read-side call (read, recvfrom, readv, recvmsg) returned `ret` on `fd`.
#[inline(never)]
fn on_read(pid_tgid: u64, nr: u64, inf: &Inflight, ret: i64) -> u32 {
    let key = SockKey {
        pid: (pid_tgid >> 32) as u32,
        fd: inf.args[0] as i32,
    };
    let Some(st) = HTTP_CONNS.get_ptr_mut(&key) else {
        return 0;
    };
    // SAFETY: a valid map value; one thread serves a connection at a time (a race only garbles one scan).
    let (conn, phase, arrival, sk) = unsafe {
        let v = ((*st).conn, (*st).phase, (*st).arrival_ns, (*st).sk);
        (*st).arrival_ns = 0;
        v
    };
    let probing = phase == HTTP_PHASE_PROBE;
    if probing && ret <= 0 {
        // Nothing read yet on a provisional connection: EAGAIN keeps it, an end or error drops it unseen.
        if ret != -11 {
            let _ = HTTP_CONNS.remove(&key);
        }
        return 0;
    }
    if ret == 0 || ret == -104 {
        // EOF or ECONNRESET: the peer went away.
        if phase != PH_GONE {
            // SAFETY: see above.
            unsafe { (*st).phase = PH_GONE };
            emit(pid_tgid, key.fd, conn, HttpOp::Reset, 0, 0, 0, 0, ret);
        }
        return 0;
    }
    if ret < 0 || phase == PH_REQ_BODY || phase == PH_GONE {
        return 0;
    }
    count(ProbeId::Http, 1, 0, 0);
    let Some(b) = bufs(nr, inf) else { return 0 };
    let Some((addr, len)) = buf_at(&b, 0) else {
        return 0;
    };
    let Some(scratch) = HTTP_SCRATCH.get_ptr_mut(0) else {
        return 0;
    };
    let n = (ret as u64).min(len).min(HTTP_HEAD_MAX as u64);
    // SAFETY: reads at most HTTP_HEAD_MAX (< SCAN_MAX) bytes of the user's buffer into the scratch array.
    let rc = unsafe {
        bpf_probe_read_user(
            scratch.cast::<c_void>(),
            (n as u32) & (HTTP_HEAD_MAX as u32 * 2 - 1),
            addr as *const c_void,
        )
    };
    if rc != 0 {
        return 0;
    }
    let start = phase != PH_REQ_HEAD;
    if start {
        // SAFETY: the scratch array holds at least 4 bytes.
        let first = unsafe {
            [
                (*scratch).buf[0],
                (*scratch).buf[1],
                (*scratch).buf[2],
                (*scratch).buf[3],
            ]
        };
        let other = if first[0] == 0x16 && first[1] == 0x03 {
            Some(HttpOp::Tls)
        } else if &first == b"PRI " {
            Some(HttpOp::Http2)
        } else {
            None
        };
        if let Some(op) = other {
            let _ = HTTP_CONNS.remove(&key);
            emit(pid_tgid, key.fd, conn, op, 0, 0, 0, 0, ret);
            return 0;
        }
        if probing && (n < 4 || !is_http_request_start(&first)) {
            // Another protocol on an accepted connection (ZMQ, gRPC-less RPC, Redis…): not followed, no record.
            let _ = HTTP_CONNS.remove(&key);
            return 0;
        }
        // SAFETY: see above.
        if sk != 0 && unsafe { (*st).port_noted } == 0 {
            // A request on this port: its later connections' bytes are stamped on arrival.
            let port: u16 = sock_field(sk, SOCK_NUM_OFFSET);
            let family: u16 = sock_field(sk, SOCK_FAMILY_OFFSET);
            // A Unix socket has no port: nothing to learn.
            if port != 0 && (family == AF_INET || family == AF_INET6) {
                let _ = HTTP_PORTS.insert(&port, &1, 0);
            }
            // SAFETY: see above.
            unsafe { (*st).port_noted = 1 };
        }
    }
    // SAFETY: the scratch value is this CPU's; `st` a valid map value (see above). The callback is a verified
    // subprogram and gets the scratch value as its context.
    let hx = unsafe {
        (*scratch).n = n;
        (*scratch).matched = if start { 0 } else { (*st).head_match };
        (*scratch).done = 0;
        run_loop(HTTP_HEAD_MAX as u32, head_cb, scratch);
        &*scratch
    };
    let mut flags = 0;
    if hx.done != 0 {
        flags |= HTTP_FLAG_HEAD_DONE;
    } else if (ret as u64) > n {
        flags |= HTTP_FLAG_HEAD_CUT;
    }
    // SAFETY: see above.
    unsafe {
        if start {
            (*st).bits = 0;
            (*st).line_len = 0;
            (*st).status = 0;
            (*st).remaining = -1;
        }
        (*st).head_match = hx.matched;
        (*st).phase = if hx.done != 0 || flags & HTTP_FLAG_HEAD_CUT != 0 {
            PH_REQ_BODY
        } else {
            PH_REQ_HEAD
        };
    }
    let Some(mut e) = EVENTS.reserve::<HttpHeadEvent>(0) else {
        count(ProbeId::Http, 0, 0, 1);
        return 0;
    };
    let p = e.as_mut_ptr();
    // SAFETY: `p` is a reserved HttpHeadEvent; every write stays inside it; the data copy reads the scratch
    // array, whose bytes past the head were zeroed by `head_cb`.
    let rc = unsafe {
        (&raw mut (*p).hdr).write(header(EventKind::HttpHead, now(), pid_tgid));
        (&raw mut (*p).fd).write(key.fd);
        (&raw mut (*p).op).write(if start {
            HttpOp::RequestStart
        } else {
            HttpOp::RequestHead
        } as u32);
        (&raw mut (*p).conn).write(conn);
        (&raw mut (*p).flags).write(flags);
        (&raw mut (*p).len).write(hx.n as u32);
        (&raw mut (*p).ret).write(ret);
        (&raw mut (*p).arrival_ns).write(if start { arrival } else { 0 });
        bpf_probe_read_kernel(
            (&raw mut (*p).data).cast::<c_void>(),
            HTTP_HEAD_MAX as u32,
            scratch.cast::<c_void>(),
        )
    };
    if rc != 0 {
        e.discard(0);
        count(ProbeId::Http, 0, 0, 1);
        return 0;
    }
    e.submit(BPF_RB_NO_WAKEUP as u64);
    count(ProbeId::Http, 0, 1, 0);
    0
}

/// A write-side call (write, sendto, writev, sendmsg) returned `ret` on `fd`.
#[inline(never)]
fn on_write(pid_tgid: u64, nr: u64, inf: &Inflight, ret: i64) -> u32 {
    let key = SockKey {
        pid: (pid_tgid >> 32) as u32,
        fd: inf.args[0] as i32,
    };
    let Some(st) = HTTP_CONNS.get_ptr_mut(&key) else {
        return 0;
    };
    // SAFETY: see `on_read`.
    let (conn, phase) = unsafe { ((*st).conn, (*st).phase) };
    if ret == -104 || ret == -32 {
        // ECONNRESET / EPIPE: the peer is gone.
        if phase != PH_GONE {
            // SAFETY: see above.
            unsafe { (*st).phase = PH_GONE };
            emit(pid_tgid, key.fd, conn, HttpOp::Reset, 0, 0, 0, 0, ret);
        }
        return 0;
    }
    if ret <= 0 || phase == PH_IDLE || phase == PH_RESP_DONE || phase == PH_GONE || phase == HTTP_PHASE_PROBE
    {
        return 0;
    }
    count(ProbeId::Http, 1, 0, 0);
    let Some(scratch) = HTTP_SCRATCH.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: this CPU's scratch value and the connection's map value (see above).
    let x = unsafe {
        (*scratch).scan = Scan {
            st: *st,
            ..Scan::default()
        };
        &mut *scratch
    };
    if phase != PH_RESP {
        start_response(&mut x.scan.st);
    }
    let scanned = !counting_body(&x.scan.st);
    x.flags = 0;
    if scanned {
        let Some(b) = bufs(nr, inf) else { return 0 };
        x.bufs = b;
        x.left = ret as u64;
        run_loop(MAX_IOV as u32, write_buf_cb, scratch);
        if x.left > 0 {
            x.flags |= HTTP_FLAG_SCAN_CUT;
        }
    }
    let mut flags = x.flags;
    let o = finish_write(&mut x.scan, ret as u64, scanned);
    if o.response_start {
        emit(
            pid_tgid,
            key.fd,
            conn,
            HttpOp::ResponseStart,
            0,
            o.status,
            0,
            0,
            ret,
        );
    }
    if o.events > 0 {
        flags |= o.flags;
        if flags & HTTP_FLAG_FIRST_CONTENT != 0 || knob(Knob::HttpSseOff) == 0 {
            emit(
                pid_tgid,
                key.fd,
                conn,
                HttpOp::Sse,
                flags,
                0,
                o.events,
                o.content,
                ret,
            );
        }
    }
    x.scan.st.phase = if o.end != 0 {
        emit(pid_tgid, key.fd, conn, HttpOp::ResponseEnd, o.end, 0, 0, 0, ret);
        PH_RESP_DONE
    } else {
        PH_RESP
    };
    // SAFETY: see above.
    unsafe { *st = x.scan.st };
    0
}
