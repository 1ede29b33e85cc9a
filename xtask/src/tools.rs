//! Test tools: Perfetto's trace processor and friends (owner: profiler-user).

use anyhow::Result;

/// `cargo xtask setup-tools`.
pub fn setup(_args: &[String]) -> Result<()> {
    Ok(())
}
