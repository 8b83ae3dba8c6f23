//! Client connections: how many are served at once (`max_connections`), how
//! many RPCs each may have open (`max_streams_per_connection`), and how long
//! one may sit with none open (`idle_timeout`).
//!
//! Accepted sockets are wrapped ([`Conn`]) before tonic sees them: each
//! carries its state into every request's extensions ([`ConnInfo`]), where
//! [`StreamLimitLayer`] counts the RPCs it has open (a unary call until its
//! answer is sent, a stream until it ends). A connection with none open for
//! `idle_timeout` is closed (one that never opened any, after at most
//! [`FIRST_CALL_WITHIN`]): its reads end, so HTTP/2 ends the connection
//! (a client's channel reconnects when next used). A connection over
//! `max_connections` is not served: for a short grace it answers every
//! request RESOURCE_EXHAUSTED naming the limit, so the client learns why,
//! then it is closed; past [`MAX_REFUSING`] such connections at once, new
//! ones are closed on accept. Both refusals count in
//! `ricochet_limit_rejections_total`; `ricochet_connections` is the number
//! served.

use crate::limits::Limit;
use crate::status::status_of;
use futures::Stream;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::body::Body;
use tonic::codegen::http;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// Connections over `max_connections` kept open at once to be told why
/// (beyond this many, an over-limit connection is closed on accept).
pub const MAX_REFUSING: usize = 64;
/// How long an over-limit connection answers RESOURCE_EXHAUSTED before it
/// is closed.
pub const REFUSAL_GRACE: Duration = Duration::from_secs(2);
/// A new connection must open its first call within this (or
/// `idle_timeout`, if shorter), so sockets that never speak gRPC do not
/// hold connection slots for a whole idle timeout.
pub const FIRST_CALL_WITHIN: Duration = Duration::from_secs(10);

/// The connection limits (0 or zero durations: unlimited).
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    /// `max_connections`.
    pub max_connections: usize,
    /// `max_streams_per_connection`.
    pub max_streams: usize,
    /// `idle_timeout`.
    pub idle_timeout: Duration,
}

/// Every connection of one server.
#[derive(Debug)]
pub struct Registry {
    limits: ConnLimits,
    served: AtomicUsize,
    refusing: AtomicUsize,
    gauge: metrics::Gauge,
}

impl Registry {
    /// A registry enforcing `limits`.
    pub fn new(limits: ConnLimits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            served: AtomicUsize::new(0),
            refusing: AtomicUsize::new(0),
            gauge: metrics::gauge!("ricochet_connections"),
        })
    }

    /// Takes an accepted socket: served, refused with a grace, or (`None`)
    /// closed at once.
    fn admit(self: &Arc<Self>, tcp: TcpStream) -> Option<Conn> {
        let max = self.limits.max_connections;
        let admitted = self
            .served
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (!Limit::reached(n, max)).then_some(n + 1)
            })
            .is_ok();
        let refusing = if admitted {
            self.gauge.increment(1.0);
            false
        } else {
            crate::metrics::limit_rejected(Limit::Connections.label());
            let room = self
                .refusing
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    (n < MAX_REFUSING).then_some(n + 1)
                })
                .is_ok();
            if !room {
                tracing::debug!("connection over max_connections closed on accept");
                return None;
            }
            true
        };
        let tcp_info = tcp.connect_info();
        let state = Arc::new(ConnState {
            registry: self.clone(),
            active: watch::Sender::new(0),
            refusing,
            close: CancellationToken::new(),
        });
        let watchdog = if refusing {
            Some(REFUSAL_GRACE)
        } else if self.limits.idle_timeout.is_zero() {
            None
        } else {
            Some(self.limits.idle_timeout)
        };
        if let Some(after) = watchdog {
            tokio::spawn(watch_idle(state.clone(), after));
        }
        Some(Conn {
            closed: Box::pin(state.close.clone().cancelled_owned()),
            info: ConnInfo {
                state,
                tcp: tcp_info,
            },
            tcp,
        })
    }
}

/// Closes `state`'s connection once it has had no RPC open for `after`
/// (a refused connection: `after` its acceptance, whatever it does).
async fn watch_idle(state: Arc<ConnState>, after: Duration) {
    if state.refusing {
        tokio::select! {
            _ = state.close.cancelled() => {}
            _ = tokio::time::sleep(after) => state.close.cancel(),
        }
        return;
    }
    let mut active = state.active.subscribe();
    let mut limit = after.min(FIRST_CALL_WITHIN);
    loop {
        tokio::select! {
            _ = state.close.cancelled() => return,
            idle = active.wait_for(|n| *n == 0) => if idle.is_err() { return },
        }
        tokio::select! {
            _ = state.close.cancelled() => return,
            changed = active.changed() => {
                if changed.is_err() {
                    return;
                }
                limit = after;
            }
            _ = tokio::time::sleep(limit) => {
                tracing::debug!(after = ?limit, "closing an idle connection");
                state.close.cancel();
                return;
            }
        }
    }
}

/// One connection's state, shared by its socket, its watchdog and the
/// requests on it.
#[derive(Debug)]
struct ConnState {
    registry: Arc<Registry>,
    /// RPCs open now.
    active: watch::Sender<usize>,
    /// Over `max_connections`: every request is refused.
    refusing: bool,
    /// Cancelled to close the connection (and when it closes).
    close: CancellationToken,
}

impl ConnState {
    /// Counts one more RPC open, or refuses it.
    fn open_stream(self: &Arc<Self>) -> Result<StreamGuard, tonic::Status> {
        let limits = &self.registry.limits;
        if self.refusing {
            return Err(status_of(&crate::error::BrokerError::LimitReached(
                format!(
                    "the broker is serving as many connections as it may; retry later: the limit is {} (max_connections in the broker's config)",
                    limits.max_connections
                ),
            )));
        }
        let max = limits.max_streams;
        let mut open = None;
        self.active.send_if_modified(|n| {
            if Limit::reached(*n, max) {
                open = Some(*n);
                false
            } else {
                *n += 1;
                true
            }
        });
        if let Some(n) = open {
            let e = Limit::StreamsPerConnection
                .refuse(format!("this connection has {n} calls open"), max);
            return Err(status_of(&e));
        }
        Ok(StreamGuard(self.clone()))
    }
}

/// One open RPC; dropping it closes it.
#[derive(Debug)]
struct StreamGuard(Arc<ConnState>);

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.0.active.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// A connection's state, as request extensions carry it; also answers for
/// the TCP addresses.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    state: Arc<ConnState>,
    tcp: TcpConnectInfo,
}

/// An accepted socket whose reads end once its connection is to close.
#[derive(Debug)]
pub struct Conn {
    tcp: TcpStream,
    info: ConnInfo,
    closed: Pin<Box<WaitForCancellationFutureOwned>>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        let state = &self.info.state;
        state.close.cancel();
        let registry = &state.registry;
        if state.refusing {
            registry.refusing.fetch_sub(1, Ordering::AcqRel);
        } else {
            registry.served.fetch_sub(1, Ordering::AcqRel);
            registry.gauge.decrement(1.0);
        }
    }
}

impl Connected for Conn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        self.info.clone()
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.closed.as_mut().poll(cx).is_ready() {
            // End of stream: HTTP/2 ends the connection.
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().tcp).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }
}

/// The accepted sockets of `incoming`, admitted by `registry`.
pub fn admit_all(
    incoming: impl Stream<Item = io::Result<TcpStream>> + Send + 'static,
    registry: Arc<Registry>,
) -> impl Stream<Item = io::Result<Conn>> + Send + 'static {
    use futures::StreamExt;
    incoming.filter_map(move |accepted| {
        let conn = match accepted {
            Ok(tcp) => registry.admit(tcp).map(Ok),
            Err(e) => Some(Err(e)),
        };
        std::future::ready(conn)
    })
}

/// Counts each connection's open RPCs and refuses those over the limits.
#[derive(Debug, Clone, Copy, Default)]
pub struct StreamLimitLayer;

impl<S> tower_layer::Layer<S> for StreamLimitLayer {
    type Service = StreamLimit<S>;

    fn layer(&self, inner: S) -> StreamLimit<S> {
        StreamLimit { inner }
    }
}

/// See [`StreamLimitLayer`].
#[derive(Debug, Clone)]
pub struct StreamLimit<S> {
    inner: S,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

impl<S> tower_service::Service<http::Request<Body>> for StreamLimit<S>
where
    S: tower_service::Service<http::Request<Body>, Response = http::Response<Body>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<Body>) -> Self::Future {
        let info = req.extensions().get::<ConnInfo>().cloned().or_else(|| {
            req.extensions()
                .get::<tonic::transport::server::TlsConnectInfo<ConnInfo>>()
                .map(|tls| tls.get_ref().clone())
        });
        let Some(info) = info else {
            return Box::pin(self.inner.call(req));
        };
        // `tonic::Request::remote_addr` looks for the TCP addresses.
        req.extensions_mut().insert(info.tcp.clone());
        let guard = match info.state.open_stream() {
            Ok(g) => g,
            Err(status) => return Box::pin(std::future::ready(Ok(status.into_http()))),
        };
        // The service that was polled ready is the one called.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            let response = inner.call(req).await?;
            Ok(response.map(|body| {
                Body::new(Guarded {
                    body,
                    _guard: guard,
                })
            }))
        })
    }
}

/// A response body holding its RPC open until it is dropped.
struct Guarded {
    body: Body,
    _guard: StreamGuard,
}

impl http_body::Body for Guarded {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, tonic::Status>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
