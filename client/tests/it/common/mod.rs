//! Shared test helpers: a broker on a temp dir, a client, unique names.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use ricochet_broker::BrokerConfig;
use ricochet_client::{Client, Consumer, Message};
use ricochet_testkit::InProcessBroker;

pub struct Env {
    pub broker: InProcessBroker,
    pub client: Client,
}

pub async fn start() -> Env {
    start_with(|_| {}).await
}

pub async fn start_with(f: impl FnOnce(&mut BrokerConfig)) -> Env {
    let broker = InProcessBroker::start_with(f).await;
    let client = client(&broker.url()).await;
    Env { broker, client }
}

/// A client of the broker at `url`: 5 s request timeout, quick reconnects.
pub async fn client(url: &str) -> Client {
    Client::builder(url)
        .request_timeout(Duration::from_secs(5))
        .reconnect_backoff(Duration::from_millis(20), Duration::from_millis(200))
        .connect()
        .await
        .expect("client connects")
}

pub fn topic(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!("{prefix}-{}", N.fetch_add(1, Ordering::Relaxed))
}

/// Receives one message or panics after `within`.
pub async fn recv(c: &mut Consumer, within: Duration) -> Message {
    tokio::time::timeout(within, c.receive())
        .await
        .expect("a message in time")
        .expect("receive ok")
}

/// Asserts nothing arrives for `d`.
pub async fn assert_quiet(c: &mut Consumer, d: Duration) {
    if let Ok(r) = tokio::time::timeout(d, c.receive()).await {
        panic!(
            "unexpected delivery: {:?}",
            r.map(|m| (m.id().clone(), m.delivery_count()))
        );
    }
}

pub fn text(m: &Message) -> String {
    String::from_utf8_lossy(m.payload()).into_owned()
}

/// Polls `read` every 200 ms until the policy in force it answers has the
/// figure `want` (`value` gives the answer's figure and where the policy
/// in force comes from, which must be `from` when `want` is set); panics
/// after 10 s naming `what`. An error (an owner that just restarted) is
/// waited out like a different answer.
pub async fn policy_in_force<R, E, F>(
    what: &str,
    want: Option<i64>,
    from: &str,
    mut read: impl FnMut() -> F,
    value: impl Fn(&R) -> (Option<i64>, &str),
) where
    R: std::fmt::Debug,
    E: std::fmt::Debug,
    F: std::future::Future<Output = Result<R, E>>,
{
    let start = std::time::Instant::now();
    loop {
        let got = read().await;
        if let Ok(got) = &got {
            let (figure, source) = value(got);
            if figure == want {
                if want.is_some() {
                    assert_eq!(source, from, "{got:?}");
                }
                return;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{what}: in force {got:?}, wanted {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
