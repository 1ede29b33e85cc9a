//! Decoding an llmprof Perfetto trace packet by packet into tracks: slices (begin and end args merged),
//! instants, counter values and debug-annotation args, with the interned names resolved.
//!
//! Owns the wire side of `llmprof report`: the `Trace.packet` framing, the incremental-state rules, what a file
//! cut mid-packet leaves (the valid prefix, flagged truncated) and the check that makes a file that is not an
//! llmprof trace a [`ReportError`]. It computes no numbers: that is [`super::analyze`].

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use prost::Message;

use super::ReportError;
use crate::names::{counter, slice, track};
use crate::perfetto::schema::{
    DebugAnnotation, SEQ_INCREMENTAL_STATE_CLEARED, TRACE_PACKET_TAG, TYPE_COUNTER, TYPE_INSTANT,
    TYPE_SLICE_BEGIN, TYPE_SLICE_END, TracePacket,
};

/// A decoded debug annotation value.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Val {
    U(u64),
    I(i64),
    F(f64),
    B(bool),
    S(String),
    /// An array arg (`debug.<name>[i]`), e.g. a step's `req_ids`.
    A(Vec<Val>),
}

impl Val {
    /// The value of a decoded annotation; `None` when it has none (an empty array looks like that too).
    fn of(a: &DebugAnnotation) -> Option<Self> {
        Some(if let Some(v) = a.uint_value {
            Self::U(v)
        } else if let Some(v) = a.int_value {
            Self::I(v)
        } else if let Some(v) = a.double_value {
            Self::F(v)
        } else if let Some(v) = a.bool_value {
            Self::B(v)
        } else if let Some(v) = &a.string_value {
            Self::S(v.clone())
        } else if !a.array_values.is_empty() {
            Self::A(a.array_values.iter().filter_map(Self::of).collect())
        } else {
            return None;
        })
    }

    fn f64(&self) -> Option<f64> {
        match self {
            Self::U(v) => Some(*v as f64),
            Self::I(v) => Some(*v as f64),
            Self::F(v) => Some(*v),
            Self::B(_) | Self::S(_) | Self::A(_) => None,
        }
    }
    fn str(&self) -> Option<&str> {
        match self {
            Self::S(s) => Some(s),
            _ => None,
        }
    }
}

pub(super) type Args = BTreeMap<String, Val>;

pub(super) fn arg_f(a: &Args, k: &str) -> Option<f64> {
    a.get(k).and_then(Val::f64)
}
pub(super) fn arg_s<'a>(a: &'a Args, k: &str) -> Option<&'a str> {
    a.get(k).and_then(Val::str)
}
/// An array of unsigned integers (missing: empty; an element of another type: skipped).
pub(super) fn arg_u_array(a: &Args, k: &str) -> Vec<u64> {
    match a.get(k) {
        Some(Val::A(v)) => v
            .iter()
            .filter_map(|x| match x {
                Val::U(u) => Some(*u),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// An array of strings (missing: empty; an element of another type: an empty string, so arrays stay aligned).
pub(super) fn arg_s_array<'a>(a: &'a Args, k: &str) -> Vec<&'a str> {
    match a.get(k) {
        Some(Val::A(v)) => v.iter().map(|x| x.str().unwrap_or("")).collect(),
        _ => Vec::new(),
    }
}

/// A rebuilt slice (begin and end args merged, end wins).
#[derive(Clone, Debug)]
pub(super) struct Slice {
    /// Packet number of its begin: the order the sink wrote it in (the order of the events behind it).
    pub(super) seq: u64,
    pub(super) name: String,
    pub(super) ts: u64,
    pub(super) dur: u64,
    pub(super) args: Args,
}

/// A rebuilt instant.
#[derive(Clone, Debug)]
pub(super) struct Instant {
    /// Packet number: the order the sink wrote it in.
    pub(super) seq: u64,
    pub(super) name: String,
    pub(super) ts: u64,
    pub(super) args: Args,
}

/// One track: its descriptor's name and parent, and what happened on it.
#[derive(Debug, Default)]
pub(super) struct Track {
    pub(super) name: Option<String>,
    /// The process track a child track hangs under (steps and requests of one process share it).
    pub(super) parent: Option<u64>,
    /// The process of a process track.
    pub(super) pid: Option<u32>,
    pub(super) slices: Vec<Slice>,
    pub(super) instants: Vec<Instant>,
    pub(super) counter: Vec<f64>,
    /// Slices begun and not yet ended (a stack: Perfetto slices on one track nest).
    open: Vec<(u64, String, u64, Args)>,
}

/// The trace, decoded into tracks.
#[derive(Debug, Default)]
pub(super) struct Decoded {
    pub(super) tracks: BTreeMap<u64, Track>,
    /// CPU stack samples (`PerfSample` packets and their interned callstacks).
    pub(super) samples: super::stacks::SampleReader,
    pub(super) truncated: bool,
    /// The thread-state events and the traced threads ([`super::sched`]).
    pub(super) sched: super::sched::SchedLog,
}

fn decode_varint(b: &[u8], pos: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let x = *b.get(*pos)?;
        *pos += 1;
        v |= u64::from(x & 0x7f) << shift;
        if x & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// Decodes the trace `bytes` (`path` only names the file in errors).
pub(super) fn decode(path: &Path, bytes: &[u8]) -> Result<Decoded, ReportError> {
    if bytes.is_empty() {
        return Err(ReportError::Empty {
            path: path.to_owned(),
        });
    }
    let mut d = Decoded::default();
    let mut event_names: HashMap<u64, String> = HashMap::new();
    let mut arg_names: HashMap<u64, String> = HashMap::new();
    let mut pos = 0usize;
    let mut packets = 0u64;
    let mut last_ts = 0u64;
    // Thread states written compact need each CPU's previous switch to be read back.
    let mut compact = crate::perfetto::compact::Expander::default();
    while pos < bytes.len() {
        let start = pos;
        let packet = (|| {
            if bytes[pos] != TRACE_PACKET_TAG {
                return Err(format!(
                    "byte {start}: {:#04x} is not a Trace.packet field",
                    bytes[pos]
                ));
            }
            pos += 1;
            let len = decode_varint(bytes, &mut pos).ok_or("bad packet length")? as usize;
            let end = pos
                .checked_add(len)
                .filter(|&e| e <= bytes.len())
                .ok_or("packet runs past the end")?;
            let p = TracePacket::decode(&bytes[pos..end]).map_err(|e| e.to_string())?;
            pos = end;
            Ok(p)
        })();
        let p = match packet {
            Ok(p) => p,
            Err(reason) if packets == 0 => {
                return Err(ReportError::NotPerfetto {
                    path: path.to_owned(),
                    reason,
                });
            }
            Err(_) => {
                // What a crash leaves: the valid prefix is reported, the tail is flagged.
                d.truncated = true;
                break;
            }
        };
        packets += 1;
        if p.sequence_flags.unwrap_or(0) & SEQ_INCREMENTAL_STATE_CLEARED != 0 {
            event_names.clear();
            arg_names.clear();
        }
        if let Some(i) = &p.interned_data {
            for n in &i.event_names {
                event_names.insert(n.iid.unwrap_or(0), n.name.clone().unwrap_or_default());
            }
            for n in &i.debug_annotation_names {
                arg_names.insert(n.iid.unwrap_or(0), n.name.clone().unwrap_or_default());
            }
            for n in &i.kernel_symbols {
                d.sched
                    .blocked_labels
                    .insert(n.iid.unwrap_or(0), n.name.clone().unwrap_or_default());
            }
        }
        if let Some(td) = &p.track_descriptor {
            let t = d.tracks.entry(td.uuid.unwrap_or(0)).or_default();
            t.name = td.name.clone().or_else(|| {
                td.thread
                    .as_ref()
                    .and_then(|th| th.thread_name.clone())
                    .or_else(|| td.process.as_ref().and_then(|pr| pr.process_name.clone()))
            });
            t.parent = td.parent_uuid;
            t.pid = td.process.as_ref().and_then(|pr| pr.pid).map(|p| p as u32);
            if let Some(th) = &td.thread {
                let tid = th.tid.unwrap_or(0) as u32;
                d.sched
                    .threads
                    .insert(tid, (th.pid.unwrap_or(0) as u32, th.thread_name.clone()));
            }
        }
        if let Some(b) = p.ftrace_events {
            let cpu = b.cpu.unwrap_or(0);
            let events = compact.expand(cpu, b);
            d.sched.events.extend(events.into_iter().map(|e| (cpu, e)));
            continue;
        }
        d.samples.packet(&p);
        let Some(ev) = &p.track_event else { continue };
        let ts = p.timestamp.unwrap_or(last_ts);
        last_ts = last_ts.max(ts);
        let name = ev
            .name
            .clone()
            .or_else(|| ev.name_iid.and_then(|i| event_names.get(&i).cloned()))
            .unwrap_or_default();
        let args: Args = ev
            .debug_annotations
            .iter()
            .filter_map(|a| {
                let k = a
                    .name
                    .clone()
                    .or_else(|| a.name_iid.and_then(|i| arg_names.get(&i).cloned()))?;
                Some((k, Val::of(a)?))
            })
            .collect();
        let seq = packets;
        let t = d.tracks.entry(ev.track_uuid.unwrap_or(0)).or_default();
        match ev.r#type {
            Some(TYPE_SLICE_BEGIN) => t.open.push((seq, name, ts, args)),
            Some(TYPE_SLICE_END) => {
                if let Some((seq, n, b, mut a)) = t.open.pop() {
                    a.extend(args);
                    t.slices.push(Slice {
                        seq,
                        name: n,
                        ts: b,
                        dur: ts.saturating_sub(b),
                        args: a,
                    });
                }
            }
            Some(TYPE_INSTANT) => t.instants.push(Instant { seq, name, ts, args }),
            Some(TYPE_COUNTER) => {
                if let Some(v) = ev.double_counter_value.or(ev.counter_value.map(|v| v as f64)) {
                    t.counter.push(v);
                }
            }
            _ => {}
        }
    }
    // Slices a cut-short file leaves open end at the last timestamp seen.
    for t in d.tracks.values_mut() {
        while let Some((seq, n, b, a)) = t.open.pop() {
            t.slices.push(Slice {
                seq,
                name: n,
                ts: b,
                dur: last_ts.saturating_sub(b),
                args: a,
            });
        }
    }
    let ours = d.tracks.values().any(|t| {
        let n = t.name.as_deref().unwrap_or("");
        n == track::LLMPROF
            || n == track::STEPS
            || n.starts_with(track::DROPS_PREFIX)
            || n.starts_with(track::REQUEST_PREFIX)
            || n == track::CUDA
            || [
                counter::KV_USAGE,
                counter::WAITING,
                counter::RUNNING,
                counter::PREEMPTIONS,
            ]
            .iter()
            .any(|(c, _)| *c == n)
            || t.slices.iter().any(|s| {
                s.name.starts_with(slice::SYSCALL_PREFIX) || s.name.starts_with(slice::MODEL_FILE_PREFIX)
            })
            || t.instants.iter().any(|i| i.name.starts_with(slice::CONNECT))
    });
    if !ours {
        return Err(ReportError::NotLlmprof {
            path: path.to_owned(),
        });
    }
    Ok(d)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests {
    use std::path::Path;

    use prost::Message;

    use crate::perfetto::schema::{TRACE_PACKET_TAG, TracePacket};
    use crate::report::{ReportError, from_bytes};

    #[test]
    fn garbage_is_not_a_trace() {
        let p = Path::new("x");
        assert!(matches!(from_bytes(p, &[]), Err(ReportError::Empty { .. })));
        assert!(matches!(
            from_bytes(p, b"hello world"),
            Err(ReportError::NotPerfetto { .. })
        ));
        // A valid Trace with one empty packet: Perfetto, but not llmprof.
        let mut b = vec![TRACE_PACKET_TAG];
        TracePacket::default().encode_length_delimited(&mut b).unwrap();
        assert!(matches!(from_bytes(p, &b), Err(ReportError::NotLlmprof { .. })));
    }
}
