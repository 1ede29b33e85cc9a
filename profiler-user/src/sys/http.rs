//! The one HTTP client of llmprof: a GET over HTTP/1.0 (the server closes the connection after the body, so no
//! chunked encoding or keep-alive is needed), in plain TCP or over TLS (rustls, the configuration the caller
//! built), with one deadline for everything and a cap on the answer.
//!
//! Owns the connection, the request line and headers, reading the answer until the server closes it and
//! splitting status and body. Its callers are the /metrics scraper (an engine's loopback port: a traced
//! process, so untrusted) and `serve`'s Alertmanager poller (a configured server, maybe remote): whoever
//! answers may trickle bytes or send gigabytes, so every step is bounded by the caller's deadline and the
//! answer by its byte cap. A name lookup is the one step a deadline cannot bound (std's resolver blocks): a
//! caller that asks for names runs the GET on a thread it can give up on. Never retries, never follows a
//! redirect.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Why a GET gave no answer. Each message holds its cause (no source chain), for callers that prefix it with
/// the server they asked.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The name did not resolve.
    #[error("{0}")]
    Resolve(std::io::Error),
    /// The name resolved to no address.
    #[error("no address")]
    NoAddress,
    /// The TLS session could not be set up (a bad server name, a certificate not trusted: the handshake runs
    /// with the first write or read, so its errors may also come as [`HttpError::Io`]).
    #[error("{0}")]
    Tls(String),
    /// Connecting, writing or reading failed.
    #[error("{0}")]
    Io(std::io::Error),
    /// The deadline passed.
    #[error("no answer in time")]
    TimedOut,
    /// The answer was larger than the cap.
    #[error("answer over {0} bytes")]
    TooLarge(u64),
    /// The answer is not an HTTP response.
    #[error("not an HTTP answer")]
    NotHttp,
}

/// One GET.
#[derive(Clone, Copy, Debug)]
pub struct Get<'a> {
    /// `host:port` (an IP literal is not looked up).
    pub authority: &'a str,
    /// The request path (with its query).
    pub path: &'a str,
    /// Headers besides `Host` (the authority).
    pub headers: &'a [(&'a str, &'a str)],
    /// Most bytes of the answer read (head and body).
    pub max_answer: u64,
    /// Over TLS: the name the certificate must carry and the configuration.
    pub tls: Option<(&'a str, &'a Arc<rustls::ClientConfig>)>,
}

/// A server's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The body, as text (invalid UTF-8 replaced).
    pub body: String,
}

/// What is left of `deadline` (an error once it passed).
fn left(deadline: Instant) -> Result<Duration, HttpError> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
        .ok_or(HttpError::TimedOut)
}

/// Connects to `authority` (its first address) within `deadline`.
pub fn connect(authority: &str, deadline: Instant) -> Result<TcpStream, HttpError> {
    let addr = authority
        .to_socket_addrs()
        .map_err(HttpError::Resolve)?
        .next()
        .ok_or(HttpError::NoAddress)?;
    TcpStream::connect_timeout(&addr, left(deadline)?).map_err(|e| match e.kind() {
        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => HttpError::TimedOut,
        _ => HttpError::Io(e),
    })
}

/// Connects and sends `req`, all within `deadline`.
pub fn get(req: &Get<'_>, deadline: Instant) -> Result<Response, HttpError> {
    get_on(connect(req.authority, deadline)?, req, deadline)
}

/// Sends `req` on a connection made by [`connect`] (the caller may look at it first, e.g. to know its own
/// port) and reads the answer, all within `deadline`.
pub fn get_on(tcp: TcpStream, req: &Get<'_>, deadline: Instant) -> Result<Response, HttpError> {
    let mut request = format!("GET {} HTTP/1.0\r\nHost: {}\r\n", req.path, req.authority);
    for (name, value) in req.headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    let mut raw = Vec::new();
    match req.tls {
        Some((name, config)) => {
            let name = rustls::pki_types::ServerName::try_from(name.to_owned())
                .map_err(|e| HttpError::Tls(e.to_string()))?;
            let conn = rustls::ClientConnection::new(config.clone(), name)
                .map_err(|e| HttpError::Tls(e.to_string()))?;
            let mut s = rustls::StreamOwned::new(conn, tcp);
            s.sock
                .set_write_timeout(Some(left(deadline)?))
                .map_err(HttpError::Io)?;
            s.write_all(request.as_bytes()).map_err(io_error)?;
            read_answer(
                &mut s,
                |s, d| s.sock.set_read_timeout(Some(d)),
                req.max_answer,
                deadline,
                &mut raw,
            )?;
        }
        None => {
            let mut s = tcp;
            s.set_write_timeout(Some(left(deadline)?))
                .map_err(HttpError::Io)?;
            s.write_all(request.as_bytes()).map_err(io_error)?;
            read_answer(
                &mut s,
                |s, d| s.set_read_timeout(Some(d)),
                req.max_answer,
                deadline,
                &mut raw,
            )?;
        }
    }
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").ok_or(HttpError::NotHttp)?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or(HttpError::NotHttp)?;
    Ok(Response {
        status,
        body: body.to_owned(),
    })
}

/// A timed-out socket operation as [`HttpError::TimedOut`], any other as [`HttpError::Io`].
fn io_error(e: std::io::Error) -> HttpError {
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => HttpError::TimedOut,
        _ => HttpError::Io(e),
    }
}

/// Reads `s` to its end (at most `max` bytes) with each read's timeout what is left of the deadline. A TLS
/// peer that closes without `close_notify` ends the answer too.
fn read_answer<S: Read>(
    s: &mut S,
    set_timeout: impl Fn(&S, Duration) -> std::io::Result<()>,
    max: u64,
    deadline: Instant,
    out: &mut Vec<u8>,
) -> Result<(), HttpError> {
    let mut buf = [0u8; 16 << 10];
    loop {
        set_timeout(s, left(deadline)?).map_err(HttpError::Io)?;
        match s.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => {
                out.extend_from_slice(&buf[..n]);
                if out.len() as u64 > max {
                    return Err(HttpError::TooLarge(max));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !out.is_empty() => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_error(e)),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests {
    use super::*;

    /// A loopback server answering each connection with `answer`, `chunk` bytes every `gap`; the request
    /// it read goes to the returned channel.
    fn server(answer: Vec<u8>, chunk: usize, gap: Duration) -> (u16, std::sync::mpsc::Receiver<String>) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for mut c in l.incoming().flatten() {
                let mut buf = [0u8; 4096];
                let n = c.read(&mut buf).unwrap_or(0);
                let _ = tx.send(String::from_utf8_lossy(&buf[..n]).into_owned());
                for part in answer.chunks(chunk) {
                    if c.write_all(part).is_err() {
                        break;
                    }
                    std::thread::sleep(gap);
                }
            }
        });
        (port, rx)
    }

    #[test]
    fn a_get_sends_its_headers_and_reads_status_and_body() {
        let (port, asked) = server(
            b"HTTP/1.0 404 Not Found\r\nContent-Length: 4\r\n\r\nnope".to_vec(),
            4096,
            Duration::ZERO,
        );
        let authority = format!("127.0.0.1:{port}");
        let r = get(
            &Get {
                authority: &authority,
                path: "/metrics?x=1",
                headers: &[("Accept", "text/plain")],
                max_answer: 1 << 20,
                tls: None,
            },
            Instant::now() + Duration::from_secs(5),
        )
        .unwrap();
        assert_eq!((r.status, r.body.as_str()), (404, "nope"));
        assert_eq!(
            asked.recv().unwrap(),
            format!("GET /metrics?x=1 HTTP/1.0\r\nHost: {authority}\r\nAccept: text/plain\r\n\r\n")
        );
    }

    #[test]
    fn a_trickled_or_oversized_answer_ends_at_the_deadline_or_the_cap() {
        let answer = b"HTTP/1.0 200 OK\r\n\r\n0123456789".to_vec();
        let (slow, _) = server(answer.clone(), 1, Duration::from_millis(100));
        let authority = format!("127.0.0.1:{slow}");
        let req = Get {
            authority: &authority,
            path: "/",
            headers: &[],
            max_answer: 1 << 20,
            tls: None,
        };
        let t0 = Instant::now();
        let e = get(&req, Instant::now() + Duration::from_millis(500)).unwrap_err();
        assert!(matches!(e, HttpError::TimedOut), "{e:?}");
        assert!(t0.elapsed() < Duration::from_secs(3));
        let (quick, _) = server(answer, 4096, Duration::ZERO);
        let authority = format!("127.0.0.1:{quick}");
        let e = get(
            &Get {
                authority: &authority,
                max_answer: 8,
                ..req
            },
            Instant::now() + Duration::from_secs(5),
        )
        .unwrap_err();
        assert!(matches!(e, HttpError::TooLarge(8)), "{e:?}");
    }
}
