//! Three Raft replicas of one partition in this process, each on its own
//! tokio runtime with its own temp dir (store + Raft log) and Replication
//! server on 127.0.0.1. Killing one shuts its runtime down in the
//! background: every task (Raft core, server, checkpoints) is dropped where
//! it stands, nothing is shut down cleanly.

use ricochet_broker::BrokerConfig;
use ricochet_broker::replication::{
    GroupRegistry, NodeSettings, PartitionCommand, PublishBatch, PublishMessage, PublishReceipt,
    ReplicatedPartition, ReplicationError, ReplicationService, open_store,
};
use ricochet_broker::storage::{Cursor, Storage, SubscriptionRecord, TopicKind, TopicRecord};
use ricochet_testkit::FaultProxy;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const TOPIC: &str = "persistent://public/default/replicated-partition-0";

pub struct Node {
    pub id: u64,
    pub addr: SocketAddr,
    runtime: Option<tokio::runtime::Runtime>,
    pub part: Option<Arc<ReplicatedPartition>>,
}

impl Node {
    pub fn alive(&self) -> bool {
        self.part.is_some()
    }

    pub fn part(&self) -> &ReplicatedPartition {
        self.part.as_deref().expect("node is running")
    }

    pub fn part_arc(&self) -> Arc<ReplicatedPartition> {
        self.part.clone().expect("node is running")
    }

    /// Ends every task of the node at once (no clean shutdown).
    pub fn kill(&mut self) {
        self.part = None;
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

pub struct Cluster {
    _root: tempfile::TempDir,
    pub nodes: Vec<Node>,
    /// The settings nodes start (and restart) with.
    pub settings: NodeSettings,
    /// `proxies[(from, to)]`: the proxy node `from` reaches node `to` by.
    pub proxies: BTreeMap<(u64, u64), FaultProxy>,
}

pub fn settings() -> NodeSettings {
    NodeSettings {
        heartbeat: Duration::from_millis(50),
        election_timeout: (Duration::from_millis(300), Duration::from_millis(600)),
        ..NodeSettings::default()
    }
}

async fn start_node(
    id: u64,
    dir: PathBuf,
    bind: SocketAddr,
    settings: NodeSettings,
) -> (Node, SocketAddr) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("node runtime");
    let d = dir.clone();
    let started = runtime.spawn(async move {
        // A killed node's runtime releases its port as it winds down:
        // retry the bind for a while.
        let deadline = Instant::now() + Duration::from_secs(10);
        let listener = loop {
            match tokio::net::TcpListener::bind(bind).await {
                Ok(l) => break l,
                Err(_) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("bind {bind}: {e}"),
            }
        };
        let addr = listener.local_addr().expect("addr");
        let registry = GroupRegistry::default();
        let server = ReplicationService::new(registry.clone()).into_server();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(server)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        // A killed node's files are released by its runtime's threads as
        // they wind down: retry the opens for a while.
        let deadline = Instant::now() + Duration::from_secs(10);
        let part = loop {
            let attempt = async {
                let storage = open_store(&BrokerConfig::for_dir(d.join("store")))
                    .await
                    .map_err(|e| e.to_string())?;
                ReplicatedPartition::start(id, TOPIC, &d, &settings, storage, &registry)
                    .await
                    .map_err(|e| e.to_string())
            };
            match attempt.await {
                Ok(p) => break p,
                Err(_) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("node {id} does not start: {e}"),
            }
        };
        (Arc::new(part), addr)
    });
    let (part, addr) = started.await.expect("node start task");
    let node = Node {
        id,
        addr,
        runtime: Some(runtime),
        part: Some(part),
    };
    (node, addr)
}

impl Cluster {
    /// Three nodes, ids 1..=3; with `proxied`, every ordered pair of nodes
    /// talks through its own [`FaultProxy`].
    pub async fn start(proxied: bool) -> Self {
        Self::start_with(proxied, settings()).await
    }

    /// [`Cluster::start`] with these node settings.
    pub async fn start_with(proxied: bool, settings: NodeSettings) -> Self {
        let root = tempfile::tempdir().expect("temp dir");
        let mut cluster = Self {
            _root: root,
            nodes: Vec::new(),
            settings,
            proxies: BTreeMap::new(),
        };
        let ids = [1u64, 2, 3];
        // Bind first so every address (and every proxy) is known up front.
        let mut addrs = BTreeMap::new();
        for id in ids {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            addrs.insert(id, l.local_addr().expect("addr"));
        }
        if proxied {
            for from in ids {
                for to in ids {
                    if from != to {
                        let proxy = FaultProxy::start(addrs[&to]).await;
                        cluster.proxies.insert((from, to), proxy);
                    }
                }
            }
        }
        for id in ids {
            let node = cluster.spawn(id, addrs[&id]).await;
            cluster.nodes.push(node);
        }
        let members = addrs
            .iter()
            .map(|(id, a)| (*id, format!("http://{a}")))
            .collect();
        cluster.nodes[0]
            .part()
            .node()
            .initialize(members)
            .await
            .expect("initialize the group");
        cluster
    }

    /// Node `id`'s directory (its store and Raft files).
    pub fn dir(&self, id: u64) -> PathBuf {
        self._root.path().join(format!("node-{id}"))
    }

    fn settings_for(&self, id: u64) -> NodeSettings {
        let mut s = self.settings.clone();
        for ((from, to), proxy) in &self.proxies {
            if *from == id {
                s.peer_addrs.insert(*to, proxy.url());
            }
        }
        s
    }

    async fn spawn(&self, id: u64, bind: SocketAddr) -> Node {
        start_node(id, self.dir(id), bind, self.settings_for(id))
            .await
            .0
    }

    pub fn node(&self, id: u64) -> &Node {
        &self.nodes[(id - 1) as usize]
    }

    pub fn node_mut(&mut self, id: u64) -> &mut Node {
        &mut self.nodes[(id - 1) as usize]
    }

    /// Restarts a killed node on its directory and address.
    pub async fn restart(&mut self, id: u64) {
        let bind = self.node(id).addr;
        let node = self.spawn(id, bind).await;
        self.nodes[(id - 1) as usize] = node;
    }

    /// The leader the live nodes other than `except` agree on, once they do.
    pub async fn leader_except(&self, except: Option<u64>) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let views: Vec<Option<u64>> = self
                .nodes
                .iter()
                .filter(|n| n.alive() && Some(n.id) != except)
                .map(|n| n.part().node().leader())
                .collect();
            if let Some(Some(l)) = views.first()
                && Some(*l) != except
                && views.iter().all(|v| *v == Some(*l))
                && self.node(*l).alive()
            {
                return *l;
            }
            assert!(Instant::now() < deadline, "no leader agreed: {views:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn leader(&self) -> u64 {
        self.leader_except(None).await
    }

    /// Waits until node `id` applied everything node `leader` committed
    /// (its linearizable read point: at or past every acknowledged write).
    pub async fn caught_up(&self, id: u64, leader: u64) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let want = loop {
            let raft = self.node(leader).part().node().raft();
            match raft.ensure_linearizable().await {
                Ok(read) => break read.map(|l| l.index),
                Err(_) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => panic!("node {leader} cannot confirm it leads: {e}"),
            }
        };
        loop {
            let have = self.node(id).part().node().applied_index();
            if have >= want {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "node {id} applied {have:?}, leader committed {want:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn create_topic(&self, leader: u64) {
        let reply = self
            .node(leader)
            .part()
            .propose(&PartitionCommand::CreateTopic(topic_record(
                TOPIC,
                TopicKind::Normal,
            )))
            .await
            .expect("create topic");
        assert_eq!(reply, ricochet_broker::replication::PartitionReply::Done);
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            n.kill();
        }
    }
}

/// A Shared subscription `sub` of [`TOPIC`] with entries below `acked_to` acked.
pub fn subscription(id: u64, acked_to: u64) -> SubscriptionRecord {
    let mut main = Cursor::default();
    main.ack_range(0..acked_to);
    SubscriptionRecord {
        id,
        topic: TOPIC.to_owned(),
        name: "sub".to_owned(),
        sub_type: ricochet_proto::SubscriptionType::Shared,
        main,
        retry: Cursor::default(),
        policy: None,
        policy_source: None,
        retry_topic: None,
        dead_letter_topic: None,
        created_ms: 1,
        key_order: None,
        blocked_keys: BTreeMap::new(),
        breaker: None,
        breaker_state: None,
    }
}

pub fn topic_record(name: &str, kind: TopicKind) -> TopicRecord {
    TopicRecord {
        name: name.to_owned(),
        created_ms: 1,
        kind,
        replicas: 1,
        trimmed_below: 0,
    }
}

/// A batch of `n` 100-byte messages from `producer`, sequence ids from
/// `first_seq`.
pub fn batch(producer: &str, first_seq: u64, n: u64) -> PublishBatch {
    PublishBatch {
        topic: TOPIC.to_owned(),
        producer: producer.to_owned(),
        publish_time_ms: 1,
        messages: (first_seq..first_seq + n)
            .map(|s| PublishMessage {
                payload: vec![(s % 251) as u8; 100],
                sequence_id: s,
                ..PublishMessage::default()
            })
            .collect(),
    }
}

/// Publishes through node `via`, waiting at most `within`.
pub async fn publish_within(
    part: &ReplicatedPartition,
    batch: PublishBatch,
    within: Duration,
) -> Option<Result<Vec<PublishReceipt>, ReplicationError>> {
    tokio::time::timeout(within, part.publish(batch)).await.ok()
}

/// Every stored entry of the topic in `storage`: (entry id, producer,
/// sequence id).
pub fn stored(storage: &Arc<dyn Storage>) -> Vec<(u64, String, u64)> {
    use prost::Message as _;
    let (first, next) = storage.entry_range(TOPIC).unwrap_or((0, 0));
    let mut out = Vec::new();
    let mut from = first;
    while from < next {
        let chunk = storage.read(TOPIC, from, 1000, usize::MAX).expect("read");
        if chunk.is_empty() {
            break;
        }
        for (id, bytes) in chunk {
            let m = ricochet_proto::Message::decode(bytes.as_slice()).expect("decode entry");
            out.push((id, m.producer_name, m.sequence_id));
            from = id + 1;
        }
    }
    out
}
