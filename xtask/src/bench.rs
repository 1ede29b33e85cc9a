//! Benchmarks (owner: engine serving).

use anyhow::Result;

/// `cargo xtask bench <what>`.
pub fn run(_args: &[String]) -> Result<()> {
    Ok(())
}
