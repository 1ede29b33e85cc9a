//! `llmprof open TRACE`: hands a trace file to Perfetto UI in one command.
//!
//! Owns a one-shot HTTP server on 127.0.0.1 that works the way Perfetto's own `open_trace_in_ui` helper does:
//! it answers `GET /<secret>/<file name>` with the file and `Access-Control-Allow-Origin:
//! https://ui.perfetto.dev`, and stops once the file was fetched (or when the caller stops it). The UI is
//! opened at `https://ui.perfetto.dev/#!/?url=http://127.0.0.1:PORT/<secret>/<name>`. It never listens on
//! anything but loopback.
//!
//! Every local user can reach 127.0.0.1, and the port and the file's name show in `ps`: so the path carries
//! 128 random bits that only the link printed to the invoking user holds (every other path is a 404), and a
//! file the invoking user could not read themselves is refused before anything listens — `sudo llmprof
//! open` of a root-only trace would otherwise hand it to whoever asked first. The invoking user is the real
//! user, or under sudo the one sudo names (`SUDO_UID`/`SUDO_GID`); whether they could read the file is asked
//! of the kernel, by a child process running as them.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Default port: the one Perfetto's `open_trace_in_ui` uses (and the UI's CSP allows for 127.0.0.1).
pub const DEFAULT_PORT: u16 = 9001;
/// Origin of Perfetto UI, allowed to fetch the trace cross-origin.
pub const UI_ORIGIN: &str = "https://ui.perfetto.dev";

/// Errors of `llmprof open`.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The invoking user could not read the trace themselves.
    #[error(
        "{path} is not readable by uid {uid}, who ran llmprof open: it is not served (give them read access, \
         e.g. a copy they own, or open it as root without sudo)"
    )]
    NotTheirs {
        /// The trace.
        path: PathBuf,
        /// The invoking user.
        uid: u32,
    },
    /// The trace file cannot be read.
    #[error("cannot read trace {path}")]
    Trace {
        /// The path given.
        path: PathBuf,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// The port is taken or not bindable.
    #[error("cannot listen on 127.0.0.1:{port} (pick another with --port)")]
    Bind {
        /// Port.
        port: u16,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// Accepting or serving failed.
    #[error("serving the trace failed")]
    Io(#[from] io::Error),
}

/// A bound server for one trace file.
pub struct TraceServer {
    listener: TcpListener,
    path: PathBuf,
    name: String,
    /// 32 hex digits of randomness, the first component of the file's URL path.
    secret: String,
    port: u16,
}

/// Who ran `llmprof open`: the real user, or under sudo the user sudo names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invoker {
    /// Their uid.
    pub uid: u32,
    /// Their primary gid.
    pub gid: u32,
}

impl Invoker {
    /// The real user of this process, or `SUDO_UID`/`SUDO_GID` when root runs it through sudo.
    pub fn of_this_process() -> Invoker {
        // SAFETY: getuid/getgid have no preconditions and cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let var = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u32>().ok());
        match (uid, var("SUDO_UID"), var("SUDO_GID")) {
            (0, Some(u), Some(g)) => Invoker { uid: u, gid: g },
            _ => Invoker { uid, gid },
        }
    }
}

/// Whether `who` could open `path` for reading, asked of the kernel: a child process takes their uid, gid and
/// groups and opens it (`O_NONBLOCK`: a FIFO does not block it). Only root can do this for another user;
/// anyone else is asked about themselves, which is what their own open just did.
fn readable_by(path: &Path, who: &Invoker) -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 || who.uid == 0 {
        return true;
    }
    let Ok(cpath) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    let mut groups = vec![0 as libc::gid_t; 256];
    let mut n = groups.len() as libc::c_int;
    // SAFETY: getpwuid_r writes into `pw` and `buf`, both valid for the sizes given; the result pointer is
    // checked before use.
    let user = unsafe {
        let mut pw: libc::passwd = std::mem::zeroed();
        let mut buf = vec![0 as libc::c_char; 4096];
        let mut out: *mut libc::passwd = std::ptr::null_mut();
        let r = libc::getpwuid_r(who.uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut out);
        (r == 0 && !out.is_null()).then(|| std::ffi::CStr::from_ptr(pw.pw_name).to_owned())
    };
    match user {
        // SAFETY: getgrouplist writes at most `n` gids into `groups` and updates `n`.
        Some(name)
            if unsafe { libc::getgrouplist(name.as_ptr(), who.gid, groups.as_mut_ptr(), &mut n) } >= 0 =>
        {
            groups.truncate(n.max(0) as usize);
        }
        _ => groups = vec![who.gid],
    }
    // SAFETY: fork; the child only makes async-signal-safe syscalls (setgroups, setgid, setuid, open) and
    // _exits; the parent waits for it.
    unsafe {
        match libc::fork() {
            0 => {
                let ok = libc::setgroups(groups.len(), groups.as_ptr()) == 0
                    && libc::setgid(who.gid) == 0
                    && libc::setuid(who.uid) == 0
                    && libc::open(cpath.as_ptr(), libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY) >= 0;
                libc::_exit(if ok { 0 } else { 1 });
            }
            pid if pid > 0 => {
                let mut status = 0;
                libc::waitpid(pid, &mut status, 0) == pid
                    && libc::WIFEXITED(status)
                    && libc::WEXITSTATUS(status) == 0
            }
            _ => false,
        }
    }
}

/// 128 random bits as 32 hex digits.
fn secret() -> Result<String, OpenError> {
    let mut b = [0u8; 16];
    // SAFETY: getrandom writes at most `b.len()` bytes into `b`.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != b.len() as isize {
        return Err(OpenError::Io(io::Error::last_os_error()));
    }
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

impl TraceServer {
    /// Binds 127.0.0.1:`port` (0 = any free port) for `path`, when the user who ran llmprof could read it.
    pub fn bind(path: &Path, port: u16) -> Result<Self, OpenError> {
        Self::bind_for(path, port, &Invoker::of_this_process())
    }

    /// [`TraceServer::bind`] for a given invoking user.
    pub fn bind_for(path: &Path, port: u16, who: &Invoker) -> Result<Self, OpenError> {
        File::open(path).map_err(|source| OpenError::Trace {
            path: path.to_owned(),
            source,
        })?;
        if !readable_by(path, who) {
            return Err(OpenError::NotTheirs {
                path: path.to_owned(),
                uid: who.uid,
            });
        }
        let listener =
            TcpListener::bind(("127.0.0.1", port)).map_err(|source| OpenError::Bind { port, source })?;
        let port = listener.local_addr()?.port();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "trace.perfetto-trace".to_owned());
        // Only characters that need no escaping in a URL path (our default names are of this form).
        let name: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        Ok(Self {
            listener,
            path: path.to_owned(),
            name,
            secret: secret()?,
            port,
        })
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// URL the trace is served at (its path holds the secret).
    pub fn file_url(&self) -> String {
        format!("http://127.0.0.1:{}/{}/{}", self.port, self.secret, self.name)
    }

    /// The Perfetto UI deep link that loads the trace.
    pub fn ui_url(&self) -> String {
        format!("{UI_ORIGIN}/#!/?url={}", self.file_url())
    }

    /// Serves until the file was sent once or `stop` is set. Returns whether the file was fetched.
    pub fn serve(&self, stop: &AtomicBool) -> Result<bool, OpenError> {
        self.listener.set_nonblocking(true)?;
        loop {
            if stop.load(Ordering::Relaxed) {
                return Ok(false);
            }
            match self.listener.accept() {
                Ok((s, _)) => {
                    s.set_nonblocking(false)?;
                    if self.handle(s)? {
                        return Ok(true);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Answers one request; true when it was the trace file, sent completely.
    fn handle(&self, mut s: TcpStream) -> Result<bool, OpenError> {
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut r = BufReader::new(s.try_clone()?);
        let mut line = String::new();
        if r.read_line(&mut line).is_err() {
            return Ok(false);
        }
        // Drain the headers.
        loop {
            let mut h = String::new();
            match r.read_line(&mut h) {
                Ok(0) | Err(_) => break,
                Ok(_) if h == "\r\n" || h == "\n" => break,
                Ok(_) => {}
            }
        }
        let mut parts = line.split_whitespace();
        let method = parts.next().unwrap_or("");
        let target = parts.next().unwrap_or("");
        let cors = format!("Access-Control-Allow-Origin: {UI_ORIGIN}\r\n");
        if method == "OPTIONS" {
            write!(
                s,
                "HTTP/1.1 204 No Content\r\n{cors}Access-Control-Allow-Methods: GET\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            )?;
            return Ok(false);
        }
        if method != "GET" || target != format!("/{}/{}", self.secret, self.name) {
            write!(
                s,
                "HTTP/1.1 404 Not Found\r\n{cors}Content-Length: 0\r\nConnection: close\r\n\r\n"
            )?;
            return Ok(false);
        }
        let mut f = File::open(&self.path).map_err(|source| OpenError::Trace {
            path: self.path.clone(),
            source,
        })?;
        let len = f.metadata()?.len();
        write!(
            s,
            "HTTP/1.1 200 OK\r\n{cors}Content-Type: application/octet-stream\r\nContent-Length: {len}\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n"
        )?;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                break;
            }
            if s.write_all(&buf[..n]).is_err() {
                return Ok(false);
            }
        }
        s.flush()?;
        Ok(true)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests {
    use super::*;

    #[test]
    fn serves_the_file_once_with_the_ui_origin_allowed() {
        let dir = std::env::temp_dir().join(format!("llmprof-open-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.perfetto-trace");
        std::fs::write(&path, b"\x0a\x00hello").unwrap();
        let srv = TraceServer::bind(&path, 0).unwrap();
        assert!(
            srv.ui_url()
                .starts_with("https://ui.perfetto.dev/#!/?url=http://127.0.0.1:")
        );
        let url = srv.file_url();
        let port = srv.port();
        let stop = AtomicBool::new(false);
        std::thread::scope(|sc| {
            let h = sc.spawn(|| srv.serve(&stop).unwrap());
            // A wrong path is a 404 and does not end the server; so is the file's name without the secret.
            assert_eq!(e2e::http::get(port, "/other").unwrap().status, 404);
            assert_eq!(e2e::http::get(port, "/t.perfetto-trace").unwrap().status, 404);
            let body = crate::metrics_scrape::get(&url).expect("trace served");
            assert_eq!(body.as_bytes(), b"\x0a\x00hello");
            assert!(h.join().unwrap(), "server ends after the fetch");
        });
        let a = TraceServer::bind(&path, 0).unwrap();
        assert_ne!(
            a.file_url(),
            TraceServer::bind(&path, 0).unwrap().file_url(),
            "a new secret each time"
        );
        assert!(a.file_url().ends_with("/t.perfetto-trace") && a.file_url().len() > 60);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_file_the_invoking_user_cannot_read_is_not_served() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        let dir = std::env::temp_dir().join(format!("llmprof-open-perm-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = dir.join("root-only.perfetto-trace");
        std::fs::write(&path, b"secret trace").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        // `sudo llmprof open` by uid 65534.
        let nobody = Invoker {
            uid: 65534,
            gid: 65534,
        };
        let e = TraceServer::bind_for(&path, 0, &nobody).err().unwrap();
        assert!(matches!(e, OpenError::NotTheirs { uid: 65534, .. }), "{e}");
        assert!(e.to_string().contains("not served"), "{e}");
        // Root itself, or a file they may read: served.
        assert!(TraceServer::bind_for(&path, 0, &Invoker { uid: 0, gid: 0 }).is_ok());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let tmp_is_searchable =
            std::fs::metadata(std::env::temp_dir()).is_ok_and(|m| m.permissions().mode() & 0o001 != 0);
        if tmp_is_searchable {
            assert!(TraceServer::bind_for(&path, 0, &nobody).is_ok());
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
