//! The web console in a real browser: Debian's `chromium`, driven through
//! `chromedriver` with fantoccini, against an in-process broker serving its
//! console on loopback. A user finds why messages died, replays one, fixes
//! another (payload and a property) and resends it into its subscription
//! only, and discards the rest by clicking through the confirmation pages;
//! the broker's state is then checked through the admin API and consumers
//! of that subscription and of a second one on the same topic, and the
//! fixed message, dead again, shows its edit in its history.
//!
//! Without a `chromedriver` (on `PATH`, or named by `CHROMEDRIVER`) the test
//! says so loudly and passes, unless `RICOCHET_REQUIRE_BROWSER=1` (as in
//! `.ci/run`), which makes a missing browser a failure. With
//! `RICOCHET_CONSOLE_SCREENSHOTS=DIR` it also saves the subscription page
//! the dead-letter list and the edit confirmation as
//! `DIR/console-subscription.png`, `DIR/console-dead-letters.png` and
//! `DIR/console-edit-confirm.png` (the book's pictures: `DIR=docs/src/images`).

use crate::common;
use common::*;
use fantoccini::{Client, ClientBuilder, Locator};
use ricochet_proto::*;
use ricochet_testkit::InProcessBroker;
use std::path::PathBuf;
use std::time::{Duration, Instant};

const TOPIC: &str = "persistent://public/default/orders";
/// Generous: the machine running the tests may be busy.
const BROWSER_WAIT: Duration = Duration::from_secs(60);

/// `chromedriver`'s path, if there is one.
fn find_chromedriver() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("CHROMEDRIVER") {
        return Some(PathBuf::from(p));
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join("chromedriver"))
        .find(|p| p.is_file())
}

/// The Chromium binary chromedriver should start (Debian's by default).
fn chromium() -> String {
    std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".to_owned())
}

/// A chromedriver child process, killed (by its pid) when dropped.
struct Driver {
    child: tokio::process::Child,
    url: String,
}

impl Driver {
    async fn start(path: &PathBuf) -> Self {
        let addr = ricochet_testkit::free_addr();
        let child = tokio::process::Command::new(path)
            .arg(format!("--port={}", addr.port()))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("chromedriver starts");
        let deadline = Instant::now() + BROWSER_WAIT;
        while tokio::net::TcpStream::connect(addr).await.is_err() {
            assert!(
                Instant::now() < deadline,
                "chromedriver did not listen on {addr}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Self {
            child,
            url: format!("http://{addr}"),
        }
    }

    /// A headless Chromium session with the flags that work on this
    /// machine's closed network, on a new empty profile.
    async fn session(&self, profile: &std::path::Path) -> Client {
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            "--window-size=1280,1100",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain([format!("--user-data-dir={}", profile.display())])
        .collect::<Vec<_>>();
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            serde_json::json!({ "binary": chromium(), "args": args }),
        );
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        ClientBuilder::new(connector)
            .capabilities(caps)
            .connect(&self.url)
            .await
            .expect("a Chromium session")
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// Waits until the element at `css` shows `expected` (page loads after a
/// click are not awaited by WebDriver).
async fn wait_text(c: &Client, css: &str, expected: &str) {
    let deadline = Instant::now() + BROWSER_WAIT;
    let mut last = String::new();
    while Instant::now() < deadline {
        if let Ok(e) = c.find(Locator::Css(css)).await
            && let Ok(t) = e.text().await
        {
            if t.trim() == expected {
                return;
            }
            last = t;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "{css} never showed {expected:?} (last: {last:?}) on {:?}",
        c.current_url().await
    );
}

async fn click(c: &Client, css: &str) {
    c.wait()
        .at_most(BROWSER_WAIT)
        .for_element(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("no {css}: {e}"))
        .click()
        .await
        .unwrap_or_else(|e| panic!("cannot click {css}: {e}"));
}

/// Saves a screenshot when `RICOCHET_CONSOLE_SCREENSHOTS` names a directory;
/// either way checks the browser rendered a PNG.
async fn screenshot(c: &Client, name: &str) {
    let png = c.screenshot().await.expect("a screenshot");
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    if let Some(dir) = std::env::var_os("RICOCHET_CONSOLE_SCREENSHOTS") {
        let path = PathBuf::from(dir).join(name);
        std::fs::write(&path, &png).expect("write the screenshot");
        eprintln!("saved {}", path.display());
    }
}

/// `chromedriver`'s path; `None` (said loudly) when there is none and
/// `RICOCHET_REQUIRE_BROWSER` is not `1` (with it, a missing browser fails).
fn chromedriver_or_skip() -> Option<PathBuf> {
    let found = find_chromedriver();
    if found.is_none() {
        let msg = "\n\n######## SKIPPED: console_browser needs chromedriver (Debian: \
                   apt-get install chromium chromium-driver), none found on PATH or in \
                   CHROMEDRIVER ########\n";
        if std::env::var("RICOCHET_REQUIRE_BROWSER").as_deref() == Ok("1") {
            panic!("{msg}RICOCHET_REQUIRE_BROWSER=1: a missing browser is a failure");
        }
        eprintln!("{msg}");
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn find_why_messages_died_replay_one_and_discard_the_rest() {
    let Some(chromedriver) = chromedriver_or_skip() else {
        return;
    };
    let b = InProcessBroker::start_with_console().await;
    let url = b.url();
    let console = b.console_url();
    // A second subscription on the same topic: it must not see the fix.
    let mut audit = RawConsumer::simple(&url, TOPIC, "audit", SubscriptionType::Shared).await;
    audit.flow(100).await;

    // Dead letters of `billing`: one worth sending again, three to drop.
    let doomed = [
        ("order-17: fixed upstream", "payment-gateway timeout"),
        ("order-18", "schema: missing field `amount`"),
        ("order-19", "schema: missing field `amount`"),
        ("order-20", "schema: unknown currency XXX"),
    ];
    let doomed: Vec<Doomed> = doomed
        .iter()
        .map(|(payload, detail)| Doomed {
            payload: payload.as_bytes(),
            key: "customer-7",
            properties: &[("source", "web-shop")],
            detail,
        })
        .collect();
    dead_letter_all(&url, TOPIC, "billing", &doomed).await;
    // And three scheduled retries, due in 30 s, about 7 minutes and 80 minutes.
    let mut retrying = RawConsumer::simple(&url, TOPIC, "billing", SubscriptionType::Shared).await;
    retrying.flow(100).await;
    let mut p = RawProducer::open(&url, TOPIC, "").await.unwrap();
    p.send(&["later-1", "later-2", "later-3"]).await;
    let later = retrying.take(3, WAIT).await;
    for (i, (m, delay)) in later.iter().zip([30_000, 400_000, 5_000_000]).enumerate() {
        retrying
            .reconsume_later(
                m.id.clone().unwrap(),
                reconsume_later::Delay::DelayMs(delay),
                100 + i as u64,
            )
            .await;
        assert_eq!(retrying.result(WAIT).await.unwrap().code, 0);
    }
    drop(retrying);
    assert_eq!(dead_letter_count(&url, TOPIC, "billing").await, 4);
    // `audit` had all seven once, and acked them.
    let seen = audit.take(7, WAIT).await;
    assert_eq!(seen.len(), 7);
    audit
        .ack(seen.iter().map(|m| m.id.clone().unwrap()).collect(), 1)
        .await;
    assert_eq!(audit.result(WAIT).await.unwrap().code, 0);

    let driver = Driver::start(&chromedriver).await;
    let profile = tempfile::tempdir().unwrap();
    let c = driver.session(profile.path()).await;

    // Topics → the subscription, whose counters and pictures show.
    c.goto(&format!("{console}/")).await.unwrap();
    click(&c, "table.subscriptions a[href*='sub=billing']").await;
    wait_text(&c, "#dead", "4").await;
    wait_text(&c, "#retries", "3").await;
    c.find(Locator::Css("svg#retry-schedule"))
        .await
        .expect("the retry picture");
    c.find(Locator::Css("svg#dlq-inflow"))
        .await
        .expect("the inflow picture");
    screenshot(&c, "console-subscription.png").await;

    // Why they died: the reasons table links to the filtered list.
    click(&c, "table.reasons a[href*='reason=schema%3A+missing']").await;
    wait_text(&c, "#matching", "2 dead letters match.").await;
    // The filter form, typed into: everything with "schema" in its reason.
    let reason = c.find(Locator::Css("input[name=reason]")).await.unwrap();
    reason.clear().await.unwrap();
    reason.send_keys("schema").await.unwrap();
    click(&c, "form.filters button[type=submit]").await;
    wait_text(&c, "#matching", "3 dead letters match.").await;
    // Cleared: all four, and the one to keep, by its row; counted by reason.
    click(&c, "form.filters a").await;
    wait_text(&c, "#matching", "4 dead letters match.").await;
    click(&c, "select[name=group] option[value=reason]").await;
    click(&c, "form.filters button[type=submit]").await;
    c.wait()
        .at_most(BROWSER_WAIT)
        .for_element(Locator::Css("table#groups"))
        .await
        .expect("the counts by reason");
    let groups = c
        .find(Locator::Css("table#groups"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        groups.contains("schema: missing field `amount` 2"),
        "{groups}"
    );
    screenshot(&c, "console-dead-letters.png").await;
    let rows = c
        .find_all(Locator::Css("table.dead-letters tr[id^=dl-]"))
        .await
        .unwrap();
    let mut keep_row = None;
    for row in rows {
        if row.text().await.unwrap().contains("payment-gateway") {
            keep_row = Some(row);
        }
    }
    let keep_row = keep_row.expect("the payment-gateway dead letter is listed");
    let keep_id = keep_row.attr("id").await.unwrap().unwrap()["dl-".len()..].to_owned();

    // Its page: every attempt and the properties.
    keep_row
        .find(Locator::Css("a[href^='/dead-letter?']"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_text(&c, "#reason", "terminated: payment-gateway timeout").await;
    let attempts = c
        .find(Locator::Css("table.attempts"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        attempts.contains("terminate") && attempts.contains("payment-gateway timeout"),
        "{attempts}"
    );
    let props = c
        .find(Locator::Css("table.properties"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        props.contains("source") && props.contains("web-shop"),
        "{props}"
    );

    // Replay it: the confirmation names exactly this id and subscription.
    click(&c, "a.replay").await;
    wait_text(&c, "#plan-ids", &keep_id).await;
    let plan = c
        .find(Locator::Css("#plan"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(plan.contains("billing") && plan.contains(TOPIC), "{plan}");
    assert_eq!(
        dead_letter_count(&url, TOPIC, "billing").await,
        4,
        "nothing happens before the POST"
    );
    click(&c, "#confirm").await;
    wait_text(&c, "#done", "Replayed 1 of 1").await;

    // Fix and resend order-20: its currency, in the payload and a property.
    c.goto(&format!(
        "{console}/dead-letters?topic={}&sub=billing",
        encode(TOPIC)
    ))
    .await
    .unwrap();
    wait_text(&c, "#matching", "3 dead letters match.").await;
    let fix_row = row_with(&c, "order-20").await;
    let fix_id = fix_row.attr("id").await.unwrap().unwrap()["dl-".len()..].to_owned();
    fix_row
        .find(Locator::Css("a[href^='/dead-letter?']"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_text(&c, "#reason", "terminated: schema: unknown currency XXX").await;
    wait_text(&c, "p.no-edits", "Never edited.").await;
    let payload = c.find(Locator::Css("#edit-payload")).await.unwrap();
    assert_eq!(
        payload.prop("value").await.unwrap().as_deref(),
        Some("order-20")
    );
    payload.clear().await.unwrap();
    payload.send_keys("order-20 currency=EUR").await.unwrap();
    c.find(Locator::Css("#edit-set"))
        .await
        .unwrap()
        .send_keys("currency=EUR")
        .await
        .unwrap();
    click(&c, "#edit-submit").await;
    // The confirmation: exactly what changes, and who receives it.
    wait_text(&c, "#diff-payload", "changed: 8 bytes → 21 bytes").await;
    wait_text(&c, "#diff-set", "currency = EUR (new)").await;
    wait_text(&c, "#diff-key", "unchanged (customer-7)").await;
    wait_text(&c, "#plan-ids", &fix_id).await;
    let options = c
        .find(Locator::Css("#replay-options"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        options.contains("Only billing") && options.contains("audit included"),
        "{options}"
    );
    screenshot(&c, "console-edit-confirm.png").await;
    assert_eq!(
        dead_letter_count(&url, TOPIC, "billing").await,
        3,
        "nothing happens before the POST"
    );
    click(&c, "#confirm").await;
    wait_text(&c, "#done", "Edited and replayed 1 of 1").await;

    // Discard the rest: "Discard all matching" on the unfiltered list.
    c.goto(&format!(
        "{console}/dead-letters?topic={}&sub=billing",
        encode(TOPIC)
    ))
    .await
    .unwrap();
    wait_text(&c, "#matching", "2 dead letters match.").await;
    click(&c, "#purge-all").await;
    let plan_ids = c
        .wait()
        .at_most(BROWSER_WAIT)
        .for_element(Locator::Css("#plan-ids"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(plan_ids.split(", ").count(), 2, "{plan_ids}");
    assert!(
        !plan_ids.split(", ").any(|id| id == keep_id || id == fix_id),
        "{plan_ids}"
    );
    click(&c, "#confirm").await;
    wait_text(&c, "#done", "Discarded 2 of 2").await;

    // The broker agrees: no dead letters left; billing receives the
    // replayed message unchanged and the fixed one edited (the retry due
    // in 30 s may come too on a slow machine, and is not counted).
    assert_eq!(dead_letter_count(&url, TOPIC, "billing").await, 0);
    let mut again = RawConsumer::simple(&url, TOPIC, "billing", SubscriptionType::Shared).await;
    again.flow(10).await;
    let mut got = Vec::new();
    while let Some(m) = again.next(if got.len() < 2 { WAIT } else { QUIET }).await {
        if !text(&m).starts_with("later-") {
            got.push(m);
        }
    }
    got.sort_by_key(text);
    let texts: Vec<String> = got.iter().map(text).collect();
    assert_eq!(
        texts,
        ["order-17: fixed upstream", "order-20 currency=EUR"],
        "the replayed and the fixed one, once each"
    );
    for m in &got {
        assert_eq!(m.key, "customer-7");
        assert_eq!(
            m.properties.get("source").map(String::as_str),
            Some("web-shop")
        );
    }
    assert_eq!(got[0].properties.get("currency"), None);
    assert_eq!(
        got[1].properties.get("currency").map(String::as_str),
        Some("EUR")
    );
    // The other subscription of the topic saw neither again.
    assert!(audit.next(QUIET).await.is_none(), "audit sees nothing new");

    // Still broken: dead again, its page shows the edit in its history.
    again
        .terminate(got[1].id.clone().unwrap(), "schema: EUR not enabled", 1)
        .await;
    assert_eq!(again.result(WAIT).await.unwrap().code, 0);
    c.goto(&format!(
        "{console}/dead-letters?topic={}&sub=billing",
        encode(TOPIC)
    ))
    .await
    .unwrap();
    wait_text(&c, "#matching", "1 dead letters match.").await;
    row_with(&c, "order-20 currency=EUR")
        .await
        .find(Locator::Css("a[href^='/dead-letter?']"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_text(&c, "#reason", "terminated: schema: EUR not enabled").await;
    let history = c
        .find(Locator::Css("table.edits"))
        .await
        .expect("an edit history")
        .text()
        .await
        .unwrap();
    assert!(
        history.contains("anonymous")
            && history.contains("8 → 21 bytes")
            && history.contains("currency"),
        "{history}"
    );
    c.close().await.unwrap();
}

/// With `[auth]`: a page opened without signing in shows the broker's
/// refusal and a way to sign in; the sign-in form keeps the token in a
/// cookie no script can read; the signed-in role discards a dead letter
/// through the confirmation page; signing out makes pages refused again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sign_in_with_a_token_act_and_sign_out() {
    let Some(chromedriver) = chromedriver_or_skip() else {
        return;
    };
    let (b, ids) = crate::console_auth::secured_with_dead_letters(true).await;
    let console = b.console_url();
    let driver = Driver::start(&chromedriver).await;
    let profile = tempfile::tempdir().unwrap();
    let c = driver.session(profile.path()).await;

    c.goto(&format!("{console}/")).await.unwrap();
    wait_text(&c, "h1", "401 Unauthorized").await;
    click(&c, "#sign-in").await;
    let token = crate::console_auth::token("operator");
    c.wait()
        .at_most(BROWSER_WAIT)
        .for_element(Locator::Css("#token"))
        .await
        .unwrap()
        .send_keys(&token)
        .await
        .unwrap();
    click(&c, "#sign-in-submit").await;
    wait_text(&c, "#signed-in", "· signed in as operator").await;
    let script_sees = c.execute("return document.cookie", vec![]).await.unwrap();
    assert_eq!(script_sees, serde_json::json!(""), "the cookie is HttpOnly");

    c.goto(&format!(
        "{console}/dead-letters?topic={}&sub=s",
        encode(crate::console_auth::TOPIC)
    ))
    .await
    .unwrap();
    wait_text(&c, "#matching", "3 dead letters match.").await;
    click(&c, &format!("#dl-{} a.purge", ids[0])).await;
    click(&c, "#confirm").await;
    wait_text(&c, "#done", "Discarded 1 of 1").await;
    assert_eq!(
        crate::console_auth::dead_letter_ids(&b).await,
        ids[1..].to_vec()
    );

    click(&c, "#sign-out").await;
    wait_text(&c, "#signed-out", "Signed out").await;
    c.goto(&format!("{console}/")).await.unwrap();
    wait_text(&c, "h1", "401 Unauthorized").await;
    c.close().await.unwrap();
}

/// The dead-letter list's row whose text contains `needle`.
async fn row_with(c: &Client, needle: &str) -> fantoccini::elements::Element {
    let rows = c
        .find_all(Locator::Css("table.dead-letters tr[id^=dl-]"))
        .await
        .unwrap();
    for row in rows {
        if row.text().await.unwrap().contains(needle) {
            return row;
        }
    }
    panic!("no dead letter with {needle:?} listed");
}

fn encode(s: &str) -> String {
    serde_urlencoded::to_string([("v", s)]).unwrap()[2..].to_owned()
}
