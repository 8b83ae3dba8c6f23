//! The web console's handlers over HTTP semantics, without a browser: the
//! router is called in-process (`tower::ServiceExt::oneshot`) against an
//! in-process broker. Hostile message text is shown as text, never markup;
//! unknown things are 404, malformed filters 400; and a change is made only
//! by a POST carrying the token its confirmation page issued, once.

mod common;
use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use common::*;
use ricochet_testkit::InProcessBroker;
use tower::ServiceExt;

const TOPIC: &str = "persistent://public/default/console-http";

async fn call(app: &Router, req: Request<Body>) -> (StatusCode, String) {
    let resp = app.clone().oneshot(req).await.expect("the router answers");
    let status = resp.status();
    let body = axum::body::to_bytes(resp.into_body(), 16 << 20)
        .await
        .expect("a body");
    (
        status,
        String::from_utf8(body.to_vec()).expect("UTF-8 HTML"),
    )
}

async fn get(app: &Router, uri: &str) -> (StatusCode, String) {
    call(app, Request::get(uri).body(Body::empty()).unwrap()).await
}

async fn post(app: &Router, form: &str) -> (StatusCode, String) {
    let req = Request::builder()
        .method(Method::POST)
        .uri("/act")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(form.to_owned()))
        .unwrap();
    call(app, req).await
}

fn q(s: &str) -> String {
    serde_urlencoded::to_string([("v", s)]).unwrap()[2..].to_owned()
}

/// The confirmation token in a confirmation page.
fn token_of(page: &str) -> String {
    let at = page
        .find("name=\"token\" value=\"")
        .expect("a confirmation form")
        + "name=\"token\" value=\"".len();
    page[at..].split('"').next().unwrap().to_owned()
}

fn sub_uri(path: &str, sub: &str, extra: &str) -> String {
    format!("{path}?topic={}&sub={sub}{extra}", q(TOPIC))
}

const HOSTILE_PAYLOAD: &str = "<script>alert('payload')</script>";
const HOSTILE_KEY: &str = "<i onmouseover=alert('key')>k</i>";
const HOSTILE_PROP_KEY: &str = "<b>prop</b>";
const HOSTILE_PROP_VALUE: &str = "\"><img src=x onerror=alert('value')>";
const HOSTILE_DETAIL: &str = "<svg onload=alert('reason')>";

/// What must never reach a page unescaped.
const MARKUP: [&str; 5] = [
    "<script>alert",
    "<i onmouseover",
    "<b>prop",
    "<img src=x",
    "<svg onload",
];

#[tokio::test]
async fn hostile_message_text_is_shown_as_text_on_every_page() {
    let b = InProcessBroker::start().await;
    let app = ricochet_broker::console::router(b.core.clone());
    let origin = dead_letter_all(
        &b.url(),
        TOPIC,
        "s",
        &[Doomed {
            payload: HOSTILE_PAYLOAD.as_bytes(),
            key: HOSTILE_KEY,
            properties: &[(HOSTILE_PROP_KEY, HOSTILE_PROP_VALUE)],
            detail: HOSTILE_DETAIL,
        }],
    )
    .await;
    let (_, list) = get(&app, &sub_uri("/dead-letters", "s", "")).await;
    let id = list
        .split("id=\"dl-")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .expect("a dead-letter row")
        .to_owned();
    let pages = [
        "/".to_owned(),
        format!("/topic?topic={}", q(TOPIC)),
        sub_uri("/subscription", "s", ""),
        sub_uri("/dead-letters", "s", ""),
        sub_uri("/dead-letters", "s", &format!("&reason={}", q("<svg"))),
        sub_uri("/dead-letter", "s", &format!("&id={id}")),
        format!("/message?topic={}&id={}", q(TOPIC), origin[0].entry_id),
        sub_uri("/confirm/purge", "s", &format!("&ids={id}")),
        sub_uri("/confirm/replay", "s", ""),
    ];
    for uri in &pages {
        let (status, page) = get(&app, uri).await;
        assert_eq!(status, StatusCode::OK, "{uri}: {page}");
        for bad in MARKUP {
            assert!(
                !page.contains(bad),
                "{uri} shows {bad:?} as markup:\n{page}"
            );
        }
    }
    // ... and the text itself is there, escaped, where it belongs.
    let (_, one) = get(&app, &sub_uri("/dead-letter", "s", &format!("&id={id}"))).await;
    for shown in [
        "&lt;script&gt;alert('payload')&lt;/script&gt;",
        "&lt;i onmouseover=alert('key')&gt;k&lt;/i&gt;",
        "&lt;b&gt;prop&lt;/b&gt;",
        "&quot;&gt;&lt;img src=x onerror=alert('value')&gt;",
        "&lt;svg onload=alert('reason')&gt;",
    ] {
        assert!(one.contains(shown), "missing {shown:?}:\n{one}");
    }
}

#[tokio::test]
async fn unknown_things_are_404_and_bad_names_400() {
    let b = InProcessBroker::start().await;
    let app = ricochet_broker::console::router(b.core.clone());
    dead_letter_all(
        &b.url(),
        TOPIC,
        "s",
        &[Doomed {
            payload: b"x",
            key: "",
            properties: &[],
            detail: "d",
        }],
    )
    .await;
    let nope = q("persistent://public/default/no-such-topic");
    for uri in [
        format!("/topic?topic={nope}"),
        format!("/subscription?topic={nope}&sub=s"),
        sub_uri("/subscription", "no-such-sub", ""),
        sub_uri("/dead-letters", "no-such-sub", ""),
        sub_uri("/dead-letter", "s", "&id=999999"),
        format!("/message?topic={}&id=999999", q(TOPIC)),
        sub_uri("/confirm/explode", "s", ""),
        "/no-such-page".to_owned(),
    ] {
        let (status, page) = get(&app, &uri).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{uri}: {page}");
    }
    // Looking never creates: the unknown topic is still unknown.
    let (status, _) = get(&app, &format!("/topic?topic={nope}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, page) = get(&app, &format!("/topic?topic={}", q("bad name!"))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{page}");
}

#[tokio::test]
async fn malformed_filters_are_400_naming_the_field() {
    let b = InProcessBroker::start().await;
    let app = ricochet_broker::console::router(b.core.clone());
    dead_letter_all(
        &b.url(),
        TOPIC,
        "s",
        &[Doomed {
            payload: b"x",
            key: "",
            properties: &[],
            detail: "d",
        }],
    )
    .await;
    for (extra, field) in [
        ("&since=last+tuesday", "since"),
        ("&until=2026-13-45+25%3A00", "until"),
        ("&ids=1%2Cx", "ids"),
    ] {
        for path in ["/dead-letters", "/confirm/purge"] {
            let uri = sub_uri(path, "s", extra);
            let (status, page) = get(&app, &uri).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{uri}: {page}");
            assert!(page.contains(&format!("`{field}`")), "{uri}: {page}");
        }
    }
    let (status, page) = get(&app, &sub_uri("/dead-letters", "s", "&after=zz")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{page}");
    let (status, page) = get(&app, &sub_uri("/dead-letter", "s", "&id=abc")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{page}");
    let (status, page) = get(&app, "/dead-letters?sub=s").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{page}");
    assert!(page.contains("`topic` is required"), "{page}");
    // A good filter in each form is accepted.
    for extra in [
        "&since=2h",
        "&since=2020-01-01+00%3A00&until=2100-01-01T00%3A00%3A00",
        "&since=0&until=99999999999999",
        "&ids=1%2C+2+3",
    ] {
        let (status, page) = get(&app, &sub_uri("/dead-letters", "s", extra)).await;
        assert_eq!(status, StatusCode::OK, "{extra}: {page}");
    }
    assert_eq!(dead_letter_count(&b.url(), TOPIC, "s").await, 1);
}

#[tokio::test]
async fn a_change_needs_the_confirmation_token_and_does_exactly_what_it_showed_once() {
    let b = InProcessBroker::start().await;
    let app = ricochet_broker::console::router(b.core.clone());
    let doomed: Vec<Doomed> = ["keep-1", "keep-2", "drop-1", "drop-2"]
        .iter()
        .map(|p| Doomed {
            payload: p.as_bytes(),
            key: "",
            properties: &[],
            detail: if p.starts_with("drop") {
                "bad-input"
            } else {
                "flaky"
            },
        })
        .collect();
    dead_letter_all(&b.url(), TOPIC, "s", &doomed).await;
    assert_eq!(dead_letter_count(&b.url(), TOPIC, "s").await, 4);

    // No token, a made-up token, a GET: refused, nothing changes.
    let (status, page) = post(&app, "").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{page}");
    let (status, page) = post(&app, "token=").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{page}");
    let (status, page) = post(&app, "token=0123456789abcdef0123456789abcdef").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{page}");
    let (status, _) = call(&app, Request::get("/act").body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(dead_letter_count(&b.url(), TOPIC, "s").await, 4);

    // The confirmation page names exactly the matching ids.
    let (status, confirm) = get(&app, &sub_uri("/confirm/purge", "s", "&reason=bad-input")).await;
    assert_eq!(status, StatusCode::OK, "{confirm}");
    assert!(confirm.contains("Discard 2 dead letters?"), "{confirm}");
    assert_eq!(
        dead_letter_count(&b.url(), TOPIC, "s").await,
        4,
        "showing changes nothing"
    );
    let token = token_of(&confirm);
    // A new dead letter matching the filter after the page was shown is not
    // touched: the plan is the ids shown.
    dead_letter_all(
        &b.url(),
        TOPIC,
        "s",
        &[Doomed {
            payload: b"drop-3",
            key: "",
            properties: &[],
            detail: "bad-input",
        }],
    )
    .await;
    let (status, done) = post(&app, &format!("token={token}")).await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert!(done.contains("Discarded 2 of 2"), "{done}");
    assert_eq!(dead_letter_count(&b.url(), TOPIC, "s").await, 3);
    // Used once: the same token again does nothing.
    let (status, _) = post(&app, &format!("token={token}")).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(dead_letter_count(&b.url(), TOPIC, "s").await, 3);

    // Replay, confirmed: the dead letter leaves the tier and is published
    // again on the topic.
    let (_, confirm) = get(&app, &sub_uri("/confirm/replay", "s", "&reason=flaky")).await;
    assert!(confirm.contains("Replay 2 dead letters?"), "{confirm}");
    let (status, done) = post(&app, &format!("token={}", token_of(&confirm))).await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert!(done.contains("Replayed 2 of 2"), "{done}");
    assert_eq!(dead_letter_count(&b.url(), TOPIC, "s").await, 1);

    // A filter nothing matches offers no form at all.
    let (status, none) = get(&app, &sub_uri("/confirm/purge", "s", "&reason=no-such")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        none.contains("nothing to do") && !none.contains("name=\"token\""),
        "{none}"
    );
}

#[tokio::test]
async fn the_list_groups_by_reason_consumer_and_hour() {
    let b = InProcessBroker::start().await;
    let app = ricochet_broker::console::router(b.core.clone());
    let doomed: Vec<Doomed> = [("a", "timeout"), ("b", "timeout"), ("c", "schema")]
        .iter()
        .map(|(p, d)| Doomed {
            payload: p.as_bytes(),
            key: "",
            properties: &[],
            detail: d,
        })
        .collect();
    dead_letter_all(&b.url(), TOPIC, "s", &doomed).await;
    let groups = |page: &str| -> String {
        let at = page.find("id=\"groups\"").expect("a groups table");
        page[at..page[at..].find("</table>").unwrap() + at].to_owned()
    };
    let (status, page) = get(&app, &sub_uri("/dead-letters", "s", "&group=reason")).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let t = groups(&page);
    let timeout = t.find("terminated: timeout</a></td><td class=\"n\">2<");
    let schema = t.find("terminated: schema</a></td><td class=\"n\">1<");
    assert!(
        timeout.is_some() && schema.is_some() && timeout < schema,
        "{t}"
    );
    // Grouping applies the filter too.
    let (_, page) = get(
        &app,
        &sub_uri("/dead-letters", "s", "&group=reason&reason=schema"),
    )
    .await;
    assert!(!groups(&page).contains("timeout"), "{page}");
    let (_, page) = get(&app, &sub_uri("/dead-letters", "s", "&group=consumer")).await;
    assert!(
        groups(&page).contains("<td class=\"n\">3<"),
        "one consumer failed all three: {page}"
    );
    let (_, page) = get(&app, &sub_uri("/dead-letters", "s", "&group=hour")).await;
    let t = groups(&page);
    assert!(t.contains("since=") && t.contains("until="), "{t}");
    let (status, page) = get(&app, &sub_uri("/dead-letters", "s", "&group=colour")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{page}");
    assert!(page.contains("`group`"), "{page}");
}

/// A loopback-only console answers only to loopback host names, so a page
/// on a host name pointed at 127.0.0.1 (DNS rebinding) cannot read it.
#[tokio::test]
async fn a_loopback_console_refuses_other_host_names() {
    let b = InProcessBroker::start().await;
    let app = ricochet_broker::console::router(b.core.clone());
    for (host, expected) in [
        ("127.0.0.1:8080", StatusCode::OK),
        ("localhost:8080", StatusCode::OK),
        ("[::1]:8080", StatusCode::OK),
        ("127.0.0.1", StatusCode::OK),
        ("evil.example:8080", StatusCode::FORBIDDEN),
        ("evil.example", StatusCode::FORBIDDEN),
        ("10.0.0.7:8080", StatusCode::FORBIDDEN),
    ] {
        let req = Request::get("/")
            .header(header::HOST, host)
            .body(Body::empty())
            .unwrap();
        let (status, page) = call(&app, req).await;
        assert_eq!(status, expected, "{host}: {page}");
    }
    let req = Request::builder()
        .method(Method::POST)
        .uri("/act")
        .header(header::HOST, "evil.example")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from("token=x"))
        .unwrap();
    assert_eq!(call(&app, req).await.0, StatusCode::FORBIDDEN);
    // With console_allow_remote, any name is served.
    let open = InProcessBroker::start_with(|c| c.console_allow_remote = true).await;
    let app = ricochet_broker::console::router(open.core.clone());
    let req = Request::get("/")
        .header(header::HOST, "console.example:8080")
        .body(Body::empty())
        .unwrap();
    assert_eq!(call(&app, req).await.0, StatusCode::OK);
}
