//! [`AuthLayer`]: establishes who made each call before any service runs.
//! A call without a valid credential is answered UNAUTHENTICATED with a
//! short reason and reaches no service; health checks need none. Without a
//! token, a client certificate the TLS handshake verified proves the role
//! its subject CN names, when `tls.role_from_client_cert` is set.
//!
//! The broker-to-broker `Replication` service (Raft) admits superusers only:
//! a broker calls it with the token of `[cluster] peer_token_file`, whose
//! role the operator lists in `auth.superusers` (Pulsar's broker client
//! token, whose role is in `superUserRoles`). Any other role is answered
//! PERMISSION_DENIED before the request reaches a group. Which broker a
//! superuser may speak for is checked per request by the service itself
//! (`crate::replication::PeerRoles`, from the role each broker registered).

use super::{Auth, Principal};
use crate::connections::ConnInfo;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tonic::Status;
use tonic::body::Body;
use tonic::codegen::http;
use tonic::transport::server::TlsConnectInfo;

/// Authenticates calls (a pass-through when auth is off).
#[derive(Debug, Clone)]
pub struct AuthLayer {
    auth: Arc<Auth>,
}

impl AuthLayer {
    /// A layer checking credentials against `auth`.
    pub fn new(auth: Arc<Auth>) -> Self {
        Self { auth }
    }
}

impl<S> tower_layer::Layer<S> for AuthLayer {
    type Service = Authenticate<S>;

    fn layer(&self, inner: S) -> Authenticate<S> {
        Authenticate {
            inner,
            auth: self.auth.clone(),
        }
    }
}

/// See [`AuthLayer`].
#[derive(Debug, Clone)]
pub struct Authenticate<S> {
    inner: S,
    auth: Arc<Auth>,
}

/// The path prefix of the broker-to-broker `Replication` service's calls.
const REPLICATION_PATH: &str = "/ricochet.replication.v1.Replication/";

/// Who `req` comes from, or why it is refused: a caller of the
/// `Replication` service must be a superuser (a broker).
fn authenticate<B>(auth: &Auth, req: &http::Request<B>) -> Result<Option<Principal>, Status> {
    let who = identify(auth, req)?;
    if req.uri().path().starts_with(REPLICATION_PATH) && !auth.is_superuser(who.as_ref()) {
        let role = who.as_ref().map_or("anonymous", |p| p.role.as_str());
        return Err(Status::permission_denied(format!(
            "the Replication service is for brokers: role \"{role}\" is not a superuser \
             (a broker calls it with the token of [cluster] peer_token_file)"
        )));
    }
    Ok(who)
}

/// Who `req` comes from, or why it is refused (UNAUTHENTICATED).
fn identify<B>(auth: &Auth, req: &http::Request<B>) -> Result<Option<Principal>, Status> {
    if req.uri().path().starts_with("/grpc.health.") {
        return Ok(None);
    }
    if let Some(value) = req.headers().get(http::header::AUTHORIZATION) {
        let token = value
            .to_str()
            .ok()
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .map(str::trim)
            .ok_or_else(|| {
                Status::unauthenticated("malformed authorization header: expected `Bearer <token>`")
            })?;
        return auth
            .verify_token(token)
            .map(|role| Some(Principal { role }))
            .map_err(Status::unauthenticated);
    }
    if auth.role_from_client_cert()
        && let Some(role) = req
            .extensions()
            .get::<TlsConnectInfo<ConnInfo>>()
            .and_then(|tls| tls.peer_certs())
            .and_then(|certs| certs.first().and_then(|c| crate::tls::common_name(c)))
    {
        return Ok(Some(Principal { role }));
    }
    Err(Status::unauthenticated(
        "no credentials: send `authorization: Bearer <token>` (ricochet --token)",
    ))
}

impl<S> tower_service::Service<http::Request<Body>> for Authenticate<S>
where
    S: tower_service::Service<http::Request<Body>, Response = http::Response<Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<Body>) -> Self::Future {
        if self.auth.enabled() {
            match authenticate(&self.auth, &req) {
                Ok(Some(p)) => {
                    req.extensions_mut().insert(p);
                }
                Ok(None) => {}
                Err(status) => {
                    if status.code() == tonic::Code::PermissionDenied {
                        tracing::warn!(path = %req.uri().path(), reason = %status.message(), "broker-to-broker call refused");
                    }
                    metrics::counter!("ricochet_auth_failures_total").increment(1);
                    return Box::pin(std::future::ready(Ok(status.into_http())));
                }
            }
        }
        Box::pin(self.inner.call(req))
    }
}
