//! Replicated topics in a real cluster (issue 22): etcd and three brokers
//! as child processes on loopback (skipped like `cluster.rs` when `etcd`
//! is missing, unless `RICOCHET_REQUIRE_ETCD=1`). A topic created with
//! `--replicas 3` is a Raft group over the three brokers, recorded in
//! etcd; `Lookup` answers its Raft leader, and after a `kill -9` of the
//! leader's process another member leads and `Lookup` answers it. A
//! producer and a consumer recording a history through a leader's kill -9
//! follow it to the new leader, and the history checker finds nothing
//! acknowledged lost, nothing acked delivered again, no count going back.
//! What is not built yet is checked as refused, not assumed: topic admin
//! calls on a replicated topic get FAILED_PRECONDITION saying so.

use std::time::{Duration, Instant};

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use ricochet_client::{Client, ErrorKind, InitialPosition, PolicySpec, SubscriptionType};
use ricochet_testkit::{History, Place, SpawnOptions, etcd_or_skip, spawn_cluster};

/// One cluster at a time (shared with nothing else in this module).
static ONE_CLUSTER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn client(url: &str) -> Client {
    Client::builder(url)
        .request_timeout(Duration::from_secs(5))
        .reconnect_backoff(Duration::from_millis(50), Duration::from_millis(500))
        .connect()
        .await
        .unwrap()
}

/// The member `Lookup` (asked of `url`) names for `topic`, once it names
/// one of `among` and the answer held for two reads 300 ms apart; `None`
/// after `within`.
async fn stable_leader(
    url: &str,
    topic: &str,
    among: &[String],
    within: Duration,
) -> Option<(String, String)> {
    let c = client(url).await;
    let start = Instant::now();
    let mut last = None;
    while start.elapsed() < within {
        if let Ok(o) = c.lookup(topic).await
            && among.contains(&o.broker_id)
        {
            let now = (o.broker_id.clone(), o.url.clone());
            if last.as_ref() == Some(&now) {
                return last;
            }
            last = Some(now);
        } else {
            last = None;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    None
}

#[tokio::test]
async fn a_replicated_topic_is_a_group_of_three_led_by_the_broker_lookup_answers() {
    let _one = ONE_CLUSTER.lock().await;
    let Some(etcd) = etcd_or_skip("a_replicated_topic_is_a_group_of_three").await else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let mut brokers = spawn_cluster(
        &etcd,
        "rep",
        3,
        root.path(),
        Duration::from_secs(3),
        &SpawnOptions::new(),
    )
    .await;
    let c = client(&brokers[0].url()).await;
    let admin = c.admin();

    // More replicas than live brokers: refused, and nothing is recorded.
    let e = admin.create_replicated_topic("r4", 4).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::FailedPrecondition, "{e:?}");
    assert!(
        e.to_string().contains("needs 4 live brokers; 3 are live"),
        "{e}"
    );
    let groups = "/ricochet/rep/groups/persistent://public/default/";
    assert_eq!(etcd.get(&format!("{groups}r4")).await, None);

    let t = "orders";
    let info = admin.create_replicated_topic(t, 3).await.unwrap();
    assert!(info.created, "{info:?}");
    let again = admin.create_replicated_topic(t, 3).await.unwrap();
    assert!(!again.created, "a second create finds the group: {again:?}");
    let e = admin.create_replicated_topic(t, 2).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AlreadyExists, "{e:?}");
    let e = admin.create_topic(t).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AlreadyExists, "{e:?}");

    let (record, _) = etcd
        .get(&format!("{groups}{t}"))
        .await
        .expect("the group is recorded in etcd");
    let record: serde_json::Value = serde_json::from_str(&record).unwrap();
    assert_eq!(record["replicas"], 3, "{record}");
    let mut members: Vec<String> = record["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap().to_owned())
        .collect();
    members.sort();
    assert_eq!(members, ["b0", "b1", "b2"], "{record}");

    let (leader, leader_url) =
        stable_leader(&brokers[1].url(), t, &members, Duration::from_secs(20))
            .await
            .expect("Lookup answers a member of the group");
    // Every broker answers the same leader.
    for b in &brokers {
        let o = client(&b.url()).await.lookup(t).await.unwrap();
        assert_eq!(o.broker_id, leader, "asked of {}", b.url());
    }
    // The cluster listing shows the group, its members and its leader.
    let listed = admin.brokers(false).await.unwrap();
    let g = listed
        .groups
        .iter()
        .find(|g| g.topic.ends_with("/orders"))
        .expect("the group is listed");
    assert_eq!((g.replicas, g.members.len()), (3, 3), "{g:?}");
    assert_eq!(g.leader, leader, "{g:?}");
    // Topic admin calls on a replicated topic are not served yet: refused
    // with a clear error rather than answered from one replica.
    let e = client(&leader_url)
        .await
        .admin()
        .topic_stats(t)
        .await
        .expect_err("topic stats of a replicated topic are refused");
    assert_eq!(e.kind(), ErrorKind::FailedPrecondition, "{e:?}");
    assert!(e.to_string().contains("not yet"), "{e}");

    // kill -9 of the leader: another member leads, and Lookup says so.
    let victim = members.iter().position(|m| *m == leader).unwrap();
    let survivor = brokers[(victim + 1) % 3].url();
    let killed = Instant::now();
    brokers[victim].kill9();
    let others: Vec<String> = members.iter().filter(|m| **m != leader).cloned().collect();
    let (next, _) = stable_leader(&survivor, t, &others, Duration::from_secs(30))
        .await
        .expect("after the leader's kill -9 another member leads");
    println!(
        "replicated: leader {leader} killed; {next} answered by Lookup after {} ms",
        killed.elapsed().as_millis()
    );
    assert_ne!(next, leader);

    // The old leader returns and rejoins the group: one member leads and
    // every broker answers the same one (Raft may elect any of them).
    brokers[victim].restart().await;
    let (after, _) = stable_leader(&brokers[victim].url(), t, &members, Duration::from_secs(20))
        .await
        .expect("a leader after the return");
    for b in &brokers {
        let o = client(&b.url()).await.lookup(t).await.unwrap();
        assert_eq!(o.broker_id, after, "asked of {}", b.url());
    }
}

/// Every fifth message is nacked on its first two deliveries.
fn poison(id: &str) -> bool {
    id.parse::<u64>().is_ok_and(|n| n % 5 == 0)
}

async fn subscribe(c: &Client, t: &str, receipts: bool) -> ricochet_client::Consumer {
    c.consumer(t)
        .subscription("s")
        .subscription_type(SubscriptionType::Shared)
        .initial_position(InitialPosition::Earliest)
        .ack_receipts(receipts)
        .policy("backoff:fixed=200ms,max=50".parse::<PolicySpec>().unwrap())
        .subscribe()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_leader_killed_mid_run_loses_nothing_acknowledged_and_clients_follow_the_new_one() {
    let _one = ONE_CLUSTER.lock().await;
    let Some(etcd) = etcd_or_skip("a_leader_killed_mid_run_loses_nothing").await else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let mut brokers = spawn_cluster(
        &etcd,
        "take",
        3,
        root.path(),
        Duration::from_secs(3),
        &SpawnOptions::new(),
    )
    .await;
    let t = "jobs";
    client(&brokers[0].url())
        .await
        .admin()
        .create_replicated_topic(t, 3)
        .await
        .unwrap();
    let ids: Vec<String> = (0..3).map(|i| format!("b{i}")).collect();
    let (leader, _) = stable_leader(&brokers[0].url(), t, &ids, Duration::from_secs(20))
        .await
        .expect("a leader");
    let victim = ids.iter().position(|m| *m == leader).unwrap();
    // The clients know a broker that survives; they find the leader.
    let survivor = brokers[(victim + 1) % 3].url();
    let c = client(&survivor).await;
    let h = Arc::new(History::new());
    let stop = Arc::new(AtomicBool::new(false));
    let receipted = Arc::new(AtomicUsize::new(0));
    let nacked_before_kill = Arc::new(std::sync::Mutex::new(Vec::<(String, u32)>::new()));
    let killed = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicUsize::new(0));

    let producing = {
        let (c, h, stop, receipted) = (c.clone(), h.clone(), stop.clone(), receipted.clone());
        tokio::spawn(async move {
            let p = c
                .producer(t)
                .send_timeout(Duration::from_secs(20))
                .create()
                .await
                .unwrap();
            let mut i = 0u64;
            while !stop.load(Ordering::Acquire) {
                let id = i.to_string();
                i += 1;
                h.sent(&id);
                if let Ok(Ok(_)) =
                    tokio::time::timeout(Duration::from_secs(25), p.send(id.clone())).await
                {
                    h.receipted(&id);
                    receipted.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };
    let consuming = {
        let (c, h, stop) = (c.clone(), h.clone(), stop.clone());
        let (nacked, killed, acked) = (nacked_before_kill.clone(), killed.clone(), acked.clone());
        tokio::spawn(async move {
            let mut consumer = subscribe(&c, t, true).await;
            let mut later_counts = Vec::new();
            while !stop.load(Ordering::Acquire) {
                let Ok(Ok(m)) =
                    tokio::time::timeout(Duration::from_secs(25), consumer.receive()).await
                else {
                    continue;
                };
                let id = String::from_utf8_lossy(m.payload()).into_owned();
                h.delivered(&id, m.delivery_count());
                if killed.load(Ordering::Acquire) {
                    later_counts.push((id.clone(), m.delivery_count()));
                }
                if poison(&id) && m.delivery_count() < 2 {
                    if consumer.nack_with_reason(&m, "poison").await.is_ok() {
                        h.failure_confirmed(&id);
                        if !killed.load(Ordering::Acquire) {
                            nacked.lock().unwrap().push((id, m.delivery_count()));
                        }
                    }
                } else {
                    h.ack_sent(&id);
                    if consumer.ack(&m).await.is_ok() {
                        h.ack_confirmed(&id);
                        acked.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            later_counts
        })
    };

    // Run until enough went through the first leader, then kill it.
    let start = Instant::now();
    while receipted.load(Ordering::Relaxed) < 40 && start.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let before = receipted.load(Ordering::Relaxed);
    assert!(
        before >= 40,
        "only {before} publishes receipted before the kill"
    );
    let acked_before = acked.load(Ordering::Relaxed);
    killed.store(true, Ordering::Release);
    let kill_at = Instant::now();
    brokers[victim].kill9();
    // Go on until publishes are receipted and acks confirmed again, through
    // the new leader.
    let went_on = || {
        receipted.load(Ordering::Relaxed) >= before + 40
            && acked.load(Ordering::Relaxed) >= acked_before + 10
    };
    while !went_on() && kill_at.elapsed() < Duration::from_secs(90) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (after, acked_after) = (
        receipted.load(Ordering::Relaxed),
        acked.load(Ordering::Relaxed),
    );
    println!(
        "replicated takeover: {before} receipted and {acked_before} acks confirmed before the kill, \
         {} and {} after, in {} ms",
        after - before,
        acked_after - acked_before,
        kill_at.elapsed().as_millis()
    );
    assert!(
        went_on(),
        "the clients did not go on through the new leader"
    );
    stop.store(true, Ordering::Release);
    let _ = tokio::time::timeout(Duration::from_secs(30), producing).await;
    let later = tokio::time::timeout(Duration::from_secs(30), consuming)
        .await
        .expect("the consumer stops")
        .unwrap();

    // Audit through the new leader: whatever is still deliverable comes to
    // a consumer that acks everything.
    let audit = client(&survivor).await;
    let mut auditor = subscribe(&audit, t, false).await;
    while let Ok(Ok(m)) = tokio::time::timeout(Duration::from_secs(5), auditor.receive()).await {
        let id = String::from_utf8_lossy(m.payload()).into_owned();
        h.delivered(&id, m.delivery_count());
        h.found(&id, Place::Pending);
        auditor.ack(&m).await.unwrap();
    }
    let summary = h.assert_ok();
    println!("replicated takeover history: {summary:?}");
    assert!(summary.acks_confirmed > 10, "{summary:?}");
    assert!(summary.failures_confirmed > 2, "{summary:?}");
    // A message nacked on the first leader came again from the new one
    // with a higher count (the count was replicated), when it came again.
    let nacked = nacked_before_kill.lock().unwrap().clone();
    let mut checked = 0;
    for (id, count) in &nacked {
        if let Some((_, then)) = later.iter().find(|(l, _)| l == id) {
            assert!(
                then > count,
                "{id}: nacked at {count}, delivered again at {then}"
            );
            checked += 1;
        }
    }
    println!(
        "replicated takeover: {checked} of {} nacked messages seen again after the kill",
        nacked.len()
    );
}

/// A retry scheduled on the leader (a `reconsume_later` into the retry tier
/// and a nack the broker holds) is applied by the followers after their
/// schedulers loaded their windows; the leader is killed before it is due.
/// The new leader fires both at their due time, with the delivery count one
/// higher, once each.
#[tokio::test]
async fn a_retry_scheduled_on_a_killed_leader_fires_on_the_new_one_at_its_due_time() {
    const DELAY: Duration = Duration::from_secs(10);
    let _one = ONE_CLUSTER.lock().await;
    let Some(etcd) = etcd_or_skip("a_retry_scheduled_on_a_killed_leader_fires").await else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let mut brokers = spawn_cluster(
        &etcd,
        "due",
        3,
        root.path(),
        Duration::from_secs(3),
        &SpawnOptions::new(),
    )
    .await;
    let t = "later";
    client(&brokers[0].url())
        .await
        .admin()
        .create_replicated_topic(t, 3)
        .await
        .unwrap();
    let ids: Vec<String> = (0..3).map(|i| format!("b{i}")).collect();
    let (leader, _) = stable_leader(&brokers[0].url(), t, &ids, Duration::from_secs(20))
        .await
        .expect("a leader");
    let victim = ids.iter().position(|m| *m == leader).unwrap();
    let c = client(&brokers[(victim + 1) % 3].url()).await;
    let producer = c.producer(t).name("p").create().await.unwrap();
    producer.send("retry").await.unwrap();
    producer.send("held").await.unwrap();
    // With ack receipts every nack is held by the broker, for the policy's
    // delay.
    let policy = format!("backoff:fixed={}s,max=50", DELAY.as_secs());
    let mut consumer = c
        .consumer(t)
        .subscription("s")
        .subscription_type(SubscriptionType::Shared)
        .initial_position(InitialPosition::Earliest)
        .ack_receipts(true)
        .policy(policy.parse::<PolicySpec>().unwrap())
        .subscribe()
        .await
        .unwrap();
    let mut first = std::collections::HashMap::new();
    while first.len() < 2 {
        let m = tokio::time::timeout(Duration::from_secs(20), consumer.receive())
            .await
            .expect("both messages delivered")
            .unwrap();
        first.insert(String::from_utf8_lossy(m.payload()).into_owned(), m);
    }
    let asked = Instant::now();
    consumer
        .reconsume_later(&first["retry"], DELAY)
        .await
        .unwrap();
    consumer.nack(&first["held"]).await.unwrap();
    consumer.flush().await.unwrap();
    let confirmed = Instant::now();
    // Both are committed (ack receipts): kill the leader well before they
    // are due.
    brokers[victim].kill9();
    let killed = confirmed.elapsed();
    assert!(
        killed < DELAY / 2,
        "killed {killed:?} after the confirmations"
    );

    // Due between `asked + DELAY` and `confirmed + DELAY`; the broker never
    // fires early, and late by at most a takeover's worth.
    let mut again: Vec<(String, u32, Duration)> = Vec::new();
    let listen_until = confirmed + DELAY + Duration::from_secs(8);
    while Instant::now() < listen_until {
        let left = listen_until.saturating_duration_since(Instant::now());
        let Ok(got) = tokio::time::timeout(left, consumer.receive()).await else {
            break;
        };
        let Ok(m) = got else { continue };
        let body = String::from_utf8_lossy(m.payload()).into_owned();
        again.push((body, m.delivery_count(), asked.elapsed()));
        consumer.ack(&m).await.unwrap();
    }
    println!(
        "replicated retries after the leader's kill: {again:?} (asked at 0, due at {DELAY:?})"
    );
    for body in ["retry", "held"] {
        let seen: Vec<_> = again.iter().filter(|(b, _, _)| b == body).collect();
        assert_eq!(seen.len(), 1, "{body} delivered once: {again:?}");
        let (_, count, at) = seen[0];
        assert_eq!(
            *count,
            first[body].delivery_count() + 1,
            "{body}: the delivery count one higher"
        );
        assert!(
            *at + Duration::from_millis(5) >= DELAY,
            "{body} came {at:?} after the request, before its delay"
        );
        assert!(
            *at <= confirmed.duration_since(asked) + DELAY + Duration::from_secs(3),
            "{body} came {at:?} after the request: late"
        );
    }
    assert_eq!(again.len(), 2, "nothing else came: {again:?}");
}
