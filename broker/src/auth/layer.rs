//! [`AuthLayer`]: establishes who made each call before any service runs.
//! A call without a valid credential is answered UNAUTHENTICATED with a
//! short reason and reaches no service; health checks need none.

use super::{Auth, Principal};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tonic::Status;
use tonic::body::Body;
use tonic::codegen::http;

/// The role a client certificate names, put in a call's extensions by the
/// TLS acceptor when client certificates are verified (see `crate::tls`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertRole(pub String);

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

/// Who `req` comes from, or why it is refused.
fn authenticate<B>(auth: &Auth, req: &http::Request<B>) -> Result<Option<Principal>, Status> {
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
    if let Some(CertRole(role)) = req.extensions().get::<CertRole>() {
        return Ok(Some(Principal { role: role.clone() }));
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
                    metrics::counter!("ricochet_auth_failures_total").increment(1);
                    return Box::pin(std::future::ready(Ok(status.into_http())));
                }
            }
        }
        Box::pin(self.inner.call(req))
    }
}
