//! The web console's handlers over HTTP semantics, without a browser: the
//! router is called in-process (`tower::ServiceExt::oneshot`) against an
//! in-process broker. Hostile message text is shown as text, never markup;
//! unknown things are 404, malformed filters 400; and a change is made only
//! by a POST carrying the token its confirmation page issued, once. An edit
//! (fix and resend) is shown as a diff first, and a paced replay's job can
//! be cancelled behind a confirmation.

use crate::common;
use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use common::*;
use ricochet_policy::PolicySpec;
use ricochet_proto::admin_client::AdminClient;
use ricochet_proto::{SetPolicyRequest, SubscriptionType};
use ricochet_testkit::{InProcessBroker, now_ms};
use tower::ServiceExt;

const TOPIC: &str = "persistent://public/default/console-http";

pub(crate) async fn call(app: &Router, req: Request<Body>) -> (StatusCode, String) {
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

pub(crate) async fn get(app: &Router, uri: &str) -> (StatusCode, String) {
    call(app, Request::get(uri).body(Body::empty()).unwrap()).await
}

pub(crate) async fn post(app: &Router, form: &str) -> (StatusCode, String) {
    post_to(app, "/act", form).await
}

async fn post_to(app: &Router, uri: &str, form: &str) -> (StatusCode, String) {
    let req = Request::builder()
        .method(Method::POST)
        .uri(uri)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(form.to_owned()))
        .unwrap();
    call(app, req).await
}

pub(crate) fn q(s: &str) -> String {
    serde_urlencoded::to_string([("v", s)]).unwrap()[2..].to_owned()
}

/// The confirmation token in a confirmation page.
pub(crate) fn token_of(page: &str) -> String {
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
    let app = ricochet_broker::console::router(b.node.clone());
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
    let app = ricochet_broker::console::router(b.node.clone());
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
    let app = ricochet_broker::console::router(b.node.clone());
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
    let app = ricochet_broker::console::router(b.node.clone());
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
    let app = ricochet_broker::console::router(b.node.clone());
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
    // By the consumer's reason, with the policy's verdict beside it.
    let timeout = t.find(">timeout</a></td><td class=\"n\">2<");
    let schema = t.find(">schema</a></td><td class=\"n\">1<");
    assert!(
        timeout.is_some() && schema.is_some() && timeout < schema,
        "{t}"
    );
    assert!(
        t.contains("<td class=\"verdict\">terminated: timeout</td>"),
        "{t}"
    );
    let (_, page) = get(&app, &sub_uri("/dead-letters", "s", "&group=verdict")).await;
    assert!(groups(&page).contains(">terminated: schema<"), "{page}");
    // The subscription page: the same reasons, its type by name, and its
    // policy as a spec with the schedule it implies.
    let (_, page) = get(&app, &sub_uri("/subscription", "s", "")).await;
    let died = &page[page.find("Why messages died").expect("a reasons table")..];
    assert!(
        died.find(">timeout</a>") < died.find(">schema</a>"),
        "{died}"
    );
    assert!(!page.contains("SUBSCRIPTION_TYPE_"), "{page}");
    assert!(
        ["exclusive", "shared", "failover", "key_shared"]
            .iter()
            .any(|t| page.contains(&format!("<span id=\"sub-type\">{t}</span>"))),
        "{page}"
    );
    // No policy: what happens instead, and the fallback's schedule.
    assert!(page.contains("id=\"no-policy\""), "{page}");
    assert!(page.contains("reason: reconsume_later"), "{page}");
    let spec: PolicySpec = "delay-levels:levels=1s 2s 4s,start=1,max=3"
        .parse()
        .unwrap();
    let mut admin = AdminClient::new(channel(&b.url()).await);
    admin
        .set_policy(SetPolicyRequest {
            topic: TOPIC.into(),
            subscription: "s".into(),
            policy: Some((&spec).into()),
        })
        .await
        .unwrap();
    let (_, page) = get(&app, &sub_uri("/subscription", "s", "")).await;
    assert!(
        page.contains(&format!("<code id=\"policy-spec\">{spec}</code>")),
        "{page}"
    );
    let schedule = &page[page.find("id=\"policy-schedule\"").expect("a schedule")..];
    assert!(schedule.contains("attempt  delay"), "{schedule}");
    assert!(
        schedule.contains("dead-letter (attempt 4 exceeds max_reconsume_times 3)"),
        "{schedule}"
    );
    assert!(!page.contains("DelayLevelPolicyConfig"), "{page}");
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
    let app = ricochet_broker::console::router(b.node.clone());
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
    let app = ricochet_broker::console::router(open.node.clone());
    let req = Request::get("/")
        .header(header::HOST, "console.example:8080")
        .body(Body::empty())
        .unwrap();
    assert_eq!(call(&app, req).await.0, StatusCode::OK);
}

/// The id of the one dead letter of `sub` on the list page.
async fn only_dead_letter_id(app: &Router, sub: &str) -> String {
    let (_, list) = get(app, &sub_uri("/dead-letters", sub, "")).await;
    list.split("id=\"dl-")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .expect("a dead-letter row")
        .to_owned()
}

/// The edit form of dead letter `id` of `s`, with these fields, encoded.
fn edit_form(id: &str, fields: &[(&str, &str)]) -> String {
    let mut all = vec![("topic", TOPIC), ("sub", "s"), ("id", id)];
    all.extend_from_slice(fields);
    serde_urlencoded::to_string(all).unwrap()
}

/// The text of the element with `id` (its first `</td>`-ended cell).
fn cell<'a>(page: &'a str, id: &str) -> &'a str {
    let at = page
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no #{id} in:\n{page}"));
    &page[at..at + page[at..].find("</td>").unwrap()]
}

#[tokio::test]
async fn an_edit_is_shown_as_a_diff_then_replayed_into_this_subscription_only() {
    let b = InProcessBroker::start().await;
    let app = ricochet_broker::console::router(b.node.clone());
    // A second subscription on the same topic, which must not see the edit.
    let mut other = RawConsumer::simple(&b.url(), TOPIC, "other", SubscriptionType::Shared).await;
    other.flow(10).await;
    dead_letter_all(
        &b.url(),
        TOPIC,
        "s",
        &[Doomed {
            payload: b"{\"v\":1}",
            key: "old-key",
            properties: &[("schema", "v1"), ("junk", "x")],
            detail: "schema mismatch",
        }],
    )
    .await;
    assert!(other.next(WAIT).await.is_some(), "other got the original");
    let id = only_dead_letter_id(&app, "s").await;
    // The dead letter's page offers the form, with the payload and key.
    let (_, page) = get(&app, &sub_uri("/dead-letter", "s", &format!("&id={id}"))).await;
    assert!(page.contains("action=\"/confirm/edit\""), "{page}");
    assert!(page.contains("Never edited."), "{page}");

    // Nothing changed, a bad property line: 400, nothing held.
    let (status, same) = post_to(
        &app,
        "/confirm/edit",
        &edit_form(&id, &[("payload", "{\"v\":1}"), ("key", "old-key")]),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{same}");
    assert!(same.contains("changes nothing"), "{same}");
    let (status, bad) = post_to(
        &app,
        "/confirm/edit",
        &edit_form(&id, &[("set", "no-equals")]),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
    assert!(bad.contains("name=value"), "{bad}");

    // The diff: payload sizes, properties set (with what they were) and
    // removed, the key; which subscription receives it.
    let form = edit_form(
        &id,
        &[
            // As a browser sends a textarea: CRLF line ends.
            ("payload", "{\"v\":2,\r\n\"fixed\":true}"),
            ("set", "schema = v2\r\nadded=yes"),
            ("unset", "junk, absent"),
            ("key", "new-key"),
        ],
    );
    let (status, confirm) = post_to(&app, "/confirm/edit", &form).await;
    assert_eq!(status, StatusCode::OK, "{confirm}");
    assert!(
        cell(&confirm, "diff-payload").contains("7 bytes → 21 bytes"),
        "{confirm}"
    );
    let set = cell(&confirm, "diff-set");
    assert!(
        set.contains("<code>schema</code> = <code>v2</code> (was <code>v1</code>)")
            && set.contains("<code>added</code> = <code>yes</code> (new)"),
        "{set}"
    );
    let unset = cell(&confirm, "diff-unset");
    assert!(
        unset.contains("<code>junk</code> (was <code>x</code>)")
            && unset.contains("<code>absent</code> (not present"),
        "{unset}"
    );
    assert!(
        cell(&confirm, "diff-key").contains("<code>old-key</code> → <code>new-key</code>"),
        "{confirm}"
    );
    assert!(confirm.contains("id=\"plan-ids\">"), "{confirm}");
    assert!(
        confirm.contains("id=\"keep-count\" type=\"checkbox\" name=\"keep_count\" value=\"on\">"),
        "keeping the count is offered, unticked: {confirm}"
    );
    assert!(
        confirm.contains("value=\"retry\" checked") && confirm.contains("other included"),
        "retry tier by default, the topic named as reaching `other`: {confirm}"
    );
    assert_eq!(
        dead_letter_count(&b.url(), TOPIC, "s").await,
        1,
        "showing changes nothing"
    );
    let (status, done) = post(
        &app,
        &format!("token={}&mode=retry&at=&rate=", token_of(&confirm)),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert!(done.contains("Edited and replayed 1 of 1"), "{done}");
    assert!(done.contains("only s receives it"), "{done}");
    assert_eq!(dead_letter_count(&b.url(), TOPIC, "s").await, 0);

    // s receives the edited message (LF line ends); `other` nothing.
    let mut s = RawConsumer::simple(&b.url(), TOPIC, "s", SubscriptionType::Shared).await;
    s.flow(10).await;
    let m = s.next(WAIT).await.expect("the edited message");
    assert_eq!(text(&m), "{\"v\":2,\n\"fixed\":true}");
    assert_eq!(
        m.delivery_count, 0,
        "an edit is a new attempt: its count starts again"
    );
    assert_eq!(m.key, "new-key");
    assert_eq!(m.properties.get("schema").map(String::as_str), Some("v2"));
    assert_eq!(m.properties.get("added").map(String::as_str), Some("yes"));
    assert!(!m.properties.contains_key("junk"));
    assert!(
        other.next(QUIET).await.is_none(),
        "other sees nothing again"
    );

    // Dead again: its page shows the edit in its history.
    s.terminate(m.id.clone().unwrap(), "still broken", 1).await;
    assert_eq!(s.result(WAIT).await.unwrap().code, 0);
    let id = only_dead_letter_id(&app, "s").await;
    let (_, page) = get(&app, &sub_uri("/dead-letter", "s", &format!("&id={id}"))).await;
    let at = page.find("class=\"edits\"").expect("an edit history");
    let history = &page[at..at + page[at..].find("</table>").unwrap()];
    assert!(
        history.contains("anonymous")
            && history.contains("7 → 21 bytes")
            && history.contains("added, schema")
            && history.contains("<td>junk</td>")
            && history.contains("changed"),
        "{history}"
    );
}

#[tokio::test]
async fn hostile_text_in_an_edit_is_shown_as_text() {
    let b = InProcessBroker::start().await;
    let app = ricochet_broker::console::router(b.node.clone());
    dead_letter_all(
        &b.url(),
        TOPIC,
        "s",
        &[Doomed {
            payload: b"plain",
            key: "k",
            properties: &[(HOSTILE_PROP_KEY, "old")],
            detail: "bad",
        }],
    )
    .await;
    let id = only_dead_letter_id(&app, "s").await;
    let set = format!("{HOSTILE_PROP_KEY}={HOSTILE_PROP_VALUE}");
    let (status, confirm) = post_to(
        &app,
        "/confirm/edit",
        &edit_form(
            &id,
            &[
                ("payload", HOSTILE_PAYLOAD),
                ("set", &set),
                ("unset", HOSTILE_DETAIL),
                ("key", HOSTILE_KEY),
            ],
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{confirm}");
    for bad in MARKUP {
        assert!(!confirm.contains(bad), "{bad:?} as markup:\n{confirm}");
    }
    for shown in [
        "&lt;script&gt;alert('payload')&lt;/script&gt;",
        "&lt;i onmouseover=alert('key')&gt;k&lt;/i&gt;",
        "&lt;b&gt;prop&lt;/b&gt;",
        "&quot;&gt;&lt;img src=x onerror=alert('value')&gt;",
        "&lt;svg onload=alert('reason')&gt;",
    ] {
        assert!(confirm.contains(shown), "missing {shown:?}:\n{confirm}");
    }
    // Carried out (keeping the count, as ticked), the history names the
    // hostile property, as text.
    let (status, done) = post(&app, &format!("token={}&keep_count=on", token_of(&confirm))).await;
    assert_eq!(status, StatusCode::OK, "{done}");
    let mut s = RawConsumer::simple(&b.url(), TOPIC, "s", SubscriptionType::Shared).await;
    s.flow(10).await;
    let m = s.next(WAIT).await.expect("the edited message");
    assert_eq!(text(&m), HOSTILE_PAYLOAD);
    assert!(m.delivery_count > 0, "the count was kept: {m:?}");
    s.terminate(m.id.clone().unwrap(), "again", 1).await;
    assert_eq!(s.result(WAIT).await.unwrap().code, 0);
    let id = only_dead_letter_id(&app, "s").await;
    let (_, page) = get(&app, &sub_uri("/dead-letter", "s", &format!("&id={id}"))).await;
    assert!(page.contains("class=\"edits\""), "{page}");
    for bad in MARKUP {
        assert!(!page.contains(bad), "{bad:?} as markup:\n{page}");
    }
}

#[tokio::test]
async fn an_edit_is_made_only_by_a_post_with_its_token() {
    let b = InProcessBroker::start().await;
    let app = ricochet_broker::console::router(b.node.clone());
    dead_letter_all(
        &b.url(),
        TOPIC,
        "s",
        &[Doomed {
            payload: b"before",
            key: "k",
            properties: &[],
            detail: "bad",
        }],
    )
    .await;
    let id = only_dead_letter_id(&app, "s").await;
    let edit = edit_form(&id, &[("payload", "after")]);
    // The edit's fields posted straight to /act, without or with a made-up
    // token: refused.
    let (status, page) = post(&app, &edit).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{page}");
    let (status, page) = post(
        &app,
        &format!("{edit}&token=0123456789abcdef0123456789abcdef"),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{page}");
    // The confirmation step itself changes nothing, and a GET of it is no
    // way in either.
    let (status, confirm) = post_to(&app, "/confirm/edit", &edit).await;
    assert_eq!(status, StatusCode::OK, "{confirm}");
    let (status, _) = get(&app, &format!("/confirm/edit?{edit}")).await;
    assert_ne!(status, StatusCode::OK);
    assert_eq!(dead_letter_count(&b.url(), TOPIC, "s").await, 1);
    let token = token_of(&confirm);
    // Bad choices are refused before the token is used ...
    let (status, page) = post(&app, &format!("token={token}&mode=sideways")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{page}");
    let (status, page) = post(&app, &format!("token={token}&mode=topic&at=10m")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{page}");
    assert_eq!(dead_letter_count(&b.url(), TOPIC, "s").await, 1);
    // ... so the same confirmation still works, once: due in an hour.
    let (status, done) = post(&app, &format!("token={token}&mode=retry&at=1h")).await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert!(done.contains("Edited and replayed 1 of 1"), "{done}");
    assert_eq!(dead_letter_count(&b.url(), TOPIC, "s").await, 0);
    let stats = sub_stats(&b.url(), TOPIC, "s").await;
    assert_eq!(stats.scheduled_retries, 1, "due later: {stats:?}");
    assert!(
        stats.next_retry_due_ms > now_ms() + 50 * 60_000,
        "{stats:?}"
    );
    let (status, _) = post(&app, &format!("token={token}")).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn a_paced_replay_is_a_job_listed_on_the_subscription_and_cancelled_behind_a_confirmation() {
    let b = InProcessBroker::start().await;
    let app = ricochet_broker::console::router(b.node.clone());
    let payloads: Vec<String> = (0..40).map(|i| format!("m-{i}")).collect();
    let doomed: Vec<Doomed> = payloads
        .iter()
        .map(|p| Doomed {
            payload: p.as_bytes(),
            key: "",
            properties: &[],
            detail: "bad",
        })
        .collect();
    dead_letter_all(&b.url(), TOPIC, "s", &doomed).await;
    let (_, page) = get(&app, &sub_uri("/subscription", "s", "")).await;
    assert!(page.contains("No replay job running."), "{page}");
    let (_, confirm) = get(&app, &sub_uri("/confirm/replay", "s", "")).await;
    assert!(confirm.contains("Replay 40 dead letters?"), "{confirm}");
    let (status, done) = post(&app, &format!("token={}&rate=1", token_of(&confirm))).await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert!(done.contains("started for 40"), "{done}");
    // At one a second it runs for about 40 s: listed, with a cancel link.
    let (_, page) = get(&app, &sub_uri("/subscription", "s", "")).await;
    let at = page.find("id=\"jobs\"").expect("the jobs table");
    let jobs = &page[at..at + page[at..].find("</table>").unwrap()];
    assert!(jobs.contains(" of 40"), "{jobs}");
    let href = jobs
        .split("href=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .expect("a cancel link")
        .replace("&amp;", "&");
    assert!(href.starts_with("/confirm/cancel-job?"), "{href}");
    let (status, confirm) = get(&app, &href).await;
    assert_eq!(status, StatusCode::OK, "{confirm}");
    assert!(confirm.contains("Cancel replay job"), "{confirm}");
    let (status, done) = post(&app, &format!("token={}", token_of(&confirm))).await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert!(done.contains("Cancelled replay job"), "{done}");
    let (_, page) = get(&app, &sub_uri("/subscription", "s", "")).await;
    assert!(page.contains("No replay job running."), "{page}");
    // Stopped: most are still dead letters.
    let left = dead_letter_count(&b.url(), TOPIC, "s").await;
    assert!(
        (20..=40).contains(&left),
        "cancelled long before the end: {left} left"
    );
    // An unknown job: 404.
    let (status, _) = get(&app, &sub_uri("/confirm/cancel-job", "s", "&job=999999")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

/// The outage breaker on the subscription page, forced open and closed
/// behind a confirmation with a single-use token; a subscription without a
/// breaker is refused (400) and nothing changes.
#[tokio::test]
async fn the_breaker_is_shown_and_forced_behind_a_confirmation() {
    let b = InProcessBroker::start().await;
    let app = ricochet_broker::console::router(b.node.clone());
    let _c = RawConsumer::simple(&b.url(), TOPIC, "s", SubscriptionType::Shared).await;
    let (status, _) = get(&app, &sub_uri("/confirm/breaker-open", "s", "")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "no breaker yet");
    let spec: ricochet_policy::BreakerSpec = "breaker:failures=5,within=10s".parse().unwrap();
    AdminClient::new(channel(&b.url()).await)
        .set_policy(SetPolicyRequest {
            topic: TOPIC.into(),
            subscription: "s".into(),
            policy: Some(ricochet_proto::DeadLetterPolicyConfig {
                breaker: Some((&spec).into()),
                ..Default::default()
            }),
        })
        .await
        .unwrap();
    let text = |page: &str, id: &str| cell(page, id).rsplit('>').next().unwrap_or("").to_owned();
    let state = |page: &str| text(page, "breaker-state");
    let (_, page) = get(&app, &sub_uri("/subscription", "s", "")).await;
    assert_eq!(state(&page), "closed", "{page}");
    assert!(page.contains(&spec.to_string()), "{page}");
    assert!(page.contains("/confirm/breaker-open?"), "{page}");

    let (status, confirm) = get(&app, &sub_uri("/confirm/breaker-open", "s", "")).await;
    assert_eq!(status, StatusCode::OK, "{confirm}");
    assert!(confirm.contains("Force the breaker open?"), "{confirm}");
    // Showing the confirmation changed nothing.
    let (_, page) = get(&app, &sub_uri("/subscription", "s", "")).await;
    assert_eq!(state(&page), "closed");
    let token = token_of(&confirm);
    let (status, done) = post(&app, &format!("token={token}")).await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert!(done.contains("The breaker is open (forced open)"), "{done}");
    let (_, page) = get(&app, &sub_uri("/subscription", "s", "")).await;
    assert_eq!(state(&page), "open");
    // The token is spent.
    let (status, _) = post(&app, &format!("token={token}")).await;
    assert_eq!(status, StatusCode::FORBIDDEN);

    let (_, confirm) = get(&app, &sub_uri("/confirm/breaker-close", "s", "")).await;
    let (status, done) = post(&app, &format!("token={}", token_of(&confirm))).await;
    assert_eq!(status, StatusCode::OK, "{done}");
    let (_, page) = get(&app, &sub_uri("/subscription", "s", "")).await;
    assert_eq!(state(&page), "closed");
    assert_eq!(text(&page, "breaker-mode"), "forced closed");
}
