//! The report's opening lines: where the slow requests' time went, in a few sentences a person reads first.
//!
//! Owns the arithmetic of the verdict, from the [`Report`] alone: the tail at or above the p95 TTFT of the
//! successful requests, split into queue, prefill and time outside the engine (engine requests; the wire's
//! outermost view for the outside part), or into the wait in the server's socket and the server itself
//! (requests seen on the wire only, whose inside is not visible without engine probes); the p95 inter-token
//! time beside the engine steps that make the tokens; the function with the most on-CPU samples. Formatting
//! of numbers only; nothing is printed when there is nothing to say.

use std::collections::HashMap;

use super::{Report, RequestRow, Stats};

/// One verdict line each, in reading order (none: the trace has no request and no sample).
pub(super) fn lines(r: &Report) -> Vec<String> {
    let mut out = Vec::new();
    out.extend(ttft(r));
    out.extend(itl(r));
    out.extend(cpu(r));
    out
}

fn pct(part: f64, whole: f64) -> f64 {
    if whole > 0.0 { 100.0 * part / whole } else { 0.0 }
}

/// The requests at or above the p95 TTFT of the successful ones.
fn tail(r: &Report) -> (f64, Vec<&RequestRow>) {
    let Some(p95) = r.ttft().p95 else {
        return (0.0, Vec::new());
    };
    let rows = r
        .requests
        .iter()
        .filter(|q| !q.failed() && q.ttft_ms.is_some_and(|t| t >= p95))
        .collect();
    (p95, rows)
}

fn ttft(r: &Report) -> Option<String> {
    let (p95, rows) = tail(r);
    if rows.is_empty() {
        return None;
    }
    let n = rows.len();
    let engine: Vec<&&RequestRow> = rows.iter().filter(|q| q.queue_ms.is_some()).collect();
    if !engine.is_empty() {
        // The whole as the client saw it: the outermost wire view when there is one.
        let whole: f64 = engine
            .iter()
            .map(|q| q.wire_ttft_ms.or(q.ttft_ms).unwrap_or(0.0))
            .sum();
        let queue: f64 = engine.iter().filter_map(|q| q.queue_ms).sum();
        let prefill: f64 = engine.iter().filter_map(|q| q.prefill_ms).sum();
        let outside: f64 = engine
            .iter()
            .filter_map(|q| q.outside_engine_ttft_ms)
            .map(|v| v.max(0.0))
            .sum();
        let mut parts = vec![(pct(queue, whole), "queue"), (pct(prefill, whole), "prefill")];
        if outside > 0.0 {
            parts.push((pct(outside, whole), "outside the engine"));
        }
        parts.sort_by(|a, b| b.0.total_cmp(&a.0));
        let parts: Vec<String> = parts.iter().map(|(p, w)| format!("{w} {p:.0} %")).collect();
        return Some(format!(
            "p95 TTFT {p95:.1} ms ({n} slowest request{}): {}",
            if n == 1 { "" } else { "s" },
            parts.join(", ")
        ));
    }
    let whole: f64 = rows.iter().filter_map(|q| q.ttft_ms).sum();
    let wait: f64 = rows.iter().filter_map(|q| q.socket_wait_ms).sum();
    let waited = if wait > 0.0 {
        format!("waiting in the server's socket {:.0} %, ", pct(wait, whole))
    } else {
        String::new()
    };
    Some(format!(
        "p95 TTFT {p95:.1} ms ({n} slowest request{}, seen on the wire): {waited}inside the server {:.0} % \
         (queue and prefill are not visible without engine probes: see the CPU samples)",
        if n == 1 { "" } else { "s" },
        pct(whole - wait, whole)
    ))
}

fn itl(r: &Report) -> Option<String> {
    let itl = Stats::of(&r.itl_ms);
    let p95 = itl.p95?;
    let steps: Vec<(&str, &Stats)> = ["decode", "mixed"]
        .iter()
        .filter_map(|k| Some((*k, r.steps_by_kind.get(*k).filter(|s| s.count > 0)?)))
        .collect();
    if steps.is_empty() {
        return Some(format!(
            "p95 inter-token {p95:.1} ms (between streamed events on the wire: no engine steps in this trace)"
        ));
    }
    let step_p95 = steps.iter().filter_map(|(_, s)| s.p95).fold(0.0, f64::max);
    let share = pct(step_p95.min(p95), p95);
    let kinds: Vec<String> = steps
        .iter()
        .map(|(k, s)| format!("{k} p95 {:.1} ms", s.p95.unwrap_or(0.0)))
        .collect();
    Some(format!(
        "p95 inter-token {p95:.1} ms: the engine step that makes a token is {share:.0} % of it ({}); {}",
        kinds.join(", "),
        if share >= 80.0 {
            "decode compute dominates"
        } else {
            "the rest is time between steps (scheduling, other requests' prefill, the server around the engine)"
        }
    ))
}

fn cpu(r: &Report) -> Option<String> {
    let s = r.cpu_samples.as_ref()?;
    let mut by_fn: HashMap<&str, u64> = HashMap::new();
    for t in &s.threads {
        for f in &t.top_self {
            *by_fn.entry(f.function.as_str()).or_default() += f.samples;
        }
    }
    let (f, n) = by_fn
        .into_iter()
        .max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.cmp(a.0)))?;
    Some(format!(
        "CPU: {f} is {:.0} % of {} on-CPU samples (the most of any function)",
        pct(n as f64, s.samples as f64),
        s.samples
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine_row(ttft: f64, queue: f64, prefill: f64) -> RequestRow {
        RequestRow {
            ttft_ms: Some(ttft),
            queue_ms: Some(queue),
            prefill_ms: Some(prefill),
            finish_reason: "stop".into(),
            ..RequestRow::default()
        }
    }

    #[test]
    fn the_slow_tail_is_split_into_queue_prefill_and_outside() {
        let mut r = Report::default();
        // 19 successful requests: the nearest-rank p95 is the slowest one.
        for _ in 0..18 {
            r.requests.push(engine_row(10.0, 1.0, 9.0));
        }
        // The slowest one waited in the queue, and 20 ms more outside the engine.
        r.requests.push(RequestRow {
            wire_ttft_ms: Some(120.0),
            outside_engine_ttft_ms: Some(20.0),
            ..engine_row(100.0, 80.0, 20.0)
        });
        // A failed request is not part of the tail.
        r.requests.push(RequestRow {
            http_status: Some(500),
            ..engine_row(1000.0, 1000.0, 0.0)
        });
        let l = lines(&r);
        assert_eq!(
            l[0],
            "p95 TTFT 100.0 ms (1 slowest request): queue 67 %, prefill 17 %, outside the engine 17 %"
        );
    }

    #[test]
    fn wire_only_requests_say_what_cannot_be_seen_and_nothing_is_said_of_nothing() {
        assert!(lines(&Report::default()).is_empty());
        let mut r = Report::default();
        r.requests.push(RequestRow {
            wire: true,
            ttft_ms: Some(50.0),
            socket_wait_ms: Some(5.0),
            finish_reason: "stop".into(),
            ..RequestRow::default()
        });
        r.itl_ms = vec![10.0, 12.0];
        let l = lines(&r);
        assert!(l[0].contains("waiting in the server's socket 10 %"), "{l:?}");
        assert!(l[0].contains("inside the server 90 %"), "{l:?}");
        assert!(
            l[1].starts_with("p95 inter-token 12.0 ms (between streamed events"),
            "{l:?}"
        );
    }
}
