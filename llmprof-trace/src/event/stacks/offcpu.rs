//! Off-CPU stacks: where a traced thread was when it blocked (the stack the `sched_switch` program took as
//! the thread left the CPU asleep), and the one-line label the trace and the report show for it.
//!
//! The label is the stack from the block point outwards (innermost first, `←` read as "called from"),
//! without the scheduler's and the tracer's own frames at the top (every blocking stack starts in
//! `__schedule`) nor the syscall entry glue, cut at [`LABEL_FRAMES`] frames. The Perfetto sink writes it as
//! a `sched_blocked_reason` (the trace processor's `thread_state.blocked_function`, Perfetto UI's "Blocked
//! function" of a Sleeping or Uninterruptible state) and the report groups blocked time by it. Pure: no
//! capture here.

use crate::event::stacks::{Frame, FrameKind};

/// Most frames in a label (deeper stacks end with `…`): the block point, the syscall, the library call and
/// ~6 callers of the program's own, the part a reader needs to tell one wait from another.
pub const LABEL_FRAMES: usize = 12;
/// Between two frames of a label: the left one was called from the right one.
pub const SEPARATOR: &str = " ← ";

/// Kernel frames of the switch itself, above the function that blocked: the scheduler and the tracing
/// path that runs the program (kernel/sched/core.c, kernel/trace/bpf_trace.c, include/trace/perf.h).
const SWITCH_PREFIXES: [&str; 9] = [
    "__schedule",
    "schedule",
    "preempt_schedule",
    "__traceiter_",
    "perf_trace_",
    "trace_call_bpf",
    "bpf_",
    "__bpf_",
    "__perf_",
];
/// Kernel frames of the syscall entry (arch/x86/entry): between the syscall's function and user space.
const ENTRY_PREFIXES: [&str; 4] = ["entry_SYSCALL", "do_syscall_64", "x64_sys_call", "syscall_exit"];

fn is_switch_frame(f: &Frame) -> bool {
    f.kind == FrameKind::Kernel && SWITCH_PREFIXES.iter().any(|p| f.function.starts_with(p))
}

fn is_entry_frame(f: &Frame) -> bool {
    f.kind == FrameKind::Kernel && ENTRY_PREFIXES.iter().any(|p| f.function.starts_with(p))
}

/// The frames a label names: the stack (innermost first) without the switch's own frames at the top and
/// the syscall entry glue.
pub fn blocking_frames<F: AsRef<Frame>>(frames: &[F]) -> impl Iterator<Item = &Frame> {
    frames
        .iter()
        .map(AsRef::as_ref)
        .skip_while(|f| is_switch_frame(f))
        .filter(|f| !is_entry_frame(f))
}

/// A function name without its trailing generic arguments (`call_once<(), {closure}>` → `call_once`); a
/// qualified path (`<Box<F> as FnOnce>::call_once`) stays whole.
fn short_name(name: &str) -> &str {
    match name.find('<') {
        Some(i) if i > 0 && name.ends_with('>') => &name[..i],
        _ => name,
    }
}

/// The one-line label of an off-CPU stack (innermost first), e.g.
/// `do_nanosleep ← hrtimer_nanosleep ← __x64_sys_clock_nanosleep ← clock_nanosleep ← nap ← main`;
/// `(no stack)` when nothing is left.
pub fn label<F: AsRef<Frame>>(frames: &[F]) -> String {
    let mut out = String::new();
    for (i, f) in blocking_frames(frames).enumerate() {
        if i == LABEL_FRAMES {
            out.push_str(SEPARATOR);
            out.push('…');
            break;
        }
        if i > 0 {
            out.push_str(SEPARATOR);
        }
        out.push_str(short_name(&f.function));
    }
    if out.is_empty() {
        out.push_str("(no stack)");
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::event::stacks::{KERNEL_MODULE, UNKNOWN};

    fn k(name: &str) -> Arc<Frame> {
        Arc::new(Frame::named(name, KERNEL_MODULE, FrameKind::Kernel))
    }
    fn u(name: &str) -> Arc<Frame> {
        Arc::new(Frame::named(name, UNKNOWN, FrameKind::Native))
    }

    #[test]
    fn the_label_starts_where_the_thread_blocked_and_skips_the_entry_glue() {
        let stack = vec![
            k("__bpf_trace_sched_switch"),
            k("__traceiter_sched_switch"),
            k("__schedule"),
            k("schedule"),
            k("do_nanosleep"),
            k("hrtimer_nanosleep"),
            k("__x64_sys_clock_nanosleep"),
            k("do_syscall_64"),
            k("entry_SYSCALL_64_after_hwframe"),
            u("clock_nanosleep"),
            u("nap"),
            u("main"),
        ];
        assert_eq!(
            label(&stack),
            "do_nanosleep ← hrtimer_nanosleep ← __x64_sys_clock_nanosleep ← clock_nanosleep ← nap ← main"
        );
        // A user function named like a scheduler frame stays (only kernel frames are skipped).
        assert_eq!(label(&[u("schedule_work")]), "schedule_work");
        assert_eq!(label::<Arc<Frame>>(&[]), "(no stack)");
        let deep: Vec<Arc<Frame>> = (0..40).map(|i| u(&format!("f{i}"))).collect();
        let l = label(&deep);
        assert!(l.ends_with("f11 ← …"), "{l}");
        assert_eq!(
            label(&[
                u("call_once<(), {closure}>"),
                u("<Box<F> as FnOnce<()>>::call_once")
            ]),
            "call_once ← <Box<F> as FnOnce<()>>::call_once"
        );
    }
}
