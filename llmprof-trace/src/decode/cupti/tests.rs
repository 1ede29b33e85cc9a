//! Unit tests of the chunk reader, from chunks built byte for byte with the `llmprof_abi::cupti` layouts.

use super::*;
use crate::testing::cupti::{Chunk, api_call, kernel};

const PID: u32 = 100;
/// The chunk's clock pair: CUPTI 1_000_000 ↔ BOOTTIME 5_000_000_000.
const CUPTI: u64 = 1_000_000;
const BOOT: u64 = 5_000_000_000;

fn decode(d: &mut GpuDecoder, chunk: &[u8]) -> Vec<Event> {
    let mut out = Vec::new();
    d.chunk(PID, PID, 9_000_000_000, chunk, &mut out);
    out
}

fn work(e: &Event) -> &GpuWork {
    match &e.body {
        EventBody::GpuWork(w) => w,
        other => panic!("not GPU work: {other:?}"),
    }
}

#[test]
fn kernels_get_their_names_demangled_and_times_on_boottime() {
    let mut d = GpuDecoder::default();
    let mangled = "_Z10vector_addPKfS0_Pfi";
    let c = Chunk::new(0, CUPTI, BOOT)
        .name(1, mangled)
        .name(2, "plain_c_kernel")
        .name(3, "cuLaunchKernel")
        .api(GpuApiCall {
            name_id: 3,
            ..api_call(PID, 101, 7, 307, CUPTI + 100, CUPTI + 900)
        })
        .activity(kernel(7, 7, 1, CUPTI + 1_000, CUPTI + 3_000))
        .activity(kernel(7, 8, 2, CUPTI - 500, CUPTI + 500));
    let out = decode(&mut d, &c.build());
    assert_eq!(out.len(), 3, "one event per API call and activity: {out:?}");
    let EventBody::GpuApi(a) = &out[0].body else {
        panic!("first: the API call")
    };
    assert_eq!(
        (out[0].tid, a.rec.start_ns, a.rec.end_ns),
        (101, BOOT + 100, BOOT + 900)
    );
    assert_eq!(
        a.name.as_deref(),
        Some("cuLaunchKernel"),
        "the function's name, as the helper sent it"
    );
    let k = work(&out[1]);
    assert_eq!(k.name.as_deref(), Some("vector_add"));
    assert_eq!(k.mangled.as_deref(), Some(mangled));
    assert_eq!((k.rec.start_ns, k.rec.end_ns), (BOOT + 1_000, BOOT + 3_000));
    let k = work(&out[2]);
    assert_eq!(k.name.as_deref(), Some("plain_c_kernel"));
    assert_eq!(k.mangled, None, "a name that is not mangled is kept as it came");
    assert_eq!(k.rec.start_ns, BOOT - 500, "times before the clock pair map too");
    assert_eq!(
        out.iter().map(|e| e.ts_ns).collect::<Vec<_>>(),
        vec![9_000_000_000; 3]
    );
    assert_eq!(
        (
            d.stats().chunks,
            d.stats().activities,
            d.stats().api_calls,
            d.stats().lost()
        ),
        (1, 2, 1, 0)
    );
}

#[test]
fn names_persist_across_chunks_and_seq_gaps_and_helper_drops_are_counted() {
    let mut d = GpuDecoder::default();
    decode(&mut d, &Chunk::new(0, CUPTI, BOOT).name(4, "k").build());
    let mut c = Chunk::new(3, CUPTI, BOOT).activity(kernel(1, 0, 4, CUPTI, CUPTI + 1));
    c.hdr.dropped = 5;
    let out = decode(&mut d, &c.build());
    assert_eq!(work(&out[0]).name.as_deref(), Some("k"));
    assert_eq!((d.stats().missed_chunks, d.stats().helper_dropped), (2, 5));
    assert_eq!(
        d.stats().lost(),
        5,
        "missed chunks are shown, not added (the ring's drops count them)"
    );
    // Another process has its own names.
    let mut other = Vec::new();
    d.chunk(
        PID + 1,
        PID + 1,
        0,
        &Chunk::new(0, 0, 0).activity(kernel(1, 0, 4, 1, 2)).build(),
        &mut other,
    );
    assert_eq!(work(&other[0]).name, None);
}

#[test]
fn hostile_chunks_are_refused_and_counted_never_a_panic() {
    let mut d = GpuDecoder::default();
    let good = Chunk::new(0, CUPTI, BOOT)
        .name(1, "k")
        .activity(kernel(1, 1, 1, CUPTI, CUPTI + 5));
    // Wrong magic, wrong version, shorter than the header, shorter than it says.
    let mut bad = good.clone();
    bad.hdr.magic = 0x1234;
    assert!(decode(&mut d, &bad.build()).is_empty());
    let mut bad = good.clone();
    bad.hdr.version = 99;
    assert!(decode(&mut d, &bad.build()).is_empty());
    assert!(decode(&mut d, &good.build()[..20]).is_empty());
    let b = good.build();
    assert!(
        decode(&mut d, &b[..b.len() - 8]).is_empty(),
        "len says more than was copied"
    );
    assert_eq!(d.stats().bad_chunks, 4);
    assert_eq!(d.stats().chunks, 0);
    // A chunk of the oldest version (a helper an earlier llmprof left loaded in the target) is read.
    let mut old = good.clone();
    old.hdr.version = llmprof_abi::cupti::GPU_ABI_OLDEST;
    assert_eq!(decode(&mut d, &old.build()).len(), 1);
    assert_eq!((d.stats().bad_chunks, d.stats().chunks), (4, 1));
    // Every prefix and every single-byte corruption of a valid chunk: no panic.
    for n in 0..b.len() {
        decode(&mut d, &b[..n]);
        for v in [0u8, 0xff, 7] {
            let mut x = b.clone();
            x[n] = v;
            decode(&mut d, &x);
        }
    }
}

#[test]
fn bad_records_are_skipped_and_counted() {
    let mut d = GpuDecoder::default();
    let rec = |kind: u16, size: u32| {
        let mut v = kind.to_le_bytes().to_vec();
        v.extend_from_slice(&0u16.to_le_bytes());
        v.extend_from_slice(&size.to_le_bytes());
        v
    };
    // An unknown kind (skipped, the next record is read), then an unknown activity kind, then a short
    // activity (its size says 16), then a record whose size is not a multiple of 8 (the rest is lost).
    let mut unknown_activity = kernel(1, 0, 0, 0, 1);
    unknown_activity.kind = 42;
    let mut unknown = rec(9, 16);
    unknown.extend_from_slice(&[0; 8]);
    let mut short = rec(1, 16);
    short.extend_from_slice(&[0; 8]);
    let c = Chunk::new(0, 0, 0)
        .raw(&unknown)
        .activity(unknown_activity)
        .activity(kernel(1, 0, 0, 10, 20))
        .raw(&short)
        .raw(&rec(2, 12))
        .activity(kernel(1, 0, 0, 30, 40));
    let out = decode(&mut d, &c.build());
    assert_eq!(
        out.len(),
        1,
        "only the one valid kernel before the broken record: {out:?}"
    );
    assert_eq!(d.stats().skipped_records, 4);
    // A zero size and a size past the end stop the reading, never loop.
    decode(&mut d, &Chunk::new(1, 0, 0).raw(&rec(1, 0)).build());
    decode(&mut d, &Chunk::new(2, 0, 0).raw(&rec(1, 4096)).build());
    assert_eq!(d.stats().skipped_records, 6);
}

#[test]
fn names_over_the_cap_or_not_utf8_are_skipped() {
    let mut d = GpuDecoder::default();
    let long = "k".repeat(GPU_NAME_MAX + 8);
    let c = Chunk::new(0, 0, 0)
        .name(1, &long)
        .raw(&{
            let mut v = Chunk::new(0, 0, 0).name(2, "ab").build()[48..].to_vec();
            v[16] = 0xff;
            v
        })
        .activity(kernel(1, 0, 1, 1, 2))
        .activity(kernel(1, 0, 2, 3, 4));
    let out = decode(&mut d, &c.build());
    assert_eq!(out.len(), 2);
    assert!(out.iter().all(|e| work(e).name.is_none()));
    assert_eq!(d.stats().skipped_names, 2);
}

#[test]
fn demangling_keeps_what_it_cannot_read() {
    assert_eq!(demangle("_Z3fooi"), "foo");
    assert_eq!(demangle("_Zgarbage!"), "_Zgarbage!");
    assert_eq!(demangle("my_kernel"), "my_kernel");
}
