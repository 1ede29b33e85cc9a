//! The start of an attach session, step by step in the order [`super::run`] takes them: the checks before
//! anything is loaded ([`preflight`]), the samplers' queue, GPU layer and span export ([`open_inputs`]), the
//! capture with its probes live ([`start_capture`], [`start_gpu_kernels`]), the trace file ([`open_sink`])
//! and the /metrics scraper ([`start_scraper`]). The order is the session's: probes live before the trace's
//! prelude is written.

use super::*;

/// Step 1: what can be checked before anything is loaded: the size cap, a free trace path, root, the targets. The cap and the
/// traced processes' names and threads (the targets first, then, for trees, their descendants).
pub(super) fn preflight(opts: &AttachOptions) -> Result<(Option<SizeCap>, Vec<ProcessInfo>), AttachError> {
    let cap = opts
        .max_trace_size
        .map(SizeCap::new)
        .transpose()
        .map_err(AttachError::InvalidOption)?;
    // A taken trace path is refused before anything is loaded (open_sink refuses it again, atomically).
    crate::files::check_trace_path(&opts.output).map_err(output_error(&opts.output))?;
    if !is_root() {
        return Err(AttachError::NotRoot);
    }
    let mut roots = vec![opts.pid];
    for &p in &opts.more_pids {
        if !roots.contains(&p) {
            roots.push(p);
        }
    }
    let own = proctree::own_processes(&roots);
    if let Some(p) = roots.iter().find(|p| own.contains(p)) {
        return Err(AttachError::InvalidOption(format!(
            "--pid {p} is llmprof itself: llmprof never traces its own process; give the server's pid"
        )));
    }
    let mut infos = Vec::new();
    for &p in &roots {
        infos.push(procfs::process_info(p).ok_or(AttachError::NoProcess(p))?);
    }
    if opts.follow_children {
        // A descendant that exits during the walk is simply not traced.
        let found = proctree::descendants(&roots);
        infos.extend(
            found[roots.len()..]
                .iter()
                .filter_map(|&p| procfs::process_info(p)),
        );
    }
    Ok((cap, infos))
}

/// The inputs that start before capture.
pub(super) struct Inputs {
    /// The samplers' queue (NVML, /metrics) into the session.
    pub(super) tx: SyncSender<Event>,
    /// Its receiving end.
    pub(super) rx: Receiver<Event>,
    /// NVML counters and CUDA driver probes.
    pub(super) gpu: GpuSession,
    /// What the GPU layer has to say on the timeline so far.
    pub(super) gpu_markers: Vec<Event>,
    /// The OTel span export (None: not configured).
    pub(super) otel: Option<OtelSink>,
}

/// Step 2: the sampler queue, the GPU layer and the OTel span export. NVML first: the target's GPU UUID goes
/// into the OTel resource; its samples wait in the queue. The OTLP configuration is checked before anything is
/// loaded; the exporter runs on its own thread and never stalls capture.
pub(super) fn open_inputs(opts: &AttachOptions) -> Result<Inputs, AttachError> {
    let (tx, rx) = mpsc::sync_channel(SAMPLER_QUEUE);
    let (gpu, gpu_markers) = GpuSession::start(&opts.gpu, opts.pid, tx.clone());
    let otel = OtelSink::new(&opts.otel, ResourceInfo::from_proc(opts.pid, gpu.gpu_uuid()))?;
    Ok(Inputs {
        tx,
        rx,
        gpu,
        gpu_markers,
        otel,
    })
}

/// A capture whose probes are live, and what is measured against it.
pub(super) struct Started {
    /// The capture.
    pub(super) capture: Capture,
    /// Command start → probes live.
    pub(super) attach_latency: Duration,
    /// The moment the probes were live (BOOTTIME ns).
    pub(super) live_ns: u64,
    /// llmprof's own cost.
    pub(super) acct: SelfAccount,
    /// `--overhead-budget`, when given.
    pub(super) budget: Option<Budget>,
    /// The traced processes' CPU (self-accounting and budget).
    pub(super) targets: TargetCpu,
    /// The target's engine probes.
    pub(super) engine_probes: EngineProbes,
}

/// Step 3: loads and attaches the programs (and the CUDA driver probes when libcuda is already loaded), then
/// starts the self-accounting and the budget from the calibration. Warns when the target has no engine probes.
pub(super) fn start_capture(
    opts: &AttachOptions,
    t0: Instant,
    inputs: &mut Inputs,
    infos: &mut [ProcessInfo],
) -> Result<Started, AttachError> {
    // Text leaves the engine only for spans, and only when asked: the trace file never holds it.
    let capture_content = opts.otel.capture_content && inputs.otel.is_some();
    if opts.otel.capture_content && inputs.otel.is_none() {
        note!(
            "warning: --capture-content needs an OTLP endpoint (text goes to spans only): not capturing text"
        );
    }
    let mut cfg = CaptureConfig {
        pids: infos.iter().map(|i| i.pid).collect(),
        follow_children: opts.follow_children,
        slow_syscall: opts.slow_syscall,
        ring_bytes: opts.ring_bytes,
        capture_content,
        measure_untraced: opts.calibrator.is_some(),
        cuda_counted: opts.gpu.cuda_calls == crate::cuda::CudaCalls::Counted,
        http: opts.http.clone(),
        thread_states: opts.thread_states,
        sample_hz: opts.sample_hz,
        // Python frames ride on the stack samples (`--no-sample` turns both off).
        python_hz: opts.sample_hz,
        ..Default::default()
    };
    if !opts.model_patterns.is_empty() {
        cfg.model_patterns = opts.model_patterns.clone();
    }
    if !opts.egress_allow.is_empty() {
        cfg.egress_allow = opts.egress_allow.clone();
    }
    let mut capture = Capture::start(&cfg)?;
    for i in infos.iter() {
        inputs.gpu.watch_process(i.pid);
    }
    let cuda_markers = inputs.gpu.watch_cuda(&mut capture, true);
    inputs.gpu_markers.extend(cuda_markers);
    let attach_latency = t0.elapsed();
    let live_ns = boottime_ns();
    // The costs per hit come later, from the calibration child ([`Calibrating`]); until then nothing is
    // charged and the budget cannot be exceeded.
    let cal = Calibration::default();
    let pids: Vec<u32> = infos.iter().map(|i| i.pid).collect();
    let targets = TargetCpu::new(&pids);
    let acct = SelfAccount::new(targets.clone(), cal, Counters::of(&capture));
    let budget = opts
        .overhead_budget
        .map(|pct| Budget::new(pct, cal, Snapshot::take(&targets, Counters::of(&capture))));
    for i in infos.iter_mut() {
        i.engine_probes = matches!(capture.engine_probes(i.pid), EngineProbes::Attached { .. });
    }
    // The first process of the tree with engine probes stands for the session's (the summary line).
    let engine_probes = infos
        .iter()
        .map(|i| capture.engine_probes(i.pid))
        .find(|e| matches!(e, EngineProbes::Attached { .. }))
        .unwrap_or_else(|| capture.engine_probes(opts.pid));
    if !matches!(engine_probes, EngineProbes::Attached { .. }) {
        note!(
            "{}",
            without_engine_probes(
                opts.pid,
                &infos[0].name,
                opts.http != crate::capture::wire::HttpPorts::Off,
                !capture.python().targets().is_empty(),
                opts.sample_hz > 0,
            )
        );
    }
    // A Python target whose frames cannot be read (unsupported version, ...): said once, and on the timeline.
    for problem in capture.python().problems() {
        note!("warning: {problem}");
        inputs.gpu_markers.push(Event {
            ts_ns: boottime_ns(),
            pid: opts.pid,
            tid: 0,
            body: EventBody::Marker {
                text: problem.clone(),
            },
        });
    }
    Ok(Started {
        capture,
        attach_latency,
        live_ns,
        acct,
        budget,
        targets,
        engine_probes,
    })
}

/// Step 3b (`--gpu-kernels`), for each process the helper was loaded in and not started yet: the handoff
/// uprobe on the injected helper, then `GPU_START` there. Also on later ticks, for a process of the tree that
/// loaded CUDA after the attach ([`GpuKernels::adopt`]); `strict` is false then (a failure is said, the
/// session goes on).
pub(super) fn start_gpu_kernels(
    strict: bool,
    k: &mut GpuKernels,
    capture: &mut Capture,
) -> Result<(), AttachError> {
    for inj in k.pending() {
        if let Err(e) = capture.attach_handoff(inj.pid, &inj.host_path) {
            if strict {
                return Err(AttachError::Capture(e));
            }
            note!(
                "llmprof: GPU kernels: not recorded in pid {}: the handoff probe failed: {e}",
                inj.pid
            );
            continue;
        }
        match k.start(inj.pid) {
            Ok(true) => {
                // CUPTI's driver-call records carry the launches: the uprobes stop probing them.
                let n = capture.cuda_launches_from_cupti(inj.pid);
                log::debug!(
                    "gpu: pid {}: {n} launch probes detached (CUPTI records the launches)",
                    inj.pid
                );
            }
            Ok(false) => {}
            Err(e) if strict => return Err(AttachError::GpuKernels(e)),
            Err(e) => note!("llmprof: GPU kernels: not recorded in pid {}: {e}", inj.pid),
        }
    }
    Ok(())
}

/// Step 3c (`--python-hooks`, `--py-range`): the Python hooks in the tree's processes that want them (the
/// engine uprobes on the helper come before its start); each outcome said. With `--py-range`, a tree where no
/// process took them is refused (`AttachError::PythonHooks`): the user named functions that nothing will
/// record.
pub(super) fn start_python_hooks(
    opts: &AttachOptions,
    tree: &[u32],
    capture: &mut Capture,
) -> Result<(crate::pyhooks::PyHooks, Vec<String>), AttachError> {
    let mut hooks = crate::pyhooks::PyHooks::new(opts.python_hooks.clone());
    let lines = hooks.start(tree, capture);
    for line in &lines {
        note!("llmprof: {line}");
    }
    if opts.python_hooks.mode != crate::pyhooks::PyHooksMode::Off
        && !opts.python_hooks.ranges.is_empty()
        && hooks.hooked_pids().is_empty()
    {
        for line in hooks.stop() {
            note!("llmprof: {line}");
        }
        let why = if lines.is_empty() {
            "no process of the traced tree is CPython 3.10 to 3.13".to_owned()
        } else {
            lines.join("; ")
        };
        return Err(AttachError::PythonHooks(why));
    }
    Ok((hooks, lines))
}

/// Step 4: creates the trace file (a new file, 0600, never through a symlink: [`crate::files::create_trace`])
/// and writes its header (the target, the clock snapshot).
pub(super) fn open_sink(opts: &AttachOptions, infos: &[ProcessInfo]) -> Result<TraceSink<File>, AttachError> {
    let out_err = output_error(&opts.output);
    let file = crate::files::create_trace(&opts.output).map_err(&out_err)?;
    let mut sink = TraceSink::new(file, infos, clock_snapshot()).map_err(&out_err)?;
    // How the trace processor reads sched_switch's prev_state depends on the kernel version.
    if let Ok(release) = std::fs::read_to_string("/proc/sys/kernel/osrelease") {
        sink.note_kernel_release(&release);
    }
    Ok(sink)
}

/// Step 6: the /metrics scraper, on `--metrics-url` or the endpoint discovered from the target's listening
/// port; warns when there is none. The URL scraped and the scraper.
pub(super) fn start_scraper(
    opts: &AttachOptions,
    pids: &[u32],
    tried: &mut HashSet<(u32, u16)>,
    tx: SyncSender<Event>,
) -> (Option<String>, Option<Scraper>) {
    let found = match &opts.metrics_url {
        Some(url) => Some((opts.pid, url.clone())),
        None => metrics_scrape::discover_in(pids, tried),
    };
    let metrics_url = found.as_ref().map(|(_, u)| u.clone());
    let scraper = match found {
        Some((pid, url)) => match Scraper::spawn(pid, url, metrics_scrape::DEFAULT_INTERVAL, tx) {
            Ok(s) => Some(s),
            Err(e) => {
                note!("warning: cannot start the /metrics scraper: {e}");
                None
            }
        },
        None => {
            let later = if opts.follow_children {
                " (looked for again as the tree's processes listen)"
            } else {
                ""
            };
            note!(
                "warning: no Prometheus /metrics endpoint found for pid {} (pass --metrics-url){later}: no KV-cache/queue counters",
                opts.pid
            );
            None
        }
    };
    (metrics_url, scraper)
}

/// What a session of a server without llmprof's probe points records (llama.cpp's server, vLLM, ...): said
/// once at start, fitted to what this session has on.
pub(super) fn without_engine_probes(pid: u32, name: &str, wire: bool, python: bool, samples: bool) -> String {
    let mut gets = Vec::new();
    if wire {
        gets.push(
            "its requests from the wire (HTTP/1.1: status, TTFT and inter-token time as clients see them)",
        );
    }
    if python {
        gets.push("its Python frames in the stack samples");
    } else if samples {
        gets.push("stack samples");
    }
    gets.push("syscalls, thread states, model-file reads and egress");
    format!(
        "note: pid {pid} ({name}) has no llmprof probe points; recording {}. Engine steps (batches, queue and \
         prefill inside the engine) come from an engine built with llmprof-probes, such as llmserve, or from \
         llmprof's Python hooks (vLLM's engine, found by itself; any Python function with --py-range).",
        gets.join(", ")
    )
}
