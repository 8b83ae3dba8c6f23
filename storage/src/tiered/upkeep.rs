//! Upkeep of replicated topics' second tier besides the offload itself
//! ([`group`](super::group)): which of them this broker leads (set by the
//! broker's leader pass), the offload lag figures counting them on their
//! leader only, and the leader's sweep of orphan objects.
//!
//! An orphan is an object under a replicated topic's prefix that no
//! record names: an upload that a crash, or a leadership lost before its
//! record committed, cut off (`tiered.offload.after_put` is such a
//! crash). Its leader lists the prefix and deletes each object no record
//! names that is older than `[tiered] orphan_after` (longer than an
//! upload's put-to-commit window), logging each; it holds the offload
//! lock meanwhile, so none of its own uploads is in flight.

use super::{SegmentState, Tiered};
use crate::{StorageError, StorageResult as Result};
use object_store::path::Path as ObjectPath;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

impl Tiered {
    /// The replicated topics this broker leads now (replacing the last
    /// set): their lag counts here, and nowhere else.
    pub fn set_leading(&self, topics: impl IntoIterator<Item = String>) {
        *crate::util::lock(&self.leading) = topics.into_iter().collect();
    }

    /// Whether this broker leads replicated `topic`, as last set.
    pub fn leads(&self, topic: &str) -> bool {
        crate::util::lock(&self.leading).contains(topic)
    }

    /// The offload lag of every topic this broker answers for: the age in
    /// seconds of the oldest segment due for offload and not offloaded,
    /// and the bytes due, over the factor-1 topics and the replicated
    /// topics it leads (a follower's copy is its leader's to count).
    pub fn offload_lag(&self) -> (u64, u64) {
        let (mut lag_s, mut pending) = (0u64, 0u64);
        for topic in self.log.topics() {
            let (l, p) = if !self.is_grouped(&topic) {
                self.lag(&topic)
            } else if self.leads(&topic) {
                self.group_lag(&topic)
            } else {
                continue;
            };
            lag_s = lag_s.max(l);
            pending += p;
        }
        (lag_s, pending)
    }

    /// [`Tiered::offload_lag`]'s figures of one replicated topic: its
    /// sealed segments above the recorded ranges its policy says are due.
    fn group_lag(&self, topic: &str) -> (u64, u64) {
        let Some((policy, _)) = self.effective(topic) else {
            return (0, 0);
        };
        let (sealed, local_bytes) = self.candidates(topic);
        let tuples: Vec<(u64, u64, bool)> = sealed
            .iter()
            .map(|s| (s.header.created_ms, s.len, false))
            .collect();
        let now = crate::util::wall_ms();
        let due = policy.choose(now, local_bytes, &tuples);
        let age = due.first().map_or(0, |i| {
            now.saturating_sub(sealed[*i].header.created_ms) / 1000
        });
        (age, due.iter().map(|i| sealed[*i].len).sum())
    }

    /// How old an object no record names must be before the leader's
    /// sweep deletes it: `[tiered] orphan_after`, else twice the interval
    /// and at least a minute.
    pub fn orphan_after(&self) -> Duration {
        self.config
            .orphan_after
            .unwrap_or_else(|| (self.config.interval * 2).max(Duration::from_secs(60)))
    }

    /// The leader's sweep of replicated `topic`'s prefix: deletes every
    /// object there no record of the topic names and last modified at
    /// least `older_than` ago, logging each; returns how many went. Holds
    /// the offload lock (none of this broker's uploads is in flight).
    pub async fn sweep_orphans(self: &Arc<Self>, topic: &str, older_than: Duration) -> Result<u32> {
        let _one_pass = self.offloading.lock().await;
        let named: HashSet<ObjectPath> = self
            .states(topic)
            .values()
            .map(|s: &SegmentState| ObjectPath::from(s.key.as_str()))
            .collect();
        let prefix = self.topic_prefix(topic);
        let store = self.store.clone();
        let Some(rt) = &self.io.0 else {
            return Err(StorageError::Remote("shut down".into()));
        };
        let listed = rt
            .spawn(async move {
                use futures::TryStreamExt as _;
                store.list(Some(&prefix)).try_collect::<Vec<_>>().await
            })
            .await
            .map_err(StorageError::joined)?
            .map_err(|e| StorageError::Remote(format!("list: {e}")))?;
        let now = crate::util::wall_ms() as i64;
        let mut deleted = 0;
        for o in listed {
            let age_ms = now.saturating_sub(o.last_modified.timestamp_millis());
            if named.contains(&o.location) || age_ms < older_than.as_millis() as i64 {
                continue;
            }
            let (store, path) = (self.store.clone(), o.location.clone());
            let done = rt
                .spawn(async move { store.delete(&path).await })
                .await
                .map_err(StorageError::joined)?;
            match done {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {
                    deleted += 1;
                    metrics::counter!("ricochet_tiered_orphans_deleted_total").increment(1);
                    tracing::info!(%topic, object = %o.location, bytes = o.size, age_s = age_ms / 1000, "tiered: deleted an orphan object (an upload no record of the group names)");
                }
                Err(e) => {
                    metrics::counter!("ricochet_tiered_delete_errors_total").increment(1);
                    tracing::warn!(%topic, object = %o.location, error = %e, "tiered: cannot delete an orphan object; the next sweep tries again");
                }
            }
        }
        Ok(deleted)
    }
}
