//! Streaming Perfetto file writer and the interning state of its one packet sequence.
//!
//! Owns the file format: each [`TracePacket`] is appended as one `Trace.packet` field (tag byte, varint length,
//! message), which is exactly how a `Trace` message is encoded, so every prefix of the file that ends on a
//! packet boundary is a valid trace. Packets are buffered and flushed every [`FLUSH_INTERVAL`] (and at
//! [`PacketWriter::finish`]), so a crash loses at most that much. All packets share one trusted sequence; the
//! first one clears its incremental state, the others that use interned names say they need it.

use std::collections::HashMap;
use std::io::{self, Write};
use std::time::{Duration, Instant};

use prost::Message;

use super::schema::{
    DebugAnnotation, InternedData, InternedString, SEQ_INCREMENTAL_STATE_CLEARED,
    SEQ_NEEDS_INCREMENTAL_STATE, TRACE_PACKET_TAG, TracePacket, TrackEvent,
};

/// How often buffered packets reach the file: bounds what a crash loses (a UI-scale interval, not per event).
pub const FLUSH_INTERVAL: Duration = Duration::from_millis(500);

/// The sequence id of every packet we write (any non-zero value; one writer = one sequence).
pub const SEQUENCE_ID: u32 = 1;

/// Appends packets to a byte sink (a file in practice) and interns names.
pub struct PacketWriter<W: Write> {
    out: io::BufWriter<W>,
    event_names: HashMap<String, u64>,
    annotation_names: HashMap<String, u64>,
    first: bool,
    last_flush: Instant,
    bytes: u64,
    packets: u64,
    buf: Vec<u8>,
}

impl<W: Write> PacketWriter<W> {
    /// Wraps `out`; nothing is written until the first packet.
    pub fn new(out: W) -> Self {
        Self {
            out: io::BufWriter::with_capacity(1 << 20, out),
            event_names: HashMap::new(),
            annotation_names: HashMap::new(),
            first: true,
            last_flush: Instant::now(),
            bytes: 0,
            packets: 0,
            buf: Vec::with_capacity(1024),
        }
    }

    /// Bytes written so far (buffered included).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Packets written so far.
    pub fn packets(&self) -> u64 {
        self.packets
    }

    /// Writes one packet, stamping the sequence id and flags; flushes when [`FLUSH_INTERVAL`] has passed.
    pub fn write(&mut self, mut p: TracePacket) -> io::Result<()> {
        p.trusted_packet_sequence_id = Some(SEQUENCE_ID);
        if self.first {
            p.sequence_flags = Some(SEQ_INCREMENTAL_STATE_CLEARED | SEQ_NEEDS_INCREMENTAL_STATE);
            self.first = false;
        } else if p.track_event.is_some() || p.interned_data.is_some() || p.perf_sample.is_some() {
            p.sequence_flags = Some(SEQ_NEEDS_INCREMENTAL_STATE);
        }
        self.buf.clear();
        self.buf.push(TRACE_PACKET_TAG);
        p.encode_length_delimited(&mut self.buf)
            .map_err(|e| io::Error::other(format!("encoding a trace packet: {e}")))?;
        self.out.write_all(&self.buf)?;
        self.bytes += self.buf.len() as u64;
        self.packets += 1;
        if self.last_flush.elapsed() >= FLUSH_INTERVAL {
            self.flush()?;
        }
        Ok(())
    }

    /// Writes a track event at `ts`, interning its name and annotation names (new entries travel in the same
    /// packet's `interned_data`).
    pub fn write_event(
        &mut self,
        ts: u64,
        name: Option<&str>,
        mut ev: TrackEvent,
        args: Vec<Arg>,
    ) -> io::Result<()> {
        let mut interned = InternedData::default();
        if let Some(name) = name {
            ev.name_iid = Some(intern(&mut self.event_names, name, &mut interned.event_names));
        }
        ev.debug_annotations = args
            .into_iter()
            .map(|a| {
                let mut d = a.value.into_annotation();
                d.name_iid = Some(intern(
                    &mut self.annotation_names,
                    a.name,
                    &mut interned.debug_annotation_names,
                ));
                d
            })
            .collect();
        let has_interned = !interned.is_empty();
        self.write(TracePacket {
            timestamp: Some(ts),
            interned_data: has_interned.then_some(interned),
            track_event: Some(ev),
            ..Default::default()
        })
    }

    /// Pushes buffered packets to the sink.
    pub fn flush(&mut self) -> io::Result<()> {
        self.last_flush = Instant::now();
        self.out.flush()
    }

    /// Flushes and returns the sink.
    pub fn finish(mut self) -> io::Result<W> {
        self.out.flush()?;
        self.out.into_inner().map_err(|e| e.into_error())
    }
}

fn intern(table: &mut HashMap<String, u64>, name: &str, new: &mut Vec<InternedString>) -> u64 {
    if let Some(&iid) = table.get(name) {
        return iid;
    }
    // iids start at 1: 0 means "not set" to the trace processor.
    let iid = table.len() as u64 + 1;
    table.insert(name.to_owned(), iid);
    new.push(InternedString {
        iid: Some(iid),
        name: Some(name.to_owned()),
    });
    iid
}

/// A debug annotation (shown as an arg of the slice in Perfetto UI, `args` table in SQL as `debug.<name>`).
#[derive(Clone, Debug)]
pub struct Arg {
    /// Annotation name.
    pub name: &'static str,
    /// Value.
    pub value: ArgValue,
}

/// Value of an [`Arg`].
#[derive(Clone, Debug)]
pub enum ArgValue {
    /// Unsigned integer.
    U(u64),
    /// Signed integer.
    I(i64),
    /// Float.
    F(f64),
    /// Boolean.
    B(bool),
    /// String.
    S(String),
    /// Array of values (`debug.<name>[i]` in the trace processor).
    Array(Vec<ArgValue>),
}

impl ArgValue {
    fn into_annotation(self) -> DebugAnnotation {
        let mut d = DebugAnnotation::default();
        match self {
            Self::U(v) => d.uint_value = Some(v),
            Self::I(v) => d.int_value = Some(v),
            Self::F(v) => d.double_value = Some(v),
            Self::B(v) => d.bool_value = Some(v),
            Self::S(v) => d.string_value = Some(v),
            Self::Array(v) => d.array_values = v.into_iter().map(Self::into_annotation).collect(),
        }
        d
    }
}

/// Shorthand constructors for [`Arg`].
pub fn arg_u(name: &'static str, v: impl Into<u64>) -> Arg {
    Arg {
        name,
        value: ArgValue::U(v.into()),
    }
}
/// Signed integer [`Arg`].
pub fn arg_i(name: &'static str, v: i64) -> Arg {
    Arg {
        name,
        value: ArgValue::I(v),
    }
}
/// Float [`Arg`].
pub fn arg_f(name: &'static str, v: f64) -> Arg {
    Arg {
        name,
        value: ArgValue::F(v),
    }
}
/// Boolean [`Arg`].
pub fn arg_b(name: &'static str, v: bool) -> Arg {
    Arg {
        name,
        value: ArgValue::B(v),
    }
}
/// String [`Arg`].
pub fn arg_s(name: &'static str, v: impl Into<String>) -> Arg {
    Arg {
        name,
        value: ArgValue::S(v.into()),
    }
}

/// Array-of-unsigned [`Arg`].
pub fn arg_u_array(name: &'static str, v: impl IntoIterator<Item = u64>) -> Arg {
    Arg {
        name,
        value: ArgValue::Array(v.into_iter().map(ArgValue::U).collect()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests {
    use super::*;
    use crate::perfetto::schema::{TYPE_INSTANT, Trace};

    #[test]
    fn stream_decodes_as_a_trace_with_interned_names_once() {
        let mut w = PacketWriter::new(Vec::new());
        for ts in [10, 20] {
            let ev = TrackEvent {
                r#type: Some(TYPE_INSTANT),
                track_uuid: Some(7),
                ..Default::default()
            };
            let args = vec![arg_u("n", ts), arg_u_array("ids", [ts, ts + 1])];
            w.write_event(ts, Some("tick"), ev, args).unwrap();
        }
        let bytes = w.finish().unwrap();
        let trace = Trace::decode(bytes.as_slice()).unwrap();
        assert_eq!(trace.packet.len(), 2);
        let first = &trace.packet[0];
        assert_eq!(first.sequence_flags, Some(3));
        let names = &first.interned_data.as_ref().unwrap().event_names;
        assert_eq!(names[0].name.as_deref(), Some("tick"));
        // The second packet reuses the iid and carries no new interned data.
        assert!(trace.packet[1].interned_data.is_none());
        assert_eq!(
            trace.packet[1].track_event.as_ref().unwrap().name_iid,
            names[0].iid
        );
        assert_eq!(
            trace.packet[1].track_event.as_ref().unwrap().debug_annotations[0].uint_value,
            Some(20)
        );
        // An array arg: one annotation, its elements unnamed values.
        let ids = &trace.packet[1].track_event.as_ref().unwrap().debug_annotations[1];
        let values: Vec<_> = ids.array_values.iter().map(|v| v.uint_value).collect();
        assert_eq!(values, [Some(20), Some(21)]);
        assert!(ids.array_values.iter().all(|v| v.name_iid.is_none()));
    }
}
