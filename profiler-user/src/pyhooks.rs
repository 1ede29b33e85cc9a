//! `--python-hooks`, `--py-range`: engine steps, request lifecycles and ranges of running Python servers, by
//! llmprof's Python-hooks helper (`libllmprof_pyhooks.so`, crate `llmprof-pyhooks`) loaded into them.
//!
//! Owns which processes get the helper, and its life in each: a CPython process of the traced tree
//! ([`crate::python::PyProcess::discover`]) that maps a file of vLLM (the preset's hooks) or, with
//! `--py-range`, any CPython process. For each: the helper loaded ([`crate::inject`]: ptrace + `dlopen`, or
//! the one an earlier session loaded), the engine uprobes attached to its probe functions
//! ([`Capture::attach_engine_library`]) before anything can call them, the configuration written into its
//! [`PY_CONFIG`] buffer, [`PY_START`] called (it only starts a thread of the helper, which takes the
//! interpreter's lock and installs the wrappers), and its [`PY_STATUS`] read back until the installation
//! ended: one line per process says what was hooked, or why nothing was (an unknown vLLM layout, a module not
//! imported). At the end [`PY_STOP`] puts every original function back before the uprobes go. The helper's
//! status is read from the target's memory: untrusted, bounded (a fixed-size struct, a message cut at its
//! length and read as lossy UTF-8).
//!
//! Never touches a process with `--python-hooks off`, a process that is not CPython, or (without
//! `--py-range`) a Python process without vLLM. What the hooks cost the target is measured in it: their own
//! work as it runs ([`PyHooksStatus::hook_ns`]), each record call at the figure calibrated at installation
//! ([`PyHooksStatus::call_ns`]); the probe hits are charged as every probe's.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use llmprof_abi::pyhooks::{
    PY_CONFIG, PY_CONFIG_LEN, PY_HELPER_LIB, PY_START, PY_STATE_FAILED, PY_STATE_INSTALLED, PY_STATE_REMOVED,
    PY_STATUS, PY_STOP, PyHooksStatus,
};

use crate::capture::Capture;
use crate::inject::{self, InjectError, Loaded};

/// Environment variable naming the helper library instead of the one installed next to `llmprof`.
pub const HELPER_ENV: &str = "LLMPROF_PYHOOKS_LIB";
/// How long the target's loader may take to load the helper.
const LOAD_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a call of the helper's start or stop may take (they only start a thread).
const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// How long an installation or removal may wait for the interpreter's lock and run.
const WORK_WAIT: Duration = Duration::from_secs(10);
/// Between two reads of the helper's status.
const STATUS_POLL: Duration = Duration::from_millis(10);
/// Prefix of the helper's copy in a target's own root (another mount namespace).
const COPY_PREFIX: &str = "llmprof-pyhooks-";

/// `--python-hooks`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum PyHooksMode {
    /// Load the helper into the traced Python processes that run vLLM (and, with `--py-range`, into every
    /// traced Python process).
    #[default]
    Auto,
    /// Never load it.
    Off,
}

/// What the user asked of the Python hooks.
#[derive(Clone, Debug, Default)]
pub struct PyHooksOptions {
    /// `--python-hooks`.
    pub mode: PyHooksMode,
    /// `--py-range MODULE:QUALNAME`, each checked by [`parse_range`].
    pub ranges: Vec<String>,
}

/// A Python-hooks failure.
#[derive(Debug, thiserror::Error)]
pub enum PyHooksError {
    /// The helper library is not installed where llmprof looks.
    #[error("the Python-hooks helper {PY_HELPER_LIB} was not found (looked at {looked}; set {HELPER_ENV})")]
    HelperNotFound {
        /// The paths tried.
        looked: String,
    },
    /// The helper is there but anyone other than root could replace it.
    #[error("refusing to load {path} into a target: {why}")]
    HelperUntrusted {
        /// The file.
        path: String,
        /// Why it is not trusted.
        why: String,
    },
    /// Loading or calling it in the target failed.
    #[error(transparent)]
    Inject(#[from] InjectError),
    /// The helper's functions did not answer as expected.
    #[error("pid {pid}: the Python-hooks helper {what}")]
    Helper {
        /// The target.
        pid: u32,
        /// What went wrong.
        what: String,
    },
    /// The engine uprobes could not be attached to the helper.
    #[error("pid {pid}: the engine probes on the Python-hooks helper: {source}")]
    Probes {
        /// The target.
        pid: u32,
        /// The capture's error.
        #[source]
        source: crate::capture::CaptureError,
    },
}

/// Checks one `--py-range` value: `MODULE:QUALNAME`, a dotted module and a dotted attribute path of
/// identifiers (what the helper looks up in `sys.modules`; nothing of it is ever run as code).
pub fn parse_range(s: &str) -> Result<String, String> {
    let (module, qualname) = s.split_once(':').ok_or_else(|| {
        format!("expected MODULE:QUALNAME (e.g. vllm.v1.engine.core:EngineCore.step), got {s:?}")
    })?;
    let dotted = |part: &str, what: &str| {
        if part.is_empty()
            || !part.split('.').all(|w| {
                let mut c = w.chars();
                c.next().is_some_and(|f| f == '_' || f.is_alphabetic())
                    && c.all(|ch| ch == '_' || ch.is_alphanumeric())
            })
        {
            Err(format!("{what} {part:?} of {s:?} is not a dotted Python name"))
        } else {
            Ok(())
        }
    };
    dotted(module, "the module")?;
    dotted(qualname, "the function")?;
    Ok(s.to_owned())
}

/// Finds the helper library: `$LLMPROF_PYHOOKS_LIB`, else next to the `llmprof` binary or in `../lib/llmprof`
/// from it ([`inject::find_helper`]: root-owned, or the running llmprof's owner's).
pub fn find_helper() -> Result<PathBuf, PyHooksError> {
    inject::find_helper(PY_HELPER_LIB, HELPER_ENV).map_err(|e| match e {
        inject::HelperMissing::NotFound(looked) => PyHooksError::HelperNotFound { looked },
        inject::HelperMissing::Untrusted { path, why } => PyHooksError::HelperUntrusted { path, why },
    })
}

/// The configuration the helper reads (JSON): the presets on, and the ranges.
fn config_json(ranges: &[String]) -> Result<Vec<u8>, String> {
    let mut bytes = serde_json::to_vec(&serde_json::json!({ "presets": true, "ranges": ranges }))
        .map_err(|e| e.to_string())?;
    if bytes.len() >= PY_CONFIG_LEN {
        return Err(format!(
            "the --py-range list is {} bytes of configuration, more than the helper's {}",
            bytes.len(),
            PY_CONFIG_LEN - 1
        ));
    }
    bytes.push(0);
    Ok(bytes)
}

/// Whether a process that maps `paths` runs vLLM: it maps one of vLLM's compiled extensions (`_C.abi3.so` &
/// co.), which live in the `vllm` package directory itself.
fn runs_vllm<'a>(paths: impl IntoIterator<Item = &'a Path>) -> bool {
    paths
        .into_iter()
        .any(|p| p.parent().and_then(Path::file_name).is_some_and(|d| d == "vllm"))
}

/// The helper's status in `lib`'s process.
fn read_status(lib: &Loaded) -> Result<PyHooksStatus, PyHooksError> {
    let mut buf = [0u8; core::mem::size_of::<PyHooksStatus>()];
    lib.read_export(PY_STATUS, &mut buf)?;
    // SAFETY: `PyHooksStatus` is `repr(C)` of integers and a byte array: every bit pattern is a valid value,
    // and `buf` has exactly its size.
    Ok(unsafe { std::ptr::read_unaligned(buf.as_ptr().cast::<PyHooksStatus>()) })
}

/// The status message, as text.
fn message(s: &PyHooksStatus) -> String {
    let end = s.message.iter().position(|&b| b == 0).unwrap_or(s.message.len());
    String::from_utf8_lossy(&s.message[..end]).into_owned()
}

/// Calls `func` of the helper and waits until its status leaves the state it was in (a new `seq`) and is
/// one of `done`, for at most [`WORK_WAIT`].
fn call_and_wait(lib: &Loaded, func: &'static str, done: &[u32]) -> Result<PyHooksStatus, PyHooksError> {
    let before = read_status(lib)?.seq;
    let rc = lib.call_export(func, &[], CALL_TIMEOUT)?;
    if rc != 0 {
        return Err(PyHooksError::Helper {
            pid: lib.pid,
            what: format!("refused {func} ({rc}: a start or stop is still running)"),
        });
    }
    let deadline = Instant::now() + WORK_WAIT;
    loop {
        let s = read_status(lib)?;
        if s.seq != before && (done.contains(&s.state) || s.state == PY_STATE_FAILED) {
            return Ok(s);
        }
        if Instant::now() >= deadline {
            return Err(PyHooksError::Helper {
                pid: lib.pid,
                what: format!(
                    "did not finish {func} within {WORK_WAIT:?} (the interpreter's lock was not released: {})",
                    message(&s)
                ),
            });
        }
        std::thread::sleep(STATUS_POLL);
    }
}

/// One process with the helper.
#[derive(Debug)]
struct Hooked {
    lib: Loaded,
    /// Hooks installed.
    hooks: u32,
    /// The helper's records and measured hook time when this session started it.
    at_start: (u64, u64),
    /// Those at the last reading (kept once the process is gone).
    seen: std::cell::Cell<(u64, u64)>,
    /// Its calibrated cost of a record call, ns.
    call_ns: u64,
}

/// What the Python hooks cost the targets so far, for the self-accounting.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PyHooksCounters {
    /// Records the hooks wrote during this session.
    pub records: u64,
    /// The hooks' own work measured in the targets, plus each record call at its process's calibrated cost,
    /// ns (the probe hits are charged by the probe counters).
    pub added_ns: f64,
}

/// The Python hooks of one session.
#[derive(Debug)]
pub struct PyHooks {
    opts: PyHooksOptions,
    /// The helper library, found on the first process that wants it.
    helper: Option<PathBuf>,
    /// Processes already considered (hooked or not).
    tried: HashSet<u32>,
    hooked: Vec<Hooked>,
    /// The helper could not be found or trusted: said once.
    helper_error: Option<String>,
}

impl PyHooks {
    /// A session's hooks, nothing done yet.
    pub fn new(opts: PyHooksOptions) -> Self {
        PyHooks {
            opts,
            helper: None,
            tried: HashSet::new(),
            hooked: Vec::new(),
            helper_error: None,
        }
    }

    /// Whether `pid` should get the helper: a CPython process, running vLLM unless ranges were asked.
    fn wants(&self, pid: u32) -> Result<bool, PyHooksError> {
        if self.opts.mode == PyHooksMode::Off {
            return Ok(false);
        }
        if crate::python::PyProcess::discover(pid).is_err() {
            return Ok(false);
        }
        if !self.opts.ranges.is_empty() {
            return Ok(true);
        }
        Ok(runs_vllm(
            inject::loaded_files(pid)?.iter().map(|f| f.path.as_path()),
        ))
    }

    /// Loads and starts the hooks in each process of `pids` not considered yet that wants them. One line per
    /// outcome is returned for the user (a process hooked, or why not); an error of one process never stops
    /// the others or the session.
    pub fn start(&mut self, pids: &[u32], capture: &mut Capture) -> Vec<String> {
        let mut said = Vec::new();
        for &pid in pids {
            if !self.tried.insert(pid) {
                continue;
            }
            match self.wants(pid) {
                Ok(true) => {}
                Ok(false) => continue,
                Err(e) => {
                    log::debug!("python hooks: pid {pid}: {e}");
                    continue;
                }
            }
            match self.start_one(pid, capture) {
                Ok(line) => said.push(line),
                Err(e) => said.push(format!("Python hooks: not installed in pid {pid}: {e}")),
            }
        }
        said
    }

    fn helper(&mut self) -> Result<PathBuf, PyHooksError> {
        if let Some(h) = &self.helper {
            return Ok(h.clone());
        }
        let h = find_helper()?;
        self.helper = Some(h.clone());
        Ok(h)
    }

    fn start_one(&mut self, pid: u32, capture: &mut Capture) -> Result<String, PyHooksError> {
        if let Some(why) = &self.helper_error {
            return Err(PyHooksError::Helper {
                pid,
                what: why.clone(),
            });
        }
        let config = config_json(&self.opts.ranges).map_err(|what| PyHooksError::Helper { pid, what })?;
        let files = inject::loaded_files(pid)?;
        // A helper an earlier session loaded (its hooks removed) is used again: never a second copy.
        let lib = match inject::already_loaded(pid, &files, PY_HELPER_LIB)? {
            Some(lib) => lib,
            None => {
                let helper = self
                    .helper()
                    .inspect_err(|e| self.helper_error = Some(e.to_string()))?;
                inject::load(pid, &files, &helper, COPY_PREFIX, LOAD_TIMEOUT)?
            }
        };
        capture
            .attach_engine_library(pid, &lib.mapping.probe_path)
            .map_err(|source| PyHooksError::Probes { pid, source })?;
        lib.write_export(PY_CONFIG, &config)?;
        let st = read_status(&lib)?;
        let at_start = (st.records, st.hook_ns);
        let s = call_and_wait(&lib, PY_START, &[PY_STATE_INSTALLED])?;
        let text = message(&s);
        if s.state != PY_STATE_INSTALLED {
            return Err(PyHooksError::Helper {
                pid,
                what: format!("installed nothing: {text}"),
            });
        }
        self.hooked.push(Hooked {
            lib,
            hooks: s.hooks,
            at_start,
            seen: std::cell::Cell::new(at_start),
            call_ns: s.call_ns,
        });
        Ok(if s.hooks == 0 {
            format!("Python hooks: pid {pid}: {text}")
        } else {
            format!(
                "Python hooks: pid {pid}: {} hook(s) ({text}; {} ns per record call)",
                s.hooks, s.call_ns
            )
        })
    }

    /// Removes every hook this session installed (before the engine uprobes go): lines for the user about
    /// any process where that did not end as it should.
    pub fn stop(&mut self) -> Vec<String> {
        let mut said = Vec::new();
        for h in &self.hooked {
            if h.hooks == 0 {
                continue;
            }
            match call_and_wait(&h.lib, PY_STOP, &[PY_STATE_REMOVED]) {
                Ok(s) if s.state == PY_STATE_REMOVED => {}
                Ok(s) => said.push(format!(
                    "Python hooks: pid {}: removal incomplete: {}",
                    h.lib.pid,
                    message(&s)
                )),
                // A target that exited took its hooks with it.
                Err(PyHooksError::Inject(InjectError::Exited { .. })) => {}
                Err(e) => said.push(format!("Python hooks: pid {}: not removed: {e}", h.lib.pid)),
            }
        }
        said
    }

    /// The hooks' records during this session and what they cost the targets.
    pub fn counters(&self) -> PyHooksCounters {
        let mut c = PyHooksCounters::default();
        for h in &self.hooked {
            if let Ok(s) = read_status(&h.lib) {
                let (r, t) = h.seen.get();
                h.seen.set((r.max(s.records), t.max(s.hook_ns)));
            }
            let (r, t) = h.seen.get();
            let n = r.saturating_sub(h.at_start.0);
            c.records += n;
            c.added_ns += n as f64 * h.call_ns as f64 + t.saturating_sub(h.at_start.1) as f64;
        }
        c
    }

    /// Processes with hooks installed.
    pub fn hooked_pids(&self) -> Vec<u32> {
        self.hooked
            .iter()
            .filter(|h| h.hooks > 0)
            .map(|h| h.lib.pid)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_dotted_names_only() {
        assert!(parse_range("http.server:BaseHTTPRequestHandler.handle_one_request").is_ok());
        assert!(parse_range("vllm.v1.engine.core:EngineCore.step").is_ok());
        for bad in [
            "nocolon",
            ":f",
            "m:",
            "m:f()",
            "os:system('x')",
            "a..b:f",
            "m:1f",
            "m:f;g",
        ] {
            assert!(parse_range(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_configuration_fits_the_helpers_buffer_or_is_refused() {
        let c = config_json(&["m:f".to_owned()]).unwrap();
        assert_eq!(c.last(), Some(&0));
        let v: serde_json::Value = serde_json::from_slice(&c[..c.len() - 1]).unwrap();
        assert_eq!(v["ranges"][0], "m:f");
        let many: Vec<String> = (0..1000).map(|i| format!("module{i}:function{i}")).collect();
        assert!(config_json(&many).is_err());
    }

    #[test]
    fn vllm_is_found_by_its_package_directory() {
        assert!(runs_vllm([Path::new(
            "/usr/lib/python3.12/site-packages/vllm/_C.abi3.so"
        )]));
        assert!(!runs_vllm([
            Path::new("/usr/lib/libvllmfoo.so"),
            Path::new("/usr/bin/python3.12")
        ]));
        // A venv named after vLLM is not vLLM.
        assert!(!runs_vllm([Path::new(
            "/venvs/vllm/lib/python3.11/site-packages/PIL/_imaging.so"
        )]));
    }
}
