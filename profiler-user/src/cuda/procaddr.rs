//! The entry points `cuGetProcAddress` hands out, for the functions llmprof probes.
//!
//! cudart (and so PyTorch) does not call libcuda's exported symbols by name: it asks the driver for function
//! pointers with `cuGetProcAddress_v2(name, &pfn, cudaVersion, flags, &status)`. When such a pointer is not
//! one of the exported symbols (a driver may hand out its internal implementation behind an exported
//! wrapper), a uprobe on the symbol never sees those calls. This module asks the same library file for the
//! pointers, in llmprof's own process (`dlopen` of the library the target mapped; `cuGetProcAddress` needs no
//! `cuInit` on current drivers; if one answers `CUDA_ERROR_NOT_INITIALIZED`, `cuInit(0)` is called once, which
//! creates no context), and turns each into an ELF virtual address of that file, which
//! `libcuda::resolve` adds as extra probe points. It never calls into the target.
//!
//! Loading a library runs its code in llmprof, as root: only a file the target maps that root owns and nobody
//! else may write ([`trusted`]) is loaded, through the descriptor [`crate::sys::target_file`] opened (the
//! inode the target maps, never a path it could swap). Any other library, say one a user built and named
//! `libcuda.so.1`, is read for its exported symbols only.

use std::ffi::{CString, c_char, c_int, c_void};
use std::os::fd::{AsFd, AsRawFd};

use llmprof_abi::CudaFunc;

use crate::sys::in_root;
use crate::sys::target_file::{self, Limits, Source};

/// `CU_GET_PROC_ADDRESS_DEFAULT`, `_LEGACY_STREAM`, `_PER_THREAD_DEFAULT_STREAM` (cuda.h).
const FLAGS: [u64; 3] = [0, 1, 2];
/// `CUDA_ERROR_NOT_INITIALIZED` (cuda.h).
const CUDA_ERROR_NOT_INITIALIZED: c_int = 3;
/// CUDA versions asked for (`cudaVersion` is 1000 × major + 10 × minor): what cudart 12 and 13 builds ask.
const VERSIONS: [c_int; 2] = [12_000, 13_000];

type GetProcAddressV2 =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> c_int;
type GetProcAddressV1 = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64) -> c_int;

/// Whether a library may be loaded into llmprof: owned by root, writable by nobody else.
pub fn trusted(st: &libc::stat) -> bool {
    st.st_uid == 0 && st.st_mode & 0o022 == 0
}

/// For each probed function, the distinct pointers the library's `cuGetProcAddress` returns, as
/// offsets from the library's load base (`dladdr`'s `dli_fbase`): `(function, offset)`. Empty when the
/// library cannot be read, is not [`trusted`], cannot be loaded here or has no `cuGetProcAddress`.
pub fn entry_points(lib: &Source) -> Vec<(CudaFunc, u64)> {
    let file = match target_file::open(lib, Limits::ELF) {
        Ok(f) => f,
        Err(e) => {
            log::debug!("gpu: {lib}: {e}");
            return Vec::new();
        }
    };
    match in_root::fstat(file.as_fd()) {
        Ok(st) if trusted(&st) => {}
        Ok(st) => {
            log::warn!(
                "gpu: {lib} belongs to uid {} (mode {:o}): not loaded into llmprof; entry points only \
                 cuGetProcAddress hands out are not probed",
                st.st_uid,
                st.st_mode & 0o7777
            );
            return Vec::new();
        }
        Err(e) => {
            log::debug!("gpu: {lib}: {e}");
            return Vec::new();
        }
    }
    // The descriptor's own path: the loader opens exactly the inode checked above.
    let Ok(path) = CString::new(format!("/proc/self/fd/{}", file.as_raw_fd())) else {
        return Vec::new();
    };
    // SAFETY: a valid NUL-terminated path. RTLD_NODELETE: the driver library is never unloaded from llmprof
    // (unloading libcuda is not supported by the driver); RTLD_LOCAL keeps its symbols out of our namespace.
    let h = unsafe {
        libc::dlopen(
            path.as_ptr(),
            libc::RTLD_LAZY | libc::RTLD_LOCAL | libc::RTLD_NODELETE,
        )
    };
    if h.is_null() {
        log::debug!("gpu: cannot dlopen {lib} for cuGetProcAddress");
        return Vec::new();
    }
    let sym = |name: &str| {
        let n = CString::new(name).ok()?;
        // SAFETY: `h` is a live handle, `n` a valid NUL-terminated name.
        let p = unsafe { libc::dlsym(h, n.as_ptr()) };
        (!p.is_null()).then_some(p)
    };
    let v2 = sym("cuGetProcAddress_v2");
    let v1 = sym("cuGetProcAddress");
    let Some(base) = v2.or(v1).and_then(load_base) else {
        return Vec::new();
    };
    let query = |out: &mut Vec<(CudaFunc, u64)>| -> bool {
        let mut not_initialized = false;
        for f in CudaFunc::ALL {
            let Ok(name) = CString::new(f.name()) else {
                continue;
            };
            for version in VERSIONS {
                for flags in FLAGS {
                    let mut pfn: *mut c_void = std::ptr::null_mut();
                    let mut status: c_int = 0;
                    let rc = match (v2, v1) {
                        // SAFETY: the symbol is the driver's cuGetProcAddress_v2 with this signature (cuda.h);
                        // every pointer is valid for the call.
                        (Some(p), _) => unsafe {
                            std::mem::transmute::<*mut c_void, GetProcAddressV2>(p)(
                                name.as_ptr(),
                                &mut pfn,
                                version,
                                flags,
                                &mut status,
                            )
                        },
                        // SAFETY: as above, for the older cuGetProcAddress.
                        (None, Some(p)) => unsafe {
                            std::mem::transmute::<*mut c_void, GetProcAddressV1>(p)(
                                name.as_ptr(),
                                &mut pfn,
                                version,
                                flags,
                            )
                        },
                        (None, None) => return false,
                    };
                    not_initialized |= rc == CUDA_ERROR_NOT_INITIALIZED;
                    if rc != 0 || pfn.is_null() {
                        continue;
                    }
                    // Only pointers into this library (not, e.g., into a tool that hooks the driver).
                    if load_base(pfn) != Some(base) {
                        continue;
                    }
                    let off = (pfn as u64).wrapping_sub(base);
                    if !out.contains(&(f, off)) {
                        out.push((f, off));
                    }
                }
            }
        }
        not_initialized
    };
    let mut out = Vec::new();
    if query(&mut out) && out.is_empty() {
        // A driver that wants cuInit first: initialize it in llmprof's process (no context, no GPU memory)
        // and ask again.
        if let Some(init) = sym("cuInit") {
            // SAFETY: the driver's cuInit(unsigned int flags); flags must be 0.
            let rc =
                unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn(u32) -> c_int>(init)(0) };
            log::debug!("gpu: cuGetProcAddress wanted cuInit; cuInit(0) = {rc}");
            query(&mut out);
        }
    }
    out
}

/// Load base of the object containing `addr` (`dladdr`'s `dli_fbase`).
fn load_base(addr: *mut c_void) -> Option<u64> {
    // SAFETY: Dl_info is plain data (pointers and integers); all-zero is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only looks the address up and fills `info`.
    let found = unsafe { libc::dladdr(addr, &mut info) } != 0;
    (found && !info.dli_fbase.is_null()).then_some(info.dli_fbase as u64)
}
