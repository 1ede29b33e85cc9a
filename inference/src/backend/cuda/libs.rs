//! Finding and loading the CUDA libraries before cudarc touches them.
//!
//! cudarc loads `libcuda` and `libnvrtc` lazily by name and panics when one is missing, so this module loads them
//! first and turns every failure into a [`LibError`] that says what to do. The driver (`libcuda.so.1`) comes from
//! the dynamic linker's normal search (it is installed with the kernel driver). NVRTC is looked up by name first
//! (which honours `LD_LIBRARY_PATH`), then in the usual install places: `$CUDA_HOME`/`$CUDA_PATH`/`$CUDA_ROOT`
//! `/lib64`, `/usr/local/cuda/lib64`, `/usr/local/cuda-*/lib64` (newest first), and the `nvidia/*/lib`
//! folders of pip wheels under Python's site-packages. A library found by path is loaded with `RTLD_GLOBAL`,
//! after which cudarc's own load by soname (`libnvrtc.so.13`) finds the already loaded copy. NVRTC's
//! `libnvrtc-builtins` next to it is loaded the same way. The paths actually loaded are read back from
//! `/proc/self/maps` and reported. Loading happens once per process.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Soname of the CUDA driver library (installed by the NVIDIA kernel driver).
pub const DRIVER_SONAME: &str = "libcuda.so.1";

/// NVRTC sonames tried through the linker's search, newest API first (cudarc's `cuda-13000` candidates include
/// `.so.13` and `.so.12`).
pub const NVRTC_SONAMES: &[&str] = &["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"];

/// Environment variables naming a CUDA toolkit root (as cudarc's build script and CMake read them).
pub const CUDA_ROOT_VARS: &[&str] = &["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT", "CUDA_TOOLKIT_ROOT_DIR"];

/// Why the CUDA libraries cannot be used.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum LibError {
    /// `libcuda.so.1` could not be loaded: no NVIDIA driver on this machine.
    #[error(
        "the CUDA driver library {DRIVER_SONAME} cannot be loaded ({reason}): no NVIDIA driver is installed here"
    )]
    NoDriver {
        /// The dynamic linker's message.
        reason: String,
    },
    /// The driver loaded but `cuInit` failed or there is no GPU.
    #[error("the CUDA driver is installed but unusable: {0}")]
    Driver(String),
    /// NVRTC (the run-time CUDA compiler) was not found.
    #[error(
        "NVRTC (libnvrtc.so.13 or .12) not found by name or in {searched}; install the CUDA toolkit or the \
         nvidia-cuda-nvrtc pip wheel, or add its lib folder to LD_LIBRARY_PATH"
    )]
    NoNvrtc {
        /// The folders searched, comma-separated.
        searched: String,
    },
}

/// The libraries in use.
#[derive(Debug, Clone)]
pub struct CudaLibraries {
    /// File of the driver library, as mapped.
    pub driver_path: String,
    /// Driver API version, e.g. 13000.
    pub driver_version: i32,
    /// GPUs visible.
    pub device_count: i32,
    /// File of NVRTC, as mapped.
    pub nvrtc_path: String,
    /// NVRTC version (major, minor).
    pub nvrtc_version: (i32, i32),
}

impl fmt::Display for CudaLibraries {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "driver {} (CUDA {}, {} GPU(s)), NVRTC {}.{} {}",
            self.driver_path,
            version_string(self.driver_version),
            self.device_count,
            self.nvrtc_version.0,
            self.nvrtc_version.1,
            self.nvrtc_path
        )
    }
}

/// `13000` → `13.0`.
pub fn version_string(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

/// The folders searched for NVRTC after the linker's own search, in order, given the environment `env`.
pub fn nvrtc_search_dirs(env: &dyn Fn(&str) -> Option<String>) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(ld) = env("LD_LIBRARY_PATH") {
        dirs.extend(ld.split(':').filter(|s| !s.is_empty()).map(PathBuf::from));
    }
    for var in CUDA_ROOT_VARS {
        if let Some(root) = env(var).filter(|s| !s.is_empty()) {
            dirs.push(Path::new(&root).join("lib64"));
            dirs.push(Path::new(&root).join("lib"));
        }
    }
    dirs.push(PathBuf::from("/usr/local/cuda/lib64"));
    dirs.extend(newest_first(glob_dirs(Path::new("/usr/local"), "cuda-", "lib64")));
    // pip wheels: site-packages/nvidia/{cuda_nvrtc,cu13,...}/lib.
    for site in python_site_dirs(env) {
        let nv = site.join("nvidia");
        if let Ok(rd) = std::fs::read_dir(&nv) {
            let mut subs: Vec<PathBuf> = rd.flatten().map(|e| e.path().join("lib")).collect();
            subs.sort();
            subs.reverse();
            dirs.extend(subs);
        }
    }
    dirs.push(PathBuf::from("/usr/lib/x86_64-linux-gnu"));
    let mut seen = std::collections::HashSet::new();
    dirs.retain(|d| seen.insert(d.clone()));
    dirs
}

/// `BASE/PREFIX*/SUB` folders.
fn glob_dirs(base: &Path, prefix: &str, sub: &str) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(base) else {
        return Vec::new();
    };
    rd.flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
        .map(|e| e.path().join(sub))
        .collect()
}

/// Sorts paths by the version numbers in them, newest first (`cuda-13.0` before `cuda-12.9` before
/// `cuda-12.10`'s predecessor `cuda-12.2`).
pub fn newest_first(mut v: Vec<PathBuf>) -> Vec<PathBuf> {
    fn key(p: &Path) -> Vec<u64> {
        p.to_string_lossy()
            .split(|c: char| !c.is_ascii_digit())
            .filter(|s| !s.is_empty())
            .filter_map(|s| s.parse().ok())
            .collect()
    }
    v.sort_by_key(|p| std::cmp::Reverse(key(p)));
    v
}

/// Python site-packages folders: `$VIRTUAL_ENV`, `~/.local`, pyenv's `~/.pyenv/versions/*`, `/usr/local`, `/usr`,
/// `/opt/conda` and `/opt/conda/envs/*`, each `lib/python3*/{site,dist}-packages`.
fn python_site_dirs(env: &dyn Fn(&str) -> Option<String>) -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = Vec::new();
    if let Some(v) = env("VIRTUAL_ENV") {
        roots.push(Path::new(&v).join("lib"));
    }
    if let Some(h) = env("HOME") {
        roots.push(Path::new(&h).join(".local/lib"));
        // pyenv interpreters: ~/.pyenv/versions/*/lib.
        roots.extend(newest_first(glob_dirs(
            &Path::new(&h).join(".pyenv/versions"),
            "",
            "lib",
        )));
    }
    for r in ["/usr/local/lib", "/usr/lib", "/opt/conda/lib"] {
        roots.push(PathBuf::from(r));
    }
    roots.extend(glob_dirs(Path::new("/opt/conda/envs"), "", "lib"));
    let mut out = Vec::new();
    for root in roots {
        for py in newest_first(glob_dirs(&root, "python3", "")) {
            for s in ["site-packages", "dist-packages"] {
                out.push(py.join(s));
            }
        }
    }
    out
}

/// Files in `dir` whose names start with `prefix` (e.g. `libnvrtc.so.`), newest version first.
pub fn find_versioned(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    newest_first(
        rd.flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
            .map(|e| e.path())
            .collect(),
    )
}

/// The path of the first mapped file in `/proc/self/maps` text `maps` whose file name starts with `name`.
pub fn mapped_path(maps: &str, name: &str) -> Option<String> {
    maps.lines().find_map(|line| {
        let path = line.split_whitespace().nth(5)?;
        let file = Path::new(path).file_name()?.to_string_lossy();
        file.starts_with(name).then(|| path.to_string())
    })
}

fn self_mapped_path(name: &str) -> Option<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    mapped_path(&maps, name)
}

/// Opens a library with `RTLD_NOW | RTLD_GLOBAL` and keeps it loaded for the life of the process.
fn open_global(name: &Path) -> Result<(), String> {
    use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
    // SAFETY: loading a shared library runs its initializers; the CUDA libraries' initializers are safe to run
    // on any thread. The handle is leaked on purpose so the library stays loaded for cudarc's lookups.
    let lib = unsafe { Library::open(Some(name), RTLD_NOW | RTLD_GLOBAL) }.map_err(|e| {
        let mut msg = e.to_string();
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            msg = format!("{msg}: {s}");
            src = s.source();
        }
        msg
    })?;
    std::mem::forget(lib);
    Ok(())
}

/// Loads the driver and NVRTC once, initializes the driver, and reports what was loaded.
pub fn load() -> Result<CudaLibraries, LibError> {
    static LOADED: OnceLock<Result<CudaLibraries, LibError>> = OnceLock::new();
    LOADED.get_or_init(load_uncached).clone()
}

fn load_uncached() -> Result<CudaLibraries, LibError> {
    open_global(Path::new(DRIVER_SONAME)).map_err(|reason| LibError::NoDriver { reason })?;
    // SAFETY: only checks that cudarc's own load of the driver library will succeed (it was just loaded).
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(LibError::NoDriver {
            reason: "loaded, but not under a name cudarc looks for".into(),
        });
    }
    let driver_path = self_mapped_path("libcuda.so").unwrap_or_else(|| DRIVER_SONAME.to_string());
    cudarc::driver::result::init().map_err(|e| LibError::Driver(format!("cuInit failed: {e}")))?;
    let mut driver_version = 0;
    // SAFETY: the driver is loaded and initialized; the pointer is to a live i32.
    unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver_version) }
        .result()
        .map_err(|e| LibError::Driver(format!("cuDriverGetVersion failed: {e}")))?;
    let device_count = cudarc::driver::CudaContext::device_count()
        .map_err(|e| LibError::Driver(format!("cuDeviceGetCount failed: {e}")))?;
    if device_count < 1 {
        return Err(LibError::Driver(
            "no CUDA device is visible (check nvidia-smi and CUDA_VISIBLE_DEVICES)".into(),
        ));
    }

    let nvrtc_path = load_nvrtc()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: NVRTC is loaded (checked by load_nvrtc); the pointers are to live i32s.
    unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    Ok(CudaLibraries {
        driver_path,
        driver_version,
        device_count,
        nvrtc_path,
        nvrtc_version: (major, minor),
    })
}

/// Loads NVRTC (and its builtins library) and returns the mapped path. Needs no GPU or driver: NVRTC compiles
/// for any architecture, so the kernels' compilation is tested wherever NVRTC is installed.
pub fn load_nvrtc() -> Result<String, LibError> {
    let by_name = NVRTC_SONAMES.iter().any(|n| open_global(Path::new(n)).is_ok());
    let mut searched = Vec::new();
    if !by_name {
        let env = |k: &str| std::env::var(k).ok();
        let dirs = nvrtc_search_dirs(&env);
        let found = dirs.iter().any(|d| {
            searched.push(d.display().to_string());
            find_versioned(d, "libnvrtc.so.")
                .iter()
                .any(|f| open_global(f).is_ok())
        });
        if !found {
            return Err(LibError::NoNvrtc {
                searched: searched.join(", "),
            });
        }
    }
    // SAFETY: only checks that cudarc's own load of NVRTC will now succeed.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(LibError::NoNvrtc {
            searched: format!(
                "{} (a libnvrtc was loaded but has no soname cudarc looks for: {NVRTC_SONAMES:?})",
                searched.join(", ")
            ),
        });
    }
    let path = self_mapped_path("libnvrtc.so").unwrap_or_else(|| "libnvrtc (by name)".to_string());
    // NVRTC opens libnvrtc-builtins at compile time; load the one beside it so its own search cannot miss.
    if let Some(dir) = Path::new(&path).parent()
        && self_mapped_path("libnvrtc-builtins").is_none()
        && let Some(b) = find_versioned(dir, "libnvrtc-builtins.so.").first()
    {
        let _ = open_global(b);
    }
    Ok(path)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests unwrap to fail loudly")]
mod tests {
    use super::*;

    #[test]
    fn search_dirs_honour_ld_library_path_and_cuda_home_first() {
        let env = |k: &str| match k {
            "LD_LIBRARY_PATH" => Some("/opt/a::/opt/b".to_string()),
            "CUDA_HOME" => Some("/opt/cuda".to_string()),
            _ => None,
        };
        let d = nvrtc_search_dirs(&env);
        assert_eq!(d[0], PathBuf::from("/opt/a"));
        assert_eq!(d[1], PathBuf::from("/opt/b"));
        assert_eq!(d[2], PathBuf::from("/opt/cuda/lib64"));
        assert!(d.contains(&PathBuf::from("/usr/local/cuda/lib64")));
        let unique: std::collections::HashSet<_> = d.iter().collect();
        assert_eq!(unique.len(), d.len(), "no folder twice");
    }

    #[test]
    fn search_dirs_include_pip_wheel_lib_folders() {
        let venv = std::env::temp_dir().join(format!("llmserve-venv-{}", std::process::id()));
        let lib = venv.join("lib/python3.12/site-packages/nvidia/cu13/lib");
        std::fs::create_dir_all(&lib).unwrap();
        let v = venv.display().to_string();
        let env = move |k: &str| (k == "VIRTUAL_ENV").then(|| v.clone());
        let dirs = nvrtc_search_dirs(&env);
        assert!(
            dirs.iter().any(|d| d.ends_with("site-packages/nvidia/cu13/lib")),
            "{dirs:?}"
        );
        std::fs::remove_dir_all(&venv).ok();
    }

    #[test]
    fn versions_sort_newest_first() {
        let v = newest_first(vec![
            PathBuf::from("/usr/local/cuda-12.2/lib64"),
            PathBuf::from("/usr/local/cuda-13.0/lib64"),
            PathBuf::from("/usr/local/cuda-12.10/lib64"),
        ]);
        assert_eq!(
            v,
            vec![
                PathBuf::from("/usr/local/cuda-13.0/lib64"),
                PathBuf::from("/usr/local/cuda-12.10/lib64"),
                PathBuf::from("/usr/local/cuda-12.2/lib64"),
            ]
        );
        assert_eq!(version_string(13000), "13.0");
        assert_eq!(version_string(12090), "12.9");
    }

    #[test]
    fn finds_versioned_files_in_a_folder() {
        let dir = std::env::temp_dir().join(format!("llmserve-libs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for f in [
            "libnvrtc.so.12",
            "libnvrtc.so.13.0.48",
            "libnvrtc-builtins.so.13.0",
            "other.so",
        ] {
            std::fs::write(dir.join(f), b"").unwrap();
        }
        let found = find_versioned(&dir, "libnvrtc.so.");
        assert_eq!(
            found,
            vec![dir.join("libnvrtc.so.13.0.48"), dir.join("libnvrtc.so.12")]
        );
        assert_eq!(
            find_versioned(&dir, "libnvrtc-builtins.so."),
            vec![dir.join("libnvrtc-builtins.so.13.0")]
        );
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn mapped_path_reads_proc_maps_lines() {
        let maps = "7f00-7f10 r--p 00000000 08:01 123 /usr/lib/x86_64-linux-gnu/libc.so.6\n\
                    7f20-7f30 r-xp 00001000 08:01 456 /usr/local/cuda-13.0/lib64/libnvrtc.so.13.0.48\n\
                    7f40-7f50 rw-p 00000000 00:00 0 \n";
        assert_eq!(
            mapped_path(maps, "libnvrtc.so").as_deref(),
            Some("/usr/local/cuda-13.0/lib64/libnvrtc.so.13.0.48")
        );
        assert_eq!(mapped_path(maps, "libcuda.so"), None);
    }

    #[test]
    fn without_a_driver_loading_fails_with_a_clear_error_not_a_panic() {
        // On machines with an NVIDIA driver this test has nothing to check.
        if Path::new("/proc/driver/nvidia").exists() {
            eprintln!("NVIDIA driver present: skipping the no-driver check");
            return;
        }
        match load() {
            Err(e @ LibError::NoDriver { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains("libcuda.so.1"), "{msg}");
                assert!(msg.contains("no NVIDIA driver"), "{msg}");
            }
            Err(e) => panic!("expected NoDriver, got {e}"),
            Ok(l) => panic!("loaded CUDA without a driver? {l}"),
        }
    }
}
