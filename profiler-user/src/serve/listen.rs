//! How `llmprof serve` accepts and keeps HTTP and HTTPS connections, so that no client — with or without the
//! token — can hold the API away from Alertmanager and the liveness probe.
//!
//! Owns the accept loop and the life of each connection (hyper's HTTP/1 server under the axum router):
//! - a cap on connections open at once ([`Limits::max_connections`]) and per client address
//!   ([`Limits::max_per_peer`]): a connection over either is closed at once, counted
//!   (`llmprof_serve_connections_refused_total`), and never waits in the kernel's backlog;
//! - the TLS handshake runs in the connection's own task with a deadline ([`Limits::handshake`]): a client
//!   that never finishes it holds one slot for that long, never the accept loop;
//! - a deadline for a request's head ([`Limits::header`], hyper's `header_read_timeout`: a head sent a byte at a
//!   time does not extend it);
//! - an idle deadline ([`Limits::idle`]): a connection with no request in flight and no byte moved for that
//!   long is closed (a keep-alive connection left open);
//! - at shutdown, and after an idle deadline, in-flight requests get [`Limits::drain`] to finish.
//!
//! Request bodies have their own deadline where they are read (`http::BODY_TIMEOUT`). It never blocks on a
//! client anywhere but in that client's own task.

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

use super::metrics::Metrics;

/// The connection limits (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once.
    pub max_connections: usize,
    /// Connections open at once from one client address.
    pub max_per_peer: usize,
    /// Longest TLS handshake.
    pub handshake: Duration,
    /// Longest wait for a whole request head.
    pub header: Duration,
    /// Longest quiet time of a connection with no request in flight.
    pub idle: Duration,
    /// How long in-flight requests may take to finish when a connection is closed.
    pub drain: Duration,
}

impl Default for Limits {
    /// 256 connections (64 per address): Alertmanager holds a few, a scraper one, a probe one; a 10 s head and
    /// handshake (a webhook's head is a few hundred bytes); 30 s idle (Alertmanager's keep-alive reconnects on
    /// its own); 30 s to drain.
    fn default() -> Self {
        Limits {
            max_connections: 256,
            max_per_peer: 64,
            handshake: Duration::from_secs(10),
            header: Duration::from_secs(10),
            idle: Duration::from_secs(30),
            drain: Duration::from_secs(30),
        }
    }
}

/// Connections open now, in total and per client address.
#[derive(Debug, Default)]
struct Open {
    total: usize,
    per_peer: HashMap<IpAddr, usize>,
}

/// One connection's place under the caps; given back on drop.
struct Slot {
    open: Arc<Mutex<Open>>,
    peer: IpAddr,
}

impl Slot {
    fn take(open: &Arc<Mutex<Open>>, peer: IpAddr, limits: &Limits) -> Option<Slot> {
        let mut o = open.lock().unwrap_or_else(|e| e.into_inner());
        let mine = o.per_peer.get(&peer).copied().unwrap_or(0);
        if o.total >= limits.max_connections || mine >= limits.max_per_peer {
            return None;
        }
        o.total += 1;
        *o.per_peer.entry(peer).or_default() += 1;
        Some(Slot {
            open: open.clone(),
            peer,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut o = self.open.lock().unwrap_or_else(|e| e.into_inner());
        o.total = o.total.saturating_sub(1);
        if let Some(n) = o.per_peer.get_mut(&self.peer) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                o.per_peer.remove(&self.peer);
            }
        }
    }
}

/// What a connection's idle check reads: when a byte last moved, and requests in flight.
#[derive(Debug)]
struct Activity {
    epoch: Instant,
    last_ms: AtomicU64,
    in_flight: AtomicUsize,
}

impl Activity {
    fn new() -> Arc<Self> {
        Arc::new(Activity {
            epoch: Instant::now(),
            last_ms: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
        })
    }

    fn touch(&self) {
        self.last_ms
            .store(self.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    fn idle_for(&self) -> Duration {
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            return Duration::ZERO;
        }
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        self.epoch.elapsed().saturating_sub(last)
    }
}

/// A stream that notes when bytes move.
struct Watched<I> {
    io: I,
    activity: Arc<Activity>,
}

impl<I: AsyncRead + Unpin> AsyncRead for Watched<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.touch();
        }
        r
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Watched<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write(cx, data);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Counts a request in flight for as long as it lives.
struct InFlight(Arc<Activity>);

impl InFlight {
    fn enter(a: &Arc<Activity>) -> Self {
        a.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(a.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.0.touch();
    }
}

/// Serves `app` on `listener` (over TLS with `tls`) until `stop` completes; then lets in-flight requests
/// finish for [`Limits::drain`].
pub async fn serve(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    app: axum::Router,
    limits: Limits,
    metrics: Arc<Metrics>,
    stop: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let acceptor = tls.map(TlsAcceptor::from);
    let open = Arc::new(Mutex::new(Open::default()));
    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    tokio::pin!(stop);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut stop => break,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(_) => {
                    // Out of fds or a transient error: back off like axum's own listener.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        while tasks.try_join_next().is_some() {}
        let Some(slot) = Slot::take(&open, peer.ip(), &limits) else {
            Metrics::inc(&metrics.connections_refused);
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (app, acceptor, metrics, shutdown) = (
            app.clone(),
            acceptor.clone(),
            metrics.clone(),
            shutdown_rx.clone(),
        );
        tasks.spawn(async move {
            let _slot = slot;
            let activity = Activity::new();
            activity.touch();
            match acceptor {
                Some(a) => match tokio::time::timeout(limits.handshake, a.accept(stream)).await {
                    Ok(Ok(tls)) => connection(tls, app, limits, shutdown, activity, &metrics).await,
                    Ok(Err(_)) => {}
                    Err(_) => Metrics::inc(&metrics.connections_timed_out),
                },
                None => connection(stream, app, limits, shutdown, activity, &metrics).await,
            }
        });
    }
    let _ = shutdown_tx.send(true);
    let drained = tokio::time::timeout(limits.drain + Duration::from_secs(1), async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tasks.abort_all();
    }
    Ok(())
}

/// One connection, to its end (see the module doc).
async fn connection<I: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    io: I,
    app: axum::Router,
    limits: Limits,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
    activity: Arc<Activity>,
    metrics: &Metrics,
) {
    let io = Watched {
        io,
        activity: activity.clone(),
    };
    let a = activity.clone();
    let svc = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        let guard = InFlight::enter(&a);
        let app = app.clone();
        async move {
            let r = app.oneshot(req.map(axum::body::Body::new)).await;
            drop(guard);
            r
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header)
        .keep_alive(true);
    let conn = builder.serve_connection(TokioIo::new(io), svc);
    tokio::pin!(conn);
    let tick = (limits.idle / 4).max(Duration::from_millis(100));
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if r.is_err_and(|e| e.is_timeout()) {
                    Metrics::inc(&metrics.connections_timed_out);
                }
                return;
            }
            _ = shutdown.changed() => break,
            () = tokio::time::sleep(tick) => {
                if activity.idle_for() >= limits.idle {
                    Metrics::inc(&metrics.connections_timed_out);
                    break;
                }
            }
        }
    }
    conn.as_mut().graceful_shutdown();
    let _ = tokio::time::timeout(limits.drain, conn.as_mut()).await;
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests {
    use super::*;

    #[test]
    fn the_caps_count_per_address_and_in_total() {
        let open = Arc::new(Mutex::new(Open::default()));
        let limits = Limits {
            max_connections: 3,
            max_per_peer: 2,
            ..Limits::default()
        };
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let s1 = Slot::take(&open, a, &limits).unwrap();
        let s2 = Slot::take(&open, a, &limits).unwrap();
        assert!(Slot::take(&open, a, &limits).is_none(), "per address");
        let s3 = Slot::take(&open, b, &limits).unwrap();
        assert!(Slot::take(&open, b, &limits).is_none(), "in total");
        drop(s1);
        let s4 = Slot::take(&open, b, &limits).unwrap();
        drop((s2, s3, s4));
        let o = open.lock().unwrap();
        assert_eq!((o.total, o.per_peer.len()), (0, 0));
    }
}
