//! Shared builders of events and records for tests: the one place a fixture's [`Event`]s, engine records and
//! [`ProcessInfo`]s are assembled, for this crate's unit tests and (feature `testing`) for `llmprof`'s tests.
//!
//! A fixture states only what its assertions depend on: [`step`] and [`request`] start from the ABI's own
//! constructors (`StepRecord::new`, `RequestRecord::new`: every other field zero) and take the rest through
//! chained setters; the others are plain functions. Timestamps are BOOTTIME ns, like [`Event::ts_ns`]; every
//! builder takes the process (and thread) first.
//!
//! ```
//! use llmprof_abi::{FinishReason, RequestEventKind, StepKind};
//! use llmprof_trace::testing;
//!
//! let pid = 4242;
//! let arrived = testing::request(pid, RequestEventKind::Arrived, 1, 1_000)
//!     .chat("smollm2", "xr-1")
//!     .prompt(12, 16)
//!     .build();
//! let prefill = testing::step(pid, pid + 1, StepKind::Prefill, 1, 1_200, 2_200, &[1])
//!     .tokens(12, 0)
//!     .kv_blocks(3, 64)
//!     .build();
//! let finished = testing::request(pid, RequestEventKind::Finished, 1, 3_600)
//!     .output(3, FinishReason::Stop)
//!     .build();
//! assert_eq!(prefill.ts_ns, 2_200, "a step is stamped at its end");
//! # let _ = (arrived, finished);
//! ```
//!
//! Never part of a release build's code path: compiled for this crate's tests and behind the `testing` feature,
//! which only dev-dependencies enable.

pub mod cupti;

use std::net::SocketAddr;

use llmprof_abi::{
    CudaFunc, CudaVariant, FinishReason, RangeOp, RangeRecord, RequestEventKind, RequestRecord, StepKind,
    StepRecord, fill_str,
};

use crate::event::{Event, EventBody, GpuSample, MetricsSample, ProcessInfo, ThreadInfo};

/// The range domain llmserve's NVTX-style ranges carry (`inference::engine::RANGE_DOMAIN`).
pub const ENGINE_RANGE_DOMAIN: &str = "llmserve";

/// How long a [`connect`] takes, ns (1 µs: a loopback or refused connect).
pub const CONNECT_DUR_NS: u64 = 1_000;

/// An event of `pid`/`tid` at `ts_ns` (for bodies without a builder of their own).
pub fn event(pid: u32, tid: u32, ts_ns: u64, body: EventBody) -> Event {
    Event {
        ts_ns,
        pid,
        tid,
        body,
    }
}

/// An engine step `id` of `kind` on thread `tid`, host time `start_ns..end_ns`, serving `reqs`; stamped at its
/// end like the engine's probe. Device times, token counts and KV blocks stay zero unless set.
pub fn step(pid: u32, tid: u32, kind: StepKind, id: u64, start_ns: u64, end_ns: u64, reqs: &[u64]) -> Step {
    Step {
        pid,
        tid,
        rec: StepRecord {
            host_start_ns: start_ns,
            host_end_ns: end_ns,
            ..StepRecord::new(kind, id, reqs)
        },
    }
}

/// A step event being built; see [`step`].
#[derive(Clone, Debug)]
#[must_use = "a builder does nothing until `build()`"]
pub struct Step {
    pid: u32,
    tid: u32,
    rec: StepRecord,
}

impl Step {
    /// Device start and end, BOOTTIME ns.
    pub fn device(mut self, start_ns: u64, end_ns: u64) -> Self {
        self.rec.device_start_ns = start_ns;
        self.rec.device_end_ns = end_ns;
        self
    }

    /// Prompt tokens and decode tokens the step computed.
    pub fn tokens(mut self, prefill: u32, decode: u32) -> Self {
        self.rec.prefill_tokens = prefill;
        self.rec.decode_tokens = decode;
        self
    }

    /// KV-cache blocks in use and in the pool.
    pub fn kv_blocks(mut self, used: u32, total: u32) -> Self {
        self.rec.kv_blocks_used = used;
        self.rec.kv_blocks_total = total;
        self
    }

    /// The batch size of the CUDA graph the step replayed.
    pub fn graph(mut self, batch: u32) -> Self {
        self.rec.graph_batch = batch;
        self
    }

    /// Each request's share of the step's tokens, in the order of the request ids.
    pub fn req_tokens(mut self, tokens: impl IntoIterator<Item = u32>) -> Self {
        self.rec = self.rec.with_req_tokens(tokens);
        self
    }

    /// The record as built so far.
    pub fn record(&self) -> &StepRecord {
        &self.rec
    }

    /// The event, at the step's host end.
    pub fn build(self) -> Event {
        event(
            self.pid,
            self.tid,
            self.rec.host_end_ns,
            EventBody::Step(Box::new(self.rec)),
        )
    }
}

/// A request transition `kind` of engine request `id` at `ts_ns`, on the process's main thread (`tid == pid`,
/// where llmserve's HTTP layer emits it). Every field the transition does not set stays zero.
pub fn request(pid: u32, kind: RequestEventKind, id: u64, ts_ns: u64) -> Request {
    Request {
        pid,
        rec: RequestRecord::new(kind, id, ts_ns),
    }
}

/// A request event being built; see [`request`].
#[derive(Clone, Debug)]
#[must_use = "a builder does nothing until `build()`"]
pub struct Request {
    pid: u32,
    rec: RequestRecord,
}

impl Request {
    /// A chat request (`/v1/chat/completions`) for `model` with the caller's `x-request-id`.
    pub fn chat(mut self, model: &str, x_request_id: &str) -> Self {
        self.rec.is_chat = 1;
        self.rec.model = fill_str(model);
        self.rec.x_request_id = fill_str(x_request_id);
        self
    }

    /// Prompt tokens and the request's `max_tokens`.
    pub fn prompt(mut self, prompt_tokens: u32, max_tokens: u32) -> Self {
        self.rec.prompt_tokens = prompt_tokens;
        self.rec.max_tokens = max_tokens;
        self
    }

    /// Sampling parameters.
    pub fn sampling(mut self, temperature: f32, top_p: f32) -> Self {
        self.rec.temperature = temperature;
        self.rec.top_p = top_p;
        self
    }

    /// The caller's W3C trace context, sampled (`traceparent` flags 01).
    pub fn traced(mut self, trace_id: [u8; 16], parent_span_id: [u8; 8]) -> Self {
        self.rec.trace_id = trace_id;
        self.rec.parent_span_id = parent_span_id;
        self.rec.has_trace_context = 1;
        self.rec.trace_flags = 1;
        self
    }

    /// Output tokens so far and the finish reason ([`FinishReason::None`] until it finished).
    pub fn output(self, output_tokens: u32, finish: FinishReason) -> Self {
        self.output_raw(output_tokens, finish as u32)
    }

    /// [`Request::output`] with the finish reason's raw value (as the ABI record holds it).
    pub fn output_raw(mut self, output_tokens: u32, finish_reason: u32) -> Self {
        self.rec.output_tokens = output_tokens;
        self.rec.finish_reason = finish_reason;
        self
    }

    /// Times the request was preempted so far.
    pub fn preemptions(mut self, n: u32) -> Self {
        self.rec.num_preemptions = n;
        self
    }

    /// The record as built so far.
    pub fn record(&self) -> &RequestRecord {
        &self.rec
    }

    /// The event, at the record's timestamp.
    pub fn build(self) -> Event {
        request_event(self.pid, self.rec)
    }
}

/// The event of a finished request record: on the main thread of `pid`, at the record's timestamp.
pub fn request_event(pid: u32, rec: RequestRecord) -> Event {
    event(pid, pid, rec.ts_ns, EventBody::Request(Box::new(rec)))
}

/// An NVTX-style range operation of llmserve ([`ENGINE_RANGE_DOMAIN`]) named `name`, during step `step_id`.
pub fn range(pid: u32, tid: u32, ts_ns: u64, op: RangeOp, step_id: u64, name: &str) -> Event {
    let rec = RangeRecord::new(op, ts_ns, step_id, ENGINE_RANGE_DOMAIN, name);
    event(pid, tid, ts_ns, EventBody::Range(rec))
}

/// A syscall `nr` that took `dur_ns` (entered at `ts_ns`) and returned `ret`.
pub fn slow_syscall(pid: u32, tid: u32, ts_ns: u64, nr: u64, ret: i64, dur_ns: u64) -> Event {
    event(pid, tid, ts_ns, EventBody::SlowSyscall { nr, ret, dur_ns })
}

/// A connect to `to` returning `ret` (0 or -errno), inside the allowed CIDRs or not; lasts [`CONNECT_DUR_NS`].
/// `to` is anything std turns into a socket address, e.g. `([10, 0, 0, 1], 80)`.
pub fn connect(pid: u32, tid: u32, ts_ns: u64, to: impl Into<SocketAddr>, ret: i64, allowed: bool) -> Event {
    let to = to.into();
    event(
        pid,
        tid,
        ts_ns,
        EventBody::Connect {
            addr: to.ip(),
            port: to.port(),
            ret,
            dur_ns: CONNECT_DUR_NS,
            allowed,
        },
    )
}

/// A scrape of the engine's `/metrics` with every value present, in [`MetricsSample`]'s order: KV-cache usage
/// (0..1), requests running, requests waiting, preemptions so far (thread 0: not thread-specific).
pub fn metrics(
    pid: u32,
    ts_ns: u64,
    kv_cache_usage: f64,
    running: f64,
    waiting: f64,
    preemptions: f64,
) -> Event {
    event(
        pid,
        0,
        ts_ns,
        EventBody::Metrics(MetricsSample {
            kv_cache_usage: Some(kv_cache_usage),
            running: Some(running),
            waiting: Some(waiting),
            preemptions_total: Some(preemptions),
        }),
    )
}

/// A successful CUDA driver call `func` (its `_v2` symbol) of `dur_ns` entered at `ts_ns`, with argument `arg`.
pub fn cuda(pid: u32, tid: u32, ts_ns: u64, func: CudaFunc, dur_ns: u64, arg: u64) -> Event {
    event(
        pid,
        tid,
        ts_ns,
        EventBody::CudaCall {
            func,
            variant: CudaVariant::V2,
            dur_ns,
            arg,
            result: 0,
        },
    )
}

/// An NVML sample event (thread 0: not thread-specific); see [`h100`].
pub fn gpu(pid: u32, ts_ns: u64, sample: GpuSample) -> Event {
    event(pid, 0, ts_ns, EventBody::GpuSample(Box::new(sample)))
}

/// A sample of GPU 0, an H100 at `util_gpu_pct`: 1 GiB of its 80 GiB used, 1980 MHz, 55 °C, 2 MB/s PCIe TX,
/// no PCIe RX (an unsupported counter stays absent); memory utilization, power and the target's memory absent
/// unless set (`GpuSample { power_w: Some(300.0), ..h100(50.0) }`).
pub fn h100(util_gpu_pct: f64) -> GpuSample {
    GpuSample {
        index: 0,
        name: "NVIDIA H100 80GB HBM3".into(),
        uuid: "GPU-0123".into(),
        util_gpu_pct: Some(util_gpu_pct),
        util_mem_pct: None,
        mem_used_bytes: Some(1 << 30),
        mem_total_bytes: Some(80 << 30),
        power_w: None,
        sm_clock_mhz: Some(1980.0),
        temperature_c: Some(55.0),
        pcie_tx_bytes_per_s: Some(2e6),
        pcie_rx_bytes_per_s: None,
        process_mem_bytes: None,
    }
}

/// A marker (llmprof's own text on the timeline).
pub fn marker(pid: u32, tid: u32, ts_ns: u64, text: &str) -> Event {
    event(pid, tid, ts_ns, EventBody::Marker { text: text.into() })
}

/// A traced process with its engine probes attached, and its threads `(tid, name)` known at attach time.
pub fn process<S: Into<String>>(
    pid: u32,
    name: &str,
    cmdline: &str,
    threads: impl IntoIterator<Item = (u32, S)>,
) -> ProcessInfo {
    ProcessInfo {
        pid,
        name: name.into(),
        cmdline: cmdline.into(),
        threads: threads
            .into_iter()
            .map(|(tid, name)| ThreadInfo {
                tid,
                name: name.into(),
            })
            .collect(),
        engine_probes: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builders_keep_what_they_are_given_and_zero_the_rest() {
        let s = step(1, 2, StepKind::Mixed, 7, 100, 200, &[3, 4])
            .device(110, 190)
            .tokens(12, 2)
            .kv_blocks(3, 64)
            .req_tokens([8, 4]);
        let r = *s.record();
        assert_eq!(
            (r.host_start_ns, r.host_end_ns, r.device_start_ns, r.device_end_ns),
            (100, 200, 110, 190)
        );
        assert_eq!(
            (
                r.prefill_tokens,
                r.decode_tokens,
                r.kv_blocks_used,
                r.kv_blocks_total
            ),
            (12, 2, 3, 64)
        );
        assert_eq!(
            (r.tokens_of(3), r.tokens_of(4), r.num_waiting),
            (Some(8), Some(4), 0)
        );
        let e = s.build();
        assert_eq!((e.pid, e.tid, e.ts_ns), (1, 2, 200));

        let e = request(9, RequestEventKind::Finished, 5, 300)
            .output(3, FinishReason::Length)
            .build();
        let EventBody::Request(r) = &e.body else {
            panic!("a request event: {e:?}")
        };
        assert_eq!((e.pid, e.tid, e.ts_ns, r.req_id), (9, 9, 300, 5));
        assert_eq!(
            (r.output_tokens, r.finish_reason, r.is_chat),
            (3, FinishReason::Length as u32, 0)
        );

        let EventBody::Connect { addr, port, .. } = connect(1, 1, 0, ([10, 0, 0, 1], 80), 0, true).body
        else {
            panic!("a connect event")
        };
        assert_eq!((addr.to_string(), port), ("10.0.0.1".to_string(), 80));
    }
}
