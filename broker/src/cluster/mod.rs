//! Cluster mode: several brokers coordinated through etcd
//! (`--cluster NAME --etcd URL --advertise URL`). Every topic (each
//! partition of a partitioned topic is a topic) is *placed* on one broker,
//! which keeps its data; it *owns* the topic while it holds its etcd lease,
//! and serves it only then. Any broker answers where a topic lives; a call
//! about a topic sent to another broker is refused with the owner's id and
//! URL ([`BrokerError::NotOwner`]). There is no replication in this step: a
//! broker that is down leaves its topics unavailable until it returns.
//!
//! etcd keys, all under `/ricochet/<cluster>/`:
//! * `brokers/<id>`: a [`membership::Registration`] (JSON), under the
//!   broker's lease;
//! * `placement/<topic>`: the id of the broker the topic's data lives on;
//!   persistent, written once ([`placement`]);
//! * `owners/<topic>`: the owner's id under its lease, created by a
//!   "create if absent" transaction; its create revision is the topic's
//!   fencing *epoch* ([`ownership`]);
//! * `partitioned/<topic>`: a partitioned topic's partition count.
//!
//! Split by concern: [`etcd`] (the typed etcd client), [`membership`]
//! (lease, registration, keepalive, the local fence deadline), [`placement`]
//! (the pure choice of a broker), [`ownership`] (claims, the in-memory table
//! of owned topics the hot path reads, lookups). A standalone broker has no
//! [`Cluster`] at all: its hot path pays one `None` check. What the cluster
//! needs of the broker it runs in is [`Host`], which the broker's node
//! implements: this module does not know the core.

pub mod etcd;
pub mod membership;
mod moves;
pub mod ownership;
pub mod placement;

use crate::error::{BrokerError, Result};
use etcd::Etcd;
use membership::{Fence, Registration};
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

pub use crate::config::{ClusterConfig, valid_id};
pub use ownership::{BrokerView, Owner, Tenure};

/// What cluster mode needs of the broker it runs in.
#[async_trait::async_trait]
pub trait Host: Send + Sync {
    /// The ordinary topics (not retry or dead-letter tiers) held here.
    async fn topics(&self) -> Vec<crate::name::TopicName>;
    /// Messages stored in those topics so far (the load figure).
    async fn messages_in(&self) -> u64;
    /// Deletes this broker's copy of a topic that lives elsewhere now,
    /// with everything that belongs to it.
    async fn forget_moved(&self, topic: &crate::name::TopicName) -> Result<()>;
}

/// How long an etcd call may take before it counts as failed.
const ETCD_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a starting broker waits for etcd to answer.
const JOIN_WAIT: Duration = Duration::from_secs(30);

/// This broker's membership of a cluster: its lease, fence and owned
/// topics. Shared by the services; one per broker process.
#[derive(Debug)]
pub struct Cluster {
    name: String,
    id: String,
    url: String,
    prefix: String,
    etcd: Etcd,
    ttl: Duration,
    registered_at_ms: u64,
    lease: AtomicI64,
    /// The local lease deadline every acknowledgement checks.
    pub fence: Fence,
    owned: std::sync::RwLock<HashMap<String, ownership::Owned>>,
    /// Topics moving away now, to the broker each goes to: not served.
    moving: std::sync::RwLock<HashMap<String, String>>,
    /// Draining: registered as such, so no new topic is placed here.
    draining: std::sync::atomic::AtomicBool,
    /// Serialises re-joining after a lost lease.
    rejoin: tokio::sync::Mutex<()>,
    /// Load (messages per second, f64 bits) and placed count, as last
    /// registered.
    load_bits: AtomicU64,
    placed: AtomicU64,
}

impl Cluster {
    /// Joins the cluster: grants a lease (revoking the one a previous
    /// process of this broker id left behind, whose topics it takes over),
    /// registers, claims every topic placed here, and keeps the lease
    /// alive until `shutdown`. `host` gives the load figure and deletes the
    /// copies of topics placed elsewhere.
    pub async fn join(
        config: &ClusterConfig,
        id: String,
        url: String,
        host: Weak<dyn Host>,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> Result<Arc<Self>> {
        let etcd = Etcd::connect(&config.etcd, ETCD_TIMEOUT)?;
        let cluster = Arc::new(Self {
            prefix: format!("/ricochet/{}/", config.name),
            name: config.name.clone(),
            fence: Fence::new(&id),
            id,
            url,
            etcd,
            ttl: Duration::from_secs(config.lease_ttl.as_secs_f64().ceil() as u64),
            registered_at_ms: crate::util::wall_ms(),
            lease: AtomicI64::new(0),
            owned: Default::default(),
            moving: Default::default(),
            draining: Default::default(),
            rejoin: tokio::sync::Mutex::new(()),
            load_bits: AtomicU64::new(0f64.to_bits()),
            placed: AtomicU64::new(0),
        });
        let started = Instant::now();
        let previous = loop {
            match cluster.etcd.get(&cluster.broker_key(&cluster.id)).await {
                Ok(p) => break p,
                Err(e) if started.elapsed() < JOIN_WAIT => {
                    tracing::warn!(error = %e, "waiting for etcd");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => return Err(e),
            }
        };
        if let Some(prev) = previous.filter(|p| p.lease != 0) {
            tracing::warn!(
                broker = %cluster.id,
                lease = prev.lease,
                "an earlier process of this broker id still holds a lease: revoking it"
            );
            cluster.etcd.revoke(prev.lease).await?;
        }
        cluster.acquire().await?;
        if let Some(host) = host.upgrade() {
            cluster.sweep_moved_away(host.as_ref()).await;
        }
        tracing::info!(
            cluster = %cluster.name,
            broker = %cluster.id,
            url = %cluster.url,
            ttl = ?cluster.ttl,
            owned = cluster.owned_count(),
            "joined the cluster"
        );
        tokio::spawn(cluster.clone().keep(host, shutdown));
        Ok(cluster)
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

    /// The etcd client (for replication groups' keys, `crate::replication`).
    pub fn etcd(&self) -> &Etcd {
        &self.etcd
    }

    /// The etcd key `rel` under this cluster's prefix.
    pub fn key(&self, rel: &str) -> String {
        format!("{}{rel}", self.prefix)
    }

    fn broker_key(&self, id: &str) -> String {
        format!("{}brokers/{id}", self.prefix)
    }

    fn placement_key(&self, topic: &str) -> String {
        format!("{}placement/{topic}", self.prefix)
    }

    fn owner_key(&self, topic: &str) -> String {
        format!("{}owners/{topic}", self.prefix)
    }

    fn partitioned_key(&self, topic: &str) -> String {
        format!("{}partitioned/{topic}", self.prefix)
    }

    fn lease_id(&self) -> i64 {
        self.lease.load(Ordering::Acquire)
    }

    /// Grants a lease, registers under it and claims the topics placed
    /// here.
    async fn acquire(&self) -> Result<()> {
        let sent = Instant::now();
        let (lease, ttl) = self.etcd.grant(self.ttl).await?;
        self.lease.store(lease, Ordering::Release);
        self.fence.extend(sent, ttl);
        self.register().await?;
        self.claim_placed().await;
        Ok(())
    }

    /// Writes `brokers/<id>` under the current lease.
    async fn register(&self) -> Result<()> {
        let reg = Registration {
            url: self.url.clone(),
            registered_at_ms: self.registered_at_ms,
            load: f64::from_bits(self.load_bits.load(Ordering::Relaxed)),
            placed: self.placed.load(Ordering::Relaxed),
            draining: self.draining.load(Ordering::Relaxed),
        };
        let json = serde_json::to_string(&reg)
            .map_err(|e| BrokerError::Etcd(format!("cannot encode the registration: {e}")))?;
        self.etcd
            .put(&self.broker_key(&self.id), &json, self.lease_id())
            .await?;
        Ok(())
    }

    /// The lease loop: renew every third of the TTL; after an expired
    /// lease, re-join; every third round, refresh the registration and
    /// claim what others placed here. Revokes the lease on `shutdown`.
    async fn keep(
        self: Arc<Self>,
        host: Weak<dyn Host>,
        shutdown: tokio_util::sync::CancellationToken,
    ) {
        let period = self.ttl / 3;
        let renew_timeout = period.max(Duration::from_millis(300));
        let mut keepalive = self.etcd.keepalive(self.lease_id(), renew_timeout);
        let mut round = 0u64;
        let mut last_load = (Instant::now(), messages_in(&host).await);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(period) => {}
            }
            let sent = Instant::now();
            match keepalive.renew().await {
                Ok(ttl) if ttl > 0 => self
                    .fence
                    .extend(sent, Duration::from_secs(ttl.unsigned_abs())),
                Ok(_) => {
                    tracing::warn!(broker = %self.id, "etcd expired this broker's lease: fenced; re-joining");
                    self.rejoin_after_loss(&shutdown).await;
                    keepalive = self.etcd.keepalive(self.lease_id(), renew_timeout);
                }
                Err(e) => {
                    let fenced = !self.fence.holds();
                    tracing::warn!(broker = %self.id, error = %e, fenced, "cannot renew the etcd lease");
                }
            }
            round += 1;
            if round.is_multiple_of(3) && self.fence.holds() {
                let now = (Instant::now(), messages_in(&host).await);
                let secs = now.0.duration_since(last_load.0).as_secs_f64().max(0.001);
                let rate = now.1.saturating_sub(last_load.1) as f64 / secs;
                self.load_bits.store(rate.to_bits(), Ordering::Relaxed);
                last_load = now;
                self.claim_placed().await;
                if let Err(e) = self.register().await {
                    tracing::warn!(error = %e, "cannot refresh the registration");
                }
            }
        }
        self.leave().await;
    }

    /// After etcd expired the lease: void every claim, then grant a new
    /// lease, register and re-claim, retrying until it works or the broker
    /// stops.
    async fn rejoin_after_loss(&self, shutdown: &tokio_util::sync::CancellationToken) {
        let _one = self.rejoin.lock().await;
        self.fence.lose();
        crate::util::write(&self.owned).clear();
        loop {
            match self.acquire().await {
                Ok(()) => {
                    tracing::info!(broker = %self.id, owned = self.owned_count(), "re-joined with a new lease");
                    return;
                }
                Err(e) => tracing::warn!(error = %e, "cannot re-join the cluster yet"),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
        }
    }

    /// Revokes the lease (a clean stop): this broker's registration and
    /// ownership go at once; its placements stay.
    pub async fn leave(&self) {
        self.fence.lose();
        if let Err(e) = self.etcd.revoke(self.lease_id()).await {
            tracing::warn!(error = %e, "cannot revoke the etcd lease on the way out");
        }
    }
}

/// Messages stored in the broker's ordinary topics so far.
async fn messages_in(host: &Weak<dyn Host>) -> u64 {
    match host.upgrade() {
        Some(host) => host.messages_in().await,
        None => 0,
    }
}
