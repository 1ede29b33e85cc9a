//! `llmprof attach --gpu-kernels` on the testee: the helper injected, CUPTI's records through it, the uprobes
//! CUPTI replaces, a process that loads CUDA later, the refusals, a subscriber already there, another mount
//! namespace, an untrusted libcuda.

use super::*;

/// While CUPTI records a process, its synchronize calls and copies lose their uprobes (CUPTI reports the waits
/// and the copies) and its launches their counting uprobes, and the waits and graph launches still arrive: as
/// the window rows' waits, and one slice per graph launch.
#[test]
fn while_cupti_records_the_sync_copy_and_launch_uprobes_are_gone_and_the_records_arrive() {
    if !preconditions() {
        return;
    }
    let dir = fixtures("sync");
    let log = dir.join("cupti.log");
    let lib = dir.join("libcuda.so.1");
    let mut t = spawn(
        &["--libcuda", lib.to_str().unwrap()],
        &[("FAKE_CUPTI_LOG", log.to_str().unwrap())],
    );
    let trace = dir.join("sync.perfetto-trace");
    let a = Attached::start(
        t.pid(),
        &["--gpu-kernels", "on", "--no-sample", "--no-http"],
        &trace,
    );
    // Steps with launches, a copy and a stream synchronize each, then every synchronize call and a graph launch.
    assert_eq!(t.ask("cuda 3 10"), "cuda done");
    std::thread::sleep(Duration::from_millis(300));
    let stderr = a.log();
    let _ = a.stop();
    assert!(stderr.contains("recording kernel summaries"), "{stderr}");
    let syncs = syncs_produced(&log);
    assert_eq!(
        syncs,
        5,
        "3 stream synchronizes, a context and an event synchronize: {}",
        std::fs::read_to_string(&log).unwrap()
    );
    assert_eq!(graphs_produced(&log), 1);
    let mut tp = e2e::trace_processor::load(&trace).unwrap();
    assert_eq!(tp.import_errors().unwrap(), Vec::<serde_json::Value>::new());
    for f in [
        "cuStreamSynchronize",
        "cuCtxSynchronize",
        "cuEventSynchronize",
        "cuLaunchKernel",
        "cuMemcpy",
    ] {
        assert_eq!(
            count(
                &mut tp,
                &format!("select count(*) from slice where name like '{f}%'")
            ),
            0,
            "{f}: no uprobe slice while CUPTI records"
        );
    }
    assert_eq!(
        count(&mut tp, "select count(*) from slice where name = 'CUDA graph 5'"),
        1
    );
    drop(tp);
    let r = e2e::attach::report_json(&trace);
    assert_eq!(r["kernels"]["waits"].as_u64().unwrap(), syncs, "{}", r["kernels"]);
    assert_eq!(
        r["kernels"]["kernels"].as_u64().unwrap(),
        kernels_produced(&log) + 1,
        "the kernels and the graph launch: {}",
        r["kernels"]
    );
    t.exit();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The one integer a query returns.
fn count(tp: &mut e2e::trace_processor::Trace, sql: &str) -> i64 {
    tp.query_i64(sql).unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// `llmprof attach --gpu-kernels on` (summaries) for a while on `pid`; its stderr.
fn session(pid: u32, trace: &Path) -> String {
    session_in(pid, trace, "on")
}

/// `llmprof attach --gpu-kernels MODE` for a while on `pid`; its stderr.
fn session_in(pid: u32, trace: &Path, mode: &str) -> String {
    let a = Attached::start(
        pid,
        &["--gpu-kernels", mode, "--no-sample", "--no-http", "--no-cuda"],
        trace,
    );
    std::thread::sleep(Duration::from_millis(1500));
    let log = a.log();
    let _ = a.stop();
    log
}

#[test]
fn injected_helper_records_every_launch_and_a_second_attach_reuses_it() {
    if !preconditions() {
        return;
    }
    let dir = fixtures("ok");
    let log = dir.join("cupti.log");
    let lib = dir.join("libcuda.so.1");
    let mut t = spawn(
        &["--libcuda", lib.to_str().unwrap()],
        &[("FAKE_CUPTI_LOG", log.to_str().unwrap())],
    );
    assert_eq!(t.ask("cuda-loop 4"), "cuda-loop started");
    let pid = t.pid();

    let first = session_in(pid, &dir.join("one.perfetto-trace"), "all");
    assert!(
        first.contains(&format!("GPU kernels: loaded {}", helper().display())),
        "{first}"
    );
    assert_eq!(helper_mappings(pid), (1, 1), "the helper is mapped once");
    for line in [
        "subscribe",
        "thread-id-type 1",
        "enable 10",
        "enable 1",
        "enable 2",
        "enable 38",
        "enable 4",
        "enable 5",
        "flush-period 100",
    ] {
        assert_eq!(
            log_count(&log, line),
            1,
            "{line}: {}",
            std::fs::read_to_string(&log).unwrap()
        );
    }
    // Detached: every kind disabled, unsubscribed; the helper handed over exactly what CUPTI produced.
    for line in [
        "disable 10",
        "disable 1",
        "disable 2",
        "disable 38",
        "unsubscribe",
    ] {
        assert_eq!(log_count(&log, line), 1, "{line}");
    }
    let inj = cupti::find_loaded(pid).unwrap().expect("helper loaded");
    let s = inj.stats().unwrap();
    let produced = records_produced(&log);
    assert!(produced > 0, "the launches during the session produced records");
    // Names: the two kernels' and the two driver functions' (cuptiGetCallbackName), each once.
    assert_eq!((s.records, s.dropped, s.names), (produced, 0, 4), "{s:?}");
    // Each chunk is at most GPU_CHUNK_MAX bytes: many records per chunk, never one hit per kernel.
    // (48 bytes is the smallest record, a driver call; kernels and copies are 112.)
    let min_chunks = (s.records * 48).div_ceil(llmprof_abi::cupti::GPU_CHUNK_MAX as u64);
    assert!(s.chunks >= min_chunks && s.chunks * 50 <= s.records, "{s:?}");
    assert_eq!((s.starts, s.stops, s.active), (1, 1, 0));

    // The trace: every kernel the stand-in CUPTI recorded (one of its 4 records per launch: the driver calls
    // of a copy and of the launch, the copy, the kernel; fewer for a launch while the kinds are switched on or
    // off) is a slice with its demangled name, each with a flow from the launching call on the testee's
    // thread; Perfetto's own trace processor loads it without error.
    let mut tp = e2e::trace_processor::load(dir.join("one.perfetto-trace")).unwrap();
    assert_eq!(tp.import_errors().unwrap(), Vec::<serde_json::Value>::new());
    let kernels = count(
        &mut tp,
        "select count(*) from slice where name in ('fake_gemm', 'fake_softmax')",
    );
    assert_eq!(
        kernels as u64,
        kernels_produced(&log),
        "one kernel slice per kernel recorded"
    );
    assert_eq!(
        count(
            &mut tp,
            "select count(distinct name) from slice where name in ('fake_gemm', 'fake_softmax')"
        ),
        2
    );
    let flows = format!(
        "select count(*) from flow f join slice a on f.slice_out = a.id join slice b on f.slice_in = b.id \
         where a.name = '{}' and b.name in ('fake_gemm', 'fake_softmax')",
        llmprof_trace::names::cupti::slice::api_call(307, false, Some("cuLaunchKernel"))
    );
    assert_eq!(
        count(&mut tp, &flows) as u64,
        linked_produced(&log),
        "a flow from each recorded launch to its kernel"
    );
    assert_eq!(
        count(
            &mut tp,
            "select count(*) from slice where name = 'cuMemcpyHtoDAsync_v2'"
        ) as u64,
        copy_calls_produced(&log),
        "each launch's input copy, named as CUPTI names it"
    );
    drop(tp);

    assert_eq!(
        log_count(&log, "enable 51"),
        0,
        "every kernel: graphs node by node"
    );

    // A second attach in the default mode: the same library, not loaded again; started and stopped again,
    // now with summaries (no API records, graph-level records on).
    let kernels_before = kernels_produced(&log);
    let second = session(pid, &dir.join("two.perfetto-trace"));
    assert!(second.contains("GPU kernels: reusing"), "{second}");
    assert!(second.contains("recording kernel summaries"), "{second}");
    assert_eq!(helper_mappings(pid), (1, 1), "still mapped once");
    assert_eq!(
        (log_count(&log, "subscribe"), log_count(&log, "unsubscribe")),
        (2, 2)
    );
    assert_eq!(
        log_count(&log, "enable 51"),
        1,
        "graph-level records in the default mode"
    );
    assert_eq!(
        log_count(&log, "enable 4"),
        1,
        "no API records in the default mode"
    );
    let s2 = inj.stats().unwrap();
    assert_eq!(
        (s2.cupti_records, s2.starts, s2.stops, s2.active),
        (records_produced(&log), 2, 2, 0)
    );
    assert_eq!(
        s2.names - s.names,
        2,
        "the two kernel names, sent again to this session"
    );
    assert!(s2.summaries > s.summaries && s2.busy > s.busy, "{s2:?}");
    assert!(
        s2.records - s.records < (s2.cupti_records - s.cupti_records) / 4,
        "summaries are a fraction of the records: {s2:?}"
    );
    assert!(
        s2.cupti_thread_cpu_ns >= s2.helper_cpu_ns && s2.helper_cpu_ns > 0,
        "{s2:?}"
    );
    // The report reads the summarized trace: every kernel CUPTI recorded in the session counted once.
    let r = e2e::attach::report_json(&dir.join("two.perfetto-trace"));
    assert_eq!(r["kernels"]["mode"], "summaries", "{r}");
    assert_eq!(
        r["kernels"]["kernels"].as_u64().unwrap(),
        kernels_produced(&log) - kernels_before,
        "{}",
        r["kernels"]
    );
    assert!(
        r["overhead"]["est_cupti_ms"].as_f64().is_some(),
        "{}",
        r["overhead"]
    );
    let s = s2;

    // The target kept running and checking its results through both sessions; it still works.
    let done = t.ask("cuda-loop-stop");
    let f: Vec<u64> = done
        .split_whitespace()
        .skip(2)
        .map(|w| w.parse().unwrap())
        .collect();
    assert!(
        done.starts_with("cuda-loop done") && f[0] > 100 && f[1] == 0,
        "{done}"
    );
    assert_eq!(t.ask("cuda 1 10"), "cuda done");
    // Stopped: launches after the detach produce nothing.
    assert_eq!(records_produced(&log), s.cupti_records);
    t.exit();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A process that loads CUDA after the attach (PyTorch initialises it lazily; vLLM's engine core is a child
/// started later): the session looks at every process of the tree each second and injects the helper then.
#[test]
fn a_process_that_loads_cuda_after_the_attach_gets_the_helper_on_a_later_tick() {
    if !preconditions() {
        return;
    }
    let dir = fixtures("late");
    let log = dir.join("cupti.log");
    let lib = dir.join("libcuda.so.1");
    let mut t = spawn(&[], &[("FAKE_CUPTI_LOG", log.to_str().unwrap())]);
    let pid = t.pid();
    let trace = dir.join("late.perfetto-trace");
    let a = Attached::start(
        pid,
        &["--gpu-kernels", "auto", "--no-sample", "--no-http", "--no-cuda"],
        &trace,
    );
    assert_eq!(helper_mappings(pid), (0, 0), "no CUDA yet: nothing injected");
    assert_eq!(t.ask(&format!("cuda-load {}", lib.display())), "cuda loaded");
    assert_eq!(t.ask("cuda-loop 2"), "cuda-loop started");
    let until = std::time::Instant::now() + Duration::from_secs(15);
    while log_count(&log, "subscribe") == 0 && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(1000));
    let done = t.ask("cuda-loop-stop");
    let stderr = a.log();
    let _ = a.stop();
    assert!(
        stderr.contains(&format!(
            "GPU kernels: loaded {} in pid {pid}",
            helper().display()
        )),
        "{stderr}"
    );
    assert_eq!(helper_mappings(pid), (1, 1), "the helper is mapped once");
    assert!(
        done.starts_with("cuda-loop done") && done.ends_with(" 0"),
        "{done}"
    );
    assert_eq!(
        (log_count(&log, "subscribe"), log_count(&log, "unsubscribe")),
        (1, 1)
    );
    let mut tp = e2e::trace_processor::load(&trace).unwrap();
    assert_eq!(tp.import_errors().unwrap(), Vec::<serde_json::Value>::new());
    drop(tp);
    // The default mode's summaries: the report counts the kernels of every window.
    let r = e2e::attach::report_json(&trace);
    let kernels = r["kernels"]["kernels"].as_u64().unwrap_or(0);
    assert!(
        kernels > 0,
        "the kernels launched after the injection are in the trace: {}",
        r["kernels"]
    );
    assert_eq!(kernels, kernels_produced(&log), "every kernel CUPTI recorded");
    t.exit();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Runs `llmprof attach --gpu-kernels on` on `pid`, expecting a refusal: its stderr.
fn refused(pid: u32, dir: &Path) -> String {
    let out = Command::new(LLMPROF)
        .args([
            "attach",
            "--pid",
            &pid.to_string(),
            "-d",
            "2s",
            "--gpu-kernels",
            "on",
            "--no-sample",
            "-o",
        ])
        .arg(dir.join(format!("refused-{pid}.perfetto-trace")))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(llmprof::exit::GPU_KERNELS), "{err}");
    assert!(err.contains("--gpu-kernels on"), "{err}");
    err
}

#[test]
fn gpu_kernels_on_refuses_targets_it_cannot_inject() {
    if !preconditions() {
        return;
    }
    let dir = fixtures("refuse");
    let lib = dir.join("libcuda.so.1");
    let lib = lib.to_str().unwrap();

    // No libcuda.
    let t = spawn(&[], &[]);
    let err = refused(t.pid(), &dir);
    assert!(err.contains("has no CUDA driver library"), "{err}");
    t.exit();

    // Statically linked.
    let src = dir.join("static.c");
    std::fs::write(
        &src,
        "#include <unistd.h>\nint main(void) { for (;;) pause(); }\n",
    )
    .unwrap();
    let bin = dir.join("static");
    let o = Command::new("gcc")
        .args(["-static", "-O1", "-o"])
        .arg(&bin)
        .arg(&src)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "gcc -static: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let mut st = Command::new(&bin).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let err = refused(st.id(), &dir);
    assert!(err.contains("statically linked"), "{err}");
    let _ = st.kill();
    let _ = st.wait();

    // Already traced (ptrace taken: what Yama's refusal also looks like to the user).
    let t = spawn(&["--libcuda", lib], &[]);
    // SAFETY: PTRACE_SEIZE of our own child, no options; the testee is killed below.
    assert_eq!(
        unsafe { libc::ptrace(libc::PTRACE_SEIZE, t.pid() as i32, 0usize, 0usize) },
        0
    );
    let err = refused(t.pid(), &dir);
    // The tracer is this test's thread.
    // SAFETY: gettid has no preconditions.
    let me = unsafe { libc::gettid() };
    assert!(err.contains(&format!("already traced by pid {me}")), "{err}");
    drop(t);

    // Exits during the injection (its CUPTI ends the process when loaded): refused, a bystander unharmed.
    let mut bystander = spawn(&["--libcuda", lib], &[]);
    let mut dying = spawn(&["--libcuda", lib], &[("FAKE_CUPTI_EXIT_ON_LOAD", "9")]);
    let err = refused(dying.pid(), &dir);
    assert!(err.contains("exited during llmprof_gpu_start"), "{err}");
    assert_eq!(dying.child().wait().unwrap().code(), Some(9));
    assert_eq!(bystander.ask("cuda 1 10"), "cuda done");
    bystander.exit();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_cupti_subscriber_already_there_is_said_in_one_line_and_left_alone() {
    if !preconditions() {
        return;
    }
    let dir = fixtures("taken");
    let log = dir.join("cupti.log");
    let lib = dir.join("libcuda.so.1");
    let mut t = spawn(
        &["--libcuda", lib.to_str().unwrap()],
        &[
            ("FAKE_CUPTI_LOG", log.to_str().unwrap()),
            ("FAKE_CUPTI_SUBSCRIBER_TAKEN", "1"),
        ],
    );
    let a = Attached::start(
        t.pid(),
        &["--no-sample", "--no-http", "--no-cuda"],
        &dir.join("t.perfetto-trace"),
    );
    assert_eq!(t.ask("cuda 1 10"), "cuda done");
    let stderr = a.log();
    let _ = a.stop();
    assert_eq!(
        stderr.matches("CUPTI already has a subscriber").count(),
        1,
        "{stderr}"
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        text.lines().collect::<Vec<_>>(),
        vec!["subscribe taken"],
        "nothing else touched"
    );
    t.exit();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A target in its own mount namespace (as in a container) whose /tmp is not llmprof's: the helper is copied
/// into the target's /tmp (a new directory) and loaded from there; llmprof's /tmp gets nothing.
#[test]
fn a_target_in_another_mount_namespace_gets_a_copy_it_can_reach() {
    if !preconditions()
        || !e2e::require(
            Command::new("unshare")
                .arg("--help")
                .output()
                .is_ok_and(|o| o.status.success()),
            "unshare not installed (util-linux)",
        )
    {
        return;
    }
    // The stand-ins and the testee must stay reachable inside: not under /tmp, which the namespace replaces
    // (nor under the build directory, which may itself be under /tmp, as in a CI clone there): /var/tmp.
    let dir = Path::new("/var/tmp").join(format!("llmprof-inject-ns-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let testee = dir.join("llmprof-testee");
    std::fs::copy(e2e::testee::path(), &testee).unwrap();
    stand_in_libcuda(&dir);
    stand_in_libcupti(&dir);
    let log = dir.join("cupti.log");
    let script = format!(
        "mount -t tmpfs tmpfs /tmp && exec {} --libcuda {}",
        testee.display(),
        dir.join("libcuda.so.1").display()
    );
    let mut t = Testee::start(
        Command::new("unshare")
            .args(["-m", "--propagation", "private", "sh", "-c", &script])
            .env("FAKE_CUPTI_LOG", &log),
    );
    assert_eq!(t.ask("cuda-loop 2"), "cuda-loop started");
    let pid = t.pid();
    let stderr = session(pid, &dir.join("ns.perfetto-trace"));
    let inj = cupti::find_loaded(pid).unwrap().expect("helper loaded");
    assert!(
        inj.target_path.starts_with("/tmp/llmprof-cupti-") && inj.target_path.ends_with(GPU_HELPER_LIB),
        "{inj:?}\n{stderr}"
    );
    assert!(
        !Path::new(&inj.target_path).exists(),
        "the copy is in the target's /tmp only"
    );
    // Removed once loaded: nothing of llmprof's is left in the target's /tmp (the mapping keeps the file).
    let left: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/root/tmp"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("llmprof-cupti-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    assert_eq!(helper_mappings(pid), (1, 1));
    let s = inj.stats().unwrap();
    assert!(
        s.cupti_records > 0 && s.cupti_records == records_produced(&log),
        "{s:?}"
    );
    let done = t.ask("cuda-loop-stop");
    assert!(
        done.starts_with("cuda-loop done") && done.ends_with(" 0"),
        "{done}"
    );
    t.exit();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A libcuda that a user built (a constructor that leaves a mark in every process that loads it) and owns:
/// llmprof reads its symbols and probes it in the target, but never loads it into itself (as root) to ask
/// its `cuGetProcAddress`.
#[test]
fn an_untrusted_libcuda_is_never_loaded_into_llmprof() {
    if !preconditions() {
        return;
    }
    let dir = fixtures("untrusted");
    let marks = dir.join("marks");
    std::fs::create_dir_all(&marks).unwrap();
    let ctor = dir.join("mark.c");
    std::fs::write(
        &ctor,
        format!(
            "#include <stdio.h>\n#include <unistd.h>\n__attribute__((constructor)) static void mark(void) {{\n\
             char p[512]; snprintf(p, sizeof p, \"{}/loaded-by-%d\", (int)getpid());\n\
             FILE *f = fopen(p, \"w\"); if (f) fclose(f);\n}}\n",
            marks.display()
        ),
    )
    .unwrap();
    let lib = dir.join("user/libcuda.so.1");
    std::fs::create_dir_all(lib.parent().unwrap()).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fake_libcuda.c");
    let o = Command::new("gcc")
        .args(["-shared", "-fPIC", "-O1", "-pthread", "-o"])
        .arg(&lib)
        .arg(&src)
        .arg(&ctor)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // The user's: uid 65534 (nobody).
    std::os::unix::fs::chown(&lib, Some(65534), Some(65534)).unwrap();
    let t = spawn(&["--libcuda", lib.to_str().unwrap()], &[]);
    assert!(
        marks.join(format!("loaded-by-{}", t.pid())).exists(),
        "the mark works"
    );
    let llmprof = Command::new(LLMPROF)
        .args([
            "attach",
            "--pid",
            &t.pid().to_string(),
            "-d",
            "1s",
            "--no-sample",
            "--gpu-kernels",
            "off",
            "-v",
            "-o",
        ])
        .arg(dir.join("u.perfetto-trace"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let llmprof_pid = llmprof.id();
    let out = llmprof.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(
        !marks.join(format!("loaded-by-{llmprof_pid}")).exists(),
        "llmprof ran the user's library's constructor:\n{text}"
    );
    // Still probed in the target, by its exported symbols.
    assert!(
        text.contains("CUDA driver calls:") && text.contains("entry points of"),
        "{text}"
    );
    t.exit();
    std::fs::remove_dir_all(&dir).unwrap();
}
