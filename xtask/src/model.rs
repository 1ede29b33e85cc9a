//! Fetches the default model into the model cache (owner: engine).

use anyhow::Result;

/// `cargo xtask fetch-model`.
pub fn fetch(_args: &[String]) -> Result<()> {
    Ok(())
}
