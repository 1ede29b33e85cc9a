//! The spans of a closed request: the request span (GenAI attributes, the caller's trace context, the kernel
//! events) and one child per segment of its timeline.

use std::borrow::Cow;

use llmprof_abi::FinishReason;
use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status, TraceState};
use opentelemetry::{Array, KeyValue, StringValue, Value};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};

use super::{OpenRequest, SpanBuilder, secs};
use crate::event::engine::{Segment, SegmentKind};
use crate::otel::semconv as sc;

impl SpanBuilder {
    /// Turns a closed request into its span and its children's.
    pub(super) fn emit(
        &mut self,
        mut st: OpenRequest,
        end_ns: u64,
        unfinished: bool,
        out: &mut Vec<SpanData>,
    ) {
        if !st.flags.is_sampled() {
            self.stats.requests_unsampled += 1;
            return;
        }
        let tl = &st.timeline;
        let info = tl.info();
        let start_ns = tl.start_ns();
        let partial = tl.attached_mid_request();
        let operation = if info.is_chat {
            sc::OPERATION_CHAT
        } else {
            sc::OPERATION_TEXT_COMPLETION
        };
        let name = if info.model.is_empty() {
            operation.to_string()
        } else {
            format!("{operation} {}", info.model)
        };

        let (mut queue, mut prefill, mut decode, mut preempted) = (0u64, 0u64, 0u64, 0u64);
        for s in tl.segments() {
            let d = s.end - s.start;
            match s.kind {
                SegmentKind::Queue => queue += d,
                SegmentKind::Prefill { .. } => prefill += d,
                SegmentKind::Decode { .. } => decode += d,
                SegmentKind::Preempted { .. } => preempted += d,
            }
        }

        let mut attrs = vec![
            KeyValue::new(sc::GEN_AI_OPERATION_NAME, operation),
            KeyValue::new(sc::GEN_AI_PROVIDER_NAME, sc::PROVIDER_LLMSERVE),
        ];
        if !info.model.is_empty() {
            attrs.push(KeyValue::new(sc::GEN_AI_REQUEST_MODEL, info.model.clone()));
            attrs.push(KeyValue::new(sc::GEN_AI_RESPONSE_MODEL, info.model.clone()));
        }
        if info.max_tokens != 0 {
            attrs.push(KeyValue::new(
                sc::GEN_AI_REQUEST_MAX_TOKENS,
                i64::from(info.max_tokens),
            ));
        }
        if info.temperature.is_finite() {
            attrs.push(KeyValue::new(
                sc::GEN_AI_REQUEST_TEMPERATURE,
                f64::from(info.temperature),
            ));
        }
        if info.top_p.is_finite() && info.top_p > 0.0 {
            attrs.push(KeyValue::new(sc::GEN_AI_REQUEST_TOP_P, f64::from(info.top_p)));
        }
        let finish = info.finish_reason.filter(|r| *r != FinishReason::None);
        if let Some(r) = finish {
            attrs.push(KeyValue::new(
                sc::GEN_AI_RESPONSE_FINISH_REASONS,
                Value::Array(Array::String(vec![StringValue::from(r.name())])),
            ));
        }
        attrs.push(KeyValue::new(
            sc::GEN_AI_USAGE_INPUT_TOKENS,
            i64::from(info.prompt_tokens),
        ));
        attrs.push(KeyValue::new(
            sc::GEN_AI_USAGE_OUTPUT_TOKENS,
            i64::from(info.output_tokens),
        ));
        if let (Some(ttft), false) = (tl.ttft_ns(), partial) {
            attrs.push(KeyValue::new(sc::GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK, secs(ttft)));
        }
        if let Some(t) = &st.prompt_text {
            let m = serde_json::json!([{"role": "user", "parts": [{"type": "text", "content": t}]}]);
            attrs.push(KeyValue::new(sc::GEN_AI_INPUT_MESSAGES, m.to_string()));
        }
        if let Some(t) = &st.completion_text {
            let mut m = serde_json::json!({"role": "assistant", "parts": [{"type": "text", "content": t}]});
            if let Some(r) = finish {
                m["finish_reason"] = serde_json::Value::from(r.name());
            }
            attrs.push(KeyValue::new(
                sc::GEN_AI_OUTPUT_MESSAGES,
                serde_json::json!([m]).to_string(),
            ));
        }
        if st.content_truncated {
            attrs.push(KeyValue::new(sc::LLMPROF_CONTENT_TRUNCATED, true));
        }
        if !info.x_request_id.is_empty() {
            attrs.push(KeyValue::new(
                sc::HTTP_REQUEST_HEADER_X_REQUEST_ID,
                Value::Array(Array::String(vec![StringValue::from(info.x_request_id.clone())])),
            ));
        }
        attrs.extend([
            KeyValue::new(sc::LLMPROF_QUEUE_TIME, secs(queue)),
            KeyValue::new(sc::LLMPROF_PREFILL_TIME, secs(prefill)),
            KeyValue::new(sc::LLMPROF_DECODE_TIME, secs(decode)),
            KeyValue::new(sc::LLMPROF_PREEMPTED_TIME, secs(preempted)),
            KeyValue::new(
                sc::LLMPROF_PREEMPTIONS,
                i64::from(tl.preemptions_seen().max(info.num_preemptions)),
            ),
            KeyValue::new(sc::LLMPROF_STEPS, i64::from(tl.steps())),
            KeyValue::new(sc::LLMPROF_PREFILL_CHUNKS, i64::from(tl.prefill_chunks())),
        ]);
        if let Some(ns) = st.gpu_kernel_ns {
            attrs.push(KeyValue::new(sc::LLMPROF_GPU_KERNEL_TIME, ns / 1e9));
        }
        if partial {
            attrs.push(KeyValue::new(sc::LLMPROF_PARTIAL, true));
        }
        if unfinished {
            attrs.push(KeyValue::new(sc::LLMPROF_UNFINISHED, true));
        }
        let status = if finish == Some(FinishReason::Error) {
            attrs.push(KeyValue::new(sc::ERROR_TYPE, FinishReason::Error.name()));
            Status::Error {
                description: Cow::Borrowed("the engine ended the request with an error"),
            }
        } else {
            Status::Unset
        };
        attrs.push(KeyValue::new(
            sc::LLMPROF_REQUEST_ID,
            request_id_value(tl.req_id()),
        ));
        if let Some(o) = &self.overhead {
            if let Some(p) = o.est_overhead_pct {
                attrs.push(KeyValue::new(sc::LLMPROF_OVERHEAD_PCT, p));
            }
            attrs.push(KeyValue::new(sc::LLMPROF_COST_SYSCALL_NS, o.cost_syscall_ns));
            if let Some(p) = o.cost_probe_ns {
                attrs.push(KeyValue::new(sc::LLMPROF_COST_PROBE_NS, p));
            }
            if let Some(c) = o.cost_cuda_ns {
                attrs.push(KeyValue::new(sc::LLMPROF_COST_CUDA_NS, c));
            }
            attrs.push(KeyValue::new(sc::LLMPROF_DEGRADATION_LEVEL, i64::from(o.level)));
        }

        let request_ctx = SpanContext::new(st.trace_id, st.span_id, st.flags, false, TraceState::NONE);
        out.push(SpanData {
            span_context: request_ctx,
            parent_span_id: st.parent.unwrap_or(SpanId::INVALID),
            parent_span_is_remote: st.parent.is_some(),
            span_kind: SpanKind::Server,
            name: Cow::Owned(name),
            start_time: self.clock.to_system_time(start_ns),
            end_time: self.clock.to_system_time(end_ns.max(start_ns)),
            attributes: attrs,
            dropped_attributes_count: 0,
            events: span_events(std::mem::take(&mut st.events), st.dropped_events),
            links: SpanLinks::default(),
            status,
            instrumentation_scope: self.scope.clone(),
        });
        self.stats.spans_built += 1;

        // A request seen only at its finish has no timeline to show.
        let segments = st.timeline.segments();
        let children = if partial && segments.iter().all(|s| s.end == s.start) {
            &[][..]
        } else {
            segments
        };
        for seg in children {
            let (name, attrs) = segment_attrs(seg);
            out.push(SpanData {
                span_context: SpanContext::new(
                    st.trace_id,
                    self.ids.new_span_id(),
                    st.flags,
                    false,
                    TraceState::NONE,
                ),
                parent_span_id: st.span_id,
                parent_span_is_remote: false,
                span_kind: SpanKind::Internal,
                name: Cow::Borrowed(name),
                start_time: self.clock.to_system_time(seg.start),
                end_time: self.clock.to_system_time(seg.end),
                attributes: attrs,
                dropped_attributes_count: 0,
                events: SpanEvents::default(),
                links: SpanLinks::default(),
                status: Status::Unset,
                instrumentation_scope: self.scope.clone(),
            });
            self.stats.spans_built += 1;
        }
    }
}

/// The engine request id as an attribute value (an int when it fits, so backends can filter numerically).
fn request_id_value(id: u64) -> Value {
    match i64::try_from(id) {
        Ok(v) => Value::I64(v),
        Err(_) => Value::String(StringValue::from(id.to_string())),
    }
}

fn segment_attrs(seg: &Segment) -> (&'static str, Vec<KeyValue>) {
    match seg.kind {
        SegmentKind::Queue => (sc::SPAN_QUEUE, Vec::new()),
        SegmentKind::Prefill {
            index,
            recompute,
            step,
        } => {
            let mut a = vec![KeyValue::new(sc::LLMPROF_CHUNK_INDEX, i64::from(index))];
            if recompute {
                a.push(KeyValue::new(sc::LLMPROF_RECOMPUTE, true));
            }
            if let Some(s) = step {
                a.push(KeyValue::new(sc::LLMPROF_STEP_ID, s.step_id as i64));
                if let Some(k) = s.kind {
                    a.push(KeyValue::new(sc::LLMPROF_STEP_KIND, k.name()));
                }
                a.push(KeyValue::new(sc::LLMPROF_STEP_NUM_SEQS, i64::from(s.num_seqs)));
                if let Some(t) = s.request_tokens {
                    a.push(KeyValue::new(sc::LLMPROF_PREFILL_CHUNK_TOKENS, i64::from(t)));
                }
                a.push(KeyValue::new(
                    sc::LLMPROF_STEP_PREFILL_TOKENS,
                    i64::from(s.prefill_tokens),
                ));
                a.push(KeyValue::new(
                    sc::LLMPROF_STEP_DECODE_TOKENS,
                    i64::from(s.decode_tokens),
                ));
                a.push(KeyValue::new(sc::LLMPROF_STEP_HOST_DURATION, secs(s.host_ns())));
            }
            (sc::SPAN_PREFILL, a)
        }
        SegmentKind::Decode { steps } => (
            sc::SPAN_DECODE,
            vec![KeyValue::new(sc::LLMPROF_DECODE_STEPS, i64::from(steps))],
        ),
        SegmentKind::Preempted { index } => (
            sc::SPAN_PREEMPTED,
            vec![KeyValue::new(sc::LLMPROF_PREEMPTIONS, i64::from(index + 1))],
        ),
    }
}

/// `SpanEvents` is non-exhaustive: fill a default one.
fn span_events(events: Vec<opentelemetry::trace::Event>, dropped: u32) -> SpanEvents {
    let mut e = SpanEvents::default();
    e.events = events;
    e.dropped_count = dropped;
    e
}
