//! Key order (per-key ordered retries), end to end through the client on an
//! in-process broker: each key's acked sequence stays in publish order
//! through nacks and `reconsume_later` on Key_Shared, Failover and
//! Exclusive (and does not without the mode); other keys flow while one is
//! blocked, and stats say for how long; a key is released when its failed
//! message is acked or dead-lettered; a poison key goes to the DLQ with its
//! held messages (a `key_poisoned` event); holding survives a restart, a
//! change of consumer and a Failover switch; Shared is refused.

use crate::common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{Env, assert_quiet, recv, start, text, topic};
use ricochet_client::admin::SubscriptionStats;
use ricochet_client::{
    Consumer, ErrorKind, InitialPosition, KeyOrder, OutgoingMessage, PolicySpec, SubscriptionType,
};

const T: Duration = Duration::from_secs(10);

/// Publishes `per_key` messages for each key, interleaved: payload
/// `<key>:<seq>`.
async fn publish(env: &Env, t: &str, keys: &[&str], per_key: usize) {
    publish_seqs(env, t, keys, 0..per_key).await;
}

/// Publishes sequence numbers `seqs` of each key, interleaved.
async fn publish_seqs(env: &Env, t: &str, keys: &[&str], seqs: std::ops::Range<usize>) {
    let p = env.client.producer(t).create().await.unwrap();
    for seq in seqs {
        for k in keys {
            let m = OutgoingMessage::builder(format!("{k}:{seq}"))
                .key(*k)
                .build();
            drop(p.send_async(m).await.unwrap());
        }
    }
    p.flush().await.unwrap();
    p.close().await.unwrap();
}

fn seq_of(m: &ricochet_client::Message) -> (String, u32) {
    let s = text(m);
    let (k, n) = s.rsplit_once(':').unwrap();
    (k.to_owned(), n.parse().unwrap())
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Failing {
    Nack,
    ReconsumeLater,
}

async fn consumer(
    env: &Env,
    t: &str,
    sub_type: SubscriptionType,
    ordered: bool,
    name: &str,
) -> Consumer {
    let mut b = env
        .client
        .consumer(t)
        .subscription("s")
        .consumer_name(name)
        .subscription_type(sub_type)
        .initial_position(InitialPosition::Earliest)
        .negative_ack_delay(Duration::from_millis(150))
        .ack_group_time(Duration::from_millis(5));
    if ordered {
        b = b.key_order(KeyOrder::new());
    }
    b.subscribe().await.unwrap()
}

/// Consumes until every message is acked: a message whose sequence number
/// is 2 mod 5 fails on its first delivery. Returns each key's acked
/// sequence, in ack order.
async fn consume_all(
    consumers: Vec<Consumer>,
    failing: Failing,
    total: usize,
) -> BTreeMap<String, Vec<u32>> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for mut c in consumers {
        let tx = tx.clone();
        tasks.push(tokio::spawn(async move {
            while let Ok(Ok(m)) = tokio::time::timeout(T, c.receive()).await {
                let (key, seq) = seq_of(&m);
                if seq % 5 == 2 && m.delivery_count() == 0 {
                    match failing {
                        Failing::Nack => c.nack(&m).await.unwrap(),
                        Failing::ReconsumeLater => c
                            .reconsume_later(&m, Duration::from_millis(200))
                            .await
                            .unwrap(),
                    }
                    continue;
                }
                // Recorded before the ack is sent: the broker sees acks
                // in this order.
                if tx.send((key, seq)).is_err() {
                    break;
                }
                c.ack(&m).await.unwrap();
            }
        }));
    }
    drop(tx);
    let mut acked: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    let mut n = 0;
    while n < total {
        let Ok(Some((k, s))) = tokio::time::timeout(T, rx.recv()).await else {
            break;
        };
        acked.entry(k).or_default().push(s);
        n += 1;
    }
    for t in tasks {
        t.abort();
    }
    acked
}

/// The keys whose acked sequence is not exactly 0, 1, 2, … in order.
fn out_of_order(acked: &BTreeMap<String, Vec<u32>>, per_key: u32) -> Vec<String> {
    let want: Vec<u32> = (0..per_key).collect();
    acked
        .iter()
        .filter(|(_, seqs)| **seqs != want)
        .map(|(k, seqs)| format!("{k}: {seqs:?}"))
        .collect()
}

const KEYS: [&str; 4] = ["alpha", "bravo", "charlie", "delta"];
const PER_KEY: usize = 15;

async fn ordered_run(sub_type: SubscriptionType, failing: Failing, ordered: bool) -> Vec<String> {
    let env = start().await;
    let t = topic("ko-order");
    // Two consumers where two may subscribe (one active on Failover).
    let n = if sub_type == SubscriptionType::Exclusive {
        1
    } else {
        2
    };
    let mut cs = Vec::new();
    for i in 0..n {
        cs.push(consumer(&env, &t, sub_type, ordered, &format!("c{i}")).await);
    }
    publish(&env, &t, &KEYS, PER_KEY).await;
    let acked = consume_all(cs, failing, KEYS.len() * PER_KEY).await;
    assert_eq!(acked.len(), KEYS.len(), "every key acked: {acked:?}");
    let total: usize = acked.values().map(Vec::len).sum();
    assert_eq!(total, KEYS.len() * PER_KEY, "{acked:?}");
    out_of_order(&acked, PER_KEY as u32)
}

#[tokio::test]
async fn nacks_keep_each_keys_order_on_exclusive() {
    let bad = ordered_run(SubscriptionType::Exclusive, Failing::Nack, true).await;
    assert!(bad.is_empty(), "out of order: {bad:?}");
}

#[tokio::test]
async fn nacks_keep_each_keys_order_on_key_shared() {
    let bad = ordered_run(SubscriptionType::KeyShared, Failing::Nack, true).await;
    assert!(bad.is_empty(), "out of order: {bad:?}");
}

#[tokio::test]
async fn nacks_keep_each_keys_order_on_failover() {
    let bad = ordered_run(SubscriptionType::Failover, Failing::Nack, true).await;
    assert!(bad.is_empty(), "out of order: {bad:?}");
}

#[tokio::test]
async fn reconsume_later_keeps_each_keys_order_on_failover() {
    let bad = ordered_run(SubscriptionType::Failover, Failing::ReconsumeLater, true).await;
    assert!(bad.is_empty(), "out of order: {bad:?}");
}

#[tokio::test]
async fn reconsume_later_keeps_each_keys_order_on_exclusive() {
    let bad = ordered_run(SubscriptionType::Exclusive, Failing::ReconsumeLater, true).await;
    assert!(bad.is_empty(), "out of order: {bad:?}");
}

#[tokio::test]
async fn reconsume_later_keeps_each_keys_order_on_key_shared() {
    let bad = ordered_run(SubscriptionType::KeyShared, Failing::ReconsumeLater, true).await;
    assert!(bad.is_empty(), "out of order: {bad:?}");
}

/// The same runs without key order break order: the checker above is not
/// one that passes whatever happens.
#[tokio::test]
async fn without_key_order_retries_break_order() {
    for (t, f) in [
        (SubscriptionType::Exclusive, Failing::Nack),
        (SubscriptionType::KeyShared, Failing::ReconsumeLater),
        (SubscriptionType::Failover, Failing::Nack),
    ] {
        let bad = ordered_run(t, f, false).await;
        assert!(!bad.is_empty(), "{t:?} {f:?}: order kept without the mode?");
    }
}

async fn stats(env: &Env, t: &str) -> SubscriptionStats {
    env.client.admin().subscription_stats(t, "s").await.unwrap()
}

async fn dead_letters(env: &Env, t: &str) -> Vec<ricochet_client::admin::DeadLetter> {
    env.client
        .admin()
        .list_dead_letters(t, "s", &Default::default(), 100, None)
        .await
        .unwrap()
        .dead_letters
}

/// Receives until a message satisfying `want` arrives; returns it and what
/// came before it.
async fn recv_until(
    c: &mut Consumer,
    want: impl Fn(&ricochet_client::Message) -> bool,
) -> (ricochet_client::Message, Vec<ricochet_client::Message>) {
    let mut before = Vec::new();
    loop {
        let m = recv(c, T).await;
        if want(&m) {
            return (m, before);
        }
        before.push(m);
    }
}

/// `a` is blocked by a retry 2 s away: `b` flows at once, `a`'s later
/// messages wait; stats show the block; the ack releases `a` in order.
#[tokio::test]
async fn other_keys_flow_while_one_is_blocked_and_an_ack_releases_it() {
    let env = start().await;
    let t = topic("ko-flow");
    let mut c = consumer(&env, &t, SubscriptionType::Exclusive, true, "c").await;
    publish(&env, &t, &["a"], 1).await;
    let m = recv(&mut c, T).await;
    assert_eq!(text(&m), "a:0");
    let failed_at = Instant::now();
    let failed_wall = SystemTime::now();
    c.reconsume_later(&m, Duration::from_secs(2)).await.unwrap();
    publish_seqs(&env, &t, &["a", "b"], 1..5).await;
    // Every `b` arrives, no `a`, well before the retry is due.
    for i in 1..5 {
        let m = recv(&mut c, T).await;
        assert_eq!(text(&m), format!("b:{i}"), "only b flows");
        c.ack(&m).await.unwrap();
    }
    assert!(failed_at.elapsed() < Duration::from_millis(1500));
    let s = stats(&env, &t).await;
    assert!(s.key_order);
    assert_eq!(s.blocked_keys, 1, "{s:?}");
    assert_eq!(s.held_messages, 4, "a:1..a:4 held: {s:?}");
    assert_eq!(s.top_blocked_keys[0].key, "a");
    assert_eq!(s.top_blocked_keys[0].held, 4);
    // For how long: blocked since the failure, and for longer each look.
    let since = s.top_blocked_keys[0].blocked_since_ms;
    let failed_ms = failed_wall.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
    assert!(
        since + 1_000 >= failed_ms && since <= failed_ms + 1_000,
        "blocked since {since}, failed at {failed_ms}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let later = stats(&env, &t).await;
    assert_eq!(later.top_blocked_keys[0].blocked_since_ms, since);
    assert!(
        later.oldest_blocked_ms >= s.oldest_blocked_ms + 250,
        "{} then {}",
        s.oldest_blocked_ms,
        later.oldest_blocked_ms
    );
    // The failed one comes back first, then the held ones in order.
    let back = recv(&mut c, T).await;
    assert_eq!(text(&back), "a:0");
    assert!(failed_at.elapsed() >= Duration::from_secs(2));
    assert_quiet(&mut c, Duration::from_millis(300)).await;
    c.ack(&back).await.unwrap();
    for i in 1..5 {
        let m = recv(&mut c, T).await;
        assert_eq!(text(&m), format!("a:{i}"));
        c.ack(&m).await.unwrap();
    }
    let s = stats(&env, &t).await;
    assert_eq!((s.blocked_keys, s.held_messages), (0, 0), "{s:?}");
}

/// Dead-lettering the failed message releases its key.
/// A key with a message out (not failed, only not acked yet) does not
/// fill the read-ahead with its later messages: 1 500 messages of a hot
/// key (more than the broker's read-ahead of 1 000) are followed by
/// messages of another key, which arrive while the hot key's first message
/// is still unacked; the hot key's messages then come in order.
#[tokio::test]
async fn a_busy_key_does_not_hold_up_the_keys_behind_it() {
    let env = start().await;
    let t = topic("ko-busy");
    publish(&env, &t, &["hot"], 1_500).await;
    publish(&env, &t, &["cold"], 10).await;
    let mut c = consumer(&env, &t, SubscriptionType::Exclusive, true, "c").await;
    let first = recv(&mut c, T).await;
    assert_eq!(seq_of(&first), ("hot".to_owned(), 0));
    // hot:0 stays unacked: only the other key can come.
    for i in 0..10 {
        let m = recv(&mut c, T).await;
        assert_eq!(seq_of(&m), ("cold".to_owned(), i));
        c.ack(&m).await.unwrap();
    }
    c.ack(&first).await.unwrap();
    for i in 1..1_500 {
        let m = recv(&mut c, T).await;
        assert_eq!(seq_of(&m), ("hot".to_owned(), i));
        c.ack(&m).await.unwrap();
    }
    assert_quiet(&mut c, Duration::from_millis(200)).await;
}

#[tokio::test]
async fn dead_lettering_the_failed_message_releases_its_key() {
    let env = start().await;
    let t = topic("ko-dlq");
    let mut c = env
        .client
        .consumer(&t)
        .subscription("s")
        .subscription_type(SubscriptionType::Exclusive)
        .policy(PolicySpec::Backoff {
            fixed: Some(Duration::from_millis(100)),
            multiplier: None,
            max_redeliver_count: 1,
        })
        .key_order(KeyOrder::new())
        .ack_group_time(Duration::from_millis(5))
        .subscribe()
        .await
        .unwrap();
    publish(&env, &t, &["a"], 4).await;
    let m = recv(&mut c, T).await;
    assert_eq!(text(&m), "a:0");
    c.nack(&m).await.unwrap();
    let again = recv(&mut c, T).await;
    assert_eq!(
        (text(&again), again.delivery_count()),
        ("a:0".into(), 1),
        "the failed message first; a:1 is held"
    );
    c.nack(&again).await.unwrap();
    // Its second failure dead-letters it: the key resumes.
    for i in 1..4 {
        let m = recv(&mut c, T).await;
        assert_eq!(text(&m), format!("a:{i}"));
        c.ack(&m).await.unwrap();
    }
    let dlq = dead_letters(&env, &t).await;
    assert_eq!(dlq.len(), 1);
    assert_eq!(stats(&env, &t).await.blocked_keys, 0);
}

/// A key blocked past `poison_after` sends its failed message, then the held
/// ones, to the DLQ with the reason, announced by a `key_poisoned` event;
/// the key then flows again.
#[tokio::test]
async fn a_poison_key_goes_to_the_dead_letter_tier_with_its_held_messages() {
    let env = start().await;
    let t = topic("ko-poison");
    let mut events = events(&env).await;
    let mut c = env
        .client
        .consumer(&t)
        .subscription("s")
        .subscription_type(SubscriptionType::KeyShared)
        .key_order(KeyOrder::with_poison_after(Duration::from_secs(1)))
        .ack_group_time(Duration::from_millis(5))
        .subscribe()
        .await
        .unwrap();
    publish(&env, &t, &["p"], 1).await;
    let m = recv(&mut c, T).await;
    c.reconsume_later(&m, Duration::from_secs(60))
        .await
        .unwrap();
    publish_seqs(&env, &t, &["p", "q"], 1..4).await;
    for i in 1..4 {
        let m = recv(&mut c, T).await;
        assert_eq!(text(&m), format!("q:{i}"));
        c.ack(&m).await.unwrap();
    }
    // Poisoned after 1 s: nothing of `p` is delivered.
    assert_quiet(&mut c, Duration::from_millis(1800)).await;
    let dlq = dead_letters(&env, &t).await;
    let got: Vec<(String, String)> = dlq
        .iter()
        .map(|d| {
            let m = d.message.as_ref().unwrap();
            (
                String::from_utf8_lossy(&m.payload).into_owned(),
                d.reason.clone(),
            )
        })
        .collect();
    assert_eq!(got.len(), 4, "{got:?}");
    assert_eq!(got[0].0, "p:0", "the failed one first: {got:?}");
    assert!(got[0].1.contains("poison key"), "{got:?}");
    for (i, (payload, reason)) in got[1..].iter().enumerate() {
        assert_eq!(payload, &format!("p:{}", i + 1));
        assert!(
            reason.contains("blocked by") && reason.contains("(poison key)"),
            "{reason}"
        );
    }
    assert_eq!(stats(&env, &t).await.blocked_keys, 0);
    let poisoned = loop {
        let e = recv(&mut events, T).await;
        let v: serde_json::Value = serde_json::from_slice(e.payload()).unwrap();
        if v["key"] == "p" && v["kind"] == "key_poisoned" {
            break v;
        }
    };
    assert!(
        poisoned["topic"].as_str().unwrap().ends_with(&t),
        "{poisoned}"
    );
    assert_eq!(poisoned["subscription"], "s", "{poisoned}");
    // It names the failed message, as the held ones' reason does.
    let failed_id = got[1]
        .1
        .split("blocked by ")
        .nth(1)
        .and_then(|r| r.split(" for ").next())
        .unwrap();
    assert_eq!(poisoned["message_id"], failed_id, "{poisoned}");
    assert!(
        poisoned["blocked_ms"].as_u64().unwrap() >= 1_000,
        "{poisoned}"
    );
    assert!(
        poisoned["verdict"]
            .as_str()
            .is_some_and(|v| v.contains("poison key")),
        "{poisoned}"
    );
    // The key flows again.
    publish_seqs(&env, &t, &["p"], 4..5).await;
    assert_eq!(text(&recv(&mut c, T).await), "p:4");
}

/// A reader of the namespace's failure events, from the earliest.
async fn events(env: &Env) -> Consumer {
    env.client
        .consumer("persistent://public/default/__failure_events")
        .subscription("watch")
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await
        .unwrap()
}

/// A blocked key stays blocked across a restart of the broker.
#[tokio::test]
async fn holding_survives_a_broker_restart() {
    let env = start().await;
    let t = topic("ko-restart");
    let c = consumer(&env, &t, SubscriptionType::Exclusive, true, "c").await;
    let mut c = c;
    publish(&env, &t, &["a"], 1).await;
    let m = recv(&mut c, T).await;
    let due = Duration::from_secs(3);
    c.reconsume_later(&m, due).await.unwrap();
    let failed_at = Instant::now();
    publish_seqs(&env, &t, &["a", "b"], 1..4).await;
    let (b0, before) = recv_until(&mut c, |m| text(m) == "b:1").await;
    assert!(
        before.is_empty(),
        "{:?}",
        before.iter().map(text).collect::<Vec<_>>()
    );
    c.ack(&b0).await.unwrap();
    c.flush().await.unwrap();
    drop(c);
    let Env { broker, client } = env;
    drop(client);
    let dir = broker.shutdown().await;
    let broker = ricochet_testkit::InProcessBroker::start_in(dir, |_| {}).await;
    let env = Env {
        client: common::client(&broker.url()).await,
        broker,
    };
    let mut c = consumer(&env, &t, SubscriptionType::Exclusive, true, "c").await;
    // b flows; a:1.. stay held until a:0 is back from its retry.
    for i in 2..4 {
        let m = recv(&mut c, T).await;
        assert_eq!(text(&m), format!("b:{i}"), "only b before the retry");
        c.ack(&m).await.unwrap();
    }
    let back = recv(&mut c, T).await;
    assert_eq!(
        text(&back),
        "a:0",
        "the failed message first after a restart"
    );
    assert!(failed_at.elapsed() >= due);
    c.ack(&back).await.unwrap();
    for i in 1..4 {
        let m = recv(&mut c, T).await;
        assert_eq!(text(&m), format!("a:{i}"));
        c.ack(&m).await.unwrap();
    }
}

/// Key_Shared: the consumer holding a key's message leaves; the key's later
/// messages were never out with anyone, and the new holder gets the failed
/// message first, then the rest in order.
#[tokio::test]
async fn a_consumer_change_keeps_the_order() {
    let env = start().await;
    let t = topic("ko-change");
    let mut c1 = consumer(&env, &t, SubscriptionType::KeyShared, true, "c1").await;
    publish(&env, &t, &["k"], 1).await;
    let m = recv(&mut c1, T).await;
    assert_eq!(text(&m), "k:0");
    let mut c2 = consumer(&env, &t, SubscriptionType::KeyShared, true, "c2").await;
    publish_seqs(&env, &t, &["k"], 1..5).await;
    // One message of a key out at a time: nobody receives k:1.. yet.
    assert_quiet(&mut c2, Duration::from_millis(500)).await;
    c1.reconsume_later(&m, Duration::from_millis(300))
        .await
        .unwrap();
    c1.close().await.unwrap();
    drop(c1);
    let back = recv(&mut c2, T).await;
    assert_eq!((text(&back), back.delivery_count()), ("k:0".into(), 1));
    assert_quiet(&mut c2, Duration::from_millis(300)).await;
    c2.ack(&back).await.unwrap();
    for i in 1..5 {
        let m = recv(&mut c2, T).await;
        assert_eq!(text(&m), format!("k:{i}"));
        c2.ack(&m).await.unwrap();
    }
}

/// Failover: a consumer named before the active one joins and takes over
/// while the active one still holds a key's message. The key's later
/// messages go to nobody while it is out; the old consumer's retry makes
/// the failed message come to the new active one first, then the rest in
/// order, and nothing more to the old one.
#[tokio::test]
async fn a_failover_switch_keeps_the_order() {
    let env = start().await;
    let t = topic("ko-failover");
    let mut old = consumer(&env, &t, SubscriptionType::Failover, true, "b-old").await;
    publish(&env, &t, &["k"], 1).await;
    let m = recv(&mut old, T).await;
    assert_eq!(text(&m), "k:0");
    // Sorted first by name: the new consumer becomes the active one.
    let mut new = consumer(&env, &t, SubscriptionType::Failover, true, "a-new").await;
    publish_seqs(&env, &t, &["k"], 1..5).await;
    // k:0 is still out with the old consumer: nobody receives k:1.. yet.
    assert_quiet(&mut new, Duration::from_millis(500)).await;
    old.reconsume_later(&m, Duration::from_millis(300))
        .await
        .unwrap();
    let back = recv(&mut new, T).await;
    assert_eq!((text(&back), back.delivery_count()), ("k:0".into(), 1));
    assert_quiet(&mut new, Duration::from_millis(300)).await;
    new.ack(&back).await.unwrap();
    for i in 1..5 {
        let m = recv(&mut new, T).await;
        assert_eq!(text(&m), format!("k:{i}"));
        new.ack(&m).await.unwrap();
    }
    assert_quiet(&mut old, Duration::from_millis(200)).await;
}

#[tokio::test]
async fn shared_subscriptions_refuse_key_order() {
    let env = start().await;
    let t = topic("ko-shared");
    let e = env
        .client
        .consumer(&t)
        .subscription("s")
        .subscription_type(SubscriptionType::Shared)
        .key_order(KeyOrder::new())
        .subscribe()
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    // The broker refuses it too, for an operator.
    let _c = consumer(&env, &t, SubscriptionType::Shared, false, "c").await;
    let e = env
        .client
        .admin()
        .set_policy_with_key_order(&t, "s", None, KeyOrder::new())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert!(e.to_string().contains("Shared"), "{e}");
    // And a limit below a second.
    let e = env
        .client
        .admin()
        .set_policy_with_key_order(
            &t,
            "s",
            None,
            KeyOrder::with_poison_after(Duration::from_millis(10)),
        )
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
}

/// An operator turns key order on for an Exclusive subscription; GetPolicy
/// shows it.
#[tokio::test]
async fn an_operator_sets_key_order() {
    let env = start().await;
    let t = topic("ko-admin");
    let _c = consumer(&env, &t, SubscriptionType::Exclusive, false, "c").await;
    let r = env
        .client
        .admin()
        .set_policy_with_key_order(
            &t,
            "s",
            None,
            KeyOrder::with_poison_after(Duration::from_secs(60)),
        )
        .await
        .unwrap();
    let p = r.policy.unwrap();
    assert!(p.kind.is_none());
    assert_eq!(p.key_order.unwrap().poison_after_ms, 60_000);
    assert!(stats(&env, &t).await.key_order);
}

/// A blocked key shows on the console's subscription page, and its block
/// and release are failure events (`key_blocked`, `key_released`).
#[tokio::test]
async fn blocked_keys_show_in_the_console_and_as_events() {
    use tower::ServiceExt;
    let env = start().await;
    let t = topic("ko-console");
    let mut events = events(&env).await;
    let mut c = consumer(&env, &t, SubscriptionType::Exclusive, true, "c").await;
    publish(&env, &t, &["acct-7"], 3).await;
    let m = recv(&mut c, T).await;
    c.reconsume_later(&m, Duration::from_millis(1500))
        .await
        .unwrap();
    // Wait for the two later messages to be held.
    let deadline = Instant::now() + T;
    while stats(&env, &t).await.held_messages != 2 {
        assert!(Instant::now() < deadline, "not held in time");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let app = ricochet_broker::console::router(env.broker.node.clone());
    let uri = format!("/subscription?topic=persistent%3A%2F%2Fpublic%2Fdefault%2F{t}&sub=s");
    let resp = app
        .oneshot(
            axum::http::Request::get(uri)
                .body(axum::body::Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), axum::http::StatusCode::OK);
    let page = axum::body::to_bytes(resp.into_body(), 1 << 22)
        .await
        .unwrap();
    let page = String::from_utf8_lossy(&page);
    assert!(page.contains("<h2>Key order</h2>"), "{page}");
    assert!(page.contains(r#"id="blocked-keys">1<"#), "{page}");
    assert!(page.contains(r#"id="held-messages">2<"#), "{page}");
    assert!(page.contains("<code>acct-7</code>"), "{page}");
    // The retry comes back; acking it releases the key.
    let back = recv(&mut c, T).await;
    assert_eq!(text(&back), "acct-7:0");
    c.ack(&back).await.unwrap();
    for i in 1..3 {
        let m = recv(&mut c, T).await;
        assert_eq!(text(&m), format!("acct-7:{i}"));
        c.ack(&m).await.unwrap();
    }
    let mut kinds = Vec::new();
    while kinds.len() < 2 {
        let e = recv(&mut events, T).await;
        let v: serde_json::Value = serde_json::from_slice(e.payload()).unwrap();
        if v["subscription"] == "s" && v["key"] == "acct-7" {
            kinds.push(v["kind"].as_str().unwrap().to_owned());
        }
    }
    assert_eq!(kinds, ["key_blocked", "key_released"]);
}
