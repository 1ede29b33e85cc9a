//! The eBPF object and what every family shares in it: loading the embedded object, finding a program or a
//! map by name, the shared maps `KNOBS` (runtime knobs) and `COUNTERS` (per-probe hits, emitted, dropped),
//! the record ring `EVENTS`, attaching classic tracepoints, and tracefs.
//!
//! The object is `profiler-user/ebpf/llmprof-ebpf.o`, built from `profiler-ebpf/` by
//! `cargo xtask build-ebpf` and embedded here, so llmprof builds with stable Rust alone. Never holds a
//! family's state or decides what is attached: the family parts do, through these helpers.

use aya::maps::{Array, MapData, PerCpuArray, RingBuf};
use aya::programs::{TracePoint, UProbe};
use aya::{Ebpf, EbpfLoader};
use llmprof_abi::{
    CONFIG_GLOBAL, COUNTERS_MAP, Config, EVENTS_MAP, KNOBS_MAP, Knob, NUM_KNOBS, NUM_PROBES, ProbeCounters,
};

use super::error::CaptureError;
use super::tracefs;

/// The eBPF object, built by `cargo xtask build-ebpf` (checked in CI by `build-ebpf --check`).
static EBPF_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("CARGO_MANIFEST_DIR"), "/ebpf/llmprof-ebpf.o"));

/// Loads the embedded eBPF object: maps created (the ring at `ring_bytes`), nothing loaded into the kernel's
/// verifier yet.
pub(super) fn load_object(config: &Config, ring_bytes: usize) -> Result<Ebpf, CaptureError> {
    EbpfLoader::new()
        .override_global(CONFIG_GLOBAL, config, true)
        .map_max_entries(EVENTS_MAP, ring_size(ring_bytes))
        .load(EBPF_OBJECT)
        .map_err(CaptureError::Load)
}

/// Takes the record ring out of a loaded object.
pub(super) fn take_ring(ebpf: &mut Ebpf) -> Result<RingBuf<MapData>, CaptureError> {
    let ring_map = ebpf
        .take_map(EVENTS_MAP)
        .ok_or_else(|| CaptureError::MissingInObject(format!("map {EVENTS_MAP}")))?;
    RingBuf::try_from(ring_map).map_err(map_err(EVENTS_MAP))
}

fn ring_size(bytes: usize) -> u32 {
    // Page size on x86-64; the kernel wants a power-of-two multiple of it.
    const PAGE: usize = 4096;
    let n = bytes.clamp(PAGE, 1 << 30).next_power_of_two();
    u32::try_from(n).unwrap_or(1 << 30)
}

/// The program `name` of the object, as the program type `T`.
pub(super) fn program<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut T, CaptureError>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    let p = ebpf
        .program_mut(name)
        .ok_or_else(|| CaptureError::MissingInObject(format!("program {name}")))?;
    p.try_into().map_err(|source| CaptureError::Program {
        program: name.to_string(),
        source,
    })
}

/// Loads the uprobe program `name` into the kernel unless it is loaded already (by a family part or the
/// start-up calibration).
pub(super) fn load_uprobe(ebpf: &mut Ebpf, name: &str) -> Result<(), CaptureError> {
    let p: &mut UProbe = program(ebpf, name)?;
    if p.fd().is_ok() {
        return Ok(());
    }
    p.load().map_err(|source| CaptureError::Program {
        program: name.to_string(),
        source,
    })
}

/// The map `name` of the object as the aya map type `T` (`HashMap<_, K, V>`, `Array<_, V>`, ...).
pub(super) fn map_mut<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Result<T, CaptureError>
where
    T: TryFrom<&'a mut aya::maps::Map, Error = aya::maps::MapError>,
{
    let map = ebpf
        .map_mut(name)
        .ok_or_else(|| CaptureError::MissingInObject(format!("map {name}")))?;
    T::try_from(map).map_err(map_err(name))
}

/// Wraps aya's error about the map `map`.
pub(super) fn map_err(map: &str) -> impl FnOnce(aya::maps::MapError) -> CaptureError + '_ {
    move |source| CaptureError::Map {
        map: map.to_string(),
        source,
    }
}

/// Loads and attaches classic tracepoint programs, `(category, name, program)` each, in order.
pub(crate) fn attach_tracepoints(ebpf: &mut Ebpf, tps: &[(&str, &str, &str)]) -> Result<(), CaptureError> {
    for &(category, name, prog) in tps {
        let perr = |source| CaptureError::Program {
            program: prog.to_string(),
            source,
        };
        let t = std::time::Instant::now();
        let p: &mut TracePoint = program(ebpf, prog)?;
        p.load().map_err(perr)?;
        let loaded = t.elapsed();
        p.attach(category, name).map_err(perr)?;
        log::debug!(
            "capture: {prog}: verified in {loaded:?}, attached in {:?}",
            t.elapsed() - loaded
        );
    }
    Ok(())
}

/// Mounts tracefs at [`tracefs::TRACEFS`] unless its `events` directory is already there (needs root).
pub fn ensure_tracefs() -> Result<(), CaptureError> {
    tracefs::mount_if_missing().map_err(CaptureError::Tracefs)
}

/// Per-probe counters summed over CPUs, as the kernel holds them (no baseline subtracted).
pub(super) fn read_counters(ebpf: &Ebpf) -> [ProbeCounters; NUM_PROBES] {
    let mut out = [ProbeCounters::default(); NUM_PROBES];
    let Some(map) = ebpf.map(COUNTERS_MAP) else {
        return out;
    };
    let Ok(arr) = PerCpuArray::<_, ProbeCounters>::try_from(map) else {
        return out;
    };
    for (i, slot) in out.iter_mut().enumerate() {
        let Ok(vals) = arr.get(&(i as u32), 0) else {
            continue;
        };
        for v in vals.iter() {
            slot.hits += v.hits;
            slot.emitted += v.emitted;
            slot.dropped += v.dropped;
        }
    }
    out
}

/// Sets a runtime knob of the programs (takes effect on their next hit).
pub(super) fn write_knob(ebpf: &mut Ebpf, knob: Knob, value: u64) -> Result<(), CaptureError> {
    let mut knobs: Array<_, u64> = map_mut(ebpf, KNOBS_MAP)?;
    debug_assert!((knob as usize) < NUM_KNOBS);
    knobs.set(knob as u32, value, 0).map_err(map_err(KNOBS_MAP))
}
