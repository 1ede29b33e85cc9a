//! llmprof's own diagnostic log: the `log` records of every module (`log::debug!` and friends) on stderr,
//! each with the time since start, when `LLMPROF_LOG` names a level (`error`, `warn`, `info`, `debug`,
//! `trace`). Off by default: what a user must read is printed by the subcommands themselves; this is for
//! finding out where time goes (start-up) or why a probe was skipped.

use std::io::Write;
use std::sync::OnceLock;
use std::time::Instant;

/// The environment variable that turns the log on.
pub const LOG_ENV: &str = "LLMPROF_LOG";

struct StderrLog {
    start: Instant,
}

impl log::Log for StderrLog {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let ms = self.start.elapsed().as_secs_f64() * 1e3;
        // One write per line, so that lines of several threads do not interleave; a failed write is lost.
        let line = format!(
            "llmprof [{ms:9.1} ms] {:5} {}: {}\n",
            record.level(),
            record.target(),
            record.args()
        );
        let _ = std::io::stderr().write_all(line.as_bytes());
    }

    fn flush(&self) {}
}

static LOGGER: OnceLock<StderrLog> = OnceLock::new();

/// Installs the logger when [`LOG_ENV`] names a level; otherwise every record is dropped at no cost.
/// Returns the level, or `None` when the log stays off (unset, empty or unknown value).
pub fn init_from_env() -> Option<log::LevelFilter> {
    let level: log::LevelFilter = std::env::var(LOG_ENV).ok()?.trim().parse().ok()?;
    let logger = LOGGER.get_or_init(|| StderrLog {
        start: Instant::now(),
    });
    log::set_logger(logger).ok()?;
    log::set_max_level(level);
    Some(level)
}
