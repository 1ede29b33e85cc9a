//! llmprof → rotel (a real OpenTelemetry collector) → our receiver.

use super::*;

/// `rotel-agent` as `cargo xtask setup-otel-tools` installs it (or `$LLMPROF_ROTEL`).
fn rotel_agent() -> Option<std::path::PathBuf> {
    if let Ok(p) = std::env::var("LLMPROF_ROTEL") {
        return Some(p.into());
    }
    let cache = std::env::var("XDG_CACHE_HOME")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| {
            std::path::PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into())).join(".cache")
        });
    let p = cache.join("llmprof/tools/rotel/rotel/rotel-agent");
    p.exists().then_some(p)
}

fn wait_listening(addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(
            Instant::now() < deadline,
            "the collector did not listen on {addr}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn wait_spans(got: &Received, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let have: usize = got
            .lock()
            .unwrap()
            .iter()
            .flat_map(|r| &r.resource_spans)
            .flat_map(|rs| &rs.scope_spans)
            .map(|ss| ss.spans.len())
            .sum();
        if have >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the collector forwarded {have} of {n} spans"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

/// llmprof → rotel (a real OpenTelemetry collector, receiving OTLP over gRPC and over HTTP) → our gRPC receiver:
/// what a user's collector forwards to Tempo or Jaeger is still joined to the caller's trace.
#[test]
fn spans_pass_through_a_real_collector_over_grpc_and_http() {
    let rotel = rotel_agent();
    if !e2e::require(
        rotel.is_some(),
        "rotel-agent not installed (run `cargo xtask setup-otel-tools`)",
    ) {
        return;
    }
    let rotel = rotel.unwrap();
    let (sink_addr, got, _rt) = start_grpc_receiver();
    let (grpc_in, http_in) = (free_addr(), free_addr());
    let child = std::process::Command::new(&rotel)
        .args([
            "start",
            "--otlp-grpc-endpoint",
            &grpc_in.to_string(),
            "--otlp-http-endpoint",
        ])
        .arg(http_in.to_string())
        .args([
            "--exporter",
            "otlp",
            "--otlp-exporter-endpoint",
            &format!("http://{sink_addr}"),
        ])
        .args(["--otlp-exporter-protocol", "grpc"])
        .args(["--batch-timeout", "100ms"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", rotel.display()));
    let _collector = Reaped(child);
    wait_listening(grpc_in);
    wait_listening(http_in);

    for (endpoint, protocol) in [
        (format!("http://{grpc_in}"), OtlpProtocol::Grpc),
        (format!("http://{http_in}/v1/traces"), OtlpProtocol::Http),
    ] {
        got.lock().unwrap().clear();
        let clock = WallClock::now().unwrap();
        let mut sink = OtelSink::with_config(&config(endpoint, protocol), resource_info(), clock).unwrap();
        let t0_wall = push_fixture(&mut sink, clock);
        let stats = sink.finish();
        assert_eq!(stats.spans_exported, 12, "{protocol:?}: {stats:?}");
        wait_spans(&got, 12);
        check_received(&got.lock().unwrap(), t0_wall);
    }
}
