//! Where CPython 3.10–3.13 keep what the Python frame walker needs: the runtime's interpreter list, each
//! interpreter's thread list, each thread's frame chain, and the code object's fields.
//!
//! 3.10–3.12 publish no layout at run time: their tables below were read from the debug info of the pyenv
//! builds (`gdb -batch -ex 'print (long)&((PyThreadState*)0)->cframe' libpython3.11.so.1.0`, one line per
//! field; the commands are in docs/architecture.md) and match the release headers (the layout of these
//! structures is fixed within a minor version on x86-64). 3.13+ publishes `_Py_DebugOffsets` at the start of
//! `_PyRuntime` (Include/internal/pycore_runtime.h), which [`from_debug_offsets`] reads.

use llmprof_abi::python::{
    PY_LAYOUT_ALL_ENTRY, PY_LAYOUT_CSTACK_SHIMS, PY_LAYOUT_INSTR_INT, PY_NO_OFFSET, PyOffsets,
};

/// Everything user space reads, besides what the kernel walker gets ([`Layout::walker`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The kernel's part.
    pub walker: PyOffsets,
    /// In `_PyRuntimeState`: `interpreters.head`.
    pub runtime_interpreters_head: u64,
    /// In `PyInterpreterState`: `next`.
    pub interp_next: u64,
    /// In `PyInterpreterState`: the first thread (`tstate_head` in 3.10, `threads.head` since 3.11).
    pub interp_threads_head: u64,
    /// In `PyThreadState`: `next`.
    pub tstate_next: u64,
    /// In `PyThreadState`: `thread_id` (the `pthread_t`).
    pub tstate_thread_id: u64,
    /// In `PyThreadState`: `native_thread_id` (the kernel tid; 3.11+), None in 3.10.
    pub tstate_native_thread_id: Option<u64>,
    /// In `PyCodeObject`: `co_filename`.
    pub code_filename: u64,
    /// In `PyCodeObject`: `co_name`.
    pub code_name: u64,
    /// In `PyCodeObject`: `co_qualname` (3.11+).
    pub code_qualname: Option<u64>,
    /// In `PyCodeObject`: `co_firstlineno` (an `int`).
    pub code_firstlineno: u64,
    /// In `PyCodeObject`: `co_linetable` (a bytes object).
    pub code_linetable: u64,
    /// In `PyCodeObject`: `co_code_adaptive` (3.11+: where the instructions start).
    pub code_adaptive: Option<u64>,
    /// `sizeof(PyASCIIObject)`: where a compact ASCII string's characters start.
    pub ascii_size: u64,
    /// `sizeof(PyCompactUnicodeObject)`: where a compact non-ASCII string's characters start.
    pub compact_size: u64,
    /// In `PyBytesObject`: `ob_sval`.
    pub bytes_sval: u64,
}

/// `PyVarObject.ob_size` (after `ob_refcnt` and `ob_type`), the same in every version.
pub const VAR_OB_SIZE: u64 = 16;
/// `PyASCIIObject.length`, the same in every version.
pub const UNICODE_LENGTH: u64 = 16;
/// `PyASCIIObject.state` (after `length` and `hash`), the same in every version.
pub const UNICODE_STATE: u64 = 32;

/// The layout of CPython `major.minor` (3.10–3.12; 3.13 goes through [`from_debug_offsets`]).
pub fn table(minor: u32) -> Option<Layout> {
    let version = 0x0300 | minor;
    Some(match minor {
        10 => Layout {
            walker: PyOffsets {
                version,
                flags: PY_LAYOUT_ALL_ENTRY | PY_LAYOUT_INSTR_INT,
                tstate_frame: 24,
                cframe_current: PY_NO_OFFSET,
                frame_previous: 24,
                frame_code: 32,
                frame_instr: 96,
                frame_owner: PY_NO_OFFSET,
                frame_is_entry: PY_NO_OFFSET,
                _pad: 0,
            },
            runtime_interpreters_head: 32,
            interp_next: 0,
            interp_threads_head: 8,
            tstate_next: 8,
            tstate_thread_id: 176,
            tstate_native_thread_id: None,
            code_filename: 104,
            code_name: 112,
            code_qualname: None,
            code_firstlineno: 40,
            code_linetable: 120,
            code_adaptive: None,
            ascii_size: 48,
            compact_size: 72,
            bytes_sval: 32,
        },
        11 => Layout {
            walker: PyOffsets {
                version,
                flags: 0,
                tstate_frame: 56,
                cframe_current: 8,
                frame_previous: 48,
                frame_code: 32,
                frame_instr: 56,
                frame_owner: PY_NO_OFFSET,
                frame_is_entry: 68,
                _pad: 0,
            },
            runtime_interpreters_head: 40,
            interp_next: 0,
            interp_threads_head: 16,
            tstate_next: 8,
            tstate_thread_id: 152,
            tstate_native_thread_id: Some(160),
            code_filename: 112,
            code_name: 120,
            code_qualname: Some(128),
            code_firstlineno: 72,
            code_linetable: 136,
            code_adaptive: Some(184),
            ascii_size: 48,
            compact_size: 72,
            bytes_sval: 32,
        },
        12 => Layout {
            walker: PyOffsets {
                version,
                flags: PY_LAYOUT_CSTACK_SHIMS,
                tstate_frame: 56,
                cframe_current: 0,
                frame_previous: 8,
                frame_code: 0,
                frame_instr: 56,
                frame_owner: 70,
                frame_is_entry: PY_NO_OFFSET,
                _pad: 0,
            },
            runtime_interpreters_head: 40,
            interp_next: 0,
            interp_threads_head: 72,
            tstate_next: 8,
            tstate_thread_id: 136,
            tstate_native_thread_id: Some(144),
            code_filename: 112,
            code_name: 120,
            code_qualname: Some(128),
            code_firstlineno: 68,
            code_linetable: 136,
            code_adaptive: Some(192),
            ascii_size: 40,
            compact_size: 56,
            bytes_sval: 32,
        },
        _ => return None,
    })
}

/// `_Py_DebugOffsets.cookie` (Include/internal/pycore_runtime.h of 3.13).
pub const DEBUG_COOKIE: &[u8; 8] = b"xdebugpy";
/// Bytes of `_Py_DebugOffsets` this reader uses (cookie through `unicode_object.asciiobject_size`).
pub const DEBUG_OFFSETS_LEN: usize = 8 * 71;

/// The `u64` fields of 3.13's `_Py_DebugOffsets`, as indices of 8-byte words from its start (cookie = 0).
mod word {
    pub const VERSION: usize = 1;
    pub const FREE_THREADED: usize = 2;
    // runtime_state { size, finalizing, interpreters_head }
    pub const RUNTIME_INTERPRETERS_HEAD: usize = 5;
    // interpreter_state { size, id, next, threads_head, ... 13 words }
    pub const INTERP_NEXT: usize = 8;
    pub const INTERP_THREADS_HEAD: usize = 9;
    // thread_state { size, prev, next, interp, current_frame, thread_id, native_thread_id, ... 9 words }
    pub const TSTATE_NEXT: usize = 21;
    pub const TSTATE_CURRENT_FRAME: usize = 23;
    pub const TSTATE_THREAD_ID: usize = 24;
    pub const TSTATE_NATIVE_THREAD_ID: usize = 25;
    // interpreter_frame { size, previous, executable, instr_ptr, localsplus, owner }
    pub const FRAME_PREVIOUS: usize = 29;
    pub const FRAME_EXECUTABLE: usize = 30;
    pub const FRAME_INSTR_PTR: usize = 31;
    pub const FRAME_OWNER: usize = 33;
    // code_object { size, filename, name, qualname, linetable, firstlineno, argcount, localsplusnames,
    // localspluskinds, co_code_adaptive }
    pub const CODE_FILENAME: usize = 35;
    pub const CODE_NAME: usize = 36;
    pub const CODE_QUALNAME: usize = 37;
    pub const CODE_LINETABLE: usize = 38;
    pub const CODE_FIRSTLINENO: usize = 39;
    pub const CODE_ADAPTIVE: usize = 43;
    // pyobject {2}, type_object {4}, tuple {3}, list {3}, dict {3}, float {2}, long {3} = 20 words, then
    // bytes_object { size, ob_size, ob_sval }, unicode_object { size, state, length, asciiobject_size }
    pub const BYTES_SVAL: usize = 66;
    pub const UNICODE_ASCII_SIZE: usize = 70;
}

/// Why a `_Py_DebugOffsets` block cannot be used.
#[derive(Debug, PartialEq, Eq)]
pub enum DebugOffsetsError {
    /// The block does not start with the cookie (not 3.13+, or not `_PyRuntime`).
    NoCookie,
    /// A free-threaded build: its frames and objects differ; not supported.
    FreeThreaded,
}

/// The layout of a 3.13+ process from the `_Py_DebugOffsets` block at the start of its `_PyRuntime`
/// (`raw`: at least [`DEBUG_OFFSETS_LEN`] bytes). Returns the hex version (`PY_VERSION_HEX`) with it.
pub fn from_debug_offsets(raw: &[u8]) -> Result<(u64, Layout), DebugOffsetsError> {
    if raw.len() < DEBUG_OFFSETS_LEN || &raw[..8] != DEBUG_COOKIE {
        return Err(DebugOffsetsError::NoCookie);
    }
    let w = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&raw[i * 8..i * 8 + 8]);
        u64::from_le_bytes(b)
    };
    if w(word::FREE_THREADED) != 0 {
        return Err(DebugOffsetsError::FreeThreaded);
    }
    let hex = w(word::VERSION);
    let minor = ((hex >> 16) & 0xff) as u32;
    let u = |i: usize| u32::try_from(w(i)).unwrap_or(PY_NO_OFFSET);
    let ascii = w(word::UNICODE_ASCII_SIZE);
    Ok((
        hex,
        Layout {
            walker: PyOffsets {
                version: 0x0300 | minor,
                flags: PY_LAYOUT_CSTACK_SHIMS,
                tstate_frame: u(word::TSTATE_CURRENT_FRAME),
                cframe_current: PY_NO_OFFSET,
                frame_previous: u(word::FRAME_PREVIOUS),
                frame_code: u(word::FRAME_EXECUTABLE),
                frame_instr: u(word::FRAME_INSTR_PTR),
                frame_owner: u(word::FRAME_OWNER),
                frame_is_entry: PY_NO_OFFSET,
                _pad: 0,
            },
            runtime_interpreters_head: w(word::RUNTIME_INTERPRETERS_HEAD),
            interp_next: w(word::INTERP_NEXT),
            interp_threads_head: w(word::INTERP_THREADS_HEAD),
            tstate_next: w(word::TSTATE_NEXT),
            tstate_thread_id: w(word::TSTATE_THREAD_ID),
            tstate_native_thread_id: Some(w(word::TSTATE_NATIVE_THREAD_ID)),
            code_filename: w(word::CODE_FILENAME),
            code_name: w(word::CODE_NAME),
            code_qualname: Some(w(word::CODE_QUALNAME)),
            code_firstlineno: w(word::CODE_FIRSTLINENO),
            code_linetable: w(word::CODE_LINETABLE),
            code_adaptive: Some(w(word::CODE_ADAPTIVE)),
            ascii_size: ascii,
            // PyCompactUnicodeObject = PyASCIIObject + utf8_length + utf8 (3.12+).
            compact_size: ascii + 16,
            bytes_sval: w(word::BYTES_SVAL),
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_cover_310_to_312_only() {
        assert!(table(9).is_none());
        assert!(table(13).is_none());
        for m in 10..=12 {
            let l = table(m).expect("a table");
            assert_eq!(l.walker.version, 0x0300 | m);
        }
    }

    #[test]
    fn debug_offsets_need_the_cookie() {
        assert_eq!(
            from_debug_offsets(&[0u8; DEBUG_OFFSETS_LEN]).err(),
            Some(DebugOffsetsError::NoCookie)
        );
    }
}
