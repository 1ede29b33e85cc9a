//! The syscall path is exact: one thread of this test makes known numbers of fast and slow calls
//! of several kinds — plain ones (`getppid`, `nanosleep`) and ones whose exit llmprof decodes (`close`,
//! `write`, `read`) — while a real capture traces this process; the kernel's per-thread aggregates must hold
//! exactly those counts, and the slow-syscall events of that thread must be exactly the calls the
//! aggregates' latency histogram puts at or above the threshold (a fast call preempted on a loaded machine is
//! slow, and then must be reported too), with the deliberately slow calls among them. Run twice: with the
//! per-thread syscall slots in the kernel's tid-indexed array (the default) and all in its tid hash (the
//! path of tids from `SYSCALL_SLOTS` on).
//!
//! Needs root (loads eBPF programs). Without root the test skips with a loud message, except under
//! `CI=true`, where it fails.
#![allow(clippy::unwrap_used, reason = "tests panic with the error")]

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use llmprof::capture::{Capture, CaptureConfig, DECODED_SYSCALLS};
use llmprof_abi::{LAT_BUCKETS, ProbeId, SYSCALL_SLOTS};
use llmprof_trace::event::{Event, EventBody};

/// x86-64 syscall numbers of the calls the test makes.
const NR_READ: u64 = 0;
const NR_WRITE: u64 = 1;
const NR_CLOSE: u64 = 3;
const NR_NANOSLEEP: u64 = 35;
const NR_GETPPID: u64 = 110;
/// The slow-syscall threshold: 2^20 ns, a histogram bucket boundary, so "slow" can be read back from the
/// aggregates' log2 histogram exactly.
const SLOW_LOG2: usize = 20;
/// How long the deliberately slow calls take (nanosleep; read of a pipe written this much later).
const SLOW: Duration = Duration::from_millis(3);
/// Calls made of each kind.
const GETPPID: u64 = 20_000;
const CLOSE: u64 = 5_000;
const WRITE: u64 = 3_000;
const SLEEPS: u64 = 7;
const SLOW_READS: u64 = 5;

fn have_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    e2e::require(
        root,
        "root to load eBPF programs: run `sudo -E cargo test -p llmprof --test syscall_exact`",
    )
}

/// The calls, made from one thread with raw `syscall(2)` (so the numbers are the ones named above, whatever
/// the C library prefers). Returns the thread's tid.
fn make_calls() -> u32 {
    let (rd, wr) = {
        let mut fds = [0i32; 2];
        // SAFETY: `fds` has room for the two descriptors pipe(2) writes.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe");
        (fds[0], fds[1])
    };
    let devnull = std::fs::OpenOptions::new().write(true).open("/dev/null").unwrap();
    let null_fd = std::os::fd::AsRawFd::as_raw_fd(&devnull);
    let h = std::thread::spawn(move || {
        // SAFETY: gettid has no arguments.
        let tid = unsafe { libc::syscall(libc::SYS_gettid) } as u32;
        let byte = [0u8; 1];
        // SAFETY (all calls below): raw syscalls on descriptors this test owns (or -1, which fails with
        // EBADF), with buffers that live across the call.
        unsafe {
            for _ in 0..GETPPID {
                libc::syscall(libc::SYS_getppid);
            }
            for _ in 0..CLOSE {
                libc::syscall(libc::SYS_close, -1);
            }
            for _ in 0..WRITE {
                libc::syscall(libc::SYS_write, null_fd, byte.as_ptr(), 1usize);
            }
            let ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: SLOW.as_nanos() as i64,
            };
            for _ in 0..SLEEPS {
                libc::syscall(
                    libc::SYS_nanosleep,
                    &ts as *const libc::timespec,
                    std::ptr::null_mut::<u8>(),
                );
            }
            for _ in 0..SLOW_READS {
                let writer = std::thread::spawn(move || {
                    std::thread::sleep(SLOW);
                    libc::write(wr, [1u8].as_ptr().cast(), 1);
                });
                let mut b = [0u8; 1];
                libc::syscall(libc::SYS_read, rd, b.as_mut_ptr(), 1usize);
                writer.join().unwrap();
            }
        }
        tid
    });
    let tid = h.join().unwrap();
    // SAFETY: descriptors this test created.
    unsafe {
        libc::close(rd);
        libc::close(wr);
    }
    tid
}

/// One capture at a time: the two tests below trace this same process.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

#[test]
fn known_fast_and_slow_calls_are_counted_and_reported_exactly() {
    if !have_root() {
        return;
    }
    // The default: this process's tids are below `SYSCALL_SLOTS`, so every slot is an array entry.
    known_calls_exactly(SYSCALL_SLOTS);
}

#[test]
fn the_same_holds_for_threads_whose_slot_is_in_the_hash() {
    if !have_root() {
        return;
    }
    // As for tids at or above `SYSCALL_SLOTS` (a `kernel.pid_max` above it): every slot in `INFLIGHT`.
    known_calls_exactly(0);
}

fn known_calls_exactly(syscall_slot_tids: u32) {
    let _one = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let pid = std::process::id();
    let cfg = CaptureConfig {
        pids: vec![pid],
        slow_syscall: Duration::from_nanos(1 << SLOW_LOG2),
        // The reference a calibration beside the session measures against.
        measure_untraced: true,
        syscall_slot_tids,
        ..CaptureConfig::default()
    };
    let mut cap = Capture::start(&cfg).unwrap_or_else(|e| panic!("Capture::start: {e:?}"));
    let tid = make_calls();
    let mut events: Vec<Event> = Vec::new();
    for _ in 0..10 {
        cap.poll(&mut events, Duration::from_millis(50)).expect("poll");
    }

    // Counts: exact, per syscall, for the thread that made the calls.
    let aggs: BTreeMap<u64, _> = cap
        .syscall_aggregates()
        .into_iter()
        .filter(|a| a.pid == pid && a.tid == tid)
        .map(|a| (a.nr, a))
        .collect();
    let count = |nr: u64| aggs.get(&nr).map_or(0, |a| a.count);
    assert_eq!(count(NR_GETPPID), GETPPID, "getppid");
    assert_eq!(count(NR_CLOSE), CLOSE, "close");
    assert_eq!(count(NR_WRITE), WRITE, "write");
    assert_eq!(count(NR_NANOSLEEP), SLEEPS, "nanosleep");
    assert_eq!(count(NR_READ), SLOW_READS, "read");

    // The self-accounting's split (decoded calls are charged their own calibrated cost): the decoded class
    // holds this thread's close/write/read calls, not its getppid or nanosleep ones, and is what the
    // aggregates of the decoded numbers sum to (this thread's own map reads are `bpf` calls, not decoded).
    let acct = llmprof::selfacct::Counters::of(&cap);
    let decoded: u64 = cap
        .syscall_aggregates()
        .iter()
        .filter(|a| DECODED_SYSCALLS.contains(&a.nr))
        .map(|a| a.count)
        .sum();
    assert_eq!(acct.syscalls_decoded, decoded, "decoded hits = their aggregates");
    assert!(
        acct.syscalls_decoded >= CLOSE + WRITE + SLOW_READS,
        "decoded hits hold this thread's close/write/read: {}",
        acct.syscalls_decoded
    );
    assert!(
        acct.syscalls_decoded + GETPPID + SLEEPS <= acct.probes[ProbeId::Syscalls as usize].hits,
        "plain hits hold this thread's getppid/nanosleep: {acct:?}"
    );
    for a in aggs.values() {
        assert_eq!(a.hist.len(), LAT_BUCKETS);
        assert_eq!(
            a.hist.iter().sum::<u64>(),
            a.count,
            "histogram of nr {} sums to its count",
            a.nr
        );
        assert!(a.total_ns >= a.count, "nr {}: a total time for every call", a.nr);
    }

    // Outliers: the thread's slow-syscall events are exactly the calls at or above the threshold.
    let mut slow: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for e in &events {
        if let EventBody::SlowSyscall { nr, dur_ns, .. } = e.body
            && e.tid == tid
        {
            slow.entry(nr).or_default().push(dur_ns);
        }
    }
    for (nr, a) in &aggs {
        let above: u64 = a.hist[SLOW_LOG2..].iter().sum();
        let got = slow.get(nr).map_or(0, |v| v.len() as u64);
        assert_eq!(
            got, above,
            "slow events of nr {nr} vs its aggregate's calls ≥ 2^{SLOW_LOG2} ns"
        );
    }
    let sleeps = slow.get(&NR_NANOSLEEP).cloned().unwrap_or_default();
    assert_eq!(sleeps.len() as u64, SLEEPS, "every nanosleep is an outlier");
    let reads = slow.get(&NR_READ).cloned().unwrap_or_default();
    assert_eq!(
        reads.len() as u64,
        SLOW_READS,
        "every blocking read is an outlier"
    );
    for d in sleeps.iter().chain(&reads) {
        assert!(
            *d >= SLOW.as_nanos() as u64,
            "an outlier carries its duration: {d} ns"
        );
        assert!(*d < 2_000_000_000, "an outlier's duration is its own: {d} ns");
    }
    let c = cap.counters();
    assert!(c.iter().all(|p| p.dropped == 0), "no drops: {c:?}");

    // The decoded class has its own cost, measured against the reference the session took.
    let cal = llmprof::capture::calibrate::run(&llmprof::capture::calibrate::CalibrationConfig {
        untraced: cap.untraced(),
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("calibrate: {e:?}"));
    assert!(
        cal.syscall_decoded_ns.is_some_and(|d| d >= 0.0),
        "the decoded class is calibrated: {cal:?}"
    );
}
