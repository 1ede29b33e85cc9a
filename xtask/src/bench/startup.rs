//! `cargo xtask bench startup` (owner: capture): how long `llmprof attach` takes from its command to "probes
//! live" on an idle target, and how long the calibration beside the session takes to report its costs, over
//! several attaches (medians and ranges). The session stops itself after `--duration`.

use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use super::common::build_release;
use super::stats::median_range;

/// `cargo xtask bench startup` options.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Attaches to time.
    #[arg(long, default_value_t = 7)]
    pub rounds: usize,
    /// Time the debug build (target/debug, as the tests run it) instead of a release build.
    #[arg(long)]
    pub debug: bool,
}

/// `cargo xtask bench startup`.
pub(super) fn run(o: &Args) -> Result<()> {
    let llmprof = if o.debug {
        let root = crate::util::repo_root();
        crate::util::run(
            Command::new("cargo")
                .current_dir(&root)
                .args(["build", "-p", "llmprof"]),
        )?;
        std::env::var_os("CARGO_TARGET_DIR")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| root.join("target"))
            .join("debug/llmprof")
    } else {
        build_release(&["llmprof"])?.join("llmprof")
    };
    let mut target = Command::new("sleep")
        .arg("600")
        .spawn()
        .context("starting the idle target (sleep)")?;
    let trace = std::env::temp_dir().join(format!(
        "llmprof-bench-startup-{}.perfetto-trace",
        std::process::id()
    ));
    let (mut live, mut calib) = (Vec::new(), Vec::new());
    for round in 0..o.rounds {
        let _ = std::fs::remove_file(&trace);
        let out = Command::new(&llmprof)
            .args([
                "attach",
                "--pid",
                &target.id().to_string(),
                "-d",
                "1s",
                "-v",
                "-o",
            ])
            .arg(&trace)
            .stdin(Stdio::null())
            .output()
            .context("running llmprof attach")?;
        if !out.status.success() {
            let _ = target.kill();
            bail!("llmprof attach failed:\n{}", String::from_utf8_lossy(&out.stderr));
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let ms = number_after(&stderr, "probes live after ").context("no `probes live after` line")?;
        let cal = number_after(&stdout, "measured beside the session in ");
        eprintln!(
            "bench: round {round}: probes live after {ms:.1} ms, calibration {}",
            cal.map_or("not reported".to_owned(), |c| format!("{c:.0} ms"))
        );
        live.push(ms);
        calib.extend(cal);
    }
    let _ = target.kill();
    let _ = target.wait();
    let _ = std::fs::remove_file(&trace);
    let (m, lo, hi) = median_range(&mut live);
    println!(
        "probes live after {m:.1} ms [{lo:.1}-{hi:.1}] ({} attaches, {} build)",
        o.rounds,
        if o.debug { "debug" } else { "release" }
    );
    if !calib.is_empty() {
        let (m, lo, hi) = median_range(&mut calib);
        println!("calibration beside the session: {m:.0} ms [{lo:.0}-{hi:.0}]");
    }
    Ok(())
}

/// The number right after `prefix` in `text` (e.g. `probes live after 212.4 ms`).
fn number_after(text: &str, prefix: &str) -> Option<f64> {
    let rest = &text[text.find(prefix)? + prefix.len()..];
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_figures_llmprof_prints() {
        assert_eq!(
            number_after(
                "llmprof: probes live after 212.4 ms; writing x",
                "probes live after "
            ),
            Some(212.4)
        );
        assert_eq!(number_after("nothing", "probes live after "), None);
    }
}
