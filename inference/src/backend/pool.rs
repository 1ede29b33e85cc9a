//! The CPU backend's compute pool: a fork-join pool whose workers spin briefly, then park on a futex.
//!
//! Owns the compute threads (`threads - 1` workers; the calling thread is the last member and computes too) and
//! the hand-off of one parallel loop at a time: the caller publishes a job (a task count and a closure over the
//! task index), and every thread that joins takes tasks from a shared counter until none is left. The caller
//! never waits for a worker that has not joined yet (on a shared machine a worker may not be scheduled for
//! milliseconds; the caller then runs every task itself, as rayon's work stealing would): once no task is left
//! it closes the job, and waits only for the workers inside it (the closure borrows the caller's stack, so no
//! worker may still hold it); a worker that comes late sees the job closed and never touches it. Waiting is a bounded spin on an atomic ([`SPIN`], no system call: the gaps between the loops of one
//! forward pass are microseconds) and then `std::thread::park` (a futex wait); publishing a job `unpark`s every
//! worker, which is a plain atomic store unless that worker is actually parked. An idle pool therefore makes no
//! system calls at all, and a busy one about two futex calls per worker per step (the worker parks between
//! steps while the engine samples and streams).
//!
//! Replaces rayon here: rayon's idle workers call `sched_yield` in a loop before sleeping (~26,000 calls in 9 s of
//! decode) and its `join` tree costs more hand-offs than one flat loop per matrix group. Never nests
//! (`run` takes `&mut self`, so a task cannot start another job) and never blocks on anything but its tasks.

use std::cell::UnsafeCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

/// How long a waiting thread spins before it parks. Longer than the gaps inside a forward pass (single-threaded
/// norm/RoPE work and a step's attention bookkeeping, more when other processes share the cores), short next to
/// a step, so workers park between steps and an idle engine costs nothing. Measured on a quiet machine
/// (docs/lab/engine-cpu.md): 50 µs parked ~7 times per token (13.5–15.5 system calls per token at concurrency 1,
/// 5.3–10.3 at 8); 200 µs, 5.4–7.8 and 1.6–3.7, at the same tok/s.
pub const SPIN: Duration = Duration::from_micros(200);

/// Spin iterations between two clock reads (a clock read is a vDSO call, no syscall, but not free).
const SPINS_PER_CLOCK_READ: u32 = 64;

/// A job as the workers see it: a type-erased pointer to the caller's closure and its task count.
#[derive(Clone, Copy)]
struct Job {
    /// The caller's closure, lifetime erased; valid until every worker has acknowledged the job.
    f: *const (dyn Fn(usize) + Sync),
    n_tasks: usize,
}

/// `state`: the job generation in the high 32 bits, [`CLOSED`], and the number of workers inside the job below.
const GEN_SHIFT: u32 = 32;
/// Set in `state` once the job's tasks are all taken: no worker may join it any more.
const CLOSED: u64 = 1 << 31;
/// Mask of the count of workers inside the job.
const ACTIVE: u64 = CLOSED - 1;

/// Shared between the caller and the workers.
struct Shared {
    /// Generation, closed bit and workers inside (see [`GEN_SHIFT`]). The caller writes `job` and `waiter`, then
    /// publishes a new generation (Release); a worker joins by incrementing the count while the job is open
    /// (compare-and-swap, Acquire) and only then reads `job`.
    state: AtomicU64,
    /// The current job; written only by the caller while the previous one is closed with no worker inside.
    job: UnsafeCell<Job>,
    /// The caller to wake when the last worker leaves a closed job; written with `job`.
    waiter: UnsafeCell<Option<Thread>>,
    /// Next task index to take.
    next: AtomicUsize,
    /// Set when the pool is dropped.
    shutdown: AtomicBool,
    /// Jobs run in parallel so far (for tests and metrics).
    jobs: AtomicU64,
    /// Times a waiting thread (worker or caller) parked.
    parks: AtomicU64,
}

// SAFETY: `job` and `waiter` are written only inside `ComputePool::run` (`&mut self`: one publisher), and only
// while the previous job is closed with no worker inside, i.e. while no worker reads them; a worker reads them
// only after joining an open job (its compare-and-swap Acquire pairs with the caller's Release publication)
// and before leaving it. The closure behind `job.f` is `Sync`.
unsafe impl Sync for Shared {}
// SAFETY: as above; `Shared` holds no thread-bound data (the raw pointer is only dereferenced under that protocol).
unsafe impl Send for Shared {}

impl Shared {
    /// Takes and runs tasks of the current job until none is left.
    fn drain(&self, job: Job) {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= job.n_tasks {
                break;
            }
            // SAFETY: the caller of `run` keeps the closure alive until the job is closed and no worker is inside
            // it, and this thread leaves the job only after `drain` returns.
            unsafe { (*job.f)(i) };
        }
    }
}

/// Spins on `done` for [`SPIN`], then parks until it holds (spurious wake-ups re-check). Returns whether it
/// parked.
fn wait_until(done: impl Fn() -> bool, parks: &AtomicU64) -> bool {
    let start = Instant::now();
    let mut n = 0u32;
    loop {
        if done() {
            return false;
        }
        std::hint::spin_loop();
        n += 1;
        if n.is_multiple_of(SPINS_PER_CLOCK_READ) && start.elapsed() >= SPIN {
            break;
        }
    }
    parks.fetch_add(1, Ordering::Relaxed);
    while !done() {
        std::thread::park();
    }
    true
}

/// The compute pool.
pub struct ComputePool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for ComputePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ComputePool")
            .field("threads", &self.threads())
            .finish()
    }
}

/// A pool's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolStats {
    /// Parallel jobs run.
    pub jobs: u64,
    /// Times a waiting thread parked (each park is a futex wait, each wake of a parked thread a futex wake).
    pub parks: u64,
}

impl ComputePool {
    /// A pool of `threads` compute threads in all (the caller of [`run`](Self::run) counts as one; at least 1),
    /// workers named `{name}-{i}`.
    pub fn new(threads: usize, name: &str) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            state: AtomicU64::new(CLOSED),
            job: UnsafeCell::new(Job {
                f: &|_| {},
                n_tasks: 0,
            }),
            waiter: UnsafeCell::new(None),
            next: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            jobs: AtomicU64::new(0),
            parks: AtomicU64::new(0),
        });
        let mut pool = ComputePool {
            shared,
            workers: Vec::new(),
        };
        for i in 1..threads.max(1) {
            let s = Arc::clone(&pool.shared);
            let h = std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || worker(&s))?;
            pool.workers.push(h);
        }
        Ok(pool)
    }

    /// Compute threads, the caller included.
    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Counters so far.
    pub fn stats(&self) -> PoolStats {
        PoolStats {
            jobs: self.shared.jobs.load(Ordering::Relaxed),
            parks: self.shared.parks.load(Ordering::Relaxed),
        }
    }

    /// Runs `f(0) .. f(n_tasks - 1)` on the pool's threads (the caller's included), each index once; returns when
    /// all have run.
    pub fn run(&mut self, n_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        if self.workers.is_empty() || n_tasks <= 1 {
            (0..n_tasks).for_each(f);
            return;
        }
        let s = &*self.shared;
        // SAFETY: lifetime erasure only; the pointer is dereferenced by workers solely between seeing this job's
        // generation and acknowledging it, and this function does not return before all have acknowledged.
        let f_static: *const (dyn Fn(usize) + Sync + 'static) = unsafe { std::mem::transmute(f) };
        // SAFETY: the previous job is closed with no worker inside (the previous `run` waited for that), so no
        // worker reads `job` or `waiter` now, and `&mut self` makes this the only publisher.
        unsafe {
            *s.job.get() = Job { f: f_static, n_tasks };
            let w = &mut *s.waiter.get();
            if w.as_ref().is_none_or(|t| t.id() != std::thread::current().id()) {
                *w = Some(std::thread::current());
            }
        }
        s.next.store(0, Ordering::Relaxed);
        let generation = (s.state.load(Ordering::Relaxed) >> GEN_SHIFT).wrapping_add(1);
        s.state.store(generation << GEN_SHIFT, Ordering::Release);
        for h in &self.workers {
            h.thread().unpark();
        }
        s.jobs.fetch_add(1, Ordering::Relaxed);
        // SAFETY: reading the job this thread just wrote.
        s.drain(unsafe { *s.job.get() });
        // Every task is taken: close the job to late workers, wait for those still inside.
        let prev = s.state.fetch_or(CLOSED, Ordering::AcqRel);
        if prev & ACTIVE != 0 {
            wait_until(|| s.state.load(Ordering::Acquire) & ACTIVE == 0, &s.parks);
        }
    }

    /// Splits `data` into consecutive chunks of `chunk` elements (the last may be shorter) and runs
    /// `f(i, chunk_i)` for every chunk on the pool.
    pub fn chunks_mut<T: Send>(&mut self, data: &mut [T], chunk: usize, f: impl Fn(usize, &mut [T]) + Sync) {
        let chunk = chunk.max(1);
        let len = data.len();
        let n = len.div_ceil(chunk);
        let base = SendPtr(data.as_mut_ptr());
        self.run(n, &|i| {
            let start = i * chunk;
            let end = (start + chunk).min(len);
            let p = &base;
            // SAFETY: chunk `i` is `data[start..end]`, within `data` (end <= len) and disjoint from every other
            // chunk; each index runs once, and `data` stays mutably borrowed for the whole `run`.
            let s = unsafe { std::slice::from_raw_parts_mut(p.0.add(start), end - start) };
            f(i, s);
        });
    }
}

/// A raw pointer shared across the pool's threads for disjoint writes.
struct SendPtr<T>(*mut T);
// SAFETY: used only to build disjoint sub-slices of one `&mut [T]` (see `chunks_mut`), with `T: Send`.
unsafe impl<T: Send> Sync for SendPtr<T> {}

fn worker(s: &Shared) {
    let mut seen = 0u64;
    loop {
        wait_until(
            || s.state.load(Ordering::Acquire) >> GEN_SHIFT != seen || s.shutdown.load(Ordering::Acquire),
            &s.parks,
        );
        if s.shutdown.load(Ordering::Acquire) {
            return;
        }
        // Join the job unless it is already closed.
        let mut cur = s.state.load(Ordering::Acquire);
        let joined = loop {
            seen = cur >> GEN_SHIFT;
            if cur & CLOSED != 0 {
                break false;
            }
            match s
                .state
                .compare_exchange_weak(cur, cur + 1, Ordering::Acquire, Ordering::Acquire)
            {
                Ok(_) => break true,
                Err(now) => cur = now,
            }
        };
        if !joined {
            continue;
        }
        // SAFETY: this worker joined an open job (Acquire, after the caller's Release publication of `job` and
        // `waiter`), and the caller does not write them again before this worker leaves below.
        let (job, waiter) = unsafe { (*s.job.get(), (*s.waiter.get()).clone()) };
        s.drain(job);
        let prev = s.state.fetch_sub(1, Ordering::AcqRel);
        if prev & CLOSED != 0
            && prev & ACTIVE == 1
            && let Some(t) = waiter
        {
            // The caller may be parked waiting for this worker: a plain atomic store unless it is (then one
            // futex wake).
            t.unpark();
        }
    }
}

impl Drop for ComputePool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Release);
        for h in self.workers.drain(..) {
            h.thread().unpark();
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_once_on_several_threads() {
        let mut pool = ComputePool::new(3, "test-pool").expect("pool");
        assert_eq!(pool.threads(), 3);
        for n in [0usize, 1, 2, 7, 100, 1000] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool.run(n, &|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "n = {n}");
        }
    }

    #[test]
    fn chunks_write_disjoint_parts() {
        let mut pool = ComputePool::new(2, "test-pool").expect("pool");
        let mut v = vec![0usize; 103];
        pool.chunks_mut(&mut v, 10, |i, c| c.iter_mut().for_each(|x| *x = i + 1));
        assert_eq!(v[0], 1);
        assert_eq!(v[99], 10);
        assert_eq!(v[102], 11);
    }

    #[test]
    fn idle_workers_park() {
        let mut pool = ComputePool::new(2, "test-pool").expect("pool");
        pool.run(4, &|_| {});
        // Once the spin budget has passed, the worker is parked: it counted the park before sleeping.
        // (Up to 20 s for the worker to be scheduled at all on a loaded machine; normally the first check.)
        let parked = (0..20_000).any(|_| {
            std::thread::sleep(Duration::from_millis(1));
            pool.stats().parks >= 1
        });
        assert!(parked, "an idle worker never parked: {:?}", pool.stats());
        // A parked worker still takes part in the next job.
        let hits = AtomicUsize::new(0);
        pool.run(64, &|_| {
            hits.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(hits.load(Ordering::Relaxed), 64);
        assert_eq!(pool.stats().jobs, 2);
    }
}
