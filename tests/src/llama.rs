//! llama.cpp's OpenAI server (`python -m llama_cpp.server` from the servers venv, `cargo xtask setup`) started
//! the way vLLM-like servers run: as the child of a launcher process. Shared by the wire test and the stack
//! test.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::wire::children;
use crate::{default_model, http};

/// Kills the launcher and the server (its child) when the test ends, whatever happens.
pub struct Server {
    /// The launcher (`python -c ...`), the pid to attach to.
    pub launcher: Child,
    /// The server process (the launcher's child).
    pub pid: u32,
}

impl Drop for Server {
    fn drop(&mut self) {
        // SAFETY: kill(2) on pids this test started; no memory-safety preconditions.
        unsafe {
            libc::kill(self.pid as i32, libc::SIGKILL);
        }
        let _ = self.launcher.kill();
        let _ = self.launcher.wait();
    }
}

/// Starts `python -m llama_cpp.server` as the child of a launcher process (the vLLM shape) and waits until it
/// answers.
pub fn start_server(python: &Path, port: u16) -> Server {
    let launcher_src = "import subprocess, sys\n\
                        p = subprocess.Popen([sys.executable, '-m', 'llama_cpp.server'] + sys.argv[1:])\n\
                        sys.exit(p.wait())\n";
    let model = default_model();
    let launcher = Command::new(python)
        .args(["-c", launcher_src])
        .args(["--model"])
        .arg(&model)
        .args([
            "--port",
            &port.to_string(),
            "--n_ctx",
            "2048",
            "--verbose",
            "false",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the llama_cpp.server launcher");
    let deadline = Instant::now() + Duration::from_secs(120);
    let launcher_pid = launcher.id();
    let mut server = Server { launcher, pid: 0 };
    loop {
        if server.pid == 0 {
            server.pid = children(launcher_pid).first().copied().unwrap_or(0);
        }
        if server.pid != 0 && http::get(port, "/v1/models").is_ok_and(|r| r.status == 200) {
            return server;
        }
        assert!(
            Instant::now() < deadline,
            "llama_cpp.server did not answer within 120 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
