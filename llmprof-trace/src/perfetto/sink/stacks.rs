//! CPU stack samples as Perfetto's own callstack samples: interned mappings, function names, frames and
//! callstacks (`InternedData` fields 17, 18, 5, 19, 6, 7) and one `PerfSample` packet per sample (cpu, pid,
//! tid, callstack iid) on the writer's one sequence. The trace processor fills `stack_profile_mapping`,
//! `stack_profile_frame`, `stack_profile_callsite` and `perf_sample` from them; Perfetto UI shows the samples
//! on each thread and a flame graph for a selected range, and an engine step slice's samples are those of
//! its thread between its start and end (same BOOTTIME clock).
//!
//! Owns the interning tables (each mapping, name, frame and callstack is sent once, in the packet of the
//! first sample that uses it); sizes stay bounded by the number of distinct frames and stacks, not samples.

use std::collections::HashMap;
use std::io::{self, Write};
use std::sync::Arc;

use super::super::schema::{
    CPU_MODE_KERNEL, CPU_MODE_USER, Callstack, FRAME_KIND_INTERPRETED, FRAME_KIND_JIT, FRAME_KIND_KERNEL,
    FRAME_KIND_NATIVE, Frame as PFrame, InternedData, InternedString, Mapping, PerfSample, TracePacket,
};
use super::TraceSink;
use crate::event::Event;
use crate::event::stacks::{CpuSample, Frame, FrameKind};

/// Interning state of the callstack samples (iids start at 1: 0 means "not set" to the trace processor).
#[derive(Debug, Default)]
pub(super) struct Callstacks {
    /// Function names (`InternedData.function_names`); the trace processor keeps each interned table apart,
    /// so a string used both as a function name and as a path component is interned in both.
    strings: HashMap<Arc<str>, u64>,
    /// Components of mapping paths (`InternedData.mapping_paths`).
    path_parts: HashMap<Arc<str>, u64>,
    source_paths: HashMap<Arc<str>, u64>,
    mappings: HashMap<Arc<str>, u64>,
    frames: HashMap<Arc<Frame>, u64>,
    stacks: HashMap<Vec<u64>, u64>,
}

fn intern_str(table: &mut HashMap<Arc<str>, u64>, s: &Arc<str>, new: &mut Vec<InternedString>) -> u64 {
    if let Some(&iid) = table.get(s) {
        return iid;
    }
    let iid = table.len() as u64 + 1;
    table.insert(s.clone(), iid);
    new.push(InternedString {
        iid: Some(iid),
        name: Some(s.to_string()),
    });
    iid
}

fn frame_kind(k: FrameKind) -> i32 {
    match k {
        FrameKind::Kernel => FRAME_KIND_KERNEL,
        FrameKind::Native => FRAME_KIND_NATIVE,
        FrameKind::Interpreted => FRAME_KIND_INTERPRETED,
        FrameKind::Jit => FRAME_KIND_JIT,
    }
}

impl Callstacks {
    fn mapping(&mut self, module: &Arc<str>, new: &mut InternedData) -> u64 {
        if let Some(&iid) = self.mappings.get(module) {
            return iid;
        }
        // The trace processor joins the components with '/': "/usr/lib/libc.so.6" → [usr, lib, libc.so.6].
        let parts: Vec<Arc<str>> = module
            .split('/')
            .filter(|p| !p.is_empty())
            .map(Arc::from)
            .collect();
        let path_string_ids = parts
            .iter()
            .map(|p| intern_str(&mut self.path_parts, p, &mut new.mapping_paths))
            .collect();
        let iid = self.mappings.len() as u64 + 1;
        self.mappings.insert(module.clone(), iid);
        new.mappings.push(Mapping {
            iid: Some(iid),
            start: Some(0),
            end: Some(u64::MAX),
            path_string_ids,
        });
        iid
    }

    fn frame(&mut self, f: &Arc<Frame>, new: &mut InternedData) -> u64 {
        if let Some(&iid) = self.frames.get(f) {
            return iid;
        }
        let mapping_id = self.mapping(&f.module, new);
        let function_name_id = intern_str(&mut self.strings, &f.function, &mut new.function_names);
        let source_path_iid = f
            .file
            .as_ref()
            .map(|p| intern_str(&mut self.source_paths, p, &mut new.source_paths));
        let iid = self.frames.len() as u64 + 1;
        self.frames.insert(f.clone(), iid);
        new.frames.push(PFrame {
            iid: Some(iid),
            function_name_id: Some(function_name_id),
            mapping_id: Some(mapping_id),
            rel_pc: Some(f.rel_pc),
            source_path_iid,
            line_number: f.line,
            kind: Some(frame_kind(f.kind)),
        });
        iid
    }

    /// The callstack iid of `s` (outermost frame first, as `Callstack.frame_ids` wants), interning what is new
    /// into `new`.
    pub(super) fn callstack(&mut self, s: &CpuSample, new: &mut InternedData) -> u64 {
        let ids: Vec<u64> = s.frames.iter().rev().map(|f| self.frame(f, new)).collect();
        if let Some(&iid) = self.stacks.get(&ids) {
            return iid;
        }
        let iid = self.stacks.len() as u64 + 1;
        new.callstacks.push(Callstack {
            iid: Some(iid),
            frame_ids: ids.clone(),
        });
        self.stacks.insert(ids, iid);
        iid
    }

    /// Distinct callstacks written so far.
    pub(super) fn distinct(&self) -> usize {
        self.stacks.len()
    }
}

impl<W: Write> TraceSink<W> {
    /// One `PerfSample` packet on the sampled thread (its track is declared first, so it has its name).
    pub(super) fn cpu_sample(&mut self, ev: &Event, s: &CpuSample) -> io::Result<()> {
        self.thread_track(ev.pid, ev.tid)?;
        let mut new = InternedData::default();
        let callstack_iid = self.callstacks.callstack(s, &mut new);
        let kernel = s.leaf().is_some_and(|f| f.kind == FrameKind::Kernel);
        self.w.write(TracePacket {
            timestamp: Some(ev.ts_ns),
            interned_data: (!new.is_empty()).then_some(new),
            perf_sample: Some(PerfSample {
                cpu: Some(s.cpu),
                pid: Some(ev.pid),
                tid: Some(ev.tid),
                callstack_iid: Some(callstack_iid),
                cpu_mode: Some(if kernel { CPU_MODE_KERNEL } else { CPU_MODE_USER }),
            }),
            ..Default::default()
        })
    }

    /// Distinct callstacks interned so far (the trace's stack table size).
    pub fn distinct_callstacks(&self) -> usize {
        self.callstacks.distinct()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests {
    use prost::Message;

    use super::*;
    use crate::event::{EventBody, SessionStats};
    use crate::perfetto::schema::Trace;
    use crate::testing::event;

    fn sample(names: &[&str]) -> EventBody {
        let frames = names
            .iter()
            .map(|n| {
                let kind = if n.starts_with("k_") {
                    FrameKind::Kernel
                } else {
                    FrameKind::Native
                };
                Arc::new(Frame::named(
                    n,
                    if kind == FrameKind::Kernel {
                        "[kernel]"
                    } else {
                        "/bin/app"
                    },
                    kind,
                ))
            })
            .collect();
        EventBody::CpuSample(Box::new(CpuSample {
            cpu: 1,
            frames,
            truncated: false,
        }))
    }

    #[test]
    fn a_function_named_like_a_path_component_is_interned_as_a_function_name_too() {
        // An unsymbolized frame is named after its module: "app" is a path component of "/bin/app" first.
        let mut sink = TraceSink::new(Vec::new(), &[], None).unwrap();
        sink.push(&event(7, 8, 10, sample(&["app", "bin"]))).unwrap();
        let bytes = sink.finish(&SessionStats::default(), None).unwrap();
        let trace = Trace::decode(bytes.as_slice()).unwrap();
        let d = trace
            .packet
            .iter()
            .find(|p| p.perf_sample.is_some())
            .and_then(|p| p.interned_data.as_ref())
            .unwrap();
        let functions: HashMap<u64, &str> = d
            .function_names
            .iter()
            .map(|n| (n.iid.unwrap(), n.name.as_deref().unwrap()))
            .collect();
        // Every frame's function name id resolves in the function-name table itself.
        for f in &d.frames {
            assert!(
                functions.contains_key(&f.function_name_id.unwrap()),
                "{f:?} in {functions:?}"
            );
        }
        let mut names: Vec<&str> = functions.values().copied().collect();
        names.sort_unstable();
        assert_eq!(names, ["app", "bin"]);
        assert_eq!(d.mapping_paths.len(), 2, "bin, app");
    }

    #[test]
    fn samples_intern_each_frame_and_stack_once_outermost_first_and_read_back_per_thread() {
        let mut sink = TraceSink::new(Vec::new(), &[], None).unwrap();
        // Innermost first, as the symbolizer gives them.
        sink.push(&event(7, 8, 10, sample(&["c", "b", "a", "main"])))
            .unwrap();
        sink.push(&event(7, 8, 20, sample(&["c", "b", "a", "main"])))
            .unwrap();
        sink.push(&event(7, 9, 30, sample(&["k_read", "b", "a", "main"])))
            .unwrap();
        assert_eq!(sink.distinct_callstacks(), 2);
        let bytes = sink.finish(&SessionStats::default(), None).unwrap();
        let trace = Trace::decode(bytes.as_slice()).unwrap();
        let samples: Vec<_> = trace.packet.iter().filter(|p| p.perf_sample.is_some()).collect();
        assert_eq!(samples.len(), 3);
        let first = samples[0].interned_data.as_ref().unwrap();
        let names: HashMap<u64, String> = first
            .function_names
            .iter()
            .map(|n| (n.iid.unwrap(), n.name.clone().unwrap()))
            .collect();
        let frame_name: HashMap<u64, &str> = first
            .frames
            .iter()
            .map(|f| (f.iid.unwrap(), names[&f.function_name_id.unwrap()].as_str()))
            .collect();
        let stack: Vec<&str> = first.callstacks[0]
            .frame_ids
            .iter()
            .map(|f| frame_name[f])
            .collect();
        assert_eq!(
            stack,
            ["main", "a", "b", "c"],
            "Callstack.frame_ids: bottom (outermost) frame first"
        );
        // The repeated stack interns nothing; the third shares three frames and adds one frame, one stack.
        assert!(samples[1].interned_data.is_none());
        let third = samples[2].interned_data.as_ref().unwrap();
        assert_eq!((third.frames.len(), third.callstacks.len()), (1, 1));
        let s = samples[2].perf_sample.as_ref().unwrap();
        assert_eq!(
            (s.pid, s.tid, s.cpu, s.cpu_mode),
            (Some(7), Some(9), Some(1), Some(CPU_MODE_KERNEL))
        );
        assert_eq!(
            samples[0].perf_sample.as_ref().unwrap().cpu_mode,
            Some(CPU_MODE_USER)
        );

        // The report's section reads the same encoding back.
        let r = crate::report::from_bytes(std::path::Path::new("t"), &bytes).unwrap();
        let cs = r.cpu_samples.unwrap();
        assert_eq!(cs.samples, 3);
        let t8 = cs.threads.iter().find(|t| t.tids == [8]).unwrap();
        assert_eq!(
            (t8.top_self[0].function.as_str(), t8.top_self[0].samples),
            ("c", 2)
        );
        let t9 = cs.threads.iter().find(|t| t.tids == [9]).unwrap();
        assert_eq!(t9.top_self[0].function, "k_read");
        assert!(
            t9.top_total
                .iter()
                .any(|f| f.function == "main" && f.samples == 1)
        );
    }
}
