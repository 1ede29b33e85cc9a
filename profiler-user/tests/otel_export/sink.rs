//! `OtelSink` on the fixture stream: spans over gRPC and over HTTP, no endpoint, a receiver that is down, one
//! that never answers.

use super::*;

#[test]
fn grpc_spans_arrive_in_the_callers_trace_with_genai_attributes() {
    let (addr, got, _rt) = start_grpc_receiver();
    let clock = WallClock::now().unwrap();
    let mut sink = OtelSink::with_config(
        &config(format!("http://{addr}"), OtlpProtocol::Grpc),
        resource_info(),
        clock,
    )
    .unwrap();
    let t0_wall = push_fixture(&mut sink, clock);
    let stats = sink.finish();
    assert_eq!(stats.spans_built, 12);
    assert_eq!(stats.spans_exported, 12, "{stats:?}");
    assert_eq!(stats.spans_dropped, 0);
    assert_eq!(stats.export_errors, 0);
    check_received(&got.lock().unwrap(), t0_wall);
}

#[test]
fn http_spans_arrive_at_v1_traces_as_protobuf() {
    let (addr, got, seen) = start_http_receiver();
    // Through the CLI options, as a user gives them: a base URL, completed with /v1/traces.
    let opts = OtelOptions {
        otlp_endpoint: Some(format!("http://{addr}")),
        otlp_protocol: Some(OtlpProtocol::Http),
        ..Default::default()
    };
    let mut cfg = opts.resolve_with(|_| None).unwrap().expect("endpoint configured");
    cfg.resource_attributes = config(String::new(), OtlpProtocol::Http).resource_attributes;
    let clock = WallClock::now().unwrap();
    let mut sink = OtelSink::with_config(&cfg, resource_info(), clock).unwrap();
    let t0_wall = push_fixture(&mut sink, clock);
    let stats = sink.finish();
    assert_eq!(stats.spans_exported, 12, "{stats:?}");
    assert_eq!(stats.spans_dropped, 0);
    let seen = seen.lock().unwrap().clone();
    assert!(seen.paths.iter().all(|p| p == "/v1/traces"), "{seen:?}");
    assert!(
        seen.content_types.iter().all(|c| c == "application/x-protobuf"),
        "{seen:?}"
    );
    check_received(&got.lock().unwrap(), t0_wall);
}

#[test]
fn no_endpoint_means_no_sink() {
    let opts = OtelOptions::default();
    assert!(opts.resolve_with(|_| None).unwrap().is_none());
}

fn receiver_down(protocol: OtlpProtocol) {
    let endpoint = match protocol {
        OtlpProtocol::Grpc => format!("http://127.0.0.1:{}", dead_port()),
        OtlpProtocol::Http => format!("http://127.0.0.1:{}/v1/traces", dead_port()),
    };
    let clock = WallClock::now().unwrap();
    let mut sink = OtelSink::with_config(&config(endpoint, protocol), resource_info(), clock).unwrap();
    let started = Instant::now();
    push_fixture(&mut sink, clock);
    let pushed = started.elapsed();
    let stats = sink.finish();
    let total = started.elapsed();
    assert_eq!(stats.spans_built, 12);
    assert_eq!(stats.spans_exported, 0);
    assert_eq!(
        stats.spans_dropped, 12,
        "every span is counted as dropped: {stats:?}"
    );
    assert!(stats.export_errors >= 1 || stats.flush_timed_out, "{stats:?}");
    // Bounds, not performance: pushing never waits on the network, and finish gives up at its deadline.
    assert!(
        pushed < Duration::from_secs(1),
        "push waited on the dead receiver: {pushed:?}"
    );
    assert!(
        total < otel::FINISH_TIMEOUT + Duration::from_secs(2),
        "finish took {total:?}"
    );
}

#[test]
fn grpc_receiver_down_counts_drops_and_finishes() {
    receiver_down(OtlpProtocol::Grpc);
}

#[test]
fn http_receiver_down_counts_drops_and_finishes() {
    receiver_down(OtlpProtocol::Http);
}

/// A receiver that accepts connections and never answers (a hung collector): `finish` gives up at its deadline
/// and counts everything as dropped.
#[test]
fn hung_receiver_cannot_hold_up_the_end_of_a_session() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let held = Arc::new(Mutex::new(Vec::new()));
    let held2 = held.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            held2.lock().unwrap().push(conn);
        }
    });
    let clock = WallClock::now().unwrap();
    let mut sink = OtelSink::with_config(
        &config(format!("http://{addr}"), OtlpProtocol::Grpc),
        resource_info(),
        clock,
    )
    .unwrap();
    push_fixture(&mut sink, clock);
    let started = Instant::now();
    let stats = sink.finish_within(Duration::from_millis(500));
    let took = started.elapsed();
    assert!(stats.flush_timed_out, "{stats:?}");
    assert_eq!(stats.spans_exported, 0);
    assert_eq!(stats.spans_dropped, 12);
    assert!(
        took < Duration::from_secs(3),
        "finish waited {took:?} past its 500 ms deadline"
    );
}
