//! A real Prometheus (Debian package `prometheus`) scrapes `llmserve`'s `/metrics` without errors and can query
//! the vLLM-named series. Skips loudly without the `prometheus` binary; fails under `CI=true`.

#![allow(clippy::unwrap_used, reason = "tests unwrap to fail loudly")]

mod serve_common;

use std::process::{Command, Stdio};
use std::time::Duration;

use e2e::testee::Reaped;
use e2e::{http, require};
use serde_json::{Value, json};
use serve_common::{Server, wait_until};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn real_prometheus_scrapes_the_metrics_without_errors() {
    let have = Command::new("prometheus")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !require(have, "prometheus not installed (apt-get install prometheus)") {
        return;
    }
    let s = Server::start(&serve_common::tiny_model(), &["--served-model-name", "tiny"]);
    let body = json!({"prompt": "hello", "max_tokens": 4, "temperature": 0});
    assert_eq!(s.post_json("/v1/completions", &body).status, 200);

    let dir = std::env::temp_dir().join(format!("llmserve-prom-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("prometheus.yml");
    std::fs::write(
        &cfg,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: llmserve\n    static_configs:\n      - targets: ['127.0.0.1:{}']\n",
            s.port
        ),
    )
    .unwrap();
    let port = free_port();
    let prom = Reaped(
        Command::new("prometheus")
            .arg(format!("--config.file={}", cfg.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let get = |path: &str| -> Option<Value> {
        // Not listening yet: no answer.
        let r = http::get(port, path).ok()?;
        serde_json::from_slice(&r.body).ok()
    };
    let mut last = Value::Null;
    let up = wait_until(Duration::from_secs(60), || {
        let Some(v) = get("/api/v1/targets") else {
            return false;
        };
        last = v.clone();
        let t = &v["data"]["activeTargets"][0];
        t["health"] == "up" && t["lastError"] == ""
    });
    assert!(up, "prometheus did not scrape llmserve cleanly: {last}");
    let mut q = Value::Null;
    let found = wait_until(Duration::from_secs(30), || {
        let Some(v) = get("/api/v1/query?query=vllm:generation_tokens_total") else {
            return false;
        };
        q = v.clone();
        v["data"]["result"][0]["metric"]["model_name"] == "tiny"
    });
    assert!(found, "query result: {q}");
    drop(prom);
    let _ = std::fs::remove_dir_all(&dir);
}
