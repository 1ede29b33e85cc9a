//! Counter tracks of what is not a probe family: the engine's `/metrics`, NVML GPU samples and llmprof's own
//! cost (the syscall rate is `syscalls.rs`'s).

use std::io::{self, Write};

use super::{Counter, MIB, NS_GLOBAL, NS_GPU, OVERHEAD_KEY, TraceSink, uuid};
use crate::event::{GpuSample, MetricsSample, OverheadSample};
use crate::names::{counter, track};
use crate::perfetto::schema::{CounterDescriptor, TrackDescriptor};

/// A counter track's descriptor.
fn counter_descriptor(id: u64, parent: Option<u64>, name: String, unit: &str) -> TrackDescriptor {
    TrackDescriptor {
        uuid: Some(id),
        parent_uuid: parent,
        name: Some(name),
        counter: Some(CounterDescriptor {
            unit_name: Some(unit.to_owned()),
            is_incremental: None,
        }),
        ..Default::default()
    }
}

impl<W: Write> TraceSink<W> {
    /// A scrape of the engine's `/metrics`: the values it had.
    pub(super) fn metrics(&mut self, pid: u32, ts: u64, m: &MetricsSample) -> io::Result<()> {
        for (c, v) in [
            (Counter::KvUsage, m.kv_cache_usage),
            (Counter::Running, m.running),
            (Counter::Waiting, m.waiting),
            (Counter::Preemptions, m.preemptions_total),
        ] {
            if let Some(v) = v {
                let t = self.counter_track(pid, c)?;
                self.counter(ts, t, v)?;
            }
        }
        Ok(())
    }

    /// NVML counter `metric` (index into [`counter::GPU`]) of GPU `g`, under its group track.
    fn gpu_track(&mut self, g: &GpuSample, metric: usize) -> io::Result<u64> {
        let idx = u64::from(g.index) << 8;
        let group = uuid(NS_GPU, idx | 0xff);
        if !self.tracks.contains(&group) {
            self.descriptor(TrackDescriptor {
                uuid: Some(group),
                name: Some(track::gpu_group(g.index, &g.name, &g.uuid)),
                ..Default::default()
            })?;
        }
        let id = uuid(NS_GPU, idx | metric as u64);
        if self.tracks.contains(&id) {
            return Ok(id);
        }
        let (name, unit) = counter::GPU[metric];
        let d = counter_descriptor(id, Some(group), track::gpu_counter(g.index, name), unit);
        self.descriptor(d)
    }

    /// One NVML sample of one GPU: its supported counters, and the traced process's memory on it.
    pub(super) fn gpu_sample(&mut self, pid: u32, ts: u64, g: &GpuSample) -> io::Result<()> {
        let values = [
            g.util_gpu_pct,
            g.util_mem_pct,
            g.mem_used_bytes.map(|b| b as f64 / MIB),
            g.power_w,
            g.sm_clock_mhz,
            g.temperature_c,
            g.pcie_tx_bytes_per_s.map(|b| b / 1e6),
            g.pcie_rx_bytes_per_s.map(|b| b / 1e6),
        ];
        for (metric, v) in values.into_iter().enumerate() {
            if let Some(v) = v {
                let t = self.gpu_track(g, metric)?;
                self.counter(ts, t, v)?;
            }
        }
        // The traced process's device memory: 0 when it has no context on this GPU (once it had one).
        let id = uuid(NS_GPU, (1 << 40) | (u64::from(pid) << 8) | u64::from(g.index));
        if g.process_mem_bytes.is_some() || self.tracks.contains(&id) {
            if !self.tracks.contains(&id) {
                let parent = self.process_track(pid)?;
                let name = track::gpu_process_memory(g.index, pid);
                let d = counter_descriptor(id, Some(parent), name, counter::GPU_PROCESS_MEMORY_UNIT);
                self.descriptor(d)?;
            }
            self.counter(ts, id, g.process_mem_bytes.unwrap_or(0) as f64 / MIB)?;
        }
        Ok(())
    }

    /// Value `v` on self-accounting counter `i` ([`counter::OVERHEAD`]).
    fn overhead_counter(&mut self, i: usize, ts: u64, v: f64) -> io::Result<()> {
        let id = uuid(NS_GLOBAL, OVERHEAD_KEY + i as u64);
        if !self.tracks.contains(&id) {
            let (name, unit) = counter::OVERHEAD[i];
            self.descriptor(counter_descriptor(id, None, name.to_owned(), unit))?;
        }
        self.counter(ts, id, v)
    }

    /// llmprof's self-accounting over the last tick.
    pub(super) fn overhead(&mut self, ts: u64, o: &OverheadSample) -> io::Result<()> {
        let secs = (o.interval_ns as f64 / 1e9).max(1e-9);
        if let Some(p) = o.est_overhead_pct {
            self.overhead_counter(0, ts, p)?;
        }
        self.overhead_counter(1, ts, o.est_added_ns / 1e6 / secs)?;
        self.overhead_counter(2, ts, o.llmprof_cpu_ns / o.interval_ns.max(1) as f64 * 100.0)?;
        self.overhead_counter(3, ts, o.llmprof_rss_bytes as f64 / (1u64 << 20) as f64)?;
        self.overhead_counter(4, ts, o.cost_syscall_ns)?;
        if let Some(c) = o.cost_probe_ns {
            self.overhead_counter(5, ts, c)?;
        }
        if let Some(c) = o.cost_cuda_ns {
            self.overhead_counter(7, ts, c)?;
        }
        if let Some(c) = o.cost_syscall_decoded_ns {
            self.overhead_counter(8, ts, c)?;
        }
        self.overhead_counter(6, ts, f64::from(o.level))
    }
}
