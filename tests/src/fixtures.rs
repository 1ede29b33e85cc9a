//! The files the tests build their targets from, and the one builder of each: scratch folders, the stand-in
//! CUDA libraries compiled from C (`profiler-user/tests/fixtures/`: `fake_libcuda.c` exporting the real driver
//! symbols, `fake_libcupti.c` with CUPTI 13's record layouts, the GPU hand-over helper and its testee), FIFOs.
//!
//! Never decides what a test checks; a build that fails panics with the compiler's message.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The C and Python sources of the test targets (`profiler-user/tests/fixtures/`).
pub fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../profiler-user/tests/fixtures")
}

/// An empty folder `<tmp>/<tag>-<pid of this test process>`: a leftover of an earlier run whose process had the
/// same id would hold stale files, so it is removed first.
pub fn scratch_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    dir
}

/// Whether `gcc` runs (the C fixtures need it).
pub fn have_gcc() -> bool {
    Command::new("gcc")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Flags of every shared library built here: position-independent, optimized a little, no warning let through,
/// threads (the stand-ins start their own).
const SHARED: [&str; 6] = ["-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-pthread"];

/// `gcc ARGS -o OUT fixtures/SRC`; panics with gcc's message when it fails.
pub fn gcc(args: &[&str], src: &str, out: &Path) {
    let src = dir().join(src);
    run_gcc(Command::new("gcc").args(args).arg("-o").arg(out).arg(&src), &src);
}

/// Runs the gcc command `cmd` that compiles `src`; panics with gcc's message when it fails.
fn run_gcc(cmd: &mut Command, src: &Path) {
    let o = cmd
        .output()
        .unwrap_or_else(|e| panic!("running gcc (apt-get install gcc): {e}"));
    assert!(
        o.status.success(),
        "gcc {}: {}",
        src.display(),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// The stand-in CUDA driver (`fake_libcuda.c`) as `dir/libcuda.so.1`.
pub fn stand_in_libcuda(dir: &Path) -> PathBuf {
    let out = dir.join("libcuda.so.1");
    gcc(&SHARED, "fake_libcuda.c", &out);
    out
}

/// The stand-in CUPTI (`fake_libcupti.c`) as `dir/libcupti.so`, where the injected helper's directory search
/// finds it when the stand-in libcuda sits in the same folder.
pub fn stand_in_libcupti(dir: &Path) -> PathBuf {
    let out = dir.join("libcupti.so");
    gcc(&SHARED, "fake_libcupti.c", &out);
    out
}

/// The stand-in of llmprof's CUPTI helper (`gpu_helper.c`: only the hand-over of activity chunks) as
/// `dir/<llmprof_abi::cupti::GPU_HELPER_LIB>`, and `gpu_testee.c` linked with it as `dir/gpu_testee`; returns the
/// testee.
pub fn gpu_helper_testee(dir: &Path, helper_lib: &str) -> PathBuf {
    gcc(&SHARED, "gpu_helper.c", &dir.join(helper_lib));
    let testee = dir.join("gpu_testee");
    let libdir = format!("-L{}", dir.display());
    let rpath = format!("-Wl,-rpath,{}", dir.display());
    let lib = helper_lib.strip_prefix("lib").and_then(|l| l.strip_suffix(".so"));
    let Some(lib) = lib else {
        panic!("{helper_lib} is not named libNAME.so");
    };
    let link = format!("-l{lib}");
    // The library goes after the source that uses it.
    let src = self::dir().join("gpu_testee.c");
    run_gcc(
        Command::new("gcc")
            .args(["-O1", "-Wall", "-Werror", "-o"])
            .arg(&testee)
            .arg(&src)
            .args([libdir.as_str(), link.as_str(), rpath.as_str()]),
        &src,
    );
    testee
}

/// Creates a FIFO at `p`.
pub fn mkfifo(p: &Path) {
    let Some(s) = p.to_str() else {
        panic!("{} is not UTF-8", p.display());
    };
    let c = std::ffi::CString::new(s).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    // SAFETY: a valid NUL-terminated path.
    let r = unsafe { libc::mkfifo(c.as_ptr(), 0o666) };
    assert_eq!(
        r,
        0,
        "mkfifo {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    );
}
