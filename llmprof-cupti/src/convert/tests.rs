use std::ffi::CString;

use llmprof_abi::cupti::{GPU_CHUNK_MAGIC, GPU_CHUNK_MAX, GPU_NAME_MAX};

use super::pack::HDR;
use super::test_sink::Collect;
use super::*;

/// A `CUpti_ActivityKernel9` as CUDA 12 writes it (field offsets from cupti_activity.h).
fn kernel9(name: &CString) -> Vec<u8> {
    let mut r = vec![0u8; 200];
    let put32 = |r: &mut Vec<u8>, off: usize, v: u32| r[off..off + 4].copy_from_slice(&v.to_le_bytes());
    let put64 = |r: &mut Vec<u8>, off: usize, v: u64| r[off..off + 8].copy_from_slice(&v.to_le_bytes());
    put32(&mut r, 0, KIND_CONCURRENT_KERNEL);
    r[6..8].copy_from_slice(&40u16.to_le_bytes());
    put64(&mut r, 16, 1_000);
    put64(&mut r, 24, 3_500);
    put32(&mut r, 40, 1);
    put32(&mut r, 44, 7);
    put32(&mut r, 48, 13);
    for (i, v) in [128u32, 2, 1, 256, 1, 1].into_iter().enumerate() {
        put32(&mut r, 52 + 4 * i, v);
    }
    put32(&mut r, 76, 1024);
    put32(&mut r, 80, 4096);
    put32(&mut r, 92, 99);
    put64(&mut r, 104, name.as_ptr() as u64);
    put64(&mut r, 144, 0xabcd);
    put32(&mut r, 156, 5);
    r
}

/// An API record of CUPTI (driver or runtime) with callback id `cbid`.
fn api_rec(runtime: bool, cbid: u32) -> Vec<u8> {
    let mut a = vec![0u8; 40];
    let kind = if runtime { KIND_RUNTIME } else { KIND_DRIVER };
    a[0..4].copy_from_slice(&kind.to_le_bytes());
    a[4..8].copy_from_slice(&cbid.to_le_bytes());
    a
}

#[test]
fn api_functions_are_named_once_per_session_and_runtime_suffixes_go() {
    let (mut names, mut p, mut sink) = (Names::new(), Packer::new(), Collect::default());
    for (runtime, cbid) in [(false, 307), (false, 307), (true, 211), (false, 99), (false, 307)] {
        p.add(
            convert(&api_rec(runtime, cbid), 28).unwrap(),
            &mut names,
            &mut sink,
        );
    }
    p.flush(&mut sink);
    let c = &sink.0[0];
    let mut off = HDR;
    let mut got = Vec::new();
    while off < c.len() {
        let size = u32_at(c, off + 4) as usize;
        if u16_at(c, off) == GpuRecordKind::Name as u16 {
            let n = usize::from(u16_at(c, off + 12));
            got.push(format!(
                "name {} {}",
                u32_at(c, off + 8),
                String::from_utf8_lossy(&c[off + 16..off + 16 + n])
            ));
        } else {
            got.push(format!("call {} -> {}", u32_at(c, off + 12), u32_at(c, off + 44)));
        }
        off += size;
    }
    assert_eq!(
        got,
        [
            "name 1 cuLaunchKernel",
            "call 307 -> 1",
            "call 307 -> 1",
            "name 2 cudaLaunchKernel",
            "call 211 -> 2",
            "call 99 -> 0",
            "call 307 -> 1"
        ]
    );
    assert_eq!(
        api_display_name(false, b"cuMemcpyHtoDAsync_v2"),
        b"cuMemcpyHtoDAsync_v2"
    );
    assert_eq!(api_display_name(true, b"cudaMemcpy_v3020"), b"cudaMemcpy");
    assert_eq!(api_display_name(true, b"cudaFoo_v2"), b"cudaFoo_v2");
}

#[test]
fn kernel_record_fields_land_in_the_activity() {
    let name = CString::new("_Z4gemmPfS_").unwrap();
    let Converted::Activity { act, name: p } = convert(&kernel9(&name), 28).unwrap() else {
        panic!("not an activity")
    };
    assert_eq!(p, name.as_ptr() as usize);
    assert_eq!(act.kind, GpuActivityKind::Kernel as u32);
    assert_eq!((act.start_ns, act.end_ns), (1_000, 3_500));
    assert_eq!(
        (act.device, act.context, act.stream, act.correlation),
        (1, 7, 13, 99)
    );
    assert_eq!((act.grid, act.block), ([128, 2, 1], [256, 1, 1]));
    assert_eq!(
        (act.registers, act.shared_static, act.shared_dynamic),
        (40, 1024, 4096)
    );
    assert_eq!((act.graph_id, act.graph_node), (5, 0xabcd));
    // A CUPTI of CUDA 10 (API version 12) has no graph fields: not read.
    let Converted::Activity { act, .. } = convert(&kernel9(&name), 12).unwrap() else {
        panic!()
    };
    assert_eq!((act.graph_id, act.graph_node), (NO_GRAPH, 0));
    assert_eq!(convert(&kernel9(&name)[..120], 28), Err(Skip::Short));
}

#[test]
fn memcpy_memset_sync_and_api_records() {
    let mut m = vec![0u8; 88];
    m[0..4].copy_from_slice(&KIND_MEMCPY.to_le_bytes());
    m[4] = 2; // CUPTI_ACTIVITY_MEMCPY_KIND_DTOH
    m[8..16].copy_from_slice(&4096u64.to_le_bytes());
    m[16..24].copy_from_slice(&5u64.to_le_bytes());
    m[24..32].copy_from_slice(&9u64.to_le_bytes());
    m[40..44].copy_from_slice(&3u32.to_le_bytes());
    m[44..48].copy_from_slice(&42u32.to_le_bytes());
    m[64..72].copy_from_slice(&77u64.to_le_bytes());
    m[72..76].copy_from_slice(&8u32.to_le_bytes());
    let Converted::Activity { act, name } = convert(&m, 130001).unwrap() else {
        panic!()
    };
    assert_eq!(name, 0);
    assert_eq!(act.kind, GpuActivityKind::Memcpy as u32);
    assert_eq!((act.detail, act.bytes, act.start_ns, act.end_ns), (2, 4096, 5, 9));
    assert_eq!(
        (act.stream, act.correlation, act.graph_node, act.graph_id),
        (3, 42, 77, 8)
    );
    m[0..4].copy_from_slice(&KIND_MEMSET.to_le_bytes());
    let Converted::Activity { act, .. } = convert(&m, 130001).unwrap() else {
        panic!()
    };
    assert_eq!(
        (act.kind, act.detail, act.bytes),
        (GpuActivityKind::Memset as u32, 0, 4096)
    );

    let mut s = vec![0u8; 40];
    s[0..4].copy_from_slice(&KIND_SYNCHRONIZATION.to_le_bytes());
    s[4..8].copy_from_slice(&3u32.to_le_bytes()); // STREAM_SYNCHRONIZE
    s[8..16].copy_from_slice(&100u64.to_le_bytes());
    s[16..24].copy_from_slice(&200u64.to_le_bytes());
    s[32..36].copy_from_slice(&6u32.to_le_bytes());
    let Converted::Activity { act, .. } = convert(&s, 130001).unwrap() else {
        panic!()
    };
    assert_eq!(
        (act.kind, act.detail, act.start_ns, act.end_ns, act.stream),
        (3, 3, 100, 200, 6)
    );

    let mut a = vec![0u8; 40];
    a[0..4].copy_from_slice(&KIND_RUNTIME.to_le_bytes());
    a[4..8].copy_from_slice(&211u32.to_le_bytes());
    a[24..28].copy_from_slice(&1234u32.to_le_bytes());
    a[28..32].copy_from_slice(&1240u32.to_le_bytes());
    a[32..36].copy_from_slice(&42u32.to_le_bytes());
    let Converted::Api(c) = convert(&a, 130001).unwrap() else {
        panic!()
    };
    assert_eq!(
        (c.cbid, c.pid, c.tid, c.correlation, c.runtime),
        (211, 1234, 1240, 42, 1)
    );
    a[0..4].copy_from_slice(&99u32.to_le_bytes());
    assert_eq!(convert(&a, 130001), Err(Skip::OtherKind));
}

/// Walks a chunk: (kind, size) of each record, checking sizes and the header.
fn walk(chunk: &[u8]) -> Vec<(u16, u32)> {
    assert!(chunk.len() <= GPU_CHUNK_MAX);
    assert_eq!(u32_at(chunk, 0), GPU_CHUNK_MAGIC);
    assert_eq!(u32_at(chunk, 8) as usize, chunk.len());
    let mut out = Vec::new();
    let mut off = HDR;
    while off < chunk.len() {
        let (kind, size) = (u16_at(chunk, off), u32_at(chunk, off + 4));
        assert!(size % 8 == 0 && size > 0);
        out.push((kind, size));
        off += size as usize;
    }
    assert_eq!(off, chunk.len());
    assert_eq!(out.len() as u32, u32_at(chunk, 12));
    out
}

#[test]
fn names_go_once_before_their_first_activity_and_chunks_stay_under_the_max() {
    let a = CString::new("_Z1aPf").unwrap();
    let b = CString::new("b".repeat(GPU_NAME_MAX + 10)).unwrap();
    let mut names = Names::new();
    let mut p = Packer::new();
    let mut sink = Collect::default();
    for i in 0..1000 {
        let n = if i % 2 == 0 { &a } else { &b };
        p.add(convert(&kernel9(n), 28).unwrap(), &mut names, &mut sink);
    }
    p.add_dropped(3);
    p.flush(&mut sink);
    assert!(sink.0.len() > 1, "1000 kernels need several chunks");
    let kinds: Vec<(u16, u32)> = sink.0.iter().flat_map(|c| walk(c)).collect();
    let name_recs: Vec<_> = kinds
        .iter()
        .filter(|(k, _)| *k == GpuRecordKind::Name as u16)
        .collect();
    assert_eq!(name_recs.len(), 2);
    assert_eq!(kinds[0].0, GpuRecordKind::Name as u16, "the name comes first");
    assert_eq!(kinds.len(), 1002);
    assert_eq!(
        (p.records_out, p.names_out, p.chunks_out),
        (1000, 2, sink.0.len() as u64)
    );
    // The long name is cut and flagged.
    let first_b = sink.0.iter().flat_map(|c| {
        let mut v = Vec::new();
        let mut off = HDR;
        while off < c.len() {
            let size = u32_at(c, off + 4) as usize;
            if u16_at(c, off) == GpuRecordKind::Name as u16 {
                v.push((u32_at(c, off + 8), u16_at(c, off + 12), u16_at(c, off + 14)));
            }
            off += size;
        }
        v
    });
    let got: Vec<_> = first_b.collect();
    assert_eq!(got, vec![(1, 6, 0), (2, GPU_NAME_MAX as u16, 1)]);
    // Sequence numbers count up from 0; the drop is in the last header; the clock pair is in each.
    for (i, c) in sink.0.iter().enumerate() {
        assert_eq!(u64_at(c, 40), i as u64);
        assert_eq!((u64_at(c, 24), u64_at(c, 32)), (10, 20));
    }
    assert_eq!(u64_at(sink.0.last().unwrap(), 16), 3);
    // A new session forgets the names: sent again.
    names.clear();
    let mut sink2 = Collect::default();
    p.add(convert(&kernel9(&a), 28).unwrap(), &mut names, &mut sink2);
    p.flush(&mut sink2);
    assert_eq!(walk(&sink2.0[0])[0].0, GpuRecordKind::Name as u16);
    // Nothing to say: no chunk.
    p.flush(&mut sink2);
    assert_eq!(sink2.0.len(), 1);
}
