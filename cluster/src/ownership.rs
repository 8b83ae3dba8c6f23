//! Ownership and the questions about it: which broker a topic lives on,
//! whether this broker may serve it now, and the cluster as a whole.
//!
//! A broker owns a topic placed on it by creating `owners/<topic>` under its
//! lease ("create if absent"); the key's create revision is the *epoch*,
//! carried by every produce receipt. Owned topics sit in an in-memory table
//! with the fence generation they were claimed under, so the hot path
//! ([`Cluster::route`] on a topic owned here) is a map read and the fence
//! check, with no etcd round trip. A topic not placed yet is placed on
//! first use (a produce, a consume, a lookup); a topic placed elsewhere is
//! refused with [`ClusterError::NotOwner`] (its URL only when that broker is
//! live), one placed on a broker that is down with
//! [`ClusterError::OwnerDown`] from a lookup.
//!
//! Topic names arrive as the broker validated them; partitioned topics'
//! counts live in etcd too (`partitioned/<base>`), and their partitions are
//! named as `ricochet_proto::partitions` names them.

use crate::cluster::{Cluster, Owned};
use crate::error::{ClusterError, Result};
use crate::etcd::Created;
use crate::membership::Registration;
use crate::placement;
use crate::sync::{read, write};
use ricochet_proto::partitions::partition_name;
use std::collections::BTreeMap;
use tokio_util::sync::CancellationToken;

/// A tenure: the right to serve a topic here (what claiming it in etcd
/// gives), its epoch, and the fence generation it
/// was claimed under (acknowledgements check
/// [`Fence::check`](crate::membership::Fence::check) with it).
#[derive(Debug, Clone)]
pub struct Tenure {
    /// The owner key's create revision.
    pub epoch: u64,
    /// The fence generation of the claim.
    pub generation: u64,
    /// Cancelled when this broker gives the topic up (it moves to another).
    pub released: CancellationToken,
}

/// Where a topic lives, as `Lookup` answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// The broker it is placed on.
    pub broker_id: String,
    /// That broker's advertised URL.
    pub url: String,
    /// The epoch of its current claim; 0 while the (live) broker has not
    /// claimed it yet.
    pub epoch: u64,
}

/// A broker of the cluster, as `ListBrokers` answers.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BrokerView {
    /// Its id.
    pub id: String,
    /// Its advertised URL (empty when not live).
    pub url: String,
    /// Registered under a live lease.
    pub live: bool,
    /// Topics placed on it.
    pub placed: u64,
    /// Topics it owns now.
    pub owned: u64,
    /// Its reported load.
    pub load: f64,
    /// When it registered (ms since the Unix epoch).
    pub registered_at_ms: u64,
    /// The topics it owns.
    pub topics: Vec<String>,
    /// Being drained (takes no new topics).
    pub draining: bool,
    /// The identity of its second tier's store, as it registered it.
    pub tier: Option<String>,
    /// The level of replication-group commands it applies, as it
    /// registered it (0: registered by a build from before the field, or
    /// not live).
    pub group_commands: u32,
}

impl Cluster {
    /// Whether this broker may serve `topic` now, claiming it if it is
    /// placed here and not yet owned, and (with `place`) placing it if it is
    /// placed nowhere. `Ok(None)`: placed nowhere and not placed now (the
    /// call is answered here, as by a broker that has never heard of it).
    pub async fn route(&self, topic: &str, place: bool) -> Result<Option<Tenure>> {
        self.check_not_moving(topic)?;
        let owned = read(&self.owned).get(topic).cloned();
        if let Some(o) = owned {
            if self.fence.valid(o.generation) {
                return Ok(Some(Tenure {
                    epoch: o.epoch,
                    generation: o.generation,
                    released: o.released,
                }));
            }
            if !self.fence.holds() {
                return Err(self.fence.fenced());
            }
        }
        match self.placement_of(topic, place).await? {
            None => Ok(None),
            Some(b) if b == self.id => self.claim(topic).await.map(Some),
            Some(b) => Err(self.not_owner(topic, b).await),
        }
    }

    /// The refusal for `topic`, placed on broker `owner`: its URL when it
    /// is live, and the epoch of its claim when it holds one (both read
    /// from etcd at once).
    async fn not_owner(&self, topic: &str, owner: String) -> ClusterError {
        let (broker_key, owner_key) = (self.broker_key(&owner), self.owner_key(topic));
        let (registered, claimed) =
            tokio::join!(self.etcd.get(&broker_key), self.etcd.get(&owner_key));
        let url = match registered {
            Ok(Some(kv)) => Some(Registration::parse(&kv.value).url).filter(|u| !u.is_empty()),
            _ => None,
        };
        let epoch = match claimed {
            Ok(Some(kv)) if kv.value == owner => u64::try_from(kv.create_revision).ok(),
            _ => None,
        };
        ClusterError::NotOwner {
            topic: topic.to_owned(),
            owner,
            url,
            epoch,
        }
    }

    /// The broker `topic` is placed on; placed now when `place` and it has
    /// no place yet. A partitioned topic's base name is refused.
    async fn placement_of(&self, topic: &str, place: bool) -> Result<Option<String>> {
        if let Some(kv) = self.etcd.get(&self.placement_key(topic)).await? {
            return Ok(Some(kv.value));
        }
        if let Some(n) = self.partition_count(topic).await? {
            return Err(ClusterError::InvalidArgument(format!(
                "{topic} is a partitioned topic ({n} partitions): look up and address its partitions ({}-partition-0 ..)",
                topic
            )));
        }
        if !place {
            return Ok(None);
        }
        let (live, placed) = (self.live().await?, self.placed_counts().await?);
        let choice = placement::choose(&live, &placed)
            .ok_or_else(|| ClusterError::Etcd("no live broker to place the topic on".into()))?;
        self.place(topic, &choice).await.map(Some)
    }

    /// Writes `placement/<topic>` = `broker` unless the topic has a place
    /// already; where it is placed.
    async fn place(&self, topic: &str, broker: &str) -> Result<String> {
        match self
            .etcd
            .create_if_absent(&self.placement_key(topic), broker, 0)
            .await?
        {
            Created::Created(_) => {
                tracing::info!(%topic, %broker, "topic placed");
                Ok(broker.to_owned())
            }
            Created::Exists(kv) => Ok(kv.value),
        }
    }

    /// Claims `topic` (placed here) under the current lease.
    async fn claim(&self, topic: &str) -> Result<Tenure> {
        self.check_not_moving(topic)?;
        if !self.fence.holds() {
            return Err(self.fence.fenced());
        }
        let generation = self.fence.generation();
        let lease = self.lease_id();
        let epoch = match self
            .etcd
            .create_if_absent(&self.owner_key(topic), &self.id, lease)
            .await?
        {
            Created::Created(rev) => rev,
            Created::Exists(kv) if kv.value == self.id && kv.lease == lease => kv.create_revision,
            Created::Exists(kv) if kv.value == self.id => {
                // Left by an earlier process of this broker id, whose lease
                // etcd has not expired yet: that process is gone (this one
                // holds the data directory), so its claims are void.
                tracing::warn!(%topic, lease = kv.lease, "revoking a stale lease of this broker id");
                self.etcd.revoke(kv.lease).await?;
                match self
                    .etcd
                    .create_if_absent(&self.owner_key(topic), &self.id, lease)
                    .await?
                {
                    Created::Created(rev) => rev,
                    Created::Exists(kv) => {
                        return Err(self.not_owner(topic, kv.value).await);
                    }
                }
            }
            Created::Exists(kv) => return Err(self.not_owner(topic, kv.value).await),
        };
        let epoch = u64::try_from(epoch).unwrap_or(0);
        let released = CancellationToken::new();
        write(&self.owned).insert(
            topic.to_owned(),
            Owned {
                epoch,
                generation,
                released: released.clone(),
            },
        );
        tracing::debug!(%topic, epoch, "topic claimed");
        Ok(Tenure {
            epoch,
            generation,
            released,
        })
    }

    /// Claims every topic placed here that this broker does not own under
    /// its current generation (at join, after a lost lease, and now and
    /// then for topics other brokers placed here).
    pub(crate) async fn claim_placed(&self) {
        let mine = match self.placed_here().await {
            Ok(mine) => mine,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read placements");
                return;
            }
        };
        self.placed
            .store(mine.len() as u64, std::sync::atomic::Ordering::Relaxed);
        let generation = self.fence.generation();
        for topic in mine {
            if self.check_not_moving(&topic).is_err() {
                continue;
            }
            let current = read(&self.owned)
                .get(&topic)
                .is_some_and(|o| o.generation == generation);
            if current {
                continue;
            }
            if let Err(e) = self.claim(&topic).await {
                tracing::warn!(%topic, error = %e, "cannot claim a topic placed here");
            }
        }
    }

    /// Where `topic` lives, placing it if it has no place yet.
    /// [`ClusterError::OwnerDown`] when its broker is not live.
    pub async fn lookup(&self, topic: &str) -> Result<Owner> {
        let Some(broker) = self.placement_of(topic, true).await? else {
            return Err(ClusterError::Etcd("the topic could not be placed".into()));
        };
        if broker == self.id {
            let claim = self
                .route(topic, false)
                .await?
                .ok_or_else(|| ClusterError::Etcd("placed here but not claimed".into()))?;
            return Ok(Owner {
                broker_id: broker,
                url: self.url.clone(),
                epoch: claim.epoch,
            });
        }
        let Some(reg) = self.etcd.get(&self.broker_key(&broker)).await? else {
            return Err(ClusterError::OwnerDown {
                topic: topic.to_owned(),
                owner: broker,
            });
        };
        let epoch = match self.etcd.get(&self.owner_key(topic)).await? {
            Some(kv) if kv.value == broker => u64::try_from(kv.create_revision).unwrap_or(0),
            _ => 0,
        };
        Ok(Owner {
            broker_id: broker,
            url: Registration::parse(&reg.value).url,
            epoch,
        })
    }

    /// Every broker that is live or has topics placed on it.
    pub async fn brokers(&self) -> Result<Vec<BrokerView>> {
        let mut views: BTreeMap<String, BrokerView> = BTreeMap::new();
        let view = |views: &mut BTreeMap<String, BrokerView>, id: &str| {
            views
                .entry(id.to_owned())
                .or_insert_with(|| BrokerView {
                    id: id.to_owned(),
                    ..Default::default()
                })
                .id
                .clone()
        };
        let brokers = format!("{}brokers/", self.prefix);
        for kv in self.etcd.get_prefix(&brokers).await? {
            let Some(id) = kv.key.strip_prefix(&brokers) else {
                continue;
            };
            view(&mut views, id);
            let reg = Registration::parse(&kv.value);
            if let Some(v) = views.get_mut(id) {
                v.live = true;
                v.url = reg.url;
                v.load = reg.load;
                v.registered_at_ms = reg.registered_at_ms;
                v.draining = reg.draining;
                v.tier = reg.tier;
                v.group_commands = reg.group_commands;
            }
        }
        for (id, n) in self.placed_counts().await? {
            view(&mut views, &id);
            if let Some(v) = views.get_mut(&id) {
                v.placed = n;
            }
        }
        let owners = format!("{}owners/", self.prefix);
        for kv in self.etcd.get_prefix(&owners).await? {
            let Some(topic) = kv.key.strip_prefix(&owners) else {
                continue;
            };
            view(&mut views, &kv.value);
            if let Some(v) = views.get_mut(&kv.value) {
                v.owned += 1;
                v.topics.push(topic.to_owned());
            }
        }
        Ok(views.into_values().collect())
    }

    /// The partition count of partitioned topic `base`, cluster-wide.
    pub async fn partition_count(&self, base: &str) -> Result<Option<u32>> {
        let Some(kv) = self.etcd.get(&self.partitioned_key(base)).await? else {
            return Ok(None);
        };
        kv.value.parse().map(Some).map_err(|_| {
            ClusterError::Etcd(format!("bad partition count {:?} for {base}", kv.value))
        })
    }

    /// Every partitioned topic with its partition count, cluster-wide, in
    /// name order.
    pub async fn partitioned_topics(&self) -> Result<Vec<(String, u32)>> {
        let prefix = self.partitioned_key("");
        let mut out = Vec::new();
        for kv in self.etcd.get_prefix(&prefix).await? {
            let Some(base) = kv.key.strip_prefix(&prefix) else {
                continue;
            };
            let count = kv.value.parse().map_err(|_| {
                ClusterError::Etcd(format!("bad partition count {:?} for {base}", kv.value))
            })?;
            out.push((base.to_owned(), count));
        }
        Ok(out)
    }

    /// Creates partitioned topic `base` cluster-wide and places its
    /// partitions, spread over the live brokers (each creates its
    /// partitions' logs on first use). The caller has checked the name and
    /// the count (`1 ..= MAX_PARTITIONS`, a name not itself a partition's).
    /// `also` (key, value pairs: the topic's replication factor) is written
    /// in the same transaction as the count: with it, or not at all.
    pub async fn create_partitioned(
        &self,
        base: &str,
        partitions: u32,
        also: &[(String, String)],
    ) -> Result<()> {
        if self.etcd.get(&self.placement_key(base)).await?.is_some() {
            return Err(ClusterError::TopicExists(format!(
                "{base} (an ordinary topic of that name exists)"
            )));
        }
        match self
            .etcd
            .create_if_absent_with(
                &self.partitioned_key(base),
                &partitions.to_string(),
                0,
                also,
            )
            .await?
        {
            Created::Created(_) => {}
            Created::Exists(_) => return Err(ClusterError::TopicExists(base.to_string())),
        }
        self.place_partitions(base, 0, partitions).await?;
        tracing::info!(topic = %base, partitions, "partitioned topic created in the cluster");
        Ok(())
    }

    /// Raises the partition count of `base` (never lowers it); the count in
    /// force. `check` judges a new, higher count (the broker's limits and
    /// name rules) before anything changes; its error comes back as it is.
    pub async fn update_partitions<E: From<ClusterError>>(
        &self,
        base: &str,
        partitions: u32,
        check: impl Fn(u32) -> Result<(), E>,
    ) -> Result<u32, E> {
        let key = self.partitioned_key(base);
        loop {
            let Some(kv) = self.etcd.get(&key).await? else {
                return Err(ClusterError::TopicNotFound(format!(
                    "{base} (no partitioned topic of that name)"
                ))
                .into());
            };
            let current: u32 = kv.value.parse().map_err(|_| {
                ClusterError::Etcd(format!("bad partition count {:?} for {base}", kv.value))
            })?;
            if partitions < current {
                return Err(ClusterError::InvalidArgument(format!(
                    "cannot lower the partition count of {base} from {current} to {partitions}: partitions can only be added"
                ))
                .into());
            }
            if partitions == current {
                return Ok(current);
            }
            check(partitions)?;
            if self
                .etcd
                .replace_if_unchanged(&key, &partitions.to_string(), kv.mod_revision, 0)
                .await?
            {
                self.place_partitions(base, current, partitions).await?;
                return Ok(partitions);
            }
        }
    }

    /// Removes partitioned topic `base` of `partitions` partitions (deleted
    /// by the caller, each on its broker), with `also` (keys: its
    /// replication factor) in the same transaction. The partitions'
    /// placements stay, as an ordinary topic's do when it is deleted.
    /// Refused, changing nothing, when the count is no longer `partitions`
    /// (raised meanwhile) or the topic is gone.
    pub async fn delete_partitioned(
        &self,
        base: &str,
        partitions: u32,
        also: &[String],
    ) -> Result<()> {
        let key = self.partitioned_key(base);
        if self
            .etcd
            .delete_if_value(&key, &partitions.to_string(), also)
            .await?
        {
            tracing::info!(topic = %base, partitions, "partitioned topic deleted from the cluster");
            return Ok(());
        }
        match self.partition_count(base).await? {
            None => Err(ClusterError::TopicNotFound(format!(
                "{base} (no partitioned topic of that name)"
            ))),
            Some(n) => Err(ClusterError::Conflict(format!(
                "the partition count of {base} changed from {partitions} to {n} during the delete; delete it again"
            ))),
        }
    }

    async fn place_partitions(&self, base: &str, from: u32, to: u32) -> Result<()> {
        let (live, placed) = (self.live().await?, self.placed_counts().await?);
        let chosen = placement::spread(&live, &placed, (to - from) as usize);
        if chosen.len() < (to - from) as usize {
            return Err(ClusterError::Etcd(
                "no live broker to place the partitions on".into(),
            ));
        }
        for (i, broker) in (from..to).zip(chosen) {
            self.place(&partition_name(base, i), &broker).await?;
        }
        Ok(())
    }
}
