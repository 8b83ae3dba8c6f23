//! The web console: topics, subscriptions, retry queues and dead letters in a
//! browser, with discard and replay behind a confirmation page. Off unless
//! `console_listen` is set, and refused off loopback unless
//! `console_allow_remote` (it has no authentication of its own yet).
//!
//! How it is built, and why:
//! * Served by the broker itself with axum 0.8, which tonic already brings
//!   in, on its own listener, so the gRPC port stays gRPC only.
//! * Pages are rendered on the server with [`maud`]: its `html!` macro is
//!   checked at compile time and escapes every interpolated value by
//!   default, so a hostile payload, property or reason is text and never
//!   markup; nothing has to remember to escape. Askama would do the same
//!   from template files; maud keeps each page next to the code that feeds
//!   it. The pictures are inline SVG drawn by the same macro ([`charts`]),
//!   with `<title>` tooltips. No JavaScript at all and no front-end build:
//!   every page is a plain GET, every change a plain form POST, so the
//!   console works in any browser and is tested in a real one
//!   (`broker/tests/it/console_browser.rs`).
//! * Every read and action goes through [`api::ConsoleApi`], a thin wrapper
//!   over the in-process [`AdminService`] (the gRPC admin implementation
//!   itself, called directly, no loopback connection): same validation, same
//!   errors, same durability as the admin API.
//! * An action is two steps ([`actions`]): a confirmation page shows
//!   exactly what will happen (the subscription, the ids as the broker's
//!   dry run resolves them, what replay does to them, an edit's changes)
//!   and holds that plan server-side under a random single-use token; only
//!   a POST carrying the token carries it out, on exactly those ids.
//! * Loopback only (unless `console_allow_remote`) means the host name a
//!   request names too: another name is refused, so a web page that points
//!   its own name at 127.0.0.1 (DNS rebinding) cannot read a page or a token.
//!
//! Fix and resend (issue #14, item 2): a dead letter's page has an edit
//! form (payload as text or base64, properties set and removed, key); its
//! confirmation shows the change and who receives it, and the POST replays
//! through `ReplayDeadLetters` with the edit, which the broker records in
//! the message's edit history (shown on the dead letter's and message's
//! pages).

mod actions;
mod api;
mod breaker;
mod charts;
mod key_order;
mod pages;

use crate::node::Node;
use crate::service::AdminService;
use axum::Router;
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use maud::{DOCTYPE, Markup, html};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;

/// What every handler shares.
#[derive(Debug, Clone)]
struct ConsoleState {
    api: api::ConsoleApi,
    pending: Arc<actions::Pending>,
}

/// The console's routes over `node` (for serving, or for tests that call
/// the handlers without a socket).
pub fn router(node: Arc<Node>) -> Router {
    let allow_remote = node.core.config.console_allow_remote;
    let state = ConsoleState {
        api: api::ConsoleApi::new(AdminService::new(node)),
        pending: Arc::new(actions::Pending::default()),
    };
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
        .fallback(|| async { ConsoleError::not_found("no such page") })
        .with_state(state)
        .layer(axum::middleware::from_fn(
            move |req: axum::extract::Request, next: axum::middleware::Next| async move {
                if allow_remote || loopback_host(&req) {
                    next.run(req).await
                } else {
                    ConsoleError::new(
                        StatusCode::FORBIDDEN,
                        "this console answers only to a loopback host name (127.0.0.1, [::1], localhost)",
                    )
                    .into_response()
                }
            },
        ))
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

/// Binds `addr` for the console of `node`; [`ConsoleServer::spawn`] serves it.
pub async fn bind(node: Arc<Node>, addr: SocketAddr) -> crate::Result<ConsoleServer> {
    let listener = TcpListener::bind(addr).await?;
    Ok(ConsoleServer { node, listener })
}

/// A bound console listener.
#[derive(Debug)]
pub struct ConsoleServer {
    node: Arc<Node>,
    listener: TcpListener,
}

impl ConsoleServer {
    /// Where it listens.
    pub fn local_addr(&self) -> crate::Result<SocketAddr> {
        Ok(self.listener.local_addr()?)
    }

    /// Serves in the background until the broker starts shutting down.
    pub fn spawn(self) -> tokio::task::JoinHandle<()> {
        let token = self.node.core.shutdown.clone();
        let app = router(self.node);
        let addr = self.listener.local_addr().ok();
        tokio::spawn(async move {
            tracing::info!(addr = ?addr, "web console serving");
            let served = axum::serve(self.listener, app)
                .with_graceful_shutdown(token.cancelled_owned())
                .await;
            if let Err(e) = served {
                tracing::error!(error = %e, "web console stopped");
            }
        })
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

impl From<tonic::Status> for ConsoleError {
    fn from(s: tonic::Status) -> Self {
        use tonic::Code;
        let status = match s.code() {
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::InvalidArgument | Code::OutOfRange => StatusCode::BAD_REQUEST,
            Code::FailedPrecondition | Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
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
                p.error { (self.message) }
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
                    nav { a href="/" { "Ricochet console" } " · " (title) }
                    (body)
                }
            }
        }
        .into_string(),
    )
}
