//! GPU activity chunks (the `GpuChunkEvent` records of the handoff uprobe): the one reader of the
//! `llmprof_abi::cupti` layouts (what the injected CUPTI helper hands over) and the events they become.
//!
//! Owns the checks of a chunk (magic, version, lengths, record sizes), the per-process state the format needs
//! (kernel names table, next expected sequence number), the clock mapping CUPTI → CLOCK_BOOTTIME (each chunk
//! carries one pair of readings taken together: `boot = t - cupti_ns + boottime_ns`), kernel-name demangling,
//! and the loss counts ([`GpuStats`]) the trace summary shows. Hostile input (wrong magic, short or misaligned
//! records, unknown kinds, names over the cap) is skipped and counted, never a panic.
//!
//! Names are demangled with `cpp_demangle` (already built for blazesym's symbolization, so no build cost) without
//! parameters or return type: `void flash_fwd<...>(Params)` becomes `flash_fwd<...>`, which is what a timeline
//! row can show; the mangled name stays in the slice's `mangled` arg (a cut name, not demangleable, is kept
//! as it came).

use std::collections::HashMap;
use std::sync::Arc;

use llmprof_abi::GpuChunkEvent;
use llmprof_abi::cupti::{
    GPU_ABI_OLDEST, GPU_ABI_VERSION, GPU_CHUNK_MAGIC, GPU_NAME_MAX, GpuActivity, GpuActivityKind, GpuApiCall,
    GpuBusy, GpuChunkHeader, GpuRecordHeader, GpuRecordKind, GpuSummary,
};

use super::{Record, read};
use crate::event::cupti::{
    GpuApi, GpuBusyInterval, GpuStats, GpuWindow, GpuWork, NAMES_PER_PROCESS, SummaryRow,
};
use crate::event::{Event, EventBody};

impl Record for GpuChunkEvent {}

/// The chunk of a `GpuChunkEvent` record decoded into `out` (`None`: a short record).
pub(super) fn record(d: &mut GpuDecoder, b: &[u8]) -> Option<Vec<Event>> {
    let e: GpuChunkEvent = read(b)?;
    let n = (e.copied as usize).min(e.data.len());
    let mut out = Vec::new();
    d.chunk(e.hdr.pid, e.hdr.tid, e.hdr.ts_ns, &e.data[..n], &mut out);
    Some(out)
}

#[derive(Debug, Default)]
struct Process {
    names: HashMap<u32, (Arc<str>, Option<Arc<str>>)>,
    next_seq: Option<u64>,
}

/// Turns chunks into [`EventBody::GpuWork`] / [`EventBody::GpuApi`] events; keeps per-process names.
#[derive(Debug, Default)]
pub struct GpuDecoder {
    procs: HashMap<u32, Process>,
    stats: GpuStats,
}

/// Little-endian reads at fixed offsets of a slice known to be long enough.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u16(&self, at: usize) -> u16 {
        let mut b = [0; 2];
        b.copy_from_slice(&self.0[at..at + 2]);
        u16::from_le_bytes(b)
    }
    fn u32(&self, at: usize) -> u32 {
        let mut b = [0; 4];
        b.copy_from_slice(&self.0[at..at + 4]);
        u32::from_le_bytes(b)
    }
    fn u64(&self, at: usize) -> u64 {
        let mut b = [0; 8];
        b.copy_from_slice(&self.0[at..at + 8]);
        u64::from_le_bytes(b)
    }
}

const CHUNK_HDR: usize = std::mem::size_of::<GpuChunkHeader>();
const REC_HDR: usize = std::mem::size_of::<GpuRecordHeader>();
const ACTIVITY: usize = std::mem::size_of::<GpuActivity>();
const API_CALL: usize = std::mem::size_of::<GpuApiCall>();
const NAME_HDR: usize = std::mem::size_of::<llmprof_abi::cupti::GpuName>();
const SUMMARY: usize = std::mem::size_of::<GpuSummary>();
const BUSY: usize = std::mem::size_of::<GpuBusy>();

fn chunk_header(b: &Bytes) -> GpuChunkHeader {
    GpuChunkHeader {
        magic: b.u32(0),
        version: b.u32(4),
        len: b.u32(8),
        records: b.u32(12),
        dropped: b.u64(16),
        cupti_ns: b.u64(24),
        boottime_ns: b.u64(32),
        seq: b.u64(40),
    }
}

fn activity(b: &Bytes, hdr: GpuRecordHeader) -> GpuActivity {
    GpuActivity {
        hdr,
        kind: b.u32(8),
        device: b.u32(12),
        context: b.u32(16),
        stream: b.u32(20),
        correlation: b.u32(24),
        name_id: b.u32(28),
        start_ns: b.u64(32),
        end_ns: b.u64(40),
        graph_id: b.u32(48),
        detail: b.u32(52),
        graph_node: b.u64(56),
        bytes: b.u64(64),
        grid: [b.u32(72), b.u32(76), b.u32(80)],
        block: [b.u32(84), b.u32(88), b.u32(92)],
        registers: b.u32(96),
        shared_static: b.u32(100),
        shared_dynamic: b.u32(104),
        pad: b.u32(108),
    }
}

fn summary(b: &Bytes, hdr: GpuRecordHeader) -> GpuSummary {
    GpuSummary {
        hdr,
        window: b.u32(8),
        kind: b.u32(12),
        device: b.u32(16),
        name_id: b.u32(20),
        detail: b.u32(24),
        pad: b.u32(28),
        count: b.u64(32),
        total_ns: b.u64(40),
        min_ns: b.u64(48),
        max_ns: b.u64(56),
        first_ns: b.u64(64),
        last_ns: b.u64(72),
        bytes: b.u64(80),
    }
}

fn busy(b: &Bytes, hdr: GpuRecordHeader) -> GpuBusy {
    GpuBusy {
        hdr,
        device: b.u32(8),
        kernels: b.u32(12),
        start_ns: b.u64(16),
        end_ns: b.u64(24),
        busy_ns: b.u64(32),
        top_name_id: b.u32(40),
        top_count: b.u32(44),
        top_ns: b.u64(48),
    }
}

fn api_call(b: &Bytes, hdr: GpuRecordHeader) -> GpuApiCall {
    GpuApiCall {
        hdr,
        correlation: b.u32(8),
        cbid: b.u32(12),
        pid: b.u32(16),
        tid: b.u32(20),
        start_ns: b.u64(24),
        end_ns: b.u64(32),
        runtime: b.u32(40),
        name_id: b.u32(44),
    }
}

/// A kernel name for a timeline row: demangled without parameters and return type, or as it came when it is
/// not a valid mangled name (a C kernel, a cut name).
pub fn demangle(raw: &str) -> String {
    if !raw.starts_with("_Z") {
        return raw.to_owned();
    }
    let opts = cpp_demangle::DemangleOptions::new().no_params().no_return_type();
    cpp_demangle::Symbol::new(raw.as_bytes())
        .ok()
        .and_then(|s| s.demangle_with_options(&opts).ok())
        .unwrap_or_else(|| raw.to_owned())
}

impl GpuDecoder {
    /// What was decoded and lost so far.
    pub fn stats(&self) -> &GpuStats {
        &self.stats
    }

    /// A process left the session: its names go.
    pub fn forget(&mut self, pid: u32) {
        self.procs.remove(&pid);
    }

    /// Decodes one chunk `data` handed over at `ts_ns` (BOOTTIME) by thread `tid` of `pid`; appends its events
    /// (all at `ts_ns`, in record order) to `out`. A chunk that cannot be read is counted and adds nothing.
    pub fn chunk(&mut self, pid: u32, tid: u32, ts_ns: u64, data: &[u8], out: &mut Vec<Event>) {
        if data.len() < CHUNK_HDR {
            self.stats.bad_chunks += 1;
            return;
        }
        let h = chunk_header(&Bytes(data));
        let len = h.len as usize;
        if h.magic != GPU_CHUNK_MAGIC
            || !(GPU_ABI_OLDEST..=GPU_ABI_VERSION).contains(&h.version)
            || len < CHUNK_HDR
            || len > data.len()
        {
            self.stats.bad_chunks += 1;
            return;
        }
        self.stats.chunks += 1;
        self.stats.helper_dropped = self.stats.helper_dropped.saturating_add(h.dropped);
        let proc = self.procs.entry(pid).or_default();
        match proc.next_seq {
            Some(next) if h.seq > next => {
                self.stats.missed_chunks = self.stats.missed_chunks.saturating_add(h.seq - next)
            }
            _ => {}
        }
        proc.next_seq = Some(h.seq.saturating_add(1));
        let map = |t: u64| -> u64 {
            let v = i128::from(t) - i128::from(h.cupti_ns) + i128::from(h.boottime_ns);
            u64::try_from(v.max(0)).unwrap_or(u64::MAX)
        };
        // The run of summary rows of one window being read (one event when the run ends).
        let mut window: Option<GpuWindow> = None;
        let flush = |w: &mut Option<GpuWindow>, out: &mut Vec<Event>| {
            if let Some(w) = w.take() {
                out.push(Event {
                    ts_ns,
                    pid,
                    tid,
                    body: EventBody::GpuSummary(Box::new(w)),
                });
            }
        };
        let mut at = CHUNK_HDR;
        while at < len {
            if len - at < REC_HDR {
                self.stats.skipped_records += 1;
                break;
            }
            let b = Bytes(&data[at..len]);
            let rh = GpuRecordHeader {
                kind: b.u16(0),
                flags: b.u16(2),
                size: b.u32(4),
            };
            let size = rh.size as usize;
            if size < REC_HDR || !size.is_multiple_of(8) || size > len - at {
                // The next record's start is unknown: the rest of the chunk is lost.
                self.stats.skipped_records += 1;
                break;
            }
            let rec = Bytes(&data[at..at + size]);
            at += size;
            if rh.kind != GpuRecordKind::Summary as u16 {
                flush(&mut window, out);
            }
            let ev = |tid: u32, body: EventBody| Event {
                ts_ns,
                pid,
                tid,
                body,
            };
            match rh.kind {
                k if k == GpuRecordKind::Activity as u16 && size >= ACTIVITY => {
                    let mut a = activity(&rec, rh);
                    let Some(kind) = GpuActivityKind::from_raw(a.kind) else {
                        self.stats.skipped_records += 1;
                        continue;
                    };
                    a.start_ns = map(a.start_ns);
                    a.end_ns = map(a.end_ns).max(a.start_ns);
                    let (name, mangled) = match proc.names.get(&a.name_id) {
                        Some((n, m)) if kind == GpuActivityKind::Kernel => (Some(n.clone()), m.clone()),
                        _ => (None, None),
                    };
                    self.stats.activities += 1;
                    out.push(ev(
                        tid,
                        EventBody::GpuWork(Box::new(GpuWork {
                            kind,
                            rec: a,
                            name,
                            mangled,
                        })),
                    ));
                }
                k if k == GpuRecordKind::ApiCall as u16 && size >= API_CALL => {
                    let mut c = api_call(&rec, rh);
                    c.start_ns = map(c.start_ns);
                    c.end_ns = map(c.end_ns).max(c.start_ns);
                    self.stats.api_calls += 1;
                    let name = proc.names.get(&c.name_id).map(|(n, _)| n.clone());
                    out.push(ev(c.tid, EventBody::GpuApi(Box::new(GpuApi { rec: c, name }))));
                }
                k if k == GpuRecordKind::Name as u16 && size >= NAME_HDR => {
                    let id = rec.u32(8);
                    let n = usize::from(rec.u16(12));
                    let text = (n <= GPU_NAME_MAX && NAME_HDR + n <= size)
                        .then(|| std::str::from_utf8(&rec.0[NAME_HDR..NAME_HDR + n]).ok())
                        .flatten();
                    match text {
                        Some(t) if proc.names.len() < NAMES_PER_PROCESS || proc.names.contains_key(&id) => {
                            let d = demangle(t);
                            let mangled = (d != t).then(|| Arc::from(t));
                            proc.names.insert(id, (Arc::from(d), mangled));
                        }
                        _ => self.stats.skipped_names += 1,
                    }
                }
                k if k == GpuRecordKind::Summary as u16 && size >= SUMMARY => {
                    let mut r = summary(&rec, rh);
                    let Some(kind) = GpuActivityKind::from_raw(r.kind) else {
                        self.stats.skipped_records += 1;
                        continue;
                    };
                    r.first_ns = map(r.first_ns);
                    r.last_ns = map(r.last_ns).max(r.first_ns);
                    r.min_ns = r.min_ns.min(r.max_ns);
                    let name = (kind == GpuActivityKind::Kernel)
                        .then(|| proc.names.get(&r.name_id).map(|(n, _)| n.clone()))
                        .flatten();
                    self.stats.summaries += 1;
                    if window.as_ref().is_some_and(|w| w.window != r.window) {
                        flush(&mut window, out);
                    }
                    window
                        .get_or_insert_with(|| GpuWindow {
                            window: r.window,
                            rows: Vec::new(),
                        })
                        .rows
                        .push(SummaryRow { kind, rec: r, name });
                }
                k if k == GpuRecordKind::Busy as u16 && size >= BUSY => {
                    let mut b = busy(&rec, rh);
                    b.start_ns = map(b.start_ns);
                    b.end_ns = map(b.end_ns).max(b.start_ns);
                    b.busy_ns = b.busy_ns.min(b.end_ns - b.start_ns);
                    let top = proc.names.get(&b.top_name_id).map(|(n, _)| n.clone());
                    self.stats.busy += 1;
                    out.push(ev(
                        tid,
                        EventBody::GpuBusy(Box::new(GpuBusyInterval { rec: b, top })),
                    ));
                }
                _ => self.stats.skipped_records += 1,
            }
        }
        flush(&mut window, out);
    }
}

#[cfg(test)]
mod tests;
