//! The broker's side of the web console ([`ricochet_console`]): the admin
//! service the console calls, which is the broker's own gRPC stack for the
//! `Admin` and `Auth` services ([`AuthLayer`] to establish the caller from
//! the call's bearer token, the generated servers and their codec, and the
//! RPC table's [`Guarded`] services for the permission check, the route and
//! the audit line), called in process instead of over a socket. A console
//! page is therefore answered exactly as the same gRPC call would be; this
//! module adds no check of its own and skips none.

use crate::auth::{AuthLayer, AuthService};
use crate::gate::{Gate, Guarded};
use crate::node::Node;
use crate::service::{AdminService, Router};
use ricochet_proto::MAX_GRPC_MESSAGE_BYTES;
use ricochet_proto::admin_server::AdminServer;
use ricochet_proto::auth_server::AuthServer;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tonic::body::Body;
use tonic::codegen::http;
use tower_layer::Layer as _;
use tower_service::Service;

/// The `Admin` and `Auth` gRPC services of `node`, behind the broker's
/// authentication and RPC table, as one in-process service.
#[derive(Debug, Clone)]
pub struct InProcessAdmin {
    node: Arc<Node>,
}

impl InProcessAdmin {
    /// The admin services of `node`.
    pub fn new(node: Arc<Node>) -> Self {
        Self { node }
    }
}

impl Service<http::Request<Body>> for InProcessAdmin {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let node = &self.node;
        // Built per call (a few reference counts): the cluster, which the
        // route needs, is joined after the console starts.
        let gate = Gate::new(
            node.auth.clone(),
            Router::new(node.cluster().cloned(), node.groups().cloned()),
        );
        let admin = AdminServer::new(Guarded::new(AdminService::new(node.clone()), gate.clone()))
            .max_decoding_message_size(MAX_GRPC_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_GRPC_MESSAGE_BYTES);
        let grants = AuthServer::new(Guarded::new(
            AuthService::new(node.auth.clone(), node.core.flusher.clone()),
            gate,
        ));
        let routes = tonic::service::Routes::new(admin).add_service(grants);
        let mut stack = AuthLayer::new(node.auth.clone()).layer(routes);
        Box::pin(async move {
            std::future::poll_fn(|cx| stack.poll_ready(cx)).await?;
            stack.call(req).await
        })
    }
}

/// The console's routes over `node`'s admin services, with the options its
/// config gives (for serving, or for tests that call the handlers without a
/// socket).
pub fn router(node: Arc<Node>) -> axum::Router {
    let options = ricochet_console::Options {
        allow_remote: node.core.config.console_allow_remote,
        // With `[tls]` the console is served over TLS too.
        secure_cookie: node.core.config.tls.enabled(),
    };
    ricochet_console::router(InProcessAdmin::new(node), options)
}

/// Binds `addr` and serves the console of `node` there (over TLS, with the
/// gRPC listener's certificate, when `[tls]` is set) until the broker
/// starts shutting down; where it listens.
pub async fn start(node: Arc<Node>, addr: SocketAddr) -> crate::Result<SocketAddr> {
    let core = node.core.clone();
    let server = ricochet_console::ConsoleServer::bind(addr)
        .await
        .map_err(console_error)?;
    let bound = server.local_addr().map_err(console_error)?;
    let stop = core.shutdown.clone().cancelled_owned();
    match core.config.tls.console_config()? {
        Some(tls) => server.spawn_tls(router(node), tls, stop),
        None => server.spawn(router(node), stop),
    };
    Ok(bound)
}

fn console_error(e: ricochet_console::Error) -> crate::BrokerError {
    match e {
        ricochet_console::Error::Io(e) => crate::BrokerError::Io(e),
    }
}
