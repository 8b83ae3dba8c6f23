//! Replicated topics in the core: a topic whose Raft group this broker
//! leads is opened from the replica's applied store, as a restarted
//! broker opens its topics (cursors, delivery counts, schedule, tiers from
//! storage; the retry scheduler reloads their schedule), and its writer and subscription actors write through the
//! group's storage ([`crate::replication::ReplicatedStorage`]); when the
//! broker stops leading, the topic leaves the registry. Every other topic
//! writes to the broker's own store, as before.

use super::BrokerCore;
use crate::error::{BrokerError, Result};
use crate::name::TopicName;
use crate::storage::{Storage, TopicKind};
use crate::util::lock;
use std::sync::Arc;

/// A replicated topic served here: the storage it writes through, and
/// its replication factor.
pub(super) type Served = (Arc<dyn Storage>, u32);

impl BrokerCore {
    /// The storage a topic (or a tier, through the subscription that owns
    /// it) writes through.
    pub(crate) fn storage_for(&self, name: &str) -> Arc<dyn Storage> {
        let replicated = lock(&self.replicated);
        if replicated.is_empty() {
            return self.storage.clone();
        }
        let owner = || lock(&self.tier_owners).owner_of(name).map(|(t, _)| t);
        replicated
            .get(name)
            .or_else(|| owner().and_then(|t| replicated.get(&t)))
            .map_or_else(|| self.storage.clone(), |(s, _)| s.clone())
    }

    /// The storage a write about `name` (a topic, a tier, or the topic a
    /// replay job names) goes through, for a caller that did not come
    /// through the topic's route (a replay job, a call naming no topic):
    /// [`Self::storage_for`], but refused for a replicated topic another
    /// member leads, whose copy here is written by its group only.
    pub(crate) fn writer_for(&self, name: &str) -> Result<Arc<dyn Storage>> {
        if self.is_replicated(name) || lock(&self.tier_owners).owner_of(name).is_some() {
            return Ok(self.storage_for(name));
        }
        let copy = self.storage.list_topics()?;
        if copy.iter().any(|t| t.name == name && t.replicas > 1) {
            return Err(BrokerError::Conflict(format!(
                "{name} is replicated and this broker does not lead its group: \
                 ask its leader (name the topic)"
            )));
        }
        Ok(self.storage.clone())
    }

    /// Whether `name` is the retry or dead-letter tier of a subscription
    /// served here.
    pub(crate) fn is_tier_name(&self, name: &str) -> bool {
        lock(&self.tier_owners).owner_of(name).is_some()
    }

    /// The replication factor of a topic (or tier) served here.
    pub(crate) fn factor_of(&self, name: &str) -> u32 {
        let replicated = lock(&self.replicated);
        if replicated.is_empty() {
            return 1;
        }
        let owner = || lock(&self.tier_owners).owner_of(name).map(|(t, _)| t);
        replicated
            .get(name)
            .or_else(|| owner().and_then(|t| replicated.get(&t)))
            .map_or(1, |(_, r)| *r)
    }

    /// Opens replicated topic `name` (factor `replicas`) from this
    /// replica's store, writing through `storage` from now on: its log,
    /// its subscriptions with their actors, and the tiers they hold.
    pub(crate) async fn open_replicated(
        &self,
        name: &TopicName,
        storage: Arc<dyn Storage>,
        replicas: u32,
    ) -> Result<()> {
        self.close_replicated(name).await;
        lock(&self.replicated).insert(name.to_string(), (storage, replicas));
        let stored = self.storage.list_topics()?;
        let subs = self.storage.list_subscriptions(name.as_str())?;
        let mut logs = vec![(name.clone(), TopicKind::Normal)];
        for sub in &subs {
            let (retry, dlq) = crate::tier_owners::tier_names(sub)?;
            for tier in [retry, dlq] {
                if let Some(t) = stored.iter().find(|t| t.name == tier) {
                    logs.push((TopicName::parse_stored(&t.name)?, t.kind));
                }
            }
        }
        // The schedule of these subscriptions was applied to the store
        // while another broker led: the scheduler's window may have passed
        // its due times already. Reloaded before the actors register, so
        // what fired meanwhile (stale now) is dropped, not handed to them.
        self.scheduler.reload(subs.iter().map(|s| s.id).collect());
        let opened = self.adopt(&logs, subs).await;
        if opened.is_err() {
            self.close_replicated(name).await;
        }
        opened
    }

    /// Takes replicated topic `name` out of the registry (this broker no
    /// longer leads its group): its logs are sealed, its subscriptions'
    /// tier names released. Their actors end with their streams; a write
    /// one still attempts fails (its storage no longer leads).
    pub(crate) async fn close_replicated(&self, name: &TopicName) {
        let mut topics = self.topics.lock().await;
        if let Some(entry) = topics.remove(name) {
            entry.topic.seal();
            lock(&self.counts).remove(name);
            let subs = lock(&entry.subscriptions).drain().collect::<Vec<_>>();
            for (sub, _) in subs {
                let tiers = lock(&self.tier_owners).tiers_of(name.as_str(), &sub);
                if let Some((retry, dlq)) = tiers {
                    for tier in [retry, dlq] {
                        if let Ok(t) = TopicName::parse_stored(&tier)
                            && let Some(e) = topics.remove(&t)
                        {
                            e.topic.seal();
                        }
                    }
                }
                lock(&self.tier_owners).release(name.as_str(), &sub);
            }
        }
        // The entry stays, with the storage the caller retired: a write
        // still attempted on the topic (a replay job's progress) is refused,
        // never made to this replica's store alone. [`Self::forget_replicated`]
        // drops it once the group is gone.
    }

    /// Forgets replicated topic `name` (its group was deleted): closed if
    /// served here, and no longer written through a group.
    pub(crate) async fn forget_replicated(&self, name: &TopicName) {
        self.close_replicated(name).await;
        lock(&self.replicated).remove(name.as_str());
    }

    /// Whether `name` is a replicated topic this broker knows (served here
    /// now, or served here before).
    pub(crate) fn is_replicated(&self, name: &str) -> bool {
        lock(&self.replicated).contains_key(name)
    }
}
