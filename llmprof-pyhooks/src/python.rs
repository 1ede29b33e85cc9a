//! The few CPython C API functions the helper calls, found at run time in the process it was loaded into
//! (`dlsym` over the global scope: the `python3` executable exports its C API for extension modules, a
//! `libpython3.X.so` does as well). Stable since CPython 3.4: `Py_IsInitialized`, `PyGILState_Ensure`,
//! `PyGILState_Release`, `PyRun_SimpleStringFlags`.

use std::ffi::{CString, c_char, c_int, c_void};
use std::time::{Duration, Instant};

/// Longest the helper waits for an interpreter that is still starting.
pub const INIT_WAIT: Duration = Duration::from_secs(10);

type IsInitialized = unsafe extern "C" fn() -> c_int;
type GilEnsure = unsafe extern "C" fn() -> c_int;
type GilRelease = unsafe extern "C" fn(c_int);
type RunString = unsafe extern "C" fn(*const c_char, *mut c_void) -> c_int;

/// The functions, resolved.
pub struct Api {
    is_initialized: IsInitialized,
    gil_ensure: GilEnsure,
    gil_release: GilRelease,
    run_string: RunString,
}

/// The address of `name` in the process's global scope.
fn symbol(name: &str) -> Result<*mut c_void, String> {
    let c = CString::new(name).map_err(|_| format!("bad symbol name {name}"))?;
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only looks the symbol up.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c.as_ptr()) };
    if p.is_null() {
        Err(format!(
            "no {name} in this process: not a CPython interpreter, or one that does not export its C API"
        ))
    } else {
        Ok(p)
    }
}

impl Api {
    /// Looks the functions up.
    pub fn find() -> Result<Self, String> {
        let (a, b, c, d) = (
            symbol("Py_IsInitialized")?,
            symbol("PyGILState_Ensure")?,
            symbol("PyGILState_Release")?,
            symbol("PyRun_SimpleStringFlags")?,
        );
        // SAFETY: each symbol is the C API function of that name, whose signature is the one named (stable C
        // API); a function pointer has the size of a data pointer on every platform Linux runs on.
        unsafe {
            Ok(Api {
                is_initialized: std::mem::transmute::<*mut c_void, IsInitialized>(a),
                gil_ensure: std::mem::transmute::<*mut c_void, GilEnsure>(b),
                gil_release: std::mem::transmute::<*mut c_void, GilRelease>(c),
                run_string: std::mem::transmute::<*mut c_void, RunString>(d),
            })
        }
    }

    /// Waits (at most `limit`) until the interpreter is initialized.
    pub fn wait_initialized(&self, limit: Duration) -> Result<(), String> {
        let t0 = Instant::now();
        loop {
            // SAFETY: Py_IsInitialized takes no argument and may be called at any time, from any thread.
            if unsafe { (self.is_initialized)() } != 0 {
                return Ok(());
            }
            if t0.elapsed() >= limit {
                return Err("the Python interpreter is not initialized".into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Runs `source` in `__main__`'s namespace with the interpreter's lock, taken for this thread
    /// (`PyGILState_Ensure` creates its thread state; it waits while another thread holds the lock).
    pub fn run_with_gil(&self, source: &str) -> Result<(), String> {
        let code = CString::new(source).map_err(|_| "the hooks' source holds a NUL byte".to_owned())?;
        // SAFETY: the interpreter is initialized (checked by the caller); this thread is not Python's and holds
        // no lock, so Ensure/Release pair up around the call; the source is a valid C string for the call.
        let rc = unsafe {
            let state = (self.gil_ensure)();
            let rc = (self.run_string)(code.as_ptr(), std::ptr::null_mut());
            (self.gil_release)(state);
            rc
        };
        if rc == 0 {
            Ok(())
        } else {
            Err("the hooks' source raised (reported on the interpreter's stderr)".into())
        }
    }
}
