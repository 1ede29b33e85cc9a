//! llmprof's own CPU as a cost to the target: what it takes from a target that needs every CPU it shares with
//! llmprof.
//!
//! The probes' cost runs in the target's context and is estimated per hit (`selfacct`); llmprof's own work
//! (draining the ring, symbolizing stacks, writing the trace) runs in its own threads. On an idle machine that
//! work takes idle CPU time and costs the target nothing; on CPUs the target keeps busy (a CPU-bound server
//! whose threads fill the machine) every nanosecond llmprof runs is one some other thread waited for. This
//! module measures that from /proc: the CPUs both may run on (`Cpus_allowed_list` of the target, llmprof's
//! own affinity), their idle time over the session (`/proc/stat`), and charges to the target the part of
//! llmprof's CPU that idle time could not have absorbed, in the target's share of the busy time of those
//! CPUs ([`displaced_ns`]). Reads /proc only; never touches the target.

use std::collections::BTreeSet;

/// The shared CPUs and their idle time when the window started.
#[derive(Clone, Debug)]
pub struct Window {
    /// CPUs both the target and llmprof may run on.
    shared: Vec<usize>,
    /// CPUs the target may run on.
    target_cpus: usize,
    /// Idle + iowait of the shared CPUs at the start, ns.
    idle_ns: u64,
}

/// What the window measured (for the summary and the report).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Contention {
    /// CPUs the target and llmprof share.
    pub shared_cpus: usize,
    /// Idle share of those CPUs over the window, %.
    pub idle_pct: f64,
    /// llmprof's CPU charged to the target, ns.
    pub charged_ns: f64,
}

impl Window {
    /// Starts a window for the target `pid` (None when its CPUs or /proc/stat cannot be read).
    pub fn start(pid: u32) -> Option<Self> {
        let target = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| allowed_cpus(&s))?;
        let own = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| allowed_cpus(&s))?;
        let shared: Vec<usize> = target.intersection(&own).copied().collect();
        let idle_ns = idle_ns(&std::fs::read_to_string("/proc/stat").ok()?, &shared)?;
        Some(Self {
            shared,
            target_cpus: target.len(),
            idle_ns,
        })
    }

    /// The contention over the window so far: `elapsed_ns` long, in which the target used `target_ns` and
    /// llmprof `llmprof_ns` of CPU.
    pub fn contention(&self, elapsed_ns: f64, target_ns: f64, llmprof_ns: f64) -> Option<Contention> {
        if self.shared.is_empty() {
            return Some(Contention::default());
        }
        let now = idle_ns(&std::fs::read_to_string("/proc/stat").ok()?, &self.shared)?;
        let idle = now.saturating_sub(self.idle_ns) as f64;
        let capacity = elapsed_ns * self.shared.len() as f64;
        // The target's CPU on the shared CPUs: all of it when it may run on no other.
        let target_here = target_ns * self.shared.len() as f64 / self.target_cpus.max(1) as f64;
        Some(Contention {
            shared_cpus: self.shared.len(),
            idle_pct: if capacity > 0.0 {
                (100.0 * idle / capacity).min(100.0)
            } else {
                0.0
            },
            charged_ns: displaced_ns(llmprof_ns, idle, capacity, target_here),
        })
    }
}

/// llmprof's CPU charged to the target: the part of `llmprof_ns` that the shared CPUs' idle time (`idle_ns`
/// of `capacity_ns`) could not have absorbed, in the target's share (`target_ns`) of the time the others
/// kept those CPUs busy. 0 when the CPUs had idle time to spare.
pub fn displaced_ns(llmprof_ns: f64, idle_ns: f64, capacity_ns: f64, target_ns: f64) -> f64 {
    let displaced = (llmprof_ns - idle_ns).max(0.0);
    let others_busy = (capacity_ns - idle_ns - llmprof_ns).max(0.0);
    if displaced <= 0.0 || others_busy <= 0.0 {
        return 0.0;
    }
    (displaced * (target_ns / others_busy).min(1.0)).min(llmprof_ns)
}

/// The CPUs of a `/proc/PID/status` file's `Cpus_allowed_list` (`0-3,8,10-11`).
fn allowed_cpus(status: &str) -> Option<BTreeSet<usize>> {
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?
        .trim();
    let mut out = BTreeSet::new();
    for part in list.split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b): (usize, usize) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
        if b < a || b - a > 65_536 {
            return None;
        }
        out.extend(a..=b);
    }
    Some(out)
}

/// Idle + iowait of `cpus` in a `/proc/stat` text, ns (its unit is USER_HZ ticks).
fn idle_ns(stat: &str, cpus: &[usize]) -> Option<u64> {
    let tick_ns = 1_000_000_000 / crate::sys::procfs::clock_ticks();
    let mut sum = 0u64;
    let mut found = 0;
    for l in stat.lines() {
        let Some(rest) = l.strip_prefix("cpu") else {
            continue;
        };
        let mut f = rest.split_whitespace();
        let Some(Ok(cpu)) = f.next().map(str::parse::<usize>) else {
            continue;
        };
        if !cpus.contains(&cpu) {
            continue;
        }
        // user nice system idle iowait ...
        let v: Vec<u64> = f.take(5).filter_map(|x| x.parse().ok()).collect();
        if v.len() < 5 {
            return None;
        }
        sum += (v[3] + v[4]) * tick_ns;
        found += 1;
    }
    (found == cpus.len()).then_some(sum)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests {
    use super::*;

    #[test]
    fn a_saturated_target_pays_for_llmprofs_cpu_and_an_idle_machine_does_not() {
        let s = 1e9;
        // 2 CPUs for 10 s, no idle time: llmprof's 2 s came out of the target, busy 18 s of the others' 18 s.
        assert_eq!(displaced_ns(2.0 * s, 0.0, 20.0 * s, 18.0 * s), 2.0 * s);
        // The target used half of what the others kept busy: half of it is the target's.
        assert_eq!(displaced_ns(2.0 * s, 0.0, 20.0 * s, 9.0 * s), 1.0 * s);
        // A target on one of two CPUs: the other CPU's idle time absorbed llmprof.
        assert_eq!(displaced_ns(2.0 * s, 8.0 * s, 20.0 * s, 10.0 * s), 0.0);
        // Partly: 0.5 s of idle time, 1.5 s displaced.
        assert_eq!(displaced_ns(2.0 * s, 0.5 * s, 20.0 * s, 17.5 * s), 1.5 * s);
        assert_eq!(displaced_ns(0.0, 0.0, 20.0 * s, 18.0 * s), 0.0);
    }

    #[test]
    fn cpu_lists_and_proc_stat_are_read() {
        let l = |s: &str| allowed_cpus(&format!("Name:\tx\nCpus_allowed_list:\t{s}\n"));
        assert_eq!(l("0-3,8,10-11").unwrap().len(), 7);
        assert_eq!(l("5").unwrap().into_iter().collect::<Vec<_>>(), [5]);
        assert!(l("3-1").is_none());
        assert!(allowed_cpus("Name: x\n").is_none());
        let stat = "cpu  10 0 10 500 5 0 0 0 0 0\ncpu0 5 0 5 200 2 0 0 0 0 0\ncpu1 5 0 5 300 3 0 0 0 0 0\n";
        let tick = 1_000_000_000 / crate::sys::procfs::clock_ticks();
        assert_eq!(idle_ns(stat, &[1]), Some(303 * tick));
        assert_eq!(idle_ns(stat, &[0, 1]), Some(505 * tick));
        assert_eq!(idle_ns(stat, &[2]), None, "a CPU /proc/stat does not list");
        let me = std::process::id();
        let w = Window::start(me).expect("this process's CPUs");
        assert!(!w.shared.is_empty(), "llmprof shares its own CPUs");
        let c = w.contention(1e9, 0.0, 0.0).unwrap();
        assert_eq!(c.charged_ns, 0.0);
    }
}
