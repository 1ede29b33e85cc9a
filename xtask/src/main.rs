//! Project tasks: setup of everything the demo and the tests need on a fresh machine, the eBPF build, benches.
//!
//! `cargo xtask <task>`; the command line is [`cli`], each task lives in its own module. Every install step
//! the project needs is here, never done by hand.

mod bench;
mod cli;
mod ebpf;
mod flows;
mod image;
mod model;
mod otel_tools;
mod release;
mod servers;
mod tools;
mod util;
mod vllm;

use anyhow::Result;
use clap::CommandFactory;

use cli::Task;

fn main() -> Result<()> {
    let Some(task) = cli::parse().task else {
        cli::Cli::command().print_help()?;
        return Ok(());
    };
    match task {
        Task::Setup { force } => {
            model::fetch(force)?;
            tools::setup()?;
            servers::setup()?;
            vllm::setup(&model::default_model_path())?;
            ebpf::setup()
        }
        Task::Demo { seconds } => flows::demo(seconds),
        Task::Test(args) => flows::test(&args.forwarded()),
        Task::FetchModel { force } => model::fetch(force),
        Task::SetupEbpf => ebpf::setup(),
        Task::BuildEbpf { check } => ebpf::build(check),
        Task::SetupTools => tools::setup(),
        Task::SetupOtelTools => otel_tools::setup(),
        Task::InstallCheck { debug } => release::install_check(debug),
        Task::Dist { debug, check } => {
            let d = release::dist(debug)?;
            if check {
                release::check_artefacts(&d)?;
                release::deb_check(&d.deb)?;
            }
            Ok(())
        }
        Task::Image { debug, check } => image::build(debug, check),
        Task::Bench { kind } => bench::run(kind),
    }
}
