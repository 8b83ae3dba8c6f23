//! Ricochet's web console: topics, subscriptions, retry queues and dead
//! letters in a browser, with discard and replay behind a confirmation
//! page. This crate owns the pages, the actions and the sign-in; it owns no
//! broker state and checks no permission itself: every read and every
//! action is a gRPC call of the admin API ([`router`] is generic over the
//! service that answers it), carrying the signed-in user's token, so the
//! broker authenticates, authorizes, routes and audits it exactly as a call
//! from `ricochet` or any gRPC client.
//!
//! How it is built, and why:
//! * Served with axum 0.8, which tonic already brings in, on its own
//!   listener, so the gRPC port stays gRPC only.
//! * Generic over the admin *service* (a tower `Service` speaking the
//!   `Admin` and `Auth` gRPC services), not over the tonic server traits: in
//!   the broker, authentication is a tower layer below those traits, so a
//!   console handed `Admin` implementations would have to authenticate by
//!   hand. Handed the broker's own stack instead (authentication layer,
//!   codec, the RPC table's guarded services), a console call passes every
//!   step a network call passes, without a socket; handed a
//!   `tonic::transport::Channel`, the console would serve a remote broker.
//! * Sign-in by token ([`session`]): with `[auth]` on, the sign-in page
//!   takes a JWT, checks it with the broker (`Auth/WhoAmI`) and keeps it in
//!   an `HttpOnly`, `SameSite=Strict` cookie (`Secure` when
//!   [`Options::secure_cookie`]); every call then carries it as
//!   `authorization: Bearer …`. A refused call shows the broker's own
//!   UNAUTHENTICATED (401) or PERMISSION_DENIED (403) message. Without
//!   `[auth]` no sign-in is needed.
//! * Pages are rendered on the server with [`maud`]: its `html!` macro is
//!   checked at compile time and escapes every interpolated value by
//!   default, so a hostile payload, property or reason is text and never
//!   markup; nothing has to remember to escape. The pictures are inline SVG
//!   drawn by the same macro ([`charts`]), with `<title>` tooltips. No
//!   JavaScript at all and no front-end build: every page is a plain GET,
//!   every change a plain form POST, so the console works in any browser
//!   and is tested in a real one (`broker/tests/it/console_browser.rs`).
//! * An action is two steps ([`actions`]): a confirmation page shows
//!   exactly what will happen (the subscription, the ids as the broker's
//!   dry run resolves them, what replay does to them, an edit's changes)
//!   and holds that plan server-side under a random single-use token; only
//!   a POST carrying the token carries it out, on exactly those ids, with
//!   the token of whoever posts it (the broker checks the action itself,
//!   not only its confirmation).
//! * Cross-site requests: a page elsewhere cannot read a confirmation
//!   token, the sign-in cookie is `SameSite=Strict` (a cross-site POST
//!   carries none), and a POST whose `Origin` (or `Sec-Fetch-Site`) says it
//!   comes from another site is refused before any handler runs.
//! * Loopback only (unless [`Options::allow_remote`]) means the host name a
//!   request names too: another name is refused, so a web page that points
//!   its own name at 127.0.0.1 (DNS rebinding) cannot read a page or a token.
//!
//! Fix and resend (issue #14, item 2): a dead letter's page has an edit
//! form (payload as text or base64, properties set and removed, key); its
//! confirmation shows the change and who receives it, and the POST replays
//! through `ReplayDeadLetters` with the edit, which the broker records in
//! the message's edit history under the signed-in role.

mod actions;
mod api;
mod breaker;
mod charts;
mod format;
mod key_order;
mod pages;
mod params;
mod partitioned;
pub mod session;

use axum::Router;
use axum::extract::FromRequestParts;
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use maud::{DOCTYPE, Markup, html};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;

pub use api::{Backend, BackendError, BoxError};

/// The crate's error: what can go wrong serving (pages answer with a
/// status of their own, never an error of this type).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The listener could not be bound or read.
    #[error("web console listener: {0}")]
    Io(#[from] std::io::Error),
}

/// How the console is served.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Options {
    /// Answer requests naming any host name (default: only loopback names).
    pub allow_remote: bool,
    /// Mark the sign-in cookie `Secure` (the console is reached over TLS,
    /// so the browser never sends the token in clear).
    pub secure_cookie: bool,
}

/// What every handler shares.
#[derive(Debug, Clone)]
struct Shared {
    api: api::ConsoleApi,
    pending: Arc<actions::Pending>,
    options: Options,
}

/// What a handler works with: the shared state, with the admin API signed
/// as the request's caller (the token of its sign-in cookie, if any).
#[derive(Debug, Clone)]
struct ConsoleState {
    api: api::ConsoleApi,
    pending: Arc<actions::Pending>,
    options: Options,
}

impl FromRequestParts<Shared> for ConsoleState {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        shared: &Shared,
    ) -> Result<Self, Self::Rejection> {
        Ok(Self {
            api: shared.api.signed(session::token_of(&parts.headers)),
            pending: shared.pending.clone(),
            options: shared.options,
        })
    }
}

/// The console's routes over `admin`: a service answering the `Admin` and
/// `Auth` gRPC services (the broker's in-process stack, or a channel to a
/// broker). Every page and action is a call of it, made with the caller's
/// token.
pub fn router<S>(admin: S, options: Options) -> Router
where
    S: tower::Service<
            axum::http::Request<tonic::body::Body>,
            Response = axum::http::Response<tonic::body::Body>,
        > + Clone
        + Send
        + Sync
        + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    let state = Shared {
        api: api::ConsoleApi::new(admin),
        pending: Arc::new(actions::Pending::default()),
        options,
    };
    let allow_remote = options.allow_remote;
    Router::new()
        .route("/", get(pages::index))
        .route("/topic", get(pages::topic))
        .route("/subscription", get(pages::subscription))
        .route("/dead-letters", get(pages::dead_letters))
        .route("/dead-letter", get(pages::dead_letter))
        .route("/message", get(pages::message))
        .route("/confirm/{action}", get(actions::confirm))
        .route("/confirm/edit", post(actions::confirm_edit))
        .route("/act", post(actions::perform))
        .route("/sign-in", get(session::sign_in_page).post(session::sign_in))
        .route("/sign-out", post(session::sign_out))
        .fallback(|| async { ConsoleError::not_found("no such page") })
        .with_state(state)
        .layer(axum::middleware::from_fn(
            move |req: axum::extract::Request, next: axum::middleware::Next| async move {
                if !allow_remote && !loopback_host(&req) {
                    return ConsoleError::new(
                        StatusCode::FORBIDDEN,
                        "this console answers only to a loopback host name (127.0.0.1, [::1], localhost)",
                    )
                    .into_response();
                }
                if let Some(why) = cross_site(&req) {
                    return ConsoleError::new(StatusCode::FORBIDDEN, why).into_response();
                }
                let role = session::token_of(req.headers())
                    .as_deref()
                    .and_then(session::role_shown);
                SIGNED_IN.scope(role, next.run(req)).await
            },
        ))
}

tokio::task_local! {
    /// The role the request's sign-in cookie names, for the page frame
    /// only (the broker checks the token on every call).
    static SIGNED_IN: Option<String>;
}

/// Why a POST is refused as coming from another site, if it is: its
/// `Sec-Fetch-Site` says so, or its `Origin` names another host than the
/// request does. A request without either (not a browser's) passes: the
/// confirmation token and the `SameSite=Strict` cookie guard the rest.
fn cross_site(req: &axum::extract::Request) -> Option<&'static str> {
    use axum::http::{Method, header};
    if req.method() != Method::POST {
        return None;
    }
    let headers = req.headers();
    if let Some(site) = headers.get("sec-fetch-site")
        && matches!(site.as_bytes(), b"cross-site" | b"same-site")
    {
        return Some("a form posted from another site is refused: use the console's own pages");
    }
    let origin = headers.get(header::ORIGIN)?;
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let authority = origin
        .to_str()
        .ok()
        .and_then(|o| o.split_once("://"))
        .map(|(_, a)| a);
    match (authority, host) {
        (Some(a), Some(h)) if a.eq_ignore_ascii_case(h) => None,
        _ => Some("a form posted from another origin is refused: use the console's own pages"),
    }
}

/// Whether a request names a loopback host (or none). A loopback-only
/// console refuses other names, so a web page whose own host name an
/// attacker points at 127.0.0.1 (DNS rebinding) cannot read its pages,
/// confirmation tokens included.
fn loopback_host(req: &axum::extract::Request) -> bool {
    let Some(host) = req.headers().get(axum::http::header::HOST) else {
        return true;
    };
    let Ok(host) = host.to_str() else {
        return false;
    };
    let name = match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    };
    let name = name.trim_start_matches('[').trim_end_matches(']');
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A bound console listener; [`ConsoleServer::spawn`] serves a [`router`]
/// on it.
#[derive(Debug)]
pub struct ConsoleServer {
    listener: TcpListener,
}

impl ConsoleServer {
    /// Binds `addr`.
    pub async fn bind(addr: SocketAddr) -> Result<Self, Error> {
        Ok(Self {
            listener: TcpListener::bind(addr).await?,
        })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> Result<SocketAddr, Error> {
        Ok(self.listener.local_addr()?)
    }

    /// Serves `app` over TLS with `tls` (the sign-in cookie should then be
    /// [`Options::secure_cookie`]) in the background until `shutdown`
    /// resolves. Each connection's handshake runs on a task of its own
    /// (given 10 s), so a client that never finishes one holds up no other.
    pub fn spawn_tls(
        self,
        app: Router,
        tls: Arc<tokio_rustls::rustls::ServerConfig>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> tokio::task::JoinHandle<()> {
        let addr = self.listener.local_addr().ok();
        let acceptor = tokio_rustls::TlsAcceptor::from(tls);
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let listener = self.listener;
        let accepting = tokio::spawn(async move {
            loop {
                let (tcp, peer) = match listener.accept().await {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::debug!(error = %e, "web console: accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    let handshake = acceptor.accept(tcp);
                    match tokio::time::timeout(std::time::Duration::from_secs(10), handshake).await
                    {
                        Ok(Ok(stream)) => {
                            let _ = tx.send((stream, peer)).await;
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, error = %e, "web console: TLS handshake failed")
                        }
                        Err(_) => tracing::debug!(%peer, "web console: TLS handshake timed out"),
                    }
                });
            }
        });
        let listener = TlsListener { rx, addr };
        tokio::spawn(async move {
            tracing::info!(addr = ?addr, "web console serving (TLS)");
            let served = axum::serve(listener, app)
                .with_graceful_shutdown(shutdown)
                .await;
            accepting.abort();
            if let Err(e) = served {
                tracing::error!(error = %e, "web console stopped");
            }
        })
    }

    /// Serves `app` in the background until `shutdown` resolves.
    pub fn spawn(
        self,
        app: Router,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> tokio::task::JoinHandle<()> {
        let addr = self.listener.local_addr().ok();
        tokio::spawn(async move {
            tracing::info!(addr = ?addr, "web console serving");
            let served = axum::serve(self.listener, app)
                .with_graceful_shutdown(shutdown)
                .await;
            if let Err(e) = served {
                tracing::error!(error = %e, "web console stopped");
            }
        })
    }
}

/// Connections whose TLS handshake is done, for `axum::serve`.
struct TlsListener {
    rx: tokio::sync::mpsc::Receiver<(
        tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
        SocketAddr,
    )>,
    addr: Option<SocketAddr>,
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(c) => c,
            // The accepting task is gone: no connection comes any more.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.addr
            .ok_or_else(|| std::io::Error::other("the console listener has no address"))
    }
}

/// A page that could not be shown: an HTTP status and a one-line reason.
#[derive(Debug)]
pub(crate) struct ConsoleError {
    status: StatusCode,
    message: String,
}

impl ConsoleError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }

    fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }
}

/// Client input quoted for an error message: escaped like `{:?}`, cut to
/// 100 characters, and followed by its size when cut.
pub(crate) fn echo(input: &str) -> String {
    match input.char_indices().nth(100) {
        None => format!("{input:?}"),
        Some((end, _)) => format!("{:?}… ({} bytes)", &input[..end], input.len()),
    }
}

impl From<tonic::Status> for ConsoleError {
    fn from(s: tonic::Status) -> Self {
        use tonic::Code;
        let status = match s.code() {
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::InvalidArgument | Code::OutOfRange => StatusCode::BAD_REQUEST,
            Code::FailedPrecondition | Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self::new(status, s.message())
    }
}

impl IntoResponse for ConsoleError {
    fn into_response(self) -> Response {
        let title = self.status.canonical_reason().unwrap_or("error");
        let page = layout(
            title,
            html! {
                h1 { (self.status.as_u16()) " " (title) }
                p.error #error { (self.message) }
                @match self.status {
                    StatusCode::UNAUTHORIZED => p { a #sign-in href="/sign-in" { "Sign in with a token" } },
                    StatusCode::FORBIDDEN => p { "The broker refused this to the role you are signed in as. "
                        a href="/sign-in" { "Sign in with another token" } },
                    _ => {},
                }
                p { a href="/" { "Back to the topics" } }
            },
        );
        (self.status, page).into_response()
    }
}

/// What a handler returns.
type Page = Result<Html<String>, ConsoleError>;

const STYLE: &str = "
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;max-width:72em}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em}
table{border-collapse:collapse;margin:.5em 0}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:left;vertical-align:top}
th{background:#f3f3f3}td.n{text-align:right;font-variant-numeric:tabular-nums}
pre{background:#f6f6f6;padding:.5em;white-space:pre-wrap;word-break:break-all;max-width:70em}
nav{margin-bottom:1em;color:#555}.error{color:#a00}.warn{background:#fff4d6;padding:.5em}
form.inline{display:inline}button{cursor:pointer}
fieldset{margin:.8em 0;border:1px solid #ccc}textarea{width:100%;max-width:60em;font-family:monospace}
form.edit label{display:block;margin:.4em 0}
button.danger{background:#b22;color:#fff;border:0;padding:.4em 1em}
button.go{background:#263;color:#fff;border:0;padding:.4em 1em}
.charts{display:flex;flex-wrap:wrap;gap:2em}.legend span{display:inline-block;margin-right:1em}
.swatch{display:inline-block;width:.8em;height:.8em;margin-right:.3em}
";

/// The role the request's sign-in cookie names, if any.
fn signed_in() -> Option<String> {
    SIGNED_IN.try_with(Clone::clone).ok().flatten()
}

/// The page frame around `body`.
fn layout(title: &str, body: Markup) -> Html<String> {
    Html(
        html! {
            (DOCTYPE)
            html lang="en" {
                head {
                    meta charset="utf-8";
                    title { (title) " · Ricochet console" }
                    style { (maud::PreEscaped(STYLE)) }
                }
                body {
                    nav {
                        a href="/" { "Ricochet console" } " · " (title)
                        @if let Some(role) = signed_in() {
                            span #signed-in { " · signed in as " strong { (role) } " " }
                            form.inline method="post" action="/sign-out" {
                                button #sign-out type="submit" { "Sign out" }
                            }
                        }
                    }
                    (body)
                }
            }
        }
        .into_string(),
    )
}
