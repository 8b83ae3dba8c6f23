//! Replacing a replication group's member that stays down (issue 22), in a
//! real cluster: etcd and four brokers as child processes on loopback
//! (`--replace-after 5s`, a snapshot every 50 Raft entries), one topic of
//! factor 3 with published, acked, nacked and dead-lettered messages
//! recorded in a `History`. A member is killed with SIGKILL (a follower in
//! one test, the leader in the other); the group's leader puts the fourth
//! broker in its place (a learner caught up from a snapshot and the log,
//! then the membership switched), so the group has three members again.
//! Then the current leader, an original member, is killed too: the two
//! left (one of them the new member) elect a leader that holds everything
//! — every receipted publish readable once, delivery counts not gone back,
//! the dead letters there — and with no broker left to replace the second
//! dead member, the listing says the group stays degraded, until the first
//! one killed comes back and takes that place. And a group whose creating
//! broker crashed before initializing it forms once that broker is back.

use crate::replicated::{ONE_CLUSTER, client, stable_leader};
use ricochet_client::{InitialPosition, PolicySpec, SubscriptionType};
use ricochet_testkit::{History, Place, SpawnOptions, etcd_or_skip, spawn_cluster};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

const TOPIC: &str = "members";

/// The group of [`TOPIC`] as broker `url` lists it: members and each
/// member's (health, lag).
async fn group(url: &str) -> Option<(Vec<String>, BTreeMap<String, (String, u64)>)> {
    let listed = client(url).await.admin().brokers(false).await.ok()?;
    let g = listed
        .groups
        .into_iter()
        .find(|g| g.topic.ends_with(TOPIC))?;
    let status = g
        .member_status
        .iter()
        .map(|m| (m.broker_id.clone(), (m.health.clone(), m.lag)))
        .collect();
    Some((g.members, status))
}

/// Waits until the group's members are `want`, each `ok` with lag 0.
async fn members_become(url: &str, want: &BTreeSet<String>, within: Duration) {
    let start = Instant::now();
    loop {
        let g = group(url).await;
        if let Some((members, status)) = &g {
            let set: BTreeSet<String> = members.iter().cloned().collect();
            if set == *want
                && members.len() == 3
                && want
                    .iter()
                    .all(|m| status.get(m).is_some_and(|(h, lag)| h == "ok" && *lag == 0))
            {
                return;
            }
        }
        assert!(
            start.elapsed() < within,
            "the group did not become {want:?} (all ok, lag 0) within {within:?}: {g:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The snapshot files under a broker's data directory.
fn snapshot_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let Ok(groups) = std::fs::read_dir(dir.join("raft-snapshots")) else {
        return Vec::new();
    };
    groups
        .flatten()
        .flat_map(|g| std::fs::read_dir(g.path()).into_iter().flatten().flatten())
        .map(|f| f.path())
        .filter(|p| p.extension().is_some_and(|e| e == "snap"))
        .collect()
}

pub(crate) fn dead(id: u64) -> bool {
    id.is_multiple_of(10)
}

pub(crate) fn nacked(id: u64) -> bool {
    id.is_multiple_of(5) && !dead(id)
}

/// A Shared subscription `s` on `topic` (Earliest, a 200 ms backoff).
pub(crate) fn shared(
    c: &ricochet_client::Client,
    topic: &str,
    receipts: bool,
) -> ricochet_client::ConsumerBuilder {
    c.consumer(topic)
        .subscription("s")
        .subscription_type(SubscriptionType::Shared)
        .initial_position(InitialPosition::Earliest)
        .ack_receipts(receipts)
        .policy("backoff:fixed=200ms,max=50".parse::<PolicySpec>().unwrap())
}

/// The first phase the member, move and transfer tests run: 60 messages
/// published with receipts, then every tenth dead-lettered, the other
/// fifths nacked until their count is 2, the rest acked with receipts,
/// all recorded in `h`. Returns the nacked messages' last delivery counts.
pub(crate) async fn settle_first_phase(
    c: &ricochet_client::Client,
    topic: &str,
    h: &History,
) -> BTreeMap<u64, u32> {
    let p = c.producer(topic).create().await.unwrap();
    for i in 0..60u64 {
        let id = i.to_string();
        h.sent(&id);
        p.send(id.clone()).await.unwrap();
        h.receipted(&id);
    }
    drop(p);
    let mut consumer = shared(c, topic, true).subscribe().await.unwrap();
    let mut counts: BTreeMap<u64, u32> = BTreeMap::new();
    let (mut acked, mut terminated) = (0, 0);
    let start = Instant::now();
    while acked + terminated < 54 || counts.values().filter(|c| **c >= 2).count() < 6 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "first phase: {acked} acked, {terminated} dead-lettered, nacked counts {counts:?}"
        );
        let Ok(Ok(m)) = tokio::time::timeout(Duration::from_secs(5), consumer.receive()).await
        else {
            continue;
        };
        let id: u64 = String::from_utf8_lossy(m.payload()).parse().unwrap();
        h.delivered(&id.to_string(), m.delivery_count());
        if dead(id) {
            consumer.terminate(&m, "bad").await.unwrap();
            terminated += 1;
        } else if nacked(id) {
            counts.insert(id, m.delivery_count());
            if consumer.nack_with_reason(&m, "later").await.is_ok() {
                h.failure_confirmed(&id.to_string());
            }
        } else {
            h.ack_sent(&id.to_string());
            consumer.ack(&m).await.unwrap();
            h.ack_confirmed(&id.to_string());
            acked += 1;
        }
    }
    consumer.flush().await.unwrap();
    drop(consumer);
    counts
}

/// The dead letters of `topic`'s subscription `s` are exactly the
/// messages [`dead`] picks of the first 60, each recorded in `h`.
pub(crate) async fn dead_letters_are_the_six(
    admin: &ricochet_client::admin::Admin,
    topic: &str,
    h: &History,
) {
    let all = ricochet_client::admin::DeadLetterFilter::default();
    let listed = admin
        .list_dead_letters(topic, "s", &all, 100, None)
        .await
        .unwrap();
    let mut dlq: Vec<u64> = listed
        .dead_letters
        .iter()
        .map(|d| {
            let m = d.message.as_ref().unwrap();
            String::from_utf8_lossy(&m.payload).parse().unwrap()
        })
        .collect();
    dlq.sort();
    assert_eq!(dlq, (0..60).filter(|i| dead(*i)).collect::<Vec<_>>());
    for id in &dlq {
        h.found(&id.to_string(), Place::DeadLettered);
    }
}

/// The audit a member test ends with: the dead letters are the six, then
/// every message still deliverable is read (recorded in `h` as pending)
/// and acked; exactly the nacked ones (`counts`, their counts when
/// nacked) were still pending, each at a higher count; and `h` holds.
pub(crate) async fn audit_the_rest(
    c: &ricochet_client::Client,
    topic: &str,
    h: &History,
    counts: &BTreeMap<u64, u32>,
) -> ricochet_testkit::history::Summary {
    dead_letters_are_the_six(&c.admin(), topic, h).await;
    let mut auditor = shared(c, topic, false).subscribe().await.unwrap();
    let mut again = BTreeMap::new();
    while let Ok(Ok(m)) = tokio::time::timeout(Duration::from_secs(5), auditor.receive()).await {
        let id = String::from_utf8_lossy(m.payload()).into_owned();
        h.delivered(&id, m.delivery_count());
        h.found(&id, Place::Pending);
        if let Ok(n) = id.parse::<u64>() {
            again.insert(n, m.delivery_count());
        }
        auditor.ack(&m).await.unwrap();
    }
    let summary = h.assert_ok();
    assert_eq!(
        again.keys().copied().collect::<Vec<_>>(),
        counts.keys().copied().collect::<Vec<_>>(),
        "{again:?}"
    );
    for (id, count) in counts {
        assert!(
            again[id] > *count,
            "{id}: nacked at {count}, then {}",
            again[id]
        );
    }
    summary
}

/// `n` brokers of cluster `name` (lease TTL 3 s) started with `options`,
/// and `topic` of factor 3 created on them; with the brokers' ids.
/// `RMOVE_LOG=info` echoes the brokers' logs (where a move's time goes),
/// else they log warnings only, and logs this process's client to stderr
/// (`RMOVE_CLIENT_LOG`, default `ricochet_client=debug`).
pub(crate) async fn cluster_with_topic(
    etcd: &ricochet_testkit::EtcdProcess,
    name: &str,
    n: usize,
    root: &std::path::Path,
    options: SpawnOptions,
    topic: &str,
) -> (Vec<ricochet_testkit::ClusterBroker>, Vec<String>) {
    let log = std::env::var("RMOVE_LOG").ok();
    if log.is_some() {
        // The client's side too (its reconnects and lookups), with UTC
        // timestamps like the brokers' lines.
        let filter =
            std::env::var("RMOVE_CLIENT_LOG").unwrap_or_else(|_| "ricochet_client=debug".into());
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .try_init();
    }
    let options = options
        .rust_log(log.clone().unwrap_or_else(|| "warn".into()))
        .echo_log(log.is_some());
    let brokers = spawn_cluster(etcd, name, n, root, Duration::from_secs(3), &options).await;
    let ids: Vec<String> = brokers.iter().map(|b| b.id.clone()).collect();
    client(&brokers[0].url())
        .await
        .admin()
        .create_replicated_topic(topic, 3)
        .await
        .unwrap();
    (brokers, ids)
}

async fn replaced_member_run(kill_leader_first: bool, name: &str) {
    let _one = ONE_CLUSTER.lock().await;
    let Some(etcd) = etcd_or_skip(name).await else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let options = SpawnOptions::new().args(["--replace-after", "5s", "--snapshot-every", "50"]);
    let (mut brokers, ids) = cluster_with_topic(&etcd, name, 4, root.path(), options, TOPIC).await;
    let (leader, _) = stable_leader(&brokers[0].url(), TOPIC, &ids, Duration::from_secs(20))
        .await
        .expect("a leader");
    let (original, _) = group(&brokers[0].url()).await.expect("the group is listed");
    assert_eq!(original.len(), 3, "{original:?}");
    let spare_id = ids
        .iter()
        .find(|b| !original.contains(b))
        .expect("a fourth broker")
        .clone();
    let spare = ids.iter().position(|b| *b == spare_id).unwrap();
    // Everything goes through the spare, which is never killed.
    let url = brokers[spare].url();
    let c = client(&url).await;
    let h = History::new();

    // 60 messages: every tenth dead-lettered, the other fifths nacked
    // (held, delivered again with a higher count), the rest acked.
    let counts = settle_first_phase(&c, TOPIC, &h).await;

    // The first kill: a member stays down past replace_after.
    let first = if kill_leader_first {
        leader.clone()
    } else {
        original.iter().find(|m| **m != leader).unwrap().clone()
    };
    let killed_at = Instant::now();
    brokers[ids.iter().position(|b| *b == first).unwrap()].kill9();
    let want: BTreeSet<String> = original
        .iter()
        .filter(|m| **m != first)
        .cloned()
        .chain([spare_id.clone()])
        .collect();
    members_become(&url, &want, Duration::from_secs(90)).await;
    // It caught up from a snapshot (the log behind the last one was
    // purged): the file it installed is in its data directory.
    let snaps = snapshot_files(&brokers[spare].dir);
    assert!(
        !snaps.is_empty(),
        "no snapshot installed on the new member {spare_id}"
    );
    println!(
        "replicated members: {first} replaced by {spare_id} within {} ms of its kill -9",
        killed_at.elapsed().as_millis()
    );

    // The second kill: the current leader, an original member.
    let among: Vec<String> = want.iter().cloned().collect();
    let (second, _) = stable_leader(&url, TOPIC, &among, Duration::from_secs(30))
        .await
        .expect("a leader after the replacement");
    assert_ne!(second, spare_id, "the new member leads before any kill");
    brokers[ids.iter().position(|b| *b == second).unwrap()].kill9();
    let left: Vec<String> = want.iter().filter(|m| **m != second).cloned().collect();
    let (third, _) = stable_leader(&url, TOPIC, &left, Duration::from_secs(30))
        .await
        .expect("a leader among the original member left and the new one");

    // Audit through the leader left: the dead letters, then whatever is
    // still deliverable, acked.
    let summary = audit_the_rest(&c, TOPIC, &h, &counts).await;
    println!("replicated members history (leader {third}): {summary:?}");

    // No broker is left to replace the second dead member: the listing
    // says so.
    let start = Instant::now();
    loop {
        let g = group(&url).await;
        if let Some((_, status)) = &g
            && status
                .get(&second)
                .is_some_and(|(h, _)| h == "down, no spare broker to replace it")
        {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the listing does not say the group stays degraded: {g:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // The first broker killed comes back: no longer a member, it drops
    // its copy, and as the only broker outside the group it takes the
    // second dead member's place: the group is whole again.
    brokers[ids.iter().position(|b| *b == first).unwrap()]
        .restart()
        .await;
    let whole: BTreeSet<String> = left.iter().cloned().chain([first.clone()]).collect();
    members_become(&url, &whole, Duration::from_secs(90)).await;
}

#[tokio::test]
async fn a_follower_down_past_replace_after_is_replaced_and_a_later_kill_loses_nothing() {
    replaced_member_run(false, "rfollow").await;
}

#[tokio::test]
async fn a_leader_down_past_replace_after_is_replaced_and_a_later_kill_loses_nothing() {
    replaced_member_run(true, "rlead").await;
}

/// A crash of the broker creating a group between writing its record to
/// etcd and initializing the group's membership (a failpoint aborts it
/// there) left a record no node ever initialized: every later create found
/// the record and returned, and the topic never had a leader. Restarted,
/// that broker (the record's first member, of a group that never had a
/// leader) initializes the group; a producer and a consumer then work
/// through it.
#[tokio::test]
async fn a_group_whose_creator_crashed_before_initializing_it_forms_after_the_restart() {
    let _one = ONE_CLUSTER.lock().await;
    let Some(etcd) = etcd_or_skip("a_group_whose_creator_crashed").await else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let armed = SpawnOptions::new().env("RICOCHET_FAILPOINT", "groups.create.after_record");
    let mut brokers = spawn_cluster(
        &etcd,
        "unformed",
        3,
        root.path(),
        Duration::from_secs(3),
        &armed,
    )
    .await;
    let t = "unformed";
    let created = client(&brokers[0].url())
        .await
        .admin()
        .create_replicated_topic(t, 3)
        .await;
    assert!(created.is_err(), "the creating broker aborted: {created:?}");
    let key = format!("/ricochet/unformed/groups/persistent://public/default/{t}");
    let (record, _) = etcd.get(&key).await.expect("the record was written");
    let record: serde_json::Value = serde_json::from_str(&record).unwrap();
    let creator = record["members"][0].as_str().unwrap().to_owned();
    let i = brokers.iter().position(|b| b.id == creator).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !brokers[i].process.as_mut().unwrap().has_exited() {
        assert!(Instant::now() < deadline, "{creator} did not abort");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    brokers[i]
        .restart_with(|o| o.without_env("RICOCHET_FAILPOINT"))
        .await;

    // Only an elected leader reports the group's replication.
    let report = format!("/ricochet/unformed/replication-status/persistent://public/default/{t}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while etcd.get(&report).await.is_none() {
        assert!(Instant::now() < deadline, "the group never had a leader");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let c = client(&brokers[(i + 1) % 3].url()).await;
    let mut consumer = c
        .consumer(t)
        .subscription("s")
        .subscription_type(SubscriptionType::Shared)
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await
        .unwrap();
    let p = c
        .producer(t)
        .send_timeout(Duration::from_secs(30))
        .create()
        .await
        .unwrap();
    for n in 0..5 {
        p.send(format!("m{n}")).await.unwrap();
    }
    let mut got = Vec::new();
    while got.len() < 5 {
        let m = tokio::time::timeout(Duration::from_secs(20), consumer.receive())
            .await
            .expect("a delivery")
            .unwrap();
        got.push(String::from_utf8_lossy(m.payload()).into_owned());
        consumer.ack(&m).await.unwrap();
    }
    assert_eq!(got, ["m0", "m1", "m2", "m3", "m4"]);
}
