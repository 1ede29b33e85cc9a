//! Capture of thread states: attaches the scheduler programs of `profiler-ebpf/src/sched.rs`, fills their
//! tid → tgid map from `/proc/PID/task`.
//!
//! Owns the kernel side of thread states in user space (their records are decoded by
//! `llmprof_trace::decode::sched`, the trace side is `llmprof_trace::event::sched`).
//! Order at start: the programs are attached with the others; after the targets enter `TRACED`, every thread
//! listed in `/proc/PID/task` enters `THREADS` (threads created from then on are added by the kernel's
//! `task_newtask` program, which runs in the traced parent), so no thread falls between the two.

use aya::Ebpf;
use aya::maps::HashMap;
use llmprof_abi::{SSWITCH_PROGRAM, SWAKING_PROGRAM, SWNEW_PROGRAM, THREADS_MAP, TNEW_PROGRAM};

use super::error::CaptureError;
use super::object::{attach_tracepoints, map_err, map_mut};

/// The thread-state tracepoints: (category, name, program). `task_newtask` first, so a thread created while
/// the others attach is already in the map.
pub const SCHED_TRACEPOINTS: [(&str, &str, &str); 4] = [
    ("task", "task_newtask", TNEW_PROGRAM),
    ("sched", "sched_switch", SSWITCH_PROGRAM),
    ("sched", "sched_waking", SWAKING_PROGRAM),
    ("sched", "sched_wakeup_new", SWNEW_PROGRAM),
];

/// Loads and attaches [`SCHED_TRACEPOINTS`].
pub(super) fn attach(ebpf: &mut Ebpf) -> Result<(), CaptureError> {
    attach_tracepoints(ebpf, &SCHED_TRACEPOINTS)
}

/// Puts every thread of `pids` now listed in `/proc/PID/task` into the kernel's `THREADS` map. Returns how
/// many it put; a full map is an error here (the kernel program counts its own failed inserts as drops).
pub(super) fn fill_threads(ebpf: &mut Ebpf, pids: &[u32]) -> Result<usize, CaptureError> {
    let mut threads: HashMap<_, u32, u32> = map_mut(ebpf, THREADS_MAP)?;
    let mut n = 0;
    for &pid in pids {
        for tid in crate::sys::procfs::thread_ids(pid) {
            threads.insert(tid, pid, 0).map_err(map_err(THREADS_MAP))?;
            n += 1;
        }
    }
    Ok(n)
}

/// Puts `tids` of `pid` into `THREADS` (the calibration's own threads).
pub(super) fn put_threads(ebpf: &mut Ebpf, pid: u32, tids: &[u32]) -> Result<(), CaptureError> {
    let mut threads: HashMap<_, u32, u32> = map_mut(ebpf, THREADS_MAP)?;
    for &tid in tids {
        threads.insert(tid, pid, 0).map_err(map_err(THREADS_MAP))?;
    }
    Ok(())
}

/// Removes `pid`'s threads from `THREADS` (the calibration's own threads).
pub(super) fn forget_threads(ebpf: &mut Ebpf, pid: u32) -> Result<(), CaptureError> {
    let mut threads: HashMap<_, u32, u32> = map_mut(ebpf, THREADS_MAP)?;
    let mine: Vec<u32> = threads
        .iter()
        .filter_map(Result::ok)
        .filter(|(_, p)| *p == pid)
        .map(|(t, _)| t)
        .collect();
    for tid in mine {
        let _ = threads.remove(&tid);
    }
    Ok(())
}

/// Round trips per timed round of the thread-state calibration (each: two switches, two wakings, four
/// pipe syscalls; ~10–30 µs here, so 5 rounds traced and untraced take ~10–30 ms).
pub const PINGPONG_ROUND_TRIPS: u32 = 100;

/// A pipe ping-pong between the calling thread and a helper, both pinned to the CPU the caller is on, so
/// every hand-over is a context switch and a wakeup. `register` gets both tids before the timing starts
/// (the calibration puts them in `THREADS`). Returns the median over [`super::rounds::ROUNDS`] rounds of
/// the mean ns per round trip, or `None` when the pipes or the pinning fail. The caller's affinity is
/// restored.
pub fn median_ns_per_pingpong(trips: u32, register: impl FnOnce(&[u32])) -> Option<f64> {
    use std::time::Instant;
    let rounds = super::rounds::ROUNDS;
    let mut a = [0i32; 2];
    let mut b = [0i32; 2];
    // SAFETY: pipe2 writes two fds into each array; both are closed below.
    if unsafe { libc::pipe2(a.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return None;
    }
    // SAFETY: as above.
    if unsafe { libc::pipe2(b.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        // SAFETY: closing the fds just created.
        unsafe {
            libc::close(a[0]);
            libc::close(a[1]);
        }
        return None;
    }
    // SAFETY: a zeroed cpu_set_t is valid; sched_getaffinity fills it for the calling thread.
    let mut saved: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `saved` is a valid cpu_set_t of the size passed.
    let have_saved =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut saved) } == 0;
    // SAFETY: sched_getcpu has no arguments.
    let cpu = unsafe { libc::sched_getcpu() }.max(0) as usize;
    let pin = |cpu: usize| {
        // SAFETY: CPU_SET stays inside the zeroed set for cpu < CPU_SETSIZE; the call reads the set.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            if cpu < libc::CPU_SETSIZE as usize {
                libc::CPU_SET(cpu, &mut set);
            }
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
        }
    };
    let byte = |fd: i32, write: bool| -> bool {
        let mut c = 0u8;
        loop {
            // SAFETY: one byte to or from a valid local, on a pipe fd we own.
            let n = unsafe {
                if write {
                    libc::write(fd, (&raw const c).cast(), 1)
                } else {
                    libc::read(fd, (&raw mut c).cast(), 1)
                }
            };
            if n == 1 {
                return true;
            }
            if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return false;
        }
    };
    let total = trips as usize * rounds;
    let result = std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::channel();
        let helper = s.spawn(move || {
            let pinned = pin(cpu);
            // SAFETY: gettid has no arguments.
            let _ = tx.send((unsafe { libc::gettid() } as u32, pinned));
            for _ in 0..total {
                if !byte(a[0], false) || !byte(b[1], true) {
                    return;
                }
            }
        });
        let (helper_tid, helper_pinned) = rx.recv().ok()?;
        let pinned = pin(cpu);
        // SAFETY: gettid has no arguments.
        register(&[unsafe { libc::gettid() } as u32, helper_tid]);
        let mut times = Vec::with_capacity(rounds);
        let mut ok = pinned && helper_pinned;
        for _ in 0..rounds {
            let t = Instant::now();
            for _ in 0..trips {
                ok &= byte(a[1], true) && byte(b[0], false);
            }
            times.push(t.elapsed().as_nanos() as f64 / f64::from(trips.max(1)));
        }
        // SAFETY: closing the write end unblocks the helper if it still waits.
        unsafe { libc::close(a[1]) };
        let _ = helper.join();
        times.sort_by(f64::total_cmp);
        ok.then(|| times[rounds / 2])
    });
    // SAFETY: closing the fds created above (a[1] was closed in the scope when it ran).
    unsafe {
        libc::close(a[0]);
        libc::close(b[0]);
        libc::close(b[1]);
    }
    if have_saved {
        // SAFETY: restores the set read above.
        unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &saved) };
    }
    result
}
