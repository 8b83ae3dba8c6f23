//! Replacing a member whose broker stays down, and making a group's Raft
//! membership follow its record in etcd (run by the group's leader at
//! each read of the records).
//!
//! The record is what the group should be: when a member's broker has not
//! been live for `[cluster] replace_after` (as this leader saw it; a new
//! leader starts its own count), the leader picks a live broker outside the
//! group (not draining, fewest placed topics first) and writes the record
//! with it in the dead member's place, under a node id never used in the
//! group (compare-and-set on the record it read). The new broker starts
//! its member when it reads that record; the leader, seeing its Raft
//! voters differ from the record, adds it as a learner, waits until it
//! caught up (a snapshot, then the log), and switches the membership to
//! the record's (openraft's joint consensus), which removes the dead
//! member. A leader that dies part-way leaves a record the next leader
//! finishes the same way. A broker that comes back and finds itself no
//! longer in the record stops its member and deletes its copy
//! (`Groups::refresh`). With no broker to take the place, the group stays
//! degraded and its status report says so (`unreplaced`).

use super::{GroupRecord, Groups, ReplicatedPartition};
use crate::error::{BrokerError, Result};
use ricochet_cluster::BrokerView;
use ricochet_replication::NodeId;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a leader gives a new member to catch up and the membership to
/// switch before it tries again.
const CHANGE_WITHIN: Duration = Duration::from_secs(30 * 60);

impl Groups {
    /// Keeps the groups this broker leads at their record: finishes a
    /// membership change the record asks for, or replaces a member down
    /// for too long.
    pub(super) async fn maintain(
        &self,
        members: &[(String, Arc<ReplicatedPartition>, GroupRecord)],
    ) -> Result<()> {
        let leading: Vec<_> = members
            .iter()
            .filter(|(_, p, _)| {
                let me = p.node().id();
                // A leader that moved itself out steps down: not its work.
                p.node().leader() == Some(me) && p.node().voters().contains(&me)
            })
            .collect();
        {
            let mut down = crate::util::lock(&self.down_since);
            down.retain(|(t, _), _| leading.iter().any(|(l, _, _)| l == t));
        }
        if leading.is_empty() {
            return Ok(());
        }
        let brokers = self.cluster.brokers().await?;
        let now = Instant::now();
        for (topic, partition, record) in leading {
            let wanted: BTreeMap<NodeId, String> = record
                .member_ids()
                .into_iter()
                .map(|(b, id)| (id, b))
                .collect();
            let voters = partition.node().voters();
            if voters != wanted.keys().copied().collect() {
                self.change_voters(topic, partition, &wanted, &brokers);
                continue;
            }
            if !voters.contains(&partition.node().id()) {
                // It moved itself out since the filter above (the switch
                // committed meanwhile): the next leader clears `leaving`
                // once it took the topic.
                continue;
            }
            if !record.leaving.is_empty() {
                // The membership switched without them: they may stop.
                self.clear_leaving(topic, record).await?;
                continue;
            }
            if self.replace_after.is_zero() {
                continue;
            }
            self.replace_dead(topic, record, &brokers, now).await?;
        }
        Ok(())
    }

    /// Replaces the first member of `topic`'s group down for
    /// `replace_after`, if a broker can take its place.
    async fn replace_dead(
        &self,
        topic: &str,
        record: &GroupRecord,
        brokers: &[BrokerView],
        now: Instant,
    ) -> Result<()> {
        let me = self.cluster.id();
        let mut overdue = None;
        {
            let mut down = crate::util::lock(&self.down_since);
            for m in record.members.iter().filter(|m| *m != me) {
                let key = (topic.to_owned(), m.clone());
                if brokers.iter().any(|b| b.id == *m && b.live) {
                    down.remove(&key);
                    continue;
                }
                let since = *down.entry(key).or_insert(now);
                if overdue.is_none() && now.duration_since(since) >= self.replace_after {
                    overdue = Some(m.clone());
                }
            }
        }
        let Some(dead) = overdue else {
            crate::util::lock(&self.unreplaced).remove(topic);
            return Ok(());
        };
        // Only a broker sharing this one's object store ([`super::super::tier`])
        // and applying every group command of this build.
        let spare = super::moves::spare(
            record,
            brokers,
            me,
            self.cluster.tier(),
            &Default::default(),
        );
        let Some(spare) = spare else {
            if crate::util::lock(&self.unreplaced).insert(topic.to_owned()) {
                tracing::warn!(%topic, %dead, "a member is down past replace_after and no live broker outside the group may replace it (sharing this broker's [tiered] store and applying every group command of this build): the group stays degraded");
            }
            return Ok(());
        };
        crate::util::lock(&self.unreplaced).remove(topic);
        let key = self.group_key(topic);
        let etcd = self.cluster.etcd();
        let Some(kv) = etcd.get(&key).await? else {
            return Ok(());
        };
        let current: GroupRecord = serde_json::from_str(&kv.value)
            .map_err(|e| BrokerError::Etcd(format!("bad group record of {topic}: {e}")))?;
        if current != *record {
            // Changed since it was read: decide again at the next round.
            return Ok(());
        }
        let Some(next) = current.replacing(&dead, &spare) else {
            return Ok(());
        };
        let json = serde_json::to_string(&next)
            .map_err(|e| BrokerError::Etcd(format!("cannot encode a group record: {e}")))?;
        if etcd
            .replace_if_unchanged(&key, &json, kv.mod_revision, 0)
            .await?
        {
            tracing::info!(%topic, %dead, new = %spare, members = ?next.members, "replacing a member that stayed down");
            ricochet_storage::util::write(&self.known).insert(topic.to_owned(), next);
        }
        Ok(())
    }

    /// Starts making `topic`'s Raft voters the record's `wanted` (node id
    /// → broker), unless that is under way already.
    fn change_voters(
        &self,
        topic: &str,
        partition: &Arc<ReplicatedPartition>,
        wanted: &BTreeMap<NodeId, String>,
        brokers: &[BrokerView],
    ) {
        let mut addrs = BTreeMap::new();
        for (id, broker) in wanted {
            match brokers.iter().find(|b| b.id == *broker && b.live) {
                Some(b) => {
                    addrs.insert(*id, b.url.clone());
                }
                None if partition.node().voters().contains(id) => {
                    // A voter already: its address is in the membership.
                    addrs.insert(*id, String::new());
                }
                None => {
                    tracing::debug!(%topic, %broker, "the new member's broker is not live yet");
                    return;
                }
            }
        }
        if !crate::util::lock(&self.changing).insert(topic.to_owned()) {
            return;
        }
        let (topic, partition, changing) =
            (topic.to_owned(), partition.clone(), self.changing.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            match partition.node().change_voters(addrs, CHANGE_WITHIN).await {
                Ok(()) => tracing::info!(
                    %topic,
                    voters = ?partition.node().voters(),
                    ms = started.elapsed().as_millis() as u64,
                    "group membership changed"
                ),
                Err(e) => tracing::warn!(%topic, error = %e, "group membership not changed"),
            }
            crate::util::lock(&changing).remove(&topic);
        });
    }
}

impl Groups {
    /// Once after this broker starts: deletes the copies of replicated
    /// topics whose group no longer names it (it was replaced while it was
    /// down, so it never started their members), with their Raft logs.
    pub(super) async fn sweep_replaced(
        &self,
        known: &std::collections::HashMap<String, GroupRecord>,
    ) {
        if self.swept.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let stored = match self.storage.list_topics() {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list the stored topics");
                self.swept.store(false, std::sync::atomic::Ordering::SeqCst);
                return;
            }
        };
        let me = self.cluster.id();
        for t in stored.iter().filter(|t| t.replicas > 1) {
            let Some(record) = known.get(&t.name) else {
                continue;
            };
            if record.holding_id(me).is_some() {
                continue;
            }
            tracing::info!(topic = %t.name, "this broker was replaced in the group while it was down: dropping its copy");
            let group = record.raft_group(&t.name);
            if let Err(e) = ricochet_replication::remove_group(&self.db, &self.settings, &group) {
                tracing::warn!(topic = %t.name, error = %e, "cannot remove the group's Raft log");
            }
            if let Err(e) = self.drop_copy(&t.name) {
                tracing::warn!(topic = %t.name, error = %e, "cannot delete this replica's copy");
            }
        }
    }
}
