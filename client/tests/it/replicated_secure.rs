//! Replicated topics in a cluster with TLS and JWT auth on (issue 22):
//! etcd and three brokers as child processes on loopback, each listening
//! with a certificate of a CA made here (rcgen), checking HS256 tokens, and
//! calling the others' `Replication` service over TLS (`[cluster]
//! peer_ca_file`) with a superuser's token (`[cluster] peer_token_file`).
//! An R3 topic is created, produced to and consumed from through the
//! client with a token; after a `kill -9` of its leader another member
//! leads and serves, and hands the leadership to the third member
//! (`cluster move T --to <member>`: the `Elect` call between brokers, over
//! TLS with the peer token) with the killed one still down. A caller of the `Replication` service that is not a
//! superuser is refused PERMISSION_DENIED and the group's leader stays
//! as it was, as is an admin's (a superuser, no broker) speaking for a
//! broker; one without a token is UNAUTHENTICATED. The brokers share one
//! peer token here, and each warns that their identities are shared
//! (per-broker tokens: `replicated_peerid.rs`). A broker whose peer
//! token names a role that is not a superuser does not start. A topic
//! moves between two such brokers (the mover reaches the target over TLS).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use ricochet_client::{Client, InitialPosition, SubscriptionType};
use ricochet_replication::proto::RaftRequest;
use ricochet_replication::proto::replication_client::ReplicationClient;
use ricochet_testkit::{BrokerProcess, EtcdProcess, SpawnOptions, etcd_or_skip, free_addr};
use tonic::transport::{Certificate, Channel, ClientTlsConfig};

use crate::replicated::ONE_CLUSTER;

pub(crate) const SECRET: &str = "replicated-secure-test-secret-0123";

pub(crate) fn token(role: &str) -> String {
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 3600;
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &serde_json::json!({ "sub": role, "exp": exp }),
        &jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes()).unwrap(),
    )
    .unwrap()
}

/// Creates `t` at factor 3 through `admin` once the three brokers are
/// registered (until then a factor of 3 is refused naming the live ones).
pub(crate) async fn create_once_live(admin: &Client, t: &str) {
    let start = Instant::now();
    loop {
        match admin.admin().create_replicated_topic(t, 3).await {
            Ok(info) => {
                assert!(info.created, "{info:?}");
                return;
            }
            Err(e) => assert!(
                start.elapsed() < Duration::from_secs(30) && e.to_string().contains("live brokers"),
                "{e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The files every broker of the test reads: the CA, one certificate for
/// 127.0.0.1 and localhost, the HS256 secret and the peer tokens.
pub(crate) struct Secrets {
    dir: PathBuf,
    ca_pem: String,
}

impl Secrets {
    pub(crate) fn new(dir: &Path) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "test ca");
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let key = KeyPair::generate().unwrap();
        let mut leaf =
            CertificateParams::new(vec!["127.0.0.1".into(), "localhost".into()]).unwrap();
        leaf.distinguished_name.push(DnType::CommonName, "broker");
        let cert = leaf.signed_by(&key, &ca).unwrap();
        let write = |name: &str, text: &str| std::fs::write(dir.join(name), text).unwrap();
        write("ca.pem", &ca.pem());
        write("broker.pem", &cert.pem());
        write("broker.key", &key.serialize_pem());
        write("secret", SECRET);
        write("broker.token", &token("broker"));
        write("alice.token", &token("alice"));
        // Per-broker peer identities (replicated_peerid.rs).
        for i in 0..3 {
            write(
                &format!("broker-b{i}.token"),
                &token(&format!("broker-b{i}")),
            );
        }
        Self {
            dir: dir.to_owned(),
            ca_pem: ca.pem(),
        }
    }

    pub(crate) fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    /// The config of broker `id` advertising `https://{addr}`, sending
    /// the token in file `peer_token` on its Raft calls.
    fn config(
        &self,
        (etcd, cluster): (&str, &str),
        id: &str,
        addr: std::net::SocketAddr,
        peer_token: &str,
    ) -> PathBuf {
        let text = format!(
            r#"advertise = "https://{addr}"

[auth]
enabled = true
token_secret_file = "{secret}"
superusers = ["admin", "broker", "broker-b0", "broker-b1", "broker-b2"]

[tls]
cert_file = "{cert}"
key_file = "{key}"

[cluster]
name = "{cluster}"
etcd = ["{etcd}"]
broker_id = "{id}"
lease_ttl = "3s"
peer_token_file = "{peer_token}"
peer_ca_file = "{ca}"
"#,
            secret = self.path("secret"),
            cert = self.path("broker.pem"),
            key = self.path("broker.key"),
            peer_token = self.path(peer_token),
            ca = self.path("ca.pem"),
        );
        let p = self.dir.join(format!("{id}.toml"));
        std::fs::write(&p, text).unwrap();
        p
    }

    pub(crate) async fn client(&self, url: &str, role: &str) -> Client {
        Client::builder(url)
            .tls_ca_pem(self.ca_pem.clone())
            .token(token(role))
            .request_timeout(Duration::from_secs(5))
            .reconnect_backoff(Duration::from_millis(50), Duration::from_millis(500))
            .connect()
            .await
            .unwrap()
    }

    /// A raw `Replication` client to `url` over TLS (no credentials).
    pub(crate) async fn replication(&self, url: &str) -> ReplicationClient<Channel> {
        let tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&self.ca_pem));
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

/// A broker of the secure cluster.
pub(crate) struct Secure {
    pub(crate) process: Option<BrokerProcess>,
    pub(crate) url: String,
    pub(crate) id: String,
}

/// Broker `b{i}`, its Raft calls carrying the shared peer token.
pub(crate) async fn spawn(
    s: &Secrets,
    (etcd, cluster): (&EtcdProcess, &str),
    root: &Path,
    i: usize,
) -> Secure {
    spawn_with(s, (etcd, cluster), root, i, "broker.token").await
}

/// Broker `b{i}`, its Raft calls carrying the token in file `peer_token`.
pub(crate) async fn spawn_with(
    s: &Secrets,
    (etcd, cluster): (&EtcdProcess, &str),
    root: &Path,
    i: usize,
    peer_token: &str,
) -> Secure {
    let addr = free_addr();
    let id = format!("b{i}");
    let config = s.config((etcd.url(), cluster), &id, addr, peer_token);
    let options = SpawnOptions::new()
        .listen(addr)
        .start_timeout(Duration::from_secs(60))
        .args(["--config".to_owned(), config.display().to_string()]);
    let process = BrokerProcess::spawn(&root.join(&id), &options).await;
    Secure {
        process: Some(process),
        url: format!("https://{addr}"),
        id,
    }
}

/// The member `Lookup` (asked of `url` as admin) names for `topic` once
/// the answer held for two reads 300 ms apart, one of `among`.
/// The next entry id of `topic`, asked as `admin` of the broker at `url`.
async fn next_entry_id(s: &Secrets, url: &str, topic: &str) -> u64 {
    let stats = s
        .client(url, "admin")
        .await
        .admin()
        .topic_stats(topic)
        .await
        .unwrap();
    stats.next_entry_id
}

pub(crate) async fn leader(s: &Secrets, url: &str, topic: &str, among: &[&str]) -> String {
    let c = s.client(url, "admin").await;
    let start = Instant::now();
    let mut last = None;
    while start.elapsed() < Duration::from_secs(30) {
        if let Ok(o) = c.lookup(topic).await
            && among.contains(&o.broker_id.as_str())
        {
            if last.as_ref() == Some(&o.broker_id) {
                return o.broker_id;
            }
            last = Some(o.broker_id);
        } else {
            last = None;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    panic!("no stable leader of {topic} among {among:?}: last {last:?}");
}

/// A Vote request for `group` that would make its receiver step down if
/// it were let through (a higher term, a longer log).
fn disruptive_vote(group: &str) -> RaftRequest {
    let vote = openraft::raft::VoteRequest::<u64>::new(
        openraft::Vote::new(1_000, 2),
        Some(openraft::LogId::new(
            openraft::CommittedLeaderId::new(1_000, 2),
            1_000_000,
        )),
    );
    RaftRequest {
        group: group.to_owned(),
        from: 2,
        body: ricochet_replication::encode(&vote).unwrap(),
    }
}

pub(crate) fn with_token<T>(body: T, role: &str) -> tonic::Request<T> {
    let mut r = tonic::Request::new(body);
    r.metadata_mut().insert(
        "authorization",
        format!("Bearer {}", token(role)).parse().unwrap(),
    );
    r
}

#[tokio::test]
async fn a_replicated_topic_with_tls_and_auth_on_survives_its_leaders_kill() {
    let _one = ONE_CLUSTER.lock().await;
    let Some(etcd) = etcd_or_skip("a_replicated_topic_with_tls_and_auth_on").await else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let s = Secrets::new(root.path());
    let mut brokers = Vec::new();
    for i in 0..3 {
        brokers.push(spawn(&s, (&etcd, "secure"), root.path(), i).await);
    }
    let ids: Vec<&str> = vec!["b0", "b1", "b2"];
    let t = "secured";
    let admin = s.client(&brokers[0].url, "admin").await;
    // Until the three brokers registered, a factor of 3 is refused.
    create_once_live(&admin, t).await;
    let first = leader(&s, &brokers[0].url, t, &ids).await;
    let victim = ids.iter().position(|m| *m == first).unwrap();
    let survivor = brokers[(victim + 1) % 3].url.clone();

    // Produce and consume through the client, over TLS with a token.
    let c = s.client(&survivor, "admin").await;
    let p = c.producer(t).create().await.unwrap();
    for i in 0..10 {
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
    for i in 0..10 {
        let m = tokio::time::timeout(Duration::from_secs(10), consumer.receive())
            .await
            .expect("a message within 10 s")
            .unwrap();
        assert_eq!(m.payload(), format!("m{i}").as_bytes());
        consumer.ack(&m).await.unwrap();
    }

    // The Replication service, called directly: a role that is not a
    // superuser is refused, and the group goes on under the same leader
    // (a let-through vote would not have changed it either while the
    // leader's lease holds: the refusal is what the mutant check catches);
    // without a token the call is unauthenticated; a superuser passes the
    // check (and is told the group it named is not there).
    let (record, _) = etcd
        .get(&format!(
            "/ricochet/secure/groups/persistent://public/default/{t}"
        ))
        .await
        .expect("the group's record");
    let record: serde_json::Value = serde_json::from_str(&record).unwrap();
    let group = format!(
        "persistent://public/default/{t}@{}",
        record["incarnation"].as_u64().expect("an incarnation")
    );
    let mut raw = s.replication(&brokers[victim].url).await;
    let e = raw
        .vote(with_token(disruptive_vote(&group), "alice"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert!(
        e.message().contains("\"alice\" is not a superuser"),
        "{e:?}"
    );
    // One shared peer token: every broker registered the same role, so the
    // per-broker check cannot tell them apart (the group formed and serves
    // above) and each broker said so once; an admin's token, a superuser's
    // but no broker's, may not speak for a broker's node.
    let e = raw
        .vote(with_token(disruptive_vote(&group), "admin"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    let node2 = record["members"][1].as_str().expect("three members");
    assert!(
        e.message()
            .contains(&format!("\"admin\" may not speak for broker {node2}")),
        "{e:?}"
    );
    let start = Instant::now();
    for b in &brokers {
        let process = b.process.as_ref().unwrap();
        while !process
            .log_tail()
            .iter()
            .any(|l| l.contains("peer identities are shared"))
        {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "{} did not warn that peer identities are shared: {:#?}",
                b.id,
                process.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let e = raw
        .append_entries(tonic::Request::new(disruptive_vote(&group)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
    let e = raw
        .vote(with_token(disruptive_vote("no-such-group@1"), "broker"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        leader(&s, &brokers[0].url, t, &ids).await,
        first,
        "the refused vote changed nothing"
    );
    p.send("m10").await.unwrap();
    let m = tokio::time::timeout(Duration::from_secs(10), consumer.receive())
        .await
        .expect("m10 within 10 s")
        .unwrap();
    assert_eq!(m.payload(), &b"m10"[..]);
    consumer.ack(&m).await.unwrap();

    // kill -9 of the leader: another member leads, and serves the same
    // clients (which follow it through Lookup).
    let killed = Instant::now();
    if let Some(p) = brokers[victim].process.take() {
        p.kill9();
    }
    let others: Vec<&str> = ids.iter().copied().filter(|m| *m != first).collect();
    let next = leader(&s, &survivor, t, &others).await;
    println!(
        "replicated (tls+auth): leader {first} killed; {next} answered by Lookup after {} ms",
        killed.elapsed().as_millis()
    );
    for i in 11..21 {
        tokio::time::timeout(Duration::from_secs(30), p.send(format!("m{i}")))
            .await
            .expect("a receipt from the new leader within 30 s")
            .unwrap();
    }
    for i in 11..21 {
        let m = tokio::time::timeout(Duration::from_secs(30), consumer.receive())
            .await
            .expect("a message from the new leader within 30 s")
            .unwrap();
        assert_eq!(
            m.payload(),
            format!("m{i}").as_bytes(),
            "acked messages are not delivered again; the new ones come in order"
        );
        consumer.ack(&m).await.unwrap();
    }
    assert_eq!(next_entry_id(&s, &survivor, t).await, 21);
    assert!(brokers.iter().any(|b| b.id == next));

    // A leadership transfer (`cluster move T --to <member>`) with one
    // member down: the leader waits until the chosen member holds its log
    // and asks it to stand (the peers' `Elect` call, over TLS with the
    // peer token); Lookup then names it and the same clients go on. The
    // leader first leads longer than its lease (1 s): a younger one
    // refuses the vote.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let to = *others.iter().find(|m| **m != next).unwrap();
    let moved = s
        .client(&survivor, "admin")
        .await
        .admin()
        .move_topic(t, Some(to))
        .await
        .unwrap();
    assert_eq!(moved.to_broker, to, "{moved:?}");
    assert_eq!(moved.entries, 0, "nothing copied: {moved:?}");
    assert_eq!(
        leader(&s, &survivor, t, &others).await,
        to,
        "Lookup names the chosen member"
    );
    println!(
        "replicated (tls+auth): leadership moved {next} -> {to} in {} ms, one member down",
        moved.millis
    );
    tokio::time::timeout(Duration::from_secs(30), p.send("m21"))
        .await
        .expect("a receipt from the chosen member within 30 s")
        .unwrap();
    let m = tokio::time::timeout(Duration::from_secs(30), consumer.receive())
        .await
        .expect("m21 within 30 s")
        .unwrap();
    assert_eq!(
        m.payload(),
        &b"m21"[..],
        "acked messages are not delivered again"
    );
    consumer.ack(&m).await.unwrap();
    assert_eq!(next_entry_id(&s, &survivor, t).await, 22);

    // A broker whose peer token is not a superuser's does not start.
    let addr = free_addr();
    let config = s.config((etcd.url(), "secure"), "b9", addr, "alice.token");
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(ricochet_testkit::broker_bin(None))
            .arg("--data-dir")
            .arg(config.with_extension("data"))
            .arg("--listen")
            .arg(addr.to_string())
            .arg("--config")
            .arg(&config)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(!out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("peer_token_file")
            && stderr.contains("\"alice\" is not in auth.superusers"),
        "{stderr}"
    );
}

#[tokio::test]
async fn a_topic_moves_between_brokers_that_listen_with_tls_and_check_tokens() {
    let _one = ONE_CLUSTER.lock().await;
    let Some(etcd) = etcd_or_skip("a_topic_moves_between_brokers_with_tls").await else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let s = Secrets::new(root.path());
    let mut brokers = Vec::new();
    for i in 0..2 {
        brokers.push(spawn(&s, (&etcd, "secmove"), root.path(), i).await);
    }
    let t = "travels";
    let c = s.client(&brokers[0].url, "admin").await;
    let start = Instant::now();
    let from = loop {
        match c.lookup(t).await {
            Ok(o) => break o.broker_id,
            Err(e) => assert!(start.elapsed() < Duration::from_secs(30), "{e}"),
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let p = c.producer(t).create().await.unwrap();
    for i in 0..5 {
        p.send(format!("m{i}")).await.unwrap();
    }
    let to = if from == "b0" { "b1" } else { "b0" };
    // Until both brokers registered, the move may find no target.
    let start = Instant::now();
    let moved = loop {
        match c.admin().move_topic(t, Some(to)).await {
            Ok(m) => break m,
            Err(e) => assert!(start.elapsed() < Duration::from_secs(30), "{e}"),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(
        (moved.to_broker.as_str(), moved.entries),
        (to, 5),
        "{moved:?}"
    );
    assert_eq!(c.lookup(t).await.unwrap().broker_id, to);
    let mut consumer = c
        .consumer(t)
        .subscription("s")
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await
        .unwrap();
    for i in 0..5 {
        let m = tokio::time::timeout(Duration::from_secs(10), consumer.receive())
            .await
            .expect("a moved message within 10 s")
            .unwrap();
        assert_eq!(m.payload(), format!("m{i}").as_bytes());
        consumer.ack(&m).await.unwrap();
    }
    drop(brokers);
}
