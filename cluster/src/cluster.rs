//! [`Cluster`] itself: the state of this broker's membership (its lease,
//! fence, owned and moving topics, draining flag, last load figures), the
//! etcd keys it lives under, and the reads every other part shares: the
//! registration it writes, the live brokers and the placed counts. The
//! parts built on it — joining and the lease loop ([`crate::lease`]),
//! ownership ([`crate::ownership`]), moves ([`crate::moves`]) — are
//! `impl Cluster` blocks of their own modules; none of them calls another
//! except the lease loop, which claims and sweeps.

use crate::error::{ClusterError, Result};
use crate::etcd::Etcd;
use crate::membership::{Advertised, Fence, Registration, SegmentRolls};
use crate::placement::Candidate;
use crate::sync::read;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// This broker's membership of a cluster: its lease, fence and owned
/// topics. Shared by the services; one per broker process.
#[derive(Debug)]
pub struct Cluster {
    pub(crate) name: String,
    pub(crate) id: String,
    pub(crate) url: String,
    pub(crate) prefix: String,
    pub(crate) etcd: Etcd,
    pub(crate) ttl: Duration,
    pub(crate) registered_at_ms: u64,
    pub(crate) lease: AtomicI64,
    /// The local lease deadline every acknowledgement checks.
    pub fence: Fence,
    pub(crate) owned: std::sync::RwLock<HashMap<String, Owned>>,
    /// Topics moving away now, to the broker each goes to: not served.
    pub(crate) moving: std::sync::RwLock<HashMap<String, String>>,
    /// Draining: registered as such, so no new topic is placed here.
    pub(crate) draining: AtomicBool,
    /// Serialises re-joining after a lost lease.
    pub(crate) rejoin: tokio::sync::Mutex<()>,
    /// Load (messages per second, f64 bits) and placed count, as last
    /// registered.
    pub(crate) load_bits: AtomicU64,
    pub(crate) placed: AtomicU64,
    /// What this broker registers besides its URL and load (its peer role,
    /// second tier, group commands level and segment rolls).
    pub(crate) advertised: Advertised,
}

/// A topic in the table of owned topics.
#[derive(Debug, Clone)]
pub(crate) struct Owned {
    pub(crate) epoch: u64,
    pub(crate) generation: u64,
    /// Cancelled when this broker gives the topic up (a move): the streams
    /// serving it end.
    pub(crate) released: CancellationToken,
}

impl Cluster {
    /// A membership of cluster `name` as broker `id` (advertised at
    /// `url`) with leases of `ttl` (whole seconds), holding nothing yet.
    pub(crate) fn new(name: &str, id: String, url: String, etcd: Etcd, ttl: Duration) -> Self {
        Self {
            advertised: Advertised::default(),
            prefix: format!("/ricochet/{name}/"),
            name: name.to_owned(),
            fence: Fence::new(&id),
            id,
            url,
            etcd,
            ttl,
            registered_at_ms: crate::sync::wall_ms(),
            lease: AtomicI64::new(0),
            owned: Default::default(),
            moving: Default::default(),
            draining: AtomicBool::new(false),
            rejoin: tokio::sync::Mutex::new(()),
            load_bits: AtomicU64::new(0f64.to_bits()),
            placed: AtomicU64::new(0),
        }
    }

    /// The cluster's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// This broker's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// This broker's advertised URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The etcd client (the broker's replication groups keep their keys
    /// beside the cluster's, under [`Cluster::key`]).
    pub fn etcd(&self) -> &Etcd {
        &self.etcd
    }

    /// The etcd key `rel` under this cluster's prefix.
    pub fn key(&self, rel: &str) -> String {
        format!("{}{rel}", self.prefix)
    }

    pub(crate) fn broker_key(&self, id: &str) -> String {
        format!("{}brokers/{id}", self.prefix)
    }

    pub(crate) fn placement_key(&self, topic: &str) -> String {
        format!("{}placement/{topic}", self.prefix)
    }

    pub(crate) fn owner_key(&self, topic: &str) -> String {
        format!("{}owners/{topic}", self.prefix)
    }

    pub(crate) fn partitioned_key(&self, topic: &str) -> String {
        format!("{}partitioned/{topic}", self.prefix)
    }

    pub(crate) fn lease_id(&self) -> i64 {
        self.lease.load(Ordering::Acquire)
    }

    /// Writes `brokers/<id>` under the current lease.
    pub(crate) async fn register(&self) -> Result<()> {
        let reg = Registration {
            url: self.url.clone(),
            registered_at_ms: self.registered_at_ms,
            load: f64::from_bits(self.load_bits.load(Ordering::Relaxed)),
            placed: self.placed.load(Ordering::Relaxed),
            draining: self.draining.load(Ordering::Relaxed),
            peer_role: self.advertised.peer_role.clone(),
            tier: self.advertised.tier.clone(),
            group_commands: self.advertised.group_commands,
            segment_rolls: self.advertised.segment_rolls,
        };
        let json = serde_json::to_string(&reg)
            .map_err(|e| ClusterError::Etcd(format!("cannot encode the registration: {e}")))?;
        self.etcd
            .put(&self.broker_key(&self.id), &json, self.lease_id())
            .await?;
        Ok(())
    }

    /// `Err(Moving)` while `topic` moves away from this broker.
    pub(crate) fn check_not_moving(&self, topic: &str) -> Result<()> {
        match read(&self.moving).get(topic) {
            Some(to) => Err(ClusterError::Moving {
                topic: topic.to_owned(),
                from: self.id.clone(),
                to: to.clone(),
            }),
            None => Ok(()),
        }
    }

    /// How many topics this broker owns now.
    pub fn owned_count(&self) -> usize {
        let g = self.fence.generation();
        read(&self.owned)
            .values()
            .filter(|o| o.generation == g)
            .count()
    }

    /// Whether this broker is draining.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Live brokers that take new topics (not draining), with their load.
    pub(crate) async fn live(&self) -> Result<Vec<Candidate>> {
        Ok(self
            .registrations()
            .await?
            .into_iter()
            .filter_map(|(id, reg)| (!reg.draining).then_some(Candidate { id, load: reg.load }))
            .collect())
    }

    /// Every registered broker's registration, by broker id (an
    /// unreadable one as the default, see [`Registration::parse`]).
    async fn registrations(&self) -> Result<Vec<(String, Registration)>> {
        let strip = format!("{}brokers/", self.prefix);
        Ok(self
            .etcd
            .get_prefix(&strip)
            .await?
            .into_iter()
            .filter_map(|kv| {
                let id = kv.key.strip_prefix(&strip)?.to_owned();
                Some((id, Registration::parse(&kv.value)))
            })
            .collect())
    }

    /// What `pick` takes of each registered broker's registration, by
    /// broker id (one read of `brokers/`).
    async fn registered<T>(&self, pick: impl Fn(Registration) -> T) -> Result<Vec<(String, T)>> {
        Ok(self
            .registrations()
            .await?
            .into_iter()
            .map(|(id, r)| (id, pick(r)))
            .collect())
    }

    /// The peer role each registered broker recorded (`None`: it recorded
    /// none), by broker id: what a broker's `Replication` service checks a
    /// caller's role against.
    pub async fn peer_roles(&self) -> Result<Vec<(String, Option<String>)>> {
        self.registered(|r| r.peer_role).await
    }

    /// The level of replication-group commands each registered broker
    /// advertises (`Registration::group_commands`; 0 in a registration
    /// without it), by broker id. A broker not registered is not listed.
    pub async fn group_commands(&self) -> Result<Vec<(String, u32)>> {
        self.registered(|r| r.group_commands).await
    }

    /// The segment rolls each registered broker advertises
    /// (`Registration::segment_rolls`; `None` in a registration from before
    /// the field), by broker id.
    pub async fn segment_rolls(&self) -> Result<Vec<(String, Option<SegmentRolls>)>> {
        self.registered(|r| r.segment_rolls).await
    }

    /// The identity of this broker's second tier, as it registers it (see
    /// [`Cluster::join`]).
    pub fn tier(&self) -> Option<&str> {
        self.advertised.tier.as_deref()
    }

    /// The peer role this broker registers (see [`Cluster::join`]).
    pub fn peer_role(&self) -> Option<&str> {
        self.advertised.peer_role.as_deref()
    }

    /// Topics placed per broker id.
    pub(crate) async fn placed_counts(&self) -> Result<HashMap<String, u64>> {
        let mut counts = HashMap::new();
        for kv in self
            .etcd
            .get_prefix(&format!("{}placement/", self.prefix))
            .await?
        {
            *counts.entry(kv.value).or_default() += 1;
        }
        Ok(counts)
    }

    /// The topics placed on this broker, by name, in order.
    pub async fn placed_here(&self) -> Result<Vec<String>> {
        let strip = format!("{}placement/", self.prefix);
        let mut mine: Vec<String> = self
            .etcd
            .get_prefix(&strip)
            .await?
            .into_iter()
            .filter(|kv| kv.value == self.id)
            .filter_map(|kv| kv.key.strip_prefix(&strip).map(str::to_owned))
            .collect();
        mine.sort();
        Ok(mine)
    }
}
