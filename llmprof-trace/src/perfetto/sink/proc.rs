//! Process trees on the timeline: each traced process is its own process track, named by its command line;
//! a process started by a traced one, a program executed, a process's end are instants on that track.
//!
//! Owns the process track's descriptor (name and command line, rewritten when a process executes a program)
//! and the [`slice::PROCESS_START`] / [`slice::PROCESS_EXEC`] / [`slice::PROCESS_EXIT`] instants. Names come in
//! with the events (capture reads /proc); this file never reads anything.

use std::io::{self, Write};

use super::{NS_PROCESS, TraceSink, uuid};
use crate::event::{Event, ProcessInfo};
use crate::names::{arg, slice};
use crate::perfetto::schema::{ProcessDescriptor, TracePacket, TrackDescriptor};
use crate::perfetto::writer::{arg_i, arg_s, arg_u};

/// How long a process started during the session may take to execute a program before the name it inherited
/// from its parent is taken as its own (a forked worker that never executes one). Python's `subprocess` takes
/// milliseconds from fork to exec, more on a loaded machine; the trace processor keeps the first name a process
/// gets, so naming it early names it wrongly for good.
pub(super) const NAME_AFTER_NS: u64 = 1_000_000_000;

impl<W: Write> TraceSink<W> {
    /// The descriptor of `pid`'s process track from what the sink knows of it (name: the command line).
    pub(super) fn process_descriptor(&self, pid: u32) -> TrackDescriptor {
        let (name, cmdline) = match self.processes.get(&pid) {
            Some(p) => (
                Some(p.display_name()),
                p.cmdline
                    .split(' ')
                    .filter(|s| !s.is_empty())
                    .map(String::from)
                    .collect(),
            ),
            None => (None, Vec::new()),
        };
        TrackDescriptor {
            uuid: Some(uuid(NS_PROCESS, u64::from(pid))),
            process: Some(ProcessDescriptor {
                pid: Some(pid as i32),
                cmdline,
                process_name: name,
            }),
            ..Default::default()
        }
    }

    /// Records what is now known of `pid` and (re)writes its track's descriptor. The trace processor keeps the
    /// first name a process gets, so a descriptor without a name is written first when the name may still
    /// change (`named` false: a process just started, which may execute a program at once); the named one
    /// follows at its exec or its first other event ([`TraceSink::name_process`]).
    fn update_process(&mut self, info: ProcessInfo, started: Option<u64>) -> io::Result<u64> {
        let pid = info.pid;
        self.processes.insert(pid, info);
        let mut d = self.process_descriptor(pid);
        if let Some(ts) = started {
            self.unnamed.insert(pid, ts);
            if let Some(p) = d.process.as_mut() {
                p.process_name = None;
                p.cmdline = Vec::new();
            }
        } else {
            self.unnamed.remove(&pid);
        }
        let id = d.uuid.unwrap_or(0);
        self.tracks.insert(id);
        self.w.write(TracePacket {
            track_descriptor: Some(d),
            ..Default::default()
        })?;
        Ok(id)
    }

    /// A traced process started `ev.pid`: its track, named after its command line, and an instant on it.
    pub(super) fn process_start(
        &mut self,
        ev: &Event,
        ppid: u32,
        name: &str,
        cmdline: &str,
    ) -> io::Result<()> {
        let info = ProcessInfo {
            pid: ev.pid,
            name: name.to_owned(),
            cmdline: cmdline.to_owned(),
            threads: Vec::new(),
            engine_probes: false,
        };
        let track = self.update_process(info, Some(ev.ts_ns))?;
        let args = vec![arg_u(arg::PPID, ppid), arg_s(arg::CMDLINE, cmdline)];
        self.instant(ev.ts_ns, track, slice::PROCESS_START, args, Vec::new())
    }

    /// `ev.pid` executed `filename`: its track is renamed after the new command line, and an instant.
    pub(super) fn process_exec(
        &mut self,
        ev: &Event,
        filename: &str,
        name: &str,
        cmdline: &str,
    ) -> io::Result<()> {
        let mut info = self.processes.get(&ev.pid).cloned().unwrap_or(ProcessInfo {
            pid: ev.pid,
            name: String::new(),
            cmdline: String::new(),
            threads: Vec::new(),
            engine_probes: false,
        });
        info.name = name.to_owned();
        info.cmdline = cmdline.to_owned();
        let track = self.update_process(info, None)?;
        let args = vec![arg_s(arg::FILENAME, filename), arg_s(arg::CMDLINE, cmdline)];
        self.instant(ev.ts_ns, track, slice::PROCESS_EXEC, args, Vec::new())
    }

    /// Names a process started during the session that has not executed a program (a forked worker) once it
    /// has lived [`NAME_AFTER_NS`] (`now` is the event being written; `None`: the end of the trace): from then
    /// on the name it inherited from its parent is its own.
    pub(super) fn name_process(&mut self, pid: u32, now: Option<u64>) -> io::Result<()> {
        if let Some(&start) = self.unnamed.get(&pid)
            && now.is_none_or(|t| t >= start.saturating_add(NAME_AFTER_NS))
            && let Some(info) = self.processes.get(&pid).cloned()
        {
            self.update_process(info, None)?;
        }
        Ok(())
    }

    /// Names every process still unnamed (the end of the trace).
    pub(super) fn name_all(&mut self) -> io::Result<()> {
        let pids: Vec<u32> = self.unnamed.keys().copied().collect();
        for pid in pids {
            self.name_process(pid, None)?;
        }
        Ok(())
    }

    /// `ev.pid` exited: an instant on its track; for a process traced from the start, also the
    /// `target exited` marker on the llmprof track.
    pub(super) fn process_end(&mut self, ev: &Event, exit_code: i64) -> io::Result<()> {
        let track = self.process_track(ev.pid)?;
        let args = vec![arg_i(arg::EXIT_CODE, exit_code)];
        self.instant(ev.ts_ns, track, slice::PROCESS_EXIT, args, Vec::new())?;
        self.gpu.links.forget(ev.pid);
        if self.targets.contains(&ev.pid) {
            self.process_exit(ev, exit_code)?;
        }
        Ok(())
    }
}
