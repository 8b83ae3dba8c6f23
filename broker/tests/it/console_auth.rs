//! The web console beside `[auth]`: every page and action is an admin
//! call carrying the signed-in token through the broker's authentication
//! and RPC table. Without a token every page is refused (401, the broker's
//! own message); sign-in keeps a token the broker accepts in an HttpOnly,
//! SameSite=Strict cookie and refuses one it does not; a role without the
//! dead-letters permission can neither purge nor replay (the broker's
//! PERMISSION_DENIED message on the page, nothing changed, a refusal in
//! the audit log) even with a confirmation another role opened; a role
//! holding it can, the audit lines name that role, and so does the edit
//! history of a dead letter it fixed and resent. The same console
//! over a gRPC channel to the broker (as a console in another process
//! would run) is checked alike.

use crate::common;
use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use common::*;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use ricochet_broker::auth::TokenClaims;
use ricochet_proto::admin_client::AdminClient;
use ricochet_proto::auth_client::AuthClient;
use ricochet_proto::{GrantRequest, ListDeadLettersRequest, SubscriptionType};
use ricochet_testkit::InProcessBroker;
use std::sync::{Arc, Mutex};
use tower::ServiceExt;

const SECRET: &[u8] = b"console-secret-0123456789";
pub(crate) const TOPIC: &str = "persistent://a/ns/console-auth";
const COOKIE: &str = ricochet_console::session::COOKIE;

fn token_signed(key: &[u8], sub: &str) -> String {
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 3600;
    jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &TokenClaims {
            sub: sub.into(),
            exp: Some(exp),
        },
        &EncodingKey::from_secret(key).unwrap(),
    )
    .unwrap()
}

pub(crate) fn token(sub: &str) -> String {
    token_signed(SECRET, sub)
}

fn bearer<T>(msg: T, sub: &str) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut().insert(
        "authorization",
        format!("Bearer {}", token(sub)).parse().unwrap(),
    );
    r
}

/// A broker with `[auth]` (superuser `root`) whose subscription `s` holds
/// three dead letters (made before auth was on: the raw test clients carry
/// no token), `operator` holding dead-letters and `viewer` only consume on
/// the namespace; with its web console on a free loopback port if
/// `console`. Returns the dead letters' ids.
pub(crate) async fn secured_with_dead_letters(console: bool) -> (InProcessBroker, Vec<u64>) {
    let plain = InProcessBroker::start().await;
    let doomed: Vec<Doomed> = ["one", "two", "three"]
        .iter()
        .map(|p| Doomed {
            payload: p.as_bytes(),
            key: "",
            properties: &[],
            detail: "broken",
        })
        .collect();
    dead_letter_all(&plain.url(), TOPIC, "s", &doomed).await;
    let dir = plain.shutdown().await;
    let secret = dir.path().join("secret.key");
    std::fs::write(&secret, SECRET).unwrap();
    let b = InProcessBroker::start_in(dir, |c| {
        c.auth.enabled = true;
        c.auth.token_secret_file = Some(secret);
        c.auth.superusers = vec!["root".into()];
        if console {
            c.console_listen = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
        }
    })
    .await;
    for (role, perm) in [("operator", "dead-letters"), ("viewer", "consume")] {
        AuthClient::new(channel(&b.url()).await)
            .grant_permission(bearer(
                GrantRequest {
                    role: role.into(),
                    resource: "a/ns".into(),
                    permissions: vec![perm.into()],
                },
                "root",
            ))
            .await
            .expect("root grants");
    }
    let ids = dead_letter_ids(&b).await;
    assert_eq!(ids.len(), 3);
    (b, ids)
}

/// The dead letters of `s`, as root sees them over gRPC.
pub(crate) async fn dead_letter_ids(b: &InProcessBroker) -> Vec<u64> {
    AdminClient::new(channel(&b.url()).await)
        .list_dead_letters(bearer(
            ListDeadLettersRequest {
                topic: TOPIC.into(),
                subscription: "s".into(),
                ..Default::default()
            },
            "root",
        ))
        .await
        .expect("root lists dead letters")
        .into_inner()
        .dead_letters
        .iter()
        .map(|d| d.message.as_ref().unwrap().id.as_ref().unwrap().entry_id)
        .collect()
}

/// Status, `Set-Cookie` (if any) and body of `req` sent with `token`'s
/// cookie (none: no cookie).
async fn send(
    app: &Router,
    mut req: Request<Body>,
    token: Option<&str>,
) -> (StatusCode, Option<String>, String) {
    if let Some(t) = token {
        req.headers_mut()
            .insert(header::COOKIE, format!("{COOKIE}={t}").parse().unwrap());
    }
    let resp = app.clone().oneshot(req).await.expect("the router answers");
    let status = resp.status();
    let set_cookie = resp
        .headers()
        .get(header::SET_COOKIE)
        .map(|v| v.to_str().unwrap().to_owned());
    let body = axum::body::to_bytes(resp.into_body(), 16 << 20)
        .await
        .unwrap();
    (
        status,
        set_cookie,
        String::from_utf8(body.to_vec()).unwrap(),
    )
}

async fn get(app: &Router, uri: &str, token: Option<&str>) -> (StatusCode, String) {
    let (status, _, body) = send(app, Request::get(uri).body(Body::empty()).unwrap(), token).await;
    (status, body)
}

fn form_post(uri: &str, form: &str) -> Request<Body> {
    Request::builder()
        .method(Method::POST)
        .uri(uri)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(form.to_owned()))
        .unwrap()
}

fn q(s: &str) -> String {
    serde_urlencoded::to_string([("v", s)]).unwrap()[2..].to_owned()
}

fn sub_uri(path: &str, extra: &str) -> String {
    format!("{path}?topic={}&sub=s{extra}", q(TOPIC))
}

/// The confirmation token in a confirmation page.
fn confirmation_of(page: &str) -> String {
    let at = page
        .find("name=\"token\" value=\"")
        .expect("a confirmation form")
        + "name=\"token\" value=\"".len();
    page[at..].split('"').next().unwrap().to_owned()
}

/// What a log subscriber wrote, for the audit lines.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// The audit lines written so far.
    fn audit(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .filter(|l| l.contains("ricochet::audit"))
            .map(str::to_owned)
            .collect()
    }

    /// Captures this thread's log (the test's runtime is this thread) until
    /// the guard drops.
    fn install(&self) -> tracing::subscriber::DefaultGuard {
        let writer = self.clone();
        tracing::subscriber::set_default(
            tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new("ricochet::audit=info"))
                .with_ansi(false)
                .with_writer(move || writer.clone())
                .finish(),
        )
    }
}

#[tokio::test]
async fn with_auth_a_console_request_without_a_token_is_refused_and_sign_in_checks_it() {
    let (b, ids) = secured_with_dead_letters(false).await;
    let app = ricochet_broker::console::router(b.node.clone());
    for uri in [
        "/".to_owned(),
        format!("/topic?topic={}", q(TOPIC)),
        sub_uri("/dead-letters", ""),
        sub_uri("/confirm/purge", &format!("&ids={}", ids[0])),
    ] {
        let (status, page) = get(&app, &uri, None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{uri}: {page}");
        // The broker's own UNAUTHENTICATED reason, and the way to sign in.
        assert!(page.contains("no credentials"), "{uri}: {page}");
        assert!(page.contains("href=\"/sign-in\""), "{uri}: {page}");
    }
    // A token signed with another key, or not a token at all: refused with
    // the reason, and no cookie is set.
    let forged = token_signed(b"another-key-0123456789", "root");
    let (status, cookie, page) = send(
        &app,
        form_post("/sign-in", &format!("token={forged}")),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{page}");
    assert!(page.contains("the broker refused the token"), "{page}");
    assert_eq!(cookie, None);
    let (status, cookie, page) = send(&app, form_post("/sign-in", "token=a%3Bb"), None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{page}");
    assert_eq!(cookie, None);
    // A forged cookie is no better than none.
    let (status, page) = get(&app, "/", Some(&forged)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{page}");
    // A good one is kept in an HttpOnly, SameSite=Strict cookie.
    let root = token("root");
    let (status, cookie, _) =
        send(&app, form_post("/sign-in", &format!("token={root}")), None).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let cookie = cookie.expect("a cookie is set");
    assert!(cookie.starts_with(&format!("{COOKIE}={root};")), "{cookie}");
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    assert!(
        !cookie.contains("Secure"),
        "served over plain HTTP: {cookie}"
    );
    // Through a TLS proxy that says so, it is Secure too.
    let mut proxied = form_post("/sign-in", &format!("token={root}"));
    proxied
        .headers_mut()
        .insert("x-forwarded-proto", "https".parse().unwrap());
    let (_, cookie, _) = send(&app, proxied, None).await;
    assert!(cookie.unwrap().contains("; Secure"));
    let (status, page) = get(&app, "/", Some(&root)).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains(TOPIC), "{page}");
    assert!(
        page.contains("signed in as <strong>root</strong>"),
        "{page}"
    );
    // A sign-in form posted from another site is refused before it runs.
    let mut cross = form_post("/sign-in", &format!("token={root}"));
    cross
        .headers_mut()
        .insert(header::ORIGIN, "http://evil.example".parse().unwrap());
    cross
        .headers_mut()
        .insert(header::HOST, "127.0.0.1:8080".parse().unwrap());
    let (status, cookie, _) = send(&app, cross, None).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(cookie, None);
    // Sign-out clears the cookie.
    let (status, cookie, _) = send(&app, form_post("/sign-out", ""), Some(&root)).await;
    assert_eq!(status, StatusCode::OK);
    assert!(cookie.unwrap().contains("Max-Age=0"));
    assert_eq!(dead_letter_ids(&b).await, ids, "nothing changed");
}

#[tokio::test]
async fn a_role_without_the_dead_letters_permission_cannot_purge_or_replay_from_the_console() {
    let log = Captured::default();
    let _guard = log.install();
    let (b, ids) = secured_with_dead_letters(false).await;
    let app = ricochet_broker::console::router(b.node.clone());
    let viewer = token("viewer");
    let operator = token("operator");
    let one = format!("&ids={}", ids[0]);

    // The viewer sees the topic, but not its dead letters, nor any
    // confirmation of a purge or a replay: the broker's message is shown.
    let (status, page) = get(&app, &format!("/topic?topic={}", q(TOPIC)), Some(&viewer)).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    // The subscription's counters, without its dead letters, and why.
    let (status, page) = get(&app, &sub_uri("/subscription", ""), Some(&viewer)).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("id=\"dead-letters-refused\""), "{page}");
    assert!(!page.contains("Why messages died"), "{page}");
    for path in ["/dead-letters", "/confirm/purge", "/confirm/replay"] {
        let uri = sub_uri(path, &one);
        let (status, page) = get(&app, &uri, Some(&viewer)).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{uri}: {page}");
        assert!(
            page.contains("role &quot;viewer&quot; lacks the dead-letters permission"),
            "{uri}: {page}"
        );
    }
    // A confirmation the operator opened, posted with the viewer's cookie:
    // the broker checks the action itself, and refuses it.
    for action in ["purge", "replay"] {
        let (status, confirm) = get(
            &app,
            &sub_uri(&format!("/confirm/{action}"), &one),
            Some(&operator),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{confirm}");
        let (status, _, page) = send(
            &app,
            form_post("/act", &format!("token={}", confirmation_of(&confirm))),
            Some(&viewer),
        )
        .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{action}: {page}");
        assert!(
            page.contains("role &quot;viewer&quot; lacks the dead-letters permission"),
            "{action}: {page}"
        );
    }
    assert_eq!(dead_letter_ids(&b).await, ids, "nothing changed");
    let audit = log.audit();
    for method in ["Admin/PurgeDeadLetters", "Admin/ReplayDeadLetters"] {
        assert!(
            audit.iter().any(|l| l.contains("refused")
                && l.contains("role=\"viewer\"")
                && l.contains(method)),
            "no refusal of {method} in the audit log:\n{}",
            audit.join("\n")
        );
    }
    // The operator's confirmations were dry runs: nothing purged or replayed.
    assert!(
        !audit
            .iter()
            .any(|l| l.contains("purged=1") || l.contains("replayed=1")),
        "{}",
        audit.join("\n")
    );
}

#[tokio::test]
async fn a_role_holding_the_dead_letters_permission_purges_and_replays_under_its_name() {
    let log = Captured::default();
    let _guard = log.install();
    let (b, ids) = secured_with_dead_letters(false).await;
    let app = ricochet_broker::console::router(b.node.clone());
    let operator = token("operator");
    let (_, page) = get(&app, &sub_uri("/dead-letters", ""), Some(&operator)).await;
    assert!(page.contains("3 dead letters match"), "{page}");

    let (_, confirm) = get(
        &app,
        &sub_uri("/confirm/replay", &format!("&ids={}", ids[0])),
        Some(&operator),
    )
    .await;
    let form = format!("token={}", confirmation_of(&confirm));
    let (status, _, done) = send(&app, form_post("/act", &form), Some(&operator)).await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert!(done.contains("Replayed 1 of 1"), "{done}");

    let (_, confirm) = get(
        &app,
        &sub_uri("/confirm/purge", &format!("&ids={}", ids[1])),
        Some(&operator),
    )
    .await;
    let form = format!("token={}", confirmation_of(&confirm));
    let (status, _, done) = send(&app, form_post("/act", &form), Some(&operator)).await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert!(done.contains("Discarded 1 of 1"), "{done}");

    assert_eq!(dead_letter_ids(&b).await, vec![ids[2]]);

    // Fix and resend: the edit is recorded under the signed-in role (seen
    // once the message dies again, on a restart without auth: the raw test
    // consumer carries no token).
    let edit = serde_urlencoded::to_string([
        ("topic", TOPIC),
        ("sub", "s"),
        ("id", &ids[2].to_string()),
        ("payload", "fixed"),
    ])
    .unwrap();
    let (status, _, confirm) = send(&app, form_post("/confirm/edit", &edit), Some(&operator)).await;
    assert_eq!(status, StatusCode::OK, "{confirm}");
    let form = format!("token={}", confirmation_of(&confirm));
    let (status, _, done) = send(&app, form_post("/act", &form), Some(&operator)).await;
    assert!(
        done.contains("Edited and replayed 1 of 1"),
        "{status}: {done}"
    );
    drop(app);
    let plain = InProcessBroker::start_in(b.shutdown().await, |_| {}).await;
    let mut c = RawConsumer::simple(&plain.url(), TOPIC, "s", SubscriptionType::Shared).await;
    c.flow(10).await;
    // The one replayed earlier, and the fixed one.
    let got = c.take(2, WAIT).await;
    let m = got
        .into_iter()
        .find(|m| m.payload == b"fixed")
        .expect("the fixed message");
    c.terminate(m.id.unwrap(), "still broken", 1).await;
    assert_eq!(c.result(WAIT).await.unwrap().code, 0);
    let dead = AdminClient::new(channel(&plain.url()).await)
        .list_dead_letters(ListDeadLettersRequest {
            topic: TOPIC.into(),
            subscription: "s".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let by: Vec<&str> = dead
        .dead_letters
        .iter()
        .flat_map(|d| &d.edits)
        .map(|e| e.by.as_str())
        .collect();
    assert_eq!(by, ["operator"], "{dead:?}");
    let audit = log.audit();
    for (action, what) in [
        ("replay-dead-letters", "replayed=1"),
        ("purge-dead-letters", "purged=1"),
    ] {
        assert!(
            audit
                .iter()
                .any(|l| l.contains(&format!("action=\"{action}\""))
                    && l.contains("role=\"operator\"")
                    && l.contains(what)),
            "no {action} by operator in the audit log:\n{}",
            audit.join("\n")
        );
    }
}

/// The console is generic over the service answering the admin API: over
/// a gRPC channel to the broker (a console in another process) the same
/// pages are refused, signed in and permitted by the broker alike.
#[tokio::test]
async fn over_a_grpc_channel_the_console_is_checked_by_the_broker_alike() {
    let (b, ids) = secured_with_dead_letters(false).await;
    let app = ricochet_console::router(channel(&b.url()).await, Default::default());
    let (status, page) = get(&app, "/", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{page}");
    let viewer = token("viewer");
    let (status, page) = get(&app, &sub_uri("/dead-letters", ""), Some(&viewer)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{page}");
    let operator = token("operator");
    let (_, confirm) = get(
        &app,
        &sub_uri("/confirm/purge", &format!("&ids={}", ids[0])),
        Some(&operator),
    )
    .await;
    let form = format!("token={}", confirmation_of(&confirm));
    let (status, _, done) = send(&app, form_post("/act", &form), Some(&operator)).await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert!(done.contains("Discarded 1 of 1"), "{done}");
    assert_eq!(dead_letter_ids(&b).await, ids[1..].to_vec());
}

/// Without `[auth]` pages need no sign-in, and a token offered anyway is
/// not kept.
#[tokio::test]
async fn without_auth_no_sign_in_is_needed_and_none_is_kept() {
    let b = InProcessBroker::start().await;
    let app = ricochet_broker::console::router(b.node.clone());
    let (status, page) = get(&app, "/", None).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let (status, cookie, page) = send(
        &app,
        form_post("/sign-in", &format!("token={}", token("root"))),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("No sign-in needed"), "{page}");
    assert_eq!(cookie, None);
}
