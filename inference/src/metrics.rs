//! Prometheus metrics named and defined as vLLM V1's (vllm/v1/metrics/loggers.py, `PrometheusStatLogger`).
//!
//! Owns the engine's counters, gauges and histograms and their text exposition (format 0.0.4). Written by hand
//! (a few atomics and mutex-guarded histograms) instead of pulling a metrics framework. The engine thread updates
//! them; `GET /metrics` renders them. Every series carries the label `model_name`. Updating never blocks for long:
//! histogram mutexes are held for one observation.

use llmprof_abi::StepKind;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// `vllm:time_to_first_token_seconds` buckets, copied from vLLM V1 `loggers.py`.
pub const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
    80.0, 160.0, 640.0, 2560.0,
];
/// `vllm:inter_token_latency_seconds` and `vllm:request_time_per_output_token_seconds` buckets, copied from
/// vLLM V1 `loggers.py`.
pub const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
];
/// Request latency buckets (e2e, queue, prefill, decode), copied from vLLM V1 `loggers.py` (`request_latency_buckets`).
pub const REQUEST_LATENCY_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
    960.0, 1920.0, 7680.0,
];

/// vLLM's `build_1_2_5_buckets(max_model_len)`: 1, 2, 5, 10, 20, 50, ... up to `max`.
pub fn buckets_1_2_5(max: usize) -> Vec<f64> {
    let mut out = Vec::new();
    let mut exp = 1u64;
    loop {
        for m in [1u64, 2, 5] {
            let v = m * exp;
            if v as usize > max {
                return out;
            }
            out.push(v as f64);
        }
        exp *= 10;
    }
}

/// Finish reasons that get a `vllm:request_success_total` series (vLLM's `FinishReason` spellings).
pub const FINISH_REASONS: [&str; 3] = ["stop", "length", "abort"];

/// A cumulative histogram.
#[derive(Debug, Clone)]
pub struct Histogram {
    bounds: Vec<f64>,
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    /// Empty histogram with the given upper bounds (ascending; +Inf is implicit).
    pub fn new(bounds: &[f64]) -> Self {
        Self {
            bounds: bounds.to_vec(),
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    /// Records one value.
    pub fn observe(&mut self, v: f64) {
        if !v.is_finite() {
            return;
        }
        if let Some(i) = self.bounds.iter().position(|&b| v <= b) {
            self.counts[i] += 1;
        }
        self.sum += v;
        self.count += 1;
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count
    }
}

/// Gauges and counters as atomics (f64 gauges stored as bits).
#[derive(Debug, Default)]
struct Scalars {
    running: AtomicU64,
    waiting: AtomicU64,
    kv_usage_bits: AtomicU64,
    preemptions: AtomicU64,
    prompt_tokens: AtomicU64,
    generation_tokens: AtomicU64,
    success: [AtomicU64; 3],
    stream_stalls: AtomicU64,
    /// Engine steps by kind (prefill, decode, mixed), in `llmprof_abi::StepKind` order.
    steps: [AtomicU64; 3],
    /// Host time of all steps, ns.
    step_host_ns: AtomicU64,
    /// Device time of all steps (the step records' device intervals), ns.
    step_device_ns: AtomicU64,
}

/// Request-level histograms.
#[derive(Debug)]
struct Hists {
    ttft: Histogram,
    itl: Histogram,
    tpot: Histogram,
    e2e: Histogram,
    queue: Histogram,
    prefill: Histogram,
    decode: Histogram,
    prompt_tokens: Histogram,
    generation_tokens: Histogram,
}

/// Timings and sizes of one finished request, recorded at once.
#[derive(Debug, Clone, Copy, Default)]
pub struct FinishedRequestStats {
    /// `stop`, `length` or `abort` index into [`FINISH_REASONS`].
    pub reason: usize,
    /// Arrival → finish, s.
    pub e2e_s: f64,
    /// Arrival → first scheduled, s (None when never scheduled).
    pub queue_s: Option<f64>,
    /// First scheduled → first token, s.
    pub prefill_s: Option<f64>,
    /// First token → finish, s.
    pub decode_s: Option<f64>,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Output tokens.
    pub generation_tokens: u64,
}

/// All engine metrics.
#[derive(Debug)]
pub struct Metrics {
    model_name: Mutex<String>,
    s: Scalars,
    h: Mutex<Hists>,
}

impl Metrics {
    /// Fresh metrics for a model with context length `max_model_len` (sizes the token-count buckets as vLLM).
    pub fn new(model_name: &str, max_model_len: usize) -> Self {
        let tok = buckets_1_2_5(max_model_len.max(1));
        Self {
            model_name: Mutex::new(model_name.to_string()),
            s: Scalars::default(),
            h: Mutex::new(Hists {
                ttft: Histogram::new(TTFT_BUCKETS),
                itl: Histogram::new(ITL_BUCKETS),
                tpot: Histogram::new(ITL_BUCKETS),
                e2e: Histogram::new(REQUEST_LATENCY_BUCKETS),
                queue: Histogram::new(REQUEST_LATENCY_BUCKETS),
                prefill: Histogram::new(REQUEST_LATENCY_BUCKETS),
                decode: Histogram::new(REQUEST_LATENCY_BUCKETS),
                prompt_tokens: Histogram::new(&tok),
                generation_tokens: Histogram::new(&tok),
            }),
        }
    }

    fn hists(&self) -> std::sync::MutexGuard<'_, Hists> {
        // A panic while holding the lock cannot leave a histogram inconsistent in a harmful way.
        self.h.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets the scheduler gauges.
    pub fn set_scheduler_state(&self, running: usize, waiting: usize, kv_usage: f64) {
        self.s.running.store(running as u64, Ordering::Relaxed);
        self.s.waiting.store(waiting as u64, Ordering::Relaxed);
        self.s.kv_usage_bits.store(kv_usage.to_bits(), Ordering::Relaxed);
    }

    /// Adds preemptions.
    pub fn add_preemptions(&self, n: u64) {
        self.s.preemptions.fetch_add(n, Ordering::Relaxed);
    }

    /// Adds computed prompt tokens (counted once per request, when its prefill completes).
    pub fn add_prompt_tokens(&self, n: u64) {
        self.s.prompt_tokens.fetch_add(n, Ordering::Relaxed);
    }

    /// Adds generated tokens.
    pub fn add_generation_tokens(&self, n: u64) {
        self.s.generation_tokens.fetch_add(n, Ordering::Relaxed);
    }

    /// Counts a step where a client's bounded stream was full (output kept and coalesced, loop not blocked).
    pub fn add_stream_stall(&self) {
        self.s.stream_stalls.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one engine step of `kind` (`llmserve:engine_steps_total{kind}`): the engine's own step count, which
    /// a trace's step slices can be checked against.
    pub fn add_step(&self, kind: llmprof_abi::StepKind) {
        if let Some(c) = self.s.steps.get(kind as usize) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Adds one step's host time and device time (`llmserve:step_seconds_total`,
    /// `llmserve:device_busy_seconds_total`; their ratio over an interval is how busy the device kept).
    pub fn add_step_time(&self, host_ns: u64, device_ns: u64) {
        self.s.step_host_ns.fetch_add(host_ns, Ordering::Relaxed);
        self.s.step_device_ns.fetch_add(device_ns, Ordering::Relaxed);
    }

    /// Records a time to first token.
    pub fn observe_ttft(&self, s: f64) {
        self.hists().ttft.observe(s);
    }

    /// Records an inter-token latency.
    pub fn observe_itl(&self, s: f64) {
        self.hists().itl.observe(s);
    }

    /// Records a finished request.
    pub fn observe_finished(&self, f: &FinishedRequestStats) {
        if let Some(c) = self.s.success.get(f.reason) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        let mut h = self.hists();
        h.e2e.observe(f.e2e_s);
        if let Some(q) = f.queue_s {
            h.queue.observe(q);
        }
        if let Some(p) = f.prefill_s {
            h.prefill.observe(p);
        }
        if let Some(d) = f.decode_s {
            h.decode.observe(d);
            if f.generation_tokens > 1 {
                h.tpot.observe(d / (f.generation_tokens - 1) as f64);
            }
        }
        h.prompt_tokens.observe(f.prompt_tokens as f64);
        h.generation_tokens.observe(f.generation_tokens as f64);
    }

    /// Changes the model label (after a reload under another name).
    pub fn set_model_name(&self, name: &str) {
        *self.model_name.lock().unwrap_or_else(|e| e.into_inner()) = name.to_string();
    }

    /// Current `vllm:num_preemptions_total`.
    pub fn preemptions(&self) -> u64 {
        self.s.preemptions.load(Ordering::Relaxed)
    }

    /// Renders the Prometheus text exposition (format 0.0.4).
    pub fn render(&self) -> String {
        let model = escape_label(&self.model_name.lock().unwrap_or_else(|e| e.into_inner()));
        let lbl = format!("model_name=\"{model}\"");
        let mut o = String::with_capacity(16 * 1024);
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        gauge(
            &mut o,
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            &lbl,
            ld(&self.s.running) as f64,
        );
        gauge(
            &mut o,
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            &lbl,
            ld(&self.s.waiting) as f64,
        );
        gauge(
            &mut o,
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            &lbl,
            f64::from_bits(ld(&self.s.kv_usage_bits)),
        );
        counter(
            &mut o,
            "vllm:num_preemptions_total",
            "Cumulative number of preemption from the engine.",
            &[(lbl.clone(), ld(&self.s.preemptions))],
        );
        counter(
            &mut o,
            "vllm:prompt_tokens_total",
            "Number of prefill tokens processed.",
            &[(lbl.clone(), ld(&self.s.prompt_tokens))],
        );
        counter(
            &mut o,
            "vllm:generation_tokens_total",
            "Number of generation tokens processed.",
            &[(lbl.clone(), ld(&self.s.generation_tokens))],
        );
        let success: Vec<(String, u64)> = FINISH_REASONS
            .iter()
            .zip(&self.s.success)
            .map(|(r, c)| (format!("{lbl},finished_reason=\"{r}\""), ld(c)))
            .collect();
        counter(
            &mut o,
            "vllm:request_success_total",
            "Count of successfully processed requests.",
            &success,
        );
        counter(
            &mut o,
            "llmserve:stream_stalls_total",
            "Times a client's bounded output stream was full; the output was held back and coalesced (engine loop not blocked).",
            &[(lbl.clone(), ld(&self.s.stream_stalls))],
        );
        let steps: Vec<(String, u64)> = [StepKind::Prefill, StepKind::Decode, StepKind::Mixed]
            .iter()
            .zip(&self.s.steps)
            .map(|(k, c)| (format!("{lbl},kind=\"{}\"", k.name()), ld(c)))
            .collect();
        counter(
            &mut o,
            "llmserve:engine_steps_total",
            "Engine steps (forward passes) by kind: prefill, decode or mixed.",
            &steps,
        );
        for (name, help, v) in [
            (
                "llmserve:step_seconds_total",
                "Host time spent in engine steps (scheduling to step record), seconds.",
                &self.s.step_host_ns,
            ),
            (
                "llmserve:device_busy_seconds_total",
                "Device time of engine steps, seconds: CUDA events on the CUDA backend, the host compute interval on the CPU backend.",
                &self.s.step_device_ns,
            ),
        ] {
            let _ = writeln!(
                o,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name}{{{lbl}}} {}",
                ld(v) as f64 / 1e9
            );
        }
        let h = self.hists().clone_all();
        hist(
            &mut o,
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            &lbl,
            &h.ttft,
        );
        hist(
            &mut o,
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            &lbl,
            &h.itl,
        );
        hist(
            &mut o,
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            &lbl,
            &h.tpot,
        );
        hist(
            &mut o,
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            &lbl,
            &h.e2e,
        );
        hist(
            &mut o,
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            &lbl,
            &h.queue,
        );
        hist(
            &mut o,
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            &lbl,
            &h.prefill,
        );
        hist(
            &mut o,
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            &lbl,
            &h.decode,
        );
        hist(
            &mut o,
            "vllm:request_prompt_tokens",
            "Number of prefill tokens processed.",
            &lbl,
            &h.prompt_tokens,
        );
        hist(
            &mut o,
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            &lbl,
            &h.generation_tokens,
        );
        o
    }
}

impl Hists {
    fn clone_all(&self) -> Hists {
        Hists {
            ttft: self.ttft.clone(),
            itl: self.itl.clone(),
            tpot: self.tpot.clone(),
            e2e: self.e2e.clone(),
            queue: self.queue.clone(),
            prefill: self.prefill.clone(),
            decode: self.decode.clone(),
            prompt_tokens: self.prompt_tokens.clone(),
            generation_tokens: self.generation_tokens.clone(),
        }
    }
}

fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn fmt_f64(v: f64) -> String {
    if v == f64::INFINITY {
        "+Inf".into()
    } else if v.is_nan() {
        "NaN".into()
    } else {
        format!("{v:?}")
    }
}

fn gauge(o: &mut String, name: &str, help: &str, lbl: &str, v: f64) {
    let _ = writeln!(
        o,
        "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{{lbl}}} {}",
        fmt_f64(v)
    );
}

fn counter(o: &mut String, name: &str, help: &str, series: &[(String, u64)]) {
    let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} counter");
    for (lbl, v) in series {
        let _ = writeln!(o, "{name}{{{lbl}}} {v}");
    }
}

fn hist(o: &mut String, name: &str, help: &str, lbl: &str, h: &Histogram) {
    let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} histogram");
    let mut cum = 0u64;
    for (b, c) in h.bounds.iter().zip(&h.counts) {
        cum += c;
        let _ = writeln!(o, "{name}_bucket{{{lbl},le=\"{}\"}} {cum}", fmt_f64(*b));
    }
    let _ = writeln!(o, "{name}_bucket{{{lbl},le=\"+Inf\"}} {}", h.count);
    let _ = writeln!(o, "{name}_sum{{{lbl}}} {}", fmt_f64(h.sum));
    let _ = writeln!(o, "{name}_count{{{lbl}}} {}", h.count);
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests unwrap to fail loudly")]
mod tests {
    use super::*;

    #[test]
    fn buckets_1_2_5_match_vllm() {
        assert_eq!(buckets_1_2_5(100), vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0]);
        assert_eq!(buckets_1_2_5(8192).last(), Some(&5000.0));
    }

    #[test]
    fn step_and_device_busy_seconds_accumulate() {
        let m = Metrics::new("m", 128);
        m.add_step_time(2_000_000, 1_500_000);
        m.add_step_time(3_000_000, 2_500_000);
        let t = m.render();
        assert!(
            t.contains("llmserve:step_seconds_total{model_name=\"m\"} 0.005\n"),
            "{t}"
        );
        assert!(
            t.contains("llmserve:device_busy_seconds_total{model_name=\"m\"} 0.004\n"),
            "{t}"
        );
        assert!(t.contains("# TYPE llmserve:device_busy_seconds_total counter"));
    }

    #[test]
    fn renders_cumulative_histograms_and_labels() {
        let m = Metrics::new("tiny\"m", 128);
        m.observe_ttft(0.003);
        m.observe_ttft(100.0);
        m.observe_finished(&FinishedRequestStats {
            reason: 1,
            e2e_s: 1.0,
            generation_tokens: 3,
            ..Default::default()
        });
        m.set_scheduler_state(2, 1, 0.5);
        let t = m.render();
        assert!(
            t.contains("vllm:time_to_first_token_seconds_bucket{model_name=\"tiny\\\"m\",le=\"0.001\"} 0")
        );
        assert!(
            t.contains("vllm:time_to_first_token_seconds_bucket{model_name=\"tiny\\\"m\",le=\"0.005\"} 1")
        );
        assert!(
            t.contains("vllm:time_to_first_token_seconds_bucket{model_name=\"tiny\\\"m\",le=\"+Inf\"} 2")
        );
        assert!(t.contains("vllm:time_to_first_token_seconds_count{model_name=\"tiny\\\"m\"} 2"));
        assert!(
            t.contains("vllm:request_success_total{model_name=\"tiny\\\"m\",finished_reason=\"length\"} 1")
        );
        assert!(t.contains("vllm:kv_cache_usage_perc{model_name=\"tiny\\\"m\"} 0.5"));
        assert!(t.contains("vllm:num_requests_running{model_name=\"tiny\\\"m\"} 2"));
    }
}
