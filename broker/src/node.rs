//! A broker node: the core (topics, subscriptions, storage) composed with
//! the features built on it: authorization ([`Auth`]), partitioned topics
//! ([`Partitions`]), retention ([`Retention`]) and, once the broker joined
//! one, its cluster ([`Cluster`], from the `ricochet-cluster` crate). The
//! services receive a node. The core knows none of these: they give it
//! hooks when it opens ([`crate::core::Hooks`]), and the cluster sees the
//! node through [`Host`], implemented here.

use crate::auth::Auth;
use crate::clock::SharedClock;
use crate::config::BrokerConfig;
use crate::core::{BrokerCore, Hooks, Placement};
use crate::error::Result;
use crate::name::TopicName;
use crate::partitions::{PartitionCounts, Partitions};
use crate::replication::groups::Groups;
use crate::replication::{GroupRegistry, NodeSettings};
use crate::retention::{Policies, Retention};
use crate::storage::{Storage, TopicKind, Watched};
use ricochet_cluster::{Cluster, Host, HostError};
use ricochet_policy::PolicyRegistry;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock, Weak};

/// The core and the features composed over it.
#[derive(Debug)]
pub struct Node {
    /// The registry of topics and subscriptions, with storage.
    pub core: Arc<BrokerCore>,
    /// Who may do what: token verification and grants.
    pub auth: Arc<Auth>,
    /// Partitioned topics.
    pub partitions: Partitions,
    /// Retention policies and backlog quotas.
    pub retention: Retention,
    /// Set once when the broker joins a cluster; empty when standalone.
    cluster: OnceLock<Arc<Cluster>>,
    /// The Raft groups of replicated topics held here, by name: what the
    /// `Replication` service routes to (empty when standalone).
    pub registry: GroupRegistry,
    /// This broker's replication groups; set with the cluster.
    groups: OnceLock<Arc<Groups>>,
    /// Topics this broker is moving off (their logs being pre-copied).
    pub(crate) moving: Moving,
}

impl Node {
    /// Opens a node on `storage` (watched for damage, see [`Watched`]):
    /// grants, partition counts and retention policies are loaded, then
    /// the core opens with them as its hooks (see [`BrokerCore::open`]).
    pub async fn open(
        config: BrokerConfig,
        storage: Arc<dyn Storage>,
        policies: PolicyRegistry,
        clock: SharedClock,
    ) -> Result<Arc<Self>> {
        let storage: Arc<dyn Storage> = Arc::new(Watched::new(storage));
        let phase = std::time::Instant::now();
        let auth = Arc::new(Auth::open(&config.auth, &config.tls, storage.clone())?);
        if config.cluster.is_some() {
            auth.expect_cluster();
        }
        let counts = Arc::new(PartitionCounts::load(storage.as_ref())?);
        let retention = Arc::new(Policies::load(storage.as_ref())?);
        tracing::info!(
            took_ms = phase.elapsed().as_millis() as u64,
            "start: grants, partitioned topics and retention policies loaded"
        );
        let hooks = Hooks {
            reserved: counts.clone(),
            opened: retention.clone(),
        };
        let core = BrokerCore::open(config, storage, policies, clock, hooks).await?;
        Ok(Arc::new(Self {
            auth,
            partitions: Partitions::new(counts, core.clone()),
            retention: Retention::start(retention, core.clone()),
            core,
            cluster: OnceLock::new(),
            registry: GroupRegistry::default(),
            groups: OnceLock::new(),
            moving: Moving::default(),
        }))
    }

    /// This broker's cluster membership; `None` when standalone.
    pub fn cluster(&self) -> Option<&Arc<Cluster>> {
        self.cluster.get()
    }

    /// In cluster mode (`[cluster]` configured), joins the cluster as the
    /// broker clients reach at `url`; standalone, does nothing.
    pub async fn join_cluster(self: &Arc<Self>, url: String) -> Result<()> {
        let Some(config) = &self.core.config.cluster else {
            return Ok(());
        };
        let id = config
            .broker_id
            .clone()
            .unwrap_or_else(|| self.core.keeper.store_id());
        // Checked before joining: a peer token the others would refuse
        // stops this broker before it is counted live.
        let (settings, peer_role) = raft_settings(&self.core.config, &self.auth)?;
        let node: Weak<Self> = Arc::downgrade(self);
        let host: Weak<dyn Host> = node;
        // Registered so that a replication group is formed only of brokers
        // sharing one object store ([`crate::replication::tier`]).
        let tier = self.core.config.tiered.as_ref().map(|t| t.identity());
        let rolls = ricochet_cluster::SegmentRolls {
            entries: self.core.config.segment_entries,
            max_bytes: self.core.config.segment_max_bytes,
        };
        let advertised = ricochet_cluster::Advertised {
            peer_role,
            tier,
            group_commands: crate::replication::gate::GROUP_COMMANDS,
            segment_rolls: Some(rolls),
        };
        let cluster = Cluster::join(
            config,
            id,
            url,
            advertised,
            host,
            self.core.shutdown.clone(),
        )
        .await?;
        warn_differing_rolls(&cluster, rolls).await;
        self.core.set_placement(Arc::new(EventsPlacement {
            cluster: cluster.clone(),
            config: self.core.config.clone(),
        }));
        let groups = Groups::start(
            cluster.clone(),
            self.core.clone(),
            self.registry.clone(),
            settings,
            &self.core.config.data_dir,
            self.core.shutdown.clone(),
        )?;
        let _ = self.groups.set(groups);
        self.retention.join(cluster.clone());
        self.auth.join(
            cluster.clone(),
            self.core.flusher.clone(),
            self.core.shutdown.clone(),
        );
        let _ = self.cluster.set(cluster);
        Ok(())
    }

    /// This broker's replication groups; `None` when standalone.
    pub fn groups(&self) -> Option<&Arc<Groups>> {
        self.groups.get()
    }

    /// Deletes this broker's copy of a topic that now lives elsewhere:
    /// its retention policy, then the topic with its subscriptions and
    /// their tiers.
    pub(crate) async fn forget_moved(&self, name: &TopicName) -> Result<()> {
        self.retention.forget_moved(name)?;
        self.core.forget_moved(name).await
    }
}

/// The topics a node is moving off (their logs being pre-copied to a
/// target): a second move of one of them is refused before it writes
/// anything on a target.
#[derive(Debug, Default)]
pub(crate) struct Moving(std::sync::Mutex<std::collections::HashSet<String>>);

impl Moving {
    /// Marks `topic` as moving; `false` if it already was.
    pub(crate) fn insert(&self, topic: &str) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(topic.to_owned())
    }

    /// Marks `topic` as no longer moving.
    pub(crate) fn remove(&self, topic: &str) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(topic);
    }
}

#[async_trait::async_trait]
impl Host for Node {
    async fn topics(&self) -> Vec<String> {
        self.core
            .all_topics()
            .await
            .iter()
            .filter(|t| t.kind() == TopicKind::Normal)
            .map(|t| t.name().to_string())
            .collect()
    }

    async fn messages_in(&self) -> u64 {
        self.core
            .all_topics()
            .await
            .iter()
            .filter(|t| t.kind() == TopicKind::Normal)
            .map(|t| t.counters.messages_in.load(Ordering::Relaxed))
            .sum()
    }

    async fn forget_moved(&self, topic: &str) -> Result<(), HostError> {
        // A name this broker stored: held to the rules it was stored under.
        let name = TopicName::parse_stored(topic)?;
        Ok(Node::forget_moved(self, &name).await?)
    }
}

/// Where the core's failure events go in a cluster: the cluster's routing
/// names their topic's owner, and events for another broker are forwarded
/// to it ([`crate::events_route`]) with this broker's peer settings.
#[derive(Debug)]
struct EventsPlacement {
    cluster: Arc<Cluster>,
    config: BrokerConfig,
}

#[async_trait::async_trait]
impl Placement for EventsPlacement {
    async fn serve_here(&self, topic: &TopicName) -> Result<()> {
        self.cluster.route(topic.as_str(), true).await?;
        Ok(())
    }

    async fn write_there(
        &self,
        topic: &TopicName,
        (owner, url): (&str, &str),
        messages: Vec<ricochet_proto::OutboundMessage>,
    ) -> Result<()> {
        let token = crate::events_route::events_token(
            self.config
                .cluster
                .as_ref()
                .and_then(|c| c.events_token_file.as_deref()),
        );
        crate::events_route::forward_to_owner(
            (owner, url),
            self.config.peer_endpoint(url)?,
            topic,
            messages,
            token.as_ref(),
        )
        .await
    }
}

/// How this broker's Raft groups run: its durability (`sync`: every log
/// append and applied batch flushed before it counts; `interval`: flushed
/// every `flush_interval`), Raft's default timing, snapshots every
/// `[cluster] snapshot_every` entries.
///
/// Peers are called over TLS when this broker listens with it (see
/// `TlsConfig::peer_client_config`), with the token of `[cluster]
/// peer_token_file`, which is checked now when auth is on: a token this
/// broker does not accept, or whose role is not a superuser, would have
/// every peer refuse its Raft calls, so the broker does not start.
/// Without a token file, when the peers take a client certificate's CN as
/// the role (`TlsConfig::peer_identity_from_cert`), its own certificate's
/// CN is its role, checked the same way. The role is returned with the
/// settings: the broker registers it as its peer identity (`None` with
/// auth off or no peer credential).
fn raft_settings(config: &BrokerConfig, auth: &Auth) -> Result<(NodeSettings, Option<String>)> {
    let cluster = config.cluster.as_ref();
    let snapshot_every =
        cluster.map_or(NodeSettings::default().snapshot_every, |c| c.snapshot_every);
    let transport = crate::replication::PeerTransport {
        tls: config
            .tls
            .peer_client_config(cluster.and_then(|c| c.peer_ca_file.as_deref()))?,
        token_file: cluster.and_then(|c| c.peer_token_file.clone()),
    };
    let mut peer_role = None;
    if auth.enabled()
        && let Some(path) = &transport.token_file
    {
        let bad = |why: String| {
            crate::error::BrokerError::Config(format!(
                "cluster.peer_token_file {}: {why}",
                path.display()
            ))
        };
        transport.authorization().map_err(bad)?;
        let token = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
        let role = auth
            .verify_token(token.trim())
            .map_err(|why| bad(format!("this broker does not accept its token: {why}")))?;
        if !auth.is_superuser(Some(&crate::auth::Principal { role: role.clone() })) {
            return Err(bad(format!(
                "its role {role:?} is not in auth.superusers, so the other brokers would refuse its Raft calls"
            )));
        }
        peer_role = Some(role);
    } else if auth.enabled() && auth.role_from_client_cert() && config.tls.peer_identity_from_cert()
    {
        // No token: the calls show this broker's certificate, whose CN the
        // peers take as its role.
        let role = config.tls.own_common_name()?;
        if !auth.is_superuser(Some(&crate::auth::Principal { role: role.clone() })) {
            return Err(crate::error::BrokerError::Config(format!(
                "tls.cert_file: its CN {role:?} (this broker's role on its Raft calls, without \
                 cluster.peer_token_file) is not in auth.superusers, so the other brokers would \
                 refuse them"
            )));
        }
        peer_role = Some(role);
    }
    let settings = NodeSettings {
        transport,
        durability: match config.durability {
            crate::config::Durability::Sync => crate::replication::Durability::Sync,
            crate::config::Durability::Interval => crate::replication::Durability::Interval,
        },
        flush_interval: config.flush_interval,
        snapshot_every,
        // A tenth of the interval kept behind each snapshot (at most the
        // default 1 000): a follower a little behind catches up from the
        // log, one further behind from the snapshot.
        snapshot_keep: (snapshot_every / 10).min(NodeSettings::default().snapshot_keep),
        ..NodeSettings::default()
    };
    Ok((settings, peer_role))
}

/// Warns, once at join, about each registered broker whose segment rolls
/// (`segment_entries`, `segment_max_bytes`) differ from this one's: the
/// replicas of a replicated topic roll where their own broker's settings
/// say, so a group with members of both splits the topic into segments at
/// different ids (each replica is still whole and correct; an offload
/// through the group seals at one id, but the size and block rolls after
/// it differ again). A broker that registers no rolls (an older build) is
/// not compared.
async fn warn_differing_rolls(
    cluster: &ricochet_cluster::Cluster,
    mine: ricochet_cluster::SegmentRolls,
) {
    let registered = match cluster.segment_rolls().await {
        Ok(r) => r,
        Err(e) => {
            tracing::debug!(error = %e, "cannot read the brokers' segment rolls to compare them");
            return;
        }
    };
    for (broker, theirs) in
        ricochet_cluster::membership::differing_rolls(cluster.id(), mine, &registered)
    {
        tracing::warn!(%broker, theirs = %theirs, mine = %mine, "this broker's segment rolls differ from another broker's: replicas of a replicated topic on both split it into segments at different ids; give every broker the same segment_entries and segment_max_bytes");
    }
}
