//! Python frames of CPython 3.10–3.13 processes: discovery, per-version layouts, the thread → thread-state
//! map the kernel walker needs, and resolving the walker's raw frames into function, file and line.
//!
//! Owns everything user space does for Python frames, by reading the target's memory (`/proc/PID/mem`) and
//! its ELF files; never writes to the target. The kernel half is `profiler-ebpf/src/python.rs`; the layouts
//! they share are `llmprof_abi::python`. Discovery ([`PyProcess::discover`]): the `_PyRuntime` symbol in the
//! executable or a mapped `libpython3.X`; the version from `Py_Version` (3.11+) or the file name (3.10); the
//! layout from `_Py_DebugOffsets` (3.13+) or [`offsets::table`] (3.10–3.12). Threads
//! ([`PyProcess::threads`]): the interpreter list, each interpreter's thread states, each with its kernel tid
//! (`native_thread_id`, or in 3.10 glibc's `struct pthread.tid` behind `thread_id`). Code objects are read
//! once and cached by address ([`PyProcess::resolve`]); a freed code object whose address is reused by
//! another can be misnamed until the cache is cleared (it is, past [`CODE_CACHE_MAX`] entries or
//! [`CODE_CACHE_BYTES`]: names and line tables come from the target's memory, up to [`MAX_LINETABLE`] each).

pub mod linetable;
pub mod offsets;

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use llmprof_abi::python::{
    PY_STATUS_NO_THREAD, PY_STATUS_READ_FAILED, PY_STATUS_TRUNCATED, PyOffsets, PyStack,
};
use llmprof_trace::event::python::{PyFrame, PyStackSample, PyStackStatus};
use object::{Object, ObjectKind, ObjectSymbol};

use offsets::{Layout, UNICODE_LENGTH, UNICODE_STATE, VAR_OB_SIZE};

use crate::sys::elf;
use crate::sys::maps::{MappedFile, Maps};

/// Code objects kept resolved per process before the cache starts over.
pub const CODE_CACHE_MAX: usize = 65536;
/// Memory the code cache of one process may hold (its names, file names and line tables).
pub const CODE_CACHE_BYTES: usize = 64 << 20;
/// Most interpreters and thread states [`PyProcess::threads`] follows (a corrupt list cannot loop forever).
const MAX_LIST: usize = 4096;
/// Longest name or file name read, characters.
const MAX_STR: u64 = 4096;
/// Longest line table read, bytes.
const MAX_LINETABLE: u64 = 1 << 20;
/// glibc x86-64 `struct pthread`: offset of `tid` (the `pthread_t` of a thread is its address). Checked
/// against the main thread before use; 3.10 only (3.11+ stores the tid itself).
const GLIBC_PTHREAD_TID: u64 = 0x2d0;

/// Why a process's Python frames cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum PythonError {
    /// Neither the executable nor a mapped library defines `_PyRuntime`.
    #[error("pid {0} is not a CPython 3.7+ process (no _PyRuntime symbol in its executable or a libpython)")]
    NotPython(u32),
    /// A Python version the walker has no layout for.
    #[error(
        "pid {pid} runs Python {version}: llmprof reads Python frames of CPython 3.10–3.13 only, so its samples will have no Python frames"
    )]
    Unsupported {
        /// The process.
        pid: u32,
        /// `3.9`, `3.14`, ...
        version: String,
    },
    /// The version could not be told (no `Py_Version`, no version in the file name).
    #[error("pid {pid}: cannot tell the Python version of {path}; its samples will have no Python frames")]
    UnknownVersion {
        /// The process.
        pid: u32,
        /// The file defining `_PyRuntime`.
        path: String,
    },
    /// A free-threaded (no-GIL) build.
    #[error("pid {0} runs a free-threaded CPython build, whose frames llmprof cannot read yet")]
    FreeThreaded(u32),
    /// Reading the process's maps, ELF files or memory failed.
    #[error("pid {pid}: cannot read {what}")]
    Read {
        /// The process.
        pid: u32,
        /// What was being read.
        what: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// A discovered CPython process.
#[derive(Debug)]
pub struct PyProcess {
    /// Its pid.
    pub pid: u32,
    /// `(3, minor)`.
    pub version: (u32, u32),
    /// Address of `_PyRuntime` in the process.
    pub runtime: u64,
    /// Its layout.
    pub layout: Layout,
    mem: File,
    code: HashMap<u64, Code>,
    /// [`Code::bytes`] of `code`.
    code_bytes: usize,
}

/// A code object, read once.
#[derive(Clone, Debug)]
struct Code {
    function: String,
    file: String,
    firstlineno: i32,
    linetable: Vec<u8>,
}

impl Code {
    /// Approximate memory it holds.
    fn bytes(&self) -> usize {
        std::mem::size_of::<Self>() + self.function.len() + self.file.len() + self.linetable.len()
    }
}

/// Where `_PyRuntime` lives: the ELF file defining it and its load address.
struct RuntimeSym {
    path: String,
    runtime: u64,
    py_version: Option<u64>,
}

fn io_err(pid: u32, what: impl Into<String>) -> impl FnOnce(std::io::Error) -> PythonError {
    let what = what.into();
    move |source| PythonError::Read { pid, what, source }
}

/// Each file mapped by `pid` ([`crate::sys::maps`]).
fn mapped_files(pid: u32) -> Result<Vec<MappedFile>, PythonError> {
    Ok(Maps::of(pid)
        .map_err(io_err(pid, format!("/proc/{pid}/maps")))?
        .files())
}

/// Looks for `_PyRuntime` (and `Py_Version`) in the mapped ELF file `f`.
fn runtime_in(f: &MappedFile) -> Option<RuntimeSym> {
    let base = f.base;
    let (runtime, py_version) = elf::read(&f.source, "a Python binary", move |file| {
        let bias = if file.kind() == ObjectKind::Executable {
            0
        } else {
            // Load address of the lowest segment, minus its link-time address (0 for libraries and PIEs).
            base.wrapping_sub(elf::first_load(file))
        };
        let mut runtime = None;
        let mut py_version = None;
        for sym in file.dynamic_symbols().chain(file.symbols()) {
            if !sym.is_definition() {
                continue;
            }
            match sym.name() {
                Ok("_PyRuntime") => runtime = runtime.or(Some(bias.wrapping_add(sym.address()))),
                Ok("Py_Version") => py_version = py_version.or(Some(bias.wrapping_add(sym.address()))),
                _ => {}
            }
        }
        (runtime, py_version)
    })
    .map_err(|e| log::debug!("python: {}", crate::causes::one_line(&e)))
    .ok()?;
    Some(RuntimeSym {
        path: f.path.display().to_string(),
        runtime: runtime?,
        py_version,
    })
}

/// `(3, minor)` from a file name like `libpython3.10.so.1.0` or `python3.10`.
fn version_from_name(path: &str) -> Option<(u32, u32)> {
    let name = path.rsplit('/').next()?;
    let rest = name.split("python3.").nth(1)?;
    let minor: String = rest.chars().take_while(char::is_ascii_digit).collect();
    Some((3, minor.parse().ok()?))
}

impl PyProcess {
    /// Finds the interpreter of `pid` and its layout. [`PythonError::NotPython`] for any other process.
    pub fn discover(pid: u32) -> Result<PyProcess, PythonError> {
        let files = mapped_files(pid)?;
        let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        // The executable first, then libpython (a static build defines _PyRuntime in the executable).
        let mut candidates: Vec<&MappedFile> = files
            .iter()
            .filter(|f| f.path.as_os_str() == exe.as_str())
            .collect();
        candidates.extend(files.iter().filter(|f| {
            f.path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libpython3"))
        }));
        let sym = candidates
            .iter()
            .find_map(|f| runtime_in(f))
            .ok_or(PythonError::NotPython(pid))?;
        let mem = File::open(PathBuf::from(format!("/proc/{pid}/mem")))
            .map_err(io_err(pid, format!("/proc/{pid}/mem")))?;
        let mut p = PyProcess {
            pid,
            version: (3, 0),
            runtime: sym.runtime,
            layout: offsets::table(10).ok_or(PythonError::NotPython(pid))?,
            mem,
            code: HashMap::new(),
            code_bytes: 0,
        };
        // 3.13+: the debug offsets at the start of _PyRuntime say everything.
        let mut raw = vec![0u8; offsets::DEBUG_OFFSETS_LEN];
        if p.read_exact(sym.runtime, &mut raw).is_ok() {
            match offsets::from_debug_offsets(&raw) {
                Ok((hex, layout)) => {
                    let minor = ((hex >> 16) & 0xff) as u32;
                    if minor != 13 {
                        return Err(PythonError::Unsupported {
                            pid,
                            version: format!("3.{minor}"),
                        });
                    }
                    p.version = (3, minor);
                    p.layout = layout;
                    return Ok(p);
                }
                Err(offsets::DebugOffsetsError::FreeThreaded) => return Err(PythonError::FreeThreaded(pid)),
                Err(offsets::DebugOffsetsError::NoCookie) => {}
            }
        }
        let version = match sym.py_version {
            Some(addr) => {
                let hex = p.read_u64(addr).map_err(io_err(pid, "Py_Version"))? as u32;
                (hex >> 24, (hex >> 16) & 0xff)
            }
            None => version_from_name(&sym.path)
                .or_else(|| version_from_name(&exe))
                .ok_or_else(|| PythonError::UnknownVersion {
                    pid,
                    path: sym.path.clone(),
                })?,
        };
        let Some(layout) = (version.0 == 3).then(|| offsets::table(version.1)).flatten() else {
            return Err(PythonError::Unsupported {
                pid,
                version: format!("{}.{}", version.0, version.1),
            });
        };
        p.version = version;
        p.layout = layout;
        Ok(p)
    }

    /// What the kernel walker needs for this process.
    pub fn walker_offsets(&self) -> PyOffsets {
        self.layout.walker
    }

    fn read_exact(&self, addr: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.mem.read_exact_at(buf, addr)
    }

    fn read_u64(&self, addr: u64) -> std::io::Result<u64> {
        let mut b = [0u8; 8];
        self.read_exact(addr, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    fn read_u32(&self, addr: u64) -> std::io::Result<u32> {
        let mut b = [0u8; 4];
        self.read_exact(addr, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    /// Every thread state of every interpreter: `(kernel tid, PyThreadState address)`.
    pub fn threads(&mut self) -> Result<Vec<(u32, u64)>, PythonError> {
        let pid = self.pid;
        let l = self.layout;
        let err = || io_err(pid, "the interpreter's thread list");
        let mut tstates = Vec::new();
        let mut interp = self
            .read_u64(self.runtime.wrapping_add(l.runtime_interpreters_head))
            .map_err(err())?;
        let mut guard = 0;
        while interp != 0 && guard < MAX_LIST {
            let mut t = self
                .read_u64(interp.wrapping_add(l.interp_threads_head))
                .map_err(err())?;
            while t != 0 && guard < MAX_LIST {
                tstates.push(t);
                t = self.read_u64(t.wrapping_add(l.tstate_next)).map_err(err())?;
                guard += 1;
            }
            interp = self.read_u64(interp.wrapping_add(l.interp_next)).map_err(err())?;
            guard += 1;
        }
        let mut out = Vec::with_capacity(tstates.len());
        for t in tstates {
            let tid = match l.tstate_native_thread_id {
                Some(off) => self.read_u64(t.wrapping_add(off)).map_err(err())? as u32,
                None => {
                    let pthread = self.read_u64(t.wrapping_add(l.tstate_thread_id)).map_err(err())?;
                    match self.pthread_tid(pthread) {
                        Some(tid) => tid,
                        None => continue,
                    }
                }
            };
            if tid != 0 {
                out.push((tid, t));
            }
        }
        Ok(out)
    }

    /// 3.10: the kernel tid of the thread whose `pthread_t` is `pthread` (glibc: the address of its
    /// `struct pthread`), accepted only when it names a live thread of the process.
    fn pthread_tid(&self, pthread: u64) -> Option<u32> {
        let tid = self.read_u32(pthread.wrapping_add(GLIBC_PTHREAD_TID)).ok()?;
        let live = std::path::Path::new(&format!("/proc/{}/task/{tid}", self.pid)).exists();
        live.then_some(tid)
    }

    /// Reads a `str` object (compact ASCII, Latin-1, UCS-2 or UCS-4).
    fn read_str(&self, addr: u64) -> Option<String> {
        let len = self.read_u64(addr.wrapping_add(UNICODE_LENGTH)).ok()?;
        let state = self.read_u32(addr.wrapping_add(UNICODE_STATE)).ok()?;
        let kind = (state >> 2) & 7;
        let compact = (state >> 5) & 1 == 1;
        let ascii = (state >> 6) & 1 == 1;
        if !compact || len > MAX_STR {
            return None;
        }
        let data = if ascii {
            addr.wrapping_add(self.layout.ascii_size)
        } else {
            addr.wrapping_add(self.layout.compact_size)
        };
        let width = u64::from(if ascii { 1 } else { kind });
        if !matches!(width, 1 | 2 | 4) {
            return None;
        }
        let mut buf = vec![0u8; (len * width) as usize];
        self.read_exact(data, &mut buf).ok()?;
        Some(match width {
            1 => buf.iter().map(|&b| char::from(b)).collect(),
            2 => buf
                .chunks_exact(2)
                .map(|c| char::from_u32(u32::from(u16::from_le_bytes([c[0], c[1]]))).unwrap_or('\u{fffd}'))
                .collect(),
            _ => buf
                .chunks_exact(4)
                .map(|c| char::from_u32(u32::from_le_bytes([c[0], c[1], c[2], c[3]])).unwrap_or('\u{fffd}'))
                .collect(),
        })
    }

    /// Reads a `bytes` object.
    fn read_bytes(&self, addr: u64) -> Option<Vec<u8>> {
        let len = self.read_u64(addr.wrapping_add(VAR_OB_SIZE)).ok()?;
        if len > MAX_LINETABLE {
            return None;
        }
        let mut buf = vec![0u8; len as usize];
        self.read_exact(addr.wrapping_add(self.layout.bytes_sval), &mut buf)
            .ok()?;
        Some(buf)
    }

    fn read_code(&self, addr: u64) -> Option<Code> {
        let l = &self.layout;
        let name_off = l.code_qualname.unwrap_or(l.code_name);
        let function = self.read_str(self.read_u64(addr.wrapping_add(name_off)).ok()?)?;
        let file = self.read_str(self.read_u64(addr.wrapping_add(l.code_filename)).ok()?)?;
        let firstlineno = self.read_u32(addr.wrapping_add(l.code_firstlineno)).ok()? as i32;
        let linetable = self.read_bytes(self.read_u64(addr.wrapping_add(l.code_linetable)).ok()?)?;
        Some(Code {
            function,
            file,
            firstlineno,
            linetable,
        })
    }

    /// The line of the instruction `instr` (the walker's raw value) in the code object at `code`.
    fn line(&self, code: u64, c: &Code, instr: u64) -> Option<u32> {
        let line = match self.layout.code_adaptive {
            None => linetable::line_310(&c.linetable, c.firstlineno, (instr & 0xffff_ffff) * 2),
            Some(adaptive) => {
                let start = code.wrapping_add(adaptive);
                let index = instr.saturating_sub(start) / 2;
                linetable::line_311(&c.linetable, c.firstlineno, index)
            }
        }?;
        u32::try_from(line).ok()
    }

    /// Resolves a kernel walk into function, file and line per frame (innermost first).
    pub fn resolve(&mut self, raw: &PyStack) -> PyStackSample {
        let n = (raw.nframes as usize).min(raw.frames.len());
        let mut frames = Vec::with_capacity(n);
        if self.code.len() > CODE_CACHE_MAX || self.code_bytes > CODE_CACHE_BYTES {
            self.code.clear();
            self.code_bytes = 0;
        }
        for (i, f) in raw.frames[..n].iter().enumerate() {
            let code = match self.code.get(&f.code) {
                Some(c) => Some(c.clone()),
                None => {
                    let c = self.read_code(f.code);
                    if let Some(c) = &c {
                        self.code_bytes += c.bytes();
                        self.code.insert(f.code, c.clone());
                    }
                    c
                }
            };
            let entry = raw.entry_mask & (1u64 << i) != 0;
            frames.push(match code {
                Some(c) => PyFrame {
                    line: self.line(f.code, &c, f.instr),
                    function: c.function,
                    file: c.file,
                    entry,
                },
                None => PyFrame {
                    function: "<unknown>".into(),
                    file: String::new(),
                    line: None,
                    entry,
                },
            });
        }
        let status = match raw.status & 0xff {
            PY_STATUS_NO_THREAD => PyStackStatus::NoThread,
            PY_STATUS_READ_FAILED => PyStackStatus::ReadFailed,
            _ if raw.status & PY_STATUS_TRUNCATED != 0 => PyStackStatus::Truncated,
            _ => PyStackStatus::Complete,
        };
        PyStackSample { frames, status }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_code_cache_is_bounded_in_bytes() {
        let mut p = PyProcess {
            pid: std::process::id(),
            version: (3, 11),
            runtime: 0,
            layout: offsets::table(11).unwrap(),
            mem: File::open("/proc/self/mem").unwrap(),
            code: HashMap::new(),
            code_bytes: 0,
        };
        // A few entries with line tables of the largest size read fill the byte bound long before the count.
        let big = Code {
            function: "f".into(),
            file: "f.py".into(),
            firstlineno: 1,
            linetable: vec![0; MAX_LINETABLE as usize],
        };
        for i in 0..(CODE_CACHE_BYTES as u64 / MAX_LINETABLE + 1) {
            p.code_bytes += big.bytes();
            p.code.insert(i, big.clone());
        }
        assert!(p.code.len() < CODE_CACHE_MAX && p.code_bytes > CODE_CACHE_BYTES);
        // SAFETY: an all-zero PyStack (no frames) is a valid value of this plain C struct.
        let empty: PyStack = unsafe { std::mem::zeroed() };
        let _ = p.resolve(&empty);
        assert!(p.code.is_empty() && p.code_bytes == 0);
    }

    #[test]
    fn versions_from_file_names() {
        assert_eq!(version_from_name("/usr/lib/libpython3.10.so.1.0"), Some((3, 10)));
        assert_eq!(
            version_from_name("/root/.pyenv/versions/3.9.18/bin/python3.9"),
            Some((3, 9))
        );
        assert_eq!(version_from_name("/usr/bin/python3"), None);
    }

    #[test]
    fn llmprof_itself_is_not_python() {
        let e = PyProcess::discover(std::process::id()).err();
        assert!(matches!(e, Some(PythonError::NotPython(_))), "{e:?}");
    }
}
