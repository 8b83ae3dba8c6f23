//! Tiered storage against live in-process brokers: sealed segments
//! offloaded to a local directory (`object_store`'s `LocalFileSystem`) and
//! to a real S3-compatible server (`moto_server`, started by the test on a
//! loopback port; skipped with a message when it is not installed unless
//! `RICOCHET_REQUIRE_S3=1`). A consumer from the earliest position reads
//! across the offloaded/local boundary in order, `message get` reads an
//! offloaded entry, a restart keeps serving both tiers, offloads run while
//! a producer publishes, a store that is down never stops publishing and
//! the offload resumes once it is back, a corrupted object is refused with
//! DATA_LOSS, retention and topic deletion remove objects too, and bad
//! calls get a precise status.

use crate::common;

use common::tiered::*;
use common::*;
use ricochet_proto::admin_client::AdminClient;
use ricochet_proto::retention_client::RetentionClient;
use ricochet_proto::*;
use ricochet_testkit::InProcessBroker;
use std::time::Duration;
use tonic::Code;

const SEGMENT: u64 = 50;

async fn broker_in(
    dir: tempfile::TempDir,
    tier: ricochet_broker::storage::tiered::TieredConfig,
) -> InProcessBroker {
    InProcessBroker::start_in(dir, move |c| {
        c.segment_entries = SEGMENT;
        c.retention_interval = Duration::from_millis(100);
        c.tiered = Some(tier);
    })
    .await
}

fn topic(name: &str) -> String {
    format!("persistent://public/default/{name}")
}

async fn get_message(url: &str, topic: &str, id: u64) -> Result<GetMessageResponse, tonic::Status> {
    AdminClient::new(channel(url).await)
        .get_message(GetMessageRequest {
            id: Some(MessageId {
                topic: topic.into(),
                entry_id: id,
            }),
        })
        .await
        .map(|r| r.into_inner())
}

/// Offloads `t` and checks what the status then says: every sealed
/// segment remote, one local (the new active one).
async fn offload_all(url: &str, t: &str) -> TieredStatusResponse {
    let done = offload(url, t).await.expect("offload");
    assert!(done.offloaded_segments > 0, "{done:?}");
    assert_eq!(done.local_deleted, done.offloaded_segments, "{done:?}");
    let s = status(url, t).await;
    assert_eq!(s.local_segments, 1, "{s:?}");
    assert_eq!(s.remote_only_segments, s.offloaded_segments, "{s:?}");
    assert!(s.last_error.is_empty(), "{s:?}");
    s
}

#[tokio::test]
async fn a_consumer_reads_across_the_offloaded_boundary_in_order_from_a_local_directory() {
    let root = tempfile::tempdir().unwrap();
    let b = broker_in(tempfile::tempdir().unwrap(), local_tier(root.path())).await;
    let t = topic("across");
    publish(&b.url(), &t, 0..500).await;
    let s = offload_all(&b.url(), &t).await;
    assert_eq!(s.remote_only_segments, 10, "{s:?}");
    // The local copies are gone; the objects are there, each referenced.
    assert_eq!(local_segments(b.dir(), &t), 1);
    assert_eq!(files_under(root.path()), referenced(&s));
    // More after the boundary, then a reader from the earliest position.
    publish(&b.url(), &t, 500..560).await;
    let got = read_all(&b.url(), &t, "s", 560).await;
    assert_eq!(got, (0..560).collect::<Vec<_>>());
    // `message get` of an entry in an offloaded segment.
    let m = get_message(&b.url(), &t, 123).await.unwrap();
    let text = String::from_utf8(m.message.unwrap().payload).unwrap();
    assert_eq!(text, payload(123));
    // A restart checks the chain across both tiers and serves them.
    let dir = b.shutdown().await;
    let b = broker_in(dir, local_tier(root.path())).await;
    let got = read_all(&b.url(), &t, "again", 560).await;
    assert_eq!(got, (0..560).collect::<Vec<_>>());
    let stats = AdminClient::new(channel(&b.url()).await)
        .topic_stats(TopicRequest { topic: t.clone() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stats.first_entry_id, 0, "{stats:?}");
}

#[tokio::test]
async fn a_corrupted_object_is_refused_with_data_loss_not_served() {
    let root = tempfile::tempdir().unwrap();
    let b = broker_in(tempfile::tempdir().unwrap(), local_tier(root.path())).await;
    let t = topic("corrupt");
    publish(&b.url(), &t, 0..120).await;
    let s = offload_all(&b.url(), &t).await;
    let first = s.segments.iter().find(|g| g.state == "remote").unwrap();
    // One flipped byte inside the first record of the first object.
    let path = root.path().join(&first.object);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[48 + 24 + 10] ^= 0x20;
    std::fs::write(&path, bytes).unwrap();
    let e = get_message(&b.url(), &t, 1).await.unwrap_err();
    assert_eq!(e.code(), Code::DataLoss, "{e:?}");
    assert!(e.message().contains("checksum"), "{e:?}");
    // A consumer from the earliest position is not served the entries
    // either (nothing before the damage, nothing after it).
    let mut c = RawConsumer::simple(&b.url(), &t, "s", SubscriptionType::Exclusive).await;
    c.flow(200).await;
    let got = c.next(Duration::from_secs(2)).await;
    assert!(got.is_none(), "served from a damaged object: {got:?}");
}

#[tokio::test]
async fn retention_and_topic_deletion_remove_offloaded_segments_and_their_objects() {
    let root = tempfile::tempdir().unwrap();
    let b = broker_in(tempfile::tempdir().unwrap(), local_tier(root.path())).await;
    let t = topic("kept");
    publish(&b.url(), &t, 0..300).await;
    let s = offload_all(&b.url(), &t).await;
    let before = files_under(root.path()).len();
    assert_eq!(before, s.remote_only_segments as usize);
    // Keep about 100 messages' bytes: the oldest offloaded segments go, and
    // their objects after them.
    RetentionClient::new(channel(&b.url()).await)
        .set_retention(SetRetentionRequest {
            topic: t.clone(),
            policy: Some(RetentionPolicy {
                max_size_bytes: Some(100 * 200),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let s = status(&b.url(), &t).await;
        let files = files_under(root.path());
        if s.remote_only_segments < 5 && files == referenced(&s) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "retention left {s:?} and {files:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // What is left reads in order from its new first entry.
    let first = AdminClient::new(channel(&b.url()).await)
        .topic_stats(TopicRequest { topic: t.clone() })
        .await
        .unwrap()
        .into_inner()
        .first_entry_id as u32;
    assert!(first >= 150, "{first}");
    let got = read_all(&b.url(), &t, "s", (300 - first) as usize).await;
    assert_eq!(got, (first..300).collect::<Vec<_>>());
    // Deleting the topic deletes every object of it.
    AdminClient::new(channel(&b.url()).await)
        .delete_topic(DeleteTopicRequest {
            topic: t.clone(),
            force: true,
        })
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    while !files_under(root.path()).is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "objects left");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn bad_calls_get_a_precise_status_and_change_nothing() {
    let root = tempfile::tempdir().unwrap();
    let b = broker_in(tempfile::tempdir().unwrap(), local_tier(root.path())).await;
    let e = offload(&b.url(), &topic("nope")).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    let e = offload(&b.url(), "a/b/c/d/e").await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    let mut c = tiered(&b.url()).await;
    let e = c
        .set_offload_policy(SetOffloadPolicyRequest {
            namespace: "public/default".into(),
            policy: Some(OffloadPolicy {
                offload_after_ms: Some(-1),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("offload_after_ms"), "{e:?}");
    let e = c
        .set_offload_policy(SetOffloadPolicyRequest {
            namespace: "public/default".into(),
            topic: topic("x"),
            policy: Some(OffloadPolicy::default()),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    let got = c
        .get_offload_policy(GetOffloadPolicyRequest {
            namespace: "public/default".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(got.policy.is_none(), "{got:?}");
    // A namespace policy applies to its topics, a topic's own replaces it.
    let set = c
        .set_offload_policy(SetOffloadPolicyRequest {
            namespace: "public/default".into(),
            policy: Some(OffloadPolicy {
                offload_after_ms: Some(60_000),
                keep_local: true,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(set.policy.unwrap().offload_after_ms, Some(60_000));
    let eff = c
        .get_offload_policy(GetOffloadPolicyRequest {
            topic: topic("y"),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(eff.effective_from, "public/default", "{eff:?}");
    // A broker without a [tiered] section says so.
    let plain = InProcessBroker::start().await;
    let t = topic("plain");
    publish(&plain.url(), &t, 0..1).await;
    let e = offload(&plain.url(), &t).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("[tiered]"), "{e:?}");
}

#[tokio::test]
async fn keep_local_offloads_but_never_deletes_the_local_copy() {
    let root = tempfile::tempdir().unwrap();
    let b = broker_in(tempfile::tempdir().unwrap(), local_tier(root.path())).await;
    let t = topic("keep");
    tiered(&b.url())
        .await
        .set_offload_policy(SetOffloadPolicyRequest {
            topic: t.clone(),
            policy: Some(OffloadPolicy {
                keep_local: true,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap();
    publish(&b.url(), &t, 0..200).await;
    let done = offload(&b.url(), &t).await.unwrap();
    assert_eq!((done.offloaded_segments, done.local_deleted), (4, 0));
    let s = status(&b.url(), &t).await;
    assert_eq!(
        (s.remote_only_segments, s.offloaded_segments),
        (0, 4),
        "{s:?}"
    );
    assert_eq!(local_segments(b.dir(), &t), 5);
    assert_eq!(files_under(root.path()), referenced(&s));
}

// ---- against moto_server ------------------------------------------------

#[tokio::test]
async fn offload_under_load_to_s3_then_read_everything_in_order() {
    let Some(moto) = ricochet_testkit::moto_or_skip("offload_under_load_to_s3") else {
        return;
    };
    let cfg_dir = tempfile::tempdir().unwrap();
    let b = broker_in(
        tempfile::tempdir().unwrap(),
        s3_tier(&moto.endpoint(), cfg_dir.path()),
    )
    .await;
    let t = topic("load");
    let url = b.url();
    let (t2, url2) = (t.clone(), url.clone());
    let producer = tokio::spawn(async move { publish(&url2, &t2, 0..2000).await });
    let mut offloaded = 0;
    while !producer.is_finished() {
        match offload(&url, &t).await {
            Ok(done) => offloaded += done.offloaded_segments,
            // Before the producer created the topic.
            Err(e) if e.code() == Code::NotFound => {}
            Err(e) => panic!("offload: {e:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    producer.await.unwrap();
    offloaded += offload(&url, &t).await.unwrap().offloaded_segments;
    // Each segment offloaded once (triggers seal the active segment, so
    // there are more than 2000 / 50).
    let s = status(&url, &t).await;
    assert!(offloaded >= 40, "{offloaded}");
    assert_eq!(s.remote_only_segments, offloaded, "{s:?}");
    // Exactly the referenced objects are in the bucket.
    let store = object_store::aws::AmazonS3Builder::new()
        .with_bucket_name(ricochet_testkit::moto::BUCKET)
        .with_endpoint(moto.endpoint())
        .with_allow_http(true)
        .with_region("us-east-1")
        .with_access_key_id("testing")
        .with_secret_access_key("testing")
        .build()
        .unwrap();
    use futures::TryStreamExt as _;
    use object_store::ObjectStore as _;
    let mut listed: Vec<String> = store
        .list(None)
        .map_ok(|o| o.location.to_string())
        .try_collect()
        .await
        .unwrap();
    listed.sort();
    assert_eq!(listed, referenced(&s));
    let got = read_all(&url, &t, "s", 2000).await;
    assert_eq!(got, (0..2000).collect::<Vec<_>>());
    let m = get_message(&url, &t, 777).await.unwrap();
    assert_eq!(m.message.unwrap().payload, payload(777).into_bytes());
}

#[tokio::test]
async fn publishing_continues_while_s3_is_down_and_offload_resumes_when_it_is_back() {
    let Some(mut moto) = ricochet_testkit::moto_or_skip("s3_down") else {
        return;
    };
    moto.kill();
    let cfg_dir = tempfile::tempdir().unwrap();
    let mut tier = s3_tier(&moto.endpoint(), cfg_dir.path());
    // Offload every sealed segment, checked every 200 ms.
    tier.interval = Duration::from_millis(200);
    tier.offload_after = Some(Duration::ZERO);
    let b = broker_in(tempfile::tempdir().unwrap(), tier).await;
    let t = topic("down");
    let started = std::time::Instant::now();
    publish(&b.url(), &t, 0..300).await;
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "publishing took {:?} with the store down",
        started.elapsed()
    );
    // The offloader fails and says so; nothing is offloaded, nothing lost.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let s = status(&b.url(), &t).await;
        if !s.last_error.is_empty() {
            assert_eq!(s.offloaded_segments, 0, "{s:?}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no error reported: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let e = offload(&b.url(), &t).await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    // Back: the background task offloads everything sealed by itself.
    moto.restart();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let s = status(&b.url(), &t).await;
        if s.remote_only_segments >= 5 && s.last_error.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "offload did not resume: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let got = read_all(&b.url(), &t, "s", 300).await;
    assert_eq!(got, (0..300).collect::<Vec<_>>());
}
