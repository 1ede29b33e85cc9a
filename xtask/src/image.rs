//! The image the DaemonSet names: `cargo xtask image` builds `deploy/image/Containerfile` `FROM
//! scratch` with buildah (Debian's package), tagged `ghcr.io/llmprof/llmprof:<crate version>`, and checks it
//! without running a container (which this sandbox cannot): the image is mounted and its `llmprof --version`
//! and `doctor --json` run by chroot, with the host's /proc and /sys bound in as Kubernetes gives them.
//! [`validate_manifests`] checks every manifest of deploy/kubernetes against Kubernetes' schemas offline (PyPI
//! `kubernetes-validate` in a venv of the project cache, `--strict`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};

use crate::release::{VERSION, ldd_paths, target_dir};
use crate::util::{apt_install, cache_dir, repo_root, run};

/// The image repository of deploy/kubernetes (its tag is the crate version).
pub const IMAGE_REPO: &str = "ghcr.io/llmprof/llmprof";
/// Pinned schema validator (its default schemas: Kubernetes 1.37).
const KUBERNETES_VALIDATE: &str = "kubernetes-validate==1.37.0";

/// `ghcr.io/llmprof/llmprof:VERSION`.
pub fn image_ref() -> String {
    format!("{IMAGE_REPO}:{VERSION}")
}

/// Runs `cmd` and returns its trimmed stdout.
fn stdout_of(cmd: &mut Command) -> Result<String> {
    let desc = format!("{cmd:?}");
    let out = cmd.output().with_context(|| format!("could not start {desc}"))?;
    if !out.status.success() {
        bail!(
            "{desc} failed with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// `cargo xtask image [--debug] [--check]`: the build context from the shipped binary (`cargo xtask dist`'s),
/// then `buildah build`.
pub fn build(debug: bool, check: bool) -> Result<()> {
    apt_install("buildah", &["buildah"])?;
    let dist = crate::release::dist(debug)?;
    build_from(&dist, check)
}

/// The image from what [`crate::release::dist`] shipped.
pub fn build_from(dist: &crate::release::Dist, check: bool) -> Result<()> {
    apt_install("buildah", &["buildah"])?;
    let t = Instant::now();
    let bin = &dist.bin;
    let ctx = target_dir().join("image");
    if ctx.exists() {
        std::fs::remove_dir_all(&ctx)?;
    }
    let rootfs = ctx.join("rootfs");
    for d in [
        "usr/bin",
        "usr/lib/llmprof",
        "proc",
        "sys",
        "tmp",
        "var/lib/llmprof/traces",
        "etc/llmprof",
    ] {
        std::fs::create_dir_all(rootfs.join(d))?;
    }
    run(Command::new("cp").arg(bin).arg(rootfs.join("usr/bin/llmprof")))?;
    // The helpers `llmprof attach` injects, where llmprof looks for them (`../lib/llmprof/`).
    let libs = bin
        .parent()
        .and_then(Path::parent)
        .context("the shipped binary's folder")?
        .join("lib/llmprof");
    for lib in ["libllmprof_cupti.so", "libllmprof_pyhooks.so"] {
        run(Command::new("cp")
            .arg(libs.join(lib))
            .arg(rootfs.join("usr/lib/llmprof").join(lib)))?;
    }
    for lib in ldd_paths(bin)? {
        let to = rootfs.join(lib.strip_prefix("/").unwrap_or(&lib));
        std::fs::create_dir_all(to.parent().context("library path")?)?;
        run(Command::new("cp").arg("-L").arg(&lib).arg(&to))?;
    }
    let ca = Path::new("/etc/ssl/certs/ca-certificates.crt");
    if ca.exists() {
        std::fs::create_dir_all(rootfs.join("etc/ssl/certs"))?;
        run(Command::new("cp")
            .arg("-L")
            .arg(ca)
            .arg(rootfs.join("etc/ssl/certs")))?;
    }
    run(Command::new("cp")
        .arg(repo_root().join("deploy/image/Containerfile"))
        .arg(ctx.join("Containerfile")))?;
    let image = image_ref();
    // A rebuild replaces the tag; the previous image would stay behind untagged.
    let _ = Command::new("buildah").args(["rmi", "-f", &image]).output();
    run(Command::new("buildah")
        .current_dir(&ctx)
        .args(["build", "--layers=false", "--quiet", "-f", "Containerfile"])
        .arg(format!("--build-arg=VERSION={VERSION}"))
        .args(["-t", &image, "."]))?;
    eprintln!("xtask: image {image} built in {:.1} s", t.elapsed().as_secs_f64());
    if check {
        check_image(&image)?;
        validate_manifests()?;
    }
    Ok(())
}

/// Mounts the image and runs its llmprof by chroot: `--version` must say the tag's version, `doctor --json`
/// must be ready to attach (exit 0) with the host's /proc and /sys bound in (a private mount namespace, so
/// nothing stays mounted).
pub fn check_image(image: &str) -> Result<()> {
    let ctr = stdout_of(Command::new("buildah").args(["from", "--pull-never", image]))?;
    let checked = (|| -> Result<()> {
        let root = PathBuf::from(stdout_of(Command::new("buildah").args(["mount", &ctr]))?);
        let version = stdout_of(
            Command::new("chroot")
                .arg(&root)
                .args(["/usr/bin/llmprof", "--version"]),
        )?;
        ensure!(
            version == format!("llmprof {VERSION}"),
            "the image's llmprof says {version:?}, its tag {image}"
        );
        let r = root.display();
        let doctor = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg(format!(
                "mount --rbind /proc {r}/proc && mount --rbind /sys {r}/sys && \
                 exec chroot {r} /usr/bin/llmprof doctor --json"
            ))
            .output()
            .context("running doctor in the image")?;
        let json = String::from_utf8_lossy(&doctor.stdout);
        ensure!(
            doctor.status.success() && json.trim_start().starts_with('['),
            "the image's llmprof doctor is not ready to attach ({}):\n{json}{}",
            doctor.status,
            String::from_utf8_lossy(&doctor.stderr)
        );
        eprintln!("xtask: image check ok: {image}: {version}, doctor --json ready (exit 0) by chroot");
        Ok(())
    })();
    let _ = Command::new("buildah").args(["umount", &ctr]).output();
    let _ = Command::new("buildah").args(["rm", &ctr]).output();
    checked
}

/// The image the DaemonSet runs (`image:` of its container).
fn daemonset_image(yaml: &str) -> Option<&str> {
    yaml.lines()
        .find_map(|l| l.trim().strip_prefix("image:"))
        .map(str::trim)
}

/// Every manifest of deploy/kubernetes against Kubernetes' schemas (`kubernetes-validate --strict`, installed
/// into a venv of the project cache on first use), and the DaemonSet's image is the one `cargo xtask image` tags.
pub fn validate_manifests() -> Result<()> {
    let dir = repo_root().join("deploy/kubernetes");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    ensure!(!files.is_empty(), "no manifest in {}", dir.display());
    for f in &files {
        let text = std::fs::read_to_string(f)?;
        if let Some(img) = daemonset_image(&text) {
            ensure!(
                img == image_ref(),
                "{} runs {img}, but `cargo xtask image` builds {} (the crate version)",
                f.display(),
                image_ref()
            );
        }
    }
    let venv = cache_dir().join("tools").join("kubernetes-validate");
    let tool = venv.join("bin").join("kubernetes-validate");
    if !tool.exists() {
        let venv_ok = |()| {
            Command::new(crate::util::python())
                .args(["-m", "venv"])
                .arg(&venv)
                .status()
                .is_ok_and(|s| s.success())
        };
        if !venv_ok(()) {
            // Debian's python3 has venv without ensurepip until python3-venv is installed.
            run(Command::new("apt-get").args(["install", "-y", "-qq", "python3-venv"]))?;
            ensure!(venv_ok(()), "python3 -m venv {} failed", venv.display());
        }
        run(Command::new(venv.join("bin/pip")).args(["install", "--quiet", KUBERNETES_VALIDATE]))?;
    }
    run(Command::new(&tool).args(["--strict", "--quiet"]).args(&files))?;
    eprintln!(
        "xtask: {} manifest file(s) of deploy/kubernetes valid against Kubernetes' schemas (--strict)",
        files.len()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_daemonset_runs_the_image_of_the_crate_version() {
        let yaml =
            std::fs::read_to_string(repo_root().join("deploy/kubernetes/llmprof-serve-daemonset.yaml"))
                .expect("the DaemonSet");
        assert_eq!(daemonset_image(&yaml), Some(image_ref().as_str()));
        assert_eq!(
            image_ref(),
            format!("ghcr.io/llmprof/llmprof:{}", env!("CARGO_PKG_VERSION"))
        );
    }
}
