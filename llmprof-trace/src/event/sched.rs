//! Thread states: the scheduler events of the traced threads as the event stream carries them, and the one
//! decoding of the kernel's `prev_state` that the Perfetto sink and `llmprof report` share.
//!
//! Owns the model only (pure: capture decodes the kernel records into these, the sink writes them in
//! Perfetto's ftrace encoding, the report reads them back). A thread is Running from the switch that puts
//! it on a CPU to the switch that takes it off; then Runnable when it was preempted (`prev_state` 0 or the
//! preempted bit), else blocked (Sleeping `S`, Uninterruptible `D`, ...) until a wakeup makes it Runnable;
//! Runnable until it is switched in again. This is what Perfetto's trace processor computes into its
//! `thread_state` table from the same events.

/// A context switch involving at least one traced thread (`sched:sched_switch`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SchedSwitch {
    /// CPU of the switch.
    pub cpu: u32,
    /// Thread going off the CPU.
    pub prev_tid: u32,
    /// Its tgid (traced or not).
    pub prev_pid: u32,
    /// Whether it belongs to a traced process (else the next thread does).
    pub prev_traced: bool,
    /// Its `comm`.
    pub prev_comm: String,
    /// Its priority (kernel scale, 120 = nice 0).
    pub prev_prio: i32,
    /// The kernel's `prev_state` (see [`BlockState::from_prev_state`]).
    pub prev_state: i64,
    /// Thread coming on the CPU (0: idle).
    pub next_tid: u32,
    /// Its tgid when it belongs to a traced process, else 0.
    pub next_pid: u32,
    /// Its `comm`.
    pub next_comm: String,
    /// Its priority.
    pub next_prio: i32,
    /// Off-CPU stack id of the thread going off (the stack sampler's; `None` until it provides one).
    pub stack_id: Option<i64>,
}

/// A traced thread made runnable (`sched:sched_waking` / `sched:sched_wakeup_new`). The event's own
/// pid/tid are the woken thread's (like `tid`/`pid` here).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SchedWake {
    /// CPU the waker ran on.
    pub cpu: u32,
    /// The waker: the task current when the wakeup happened (in interrupt context, the interrupted task).
    pub waker_tid: u32,
    /// Its tgid (traced or not).
    pub waker_pid: u32,
    /// The woken thread.
    pub tid: u32,
    /// Its tgid.
    pub pid: u32,
    /// Its `comm`.
    pub comm: String,
    /// Its priority.
    pub prio: i32,
    /// The CPU it was queued on.
    pub target_cpu: i32,
    /// The first wakeup of a new thread (`sched_wakeup_new`).
    pub new_task: bool,
    /// The waker was an interrupt (hard or soft), not the task named by the event's tid.
    pub in_interrupt: bool,
    /// The tracepoint's `common_flags`.
    pub common_flags: u32,
}

/// `TASK_REPORT_MAX` on kernels 4.14+: set in `prev_state` when the thread was preempted (still runnable).
pub const PREEMPTED: i64 = 0x100;

/// What a thread going off the CPU does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BlockState {
    /// Still runnable (preempted or yielded): waiting for a CPU.
    Runnable,
    /// Interruptible sleep (`S`): waiting for an event (I/O, a lock, a timer, a message).
    Sleeping,
    /// Uninterruptible sleep (`D`), usually disk I/O or a kernel lock.
    Uninterruptible,
    /// Idle kernel wait (`I`, TASK_IDLE).
    Idle,
    /// Stopped, traced, dead or zombie: not coming back by a wakeup.
    Other,
}

impl BlockState {
    /// Decodes the TASK_REPORT value of a 4.14+ kernel's `sched_switch` `prev_state`.
    pub fn from_prev_state(state: i64) -> Self {
        if state & PREEMPTED != 0 || state & 0xff == 0 {
            return Self::Runnable;
        }
        if state & 0x01 != 0 {
            Self::Sleeping
        } else if state & 0x02 != 0 {
            Self::Uninterruptible
        } else if state & 0x80 != 0 {
            Self::Idle
        } else {
            Self::Other
        }
    }

    /// Whether a thread in this state is off the CPU waiting for a wakeup (blocked).
    pub fn is_blocked(self) -> bool {
        matches!(self, Self::Sleeping | Self::Uninterruptible | Self::Idle)
    }
}

/// A kernel `comm` as text (the bytes up to the first NUL; invalid UTF-8 replaced).
pub fn comm_str(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prev_state_decodes_like_the_kernels_print_format() {
        assert_eq!(BlockState::from_prev_state(0), BlockState::Runnable);
        assert_eq!(BlockState::from_prev_state(PREEMPTED), BlockState::Runnable);
        assert_eq!(BlockState::from_prev_state(1), BlockState::Sleeping);
        assert_eq!(BlockState::from_prev_state(2), BlockState::Uninterruptible);
        assert_eq!(BlockState::from_prev_state(0x80), BlockState::Idle);
        assert_eq!(BlockState::from_prev_state(0x10), BlockState::Other);
        assert!(BlockState::Sleeping.is_blocked() && !BlockState::Runnable.is_blocked());
        assert_eq!(comm_str(b"llmserve\0\0\0"), "llmserve");
    }
}
