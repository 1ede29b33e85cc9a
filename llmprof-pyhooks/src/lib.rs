//! `libllmprof_pyhooks.so`: the helper library `llmprof attach` injects into a running CPython process to hook
//! Python code — vLLM's engine (steps, request lifecycles, KV-cache use) and any function the user names
//! (`--py-range MODULE:QUALNAME`) — through the engine probes an instrumented engine calls (the same
//! `llmprof_probe_*` NOP5 functions, exported by this library, the same records). llmprof attaches its engine
//! uprobes to this library as it would to llmserve.
//!
//! Owns the exported functions of `llmprof_abi::pyhooks` and the records the hooks hand it:
//! - [`llmprof_py_start`] / [`llmprof_py_stop`] (called by llmprof through ptrace, on whatever thread it
//!   borrowed): they only start a thread of the helper and return. That thread waits for the interpreter's
//!   lock (`PyGILState_Ensure`: the borrowed thread may hold it), runs the hooks' Python source (`hooks.py`,
//!   embedded) with the configuration llmprof wrote into [`llmprof_py_config`], and releases the lock. The
//!   Python side installs or removes wrappers and reports through [`llmprof_py_report`]; what came of it is in
//!   [`llmprof_py_status`] for llmprof to read.
//! - the functions the wrappers call through `ctypes` ([`llmprof_py_step`], [`llmprof_py_request`],
//!   [`llmprof_py_range`]): each builds one record ([`records`]) on the stack and calls its probe.
//!
//! It never blocks a thread of the target other than its own, never prints into the target's streams (the
//! Python source catches every exception of its own), and holds the interpreter's lock only while installing
//! or removing. The C API it needs is looked up at run time (`dlsym`): a process without it (not Python, or
//! a Python that does not export its C API) is reported, not crashed.

pub mod records;

mod python;

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use llmprof_abi::pyhooks::{
    PY_CONFIG_LEN, PY_MESSAGE_LEN, PY_STATE_FAILED, PY_STATE_INSTALLING, PY_STATE_REMOVING, PyHooksStatus,
};

/// The Python source run in the target: the hooks, the vLLM preset, `--py-range`, removal.
const HOOKS_PY: &str = include_str!("hooks.py");

/// A byte buffer another process writes (llmprof, through the target's memory) and this library reads.
#[repr(transparent)]
pub struct SharedBytes<const N: usize>(UnsafeCell<[u8; N]>);

// SAFETY: the buffer is written by llmprof before it calls a start or stop, and read only by the one thread that
// call starts ([`BUSY`] keeps a second from running); within this process nothing writes it.
unsafe impl<const N: usize> Sync for SharedBytes<N> {}

impl<const N: usize> SharedBytes<N> {
    /// A copy of the bytes up to the first NUL.
    fn read(&self) -> Vec<u8> {
        // SAFETY: a volatile read of the whole array (another process wrote it before calling us).
        let bytes = unsafe { std::ptr::read_volatile(self.0.get()) };
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(N);
        bytes[..end].to_vec()
    }
}

/// `llmprof_abi::pyhooks::PY_CONFIG`: the configuration (JSON) llmprof writes before a start.
#[unsafe(no_mangle)]
#[used]
pub static llmprof_py_config: SharedBytes<PY_CONFIG_LEN> = SharedBytes(UnsafeCell::new([0; PY_CONFIG_LEN]));

/// The status, laid out as [`PyHooksStatus`] (llmprof reads it from the target's memory).
#[repr(C)]
pub struct Status {
    pub state: AtomicU32,
    pub seq: AtomicU32,
    pub hooks: AtomicU32,
    pub hook_errors: AtomicU32,
    pub records: AtomicU64,
    pub call_ns: AtomicU64,
    pub hook_ns: AtomicU64,
    message: UnsafeCell<[u8; PY_MESSAGE_LEN]>,
}
const _: () = assert!(core::mem::size_of::<Status>() == core::mem::size_of::<PyHooksStatus>());

// SAFETY: `message` is written only under [`REPORT`] and before `state`/`seq` are stored with Release; the
// counters are atomics.
unsafe impl Sync for Status {}

/// `llmprof_abi::pyhooks::PY_STATUS`.
#[unsafe(no_mangle)]
#[used]
pub static llmprof_py_status: Status = Status {
    state: AtomicU32::new(0),
    seq: AtomicU32::new(0),
    hooks: AtomicU32::new(0),
    hook_errors: AtomicU32::new(0),
    records: AtomicU64::new(0),
    call_ns: AtomicU64::new(0),
    hook_ns: AtomicU64::new(0),
    message: UnsafeCell::new([0; PY_MESSAGE_LEN]),
};

/// Serializes the writers of the status message.
static REPORT: std::sync::Mutex<()> = std::sync::Mutex::new(());
/// A start or stop is running (its thread has not finished).
static BUSY: AtomicBool = AtomicBool::new(false);

/// Sets the state, the hooks count and the message (cut at [`PY_MESSAGE_LEN`] - 1 bytes, on a UTF-8
/// boundary), then bumps `seq`.
fn set_status(state: u32, hooks: Option<u32>, message: &str) {
    let _guard = REPORT.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut buf = [0u8; PY_MESSAGE_LEN];
    let mut n = message.len().min(PY_MESSAGE_LEN - 1);
    while !message.is_char_boundary(n) {
        n -= 1;
    }
    buf[..n].copy_from_slice(&message.as_bytes()[..n]);
    // SAFETY: only writers holding REPORT write the message; readers are other processes reading bytes.
    unsafe { std::ptr::write_volatile(llmprof_py_status.message.get(), buf) };
    if let Some(h) = hooks {
        llmprof_py_status.hooks.store(h, Ordering::Relaxed);
    }
    llmprof_py_status.state.store(state, Ordering::Release);
    llmprof_py_status.seq.fetch_add(1, Ordering::Release);
}

/// Called by the hooks' Python source: the outcome of an installation or removal (`state`, one of
/// `PY_STATE_*`), the hooks in place, what one record call costs its caller (ns, measured at installation; 0:
/// unchanged), and a message (`len` bytes of UTF-8 at `msg`).
///
/// # Safety
/// `msg` must point to `len` readable bytes (ctypes passes a `bytes` object's buffer).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llmprof_py_report(state: u32, hooks: u32, call_ns: u64, msg: *const u8, len: usize) {
    if call_ns > 0 {
        llmprof_py_status.call_ns.store(call_ns, Ordering::Relaxed);
    }
    let text = if msg.is_null() {
        String::new()
    } else {
        // SAFETY: the caller's promise.
        String::from_utf8_lossy(unsafe { std::slice::from_raw_parts(msg, len.min(PY_MESSAGE_LEN)) })
            .into_owned()
    };
    set_status(state, Some(hooks), &text);
}

/// Called by the hooks' Python source when its own code raised (the hooked function is unaffected).
#[unsafe(no_mangle)]
pub extern "C" fn llmprof_py_hook_error() {
    llmprof_py_status.hook_errors.fetch_add(1, Ordering::Relaxed);
}

/// `llmprof_abi::pyhooks::PY_START`: installs the hooks [`llmprof_py_config`] names, on a thread of the helper.
/// 0: started; 1: a start or stop is still running; 2: the thread could not be created.
#[unsafe(no_mangle)]
pub extern "C" fn llmprof_py_start() -> i32 {
    spawn_work(PY_STATE_INSTALLING, "install")
}

/// `llmprof_abi::pyhooks::PY_STOP`: removes every hook, on a thread of the helper. Return values as
/// [`llmprof_py_start`]'s.
#[unsafe(no_mangle)]
pub extern "C" fn llmprof_py_stop() -> i32 {
    spawn_work(PY_STATE_REMOVING, "remove")
}

/// Starts the thread that runs `action` (`install` / `remove`) of the hooks' source.
fn spawn_work(state: u32, action: &'static str) -> i32 {
    if BUSY.swap(true, Ordering::AcqRel) {
        return 1;
    }
    set_status(state, None, "");
    let spawned = std::thread::Builder::new()
        .name("llmprof-pyhooks".into())
        .spawn(move || {
            let outcome = run(action);
            if let Err(why) = outcome {
                set_status(PY_STATE_FAILED, Some(0), &why);
            }
            BUSY.store(false, Ordering::Release);
        });
    match spawned {
        Ok(_) => 0,
        Err(e) => {
            set_status(
                PY_STATE_FAILED,
                Some(0),
                &format!("cannot start the helper's thread: {e}"),
            );
            BUSY.store(false, Ordering::Release);
            2
        }
    }
}

/// Runs the hooks' source for `action` with the interpreter's lock held. The source reports its own outcome
/// ([`llmprof_py_report`]); an error here is one the source could not report (no interpreter, no C API).
fn run(action: &str) -> Result<(), String> {
    let api = python::Api::find()?;
    api.wait_initialized(python::INIT_WAIT)?;
    let config = String::from_utf8_lossy(&llmprof_py_config.read()).into_owned();
    let lib = own_path().ok_or("the helper cannot find its own path (dladdr)")?;
    let source = bootstrap(&lib, &config, action);
    api.run_with_gil(&source)
}

/// The source run in the target (one expression: it binds no name in `__main__`, where the C API runs it): the
/// module `_llmprof_hooks` (created from [`HOOKS_PY`] the first time, kept between sessions) and its entry
/// point with the library's path, the configuration and the action. Every text is passed as hex, so none of
/// it is ever parsed as Python.
pub fn bootstrap(lib: &str, config: &str, action: &str) -> String {
    let hex = |s: &str| s.bytes().map(|b| format!("{b:02x}")).collect::<String>();
    let action = if action == "remove" { "remove" } else { "install" };
    format!(
        "(lambda m: (None if hasattr(m, '_llmprof_entry') else exec(compile(bytes.fromhex('{}').decode(), \
         '<llmprof hooks>', 'exec'), m.__dict__), m._llmprof_entry(bytes.fromhex('{}').decode(), \
         bytes.fromhex('{}').decode(), '{action}')))(__import__('sys').modules.setdefault('_llmprof_hooks', \
         __import__('types').ModuleType('_llmprof_hooks')))\n",
        hex(HOOKS_PY),
        hex(lib),
        hex(config),
    )
}

/// This library's path as the dynamic loader opened it (what `ctypes.CDLL` opens again in the target).
fn own_path() -> Option<String> {
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: dladdr reads the address of one of our own functions and fills `info`; the strings it points to
    // belong to the loader and live as long as the library is loaded.
    let ok = unsafe { libc::dladdr(llmprof_py_start as *const libc::c_void, info.as_mut_ptr()) };
    if ok == 0 {
        return None;
    }
    // SAFETY: dladdr succeeded, so `info` is filled.
    let info = unsafe { info.assume_init() };
    if info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: a NUL-terminated string owned by the loader.
    let name = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
    name.to_str().ok().map(str::to_owned)
}

/// Called by the vLLM hooks at the end of an engine step; see [`records::step`] for the fields. `spent_ns`:
/// the hooks' own work since their last record call (every record function takes it).
///
/// # Safety
/// `ids` and `tokens` must point to `n` readable values each (or be null with `n` = 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llmprof_py_step(
    s: *const records::StepArgs,
    ids: *const u64,
    tokens: *const u32,
    n: usize,
    spent_ns: u64,
) {
    spent(spent_ns);
    if s.is_null() {
        return;
    }
    // SAFETY: the caller's promise (a ctypes structure of the same layout, arrays of `n`).
    let (s, ids, tokens) = unsafe { (&*s, slice_or_empty(ids, n), slice_or_empty(tokens, n)) };
    llmprof_probes::step(&records::step(s, ids, tokens));
    llmprof_py_status.records.fetch_add(1, Ordering::Relaxed);
}

/// Called by the vLLM hooks at a request's transition; see [`records::request`].
///
/// # Safety
/// `r` must point to a valid [`records::RequestArgs`]; `xid`/`model` to `xid_len`/`model_len` bytes (or null).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llmprof_py_request(
    r: *const records::RequestArgs,
    xid: *const u8,
    xid_len: usize,
    model: *const u8,
    model_len: usize,
    spent_ns: u64,
) {
    spent(spent_ns);
    if r.is_null() {
        return;
    }
    // SAFETY: the caller's promise.
    let (r, xid, model) = unsafe {
        (
            &*r,
            slice_or_empty(xid, xid_len),
            slice_or_empty(model, model_len),
        )
    };
    llmprof_probes::request(&records::request(r, xid, model));
    llmprof_py_status.records.fetch_add(1, Ordering::Relaxed);
}

/// Called by a `--py-range` wrapper around its function's call: `op` 0 push, 1 pop (`llmprof_abi::RangeOp`).
///
/// # Safety
/// `domain`/`name` must point to `domain_len`/`name_len` bytes (or be null).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llmprof_py_range(
    op: u32,
    ts_ns: u64,
    step_id: u64,
    domain: *const u8,
    domain_len: usize,
    name: *const u8,
    name_len: usize,
    spent_ns: u64,
) {
    spent(spent_ns);
    // SAFETY: the caller's promise.
    let (domain, name) = unsafe { (slice_or_empty(domain, domain_len), slice_or_empty(name, name_len)) };
    if let Some(rec) = records::range(op, ts_ns, step_id, domain, name) {
        llmprof_probes::range(&rec);
        llmprof_py_status.records.fetch_add(1, Ordering::Relaxed);
    }
}

/// Adds the hooks' own work the caller measured to the status.
fn spent(ns: u64) {
    if ns > 0 {
        llmprof_py_status.hook_ns.fetch_add(ns, Ordering::Relaxed);
    }
}

/// `n` values at `p`, or none when `p` is null.
///
/// # Safety
/// A non-null `p` must point to `n` readable, initialized values that outlive the returned slice.
unsafe fn slice_or_empty<'a, T>(p: *const T, n: usize) -> &'a [T] {
    if p.is_null() || n == 0 {
        &[]
    } else {
        // SAFETY: the caller's promise.
        unsafe { std::slice::from_raw_parts(p, n) }
    }
}

/// Keeps the engine probe symbols and the ABI version in this library's dynamic symbol table.
#[unsafe(no_mangle)]
pub extern "C" fn llmprof_py_keep() -> u32 {
    llmprof_probes::keep()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests {
    use super::*;

    #[test]
    fn the_bootstrap_is_one_expression_with_every_text_as_hex() {
        let src = bootstrap("/tmp/x'\"\\n.so", "{\"ranges\":[\"a:b\"]}", "install");
        assert_eq!(src.lines().count(), 1, "one line, one expression");
        assert!(
            src.contains("bytes.fromhex('2f746d702f7827225c6e2e736f')"),
            "{src}"
        );
        assert!(!src.contains('"'), "no quote of the inputs reaches the source");
        assert!(src.contains(", 'install')))"));
        assert!(bootstrap("", "", "remove").contains(", 'remove')))"));
    }

    #[test]
    fn the_status_message_is_cut_on_a_character_boundary() {
        let long = "é".repeat(PY_MESSAGE_LEN);
        set_status(PY_STATE_FAILED, Some(0), &long);
        // SAFETY: a test reading its own static.
        let msg = unsafe { *llmprof_py_status.message.get() };
        let end = msg.iter().position(|&b| b == 0).unwrap();
        assert!(end < PY_MESSAGE_LEN && std::str::from_utf8(&msg[..end]).is_ok());
    }
}
