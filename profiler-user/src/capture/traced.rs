//! The `TRACED` map: which processes the probes record.
//!
//! Owns putting a process in the map and taking it out, and lifting llmprof's own refusal of itself
//! (`Knob::SelfTraced`) for as long as llmprof is in it (the calibration and the sampler's own measurement).
//! Never decides who is traced: that is the session's and the calibration's.

use aya::maps::HashMap;
use llmprof_abi::Knob;

use super::CaptureError;

/// Puts `pid` in (or takes it out of) the `TRACED` map. For llmprof itself this also lifts (or restores) the
/// kernel's refusal of its own process (`Knob::SelfTraced`): outside these windows nothing llmprof does is
/// traced, whatever is left in the maps.
pub(super) fn set_traced(ebpf: &mut aya::Ebpf, pid: u32, on: bool) -> Result<(), CaptureError> {
    if pid == std::process::id() && on {
        super::write_knob(ebpf, Knob::SelfTraced, 1)?;
    }
    let done = set_traced_entry(ebpf, pid, on);
    if pid == std::process::id() && !on {
        super::write_knob(ebpf, Knob::SelfTraced, 0)?;
    }
    done
}

fn set_traced_entry(ebpf: &mut aya::Ebpf, pid: u32, on: bool) -> Result<(), CaptureError> {
    let map = ebpf
        .map_mut("TRACED")
        .ok_or_else(|| CaptureError::MissingInObject("map TRACED".into()))?;
    let mut traced = HashMap::<_, u32, u8>::try_from(map).map_err(super::map_err("TRACED"))?;
    if on {
        traced.insert(pid, 1, 0).map_err(super::map_err("TRACED"))
    } else {
        traced.remove(&pid).map_err(super::map_err("TRACED"))
    }
}
