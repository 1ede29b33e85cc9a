//! The eBPF build chain and the committed eBPF object (owner: eBPF).

use anyhow::Result;

/// `cargo xtask setup-ebpf`.
pub fn setup(_args: &[String]) -> Result<()> {
    Ok(())
}

/// `cargo xtask build-ebpf [--check]`.
pub fn build(_args: &[String]) -> Result<()> {
    Ok(())
}
