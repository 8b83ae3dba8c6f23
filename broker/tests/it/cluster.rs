//! Brokers coordinated through etcd (cluster mode), as child processes on
//! loopback against a real etcd (Debian's `etcd-server`; without it these
//! tests print that they are skipped, unless `RICOCHET_REQUIRE_ETCD=1`):
//! any broker answers where a topic lives; the partitions of a partitioned
//! topic spread over the brokers; a broker refuses a topic it does not own
//! with the owner in the trailers; a killed broker leaves only its topics
//! unavailable and gets them back, with everything acknowledged, when it
//! returns; a frozen owner acknowledges nothing under its old epoch once
//! etcd has dropped its lease, then re-claims with a higher epoch, and
//! applies no ack that reaches it after that. Plus the
//! standalone broker's answers (no etcd).

use crate::common;

use common::*;
use ricochet_proto::admin_client::AdminClient;
use ricochet_proto::cluster_client::ClusterClient;
use ricochet_proto::partitions_client::PartitionsClient;
use ricochet_proto::*;
use ricochet_testkit::{ClusterBroker, EtcdProcess, InProcessBroker, etcd_or_skip, spawn_cluster};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tonic::{Code, Status};

/// Cluster tests start an etcd and three brokers each: one at a time, so a
/// loaded machine does not starve their lease renewals.
static ONE_CLUSTER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Generous: the machine is shared and slow.
const LONG: Duration = Duration::from_secs(90);

const NAME: &str = "test";

async fn lookup(url: &str, topic: &str) -> Result<LookupResponse, Status> {
    ClusterClient::new(channel(url).await)
        .lookup(LookupRequest {
            topic: topic.into(),
        })
        .await
        .map(|r| r.into_inner())
}

fn topic(name: &str) -> String {
    format!("persistent://public/default/{name}")
}

fn trailer<'a>(s: &'a Status, key: &str) -> Option<&'a str> {
    s.metadata().get(key).and_then(|v| v.to_str().ok())
}

/// Sends one message; its receipt batch (panics on anything else).
async fn send_one(p: &mut RawProducer, payload: &str) -> SendReceipts {
    let m = p.msg(payload.as_bytes().to_vec());
    match p.send_batch(vec![m]).await {
        produce_response::Response::Receipts(r) => r,
        other => panic!("send failed: {other:?}"),
    }
}

async fn cluster(
    etcd: &EtcdProcess,
    n: usize,
    root: &std::path::Path,
    ttl_secs: u64,
) -> Vec<ClusterBroker> {
    spawn_cluster(
        etcd,
        NAME,
        n,
        root,
        Duration::from_secs(ttl_secs),
        &options(),
    )
    .await
}

fn by_url<'a>(brokers: &'a [ClusterBroker], url: &str) -> &'a ClusterBroker {
    brokers
        .iter()
        .find(|b| b.url() == url)
        .unwrap_or_else(|| panic!("no broker at {url}"))
}

#[tokio::test]
async fn a_standalone_broker_answers_lookups_itself() {
    let broker = InProcessBroker::start().await;
    let url = broker.url();
    let t = topic("alone");
    let answer = lookup(&url, &t).await.unwrap();
    assert_eq!(answer.url, url);
    assert_eq!(answer.topic, t);
    assert_eq!(
        (answer.live, answer.epoch, answer.cluster.as_str()),
        (true, 0, "")
    );
    assert_eq!(answer.broker_id.len(), 32, "the store id: {answer:?}");
    let mut p = RawProducer::open(&url, &t, "p").await.unwrap();
    assert_eq!(send_one(&mut p, "x").await.epoch, 0, "no epochs standalone");
    let list = ClusterClient::new(channel(&url).await)
        .list_brokers(ListBrokersRequest { with_topics: true })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(list.brokers.len(), 1, "{list:?}");
    let me = &list.brokers[0];
    assert_eq!(
        (me.id.as_str(), me.url.as_str(), me.live),
        (answer.broker_id.as_str(), url.as_str(), true)
    );
    assert_eq!(me.topics, vec![t.clone()]);
    // A partitioned topic's base name is not a topic to look up.
    let base = topic("parted");
    PartitionsClient::new(channel(&url).await)
        .create_partitioned_topic(UpdatePartitionsRequest {
            topic: base.clone(),
            partitions: 2,
            replicas: 0,
        })
        .await
        .unwrap();
    let e = lookup(&url, &base).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(lookup(&url, &format!("{base}-partition-1")).await.is_ok());
}

#[tokio::test]
async fn any_broker_finds_owners_partitions_spread_and_non_owners_redirect() {
    let Some(etcd) = etcd_or_skip("any_broker_finds_owners").await else {
        return;
    };
    let _one = ONE_CLUSTER.lock().await;
    let root = tempfile::tempdir().unwrap();
    let brokers = cluster(&etcd, 3, root.path(), 10).await;
    let urls: Vec<String> = brokers.iter().map(|b| b.url()).collect();
    let base = topic("orders");
    PartitionsClient::new(channel(&urls[0]).await)
        .create_partitioned_topic(UpdatePartitionsRequest {
            topic: base.clone(),
            partitions: 8,
            replicas: 0,
        })
        .await
        .unwrap();
    // The count is cluster-wide.
    let count = PartitionsClient::new(channel(&urls[2]).await)
        .get_partitions(PartitionsRequest {
            topic: base.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(count.partitions, 8);
    let e = lookup(&urls[1], &base).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "a base name: {e:?}");
    // A partitioned create refused (an ordinary topic has the name)
    // records nothing, not even the factor it asked for: a later create of
    // that name must not inherit it.
    let clash = topic("clash");
    lookup(&urls[0], &clash).await.unwrap();
    let e = PartitionsClient::new(channel(&urls[1]).await)
        .create_partitioned_topic(UpdatePartitionsRequest {
            topic: clash.clone(),
            partitions: 2,
            replicas: 3,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
    let recorded = |rel: &str| format!("/ricochet/{NAME}/{rel}/{clash}");
    assert_eq!(etcd.get(&recorded("partitioned-replicas")).await, None);
    assert_eq!(etcd.get(&recorded("partitioned")).await, None);

    // Spread over the three: 3 + 3 + 2.
    let mut per_broker: BTreeMap<String, usize> = BTreeMap::new();
    let mut owners = Vec::new();
    for i in 0..8 {
        let p = format!("{base}-partition-{i}");
        let owner = lookup(&urls[0], &p).await.unwrap();
        assert!(owner.live && owner.cluster == NAME, "{owner:?}");
        *per_broker.entry(owner.broker_id.clone()).or_default() += 1;
        owners.push((p, owner));
    }
    let mut counts: Vec<usize> = per_broker.values().copied().collect();
    counts.sort();
    assert_eq!(counts, vec![2, 3, 3], "{per_broker:?}");

    for (p, owner) in &owners {
        // The owner serves it, and its receipts carry its epoch.
        let mut producer = RawProducer::open(&owner.url, p, "p").await.unwrap();
        let receipt = send_one(&mut producer, "m").await;
        assert!(receipt.epoch > 0, "{receipt:?}");
        // Every broker gives the same answer, with that epoch.
        for url in &urls {
            let again = lookup(url, p).await.unwrap();
            assert_eq!(
                (again.broker_id.as_str(), again.url.as_str(), again.epoch),
                (owner.broker_id.as_str(), owner.url.as_str(), receipt.epoch),
                "lookup of {p} through {url}"
            );
        }
        // A broker that does not own it refuses with the owner's trailers:
        // a producer, a consumer, and a topic-scoped admin call.
        let other = urls.iter().find(|u| **u != owner.url).unwrap();
        let e = RawProducer::open(other, p, "p").await.unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        assert_eq!(
            e.message(),
            format!("topic {p} is owned by broker {}", owner.broker_id)
        );
        assert_eq!(
            trailer(&e, "ricochet-owner"),
            Some(owner.broker_id.as_str())
        );
        assert_eq!(trailer(&e, "ricochet-owner-url"), Some(owner.url.as_str()));
        let e = RawConsumer::subscribe(other, p, "s", SubOpts::default())
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        assert_eq!(
            trailer(&e, "ricochet-owner"),
            Some(owner.broker_id.as_str())
        );
        let e = AdminClient::new(channel(other).await)
            .topic_stats(TopicRequest { topic: p.clone() })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        assert_eq!(trailer(&e, "ricochet-owner-url"), Some(owner.url.as_str()));
    }
    // A new topic produced to a broker is placed on first use; if it lands
    // elsewhere the producer is sent there.
    let fresh = topic("fresh");
    match RawProducer::open(&urls[0], &fresh, "p").await {
        Ok(mut p) => assert!(send_one(&mut p, "x").await.epoch > 0),
        Err(e) => {
            assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
            let url = trailer(&e, "ricochet-owner-url").unwrap().to_owned();
            let mut p = RawProducer::open(&url, &fresh, "p").await.unwrap();
            assert!(send_one(&mut p, "x").await.epoch > 0);
        }
    }
    let list = ClusterClient::new(channel(&urls[1]).await)
        .list_brokers(ListBrokersRequest { with_topics: true })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(list.cluster, NAME);
    assert_eq!(list.brokers.len(), 3, "{list:?}");
    assert!(list.brokers.iter().all(|b| b.live), "{list:?}");
    let sum = |f: fn(&BrokerInfo) -> u64| list.brokers.iter().map(f).sum::<u64>();
    // "clash" is placed (looked up) but never served.
    assert_eq!(sum(|b| b.placed_topics), 10, "{list:?}");
    assert_eq!(sum(|b| b.owned_topics), 9, "{list:?}");
    assert_eq!(sum(|b| b.topics.len() as u64), 9, "{list:?}");
}

#[tokio::test]
async fn a_killed_broker_leaves_only_its_topics_unavailable_and_keeps_what_it_acknowledged() {
    let Some(etcd) = etcd_or_skip("a_killed_broker").await else {
        return;
    };
    let _one = ONE_CLUSTER.lock().await;
    let root = tempfile::tempdir().unwrap();
    let mut brokers = cluster(&etcd, 3, root.path(), 3).await;
    let urls: Vec<String> = brokers.iter().map(|b| b.url()).collect();
    // Six topics, two per broker; ten messages acknowledged on each.
    let mut placed = Vec::new();
    for i in 0..6 {
        let t = topic(&format!("t{i}"));
        let owner = lookup(&urls[i % 3], &t).await.unwrap();
        let mut p = RawProducer::open(&owner.url, &t, "p").await.unwrap();
        let mut epoch = 0;
        for j in 0..10 {
            epoch = send_one(&mut p, &format!("{i}-{j}")).await.epoch;
        }
        placed.push((t, owner.url, epoch));
    }
    let (victim_topic, victim_url, old_epoch) = placed[0].clone();
    let victim = brokers.iter().position(|b| b.url() == victim_url).unwrap();
    let victim_id = brokers[victim].id.clone();
    brokers[victim].kill9();
    let survivor = urls.iter().find(|u| **u != victim_url).unwrap().clone();

    // Once etcd has expired its lease, the others say it is down.
    let deadline = Instant::now() + LONG;
    let down = loop {
        match lookup(&survivor, &victim_topic).await {
            Err(e) if e.code() == Code::Unavailable => break e,
            other => {
                assert!(Instant::now() < deadline, "still {other:?}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    assert!(
        down.message().contains(&format!("broker {victim_id}")),
        "{down:?}"
    );
    // A producer sent to another broker is told the owner, without a URL.
    let e = RawProducer::open(&survivor, &victim_topic, "p")
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert_eq!(trailer(&e, "ricochet-owner"), Some(victim_id.as_str()));
    assert_eq!(trailer(&e, "ricochet-owner-url"), None);
    // The other brokers' topics keep working.
    for (t, url, _) in placed.iter().filter(|(_, u, _)| *u != victim_url) {
        let mut p = RawProducer::open(url, t, "p").await.unwrap();
        assert!(send_one(&mut p, "more").await.epoch > 0);
    }

    // It comes back on the same directory and port: it re-claims its
    // topics under a new lease (a higher epoch), with every message.
    let restarted = Instant::now();
    brokers[victim].restart().await;
    let deadline = Instant::now() + LONG;
    let back = loop {
        match lookup(&survivor, &victim_topic).await {
            Ok(o) if o.epoch > 0 => break o,
            other => {
                assert!(Instant::now() < deadline, "still {other:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    println!(
        "restart to served again (lookup through another broker): {:?}",
        restarted.elapsed()
    );
    assert_eq!(back.url, victim_url);
    assert!(back.epoch > old_epoch, "{} then {}", old_epoch, back.epoch);
    for (t, url, _) in placed.iter().filter(|(_, u, _)| *u == victim_url) {
        let mut c = RawConsumer::subscribe(url, t, "check", SubOpts::default())
            .await
            .unwrap();
        c.flow(100).await;
        let got: Vec<String> = c.take(10, LONG).await.iter().map(text).collect();
        let i = &t[t.len() - 1..];
        let want: Vec<String> = (0..10).map(|j| format!("{i}-{j}")).collect();
        assert_eq!(got, want, "{t}");
        let mut p = RawProducer::open(url, t, "p").await.unwrap();
        let now = lookup(&survivor, t).await.unwrap();
        assert_eq!(send_one(&mut p, "after").await.epoch, now.epoch, "{t}");
    }
}

/// One receipt as the test producer saw it: when its batch was sent and
/// when the receipt came.
#[derive(Debug, Clone)]
struct Seen {
    sent: Instant,
    at: Instant,
    epoch: u64,
    payload: String,
}

#[tokio::test]
async fn a_frozen_owner_acknowledges_nothing_under_its_old_epoch_once_its_lease_is_gone() {
    let Some(etcd) = etcd_or_skip("a_frozen_owner").await else {
        return;
    };
    let _one = ONE_CLUSTER.lock().await;
    let root = tempfile::tempdir().unwrap();
    let ttl = 2;
    let brokers = cluster(&etcd, 3, root.path(), ttl).await;
    let t = topic("fenced");
    let owner = lookup(&brokers[0].url(), &t).await.unwrap();
    let url = owner.url.clone();
    let frozen = by_url(&brokers, &url);
    let owner_key = format!("/ricochet/{NAME}/owners/{t}");

    // A producer that keeps sending (one message a batch), reopening after
    // each failure and resending what was not acknowledged.
    let stop = tokio_util::sync::CancellationToken::new();
    let producer = tokio::spawn({
        let (t, url, stop) = (t.clone(), url.clone(), stop.clone());
        async move {
            let mut seen: Vec<Seen> = Vec::new();
            let mut refusals: Vec<String> = Vec::new();
            let mut next = 0u64;
            while !stop.is_cancelled() {
                let mut p =
                    match tokio::time::timeout(LONG, RawProducer::open(&url, &t, "fp")).await {
                        Ok(Ok(p)) => p,
                        Ok(Err(e)) => {
                            refusals.push(format!("open: {:?} {}", e.code(), e.message()));
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                        Err(_) => continue,
                    };
                p.next_seq = next;
                while !stop.is_cancelled() {
                    let payload = format!("m{next}");
                    let m = p.msg(payload.clone().into_bytes());
                    let sent = Instant::now();
                    match tokio::time::timeout(LONG, p.send_batch_result(vec![m])).await {
                        Ok(Ok(produce_response::Response::Receipts(r))) => {
                            seen.push(Seen {
                                sent,
                                at: Instant::now(),
                                epoch: r.epoch,
                                payload,
                            });
                            next += 1;
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        Ok(Err(e)) => {
                            refusals.push(format!("send: {:?} {}", e.code(), e.message()));
                            break;
                        }
                        other => {
                            refusals.push(format!("send: {other:?}"));
                            break;
                        }
                    }
                }
            }
            (seen, refusals)
        }
    });
    // Acknowledged under the first epoch before anything happens.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let first = etcd.get(&owner_key).await.expect("the owner key").1;

    let froze = Instant::now();
    frozen.process().freeze();
    // etcd drops the lease (and the owner key) once the TTL has passed.
    let deadline = Instant::now() + LONG;
    let gone = loop {
        match etcd.get(&owner_key).await {
            Some((_, rev)) if rev == first => {
                assert!(Instant::now() < deadline, "the owner key outlived the TTL");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            _ => break Instant::now(),
        }
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    frozen.process().thaw();
    println!(
        "owner key gone {:?} after the freeze began (TTL {ttl} s)",
        gone.duration_since(froze)
    );
    // It re-claims under a new epoch and acknowledges again.
    let deadline = Instant::now() + LONG;
    let second = loop {
        match etcd.get(&owner_key).await {
            Some((_, rev)) if rev > first => break rev,
            _ => {
                assert!(Instant::now() < deadline, "never re-claimed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.cancel();
    let (seen, refusals) = producer.await.unwrap();
    println!("{} receipts, refusals on the way: {refusals:?}", seen.len());
    // The batch in flight when it froze was refused by the fence, not
    // acknowledged: the broker says why.
    assert!(
        refusals.iter().any(|r| r.contains("Unavailable")
            && r.contains(&format!("broker {} lost its etcd lease", frozen.id))),
        "{refusals:?}"
    );

    let first = first as u64;
    let before: Vec<&Seen> = seen.iter().filter(|s| s.epoch == first).collect();
    let after: Vec<&Seen> = seen.iter().filter(|s| s.epoch > first).collect();
    assert!(!before.is_empty(), "nothing acknowledged under {first}");
    assert!(
        !after.is_empty(),
        "nothing acknowledged after the re-claim: {seen:?}"
    );
    // The history: epochs never go back, no receipt of the old epoch after
    // etcd dropped the key, and the new epoch is the new key's.
    for w in seen.windows(2) {
        assert!(w[0].epoch <= w[1].epoch, "{w:?}");
    }
    // A receipt decided before the freeze may reach the producer after
    // it (the broker checks its fence before each receipt goes out, and
    // can be stopped between that check and the socket): one of a batch
    // sent after the freeze began was decided after it, and must not be
    // of the old epoch once the key is gone.
    for s in &before {
        assert!(
            s.at < gone || s.sent < froze,
            "acknowledged under epoch {first} after its key was gone, for a batch sent after the freeze began: {s:?}"
        );
    }
    assert!(
        seen.iter()
            .all(|s| s.epoch == first || s.epoch >= second as u64),
        "{seen:?}"
    );
    // Every acknowledged message is on the topic.
    let mut c = RawConsumer::subscribe(&url, &t, "check", SubOpts::default())
        .await
        .unwrap();
    c.flow(10_000).await;
    let acked: std::collections::BTreeSet<&str> = seen.iter().map(|s| s.payload.as_str()).collect();
    let mut stored = std::collections::BTreeSet::new();
    while let Some(m) = c.next(Duration::from_secs(10)).await {
        stored.insert(text(&m));
        if acked.iter().all(|a| stored.contains(*a)) {
            break;
        }
    }
    let missing: Vec<&&str> = acked.iter().filter(|a| !stored.contains(**a)).collect();
    assert!(
        missing.is_empty(),
        "acknowledged but not stored: {missing:?}"
    );
}

#[tokio::test]
async fn a_frozen_owner_applies_no_ack_once_its_lease_is_gone() {
    let Some(etcd) = etcd_or_skip("a_frozen_owner_applies_no_ack").await else {
        return;
    };
    let _one = ONE_CLUSTER.lock().await;
    let root = tempfile::tempdir().unwrap();
    let brokers = cluster(&etcd, 3, root.path(), 2).await;
    let t = topic("fenced-acks");
    let owner = lookup(&brokers[0].url(), &t).await.unwrap();
    let frozen = by_url(&brokers, &owner.url);
    let other = brokers.iter().find(|b| b.url() != owner.url).unwrap().url();
    let mut p = RawProducer::open(&owner.url, &t, "p").await.unwrap();
    let first = send_one(&mut p, "a").await.epoch;
    let mut c = RawConsumer::subscribe(&owner.url, &t, "s", SubOpts::default())
        .await
        .unwrap();
    c.flow(10).await;
    let m = c.next(LONG).await.expect("the message");
    let owner_key = format!("/ricochet/{NAME}/owners/{t}");

    frozen.process().freeze();
    let deadline = Instant::now() + LONG;
    while etcd
        .get(&owner_key)
        .await
        .is_some_and(|(_, rev)| rev as u64 == first)
    {
        assert!(Instant::now() < deadline, "the owner key outlived the TTL");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Sent while it is frozen and its lease is gone: read after the thaw.
    c.ack(vec![m.id.clone().unwrap()], 1).await;
    frozen.process().thaw();
    let end = c.end(LONG).await;
    assert_eq!(end.code(), Code::Unavailable, "{end:?}");
    assert!(
        end.message()
            .contains(&format!("broker {} lost its etcd lease", frozen.id)),
        "{end:?}"
    );
    assert!(
        !c.results.iter().any(|r| r.request_id == 1 && r.code == 0),
        "the ack was confirmed: {:?}",
        c.results
    );
    // Once it has re-claimed the topic, the message is still unacknowledged.
    let deadline = Instant::now() + LONG;
    while !lookup(&other, &t).await.is_ok_and(|o| o.epoch > first) {
        assert!(Instant::now() < deadline, "never re-claimed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut again = RawConsumer::subscribe(&owner.url, &t, "s", SubOpts::default())
        .await
        .unwrap();
    again.flow(10).await;
    let redelivered = again.next(LONG).await.expect("redelivered");
    assert_eq!((text(&redelivered), redelivered.id), ("a".to_owned(), m.id));
}
