//! Fleet mode end to end: one real Prometheus and one real Alertmanager (deploy/'s rules, shortened as in
//! serve_alerts.rs), two "nodes", each its own network namespace (`ip netns`, a veth to the host) holding its own
//! `llmserve` on port 8000 and its own `llmprof serve --alertmanager-url` pulling from the one Alertmanager. Only
//! engine B is overloaded: exactly one session, on node B, none on node A (which sees the alert and ignores it:
//! its target is not allowed there). serve B is then killed (SIGKILL, mid-alert: still firing) and started again:
//! no second session, because the alert's fingerprint was recorded in B's out-dir before its session started.
//! Node B names two Alertmanager URLs, the first of them down: the one that answers is used (HA).
//!
//! Both namespaces share this machine's /proc, so node A can resolve B's `instance` (a pod IP of a "local"
//! namespace); what keeps A off B's engine is its allow-list (`--allow-target pid:` of its own engine), as a
//! DaemonSet's `cgroup:` rule keeps a node to its pods.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use e2e::serve::{self, ALERTMANAGER};
use e2e::testee::Reaped;
use e2e::{bin_path, default_model, is_root, require, trace_processor};

/// The engines' port, the same on both nodes (their addresses differ).
const ENGINE_PORT: u16 = 8000;

/// A network namespace with a veth to the host: host side `10.231.N.1`, namespace side `10.231.N.2`.
struct Netns {
    name: String,
    host_if: String,
}

fn ip(args: &[&str]) {
    let st = Command::new("ip").args(args).status().expect("run ip");
    assert!(st.success(), "ip {args:?} failed");
}

impl Netns {
    fn new(tag: char, n: u8) -> Netns {
        let id = std::process::id() % 100_000;
        let name = format!("llmprof-fleet-{tag}-{id}");
        let host_if = format!("lpf{tag}{id}h");
        let ns_if = format!("lpf{tag}{id}n");
        // Left by an earlier run of this pid, if any.
        for args in [["netns", "del", &name], ["link", "del", &host_if]] {
            let _ = Command::new("ip").args(args).stderr(Stdio::null()).status();
        }
        ip(&["netns", "add", &name]);
        let ns = Netns { name, host_if };
        ip(&["link", "add", &ns.host_if, "type", "veth", "peer", "name", &ns_if]);
        ip(&["link", "set", &ns_if, "netns", &ns.name]);
        ip(&["addr", "add", &format!("10.231.{n}.1/24"), "dev", &ns.host_if]);
        ip(&["link", "set", &ns.host_if, "up"]);
        for cmd in [
            vec!["addr", "add", &format!("10.231.{n}.2/24"), "dev", &ns_if],
            vec!["link", "set", &ns_if, "up"],
            vec!["link", "set", "lo", "up"],
        ] {
            let mut args = vec!["netns", "exec", &ns.name, "ip"];
            args.extend(cmd.iter().copied());
            ip(&args);
        }
        ns
    }

    /// `ip netns exec NAME PROGRAM` (ip execs the program: the child's pid is the program's).
    fn command(&self, program: &Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name]).arg(program);
        c
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", &self.host_if]).status();
        let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

/// One HTTP/1.0 request to `addr`; the status and body.
fn request(addr: SocketAddr, method: &str, path: &str, body: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(120)))?;
    write!(
        s,
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_owned();
    Ok((status, body))
}

/// llmserve in `ns` on 0.0.0.0:8000, waited for from the host through the veth.
fn engine(ns: &Netns, addr: SocketAddr, model: &Path) -> Reaped {
    let child = ns
        .command(&bin_path("llmserve"))
        .arg("--model")
        .arg(model)
        .args(["--host", "0.0.0.0", "--port", &ENGINE_PORT.to_string()])
        .args([
            "--served-model-name",
            "smollm2",
            "--max-num-seqs",
            "2",
            "--max-queue",
            "1024",
        ])
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn llmserve");
    let p = Reaped(child);
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        if request(addr, "GET", "/metrics", "").is_ok_and(|(s, _)| s == 200) {
            return p;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("llmserve did not answer on {addr} within 120 s");
}

/// A token file (root's, 0600) next to `out`: serve needs one even on loopback.
fn token_file(out: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = out.with_extension("token");
    std::fs::write(&p, e2e::serve::TOKEN).expect("token file");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).expect("chmod 600");
    p
}

/// `llmprof serve` of a node, in its namespace, pulling from Alertmanager; stderr to `log`.
fn serve_node(ns: &Netns, out: &Path, allow_pid: u32, am_urls: &[String], log: &Path) -> Reaped {
    let err = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("serve log");
    let child = ns
        .command(&bin_path("llmprof"))
        .arg("serve")
        .arg("--out-dir")
        .arg(out)
        .args(["--listen", "127.0.0.1:9464"])
        .arg("--token-file")
        .arg(token_file(out))
        .args(["--allow-target", &format!("pid:{allow_pid}")])
        .args(am_urls.iter().flat_map(|u| ["--alertmanager-url", u.as_str()]))
        .args(["--alertmanager-poll", "1s"])
        .args(["--cooldown", "10m", "--max-sessions", "2"])
        .stdout(Stdio::null())
        .stderr(err)
        .spawn()
        .expect("spawn llmprof serve");
    Reaped(child)
}

fn traces(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.to_string_lossy().ends_with(".perfetto-trace"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// serve's sessions API inside its namespace (curl there).
fn sessions(ns: &Netns) -> serde_json::Value {
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            &ns.name,
            "curl",
            "-sf",
            "-H",
            &format!("Authorization: Bearer {}", e2e::serve::TOKEN),
            "http://127.0.0.1:9464/v1/sessions",
        ])
        .output()
        .expect("curl");
    serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null)
}

/// The active alerts Alertmanager holds for `instance`.
fn active_alerts(am: SocketAddr, instance: &str) -> Vec<serde_json::Value> {
    let Ok((200, body)) = request(am, "GET", "/api/v2/alerts?active=true", "") else {
        return Vec::new();
    };
    let all: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap_or_default();
    all.into_iter()
        .filter(|a| a["labels"]["instance"] == instance)
        .collect()
}

#[test]
fn alerts_pulled_from_alertmanager_are_traced_on_their_node_only_and_once() {
    let model = default_model();
    if !require(is_root(), "not root: network namespaces and eBPF")
        || !require(
            model.exists(),
            "the default model is missing (`cargo xtask fetch-model`)",
        )
        || !require(
            serve::have("prometheus"),
            "prometheus is missing (`cargo xtask setup-tools`)",
        )
        || !require(
            serve::have(ALERTMANAGER),
            "Alertmanager is missing (`cargo xtask setup-tools`)",
        )
        || !require(
            Command::new("ip")
                .arg("-V")
                .output()
                .is_ok_and(|o| o.status.success())
                && serve::have("curl"),
            "ip (iproute2) and curl are missing (`cargo xtask setup-tools`)",
        )
        || !require(
            trace_processor::available(),
            "Perfetto's trace processor is missing (`cargo xtask setup-tools`)",
        )
    {
        return;
    }
    let dir = std::env::temp_dir().join(format!("llmprof-serve-fleet-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let (node_a, node_b) = (Netns::new('a', 1), Netns::new('b', 2));
    let (addr_a, addr_b): (SocketAddr, SocketAddr) = (
        format!("10.231.1.2:{ENGINE_PORT}").parse().expect("addr"),
        format!("10.231.2.2:{ENGINE_PORT}").parse().expect("addr"),
    );
    let engine_a = engine(&node_a, addr_a, &model);
    let engine_b = engine(&node_b, addr_b, &model);

    // Alertmanager on the host, reachable from both nodes through their veths; no webhook receiver at all.
    let am_port = serve::free_port();
    std::fs::create_dir_all(dir.join("am-data")).expect("am dir");
    std::fs::write(
        dir.join("alertmanager.yml"),
        "route:\n  receiver: none\n  group_by: [alertname, instance]\n  group_wait: 1s\n  group_interval: 2s\n\
         receivers:\n  - name: none\n",
    )
    .expect("am config");
    let _am = Reaped(
        Command::new(ALERTMANAGER)
            .arg(format!(
                "--config.file={}",
                dir.join("alertmanager.yml").display()
            ))
            .arg(format!("--storage.path={}", dir.join("am-data").display()))
            .arg(format!("--web.listen-address=0.0.0.0:{am_port}"))
            .arg("--cluster.listen-address=")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn alertmanager"),
    );
    let am: SocketAddr = format!("127.0.0.1:{am_port}").parse().expect("am addr");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !request(am, "GET", "/-/ready", "").is_ok_and(|(s, _)| s == 200) {
        assert!(Instant::now() < deadline, "alertmanager not ready");
        std::thread::sleep(Duration::from_millis(200));
    }
    let _prom = serve::prometheus_targets(
        &dir,
        &[addr_a.to_string(), addr_b.to_string()],
        &serve::fast_rules("1s", "8s"),
        am_port,
    );

    let (out_a, out_b) = (dir.join("node-a"), dir.join("node-b"));
    let (log_a, log_b) = (dir.join("serve-a.log"), dir.join("serve-b.log"));
    let _serve_a = serve_node(
        &node_a,
        &out_a,
        engine_a.0.id(),
        &[format!("http://10.231.1.1:{am_port}")],
        &log_a,
    );
    // Node B lists an Alertmanager peer that is down first (HA: any that answers counts).
    let am_b = [
        format!("http://10.231.2.1:{}", serve::free_port()),
        format!("http://10.231.2.1:{am_port}"),
    ];
    let mut serve_b = serve_node(&node_b, &out_b, engine_b.0.id(), &am_b, &log_b);

    // Overload engine B only.
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..32)
        .map(|i| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let body = format!(
                        r#"{{"model":"smollm2","messages":[{{"role":"user","content":"Tell me a story about robot {i}."}}],"max_tokens":64,"temperature":0}}"#
                    );
                    let _ = request(addr_b, "POST", "/v1/chat/completions", &body);
                }
            })
        })
        .collect();

    // The session on node B, finished after its 8 s.
    let deadline = Instant::now() + Duration::from_secs(120);
    let session = loop {
        let s = sessions(&node_b);
        if let Some(done) = s
            .as_array()
            .and_then(|a| a.iter().find(|s| s["state"] == "finished").cloned())
        {
            break done;
        }
        assert!(
            Instant::now() < deadline,
            "no finished session on node B within 120 s; sessions {s}; serve B: {}",
            std::fs::read_to_string(&log_b).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    assert_eq!(session["target_pid"], engine_b.0.id(), "{session}");
    let fingerprint = session["fingerprint"].as_str().expect("fingerprint").to_owned();
    assert!(
        !active_alerts(am, &addr_b.to_string()).is_empty(),
        "the alert must still fire for the restart below"
    );

    // Crash serve B mid-alert and start it again on the same out-dir.
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(serve_b.0.id() as i32, libc::SIGKILL) };
    let _ = serve_b.0.wait();
    serve_b = serve_node(&node_b, &out_b, engine_b.0.id(), &am_b, &log_b);
    // Ten polls of the restarted serve while the alert still fires.
    let polls_until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < polls_until {
        std::thread::sleep(Duration::from_millis(500));
    }
    let still_firing = active_alerts(am, &addr_b.to_string());
    stop.store(true, Ordering::Relaxed);
    let restarted_sessions = sessions(&node_b);
    drop(serve_b);
    let log_a_text = std::fs::read_to_string(&log_a).unwrap_or_default();
    let log_b_text = std::fs::read_to_string(&log_b).unwrap_or_default();

    assert!(
        still_firing
            .iter()
            .any(|a| a["fingerprint"] == fingerprint.as_str()),
        "the alert kept firing across serve B's restart: {still_firing:?}"
    );
    assert_eq!(
        restarted_sessions.as_array().map(Vec::len),
        Some(0),
        "the restarted serve B traced the alert again: {restarted_sessions}\n{log_b_text}"
    );
    let handled = std::fs::read_to_string(out_b.join(".alertmanager-handled")).expect("handled file");
    assert!(
        handled.lines().any(|l| l.starts_with(&format!("{fingerprint} "))),
        "{handled}"
    );
    assert!(
        log_b_text.contains(&format!("({} handled before)", handled.lines().count())),
        "serve B read its handled alerts back:\n{log_b_text}"
    );
    assert_eq!(
        traces(&out_b).len(),
        1,
        "exactly one trace on node B: {:?}",
        traces(&out_b)
    );
    assert!(
        traces(&out_a).is_empty(),
        "node A traced something: {:?}",
        traces(&out_a)
    );
    assert!(
        log_a_text.contains(&format!("pulled alert {fingerprint} ("))
            && log_a_text.contains("not on this node"),
        "node A saw B's alert and ignored it:\n{log_a_text}"
    );

    // The one trace is B's engine under load, with the alert in it.
    let mut trace = trace_processor::load(&traces(&out_b)[0]).expect("trace loads");
    assert_eq!(
        trace.import_errors().expect("stats"),
        Vec::<serde_json::Value>::new()
    );
    let alerts = trace
        .query_i64(&format!(
            "select count(*) from slice where name like 'alert fired: %' \
             and extract_arg(arg_set_id, 'debug.fingerprint') = '{fingerprint}'"
        ))
        .expect("query");
    assert_eq!(alerts, 1, "the trace holds the pulled alert");
    // The engines go first: the clients' queued requests then fail at once instead of draining the queue.
    drop(engine_a);
    drop(engine_b);
    for c in clients {
        let _ = c.join();
    }
    let _ = std::fs::remove_dir_all(&dir);
}
