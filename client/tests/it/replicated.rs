//! Replicated topics in a real cluster (issue 22): etcd and three brokers
//! as child processes on loopback (skipped like `cluster.rs` when `etcd`
//! is missing, unless `RICOCHET_REQUIRE_ETCD=1`). A topic created with
//! `--replicas 3` is a Raft group over the three brokers, recorded in
//! etcd; `Lookup` answers its Raft leader, and after a `kill -9` of the
//! leader's process another member leads and `Lookup` answers it. A
//! producer and a consumer recording a history through a leader's kill -9
//! follow it to the new leader, and the history checker finds nothing
//! acknowledged lost, nothing acked delivered again, no count going back.
//! Topic admin calls on a replicated topic are answered by its leader,
//! and their changes go through the group: a dead letter replayed or
//! purged on the leader is gone on every replica, and a new leader shows
//! the same dead letters and policies. A call with no replicated form is
//! refused with FAILED_PRECONDITION naming it.

use std::time::{Duration, Instant};

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use ricochet_client::{Client, ErrorKind, InitialPosition, PolicySpec, SubscriptionType};
use ricochet_testkit::{
    ClusterBroker, EtcdProcess, History, Place, SpawnOptions, etcd_or_skip, spawn_cluster,
};

/// One cluster at a time (shared with nothing else in this module).
pub(crate) static ONE_CLUSTER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub(crate) async fn client(url: &str) -> Client {
    Client::builder(url)
        .request_timeout(Duration::from_secs(5))
        .reconnect_backoff(Duration::from_millis(50), Duration::from_millis(500))
        .connect()
        .await
        .unwrap()
}

/// Creates `topic` with factor 3 through the first of `brokers` (the
/// harness names them `b0`, `b1`, ...) and waits until it has a stable
/// leader: the members' ids, and the leader's index among them.
pub(crate) async fn create_r3(
    brokers: &[ricochet_testkit::ClusterBroker],
    topic: &str,
) -> (Vec<String>, usize) {
    let c0 = client(&brokers[0].url()).await;
    c0.admin().create_replicated_topic(topic, 3).await.unwrap();
    let ids: Vec<String> = (0..brokers.len()).map(|i| format!("b{i}")).collect();
    let (leader, _) = stable_leader(&brokers[0].url(), topic, &ids, Duration::from_secs(20))
        .await
        .expect("a leader");
    let at = ids.iter().position(|m| *m == leader).unwrap();
    (ids, at)
}

/// The member (id, URL) leading `topic` after `leader` of the group `ids`
/// was killed: [`stable_leader`] among the others, asked of `url`, within
/// 30 s.
pub(crate) async fn next_leader(
    url: &str,
    topic: &str,
    ids: &[String],
    leader: &str,
) -> (String, String) {
    let others: Vec<String> = ids
        .iter()
        .filter(|m| m.as_str() != leader)
        .cloned()
        .collect();
    stable_leader(url, topic, &others, Duration::from_secs(30))
        .await
        .expect("another member leads")
}

/// The member `Lookup` (asked of `url`) names for `topic`, once it names
/// one of `among` and the answer held for two reads 300 ms apart; `None`
/// after `within`.
pub(crate) async fn stable_leader(
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

/// Three brokers of cluster `name` on `etcd` (data under `root`), with
/// `topic` created at factor 3 and led by one of them: the brokers, their
/// ids, the leader's id and its index.
pub(crate) async fn led_group(
    etcd: &EtcdProcess,
    name: &str,
    root: &std::path::Path,
    topic: &str,
) -> (Vec<ClusterBroker>, Vec<String>, String, usize) {
    led_group_with(etcd, name, root, topic, &SpawnOptions::new()).await
}

/// [`led_group`] with the brokers started from `options`.
pub(crate) async fn led_group_with(
    etcd: &EtcdProcess,
    name: &str,
    root: &std::path::Path,
    topic: &str,
    options: &SpawnOptions,
) -> (Vec<ClusterBroker>, Vec<String>, String, usize) {
    let brokers = spawn_cluster(etcd, name, 3, root, Duration::from_secs(3), options).await;
    client(&brokers[0].url())
        .await
        .admin()
        .create_replicated_topic(topic, 3)
        .await
        .unwrap();
    let ids: Vec<String> = (0..3).map(|i| format!("b{i}")).collect();
    let (leader, _) = stable_leader(&brokers[0].url(), topic, &ids, Duration::from_secs(20))
        .await
        .expect("a leader");
    let victim = ids.iter().position(|m| *m == leader).unwrap();
    (brokers, ids, leader, victim)
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
    // Its leader reports each member caught up.
    let healths = |want: &'static [(&'static str, &'static str)], url: String| async move {
        let admin = client(&url).await.admin();
        let start = Instant::now();
        loop {
            let listed = admin.brokers(false).await.unwrap();
            let g = listed
                .groups
                .iter()
                .find(|g| g.topic.ends_with("/orders"))
                .cloned();
            let seen: Vec<(String, String)> = g
                .iter()
                .flat_map(|g| &g.member_status)
                .map(|m| (m.broker_id.clone(), m.health.clone()))
                .collect();
            let wanted = want
                .iter()
                .all(|(b, h)| seen.iter().any(|(sb, sh)| sb == b && sh == h));
            if wanted {
                return g.unwrap();
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "member health {seen:?}, wanted {want:?}: {g:?}"
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    };
    let all_ok: &'static [(&'static str, &'static str)] =
        &[("b0", "ok"), ("b1", "ok"), ("b2", "ok")];
    // `ok` means a member held what the leader had at its previous report,
    // so a fresh report may still show a lag: all caught up comes after.
    let caught_up = Instant::now();
    let g = loop {
        let g = healths(all_ok, brokers[0].url()).await;
        if g.member_status.iter().all(|m| m.lag == 0) {
            break g;
        }
        assert!(
            caught_up.elapsed() < Duration::from_secs(20),
            "members never caught up: {g:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert!(g.last_index > 0, "{g:?}");
    // Topic admin calls are answered by the leader, also when asked of a
    // follower (the client follows its redirect).
    let follower = members.iter().position(|m| *m != leader).unwrap();
    let via_follower = client(&brokers[follower].url()).await;
    let stats = via_follower.admin().topic_stats(t).await.unwrap();
    assert_eq!(
        (stats.message_count, stats.next_entry_id),
        (0, 0),
        "{stats:?}"
    );
    // Offload calls have a replicated form (replicated_offload.rs); on
    // brokers without a tier they are refused, naming the section.
    let mut tiered = ricochet_proto::tiered_client::TieredClient::connect(leader_url.clone())
        .await
        .unwrap();
    let e = tiered
        .set_offload_policy(ricochet_proto::SetOffloadPolicyRequest {
            topic: t.to_owned(),
            ..Default::default()
        })
        .await
        .expect_err("an offload policy without a tier is refused");
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("no [tiered] section"), "{e:?}");

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
    // The new leader reports the killed member down, the other ok.
    let down: &'static [(&'static str, &'static str)] = match victim {
        0 => &[("b0", "down")],
        1 => &[("b1", "down")],
        _ => &[("b2", "down")],
    };
    let g = healths(down, survivor.clone()).await;
    assert_eq!(g.leader, next, "{g:?}");
    let others_ok = g
        .member_status
        .iter()
        .filter(|m| m.broker_id != leader)
        .all(|m| m.health == "ok");
    assert!(others_ok, "{g:?}");

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

    // A subscription deleted through the group, then the topic: its group
    // leaves etcd, and a topic of the same name is a new group.
    let c = client(&brokers[0].url()).await;
    let admin = c.admin();
    let consumer = c
        .consumer(t)
        .subscription("gone")
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await
        .unwrap();
    consumer.close().await.unwrap();
    let subs = admin.list_subscriptions(t).await.unwrap();
    assert_eq!(subs, ["gone"]);
    admin.delete_subscription(t, "gone", false).await.unwrap();
    assert!(admin.list_subscriptions(t).await.unwrap().is_empty());
    admin.delete_topic(t, false).await.unwrap();
    assert_eq!(etcd.get(&format!("{groups}{t}")).await, None);
    let e = admin.topic_stats(t).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e:?}");
    let info = admin.create_replicated_topic(t, 3).await.unwrap();
    assert!(info.created, "a new group: {info:?}");
    let (leader, _) = stable_leader(&brokers[0].url(), t, &members, Duration::from_secs(20))
        .await
        .expect("the new group leads");
    let p = c.producer(t).create().await.unwrap();
    p.send("fresh").await.unwrap();
    let stats = admin.topic_stats(t).await.unwrap();
    assert_eq!(
        (stats.message_count, stats.next_entry_id),
        (1, 1),
        "the new group's topic starts empty (led by {leader}): {stats:?}"
    );
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
    let t = "jobs";
    let (mut brokers, _, _, victim) = led_group(&etcd, "take", root.path(), t).await;
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

/// The dead letters (entry id, payload) of subscription `s` on `t`, as
/// the leader lists them.
async fn dead_letter_list(admin: &ricochet_client::Admin, t: &str) -> Vec<(u64, String)> {
    let all = ricochet_client::admin::DeadLetterFilter::default();
    let listed = admin
        .list_dead_letters(t, "s", &all, 100, None)
        .await
        .unwrap();
    assert_eq!(listed.total as usize, listed.dead_letters.len());
    listed
        .dead_letters
        .iter()
        .map(|d| {
            let m = d.message.as_ref().unwrap();
            let payload = String::from_utf8_lossy(&m.payload).into_owned();
            (m.id.as_ref().unwrap().entry_id, payload)
        })
        .collect()
}

/// Subscription `s` of `topic` in the store of a killed broker: its dead
/// letters' ids and the policy its record holds.
fn stored_state(dir: &std::path::Path, topic: &str) -> (Vec<u64>, Option<PolicySpec>) {
    use ricochet_broker::storage::{MetaStore, SledStorage, SubscriptionStore};
    let store = SledStorage::open(dir, 16_384, 16 << 20).unwrap();
    assert!(
        store.list_topics().unwrap().iter().any(|r| r.name == topic),
        "{topic} in {}",
        dir.display()
    );
    let subs = store.list_subscriptions(topic).unwrap();
    let sub = subs.iter().find(|r| r.name == "s").expect("subscription s");
    let ids = store
        .dead_letters(sub.id, None)
        .unwrap()
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    (ids, sub.policy.clone())
}

#[tokio::test]
async fn admin_changes_on_a_replicated_topic_reach_every_replica_and_outlive_the_leader() {
    use ricochet_client::admin::{DeadLetterFilter, ReplayOptions};
    let _one = ONE_CLUSTER.lock().await;
    let Some(etcd) = etcd_or_skip("admin_changes_on_a_replicated_topic").await else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let t = "ledger";
    let full = "persistent://public/default/ledger";
    let (mut brokers, ids, leader, victim) = led_group(&etcd, "radm", root.path(), t).await;
    // Everything goes through a broker that survives: producers, consumers
    // and admin calls find the leader.
    let survivor = brokers[(victim + 1) % 3].url();
    let c = client(&survivor).await;
    let admin = c.admin();

    // Ten messages: m0..m5 terminated (dead letters), m6..m9 acked.
    let mut consumer = c
        .consumer(t)
        .subscription("s")
        .subscription_type(SubscriptionType::Shared)
        .initial_position(InitialPosition::Earliest)
        .ack_receipts(true)
        .subscribe()
        .await
        .unwrap();
    let p = c.producer(t).create().await.unwrap();
    for i in 0..10 {
        p.send(format!("m{i}")).await.unwrap();
    }
    for _ in 0..10 {
        let m = tokio::time::timeout(Duration::from_secs(10), consumer.receive())
            .await
            .expect("a delivery")
            .unwrap();
        let body = String::from_utf8_lossy(m.payload()).into_owned();
        let n: u32 = body[1..].parse().unwrap();
        if n < 6 {
            consumer
                .terminate(&m, &format!("bad {body}"))
                .await
                .unwrap();
        } else {
            consumer.ack(&m).await.unwrap();
        }
    }
    consumer.flush().await.unwrap();
    let start = Instant::now();
    let mut dlq = dead_letter_list(&admin, t).await;
    while dlq.len() < 6 && start.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        dlq = dead_letter_list(&admin, t).await;
    }
    assert_eq!(dlq.len(), 6, "{dlq:?}");

    // Stats agree with what was published, acked and dead-lettered.
    let stats = admin.topic_stats(t).await.unwrap();
    assert_eq!(
        (stats.message_count, stats.next_entry_id),
        (10, 10),
        "{stats:?}"
    );
    let sub = admin.subscription_stats(t, "s").await.unwrap();
    assert_eq!((sub.backlog, sub.dead_lettered), (0, 6), "{sub:?}");

    // A policy set on the leader.
    let policy: PolicySpec = "backoff:fixed=1s,max=7".parse().unwrap();
    admin.set_policy(t, "s", &policy).await.unwrap();
    let in_force = admin.policy(t, "s").await.unwrap();

    // Two dead letters replayed into the retry tier (delivered again), one
    // purged: three are left.
    let id_of = |payload: &str| dlq.iter().find(|(_, p)| p == payload).unwrap().0;
    let replay = DeadLetterFilter {
        entry_ids: vec![id_of("m0"), id_of("m1")],
        ..Default::default()
    };
    let done = admin
        .replay_dead_letters(t, "s", &ReplayOptions::new().filter(replay))
        .await
        .unwrap();
    assert_eq!(done.replayed, 2, "{done:?}");
    let purge = DeadLetterFilter {
        entry_ids: vec![id_of("m2")],
        ..Default::default()
    };
    let purged = admin
        .purge_dead_letters(t, "s", &purge, false)
        .await
        .unwrap();
    assert_eq!(purged.purged, 1, "{purged:?}");
    let mut again = Vec::new();
    while again.len() < 2 {
        let m = tokio::time::timeout(Duration::from_secs(10), consumer.receive())
            .await
            .expect("the replayed dead letters are delivered again")
            .unwrap();
        again.push(String::from_utf8_lossy(m.payload()).into_owned());
        consumer.ack(&m).await.unwrap();
    }
    again.sort();
    assert_eq!(again, ["m0", "m1"]);
    consumer.flush().await.unwrap();
    let left = dead_letter_list(&admin, t).await;
    let payloads: Vec<&str> = left.iter().map(|(_, p)| p.as_str()).collect();
    assert_eq!(payloads, ["m3", "m4", "m5"], "{left:?}");
    drop(consumer);

    // kill -9 of the leader: the new one shows the same dead letters,
    // policy and counts.
    brokers[victim].kill9();
    let others: Vec<String> = ids.iter().filter(|m| **m != leader).cloned().collect();
    let (next, _) = stable_leader(&survivor, t, &others, Duration::from_secs(30))
        .await
        .expect("a new leader");
    let start = Instant::now();
    let after = loop {
        match tokio::time::timeout(Duration::from_secs(5), admin.topic_stats(t)).await {
            Ok(Ok(_)) => break dead_letter_list(&admin, t).await,
            _ if start.elapsed() < Duration::from_secs(30) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => panic!("the new leader {next} does not answer: {other:?}"),
        }
    };
    assert_eq!(after, left, "the new leader {next}'s dead letters");
    assert_eq!(admin.policy(t, "s").await.unwrap(), in_force);
    let sub = admin.subscription_stats(t, "s").await.unwrap();
    assert_eq!((sub.backlog, sub.dead_lettered), (0, 3), "{sub:?}");
    let stats = admin.topic_stats(t).await.unwrap();
    assert_eq!(stats.next_entry_id, 10, "{stats:?}");

    // Every replica's store holds the same: the victim's (it made the
    // changes as leader), and both others' once killed.
    for b in brokers.iter_mut() {
        b.kill9();
    }
    let left_ids: Vec<u64> = left.iter().map(|(id, _)| *id).collect();
    for b in &brokers {
        let (dead, stored) = stored_state(&b.dir, full);
        assert_eq!(dead, left_ids, "dead letters stored by {}", b.id);
        assert_eq!(
            stored.as_ref(),
            Some(&policy),
            "the policy stored by {}",
            b.id
        );
    }

    // A replay job is stored through the group and resumes on the next
    // leader: a slow job started on the leader, the leader killed, the job
    // finishes on the new one, each dead letter delivered again once.
    for b in brokers.iter_mut() {
        b.restart().await;
    }
    let (leader, _) = stable_leader(&brokers[0].url(), t, &ids, Duration::from_secs(30))
        .await
        .expect("a leader after the restart");
    let victim = ids.iter().position(|m| *m == leader).unwrap();
    let survivor = brokers[(victim + 1) % 3].url();
    let c = client(&survivor).await;
    let admin = c.admin();
    let start = Instant::now();
    while admin.topic_stats(t).await.is_err() && start.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let slow = ReplayOptions::new().rate_per_second(1).detach(true);
    let job = admin.replay_dead_letters(t, "s", &slow).await.unwrap();
    assert_ne!(job.job_id, 0, "{job:?}");
    let jobs = admin.list_replay_jobs(Some(t), None).await.unwrap();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    brokers[victim].kill9();
    let others: Vec<String> = ids.iter().filter(|m| **m != leader).cloned().collect();
    let (next, _) = stable_leader(&survivor, t, &others, Duration::from_secs(30))
        .await
        .expect("a new leader");
    let start = Instant::now();
    loop {
        let done = match (
            admin.list_replay_jobs(Some(t), None).await,
            admin
                .list_dead_letters(t, "s", &DeadLetterFilter::default(), 10, None)
                .await,
        ) {
            (Ok(jobs), Ok(dlq)) => jobs.is_empty() && dlq.total == 0,
            _ => false,
        };
        if done {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(40),
            "the replay job did not finish on the new leader {next}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut consumer = c
        .consumer(t)
        .subscription("s")
        .subscription_type(SubscriptionType::Shared)
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await
        .unwrap();
    let mut again = Vec::new();
    // Two quiet seconds after the third: a doubled replay would show.
    let wait = |n: usize| Duration::from_secs(if n < 3 { 20 } else { 2 });
    while let Ok(Ok(m)) = tokio::time::timeout(wait(again.len()), consumer.receive()).await {
        again.push(String::from_utf8_lossy(m.payload()).into_owned());
        consumer.ack(&m).await.unwrap();
    }
    again.sort();
    assert_eq!(again, ["m3", "m4", "m5"], "delivered after the replay");
}

#[tokio::test]
async fn a_namespaces_default_factor_is_what_its_new_topics_get() {
    let _one = ONE_CLUSTER.lock().await;
    let Some(etcd) = etcd_or_skip("a_namespaces_default_factor").await else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let brokers = spawn_cluster(
        &etcd,
        "rns",
        3,
        root.path(),
        Duration::from_secs(3),
        &SpawnOptions::new(),
    )
    .await;
    let groups = "/ricochet/rns/groups/persistent://";
    let factor_of = |topic: &'static str| {
        let etcd = &etcd;
        async move {
            let (record, _) = etcd.get(&format!("{groups}{topic}")).await?;
            let record: serde_json::Value = serde_json::from_str(&record).unwrap();
            record["replicas"].as_u64()
        }
    };
    let c = client(&brokers[0].url()).await;
    let admin = c.admin();
    let ns = "acme/ledgers";
    let r = admin.namespace_replication(ns).await.unwrap();
    assert_eq!((r.replicas, r.effective), (0, 1), "{r:?}");
    let e = admin.set_namespace_replication(ns, 4).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::FailedPrecondition, "{e:?}");
    assert!(
        e.to_string().contains("needs 4 live brokers; 3 are live"),
        "{e}"
    );
    let e = admin.set_namespace_replication(ns, 0).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e:?}");
    let r = admin.set_namespace_replication(ns, 3).await.unwrap();
    assert_eq!((r.replicas, r.effective), (3, 3), "{r:?}");
    // Every broker sees it (etcd).
    for b in &brokers {
        let r = client(&b.url())
            .await
            .admin()
            .namespace_replication(ns)
            .await
            .unwrap();
        assert_eq!((r.replicas, r.effective), (3, 3), "asked of {}", b.url());
    }

    // Created without a factor: the namespace's.
    let info = admin
        .create_topic("persistent://acme/ledgers/made")
        .await
        .unwrap();
    assert!(info.created, "{info:?}");
    assert_eq!(factor_of("acme/ledgers/made").await, Some(3));
    // An explicit factor still wins.
    admin
        .create_replicated_topic("persistent://acme/ledgers/single", 1)
        .await
        .unwrap();
    assert_eq!(factor_of("acme/ledgers/single").await, None);

    // Auto-created by a producer, through another broker: a group of three
    // that takes the message.
    let auto = "persistent://acme/ledgers/auto";
    let other = client(&brokers[1].url()).await;
    let p = other
        .producer(auto)
        .send_timeout(Duration::from_secs(30))
        .create()
        .await
        .unwrap();
    p.send("first").await.unwrap();
    assert_eq!(factor_of("acme/ledgers/auto").await, Some(3));
    let stats = admin.topic_stats(auto).await.unwrap();
    assert_eq!(stats.message_count, 1, "{stats:?}");

    // Another namespace keeps the cluster's default (1).
    let plain = "persistent://acme/other/plain";
    let p = other.producer(plain).create().await.unwrap();
    p.send("x").await.unwrap();
    assert_eq!(factor_of("acme/other/plain").await, None);
}
