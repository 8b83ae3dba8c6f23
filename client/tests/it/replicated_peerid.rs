//! Per-broker identities for the Raft calls (issue 22): the secure cluster
//! of `replicated_secure.rs` (etcd and three brokers as child processes,
//! TLS with a CA made here, HS256 tokens), but each broker calls its peers
//! with a token of its own role (`broker-b0`, `broker-b1`, `broker-b2`,
//! all superusers). An R3 topic forms, serves a producer and a consumer,
//! and survives a `kill -9` of its leader (the election among the two
//! others runs on their own tokens). Raw `Replication` calls made with one
//! broker's token speaking for another broker's node (an append entries, a
//! vote, an elect), or with an admin's token (a superuser, no broker), are
//! refused PERMISSION_DENIED naming the role and the broker claimed, and
//! the group's term is what it was: the forged term, 1 000 above it, never
//! reached the group.

use std::time::{Duration, Instant};

use openraft::raft::{AppendEntriesRequest, VoteRequest, VoteResponse};
use openraft::{CommittedLeaderId, LogId, Vote};
use ricochet_client::{Consumer, InitialPosition, SubscriptionType};
use ricochet_replication::proto::RaftRequest;
use ricochet_replication::proto::replication_client::ReplicationClient;
use ricochet_replication::{TypeConfig, decode, encode};
use ricochet_testkit::etcd_or_skip;
use tonic::transport::Channel;

use crate::replicated::ONE_CLUSTER;
use crate::replicated_secure::{Secrets, leader, spawn_with, with_token};

fn request(group: &str, from: u64, body: Vec<u8>) -> RaftRequest {
    RaftRequest {
        group: group.to_owned(),
        from,
        body,
    }
}

/// A vote of `candidate` in `term` with a long log: one the receiver
/// would act on (adopt the term, maybe grant) were it let through.
fn vote(group: &str, candidate: u64, term: u64) -> RaftRequest {
    let v = VoteRequest::<u64>::new(
        Vote::new(term, candidate),
        Some(LogId::new(
            CommittedLeaderId::new(term, candidate),
            1_000_000,
        )),
    );
    request(group, candidate, encode(&v).unwrap())
}

/// A heartbeat of leader `leader` in `term` (committed): the receiver
/// would take `term` as its own were it let through.
fn append(group: &str, leader: u64, term: u64) -> RaftRequest {
    let a = AppendEntriesRequest::<TypeConfig> {
        vote: Vote::new_committed(term, leader),
        prev_log_id: None,
        entries: Vec::new(),
        leader_commit: None,
    };
    request(group, leader, encode(&a).unwrap())
}

/// The term broker `raw` is in for `group`, asked with a vote of node
/// `me` in term 0 made with `role`'s token: refused by Raft (a lower
/// term), it answers the receiver's own vote and changes nothing.
async fn term_of(raw: &mut ReplicationClient<Channel>, group: &str, me: u64, role: &str) -> u64 {
    let probe = VoteRequest::<u64>::new(Vote::new(0, me), None);
    let reply = raw
        .vote(with_token(
            request(group, me, encode(&probe).unwrap()),
            role,
        ))
        .await
        .expect("a broker's own token speaking for its own node is let through")
        .into_inner();
    assert!(reply.error.is_empty(), "the probe vote is answered");
    let resp: VoteResponse<u64> = decode(&reply.body).unwrap();
    assert!(!resp.vote_granted, "a term-0 vote is never granted");
    resp.vote.leader_id().term
}

/// Receives and acks m{from} .. m{to}, in order.
async fn expect(consumer: &mut Consumer, from: usize, to: usize) {
    for i in from..to {
        let m = tokio::time::timeout(Duration::from_secs(30), consumer.receive())
            .await
            .expect("a message within 30 s")
            .unwrap();
        assert_eq!(m.payload(), format!("m{i}").as_bytes());
        consumer.ack(&m).await.unwrap();
    }
}

#[tokio::test]
async fn each_broker_speaks_raft_only_for_itself() {
    let _one = ONE_CLUSTER.lock().await;
    let Some(etcd) = etcd_or_skip("each_broker_speaks_raft_only_for_itself").await else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let s = Secrets::new(root.path());
    let mut brokers = Vec::new();
    for i in 0..3 {
        let token = format!("broker-b{i}.token");
        brokers.push(spawn_with(&s, (&etcd, "peerid"), root.path(), i, &token).await);
    }
    let ids = ["b0", "b1", "b2"];
    let t = "own-identities";
    let admin = s.client(&brokers[0].url, "admin").await;
    let start = Instant::now();
    loop {
        match admin.admin().create_replicated_topic(t, 3).await {
            Ok(info) => {
                assert!(info.created, "{info:?}");
                break;
            }
            Err(e) => assert!(
                start.elapsed() < Duration::from_secs(30) && e.to_string().contains("live brokers"),
                "{e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let first = leader(&s, &brokers[0].url, t, &ids).await;
    let victim = ids.iter().position(|b| *b == first).unwrap();
    let survivor = brokers[(victim + 1) % 3].url.clone();

    let c = s.client(&survivor, "admin").await;
    let p = c.producer(t).create().await.unwrap();
    for i in 0..5 {
        p.send(format!("m{i}")).await.unwrap();
    }
    let mut consumer = c
        .consumer(t)
        .subscription("s")
        .subscription_type(SubscriptionType::Shared)
        .initial_position(InitialPosition::Earliest)
        .ack_receipts(true)
        .subscribe()
        .await
        .unwrap();
    expect(&mut consumer, 0, 5).await;

    // The group: its Raft name and each member's node id (its position
    // in the record plus one).
    let (record, _) = etcd
        .get(&format!(
            "/ricochet/peerid/groups/persistent://public/default/{t}"
        ))
        .await
        .expect("the group's record");
    let record: serde_json::Value = serde_json::from_str(&record).unwrap();
    let group = format!(
        "persistent://public/default/{t}@{}",
        record["incarnation"].as_u64().expect("an incarnation")
    );
    let node_of = |b: &str| {
        record["members"]
            .as_array()
            .unwrap()
            .iter()
            .position(|m| m == b)
            .expect("a member") as u64
            + 1
    };
    let follower = ids[(victim + 1) % 3];
    let third = ids[(victim + 2) % 3];
    let (leader_node, third_node) = (node_of(first.as_str()), node_of(third));
    let third_role = format!("broker-{third}");
    let mut raw = s.replication(&brokers[(victim + 1) % 3].url).await;
    let before = term_of(&mut raw, &group, third_node, &third_role).await;
    let forged = before + 1_000;

    // The third broker's own token speaking for the leader's node: a
    // heartbeat, a vote, an elect. Refused, naming its role and the
    // leader's broker id.
    let denied = |e: tonic::Status, role: &str| {
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
        assert!(
            e.message()
                .contains(&format!("\"{role}\" may not speak for broker {first}")),
            "{e:?}"
        );
    };
    let e = raw
        .append_entries(with_token(append(&group, leader_node, forged), &third_role))
        .await
        .unwrap_err();
    denied(e, &third_role);
    let e = raw
        .vote(with_token(vote(&group, leader_node, forged), &third_role))
        .await
        .unwrap_err();
    denied(e, &third_role);
    let elect = request(&group, leader_node, encode(&Some(0u64)).unwrap());
    let e = raw
        .elect(with_token(elect.clone(), &third_role))
        .await
        .unwrap_err();
    denied(e, &third_role);
    // An admin's token: a superuser, but no broker.
    let e = raw
        .append_entries(with_token(append(&group, leader_node, forged), "admin"))
        .await
        .unwrap_err();
    denied(e, "admin");
    let e = raw.elect(with_token(elect, "admin")).await.unwrap_err();
    denied(e, "admin");
    // Its own token, but a body speaking for another node than its sender.
    let mut mixed = append(&group, leader_node, forged);
    mixed.from = third_node;
    let e = raw
        .append_entries(with_token(mixed, &third_role))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    // A node that is no member of the group.
    let e = raw
        .vote(with_token(vote(&group, 99, forged), &third_role))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("no member"), "{e:?}");

    // Nothing reached the group: the follower's term is not the forged
    // one (an election of its own on this loaded machine may have moved
    // it by a few), and the leader is the same.
    let after = term_of(&mut raw, &group, third_node, &third_role).await;
    assert!(
        after < forged && after - before < 10,
        "{follower}'s term went from {before} to {after} (forged {forged})"
    );
    assert_eq!(leader(&s, &survivor, t, &ids).await, first);
    println!(
        "peerid: {follower}'s term {before} before and {after} after the refused calls (forged {forged})"
    );
    assert!(
        brokers.iter().all(|b| !b
            .process
            .as_ref()
            .unwrap()
            .log_tail()
            .iter()
            .any(|l| l.contains("peer identities are shared"))),
        "each broker has its own peer role: no warning"
    );
    p.send("m5").await.unwrap();
    expect(&mut consumer, 5, 6).await;

    // kill -9 of the leader: the two others elect one of them (votes and
    // appends on their own tokens), which serves the same clients.
    let killed = Instant::now();
    if let Some(p) = brokers[victim].process.take() {
        p.kill9();
    }
    let others: Vec<&str> = ids.iter().copied().filter(|b| *b != first).collect();
    let next = leader(&s, &survivor, t, &others).await;
    assert_ne!(next, first);
    println!(
        "peerid: leader {first} killed; {next} named by Lookup after {} ms",
        killed.elapsed().as_millis()
    );
    for i in 6..11 {
        tokio::time::timeout(Duration::from_secs(30), p.send(format!("m{i}")))
            .await
            .expect("a receipt from the new leader within 30 s")
            .unwrap();
    }
    expect(&mut consumer, 6, 11).await;
}
