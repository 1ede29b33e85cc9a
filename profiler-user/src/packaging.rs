//! What a package installs besides the binary, generated from the one command line ([`crate::cli`]): shell
//! completion scripts (`llmprof completions SHELL`, clap_complete) and man pages (`llmprof manpages DIR`, hidden,
//! clap_mangen). `cargo xtask dist` calls both, so the tarball and the .deb ship what `--help` says.
//!
//! Like [`crate::cli`], this is the binary's layer: no library module imports it.

use std::path::Path;

use clap::CommandFactory;

use crate::cli::Cli;
use crate::exit;

/// `llmprof completions SHELL`: the completion script on stdout.
pub fn completions(shell: clap_complete::Shell) -> i32 {
    let mut cmd = Cli::command();
    clap_complete::generate(shell, &mut cmd, "llmprof", &mut std::io::stdout());
    exit::OK
}

/// `llmprof manpages DIR`: `llmprof.1` and `llmprof-SUBCOMMAND.1` for every visible subcommand.
pub fn manpages(dir: &Path) -> i32 {
    match write_manpages(dir) {
        Ok(n) => {
            println!("{n} man pages written to {}", dir.display());
            exit::OK
        }
        Err(e) => {
            eprintln!("error: writing man pages to {}: {e}", dir.display());
            exit::OUTPUT
        }
    }
}

/// Writes the pages; returns how many.
pub fn write_manpages(dir: &Path) -> std::io::Result<usize> {
    std::fs::create_dir_all(dir)?;
    let mut cmd = Cli::command();
    cmd.build();
    // After build(), a subcommand's display name is `llmprof-attach` (the page's title and NAME) and its bin
    // name `llmprof attach` (SYNOPSIS).
    let pages = std::iter::once(cmd.clone()).chain(
        cmd.get_subcommands()
            .filter(|s| !s.is_hide_set() && s.get_name() != "help")
            .cloned(),
    );
    let mut n = 0;
    for c in pages {
        let name = c.get_display_name().unwrap_or(c.get_name()).to_owned();
        let mut buf = Vec::new();
        clap_mangen::Man::new(c)
            .source(format!("llmprof {}", env!("CARGO_PKG_VERSION")))
            .render(&mut buf)?;
        std::fs::write(dir.join(format!("{name}.1")), buf)?;
        n += 1;
    }
    Ok(n)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests {
    use super::*;

    #[test]
    fn every_visible_subcommand_has_a_man_page_with_its_options() {
        let dir = std::env::temp_dir().join(format!("llmprof-man-{}", std::process::id()));
        let n = write_manpages(&dir).unwrap();
        assert_eq!(
            n,
            1 + 6,
            "llmprof.1 and attach, open, doctor, report, serve, completions"
        );
        let serve = std::fs::read_to_string(dir.join("llmprof-serve.1")).unwrap();
        assert!(
            serve.contains(".TH llmprof-serve"),
            "{}",
            &serve[..200.min(serve.len())]
        );
        assert!(serve.contains("check\\-config"), "serve's options are listed");
        assert!(
            !dir.join("llmprof-manpages.1").exists(),
            "hidden subcommands get no page"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
