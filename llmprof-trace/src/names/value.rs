//! The string values made of `key=value` words (the summary's per-probe counters, `top_syscalls`, `cuda_calls`,
//! `overhead_by_probe_ms`; a CUDA batch's `functions`): how the sink writes them and how a reader takes them apart.

/// Per-probe counter: records the probe's hits.
pub const HITS: &str = "hits";
/// Per-probe counter: records written to the ring buffer.
pub const EMITTED: &str = "emitted";
/// Per-probe counter: records lost.
pub const DROPPED: &str = "dropped";
/// `top_syscalls` item: the thread.
pub const TID: &str = "tid";
/// `top_syscalls` item: calls.
pub const COUNT: &str = "count";
/// `top_syscalls` item: total time, ms.
pub const TOTAL_MS: &str = "total_ms";
/// Separator of the `top_syscalls` items.
pub const ITEM_SEPARATOR: &str = "; ";
/// `cuda_calls`: calls seen.
pub const CALLS: &str = "calls";
/// `cuda_calls`: calls shown one by one.
pub const INDIVIDUAL: &str = "individual";
/// `cuda_calls`: batch slices.
pub const BATCHES: &str = "batches";
/// `cuda_calls`: calls inside batches.
pub const BATCHED: &str = "batched";
/// `cuda_calls`: calls batched over the individual-slice budget.
pub const OVER_BUDGET: &str = "over_budget";

/// A probe's summary value: `hits=H emitted=E dropped=D`.
pub fn probe_counters(hits: u64, emitted: u64, dropped: u64) -> String {
    format!("{HITS}={hits} {EMITTED}={emitted} {DROPPED}={dropped}")
}

/// A `top_syscalls` item: `<name> tid=T count=N total_ms=M`.
pub fn top_syscall(name: &str, tid: u32, count: u64, total_ms: f64) -> String {
    format!("{name} {TID}={tid} {COUNT}={count} {TOTAL_MS}={total_ms:.3}")
}

/// The summary's `cuda_calls`: `calls=N individual=I batches=B batched=C over_budget=O`.
pub fn cuda_calls(calls: u64, individual: u64, batches: u64, batched: u64, over_budget: u64) -> String {
    format!(
        "{CALLS}={calls} {INDIVIDUAL}={individual} {BATCHES}={batches} {BATCHED}={batched} \
         {OVER_BUDGET}={over_budget}"
    )
}

/// One function of a CUDA batch's `functions`: `<function>=N (M ms)`.
pub fn cuda_function(function: &str, calls: u64, ms: f64) -> String {
    format!("{function}={calls} ({ms:.3} ms)")
}

/// The value of the `key=value` word of `s` (`None`: no such word, or it does not parse).
pub fn field<T: std::str::FromStr>(s: &str, key: &str) -> Option<T> {
    s.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
}

/// Every `key=value` word of `s`, in order (`overhead_by_probe_ms`, `events`).
pub fn pairs<T: std::str::FromStr>(s: &str) -> impl Iterator<Item = (&str, T)> {
    s.split_whitespace().filter_map(|w| {
        let (k, v) = w.split_once('=')?;
        Some((k, v.parse().ok()?))
    })
}

/// A CUDA batch's `functions` taken apart: `(function, calls, ms)`.
pub fn cuda_functions(s: &str) -> Vec<(String, u64, f64)> {
    let mut out: Vec<(String, u64, f64)> = Vec::new();
    for w in s.split_whitespace() {
        if let Some((name, n)) = w.split_once('=') {
            out.push((name.to_owned(), n.parse().unwrap_or(0), 0.0));
        } else if let Some(v) = w.strip_prefix('(').and_then(|v| v.parse::<f64>().ok())
            && let Some(last) = out.last_mut()
        {
            last.2 = v;
        }
    }
    out
}
