//! The benches that run inside one process (`kernels`, `decode`, `probes`, `trace`): cargo bench targets
//! (`harness = false`) of the crate they measure, each printing one `bench<TAB>NAME<TAB>UNIT<TAB>VALUE` line
//! per measurement and round; this module builds and runs one, passes its other output through, and prints
//! the median and range of each measurement over the rounds.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use super::stats::median_range;

/// Rounds when `--rounds` is not given.
const ROUNDS: usize = 5;

/// Options of the in-process benches.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Rounds of every measurement (medians and ranges over them).
    #[arg(long, value_name = "N", default_value_t = ROUNDS)]
    rounds: usize,
}

/// One in-process bench: the package and its bench target.
#[derive(Clone, Copy, Debug)]
pub(super) struct Target {
    pub package: &'static str,
    pub bench: &'static str,
}

/// `inference/benches/kernels.rs`.
pub(super) const KERNELS: Target = Target {
    package: "inference",
    bench: "kernels",
};
/// `inference/benches/decode.rs`.
pub(super) const DECODE: Target = Target {
    package: "inference",
    bench: "decode",
};
/// `inference/benches/probes.rs`.
pub(super) const PROBES: Target = Target {
    package: "inference",
    bench: "probes",
};
/// `tests/benches/trace.rs` (the e2e crate, where the event builders of the trace crate's tests are at hand).
pub(super) const TRACE: Target = Target {
    package: "e2e",
    bench: "trace",
};

/// Runs `target` for `o.rounds` rounds and prints its medians and ranges.
pub(super) fn run(target: Target, o: &Args) -> Result<()> {
    let rounds = o.rounds.max(1);
    let mut child = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(crate::util::repo_root())
        .args([
            "bench",
            "-p",
            target.package,
            "--bench",
            target.bench,
            "--",
            "--rounds",
        ])
        .arg(rounds.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .context("running cargo bench")?;
    let out = child.stdout.take().context("no stdout")?;
    // (name, unit, values), in the order the bench first printed them.
    let mut seen: Vec<(String, String, Vec<f64>)> = Vec::new();
    for line in BufReader::new(out).lines() {
        let line = line.context("reading the bench")?;
        let fields: Vec<&str> = line.split('\t').collect();
        let [tag, name, unit, value] = fields[..] else {
            println!("{line}");
            continue;
        };
        if tag != "bench" {
            println!("{line}");
            continue;
        }
        let value: f64 = value
            .parse()
            .with_context(|| format!("the bench printed {line:?}"))?;
        match seen.iter_mut().find(|(n, _, _)| n == name) {
            Some((_, _, v)) => v.push(value),
            None => seen.push((name.to_owned(), unit.to_owned(), vec![value])),
        }
    }
    let status = child.wait().context("waiting for cargo bench")?;
    if !status.success() {
        bail!(
            "cargo bench -p {} --bench {} failed ({status})",
            target.package,
            target.bench
        );
    }
    if seen.is_empty() {
        bail!(
            "cargo bench -p {} --bench {} measured nothing",
            target.package,
            target.bench
        );
    }
    println!("bench {}: median (range) over {rounds} rounds", target.bench);
    let width = seen.iter().map(|(n, _, _)| n.len()).max().unwrap_or(0);
    for (name, unit, mut v) in seen {
        let (m, lo, hi) = median_range(&mut v);
        println!("  {name:<width$}  {} {unit} ({}–{})", fmt(m), fmt(lo), fmt(hi));
    }
    Ok(())
}

/// Three significant digits, at least (no exponent).
fn fmt(v: f64) -> String {
    let digits = if v.abs() >= 100.0 {
        0
    } else if v.abs() >= 10.0 {
        1
    } else {
        2
    };
    format!("{v:.digits$}")
}

#[cfg(test)]
mod tests {
    use super::fmt;

    #[test]
    fn figures_keep_three_significant_digits() {
        assert_eq!(fmt(478_123.4), "478123");
        assert_eq!(fmt(14.26), "14.3");
        assert_eq!(fmt(2.345), "2.35");
    }
}
