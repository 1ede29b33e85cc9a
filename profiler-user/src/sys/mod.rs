//! The system plumbing llmprof shares between its parts: the one reader of each thing a traced process, or
//! another local user, chooses what llmprof touches through.
//!
//! - [`target_file`]: the one way to read a file a target names (a path from its `/proc/PID/maps`, its
//!   executable, its perf map): regular files only, never a FIFO, socket or device; a size cap, a cap on the
//!   bytes read and a deadline, so a FIFO, a sparse giant or a FUSE file that never answers cannot hang or
//!   bloat llmprof.
//! - [`elf`]: the ELF images of such files (symbol tables, file offsets), through [`target_file`], with one
//!   error type.
//! - [`in_root`]: the one way to open, create or remove a file in another process's root directory
//!   (`openat2` with `RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS`): a symlink the target planted stays inside its
//!   root instead of leading llmprof's writes into the host's.
//! - `/proc` readers: [`procfs`] (a process's name, command line, threads, liveness), [`maps`] (its memory
//!   map), [`tcp`] (TCP tables and socket fds), [`ns`] (namespaces).
//! - [`http`]: the one HTTP client (a GET bounded by one deadline and a byte cap).
//!
//! None ever follows a path through the host's root on a target's behalf, and none blocks the caller past
//! its deadline or reads without a cap.

pub mod elf;
pub mod http;
pub mod in_root;
pub mod maps;
pub mod ns;
pub mod procfs;
pub mod target_file;
pub mod tcp;
