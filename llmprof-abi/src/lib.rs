//! The llmprof probe ABI: the one definition of every record and name that crosses a boundary, one module per
//! probe family.
//!
//! Two boundaries use these types:
//! 1. engine → eBPF ([`engine`]): the engine (`llmserve`) calls exported probe functions with a pointer to a
//!    `#[repr(C)]` record; a uprobe at the function's leading 5-byte NOP ([`PROBE_NOP5`]) copies it.
//! 2. eBPF → user space: the kernel programs write [`EventHeader`]-prefixed records into the ring buffer and keep
//!    aggregates in maps.
//!
//! A family has one name in every layer (this crate's module, the eBPF module, capture, decoding, the trace sink,
//! the report): [`syscalls`], [`files`], [`egress`], [`engine`], [`cuda`], [`cupti`], [`wire`], [`stacks`],
//! [`sched`], [`python`], [`proc`]. Each module owns its records, its constants and the names of its eBPF
//! programs and maps ([`Family`]), which user space finds them by. What every family shares (the record header
//! and kinds, the per-probe counters, the knobs, the load-time [`Config`], the shared maps) is [`shared`]; this
//! file holds the list of families ([`FAMILIES`]) and [`ABI_VERSION`].
//!
//! This crate is `no_std`, has no dependencies (aya only behind the `user` feature, for `Pod`) and must build with
//! the eBPF toolchain. Every layout is pinned by a compile-time size assertion beside it; any change to a layout of
//! the engine ABI bumps [`ABI_VERSION`]. The engine exports [`ABI_VERSION`] as the dynamic symbol
//! [`ABI_VERSION_SYMBOL`] and also stamps it into every record, so an llmprof built for another version refuses the
//! engine with a clear message instead of misreading it. All timestamps are CLOCK_BOOTTIME nanoseconds.
#![no_std]

pub mod cuda;
pub mod cupti;
pub mod egress;
pub mod engine;
pub mod files;
pub mod proc;
pub mod pyhooks;
pub mod python;
pub mod sched;
pub mod shared;
pub mod stacks;
pub mod syscalls;
pub mod wire;

// Every family's items at the crate root too, where the user-space crates import them from. `PROGRAMS`, `MAPS`
// and `FAMILY` have the same name in every family: reach them through the family.
#[expect(
    ambiguous_glob_reexports,
    reason = "PROGRAMS, MAPS and FAMILY are reached through their family"
)]
pub use {
    cuda::*, cupti::*, egress::*, engine::*, files::*, proc::*, python::*, sched::*, shared::*, stacks::*,
    syscalls::*, wire::*,
};

/// Version of every layout in this crate. Bump on any change.
pub const ABI_VERSION: u32 = 3;
/// Name of the exported `u32` static holding the engine's [`ABI_VERSION`].
pub const ABI_VERSION_SYMBOL: &str = "llmprof_abi_version";

/// The kernel names of one probe family: the eBPF programs and maps user space finds by name in the object.
#[derive(Clone, Copy, Debug)]
pub struct Family {
    /// The family's name, the same in every layer.
    pub name: &'static str,
    /// Its programs (all starting with `llmprof_`; the kernel keeps a program name's first 15 bytes).
    pub programs: &'static [&'static str],
    /// Its own maps (the shared ones are [`SHARED_MAPS`]).
    pub maps: &'static [&'static str],
}

/// Every family, in the order of this crate's documentation.
pub const FAMILIES: [Family; 11] = [
    syscalls::FAMILY,
    files::FAMILY,
    egress::FAMILY,
    engine::FAMILY,
    cuda::FAMILY,
    cupti::FAMILY,
    wire::FAMILY,
    stacks::FAMILY,
    sched::FAMILY,
    python::FAMILY,
    proc::FAMILY,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_name_is_owned_by_one_family_and_told_apart_by_the_kernel() {
        let mut names: [&str; 64] = [""; 64];
        let mut n = 0;
        let mut programs: [&[u8]; 32] = [b""; 32];
        let mut p = 0;
        for (i, f) in FAMILIES.iter().enumerate() {
            assert!(FAMILIES[..i].iter().all(|g| g.name != f.name), "{}", f.name);
            for name in f.programs.iter().chain(f.maps) {
                assert!(!names[..n].contains(name), "{name} is named twice");
                names[n] = name;
                n += 1;
            }
            for name in f.programs {
                // The kernel keeps 15 bytes of a program's name (BPF_OBJ_NAME_LEN with its NUL).
                let kept = &name.as_bytes()[..name.len().min(15)];
                assert!(
                    name.starts_with("llmprof_") && !programs[..p].contains(&kept),
                    "{name}"
                );
                programs[p] = kept;
                p += 1;
            }
        }
        assert!(SHARED_MAPS.iter().all(|m| !names[..n].contains(m)));
    }
}
