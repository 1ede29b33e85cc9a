//! The one HTTP client of the workspace's tests: blocking HTTP/1.1 over std's `TcpStream` to loopback, enough
//! for JSON APIs, chunked transfer, SSE bodies and a client that walks away mid-stream (no client library).
//!
//! Every request is sent with `Connection: close`; the response is read whole (by `Content-Length`, chunk by
//! chunk, or to the end of the stream). It never retries and never follows redirects: a test sees exactly what
//! the server answered. Errors are `io::Error`s, so a test that polls a starting daemon can treat them as
//! "not yet".

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// How long a read may wait for the server (a request to the engine may generate for minutes on a loaded
/// machine).
pub const READ_TIMEOUT: Duration = Duration::from_secs(300);

/// A response: status code, headers and the body (de-chunked).
#[derive(Debug)]
pub struct Response {
    /// HTTP status code.
    pub status: u16,
    /// Headers in arrival order, names lower-cased.
    pub headers: Vec<(String, String)>,
    /// The body, de-chunked.
    pub body: Vec<u8>,
}

impl Response {
    /// The body as text (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON; panics with the body when it is not.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    /// The first value of header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The `data:` payloads of an SSE (`text/event-stream`) body, in order.
    pub fn sse_events(&self) -> Vec<String> {
        self.text()
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(str::to_string)
            .collect()
    }
}

/// Sends one request to 127.0.0.1:`port` and reads the whole response. Adds only `Host`, `Connection: close`
/// and (with a body) `Content-Length`: every other header, `Content-Type` included, is the caller's.
pub fn request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> std::io::Result<Response> {
    let s = send(port, method, path, headers, body)?;
    read_response(BufReader::new(s))
}

/// GET `path`.
pub fn get(port: u16, path: &str) -> std::io::Result<Response> {
    request(port, "GET", path, &[], None)
}

/// POST a JSON `body` (with `Content-Type: application/json`) and `headers`.
pub fn post_json(port: u16, path: &str, headers: &[(&str, &str)], body: &str) -> std::io::Result<Response> {
    let mut all = vec![("Content-Type", "application/json")];
    all.extend_from_slice(headers);
    request(port, "POST", path, &all, Some(body.as_bytes()))
}

/// POSTs a JSON `body` and returns the socket once `min_bytes` of the response arrived (or the response ended):
/// the caller reads the rest of a stream itself, or drops the socket to disconnect mid-stream.
pub fn open_stream(port: u16, path: &str, body: &str, min_bytes: usize) -> std::io::Result<TcpStream> {
    let mut s = send(
        port,
        "POST",
        path,
        &[("Content-Type", "application/json")],
        Some(body.as_bytes()),
    )?;
    let mut got = 0;
    let mut buf = [0u8; 4096];
    while got < min_bytes {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
    }
    Ok(s)
}

/// Connects and writes the request; returns the socket to read the response from.
fn send(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> std::io::Result<TcpStream> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(READ_TIMEOUT))?;
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if let Some(b) = body {
        head.push_str(&format!("Content-Length: {}\r\n", b.len()));
    }
    head.push_str("\r\n");
    let mut req = head.into_bytes();
    req.extend_from_slice(body.unwrap_or_default());
    s.write_all(&req)?;
    Ok(s)
}

/// Reads a status line, headers and the body (by `Content-Length`, chunked, or to the end of the stream).
fn read_response(mut r: impl BufRead) -> std::io::Result<Response> {
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line {line:?}")))?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let value = |name: &str| headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
    let chunked = value("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
    let length = value("content-length").and_then(|v| v.parse::<usize>().ok());
    let body = if chunked {
        read_chunked(&mut r)?
    } else if let Some(n) = length {
        let mut body = vec![0; n];
        r.read_exact(&mut body)?;
        body
    } else {
        let mut body = Vec::new();
        r.read_to_end(&mut body)?;
        body
    };
    Ok(Response {
        status,
        headers,
        body,
    })
}

/// A chunked body (chunk extensions ignored, trailers skipped).
fn read_chunked(r: &mut impl BufRead) -> std::io::Result<Vec<u8>> {
    let mut body = Vec::new();
    let mut line = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let size = line.split(';').next().unwrap_or_default().trim();
        let n = usize::from_str_radix(size, 16)
            .map_err(|e| std::io::Error::other(format!("bad chunk size {line:?}: {e}")))?;
        if n == 0 {
            // Trailers, up to the empty line (or the end of the stream).
            loop {
                line.clear();
                if r.read_line(&mut line)? == 0 || line.trim_end().is_empty() {
                    return Ok(body);
                }
            }
        }
        let start = body.len();
        body.resize(start + n + 2, 0);
        r.read_exact(&mut body[start..])?;
        body.truncate(start + n);
    }
}

/// Reads the value of a Prometheus sample `name{labels...}` (first match whose label set contains `label_filter`).
pub fn metric(text: &str, name: &str, label_filter: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| {
            let (series, _) = l.rsplit_once(' ').unwrap_or((l, ""));
            (series == name || series.starts_with(&format!("{name}{{"))) && series.contains(label_filter)
        })
        .and_then(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse().ok()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(raw: &str) -> Response {
        read_response(raw.as_bytes()).expect("a response")
    }

    #[test]
    fn reads_bodies_by_length_chunked_and_to_the_end() {
        let r = parse("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: b\r\n\r\nhelloEXTRA");
        assert_eq!(
            (r.status, r.text().as_str(), r.header("x-a")),
            (200, "hello", Some("b"))
        );
        let r = parse(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\ndata:\r\n6\r\n 1\n\nda\r\n5\r\nta: 2\r\n0\r\n\r\n",
        );
        assert_eq!(r.text(), "data: 1\n\ndata: 2");
        assert_eq!(r.sse_events(), ["1", "2"]);
        let r = parse("HTTP/1.1 404 Not Found\r\ncontent-type: text/plain\r\n\r\nno such path");
        assert_eq!((r.status, r.text().as_str()), (404, "no such path"));
        assert!(read_response("HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort".as_bytes()).is_err());
    }
}
