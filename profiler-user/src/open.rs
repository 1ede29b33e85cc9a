//! `llmprof open TRACE`: hands a trace file to Perfetto UI in one command.
//!
//! Owns a one-shot HTTP server on 127.0.0.1 that works the way Perfetto's own `open_trace_in_ui` helper does:
//! it answers `GET /<file name>` with the file and `Access-Control-Allow-Origin: https://ui.perfetto.dev`, and
//! stops once the file was fetched (or when the caller stops it). The UI is opened at
//! `https://ui.perfetto.dev/#!/?url=http://127.0.0.1:PORT/<name>`. It never listens on anything but loopback.

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
    port: u16,
}

impl TraceServer {
    /// Binds 127.0.0.1:`port` (0 = any free port) for `path`.
    pub fn bind(path: &Path, port: u16) -> Result<Self, OpenError> {
        File::open(path).map_err(|source| OpenError::Trace {
            path: path.to_owned(),
            source,
        })?;
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
            port,
        })
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// URL the trace is served at.
    pub fn file_url(&self) -> String {
        format!("http://127.0.0.1:{}/{}", self.port, self.name)
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
        if method != "GET" || target.trim_start_matches('/') != self.name {
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
            // A wrong path is a 404 and does not end the server.
            assert_eq!(e2e::http::get(port, "/other").unwrap().status, 404);
            let body = crate::metrics_scrape::get(&url).expect("trace served");
            assert_eq!(body.as_bytes(), b"\x0a\x00hello");
            assert!(h.join().unwrap(), "server ends after the fetch");
        });
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
