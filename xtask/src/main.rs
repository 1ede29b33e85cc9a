//! Project tasks: setup of everything the demo and the tests need on a fresh machine, the eBPF build, benches.
//!
//! `cargo xtask <task>`; each task lives in its own module. Every install step the project needs is here,
//! never done by hand.

mod bench;
mod bench_syscalls;
mod ebpf;
mod flows;
mod model;
mod otel_tools;
mod tools;
mod util;

use anyhow::{Result, bail};

const USAGE: &str = "usage: cargo xtask <task>

tasks:
  demo [SECS]      the main job: engine on the default model + load + llmprof attach -> a Perfetto trace
  test [ARGS]      every test, as CI runs them (setup, eBPF object check, build, cargo test --workspace)
  setup            install everything the demo and the tests need (model, eBPF chain, trace processor, ...)
  fetch-model      fetch the default GGUF (SmolLM2-135M-Instruct Q4_1) into the model cache
  setup-ebpf       install the eBPF build chain (compiler able to build core for bpfel, bpf-linker)
  build-ebpf       rebuild the committed eBPF object from profiler-ebpf/ (--check: fail if it differs)
  setup-tools      install test tools (Perfetto trace processor, Prometheus, Alertmanager, OpenAI client, rotel)
  setup-otel-tools install the rotel OTLP collector only
  bench <what>     benchmarks (engine, attach, syscalls)
";

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(task) = args.first() else {
        print!("{USAGE}");
        return Ok(());
    };
    let rest = &args[1..];
    match task.as_str() {
        "setup" => {
            model::fetch(rest)?;
            tools::setup(rest)?;
            ebpf::setup(rest)
        }
        "demo" => flows::demo(rest),
        "test" => flows::test(rest),
        "fetch-model" => model::fetch(rest),
        "setup-ebpf" => ebpf::setup(rest),
        "build-ebpf" => ebpf::build(rest),
        "setup-tools" => tools::setup(rest),
        "setup-otel-tools" => otel_tools::setup(rest),
        "bench" => bench::run(rest),
        "-h" | "--help" | "help" => {
            print!("{USAGE}");
            Ok(())
        }
        other => bail!("unknown task {other:?}\n\n{USAGE}"),
    }
}
