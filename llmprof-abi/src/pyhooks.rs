//! The Python-hooks helper's interface with llmprof: the library `llmprof attach` injects into a running
//! CPython process (`libllmprof_pyhooks.so`, crate `llmprof-pyhooks`) to record engine steps, request
//! lifecycles and ranges of Python code through the engine probes (`llmprof_probe_step` & co., the same
//! records an instrumented engine writes).
//!
//! llmprof writes the configuration (JSON, [`PY_CONFIG_LEN`] bytes at most, NUL terminated) into
//! [`PY_CONFIG`], then calls [`PY_START`] (or [`PY_STOP`]) on a thread of the target through ptrace; both
//! return at once: the work runs on a thread of the helper that waits for the interpreter's lock. What came
//! of it is in [`PY_STATUS`] ([`PyHooksStatus`]), read from the target's memory: untrusted input, bounded.

/// File name of the helper library.
pub const PY_HELPER_LIB: &str = "libllmprof_pyhooks.so";
/// `int llmprof_py_start(void)`: installs the hooks the configuration names; 0 when the work started.
pub const PY_START: &str = "llmprof_py_start";
/// `int llmprof_py_stop(void)`: removes every hook installed; 0 when the work started.
pub const PY_STOP: &str = "llmprof_py_stop";
/// The configuration buffer (`char[PY_CONFIG_LEN]`).
pub const PY_CONFIG: &str = "llmprof_py_config";
/// Bytes of [`PY_CONFIG`].
pub const PY_CONFIG_LEN: usize = 4096;
/// The status ([`PyHooksStatus`]).
pub const PY_STATUS: &str = "llmprof_py_status";
/// Bytes of [`PyHooksStatus::message`].
pub const PY_MESSAGE_LEN: usize = 1024;

/// [`PyHooksStatus::state`]: nothing asked yet.
pub const PY_STATE_IDLE: u32 = 0;
/// Waiting for the interpreter, or running the installation.
pub const PY_STATE_INSTALLING: u32 = 1;
/// Hooks installed (`hooks` of them; the message says which).
pub const PY_STATE_INSTALLED: u32 = 2;
/// Nothing installed: the message says why (an unknown version, no Python, an error).
pub const PY_STATE_FAILED: u32 = 3;
/// Removing the hooks.
pub const PY_STATE_REMOVING: u32 = 4;
/// Every hook removed; the functions are the original objects again.
pub const PY_STATE_REMOVED: u32 = 5;

/// What the helper says of its work, laid out for a read from the target's memory. `seq` grows each time
/// `state` changes (the message is written before it).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PyHooksStatus {
    /// `PY_STATE_*`.
    pub state: u32,
    /// Changes of `state` so far.
    pub seq: u32,
    /// Hooks installed now.
    pub hooks: u32,
    /// Exceptions a hook caught in its own code (the hooked function's own exceptions are not counted: they
    /// go to its caller untouched).
    pub hook_errors: u32,
    /// Records written through the probes.
    pub records: u64,
    /// What one record call costs the thread that makes it, ns, the probe hit aside: measured in the target
    /// at installation (calls of an op the library ignores: no record, no probe); 0 before.
    pub call_ns: u64,
    /// Time the hooks' own Python work took in the target's threads, ns, measured there (each hook's work,
    /// the record calls apart: those are `records` × `call_ns`).
    pub hook_ns: u64,
    /// UTF-8, NUL padded: what was installed, or why not.
    pub message: [u8; PY_MESSAGE_LEN],
}

const _: () = assert!(core::mem::size_of::<PyHooksStatus>() == 40 + PY_MESSAGE_LEN);
