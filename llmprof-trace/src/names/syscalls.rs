//! Names of syscall numbers, for slice names, summaries and `llmprof report`: the complete tables of the two
//! architectures llmprof builds for, and the set of calls that wait for work rather than do it.
//!
//! Owns the number → name tables (x86-64: the kernel's `arch/x86/entry/syscalls/syscall_64.tbl`; aarch64:
//! the generic table `include/uapi/asm-generic/unistd.h` with its 64-bit names, e.g. `newfstatat`), up to
//! `file_setattr` (469, Linux 6.17). A number missing from the table is shown as `syscall_<nr>`. The table of
//! the architecture llmprof was built for is used: the numbers come from the machine it traces.

mod aarch64;
mod x86_64;

/// The table of the architecture this llmprof runs on.
#[cfg(not(target_arch = "aarch64"))]
const TABLE: &[(u64, &str)] = x86_64::X86_64;
/// The table of the architecture this llmprof runs on.
#[cfg(target_arch = "aarch64")]
const TABLE: &[(u64, &str)] = aarch64::AARCH64;

/// Calls in which a thread waits for work (an event, a wakeup, a timer, a child, a connection) rather than
/// doing any: their time is idle time, shown apart from the calls that work. `futex` counts waits and wakes
/// together (one number), and is mostly waits.
pub const IDLE_WAITS: &[&str] = &[
    "accept",
    "accept4",
    "clock_nanosleep",
    "epoll_pwait",
    "epoll_pwait2",
    "epoll_wait",
    "futex",
    "futex_wait",
    "futex_waitv",
    "io_getevents",
    "io_pgetevents",
    "nanosleep",
    "pause",
    "poll",
    "ppoll",
    "pselect6",
    "rt_sigsuspend",
    "rt_sigtimedwait",
    "select",
    "wait4",
    "waitid",
];

/// Whether the syscall called `name` waits for work ([`IDLE_WAITS`]).
pub fn is_idle_wait(name: &str) -> bool {
    IDLE_WAITS.contains(&name)
}

fn lookup(table: &'static [(u64, &'static str)], nr: u64) -> std::borrow::Cow<'static, str> {
    match table.binary_search_by_key(&nr, |&(n, _)| n) {
        Ok(i) => std::borrow::Cow::Borrowed(table[i].1),
        Err(_) => std::borrow::Cow::Owned(format!("syscall_{nr}")),
    }
}

/// Name of syscall `nr` on this architecture (`syscall_<nr>` when not in the table).
pub fn name(nr: u64) -> std::borrow::Cow<'static, str> {
    lookup(TABLE, nr)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests {
    use super::aarch64::AARCH64;
    use super::x86_64::X86_64;
    use super::*;

    #[test]
    fn tables_are_sorted_and_known_numbers_resolve() {
        for t in [X86_64, AARCH64] {
            assert!(t.windows(2).all(|w| w[0].0 < w[1].0));
        }
        assert_eq!(lookup(X86_64, 35), "nanosleep");
        assert_eq!(lookup(X86_64, 202), "futex");
        assert_eq!(lookup(X86_64, 321), "bpf");
        assert_eq!(lookup(X86_64, 232), "epoll_wait");
        assert_eq!(lookup(X86_64, 469), "file_setattr");
        assert_eq!(lookup(X86_64, 336), "uprobe");
        assert_eq!(lookup(AARCH64, 63), "read");
        assert_eq!(lookup(AARCH64, 79), "newfstatat");
        assert_eq!(lookup(AARCH64, 280), "bpf");
        assert_eq!(lookup(AARCH64, 98), "futex");
        assert_eq!(name(9999), "syscall_9999");
    }

    #[test]
    fn every_number_of_both_tables_has_a_name() {
        // x86-64: 0..=336 (335/336: the uretprobe and uprobe calls of 6.11/6.16) and the common numbers from
        // 424 on; aarch64: 0..=243, 260..=294 and 424 on.
        let x86: Vec<u64> = (0..=336).chain(424..=469).collect();
        for nr in x86 {
            assert!(!lookup(X86_64, nr).starts_with("syscall_"), "x86-64 {nr}");
        }
        let arm: Vec<u64> = (0..=243).chain(260..=294).chain(424..=469).collect();
        for nr in arm {
            assert!(!lookup(AARCH64, nr).starts_with("syscall_"), "aarch64 {nr}");
        }
        for w in IDLE_WAITS {
            assert!(
                X86_64.iter().any(|(_, n)| n == w) || AARCH64.iter().any(|(_, n)| n == w),
                "{w}"
            );
        }
    }
}
