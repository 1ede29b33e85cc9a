//! The system plumbing llmprof shares between its parts where a traced process, or another local user, chooses
//! what llmprof touches.
//!
//! - [`target_file`]: the one way to read a file a target names (a path from its `/proc/PID/maps`, its
//!   executable, its perf map): regular files only, never a FIFO, socket or device; a size cap, a cap on the
//!   bytes read and a deadline, so a FIFO, a sparse giant or a FUSE file that never answers cannot hang or
//!   bloat llmprof.
//! - [`in_root`]: the one way to open, create or remove a file in another process's root directory
//!   (`openat2` with `RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS`): a symlink the target planted stays inside its
//!   root instead of leading llmprof's writes into the host's.
//!
//! Neither ever follows a path through the host's root on a target's behalf, and neither blocks the caller past
//! its deadline.

pub mod in_root;
pub mod target_file;
