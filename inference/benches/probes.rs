//! `cargo xtask bench probes`: what a probe call costs the engine while no llmprof is attached (the probe
//! functions start with a 5-byte NOP and return): ns per call of the step, request and range probes (the range
//! call includes its clock read and record), and of the BOOTTIME clock read alone. Against engine steps of
//! 15–250 ms these are unmeasurable; the bench keeps it so.

mod common;

use std::time::Instant;

use llmprof_abi::{RangeOp, RequestEventKind, RequestRecord, StepKind, StepRecord};

use common::{emit, rounds};

/// Calls per measurement.
const N: u64 = 10_000_000;

/// ns per call of `f`, `N` calls.
fn per_call(mut f: impl FnMut(u64)) -> f64 {
    let t = Instant::now();
    for i in 0..N {
        f(i);
    }
    t.elapsed().as_nanos() as f64 / N as f64
}

fn main() {
    let rounds = rounds();
    let step = StepRecord {
        num_seqs: 1,
        decode_tokens: 1,
        ..StepRecord::new(StepKind::Decode, 1, &[])
    };
    let rec = RequestRecord::new(RequestEventKind::Arrived, 1, 0);
    for _ in 0..rounds {
        let v = per_call(|i| {
            let mut r = step;
            r.step_id = i;
            llmprof_probes::step(std::hint::black_box(&r));
        });
        emit("step probe (600-byte record filled)", "ns/call", v);
        let v = per_call(|_| llmprof_probes::request(std::hint::black_box(&rec)));
        emit("request probe", "ns/call", v);
        let v = per_call(|i| inference::engine::emit_range(RangeOp::Push, "forward", i));
        emit("range probe (clock read and record included)", "ns/call", v);
        let v = per_call(|_| {
            std::hint::black_box(llmprof_probes::boottime_ns());
        });
        emit("BOOTTIME clock read", "ns/call", v);
    }
}
