//! The `--json` document of `llmprof report` (layout and stability rules in the [module docs](super)): object
//! keys in the documented order, numbers rounded to 1e-6, non-finite numbers as `null`.
//!
//! Formatting only: every number comes from the [`Report`].

use super::{CounterSummary, GpuSection, JSON_FORMAT, OverheadReport, Report, Stats, SyscallRow};

/// A JSON value with ordered object keys (the `--json` layout is written field by field, so it is stable).
enum Json {
    Null,
    Bool(bool),
    Num(f64),
    Int(u64),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(&'static str, Json)>),
}

impl Json {
    /// The serde_json value (object keys keep their order: serde_json's `preserve_order`); numbers rounded to
    /// 1e-6, non-finite numbers as null.
    fn into_value(self) -> serde_json::Value {
        use serde_json::Value;
        match self {
            Self::Null => Value::Null,
            Self::Bool(b) => Value::Bool(b),
            Self::Num(v) => {
                serde_json::Number::from_f64((v * 1e6).round() / 1e6).map_or(Value::Null, Value::Number)
            }
            Self::Int(v) => Value::from(v),
            Self::Str(s) => Value::String(s),
            Self::Arr(v) => Value::Array(v.into_iter().map(Self::into_value).collect()),
            Self::Obj(v) => Value::Object(
                v.into_iter()
                    .map(|(k, x)| (k.to_string(), x.into_value()))
                    .collect(),
            ),
        }
    }
}

fn opt(v: Option<f64>) -> Json {
    v.map_or(Json::Null, Json::Num)
}

fn stats_json(s: &Stats) -> Json {
    Json::Obj(vec![
        ("count", Json::Int(s.count as u64)),
        ("p50", opt(s.p50)),
        ("p95", opt(s.p95)),
        ("p99", opt(s.p99)),
        ("max", opt(s.max)),
        ("mean", opt(s.mean)),
    ])
}

fn syscalls_json(v: &[SyscallRow], with_max: bool) -> Json {
    Json::Arr(
        v.iter()
            .map(|s| {
                let mut o = vec![
                    ("name", Json::Str(s.name.clone())),
                    ("count", Json::Int(s.count)),
                    ("total_ms", Json::Num(s.total_ms)),
                ];
                if with_max {
                    o.push(("max_ms", opt(s.max_ms)));
                }
                Json::Obj(o)
            })
            .collect(),
    )
}

impl Report {
    /// The `--json` document (layout in the module docs).
    pub fn to_json(&self) -> String {
        let finished = self
            .requests
            .iter()
            .filter(|q| q.finish_reason != "unfinished")
            .count();
        let requests = Json::Obj(vec![
            ("count", Json::Int(self.requests.len() as u64)),
            ("finished", Json::Int(finished as u64)),
            ("unfinished", Json::Int((self.requests.len() - finished) as u64)),
            ("ttft_ms", stats_json(&self.ttft())),
            ("queue_ms", stats_json(&self.col(|q| q.queue_ms))),
            ("prefill_ms", stats_json(&self.col(|q| q.prefill_ms))),
            (
                "first_decode_step_ms",
                stats_json(&self.col(|q| q.first_decode_step_ms)),
            ),
            ("itl_ms", stats_json(&Stats::of(&self.itl_ms))),
            (
                "per_request",
                Json::Arr(
                    self.requests
                        .iter()
                        .map(|q| {
                            Json::Obj(vec![
                                ("req_id", Json::Int(q.req_id)),
                                ("x_request_id", Json::Str(q.x_request_id.clone())),
                                ("queue_ms", opt(q.queue_ms)),
                                ("prefill_ms", opt(q.prefill_ms)),
                                ("ttft_ms", opt(q.ttft_ms)),
                                ("first_decode_step_ms", opt(q.first_decode_step_ms)),
                                ("output_tokens", Json::Int(q.output_tokens)),
                                ("finish_reason", Json::Str(q.finish_reason.clone())),
                                ("preemptions", Json::Int(q.preemptions)),
                                ("attached_mid_request", Json::Bool(q.attached_mid_request)),
                            ])
                        })
                        .collect(),
                ),
            ),
        ]);
        let steps = Json::Obj(vec![
            (
                "count",
                Json::Int(self.steps_by_kind.values().map(|s| s.count as u64).sum()),
            ),
            (
                "by_kind",
                Json::Obj(
                    ["prefill", "decode", "mixed"]
                        .into_iter()
                        .map(|k| {
                            (
                                k,
                                stats_json(&self.steps_by_kind.get(k).cloned().unwrap_or_default()),
                            )
                        })
                        .collect(),
                ),
            ),
            (
                "by_batch_size",
                Json::Arr(
                    self.steps_by_batch
                        .iter()
                        .map(|b| {
                            Json::Obj(vec![
                                ("bucket", Json::Str(b.bucket.clone())),
                                ("min_seqs", Json::Int(b.min_seqs)),
                                (
                                    "max_seqs",
                                    if b.max_seqs == u64::MAX {
                                        Json::Null
                                    } else {
                                        Json::Int(b.max_seqs)
                                    },
                                ),
                                ("stats", stats_json(&b.stats)),
                            ])
                        })
                        .collect(),
                ),
            ),
        ]);
        let mut counters: Vec<(&'static str, Json)> = self
            .counters
            .iter()
            .map(|(k, c)| {
                (
                    *k,
                    Json::Obj(vec![
                        ("samples", Json::Int(c.samples as u64)),
                        ("max", opt(c.max)),
                        ("mean", opt(c.mean)),
                        ("last", opt(c.last)),
                    ]),
                )
            })
            .collect();
        counters.push(("preemptions_total", opt(self.preemptions_total)));
        let doc = Json::Obj(vec![
            ("format", Json::Str(JSON_FORMAT.to_owned())),
            ("trace", Json::Str(self.trace.clone())),
            ("truncated", Json::Bool(self.truncated)),
            ("has_summary", Json::Bool(self.has_summary)),
            (
                "end_reason",
                self.end_reason.clone().map_or(Json::Null, Json::Str),
            ),
            ("requests", requests),
            ("steps", steps),
            ("counters", Json::Obj(counters)),
            (
                "syscalls",
                Json::Obj(vec![
                    ("slow_syscall_slices", syscalls_json(&self.slow_syscalls, true)),
                    (
                        "kernel_aggregates",
                        syscalls_json(&self.syscall_aggregates, false),
                    ),
                ]),
            ),
            (
                "model_files",
                Json::Arr(
                    self.model_files
                        .iter()
                        .map(|f| {
                            Json::Obj(vec![
                                ("path", Json::Str(f.path.clone())),
                                ("reads", Json::Int(f.reads)),
                                ("bytes", Json::Int(f.bytes)),
                                ("read_ms", Json::Num(f.read_ms)),
                                ("mb_per_s", opt(f.mb_per_s)),
                                ("opens", Json::Int(f.opens)),
                                ("mmaps", Json::Int(f.mmaps)),
                            ])
                        })
                        .collect(),
                ),
            ),
            (
                "egress",
                Json::Arr(
                    self.egress
                        .iter()
                        .map(|e| {
                            Json::Obj(vec![
                                ("address", Json::Str(e.address.clone())),
                                ("port", Json::Int(e.port)),
                                ("connects", Json::Int(e.connects)),
                                ("failed", Json::Int(e.failed)),
                                ("allowed", Json::Bool(e.allowed)),
                                (
                                    "verdict",
                                    Json::Str(if e.allowed { "allowed" } else { "flagged" }.to_owned()),
                                ),
                            ])
                        })
                        .collect(),
                ),
            ),
            (
                "drops",
                Json::Obj(vec![
                    ("total_dropped", Json::Int(self.total_dropped)),
                    ("user_drops", Json::Int(self.user_drops)),
                    ("decode_errors", Json::Int(self.decode_errors)),
                    ("source", Json::Str(self.drops_source.to_owned())),
                    (
                        "probes",
                        Json::Arr(
                            self.probes
                                .iter()
                                .map(|p| {
                                    Json::Obj(vec![
                                        ("probe", Json::Str(p.probe.clone())),
                                        ("hits", p.hits.map_or(Json::Null, Json::Int)),
                                        ("emitted", p.emitted.map_or(Json::Null, Json::Int)),
                                        ("dropped", Json::Int(p.dropped)),
                                    ])
                                })
                                .collect(),
                        ),
                    ),
                ]),
            ),
            (
                "overhead",
                self.overhead.as_ref().map_or(Json::Null, overhead_json),
            ),
            ("gpu", self.gpu.as_ref().map_or(Json::Null, gpu_json)),
        ]);
        let mut out = serde_json::to_string_pretty(&doc.into_value()).unwrap_or_default();
        out.push('\n');
        out
    }
}

fn counter_json(c: &CounterSummary) -> Vec<(&'static str, Json)> {
    vec![
        ("samples", Json::Int(c.samples as u64)),
        ("mean", opt(c.mean)),
        ("max", opt(c.max)),
        ("last", opt(c.last)),
    ]
}

fn gpu_json(g: &GpuSection) -> Json {
    let gpus = g
        .gpus
        .iter()
        .map(|row| {
            Json::Obj(vec![
                ("index", Json::Int(row.index)),
                ("name", Json::Str(row.name.clone())),
                (
                    "counters",
                    Json::Arr(
                        row.counters
                            .iter()
                            .map(|c| {
                                let mut o = vec![
                                    ("metric", Json::Str(c.metric.clone())),
                                    ("unit", Json::Str(c.unit.clone())),
                                ];
                                o.extend(counter_json(&c.summary));
                                Json::Obj(o)
                            })
                            .collect(),
                    ),
                ),
                (
                    "process_memory_mib",
                    Json::Arr(
                        row.process_memory
                            .iter()
                            .map(|(pid, c)| {
                                let mut o = vec![("pid", Json::Int(*pid))];
                                o.extend(counter_json(c));
                                Json::Obj(o)
                            })
                            .collect(),
                    ),
                ),
            ])
        })
        .collect();
    let functions = g
        .cuda_functions
        .iter()
        .map(|f| {
            Json::Obj(vec![
                ("function", Json::Str(f.function.clone())),
                ("calls", Json::Int(f.calls)),
                ("total_ms", Json::Num(f.total_ms)),
                ("individual", stats_json(&f.individual)),
            ])
        })
        .collect();
    let summary = g.summary.as_ref().map_or(Json::Null, |s| {
        Json::Obj(vec![
            ("calls", Json::Int(s.calls)),
            ("individual", Json::Int(s.individual)),
            ("batches", Json::Int(s.batches)),
            ("batched", Json::Int(s.batched)),
            ("over_budget", Json::Int(s.over_budget)),
        ])
    });
    let probe = g.probe.as_ref().map_or(Json::Null, |p| {
        Json::Obj(vec![
            ("hits", p.hits.map_or(Json::Null, Json::Int)),
            ("emitted", p.emitted.map_or(Json::Null, Json::Int)),
            ("dropped", Json::Int(p.dropped)),
        ])
    });
    Json::Obj(vec![
        ("gpus", Json::Arr(gpus)),
        (
            "cuda",
            Json::Obj(vec![
                ("functions", Json::Arr(functions)),
                ("host_total_ms", Json::Num(g.cuda_host_total_ms)),
                ("synchronize_calls", Json::Int(g.synchronize_calls)),
                ("synchronize_ms", Json::Num(g.synchronize_ms)),
                ("launches_per_step", stats_json(&g.launches_per_step)),
                ("summary", summary),
                ("probe", probe),
            ]),
        ),
        (
            "markers",
            Json::Arr(g.markers.iter().cloned().map(Json::Str).collect()),
        ),
    ])
}

fn overhead_json(o: &OverheadReport) -> Json {
    let int = |v: Option<u64>| v.map_or(Json::Null, Json::Int);
    Json::Obj(vec![
        ("est_target_cpu_ms", opt(o.est_target_cpu_ms)),
        ("est_target_pct", opt(o.est_target_pct)),
        ("target_cpu_ms", opt(o.target_cpu_ms)),
        (
            "by_probe_ms",
            Json::Obj(
                o.by_probe_ms
                    .iter()
                    .map(|(k, v)| {
                        let name = llmprof_abi::PROBE_NAMES
                            .iter()
                            .find(|n| **n == k.as_str())
                            .copied()
                            .unwrap_or("other");
                        (name, Json::Num(*v))
                    })
                    .collect(),
            ),
        ),
        ("llmprof_cpu_ms", opt(o.llmprof_cpu_ms)),
        ("llmprof_cpu_pct", opt(o.llmprof_cpu_pct)),
        ("llmprof_max_rss_mib", opt(o.llmprof_max_rss_mib)),
        (
            "cost_ns",
            Json::Obj(vec![
                ("syscall", opt(o.cost_ns_syscall)),
                ("engine_probe", opt(o.cost_ns_engine_probe)),
                (
                    "engine_probe_sampled_out",
                    opt(o.cost_ns_engine_probe_sampled_out),
                ),
                ("cuda_call", opt(o.cost_ns_cuda_call)),
            ]),
        ),
        ("probe_entry", o.probe_entry.clone().map_or(Json::Null, Json::Str)),
        ("budget_pct", opt(o.budget_pct)),
        (
            "degradations",
            Json::Arr(
                o.degradations
                    .iter()
                    .map(|d| {
                        Json::Obj(vec![
                            ("at_s", Json::Num(d.at_s)),
                            ("level", Json::Int(d.level)),
                            ("step", Json::Str(d.step.clone())),
                            ("change", Json::Str(d.change.clone())),
                            ("est_overhead_pct", opt(d.est_overhead_pct)),
                            ("syscalls_counted", int(d.syscalls_counted)),
                        ])
                    })
                    .collect(),
            ),
        ),
        ("size_limit_bytes", int(o.size_limit_bytes)),
        ("size_limit_reached", Json::Bool(o.size_limit_reached)),
        ("events_not_written", int(o.events_not_written)),
    ])
}
