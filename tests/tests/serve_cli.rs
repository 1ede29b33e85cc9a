//! `llmprof serve`'s command line refuses unsafe or contradictory configurations with a clear message and exit
//! code 2 (usage), before loading anything; these checks need neither root nor a target.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use e2e::bin_path;

fn serve(args: &[&str]) -> (i32, String) {
    let dir = std::env::temp_dir().join(format!("llmprof-serve-cli-{}", std::process::id()));
    let out = Command::new(bin_path("llmprof"))
        .args(["serve", "--out-dir"])
        .arg(dir.join("traces"))
        .args(args)
        .output()
        .expect("run llmprof serve");
    let _ = std::fs::remove_dir_all(&dir);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_public_address_without_a_token_is_refused() {
    let (code, err) = serve(&["--listen", "0.0.0.0:0"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--token-file"), "the error says what to do: {err}");
}

#[test]
fn loopback_without_a_token_is_refused_with_what_to_do() {
    // Every local user can reach 127.0.0.1.
    let (code, err) = serve(&["--listen", "127.0.0.1:0"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--token-file") && err.contains("openssl rand"),
        "{err}"
    );
}

#[test]
fn a_flight_recorder_without_targets_is_refused() {
    let (code, err) = serve(&["--flight-recorder", "30s"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--watch"), "the error says what to do: {err}");
}

#[test]
fn an_empty_or_missing_token_file_is_refused() {
    let dir = std::env::temp_dir().join(format!("llmprof-serve-cli-token-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let empty = dir.join("empty");
    std::fs::write(&empty, "\n").expect("write");
    std::fs::set_permissions(&empty, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let (code, err) = serve(&["--token-file", &empty.display().to_string()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("empty"), "{err}");
    let (code, err) = serve(&["--token-file", &dir.join("missing").display().to_string()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("missing"), "the error names the file: {err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_token_file_others_can_read_is_refused_with_the_fix() {
    let dir = std::env::temp_dir().join(format!("llmprof-serve-cli-perm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let token = dir.join("token");
    std::fs::write(&token, "s3cret\n").expect("write");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let (code, err) = serve(&["--token-file", &token.display().to_string()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("mode 644"), "{err}");
    assert!(
        err.contains(&format!("chmod 600 {}", token.display())),
        "the error says what to do: {err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_targets_and_sizes_are_usage_errors() {
    let (code, err) = serve(&["--watch", "8000"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("port:N"), "{err}");
    let (code, err) = serve(&["--max-disk", "lots"]);
    assert_eq!(code, 2, "{err}");
}

#[test]
fn help_shows_examples_and_the_api() {
    let out = Command::new(bin_path("llmprof"))
        .args(["serve", "--help"])
        .output()
        .expect("run llmprof serve --help");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for want in [
        "sudo llmprof serve",
        "/v1/alerts",
        "llmprof_duration",
        "--flight-recorder",
        "deploy/",
    ] {
        assert!(help.contains(want), "help lacks {want:?}:\n{help}");
    }
}
