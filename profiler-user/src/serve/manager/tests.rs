use super::files::{file_stem, fresh_path};
use super::*;
use crate::otel::OtelOptions;

fn manager(cooldown: Duration) -> Arc<Manager> {
    let out_dir = std::env::temp_dir().join(format!("llmprof-manager-{}", std::process::id()));
    let template = AttachOptions {
        pid: 0,
        // Sessions follow the target's process tree, like `llmprof attach` without `--no-children`.
        more_pids: Vec::new(),
        follow_children: true,
        duration: None,
        output: out_dir.clone(),
        slow_syscall: Duration::from_millis(1),
        model_patterns: Vec::new(),
        egress_allow: Vec::new(),
        metrics_url: None,
        ring_bytes: 1 << 20,
        verbose: false,
        otel: OtelOptions::default(),
        gpu: crate::attach::gpu::GpuOptions::default(),
        python_hooks: crate::pyhooks::PyHooksOptions::default(),
        sample_hz: 0,
        overhead_budget: None,
        thread_states: true,
        max_trace_size: None,
        live_status: false,
        metadata: None,
        prelude: None,
        stop_reason: StopReason::default(),
        http: crate::capture::wire::HttpPorts::All,
        calibrator: None,
    };
    let cfg = ManagerConfig {
        out_dir,
        resolve: ResolveConfig::default(),
        allow: AllowList::new(&["exe:/".parse().unwrap()], None, &[]),
        default_duration: Duration::from_secs(30),
        max_duration: Duration::from_secs(600),
        max_sessions: 2,
        cooldown,
        disk_quota: None,
        template,
    };
    Arc::new(Manager::new(cfg, Vec::new(), Arc::new(Metrics::default())))
}

fn alert(fp: &str, status: AlertStatus, labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> Alert {
    let map = |kv: &[(&str, &str)]| kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    Alert {
        status,
        labels: map(labels),
        annotations: map(annotations),
        starts_at: String::new(),
        ends_at: String::new(),
        generator_url: String::new(),
        fingerprint: fp.into(),
    }
}

#[test]
fn a_session_past_its_duration_and_grace_is_stopped_then_abandoned() {
    use crate::watchdog::{END_GRACE, START_GRACE};
    let m = manager(Duration::from_secs(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut view = SessionView {
        id: 7,
        alert: "A".into(),
        fingerprint: "fp".into(),
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
        target_pid: Some(1234),
        target: None,
        state: State::Running,
        reason: None,
        end_reason: None,
        trace: Some("/nowhere".into()),
        trace_removed: false,
        bytes: 0,
        drops: 0,
        prelude_events: 0,
        duration_s: 2.0,
        created_at: String::new(),
        ended_at: None,
    };
    let started = |ago: Duration| Instant::now().checked_sub(ago).unwrap();
    let insert = |view: SessionView, created: Instant| {
        lock(&m.inner).sessions.insert(
            view.id,
            Session {
                view,
                stop: stop.clone(),
                prelude_events: Arc::new(AtomicU64::new(0)),
                created,
                ended: None,
                stop_reason: StopReason::default(),
            },
        );
    };
    // Within its duration and start-up grace: left alone.
    insert(view.clone(), started(Duration::from_secs(1)));
    m.reap();
    assert!(!stop.load(Ordering::Acquire));
    assert_eq!(m.running(), 1);
    // Past them: asked to stop.
    insert(view.clone(), started(START_GRACE + Duration::from_secs(3)));
    m.reap();
    assert!(stop.load(Ordering::Acquire));
    assert_eq!(m.running(), 1);
    // Past the end grace too: abandoned, the slot free.
    view.id = 7;
    insert(view, started(START_GRACE + END_GRACE + Duration::from_secs(3)));
    m.reap();
    assert_eq!(m.running(), 0);
    let s = m.session(7).unwrap();
    assert_eq!(s.state, State::Failed);
    assert!(s.reason.unwrap().contains(END_ABANDONED));
    assert_eq!(m.metrics.sessions_abandoned.load(Ordering::Relaxed), 1);
}

#[test]
fn the_history_is_bounded_in_bytes_not_only_in_count() {
    let m = manager(Duration::from_secs(0));
    let big = "x".repeat(512 << 10);
    for i in 0..40 {
        let a = alert(
            &format!("big-{i}"),
            AlertStatus::Firing,
            &[("alertname", "Big"), ("pid", "1073741823"), ("note", &big)],
            &[],
        );
        assert!(matches!(m.handle(&a), Outcome::Failed { .. }));
    }
    let sessions = m.sessions();
    let held: usize = sessions.iter().map(SessionView::approx_bytes).sum();
    assert!(held <= MAX_HISTORY_BYTES, "{held} bytes held");
    assert!(
        sessions.len() < 40 && sessions.len() >= 10,
        "{} kept",
        sessions.len()
    );
    // The newest are the ones kept.
    assert_eq!(sessions.last().map(|s| s.fingerprint.as_str()), Some("big-39"));
}

#[test]
fn alerts_naming_no_process_fail_once_per_cooldown() {
    let m = manager(Duration::from_secs(600));
    let a = alert(
        "f1",
        AlertStatus::Firing,
        &[("alertname", "X"), ("pid", "1073741823")],
        &[],
    );
    let Outcome::Failed { session, reason, .. } = m.handle(&a) else {
        panic!("failed")
    };
    assert!(reason.contains("1073741823"), "{reason}");
    assert!(matches!(m.handle(&a), Outcome::Deduped { session: s, .. } if s == session));
    let none = alert("f2", AlertStatus::Firing, &[("alertname", "Y")], &[]);
    let Outcome::Failed { reason, .. } = m.handle(&none) else {
        panic!("failed")
    };
    assert!(reason.contains("--default-target"), "{reason}");
    let sessions = m.sessions();
    assert_eq!(sessions.len(), 2);
    assert!(
        sessions
            .iter()
            .all(|s| s.state == State::Failed && s.trace.is_none())
    );
    assert_eq!(m.metrics.sessions_failed.load(Ordering::Relaxed), 2);
    assert_eq!(m.metrics.sessions_deduped.load(Ordering::Relaxed), 1);
    // Without a cooldown a failure is reported again.
    let m = manager(Duration::ZERO);
    assert!(matches!(m.handle(&a), Outcome::Failed { .. }));
    assert!(matches!(m.handle(&a), Outcome::Failed { .. }));
}

#[test]
fn a_bad_duration_annotation_is_a_failed_session_with_the_reason() {
    let m = manager(Duration::from_secs(600));
    // Our parent (cargo or a shell): serve never traces itself.
    let parent = std::os::unix::process::parent_id();
    let me = parent.to_string();
    let a = alert(
        "f3",
        AlertStatus::Firing,
        &[("alertname", "X"), ("pid", &me)],
        &[(DURATION_ANNOTATION, "soon")],
    );
    let Outcome::Failed { reason, .. } = m.handle(&a) else {
        panic!("failed")
    };
    assert!(reason.contains(DURATION_ANNOTATION), "{reason}");
    assert_eq!(m.sessions()[0].target_pid, Some(parent));
    // A resolved alert without a running session is ignored.
    let r = alert("f3", AlertStatus::Resolved, &[], &[]);
    assert!(matches!(m.handle(&r), Outcome::Ignored { .. }));
    assert!(matches!(m.trace_of(1), Err(TraceLookupError::NoTrace(1, _))));
    assert_eq!(m.trace_of(9), Err(TraceLookupError::NotFound(9)));
}

#[test]
fn a_planted_file_or_symlink_makes_the_session_pick_a_fresh_name() {
    let dir = std::env::temp_dir().join(format!("llmprof-fresh-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    crate::files::create_private_dir(&dir).unwrap();
    let victim = dir.join("victim");
    std::fs::write(&victim, "precious").unwrap();
    let first = fresh_path(&dir, "X-20260101-000000-1");
    assert_eq!(first, dir.join("X-20260101-000000-1.perfetto-trace"));
    // A dangling symlink (Path::exists says false for it), a symlink to a file, a plain file.
    std::os::unix::fs::symlink(dir.join("nowhere"), &first).unwrap();
    let second = fresh_path(&dir, "X-20260101-000000-1");
    assert_eq!(second, dir.join("X-20260101-000000-1.2.perfetto-trace"));
    std::os::unix::fs::symlink(&victim, &second).unwrap();
    std::fs::write(dir.join("X-20260101-000000-1.3.perfetto-trace"), "old").unwrap();
    let fourth = fresh_path(&dir, "X-20260101-000000-1");
    assert_eq!(fourth, dir.join("X-20260101-000000-1.4.perfetto-trace"));
    // What a session then does with the planted names: refuse them, following and overwriting nothing.
    for p in [&first, &second, &dir.join("X-20260101-000000-1.3.perfetto-trace")] {
        assert!(crate::files::create_trace(p).is_err(), "{}", p.display());
    }
    crate::files::create_trace(&fourth).unwrap();
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    assert!(!dir.join("nowhere").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn file_names_are_safe() {
    assert_eq!(file_stem("LLMQueueBacklog"), "LLMQueueBacklog");
    assert_eq!(file_stem("../etc/passwd"), "___etc_passwd");
    assert_eq!(file_stem(""), "alert");
}
