//! A replicated topic's offload is its group's (issue 22): the leader
//! uploads its sealed segments to the object store and records each
//! through the group, every replica drops its local files of the
//! offloaded ranges, and after a `kill -9` of the leader the member that
//! leads next serves the offloaded ids from the object store. Etcd, moto
//! (one bucket) and three brokers as child processes, segments of 10 ids.
//!
//! The second test sets the topic's offload policy through the group: the
//! leader's pass offloads by it, and the member that leads after a
//! `kill -9` keeps it in force and offloads what it seals.
//!
//! The first test fails against a broker whose followers do not apply the group's offload
//! record (checked by hand with the apply of `Offloaded` made a no-op:
//! the followers keep every file, and the new leader's `GetMessage` of id
//! 5 is NOT_FOUND, see the session report), and against main's broker
//! before this change (the `Offload` call is refused FAILED_PRECONDITION).

use std::path::Path;
use std::time::{Duration, Instant};

use ricochet_broker::storage::segments::dir_name;
use ricochet_client::{InitialPosition, MessageId};
use ricochet_proto::tiered_client::TieredClient;
use ricochet_proto::{
    GetOffloadPolicyRequest, OffloadPolicy, SetOffloadPolicyRequest, TieredOffloadRequest,
    TieredStatusRequest, TieredStatusResponse,
};
use ricochet_testkit::{ClusterBroker, MotoServer, SpawnOptions, etcd_or_skip, moto_or_skip};

use super::replicated::{ONE_CLUSTER, client, led_group_with, next_leader};

/// Ids per segment (the brokers' `segment_entries`).
const ENTRIES: u64 = 10;
/// Messages published, 1 KiB each: ten segments.
const SENT: u64 = 100;

/// Brokers with segments of [`ENTRIES`] ids and one shared tier on moto
/// (its passes an hour apart: only the call offloads).
fn options(root: &Path, moto: &MotoServer) -> SpawnOptions {
    options_every(root, moto, "1h")
}

/// [`options`] with the leader's offload pass every `interval`.
fn options_every(root: &Path, moto: &MotoServer, interval: &str) -> SpawnOptions {
    let config = root.join("broker.toml");
    let credentials = MotoServer::credentials_file(root);
    std::fs::write(
        &config,
        format!(
            "segment_entries = {ENTRIES}\nretention_interval = \"1h\"\n\n[tiered]\n\
             url = \"s3://{bucket}/replicated\"\nendpoint = \"{endpoint}\"\n\
             region = \"us-east-1\"\nallow_http = true\ncredentials_file = \"{creds}\"\n\
             interval = \"{interval}\"\n",
            bucket = ricochet_testkit::moto::BUCKET,
            endpoint = moto.endpoint(),
            creds = credentials.display(),
        ),
    )
    .unwrap();
    SpawnOptions::new().config(config)
}

pub(crate) fn stored(topic: &str) -> String {
    format!("persistent://public/default/{topic}")
}

/// Publishes one message per id of `ids` to `topic` through `url`, each
/// `size` bytes of the id's low byte, one at a time.
pub(crate) async fn publish_filled(url: &str, topic: &str, ids: std::ops::Range<u64>, size: usize) {
    let c = client(url).await;
    let p = c.producer(topic).create().await.unwrap();
    for i in ids {
        p.send(vec![i as u8; size]).await.unwrap();
    }
}

/// Sets `topic`'s own offload policy through the broker at `url` (on a
/// replicated topic, a command of its group).
pub(crate) async fn set_topic_policy(url: &str, topic: &str, policy: OffloadPolicy) {
    tiered(url)
        .await
        .set_offload_policy(SetOffloadPolicyRequest {
            topic: stored(topic),
            policy: Some(policy),
            ..Default::default()
        })
        .await
        .expect("the topic's policy, through its group");
}

/// The first ids of `topic`'s segment files on `broker`'s disk.
pub(crate) fn segment_files(broker: &ClusterBroker, topic: &str) -> Vec<u64> {
    let dir = broker.dir.join("log").join(dir_name(&stored(topic)));
    let Ok(read) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut firsts: Vec<u64> = read
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            name.strip_suffix(".seg")?.parse().ok()
        })
        .collect();
    firsts.sort_unstable();
    firsts
}

async fn tiered(url: &str) -> TieredClient<tonic::transport::Channel> {
    TieredClient::connect(url.to_owned()).await.unwrap()
}

async fn status(url: &str, topic: &str) -> TieredStatusResponse {
    tiered(url)
        .await
        .offload_status(TieredStatusRequest {
            topic: topic.into(),
        })
        .await
        .expect("offload status")
        .into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leaders_offload_is_the_groups_and_the_next_leader_reads_the_objects() {
    let _one = ONE_CLUSTER.lock().await;
    let Some(moto) = moto_or_skip("the_leaders_offload_is_the_groups") else {
        return;
    };
    let Some(etcd) = etcd_or_skip("the_leaders_offload_is_the_groups").await else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let t = "offloaded";
    let (mut brokers, ids, leader, victim) =
        led_group_with(&etcd, "roff", root.path(), t, &options(root.path(), &moto)).await;
    publish_filled(&brokers[victim].url(), t, 0..SENT, 1024).await;

    // The offload on the leader: every segment (the active one sealed
    // first) goes to the object store, and the leader's files with it.
    let done = tiered(&brokers[victim].url())
        .await
        .offload(TieredOffloadRequest { topic: stored(t) })
        .await
        .expect("the leader offloads a replicated topic")
        .into_inner();
    assert!(
        done.offloaded_segments >= (SENT / ENTRIES - 1) as u32,
        "the leader {leader} offloaded {done:?}"
    );
    let on_leader = segment_files(&brokers[victim], t);
    assert!(
        on_leader.first().is_some_and(|f| *f >= SENT - ENTRIES),
        "the leader {leader}'s files after the offload: {on_leader:?}"
    );
    let st = status(&brokers[victim].url(), t).await;
    assert!(
        st.remote_only_segments >= (SENT / ENTRIES - 1) as u32,
        "the leader's status: {st:?}"
    );

    // Each follower drops its files of the offloaded ranges within
    // seconds (segments of 10 ids end at the same ids on every replica;
    // the one a follower still writes to stays).
    for (i, b) in brokers.iter().enumerate().filter(|(i, _)| *i != victim) {
        let start = Instant::now();
        loop {
            let held = segment_files(b, t);
            if held.first().is_some_and(|f| *f >= SENT - ENTRIES) {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "follower b{i}'s files 10 s after the leader {leader} offloaded: {held:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    // The leader dies; the next one has no file below id 90 and serves
    // the offloaded ids from the object store.
    brokers[victim].kill9();
    let follower = (victim + 1) % 3;
    let (next, next_url) = next_leader(&brokers[follower].url(), t, &ids, &leader).await;
    let next_at = ids.iter().position(|m| *m == next).unwrap();
    let files = segment_files(&brokers[next_at], t);
    assert!(
        files.first().is_some_and(|f| *f >= SENT - ENTRIES),
        "the new leader {next}'s files: {files:?}"
    );
    let c2 = client(&next_url).await;
    let stats = c2.admin().topic_stats(t).await.unwrap();
    assert_eq!(
        (stats.first_entry_id, stats.next_entry_id),
        (0, SENT),
        "the new leader {next}'s log spans both tiers"
    );
    for id in [0, 5, 42, SENT - ENTRIES - 1] {
        let got = c2
            .admin()
            .message(&MessageId::new(stored(t), id))
            .await
            .unwrap_or_else(|e| panic!("id {id} on the new leader {next}: {e:?}"));
        assert_eq!(
            got.message.map(|m| m.payload),
            Some(vec![id as u8; 1024]),
            "id {id} on {next}"
        );
    }
    let st = status(&next_url, t).await;
    assert!(
        st.remote_only_segments >= (SENT / ENTRIES - 1) as u32,
        "the new leader's status: {st:?}"
    );

    // A subscription from the earliest id reads every message in order,
    // across the object store and the local tail.
    let mut all = c2
        .consumer(t)
        .subscription("all")
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await
        .unwrap();
    for want in 0..SENT {
        let m = tokio::time::timeout(Duration::from_secs(10), all.receive())
            .await
            .unwrap_or_else(|_| panic!("message {want} within 10 s"))
            .unwrap();
        assert_eq!(m.id().entry_id(), want, "on {next}");
        assert_eq!(m.payload().as_ref(), &vec![want as u8; 1024][..]);
        all.ack(&m).await.unwrap();
    }
}

/// Waits until every broker of `on` holds no segment file of `topic`
/// below `below` (within `within`).
async fn files_leave(brokers: &[&ClusterBroker], topic: &str, below: u64, within: Duration) {
    for b in brokers {
        let start = Instant::now();
        loop {
            let held = segment_files(b, topic);
            if held.first().is_some_and(|f| *f >= below) {
                break;
            }
            assert!(
                start.elapsed() < within,
                "{}'s files of {topic} after {within:?}: {held:?} (wanted none below {below})",
                b.dir.display()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_topics_offload_policy_is_the_groups_and_outlives_its_leader() {
    let _one = ONE_CLUSTER.lock().await;
    let Some(moto) = moto_or_skip("the_topics_offload_policy_is_the_groups") else {
        return;
    };
    let Some(etcd) = etcd_or_skip("the_topics_offload_policy_is_the_groups").await else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let t = "bypolicy";
    let (mut brokers, ids, leader, victim) = led_group_with(
        &etcd,
        "roffp",
        root.path(),
        t,
        &options_every(root.path(), &moto, "1s"),
    )
    .await;
    // Every sealed segment is due at once.
    let policy = OffloadPolicy {
        offload_after_ms: Some(0),
        ..Default::default()
    };
    set_topic_policy(&brokers[victim].url(), t, policy).await;
    publish_filled(&brokers[victim].url(), t, 0..SENT, 1024).await;
    // The leader's pass offloads the nine sealed segments; every replica
    // drops its files of them ([90, 100) is still written to).
    let all: Vec<&ClusterBroker> = brokers.iter().collect();
    files_leave(&all, t, SENT - ENTRIES, Duration::from_secs(20)).await;

    brokers[victim].kill9();
    let (next, next_url) = next_leader(&brokers[(victim + 1) % 3].url(), t, &ids, &leader).await;
    let got = tiered(&next_url)
        .await
        .get_offload_policy(GetOffloadPolicyRequest {
            topic: stored(t),
            ..Default::default()
        })
        .await
        .expect("the policy on the new leader")
        .into_inner();
    assert_eq!(
        got.policy,
        Some(policy),
        "the new leader {next}'s own policy"
    );
    assert_eq!(got.effective_from, stored(t), "{got:?}");

    // The new leader's pass follows it: 30 more messages seal [90, 100)
    // and [100, 110), [110, 120), which leave both live replicas.
    publish_filled(&next_url, t, SENT..SENT + 3 * ENTRIES, 1024).await;
    let live: Vec<&ClusterBroker> = brokers
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != victim)
        .map(|(_, b)| b)
        .collect();
    files_leave(&live, t, SENT + 2 * ENTRIES, Duration::from_secs(20)).await;
    let c2 = client(&next_url).await;
    for id in [3, SENT + 5] {
        let got = c2
            .admin()
            .message(&MessageId::new(stored(t), id))
            .await
            .unwrap_or_else(|e| panic!("id {id} on the new leader {next}: {e:?}"));
        assert_eq!(got.message.map(|m| m.payload), Some(vec![id as u8; 1024]));
    }
}
