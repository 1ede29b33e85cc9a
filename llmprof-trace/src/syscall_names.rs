//! Names of x86-64 syscall numbers, for slice names and summaries.
//!
//! Owns a compact table of the common calls (numbers from the kernel's
//! `arch/x86/entry/syscalls/syscall_64.tbl`); anything else is shown as `syscall_<nr>`.

/// `(number, name)` pairs from `arch/x86/entry/syscalls/syscall_64.tbl`.
const TABLE: &[(u64, &str)] = &[
    (0, "read"),
    (1, "write"),
    (2, "open"),
    (3, "close"),
    (4, "stat"),
    (5, "fstat"),
    (6, "lstat"),
    (7, "poll"),
    (8, "lseek"),
    (9, "mmap"),
    (10, "mprotect"),
    (11, "munmap"),
    (12, "brk"),
    (13, "rt_sigaction"),
    (14, "rt_sigprocmask"),
    (16, "ioctl"),
    (17, "pread64"),
    (18, "pwrite64"),
    (19, "readv"),
    (20, "writev"),
    (21, "access"),
    (22, "pipe"),
    (23, "select"),
    (24, "sched_yield"),
    (25, "mremap"),
    (26, "msync"),
    (28, "madvise"),
    (32, "dup"),
    (33, "dup2"),
    (34, "pause"),
    (35, "nanosleep"),
    (39, "getpid"),
    (40, "sendfile"),
    (41, "socket"),
    (42, "connect"),
    (43, "accept"),
    (44, "sendto"),
    (45, "recvfrom"),
    (46, "sendmsg"),
    (47, "recvmsg"),
    (48, "shutdown"),
    (49, "bind"),
    (50, "listen"),
    (51, "getsockname"),
    (52, "getpeername"),
    (54, "setsockopt"),
    (55, "getsockopt"),
    (56, "clone"),
    (57, "fork"),
    (59, "execve"),
    (60, "exit"),
    (61, "wait4"),
    (62, "kill"),
    (72, "fcntl"),
    (73, "flock"),
    (74, "fsync"),
    (75, "fdatasync"),
    (78, "getdents"),
    (79, "getcwd"),
    (82, "rename"),
    (83, "mkdir"),
    (87, "unlink"),
    (89, "readlink"),
    (96, "gettimeofday"),
    (102, "getuid"),
    (186, "gettid"),
    (200, "tkill"),
    (202, "futex"),
    (213, "epoll_create"),
    (217, "getdents64"),
    (228, "clock_gettime"),
    (230, "clock_nanosleep"),
    (231, "exit_group"),
    (232, "epoll_wait"),
    (233, "epoll_ctl"),
    (234, "tgkill"),
    (257, "openat"),
    (262, "newfstatat"),
    (270, "pselect6"),
    (271, "ppoll"),
    (281, "epoll_pwait"),
    (284, "eventfd"),
    (288, "accept4"),
    (290, "eventfd2"),
    (291, "epoll_create1"),
    (293, "pipe2"),
    (295, "preadv"),
    (296, "pwritev"),
    (299, "recvmmsg"),
    (302, "prlimit64"),
    (307, "sendmmsg"),
    (318, "getrandom"),
    (319, "memfd_create"),
    (332, "statx"),
    (334, "rseq"),
    (424, "pidfd_send_signal"),
    (425, "io_uring_setup"),
    (426, "io_uring_enter"),
    (435, "clone3"),
    (441, "epoll_pwait2"),
];

/// Name of x86-64 syscall `nr` (`syscall_<nr>` when not in the table).
pub fn name(nr: u64) -> std::borrow::Cow<'static, str> {
    match TABLE.binary_search_by_key(&nr, |&(n, _)| n) {
        Ok(i) => std::borrow::Cow::Borrowed(TABLE[i].1),
        Err(_) => std::borrow::Cow::Owned(format!("syscall_{nr}")),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests {
    #[test]
    fn table_is_sorted_and_known_numbers_resolve() {
        assert!(super::TABLE.windows(2).all(|w| w[0].0 < w[1].0));
        assert_eq!(super::name(35), "nanosleep");
        assert_eq!(super::name(202), "futex");
        assert_eq!(super::name(9999), "syscall_9999");
    }
}
