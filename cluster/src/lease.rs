//! Joining the cluster and keeping this broker's lease: [`Cluster::join`]
//! grants a lease (revoking one an earlier process of the same broker id
//! left), registers, claims the topics placed here and deletes stale
//! copies of topics placed elsewhere; then a loop renews the lease every
//! third of its TTL, moves the fence deadline on each renewal, re-joins
//! after etcd expired the lease, refreshes the registration (load, placed
//! count) and claims what others placed here, and revokes the lease when
//! the broker stops ([`Cluster::leave`]).

use crate::Host;
use crate::cluster::Cluster;
use crate::config::ClusterConfig;
use crate::error::Result;
use crate::etcd::Etcd;
use crate::membership::Advertised;
use crate::sync::write;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// How long an etcd call may take before it counts as failed.
const ETCD_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a starting broker waits for etcd to answer.
const JOIN_WAIT: Duration = Duration::from_secs(30);

impl Cluster {
    /// Joins the cluster: grants a lease (revoking the one a previous
    /// process of this broker id left behind, whose topics it takes over),
    /// registers, claims every topic placed here, and keeps the lease
    /// alive until `shutdown`. `host` gives the load figure and deletes the
    /// copies of topics placed elsewhere. `peer_role`, the role this
    /// broker's peer credential proves, is registered with it: the other
    /// brokers let only that role speak Raft for this broker id. `tier`,
    /// the identity of its second tier's store, is registered too: a
    /// replication group's members must share it; and `group_commands`,
    /// the level of group commands it applies (a group's leader proposes
    /// a command only when every member advertises its level); and its
    /// segment rolls. All of them come in `advertised`.
    pub async fn join(
        config: &ClusterConfig,
        id: String,
        url: String,
        advertised: Advertised,
        host: Weak<dyn Host>,
        shutdown: CancellationToken,
    ) -> Result<Arc<Self>> {
        let etcd = Etcd::connect(&config.etcd, ETCD_TIMEOUT)?;
        let ttl = Duration::from_secs(config.lease_ttl.as_secs_f64().ceil() as u64);
        let mut cluster = Self::new(&config.name, id, url, etcd, ttl);
        cluster.advertised = advertised;
        let cluster = Arc::new(cluster);
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

    /// The lease loop: renew every third of the TTL; after an expired
    /// lease, re-join; every third round, refresh the registration and
    /// claim what others placed here. Revokes the lease on `shutdown`.
    async fn keep(self: Arc<Self>, host: Weak<dyn Host>, shutdown: CancellationToken) {
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
    async fn rejoin_after_loss(&self, shutdown: &CancellationToken) {
        let _one = self.rejoin.lock().await;
        self.fence.lose();
        write(&self.owned).clear();
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
