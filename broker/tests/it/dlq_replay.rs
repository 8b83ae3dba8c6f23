//! Dead letters as a human workflow (issue #14): replay scoped to one
//! subscription (its retry tier, the default) or to the whole topic, fix and
//! resend (edits recorded in the history), dry runs, group-by views and
//! replay jobs, against an in-process broker.

use crate::common;
use common::*;
use ricochet_proto::admin_client::AdminClient;
use ricochet_proto::*;
use ricochet_testkit::{InProcessBroker, now_ms};
use std::time::Duration;
use tonic::Code;
use tonic::transport::Channel;

const FULL: &str = "persistent://public/default/";

async fn admin(url: &str) -> AdminClient<Channel> {
    AdminClient::new(channel(url).await)
}

async fn dead_letters(url: &str, topic: &str, sub: &str) -> Vec<DeadLetter> {
    admin(url)
        .await
        .list_dead_letters(ListDeadLettersRequest {
            topic: topic.into(),
            subscription: sub.into(),
            limit: 1000,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .dead_letters
}

fn dlq_id(d: &DeadLetter) -> u64 {
    d.message.as_ref().unwrap().id.as_ref().unwrap().entry_id
}

/// A topic with subscriptions `s` (whose consumer dead-letters every
/// message it gets, with reason `why(i)`) and `other` (which acks them);
/// returns both consumers, each having seen `payloads` once.
async fn with_dead_letters(
    b: &InProcessBroker,
    topic: &str,
    payloads: &[&str],
    why: impl Fn(usize) -> String,
) -> (RawConsumer, RawConsumer) {
    let mut s = RawConsumer::simple(&b.url(), topic, "s", SubscriptionType::Shared).await;
    let mut other = RawConsumer::simple(&b.url(), topic, "other", SubscriptionType::Shared).await;
    s.flow(1000).await;
    other.flow(1000).await;
    let mut p = RawProducer::open(&b.url(), topic, "p").await.unwrap();
    p.send(payloads).await;
    let got = s.take(payloads.len(), WAIT).await;
    assert_eq!(got.len(), payloads.len());
    for (i, m) in got.iter().enumerate() {
        s.terminate(m.id.clone().unwrap(), &why(i), i as u64 + 1)
            .await;
        assert_eq!(s.result(WAIT).await.unwrap().code, 0);
    }
    let seen = other.take(payloads.len(), WAIT).await;
    assert_eq!(seen.len(), payloads.len());
    other
        .ack(seen.iter().map(|m| m.id.clone().unwrap()).collect(), 0)
        .await;
    assert_eq!(
        dead_letters(&b.url(), topic, "s").await.len(),
        payloads.len()
    );
    (s, other)
}

fn replay_req(topic: &str) -> ReplayDeadLettersRequest {
    ReplayDeadLettersRequest {
        topic: topic.into(),
        subscription: "s".into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn by_default_a_replay_goes_to_that_subscription_only() {
    let b = InProcessBroker::start().await;
    let (mut s, mut other) = with_dead_letters(&b, "scoped", &["a", "b"], |_| "bad".into()).await;
    let r = admin(&b.url())
        .await
        .replay_dead_letters(replay_req("scoped"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.replayed, 2);
    assert_eq!(r.dead_letter_ids.len(), 2);
    let retry_topic = format!("{FULL}scoped-s-RETRY");
    assert!(r.new_ids.iter().all(|id| id.topic == retry_topic), "{r:?}");
    let again = s.take(2, WAIT).await;
    let mut texts: Vec<String> = again.iter().map(text).collect();
    texts.sort();
    assert_eq!(texts, ["a", "b"]);
    for m in &again {
        assert_eq!(m.id.as_ref().unwrap().topic, retry_topic);
        assert_eq!(m.delivery_count, 1, "count kept");
        assert!(!m.properties.contains_key("DEAD_LETTER_REASON"));
    }
    assert!(dead_letters(&b.url(), "scoped", "s").await.is_empty());
    // The other subscription does not see them again.
    assert!(other.next(QUIET).await.is_none());
    // Acked from the retry tier, they are gone for good.
    s.ack(again.iter().map(|m| m.id.clone().unwrap()).collect(), 0)
        .await;
    assert!(s.next(QUIET).await.is_none());
    let stats = sub_stats(&b.url(), "scoped", "s").await;
    assert_eq!(
        (stats.dead_lettered, stats.scheduled_retries),
        (0, 0),
        "{stats:?}"
    );
}

#[tokio::test]
async fn a_replay_into_the_retry_tier_waits_for_its_time_and_can_reset_the_count() {
    let b = InProcessBroker::start().await;
    let (mut s, _other) = with_dead_letters(&b, "later", &["x"], |_| "bad".into()).await;
    let at = now_ms() + 1_500;
    admin(&b.url())
        .await
        .replay_dead_letters(ReplayDeadLettersRequest {
            deliver_at_ms: at,
            reset_delivery_count: Some(true),
            ..replay_req("later")
        })
        .await
        .unwrap();
    let m = s.next(WAIT).await.expect("delivered once its time came");
    assert!(now_ms() >= at, "delivered {} ms early", at - now_ms());
    assert_eq!(text(&m), "x");
    assert_eq!(m.delivery_count, 0, "count reset");
    assert!(!m.properties.contains_key("RECONSUMETIMES"));
}

#[tokio::test]
async fn a_topic_replay_is_seen_by_every_subscription() {
    let b = InProcessBroker::start().await;
    let (mut s, mut other) = with_dead_letters(&b, "all", &["m"], |_| "bad".into()).await;
    let r = admin(&b.url())
        .await
        .replay_dead_letters(ReplayDeadLettersRequest {
            mode: ReplayMode::Topic as i32,
            ..replay_req("all")
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.replayed, 1);
    assert_eq!(r.new_ids[0].topic, format!("{FULL}all"));
    let a = s.next(WAIT).await.expect("s sees it again");
    assert_eq!((text(&a).as_str(), a.delivery_count), ("m", 1));
    let o = other.next(WAIT).await.expect("other sees it too");
    assert_eq!((text(&o).as_str(), o.delivery_count), ("m", 0));
    assert!(dead_letters(&b.url(), "all", "s").await.is_empty());
    assert!(s.next(QUIET).await.is_none() && other.next(QUIET).await.is_none());
}

#[tokio::test]
async fn fix_and_resend_changes_the_message_and_records_who_and_what() {
    let b = InProcessBroker::start().await;
    let mut s = RawConsumer::simple(&b.url(), "fix", "s", SubscriptionType::Shared).await;
    s.flow(10).await;
    let mut p = RawProducer::open(&b.url(), "fix", "p").await.unwrap();
    let mut msg = p.msg("{\"v\":1}");
    msg.key = "old-key".into();
    msg.properties.insert("schema".into(), "v1".into());
    msg.properties.insert("junk".into(), "x".into());
    p.send_messages(vec![msg]).await;
    let m = s.next(WAIT).await.unwrap();
    s.terminate(m.id.clone().unwrap(), "schema mismatch", 1)
        .await;
    assert_eq!(s.result(WAIT).await.unwrap().code, 0);

    let edit = ReplayEdit {
        payload: Some(b"{\"v\":2,\"fixed\":true}".to_vec()),
        set_properties: [("schema".to_owned(), "v2".to_owned())].into(),
        unset_properties: vec!["junk".into(), "absent".into()],
        key: Some("new-key".into()),
    };
    admin(&b.url())
        .await
        .replay_dead_letters(ReplayDeadLettersRequest {
            edit: Some(edit),
            ..replay_req("fix")
        })
        .await
        .unwrap();
    let fixed = s.next(WAIT).await.expect("the fixed message");
    assert_eq!(text(&fixed), "{\"v\":2,\"fixed\":true}");
    assert_eq!(fixed.key, "new-key");
    assert_eq!(
        fixed.properties.get("schema").map(String::as_str),
        Some("v2")
    );
    assert!(!fixed.properties.contains_key("junk"));

    // Still broken: dead-lettered again, its history shows the edit.
    s.terminate(fixed.id.clone().unwrap(), "still broken", 2)
        .await;
    assert_eq!(s.result(WAIT).await.unwrap().code, 0);
    let dl = dead_letters(&b.url(), "fix", "s").await;
    assert_eq!(dl.len(), 1);
    let e = &dl[0].edits;
    assert_eq!(e.len(), 1, "{dl:?}");
    assert_eq!(e[0].by, "anonymous");
    assert_eq!((e[0].payload_size_before, e[0].payload_size_after), (7, 20));
    assert_eq!(e[0].properties_set, ["schema"]);
    assert_eq!(
        e[0].properties_removed,
        ["junk"],
        "absent keys are not listed"
    );
    assert!(e[0].key_changed);
    assert!(e[0].time_ms > 0 && e[0].time_ms <= now_ms());
    // The edit was a new attempt (its count reset by default): the
    // attempts are those since, and the edit history tells what came before.
    assert_eq!(dl[0].attempts.len(), 1, "{dl:?}");
    assert_eq!(dl[0].attempts[0].detail, "still broken");
}

#[tokio::test]
async fn dry_runs_say_what_would_be_touched_and_change_nothing() {
    let b = InProcessBroker::start().await;
    let (mut s, _other) = with_dead_letters(&b, "dry", &["a", "b", "c"], |i| {
        if i == 1 { "timeout" } else { "schema" }.into()
    })
    .await;
    let before: Vec<u64> = dead_letters(&b.url(), "dry", "s")
        .await
        .iter()
        .map(dlq_id)
        .collect();
    let schema = Some(DeadLetterFilter {
        reason_contains: "schema".into(),
        ..Default::default()
    });
    let mut a = admin(&b.url()).await;
    let r = a
        .replay_dead_letters(ReplayDeadLettersRequest {
            filter: schema.clone(),
            dry_run: true,
            ..replay_req("dry")
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.dry_run);
    assert_eq!(r.replayed, 0);
    assert_eq!(r.dead_letter_ids, [before[0], before[2]]);
    let p = a
        .purge_dead_letters(PurgeDeadLettersRequest {
            topic: "dry".into(),
            subscription: "s".into(),
            filter: None,
            dry_run: true,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(p.dry_run);
    assert_eq!((p.purged, p.dead_letter_ids.clone()), (0, before.clone()));
    // Nothing moved.
    let after: Vec<u64> = dead_letters(&b.url(), "dry", "s")
        .await
        .iter()
        .map(dlq_id)
        .collect();
    assert_eq!(after, before);
    assert!(s.next(QUIET).await.is_none());
    // The real purge reports the ids it removed.
    let p = a
        .purge_dead_letters(PurgeDeadLettersRequest {
            topic: "dry".into(),
            subscription: "s".into(),
            filter: schema,
            dry_run: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (p.purged, p.dead_letter_ids),
        (2, vec![before[0], before[2]])
    );
}

#[tokio::test]
async fn dead_letters_group_by_reason_consumer_and_hour() {
    let b = InProcessBroker::start().await;
    let start = now_ms();
    let _c = with_dead_letters(&b, "groups", &["a", "b", "c", "d", "e"], |i| {
        if i % 2 == 0 { "timeout" } else { "schema" }.into()
    })
    .await;
    let mut a = admin(&b.url()).await;
    let group = |by: DeadLetterGroupBy| {
        let mut a = a.clone();
        async move {
            a.group_dead_letters(GroupDeadLettersRequest {
                topic: "groups".into(),
                subscription: "s".into(),
                group_by: by as i32,
                ids_per_group: 2,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
        }
    };
    let by_reason = group(DeadLetterGroupBy::Reason).await;
    assert_eq!(by_reason.total, 5);
    let counts: Vec<(String, u64, usize)> = by_reason
        .groups
        .iter()
        .map(|g| (g.key.clone(), g.count, g.entry_ids.len()))
        .collect();
    assert_eq!(
        counts,
        [("timeout".into(), 3, 2), ("schema".into(), 2, 2)],
        "by the consumer's reason, largest first, ids capped"
    );
    let verdicts: Vec<&[String]> = by_reason.groups.iter().map(|g| &g.verdicts[..]).collect();
    assert_eq!(
        verdicts,
        [
            &["terminated: timeout".to_owned()][..],
            &["terminated: schema".to_owned()][..]
        ]
    );
    let by_verdict = group(DeadLetterGroupBy::Verdict).await;
    let keys: Vec<&str> = by_verdict.groups.iter().map(|g| g.key.as_str()).collect();
    assert_eq!(keys, ["terminated: timeout", "terminated: schema"]);
    let by_consumer = group(DeadLetterGroupBy::Consumer).await;
    assert_eq!(by_consumer.groups.len(), 1, "{by_consumer:?}");
    assert_eq!(by_consumer.groups[0].count, 5);
    let by_hour = group(DeadLetterGroupBy::Hour).await;
    let total: u64 = by_hour.groups.iter().map(|g| g.count).sum();
    assert_eq!(total, 5);
    for g in &by_hour.groups {
        assert!(g.key.ends_with(":00:00Z"), "{}", g.key);
        assert!(g.first_at_ms >= start && g.last_at_ms <= now_ms());
    }
    let bad = a
        .group_dead_letters(GroupDeadLettersRequest {
            topic: "groups".into(),
            subscription: "s".into(),
            group_by: 99,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn a_paced_replay_is_a_job_that_can_be_listed_and_cancelled() {
    let b = InProcessBroker::start().await;
    let payloads: Vec<String> = (0..20).map(|i| format!("m{i}")).collect();
    let refs: Vec<&str> = payloads.iter().map(String::as_str).collect();
    let (mut s, _other) = with_dead_letters(&b, "paced", &refs, |_| "bad".into()).await;
    let mut a = admin(&b.url()).await;
    // One message a second, detached: it answers at once with the job.
    let r = a
        .replay_dead_letters(ReplayDeadLettersRequest {
            rate_per_second: 1,
            detach: true,
            ..replay_req("paced")
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.job_id != 0);
    assert_eq!(r.dead_letter_ids.len(), 20);
    let first = s.next(WAIT).await.expect("the first one goes at once");
    assert_eq!(text(&first), "m0");
    let jobs = a
        .list_replay_jobs(ListReplayJobsRequest {
            topic: "paced".into(),
            subscription: "s".into(),
            local_only: false,
        })
        .await
        .unwrap()
        .into_inner()
        .jobs;
    assert_eq!(jobs.len(), 1);
    assert_eq!((jobs[0].id, jobs[0].total), (r.job_id, 20));
    assert!(jobs[0].done < 20);
    // Named with another topic, it is not found there.
    let elsewhere = a
        .cancel_replay_job(CancelReplayJobRequest {
            id: r.job_id,
            topic: "other".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(elsewhere.code(), Code::NotFound);
    a.cancel_replay_job(CancelReplayJobRequest {
        id: r.job_id,
        topic: "paced".into(),
    })
    .await
    .unwrap();
    let listed = a
        .list_replay_jobs(ListReplayJobsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .jobs;
    assert!(listed.is_empty(), "{listed:?}");
    // At most the chunk in flight goes after the cancel; most stay put.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let left = dead_letters(&b.url(), "paced", "s").await.len();
    assert!(left >= 15, "{left} left");
    let again = a
        .cancel_replay_job(CancelReplayJobRequest {
            id: r.job_id,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(again.code(), Code::NotFound);
}

#[tokio::test]
async fn bad_replay_requests_are_refused_and_change_nothing() {
    let b = InProcessBroker::start().await;
    let (mut s, _other) = with_dead_letters(&b, "badreq", &["a"], |_| "bad".into()).await;
    let mut a = admin(&b.url()).await;
    let cases = [
        ReplayDeadLettersRequest {
            mode: 7,
            ..replay_req("badreq")
        },
        ReplayDeadLettersRequest {
            mode: ReplayMode::Topic as i32,
            deliver_at_ms: now_ms() + 1_000,
            ..replay_req("badreq")
        },
        ReplayDeadLettersRequest {
            deliver_at_ms: u64::MAX,
            ..replay_req("badreq")
        },
        ReplayDeadLettersRequest {
            edit: Some(ReplayEdit {
                set_properties: [(String::new(), "v".to_owned())].into(),
                ..Default::default()
            }),
            ..replay_req("badreq")
        },
    ];
    for req in cases {
        let shown = format!("{:.120?}", req);
        let e = a.replay_dead_letters(req).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{shown}: {e}");
        assert!(e.message().len() < 200, "{e}");
    }
    assert_eq!(dead_letters(&b.url(), "badreq", "s").await.len(), 1);
    assert!(s.next(QUIET).await.is_none());
}

/// Every dead-lettering, replay and purge is announced on the namespace's
/// `__failure_events` topic, readable with the ordinary consumer API: a JSON
/// event with the ids, the consumer's reason beside the policy's verdict,
/// the attempts, the consumer and a payload excerpt.
#[tokio::test]
async fn failure_events_are_published_to_the_namespace_topic() {
    let b = InProcessBroker::start().await;
    let _c = with_dead_letters(&b, "evented", &["pay 12", "pay 13", "pay 14"], |i| {
        format!("declined {i}")
    })
    .await;
    let mut events = events_consumer(&b.url(), "watch", 100).await;
    let json = |m: &Message| -> serde_json::Value { serde_json::from_slice(&m.payload).unwrap() };
    let raw = events.take(3, WAIT).await;
    let mut dead: Vec<serde_json::Value> = raw.iter().map(json).collect();
    // Events of separate moves may be published in either order.
    dead.sort_by_key(|e| e["origin_id"].as_str().unwrap_or_default().to_owned());
    assert_eq!(dead.len(), 3, "{dead:?}");
    // Kind, topic and subscription are properties too, to filter without parsing.
    for m in &raw {
        let p = |k: &str| m.properties.get(k).map(String::as_str);
        assert_eq!(p("kind"), Some("dead_lettered"));
        assert_eq!(p("topic"), Some(&*format!("{FULL}evented")));
        assert_eq!(p("subscription"), Some("s"));
    }
    let letters = dead_letters(&b.url(), "evented", "s").await;
    for (i, e) in dead.iter().enumerate() {
        assert_eq!(e["kind"], "dead_lettered", "{e}");
        assert_eq!(e["topic"], format!("{FULL}evented"));
        assert_eq!(e["subscription"], "s");
        assert_eq!(e["cause"], format!("declined {i}"));
        assert_eq!(e["verdict"], format!("terminated: declined {i}"));
        assert_eq!(e["attempts"], 1);
        assert_eq!(e["payload_excerpt"], format!("pay {}", 12 + i));
        assert_eq!(
            e["message_id"],
            format!("{FULL}evented-s-DLQ:{}", dlq_id(&letters[i]))
        );
        assert_eq!(e["origin_id"], format!("{FULL}evented:{i}"));
        assert!(!e["consumer"].as_str().unwrap().is_empty(), "{e}");
    }

    // A replay of one, then a purge of the rest: one event each.
    let replayed = admin(&b.url())
        .await
        .replay_dead_letters(ReplayDeadLettersRequest {
            filter: Some(DeadLetterFilter {
                entry_ids: vec![dlq_id(&letters[0])],
                ..Default::default()
            }),
            ..replay_req("evented")
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(replayed.replayed, 1);
    admin(&b.url())
        .await
        .purge_dead_letters(PurgeDeadLettersRequest {
            topic: "evented".into(),
            subscription: "s".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut later: Vec<serde_json::Value> = events.take(2, WAIT).await.iter().map(json).collect();
    assert_eq!(later.len(), 2, "{later:?}");
    later.sort_by_key(|e| e["kind"].as_str().unwrap_or_default().to_owned());
    assert_eq!(later[0]["kind"], "purged");
    assert_eq!(
        later[0]["dead_letter_ids"],
        serde_json::json!([dlq_id(&letters[1]), dlq_id(&letters[2])])
    );
    assert_eq!(later[1]["kind"], "replayed");
    assert_eq!(
        later[1]["dead_letter_ids"],
        serde_json::json!([dlq_id(&letters[0])])
    );
    for e in &later {
        assert_eq!(e["by"], "anonymous");
        assert!(e.get("payload_excerpt").is_none(), "{e}");
    }
}

/// The admin API's default for the delivery count: an edited replay starts
/// again from 0 (an edit is a new attempt at a fixed message, so its first
/// failure must not dead-letter it again), an unchanged one keeps its
/// count; `reset_delivery_count` set either way overrides the default.
#[tokio::test]
async fn an_edited_replay_resets_the_count_unless_told_to_keep_it() {
    let b = InProcessBroker::start().await;
    let (mut s, _other) = with_dead_letters(&b, "edits", &["a", "b", "c"], |_| "bad".into()).await;
    let letters = dead_letters(&b.url(), "edits", "s").await;
    let id_of = |payload: &str| {
        letters
            .iter()
            .find(|d| d.message.as_ref().unwrap().payload == payload.as_bytes())
            .map(dlq_id)
            .unwrap()
    };
    let ids = [id_of("a"), id_of("b"), id_of("c")];
    let key = |k: &str| ReplayEdit {
        key: Some(k.into()),
        ..Default::default()
    };
    let cases = [
        (ids[0], Some(key("k1")), None),
        (ids[1], Some(key("k2")), Some(false)),
        (ids[2], None, None),
    ];
    for (id, edit, reset) in &cases {
        admin(&b.url())
            .await
            .replay_dead_letters(ReplayDeadLettersRequest {
                filter: Some(DeadLetterFilter {
                    entry_ids: vec![*id],
                    ..Default::default()
                }),
                edit: edit.clone(),
                reset_delivery_count: *reset,
                ..replay_req("edits")
            })
            .await
            .unwrap();
    }
    let mut got: Vec<(String, u32)> = s
        .take(3, WAIT)
        .await
        .iter()
        .map(|m| (text(m), m.delivery_count))
        .collect();
    got.sort();
    assert_eq!(
        got,
        vec![("a".into(), 0), ("b".into(), 1), ("c".into(), 1)],
        "edited: reset; edited with reset_delivery_count=false: kept; unchanged: kept"
    );
}
