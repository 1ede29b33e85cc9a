//! Exit codes of `llmprof`, as `--help` documents them.
//!
//! Owns the numbers only: the binary maps each subcommand's errors to them, and `doctor` gives each failed check
//! the code of what it found. It never prints and never exits.

/// Success.
pub const OK: i32 = 0;
/// Any other failure.
pub const FAILURE: i32 = 1;
/// Bad command line (clap's own code).
pub const USAGE: i32 = 2;
/// Not root / missing capabilities.
pub const NOT_ROOT: i32 = 3;
/// The pid does not exist.
pub const NO_PROCESS: i32 = 4;
/// The kernel lacks something llmprof needs (tracepoint, tracefs) or refused the programs.
pub const KERNEL: i32 = 5;
/// The engine speaks another probe ABI version.
pub const ABI_MISMATCH: i32 = 6;
/// The trace file could not be written.
pub const OUTPUT: i32 = 7;
/// `--gpu-kernels on`: GPU kernels cannot be recorded in the target (no libcuda, statically linked, ptrace
/// refused, the target exited during the injection, CUPTI unavailable or taken).
pub const GPU_KERNELS: i32 = 8;
/// The session did not end within its duration plus the grace for start-up and end (`llmprof::watchdog`).
pub const STUCK: i32 = 9;
/// `--py-range`: no process of the traced tree took the Python hooks (not CPython 3.10 to 3.13, an
/// interpreter without its C API, the module not imported, ptrace refused, the target exited during it).
pub const PYTHON_HOOKS: i32 = 10;
