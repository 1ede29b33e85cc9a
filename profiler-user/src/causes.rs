//! How an error is shown: its message, then each cause of its [`source`](std::error::Error::source) chain, once.
//!
//! Owns the two renderings every printer uses: [`lines`] for the terminal (`llmprof`'s `error: ...`, one cause per
//! line, so a verifier log stays readable) and [`one_line`] for places that hold one line (doctor details, trace
//! markers, serve's session reasons, logs). Error types of this crate keep their cause as `#[source]` and leave it
//! out of their message, so that these print it once; `{:#}` of an `anyhow::Error` prints the same chain. Errors of
//! other crates do not all follow that rule (nvml-wrapper's `LibloadingError` shows its libloading cause in its
//! message and returns it as its source), so a cause whose text the line already holds is not repeated.

use std::error::Error;

/// The error and its causes, one per line: `msg\n  caused by: cause\n  caused by: its cause`.
pub fn lines(e: &dyn Error) -> String {
    join(e, "\n  caused by: ")
}

/// The error and its causes on one line: `msg: cause: its cause`.
pub fn one_line(e: &dyn Error) -> String {
    join(e, ": ")
}

fn join(e: &dyn Error, sep: &str) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let text = c.to_string();
        if !s.contains(&text) {
            s.push_str(sep);
            s.push_str(&text);
        }
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::path::PathBuf;

    use super::*;
    use crate::attach::AttachError;
    use crate::capture::CaptureError;
    use crate::serve::ServeError;
    use crate::serve::auth::TokenError;

    fn assert_each_once(shown: &str, parts: &[&str]) {
        for p in parts {
            assert_eq!(
                shown.matches(p).count(),
                1,
                "{p:?} should appear once in:\n{shown}"
            );
        }
    }

    /// An error that shows its cause in its own message and also returns it as its source (as nvml-wrapper does).
    #[derive(Debug)]
    struct Embeds(io::Error);

    impl std::fmt::Display for Embeds {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "a libloading error occurred: {}", self.0)
        }
    }

    impl Error for Embeds {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn a_cause_already_in_the_message_is_not_repeated() {
        let e = Embeds(io::Error::other(
            "libnvidia-ml.so.1: cannot open shared object file",
        ));
        let shown = one_line(&e);
        assert_eq!(
            shown,
            "a libloading error occurred: libnvidia-ml.so.1: cannot open shared object file"
        );
        assert_each_once(&lines(&e), &["cannot open shared object file"]);
    }

    #[test]
    fn a_nested_cause_is_printed_once() {
        // As `llmprof attach` fails when the kernel refuses to attach a program: attach → capture (transparent)
        // → aya's program error (transparent) → the syscall → the OS error.
        let e = AttachError::Capture(CaptureError::Program {
            program: "sys_enter".into(),
            source: aya::programs::ProgramError::SyscallError(aya::sys::SyscallError {
                call: "bpf_link_create",
                io_error: io::Error::from_raw_os_error(libc::EPERM),
            }),
        });
        let shown = lines(&e);
        assert_eq!(
            shown,
            "could not load or attach eBPF program sys_enter\n  caused by: `bpf_link_create` failed\n  \
             caused by: Operation not permitted (os error 1)"
        );
        assert_each_once(
            &shown,
            &["sys_enter", "bpf_link_create", "Operation not permitted"],
        );
        assert_eq!(
            one_line(&e),
            "could not load or attach eBPF program sys_enter: `bpf_link_create` failed: Operation not permitted \
             (os error 1)"
        );
    }

    #[test]
    fn every_io_cause_of_the_front_ends_is_printed_once() {
        let disk_full = || io::Error::other("No space left on device");
        let errors: Vec<Box<dyn Error>> = vec![
            Box::new(AttachError::Output {
                path: PathBuf::from("x.perfetto-trace"),
                source: disk_full(),
            }),
            Box::new(AttachError::Capture(CaptureError::Tracefs(disk_full()))),
            Box::new(AttachError::Capture(CaptureError::Poll(disk_full()))),
            Box::new(ServeError::Token(TokenError::Read {
                what: "the token file",
                path: PathBuf::from("/etc/llmprof/token"),
                source: disk_full(),
            })),
            Box::new(ServeError::OutDir {
                path: PathBuf::from("traces"),
                source: disk_full(),
            }),
            Box::new(ServeError::Runtime(disk_full())),
            Box::new(crate::open::OpenError::Trace {
                path: PathBuf::from("x.perfetto-trace"),
                source: disk_full(),
            }),
            Box::new(llmprof_trace::report::ReportError::Io {
                path: PathBuf::from("x.perfetto-trace"),
                source: disk_full(),
            }),
        ];
        for e in &errors {
            let shown = lines(e.as_ref());
            assert_each_once(&shown, &["No space left on device"]);
            assert!(
                shown.contains("\n  caused by: No space left on device"),
                "{shown}"
            );
            assert_each_once(&one_line(e.as_ref()), &["No space left on device"]);
        }
    }
}
