//! Accepting connections: a connection limit, a header timeout and an idle
//! timeout, so sockets that send nothing, or trickle a request head byte by
//! byte, cannot hold the server.
//!
//! - **Connection limit** ([`ConnectionLimits::max_connections`]): each
//!   accepted connection holds a permit of a semaphore until it closes. A
//!   connection accepted past the limit is answered at once with `503
//!   unavailable` (a short JSON body, `retry-after: 1`, `connection:
//!   close`) and closed; a few of those refusals run at a time, and past
//!   that an excess connection is closed without an answer.
//! - **Header timeout** ([`ConnectionLimits::header_timeout`]): a new
//!   connection must deliver a complete request head within this time of
//!   being accepted; on a kept-alive connection, within this time of the
//!   first byte of the next request. Otherwise it is closed.
//! - **Idle timeout** ([`ConnectionLimits::idle_timeout`]): a kept-alive
//!   connection on which no new request starts within this time of the
//!   last response is closed.
//!
//! While a request is in flight (from its complete head until its response
//! body is written) neither timeout runs: the request timeout of the
//! router's middleware bounds the handler. On shutdown the listener stops
//! accepting, every connection is asked to close once its current request
//! (if any) is answered, and [`serve_with`] returns when all are closed.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore, watch};
use tokio::time::Instant;
use warden_store::Store;

use crate::{AppState, router};

/// Limits on connections; see the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Most connections open at once (at least 1).
    pub max_connections: usize,
    /// Time to deliver a complete request head.
    pub header_timeout: Duration,
    /// Time a kept-alive connection may wait for its next request.
    pub idle_timeout: Duration,
}

impl Default for ConnectionLimits {
    /// 512 connections, a 10 s header timeout, a 60 s idle timeout.
    fn default() -> Self {
        Self {
            max_connections: 512,
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
        }
    }
}

/// How many `503` refusals may be written at once; excess connections past
/// that are closed unanswered.
const MAX_REFUSALS: usize = 64;
/// How long a refusal may take (writing it and draining what the client
/// sent, so the close does not reset the connection before it reads).
const REFUSAL_TIME: Duration = Duration::from_secs(1);
/// The refusal past the connection limit, shaped like every API error.
const REFUSAL_BODY: &str = r#"{"error":{"code":"unavailable","message":"too many connections; retry later","details":null}}"#;

/// Where a connection is between requests.
#[derive(Debug, Clone, Copy)]
enum Phase {
    /// Waiting for a request head: since when, whether this is the first
    /// request of the connection, and when the head's first byte came.
    Waiting {
        since: Instant,
        fresh: bool,
        first_byte: Option<Instant>,
    },
    /// A request is being answered.
    Busy,
}

/// One connection's phase, shared by its I/O, its service and its task.
#[derive(Debug)]
struct Activity {
    phase: Mutex<Phase>,
    changed: Notify,
}

impl Activity {
    fn new() -> Self {
        Self {
            phase: Mutex::new(Phase::Waiting {
                since: Instant::now(),
                fresh: true,
                first_byte: None,
            }),
            changed: Notify::new(),
        }
    }

    fn set(&self, f: impl FnOnce(&mut Phase)) {
        if let Ok(mut phase) = self.phase.lock() {
            f(&mut phase);
        }
        self.changed.notify_one();
    }

    /// Bytes arrived from the client.
    fn read_some(&self) {
        let mut first = false;
        if let Ok(mut phase) = self.phase.lock()
            && let Phase::Waiting { first_byte, .. } = &mut *phase
            && first_byte.is_none()
        {
            *first_byte = Some(Instant::now());
            first = true;
        }
        if first {
            self.changed.notify_one();
        }
    }

    /// When the connection is to be closed if nothing changes; `None` while
    /// a request is in flight.
    fn deadline(&self, limits: &ConnectionLimits) -> Option<Instant> {
        let phase = self.phase.lock().map(|p| *p).unwrap_or(Phase::Busy);
        match phase {
            Phase::Busy => None,
            Phase::Waiting {
                since, fresh: true, ..
            } => Some(since + limits.header_timeout),
            Phase::Waiting {
                first_byte: Some(at),
                ..
            } => Some(at + limits.header_timeout),
            Phase::Waiting {
                since,
                first_byte: None,
                ..
            } => Some(since + limits.idle_timeout),
        }
    }
}

/// Marks a request in flight until dropped with its response body.
struct InFlight(Arc<Activity>);

impl InFlight {
    fn begin(activity: &Arc<Activity>) -> Self {
        activity.set(|p| *p = Phase::Busy);
        Self(Arc::clone(activity))
    }

    /// Referenced by the response body's frame mapper so the guard lives
    /// exactly as long as the body.
    fn keep(&self) {}
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.set(|p| {
            *p = Phase::Waiting {
                since: Instant::now(),
                fresh: false,
                first_byte: None,
            }
        });
    }
}

/// The socket, noting when a request's first bytes arrive.
struct Watched {
    io: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.read_some();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// Serve the API on `listener` under `limits` until `shutdown` completes;
/// then stop accepting, let every connection finish its current request,
/// and return once all are closed.
pub async fn serve_with<S: Store>(
    listener: TcpListener,
    state: AppState<S>,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let max = limits.max_connections.max(1);
    let app = router(state);
    let permits = Arc::new(Semaphore::new(max));
    let refusals = Arc::new(Semaphore::new(MAX_REFUSALS));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => {
                // No Nagle delay: an answer written in pieces (headers,
                // then the events of a stream such as an MCP answer) is
                // not held back waiting for the client's delayed
                // acknowledgement (about 40 ms on loopback).
                if let Err(e) = stream.set_nodelay(true) {
                    tracing::debug!(error = %e, "TCP_NODELAY not set");
                }
                stream
            }
            Err(e) => {
                if !is_connection_error(&e) {
                    // Out of descriptors, say: back off instead of spinning.
                    tracing::error!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                continue;
            }
        };
        match Arc::clone(&permits).try_acquire_owned() {
            Ok(permit) => {
                let app = app.clone();
                let stop = stop_rx.clone();
                tokio::spawn(async move {
                    connection(stream, app, limits, stop).await;
                    drop(permit);
                });
            }
            Err(_) => {
                tracing::warn!(
                    limit = max,
                    "connection limit reached; refusing a connection"
                );
                if let Ok(slot) = Arc::clone(&refusals).try_acquire_owned() {
                    tokio::spawn(async move {
                        refuse(stream).await;
                        drop(slot);
                    });
                }
            }
        }
    }
    drop(listener);
    let _ = stop_tx.send(true);
    // Every connection task holds a permit until it ends.
    let all = u32::try_from(max).unwrap_or(u32::MAX);
    let _ = permits.acquire_many(all).await;
    Ok(())
}

/// One connection, from accept to close.
async fn connection(
    stream: TcpStream,
    app: axum::Router,
    limits: ConnectionLimits,
    mut stop: watch::Receiver<bool>,
) {
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(Watched {
        io: stream,
        activity: Arc::clone(&activity),
    });
    let service = {
        let activity = Arc::clone(&activity);
        let inner = TowerToHyperService::new(app);
        hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
            let guard = InFlight::begin(&activity);
            let response = hyper::service::Service::call(&inner, request);
            async move {
                let response = response.await?;
                Ok::<_, std::convert::Infallible>(response.map(move |body| {
                    body.map_frame(move |frame| {
                        guard.keep();
                        frame
                    })
                }))
            }
        })
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.keep_alive(true).header_read_timeout(None);
    let conn = builder.serve_connection(io, service).with_upgrades();
    let mut conn = std::pin::pin!(conn);
    let mut stopping = *stop.borrow();
    if stopping {
        conn.as_mut().graceful_shutdown();
    }
    loop {
        let deadline = activity.deadline(&limits);
        let expiry = async move {
            match deadline {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            () = expiry => {
                if activity
                    .deadline(&limits)
                    .is_some_and(|at| at <= Instant::now())
                {
                    tracing::debug!("closing a connection that sent no complete request in time");
                    return;
                }
            }
            () = activity.changed.notified() => {}
            changed = stop.changed(), if !stopping => {
                stopping = true;
                if changed.is_ok() {
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

/// Answer a connection past the limit with a 503 and close it.
async fn refuse(mut stream: TcpStream) {
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{REFUSAL_BODY}",
        REFUSAL_BODY.len()
    );
    let _ = tokio::time::timeout(REFUSAL_TIME, async {
        stream.write_all(response.as_bytes()).await?;
        stream.shutdown().await?;
        // Read what the client sent until it closes, so closing does not
        // reset the connection before the client has read the answer.
        let mut sink = [0u8; 1024];
        loop {
            stream.readable().await?;
            match stream.try_read(&mut sink) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        Ok::<_, io::Error>(())
    })
    .await;
}

/// Errors of one connection that do not concern the listener.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}
