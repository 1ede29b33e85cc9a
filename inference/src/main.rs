//! `llmserve`: loads a GGUF model, starts the engine thread and serves the OpenAI-compatible API until SIGTERM or
//! SIGINT (graceful: stops accepting, lets responses finish for a bounded time, stops the engine).
//!
//! Prints `listening on http://HOST:PORT` on stdout once the socket is bound (tests and scripts wait for it).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use clap::Parser;
use inference::api::{self, AppState, Loader};
use inference::backend::Backend;
use inference::backend::device::create_backend;
use inference::config::Args;
use inference::engine::{EngineHandle, ModelHandle, Reloaded};
use inference::metrics::Metrics;
use inference::model::{self, Model};

/// How long in-flight responses may run after SIGTERM/SIGINT before the server exits anyway.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

fn main() -> Result<()> {
    llmprof_probes::keep();
    let args = Args::parse();
    let path = args.model.clone().unwrap_or_else(model::default_model_path);
    if !path.exists() {
        anyhow::bail!(
            "model file {} not found: pass --model PATH, set LLMSERVE_MODEL, or run `cargo xtask fetch-model`",
            path.display()
        );
    }
    let t0 = std::time::Instant::now();
    let model = Arc::new(Model::load(&path).with_context(|| format!("loading {}", path.display()))?);
    let selected = create_backend(args.device, model.clone(), &args.backend_options())
        .context("creating the compute backend")?;
    // Default served name: the file name without `.gguf` (like vLLM, which serves a model under its path), so
    // clients can name it without the spaces GGUF `general.name` values often have.
    let default_name = path
        .file_stem()
        .map_or_else(|| model.config.name.clone(), |s| s.to_string_lossy().into_owned());
    let cfg = args.engine_config(&default_name);
    eprintln!(
        "llmserve: loaded {} ({}, {} layers, context {}) in {:.2}s; backend {}; KV cache {} blocks x {} tokens",
        path.display(),
        model.config.name,
        model.config.n_layers,
        model.config.context_len,
        t0.elapsed().as_secs_f64(),
        selected.description,
        cfg.num_blocks,
        cfg.block_size
    );
    let metrics = Arc::new(Metrics::new(&cfg.served_model_name, model.config.context_len));
    if let Some(url) = &args.usage_stats_url {
        let target = inference::usage_stats::Target::parse(url)?;
        inference::usage_stats::start(
            target,
            args.usage_stats_interval,
            cfg.served_model_name.clone(),
            metrics.clone(),
        )
        .context("starting the usage-stats reporter")?;
    }
    let handle: Arc<dyn ModelHandle> = model.clone();
    let served = cfg.served_model_name.clone();
    let engine =
        EngineHandle::start(selected.backend, handle, cfg, metrics).context("starting the engine thread")?;
    let loader: Loader = Arc::new(|p: PathBuf| -> Result<Reloaded, String> {
        // `{:#}`: the error and its causes on one line (the API answers it to the client).
        let m = Arc::new(Model::load(&p).map_err(|e| format!("{:#}", anyhow::Error::new(e)))?);
        let handle: Arc<dyn ModelHandle> = m.clone();
        Ok(Reloaded {
            swap: Box::new(move |b: &mut dyn Backend| b.swap_weights(m)),
            handle,
            path: p.display().to_string(),
        })
    });
    let state = Arc::new(AppState {
        engine: engine.clone(),
        served_model_name: served,
        loader,
        model_path: tokio::sync::Mutex::new(path),
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    });

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("llmserve-http")
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let res = rt.block_on(serve(&args, state));
    engine.shutdown();
    rt.shutdown_timeout(Duration::from_secs(1));
    res
}

async fn serve(args: &Args, state: Arc<AppState>) -> Result<()> {
    let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
        .await
        .with_context(|| format!("binding {}:{}", args.host, args.port))?;
    let addr = listener.local_addr().context("reading the bound address")?;
    // Handlers before the address is announced: a SIGTERM sent as soon as the server answers must find them.
    let signals = (
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()),
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()),
    );
    println!("listening on http://{addr}");
    let app = api::router(state);
    let (tx, mut rx) = tokio::sync::watch::channel(false);
    let server = axum::serve(listener, app).with_graceful_shutdown(async move {
        let _ = rx.wait_for(|&v| v).await;
    });
    let mut server = std::pin::pin!(server.into_future());
    tokio::select! {
        r = &mut server => return r.context("serving"),
        _ = shutdown_signal(signals) => {}
    }
    eprintln!(
        "llmserve: shutting down (up to {}s for in-flight responses)",
        SHUTDOWN_GRACE.as_secs()
    );
    let _ = tx.send(true);
    match tokio::time::timeout(SHUTDOWN_GRACE, server).await {
        Ok(r) => r.context("serving"),
        Err(_) => Ok(()),
    }
}

async fn shutdown_signal(
    signals: (
        std::io::Result<tokio::signal::unix::Signal>,
        std::io::Result<tokio::signal::unix::Signal>,
    ),
) {
    match signals {
        (Ok(mut t), Ok(mut i)) => {
            tokio::select! {
                _ = t.recv() => {}
                _ = i.recv() => {}
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
