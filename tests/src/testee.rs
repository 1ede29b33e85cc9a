//! The traced processes of the tests, driven line by line over stdin and stdout: `llmprof-testee` (its commands
//! are listed in `profiler-user/src/bin/llmprof-testee.rs`) and any other target that speaks the same way (the
//! compiled C fixtures, Python scripts): it prints a first line starting with `ready`, then answers each command
//! line with one line.
//!
//! One owner for spawning, talking to and reaping such a target: a test that panics halfway never leaves one
//! running ([`Testee`] kills it on drop).

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};

/// `llmprof-testee`, built by cargo beside `llmprof` when llmprof's tests are built (its `testee` feature; never
/// installed).
pub fn path() -> PathBuf {
    let p = crate::profile_dir().join("llmprof-testee");
    assert!(
        p.exists(),
        "{} not found: it is built with llmprof's tests (`cargo test -p llmprof --no-run`, or `cargo xtask test`)",
        p.display()
    );
    p
}

/// A running target: stdin and stdout piped, its `ready` line read. Killed and reaped on drop.
pub struct Testee {
    child: Child,
    /// None once [`Testee::close`] closed it.
    stdin: Option<ChildStdin>,
    /// None once [`Testee::discard_output`] handed it to a thread.
    stdout: Option<BufReader<ChildStdout>>,
    ready: String,
}

impl Testee {
    /// Starts `llmprof-testee ARGS`.
    pub fn spawn(args: &[&str]) -> Testee {
        Testee::start(Command::new(path()).args(args))
    }

    /// Starts `cmd` with stdin and stdout piped and reads its first line, which must start with `ready`.
    pub fn start(cmd: &mut Command) -> Testee {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"));
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("stdout is piped"));
        let mut t = Testee {
            child,
            stdin,
            stdout: Some(stdout),
            ready: String::new(),
        };
        let line = t.line();
        let Some(rest) = line.strip_prefix("ready") else {
            panic!("the target said {line:?}, expected `ready ...`");
        };
        t.ready = rest.trim().to_owned();
        t
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What followed `ready` on its first line (`llmprof-testee` prints its pid there).
    pub fn ready(&self) -> &str {
        &self.ready
    }

    /// Sends one command line, in one `write`: a target that answers each `read` (the C fixtures) must never
    /// see the command and its newline in two reads, or it answers twice and every later answer is one behind.
    /// (`writeln!` on the unbuffered pipe writes each piece of its format apart.)
    pub fn send(&mut self, cmd: &str) {
        let Some(stdin) = self.stdin.as_mut() else {
            panic!("the target's input is closed");
        };
        stdin
            .write_all(format!("{cmd}\n").as_bytes())
            .and_then(|()| stdin.flush())
            .unwrap_or_else(|e| panic!("writing {cmd:?} to the target: {e}"));
    }

    /// Its next line, trimmed; panics when it closed its output.
    pub fn line(&mut self) -> String {
        let Some(stdout) = self.stdout.as_mut() else {
            panic!("the target's output was discarded");
        };
        let mut line = String::new();
        let n = stdout
            .read_line(&mut line)
            .unwrap_or_else(|e| panic!("reading the target: {e}"));
        assert!(n > 0, "the target closed its output (exited?)");
        line.trim().to_owned()
    }

    /// Sends `cmd` and returns the answer line.
    pub fn ask(&mut self, cmd: &str) -> String {
        self.send(cmd);
        self.line()
    }

    /// Sends `cmd`; the answer must start with `prefix`: what follows it, trimmed.
    pub fn reply(&mut self, cmd: &str, prefix: &str) -> String {
        self.send(cmd);
        self.expect(prefix)
    }

    /// Sends `cmd` and asserts that the answer is `want`.
    pub fn cmd(&mut self, cmd: &str, want: &str) {
        let got = self.ask(cmd);
        assert_eq!(got, want, "the target's answer to {cmd:?}");
    }

    /// The next line, which must start with `prefix`; what follows it, trimmed.
    pub fn expect(&mut self, prefix: &str) -> String {
        let line = self.line();
        line.strip_prefix(prefix)
            .unwrap_or_else(|| panic!("the target said {line:?}, expected {prefix:?}..."))
            .trim()
            .to_owned()
    }

    /// Keeps reading (and dropping) its output on a thread from now on, so that it never blocks on a full pipe;
    /// [`Testee::line`] panics afterwards.
    pub fn discard_output(&mut self) {
        if let Some(out) = self.stdout.take() {
            std::thread::spawn(move || for _ in out.lines().map_while(Result::ok) {});
        }
    }

    /// The process, to signal or wait for it.
    pub fn child(&mut self) -> &mut Child {
        &mut self.child
    }

    /// Sends `exit`, closes its input and waits for it to end.
    pub fn exit(mut self) -> ExitStatus {
        // The target may be gone already (a test that killed it): the status says so.
        if let Some(stdin) = self.stdin.as_mut() {
            let _ = stdin.write_all(b"exit\n").and_then(|()| stdin.flush());
        }
        self.close()
    }

    /// Closes its input (it reads end of file) and waits for it to end.
    pub fn close(mut self) -> ExitStatus {
        drop(self.stdin.take());
        self.child
            .wait()
            .unwrap_or_else(|e| panic!("waiting for the target: {e}"))
    }
}

impl Drop for Testee {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A child process killed and reaped when the test ends, however it ends.
pub struct Reaped(pub Child);

impl Reaped {
    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
