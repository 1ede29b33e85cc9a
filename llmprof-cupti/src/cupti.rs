//! Finding and loading the process's CUPTI library, and the CUPTI entry points the helper calls.
//!
//! Owns the search order (first match wins): a `libcupti.so*` already mapped in the process; the directories
//! of the mapped libcuda, libcudart and libtorch_cuda and PyTorch's pip layout next to them
//! (`site-packages/nvidia/cuda_cupti/lib`, `…/torch/lib/../../nvidia/cuda_cupti/lib`) and the toolkit's
//! `extras/CUPTI/lib64`; then the loader's own search for `libcupti.so`, `.so.13`, `.so.12`. The library is
//! opened `RTLD_NOW | RTLD_LOCAL` (its symbols stay out of the process's namespace) and never closed.

use std::ffi::{CString, c_char, c_void};
use std::path::{Path, PathBuf};

/// `CUptiResult`: `CUPTI_SUCCESS`.
pub const SUCCESS: u32 = 0;
/// `CUPTI_ERROR_MAX_LIMIT_REACHED`: `cuptiActivityGetNextRecord`'s end of buffer.
pub const MAX_LIMIT_REACHED: u32 = 12;
/// `CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED` (cupti_result.h).
pub const MULTIPLE_SUBSCRIBERS: u32 = 39;
/// `CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM`: thread ids as the kernel knows them (gettid).
pub const THREAD_ID_TYPE_SYSTEM: u32 = 1;
/// `CUPTI_ACTIVITY_FLAG_FLUSH_FORCED`: flush buffers that are not full too.
pub const FLUSH_FORCED: u32 = 1;

/// `CUpti_BuffersCallbackRequestFunc`.
pub type BufferRequested = extern "C" fn(*mut *mut u8, *mut usize, *mut usize);
/// `CUpti_BuffersCallbackCompleteFunc`.
pub type BufferCompleted = extern "C" fn(*mut c_void, u32, *mut u8, usize, usize);
/// `CUpti_CallbackFunc` (the helper subscribes only to hold CUPTI; it enables no callback domain).
pub type Callback = extern "C" fn(*mut c_void, u32, u32, *const c_void);

/// `CUptiResult f(uint32_t *)` (cuptiGetVersion).
type U32OutFn = unsafe extern "C" fn(*mut u32) -> u32;
/// `CUptiResult f(uint32_t)` (enable/disable a kind, flush, flush period, thread id type).
type U32Fn = unsafe extern "C" fn(u32) -> u32;
/// `cuptiSubscribe`.
type SubscribeFn = unsafe extern "C" fn(*mut *mut c_void, Callback, *mut c_void) -> u32;
/// `cuptiUnsubscribe`.
type UnsubscribeFn = unsafe extern "C" fn(*mut c_void) -> u32;
/// `cuptiActivityRegisterCallbacks`.
type RegisterFn = unsafe extern "C" fn(BufferRequested, BufferCompleted) -> u32;
/// `cuptiActivityGetNextRecord`.
type NextRecordFn = unsafe extern "C" fn(*mut u8, usize, *mut *mut u32) -> u32;
/// `cuptiActivityGetNumDroppedRecords`.
type DroppedFn = unsafe extern "C" fn(*mut c_void, u32, *mut usize) -> u32;
/// `cuptiGetTimestamp`.
type TimestampFn = unsafe extern "C" fn(*mut u64) -> u32;
/// `cuptiGetCallbackName(CUpti_CallbackDomain, uint32_t cbid, const char **name)`.
pub type CallbackNameFn = unsafe extern "C" fn(u32, u32, *mut *const c_char) -> u32;
/// `CUPTI_CB_DOMAIN_DRIVER_API` (cupti_callbacks.h).
pub const DOMAIN_DRIVER_API: u32 = 1;
/// `CUPTI_CB_DOMAIN_RUNTIME_API`.
pub const DOMAIN_RUNTIME_API: u32 = 2;

/// The CUPTI functions the helper uses, with cupti_activity.h / cupti_callbacks.h signatures.
#[derive(Clone, Copy, Debug)]
pub struct Api {
    pub get_version: U32OutFn,
    pub subscribe: SubscribeFn,
    pub unsubscribe: UnsubscribeFn,
    pub set_thread_id_type: U32Fn,
    pub register_callbacks: RegisterFn,
    pub enable: U32Fn,
    pub disable: U32Fn,
    pub flush_all: U32Fn,
    pub flush_period: U32Fn,
    pub get_next_record: NextRecordFn,
    pub get_num_dropped: DroppedFn,
    pub get_timestamp: TimestampFn,
    /// Optional: without it API calls are named by callback id.
    pub get_callback_name: Option<CallbackNameFn>,
}

/// Mapped files of `/proc/self/maps` (absolute paths, in map order, deduplicated).
fn mapped_files() -> Vec<PathBuf> {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = Vec::new();
    for line in maps.lines() {
        let Some(path) = line.splitn(6, char::is_whitespace).nth(5).map(str::trim_start) else {
            continue;
        };
        if path.starts_with('/') && !out.iter().any(|p| p.as_os_str() == path) {
            out.push(PathBuf::from(path));
        }
    }
    out
}

fn base_starts(p: &Path, prefix: &str) -> bool {
    p.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with(prefix))
}

/// True when a CUDA driver library (`libcuda.so*`) is mapped.
pub fn libcuda_mapped() -> bool {
    mapped_files().iter().any(|p| base_starts(p, "libcuda.so"))
}

/// The candidate files, in search order (see the module doc).
pub fn candidates() -> Vec<PathBuf> {
    let maps = mapped_files();
    let mut out: Vec<PathBuf> = maps
        .iter()
        .filter(|p| base_starts(p, "libcupti.so"))
        .cloned()
        .collect();
    for lib in ["libcuda.so", "libcudart.so", "libtorch_cuda.so"] {
        for p in maps.iter().filter(|p| base_starts(p, lib)) {
            let Some(dir) = p.parent() else { continue };
            for d in [
                dir.to_path_buf(),
                dir.join("../../nvidia/cuda_cupti/lib"),
                dir.join("../../cuda_cupti/lib"),
                dir.join("../extras/CUPTI/lib64"),
            ] {
                let Ok(rd) = std::fs::read_dir(&d) else { continue };
                let mut found: Vec<PathBuf> = rd
                    .flatten()
                    .map(|e| e.path())
                    .filter(|f| base_starts(f, "libcupti.so"))
                    .collect();
                // The plain name first, then the versioned ones.
                found.sort_by_key(|f| f.as_os_str().len());
                for f in found {
                    if !out.contains(&f) {
                        out.push(f);
                    }
                }
            }
        }
    }
    for plain in ["libcupti.so", "libcupti.so.13", "libcupti.so.12"] {
        out.push(PathBuf::from(plain));
    }
    out
}

/// Opens the first candidate that loads and exports every function of [`Api`].
pub fn load() -> Option<(Api, PathBuf)> {
    candidates()
        .into_iter()
        .find_map(|c| open(&c).map(|api| (api, c)))
}

fn open(path: &Path) -> Option<Api> {
    let c = CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: a valid NUL-terminated path; the handle is never closed, so the symbols below stay valid.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        return None;
    }
    let sym = |name: &std::ffi::CStr| -> Option<*mut c_void> {
        // SAFETY: `h` is a live handle and `name` NUL-terminated.
        let p = unsafe { libc::dlsym(h, name.as_ptr().cast::<c_char>()) };
        (!p.is_null()).then_some(p)
    };
    macro_rules! f {
        ($name:literal, $ty:ty) => {
            // SAFETY: the symbol is CUPTI's function of that name; the field's type is its C signature
            // (cupti_activity.h, cupti_callbacks.h, cupti_version.h).
            unsafe { std::mem::transmute::<*mut c_void, $ty>(sym($name)?) }
        };
    }
    Some(Api {
        get_version: f!(c"cuptiGetVersion", U32OutFn),
        subscribe: f!(c"cuptiSubscribe", SubscribeFn),
        unsubscribe: f!(c"cuptiUnsubscribe", UnsubscribeFn),
        set_thread_id_type: f!(c"cuptiSetThreadIdType", U32Fn),
        register_callbacks: f!(c"cuptiActivityRegisterCallbacks", RegisterFn),
        enable: f!(c"cuptiActivityEnable", U32Fn),
        disable: f!(c"cuptiActivityDisable", U32Fn),
        flush_all: f!(c"cuptiActivityFlushAll", U32Fn),
        flush_period: f!(c"cuptiActivityFlushPeriod", U32Fn),
        get_next_record: f!(c"cuptiActivityGetNextRecord", NextRecordFn),
        get_num_dropped: f!(c"cuptiActivityGetNumDroppedRecords", DroppedFn),
        get_timestamp: f!(c"cuptiGetTimestamp", TimestampFn),
        // SAFETY: as in `f!`: CUPTI's function of that name, with the field's C signature (cupti_callbacks.h).
        get_callback_name: sym(c"cuptiGetCallbackName")
            .map(|p| unsafe { std::mem::transmute::<*mut c_void, CallbackNameFn>(p) }),
    })
}
