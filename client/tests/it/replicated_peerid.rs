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
use crate::replicated_secure::{Secrets, create_once_live, leader, spawn_with, with_token};

/// The Raft group name of replicated topic `t` in cluster `cluster` and
/// its member brokers, from its etcd record (a member's node id is its
/// position plus one).
async fn group_of(
    etcd: &ricochet_testkit::EtcdProcess,
    cluster: &str,
    t: &str,
) -> (String, Vec<String>) {
    let (record, _) = etcd
        .get(&format!(
            "/ricochet/{cluster}/groups/persistent://public/default/{t}"
        ))
        .await
        .expect("the group's record");
    let record: serde_json::Value = serde_json::from_str(&record).unwrap();
    let group = format!(
        "persistent://public/default/{t}@{}",
        record["incarnation"].as_u64().expect("an incarnation")
    );
    let members = record["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap().to_owned())
        .collect();
    (group, members)
}

/// A Raft call refused because `role` may not speak for broker `broker`.
fn refused_for(e: tonic::Status, role: &str, broker: &str) {
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert!(
        e.message()
            .contains(&format!("\"{role}\" may not speak for broker {broker}")),
        "{e:?}"
    );
}

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
    probed_term(raw, group, me, |r| with_token(r, role)).await
}

/// The term broker `raw` is in for `group`, asked with a term-0 vote of
/// node `me` (a request `dress` adds the caller's identity to). A member
/// starts its replica when it next reads the group records (every
/// 500 ms), so a follower the leader did not need for its majority may
/// not host the group yet: NOT_FOUND for it is asked again, for up to
/// 30 s; anything else fails the test.
async fn probed_term(
    raw: &mut ReplicationClient<Channel>,
    group: &str,
    me: u64,
    dress: impl Fn(RaftRequest) -> tonic::Request<RaftRequest>,
) -> u64 {
    let probe = VoteRequest::<u64>::new(Vote::new(0, me), None);
    let deadline = Instant::now() + Duration::from_secs(30);
    let reply = loop {
        match raw
            .vote(dress(request(group, me, encode(&probe).unwrap())))
            .await
        {
            Ok(reply) => break reply.into_inner(),
            Err(e) if e.code() == tonic::Code::NotFound && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => {
                panic!("a broker's own identity speaking for its own node is let through: {e:?}")
            }
        }
    };
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
    create_once_live(&admin, t).await;
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
    let (group, members) = group_of(&etcd, "peerid", t).await;
    let node_of = |b: &str| members.iter().position(|m| m == b).expect("a member") as u64 + 1;
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
    let denied = |e: tonic::Status, role: &str| refused_for(e, role, &first);
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

/// The certificate variant's files: a CA, a certificate per broker whose
/// CN is its role (`broker-b0` …), one for the admin client, the secret.
struct CertFiles {
    dir: std::path::PathBuf,
    ca: String,
}

impl CertFiles {
    fn new(dir: &std::path::Path) -> Self {
        use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "test ca");
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let write = |name: &str, text: &str| std::fs::write(dir.join(name), text).unwrap();
        for name in ["broker-b0", "broker-b1", "broker-b2", "admin"] {
            let key = KeyPair::generate().unwrap();
            let mut leaf =
                CertificateParams::new(vec!["127.0.0.1".into(), "localhost".into()]).unwrap();
            leaf.distinguished_name.push(DnType::CommonName, name);
            let cert = leaf.signed_by(&key, &ca).unwrap();
            write(&format!("{name}.pem"), &cert.pem());
            write(&format!("{name}.key"), &key.serialize_pem());
        }
        write("ca.pem", &ca.pem());
        write("secret", crate::replicated_secure::SECRET);
        Self {
            dir: dir.to_owned(),
            ca: ca.pem(),
        }
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(name)).unwrap()
    }

    /// Broker `b{i}`: clients must show a certificate of the CA, whose CN
    /// is their role without a token; no peer token, so its Raft calls
    /// prove its role with its own certificate.
    async fn spawn(
        &self,
        etcd: &ricochet_testkit::EtcdProcess,
        i: usize,
    ) -> (ricochet_testkit::BrokerProcess, String) {
        let addr = ricochet_testkit::free_addr();
        let id = format!("b{i}");
        let text = format!(
            r#"advertise = "https://{addr}"

[auth]
enabled = true
token_secret_file = "{secret}"
superusers = ["admin", "broker-b0", "broker-b1", "broker-b2"]

[tls]
cert_file = "{cert}"
key_file = "{key}"
client_ca_file = "{ca}"
require_client_cert = true
role_from_client_cert = true

[cluster]
name = "peercert"
etcd = ["{etcd}"]
broker_id = "{id}"
lease_ttl = "3s"
"#,
            secret = self.path("secret"),
            cert = self.path(&format!("broker-{id}.pem")),
            key = self.path(&format!("broker-{id}.key")),
            ca = self.path("ca.pem"),
            etcd = etcd.url(),
        );
        let config = self.dir.join(format!("{id}.toml"));
        std::fs::write(&config, text).unwrap();
        let options = ricochet_testkit::SpawnOptions::new()
            .listen(addr)
            .start_timeout(Duration::from_secs(60))
            .args(["--config".to_owned(), config.display().to_string()]);
        let process = ricochet_testkit::BrokerProcess::spawn(&self.dir.join(&id), &options).await;
        (process, format!("https://{addr}"))
    }

    /// A client with the admin's certificate and token.
    async fn client(&self, url: &str) -> ricochet_client::Client {
        ricochet_client::Client::builder(url)
            .tls_ca_pem(self.ca.clone())
            .tls_identity_pem(self.read("admin.pem"), self.read("admin.key"))
            .token(crate::replicated_secure::token("admin"))
            .request_timeout(Duration::from_secs(5))
            .reconnect_backoff(Duration::from_millis(50), Duration::from_millis(500))
            .connect()
            .await
            .unwrap()
    }

    /// A raw `Replication` client to `url` showing `name`'s certificate
    /// (and no token).
    async fn replication(&self, url: &str, name: &str) -> ReplicationClient<Channel> {
        use tonic::transport::{Certificate, ClientTlsConfig, Identity};
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca))
            .identity(Identity::from_pem(
                self.read(&format!("{name}.pem")),
                self.read(&format!("{name}.key")),
            ));
        let channel = Channel::from_shared(url.to_owned())
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .connect()
            .await
            .unwrap();
        ReplicationClient::new(channel)
    }
}

/// The broker `Lookup` names for `topic`, once two reads 300 ms apart
/// agree on one of `among`.
async fn settled_leader(c: &ricochet_client::Client, topic: &str, among: &[&str]) -> String {
    let start = Instant::now();
    let mut last = None;
    while start.elapsed() < Duration::from_secs(30) {
        match c.lookup(topic).await {
            Ok(o) if among.contains(&o.broker_id.as_str()) => {
                if last.as_ref() == Some(&o.broker_id) {
                    return o.broker_id;
                }
                last = Some(o.broker_id);
            }
            _ => last = None,
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    panic!("no stable leader of {topic} among {among:?}: last {last:?}");
}

/// The same checks with certificates as the brokers' peer identities
/// (`require_client_cert`, `role_from_client_cert`, no peer token): each
/// broker's Raft calls show its own certificate, whose CN is its role.
#[tokio::test]
async fn a_broker_whose_certificate_names_its_role_speaks_raft_only_for_itself() {
    let _one = ONE_CLUSTER.lock().await;
    let Some(etcd) = etcd_or_skip("a_broker_whose_certificate_names_its_role").await else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let f = CertFiles::new(root.path());
    let mut brokers = Vec::new();
    for i in 0..3 {
        brokers.push(f.spawn(&etcd, i).await);
    }
    let ids = ["b0", "b1", "b2"];
    let t = "certified";
    let admin = f.client(&brokers[0].1).await;
    create_once_live(&admin, t).await;
    let first = settled_leader(&admin, t, &ids).await;
    let victim = ids.iter().position(|b| *b == first).unwrap();
    let survivor = brokers[(victim + 1) % 3].1.clone();
    let c = f.client(&survivor).await;
    let p = c.producer(t).create().await.unwrap();
    for i in 0..3 {
        p.send(format!("m{i}")).await.unwrap();
    }
    let mut consumer = c
        .consumer(t)
        .subscription("s")
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await
        .unwrap();
    expect(&mut consumer, 0, 3).await;

    let (group, members) = group_of(&etcd, "peercert", t).await;
    let node_of = |b: &str| members.iter().position(|m| m == b).expect("a member") as u64 + 1;
    let third = ids[(victim + 2) % 3];
    let (leader_node, third_node) = (node_of(first.as_str()), node_of(third));
    let third_role = format!("broker-{third}");
    let follower_url = &brokers[(victim + 1) % 3].1;
    let mut as_third = f.replication(follower_url, &third_role).await;
    let before = probed_term(&mut as_third, &group, third_node, tonic::Request::new).await;
    let forged = before + 1_000;
    let denied = |e: tonic::Status, role: &str| refused_for(e, role, &first);
    let e = as_third
        .append_entries(tonic::Request::new(append(&group, leader_node, forged)))
        .await
        .unwrap_err();
    denied(e, &third_role);
    let e = as_third
        .vote(tonic::Request::new(vote(&group, leader_node, forged)))
        .await
        .unwrap_err();
    denied(e, &third_role);
    let mut as_admin = f.replication(follower_url, "admin").await;
    let e = as_admin
        .append_entries(tonic::Request::new(append(&group, leader_node, forged)))
        .await
        .unwrap_err();
    denied(e, "admin");
    let after = probed_term(&mut as_third, &group, third_node, tonic::Request::new).await;
    println!("peerid (certificates): term {before} before and {after} after (forged {forged})");
    assert!(after < forged && after - before < 10, "{before} -> {after}");
    assert_eq!(settled_leader(&c, t, &ids).await, first);

    // kill -9 of the leader: the others elect one of them on their
    // certificates, which serves.
    let (process, _) = brokers.remove(victim);
    process.kill9();
    let others: Vec<&str> = ids.iter().copied().filter(|b| *b != first).collect();
    let next = settled_leader(&c, t, &others).await;
    println!("peerid (certificates): leader {first} killed; {next} leads");
    tokio::time::timeout(Duration::from_secs(30), p.send("m3"))
        .await
        .expect("a receipt from the new leader within 30 s")
        .unwrap();
    expect(&mut consumer, 3, 4).await;
}
