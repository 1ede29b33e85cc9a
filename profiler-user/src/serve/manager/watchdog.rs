//! Sessions that outlive their duration: asked to stop, then abandoned (see the module docs of
//! [`super`]).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::super::metrics::Metrics;
use super::{END_ABANDONED, Manager, State, lock, now_rfc3339};

impl Manager {
    /// Sessions past their duration plus [`crate::watchdog::START_GRACE`] are asked to stop; past
    /// [`crate::watchdog::END_GRACE`] more, they are abandoned (failed, slot freed).
    pub(super) fn watchdog(&self) {
        use crate::watchdog::{END_GRACE, START_GRACE};
        let mut inner = lock(&self.inner);
        for s in inner.sessions.values_mut() {
            if s.view.state != State::Running {
                continue;
            }
            let due = START_GRACE + Duration::from_secs_f64(s.view.duration_s);
            let age = s.created.elapsed();
            if age >= due + END_GRACE {
                s.view.state = State::Failed;
                s.view.reason = Some(format!(
                    "{END_ABANDONED} ({:.0} s after it started, {:?} + {:?} of grace): something the target set up \
                     keeps it busy; its slot is freed, its thread left behind",
                    age.as_secs_f64(),
                    START_GRACE,
                    END_GRACE
                ));
                s.view.end_reason = Some(END_ABANDONED.to_owned());
                s.view.ended_at = Some(now_rfc3339());
                s.ended = Some(Instant::now());
                Metrics::inc(&self.metrics.sessions_abandoned);
                eprintln!(
                    "llmprof serve: session {} {END_ABANDONED}: abandoned, its slot freed",
                    s.view.id
                );
            } else if age >= due && !s.stop.load(Ordering::Acquire) {
                s.stop_reason.set(END_ABANDONED);
                s.stop.store(true, Ordering::Release);
            }
        }
    }
}
