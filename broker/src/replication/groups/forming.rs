//! Finishing a group whose creation stopped half-way. A create writes the
//! group's record to etcd and then initializes the membership on its first
//! member; a crash of that broker (or a create dropped) in between left a
//! record naming members that no node ever initialized: every later create
//! found the record and returned, and the topic never had a leader.
//!
//! Each broker now notes the creates under way in this process
//! (`Groups::forming`); the periodic reading of the records
//! ([`Groups::finish_unformed`]) initializes, on the record's first member,
//! a group of the record's first membership whose node here has no
//! membership, whose create is not under way here, and which never had a
//! leader (no leader's report in etcd, see [`crate::replication::status`]:
//! a first member whose disk was lost also has no membership, and must
//! rejoin from the leader rather than start a membership of its own). Only the first
//! member ever initializes, so two brokers never both do; a node that
//! already has a membership refuses a second one (openraft), so a race
//! with a create under way fails harmlessly. The topic's creation is then
//! committed as the create would have (on this member when it leads; else
//! by the next create of the topic, as after a create that timed out).

use super::{FORM_TIMEOUT, Groups, create_command, propose_as_leader};
use crate::name::TopicName;
use crate::replication::ReplicatedPartition;
use crate::replication::record::GroupRecord;
use ricochet_replication::NodeId;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Marks a create of `topic` under way in this process while it lives.
pub(super) struct Forming<'a> {
    groups: &'a Groups,
    topic: String,
}

impl<'a> Forming<'a> {
    pub(super) fn start(groups: &'a Groups, topic: &str) -> Self {
        ricochet_storage::util::lock(&groups.forming).insert(topic.to_owned());
        Self {
            groups,
            topic: topic.to_owned(),
        }
    }
}

impl Drop for Forming<'_> {
    fn drop(&mut self) {
        ricochet_storage::util::lock(&self.groups.forming).remove(&self.topic);
    }
}

/// Whether `record` is a group's first membership with broker `me` first:
/// the one broker that initializes it.
fn initializes(record: &GroupRecord, me: &str) -> bool {
    record.ids.is_empty()
        && record.leaving.is_empty()
        && record.members.first().is_some_and(|m| m == me)
}

impl Groups {
    /// Initializes the groups of `started` members this broker should
    /// have initialized and never did (see the module doc).
    pub(super) async fn finish_unformed(
        &self,
        started: &[(String, Arc<ReplicatedPartition>, GroupRecord)],
    ) {
        let me = self.cluster.id().to_owned();
        let todo: Vec<_> = started
            .iter()
            .filter(|(topic, partition, record)| {
                initializes(record, &me)
                    && partition.node().voters().is_empty()
                    && !ricochet_storage::util::lock(&self.forming).contains(topic)
            })
            .collect();
        if todo.is_empty() {
            return;
        }
        let brokers = match self.cluster.brokers().await {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list the brokers to finish a group's forming");
                return;
            }
        };
        for (topic, partition, record) in todo {
            // A group that had a leader was formed: a member without a
            // membership lost its copy and catches up from the leader.
            match crate::replication::status::exists(&self.cluster, topic).await {
                Ok(false) => {}
                Ok(true) => continue,
                Err(e) => {
                    tracing::warn!(%topic, error = %e, "cannot read the group's report to finish its forming");
                    continue;
                }
            }
            let urls: Option<BTreeMap<NodeId, String>> = record
                .member_ids()
                .into_iter()
                .map(|(b, id)| Some((id, brokers.iter().find(|r| r.id == b)?.url.clone())))
                .collect();
            let Some(urls) = urls else {
                tracing::warn!(%topic, members = ?record.members, "a group never initialized names a broker not registered: left until it is");
                continue;
            };
            if let Err(e) = partition.node().initialize(urls).await {
                tracing::debug!(%topic, error = %e, "finishing a group's forming");
                continue;
            }
            tracing::warn!(
                %topic,
                members = ?record.members,
                "a group whose create stopped before its membership was initialized (a crash or a dropped create): initialized now"
            );
            // Then the topic's creation, as the create would have: here
            // when this member leads (it usually does, the one to start),
            // else by the next create of the topic on its leader. Apart
            // from the reading of the records, which must not wait for it.
            let Ok(name) = TopicName::parse(topic) else {
                continue;
            };
            let command = create_command(&name, record.replicas);
            let (partition, topic) = (partition.clone(), topic.clone());
            tokio::spawn(async move {
                match tokio::time::timeout(
                    FORM_TIMEOUT,
                    propose_as_leader(&partition, &command, None),
                )
                .await
                {
                    Ok(Ok(())) => tracing::info!(%topic, "the group's topic creation committed"),
                    Ok(Err(e)) => {
                        tracing::info!(%topic, error = %e, "the topic's creation is left to its next create")
                    }
                    Err(_) => {
                        tracing::info!(%topic, "the topic's creation is left to its next create (no commit in time)")
                    }
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(members: &[&str]) -> GroupRecord {
        GroupRecord::of(members)
    }

    #[test]
    fn only_the_first_member_of_a_first_membership_initializes() {
        let r = record(&["b0", "b1", "b2"]);
        assert!(initializes(&r, "b0"));
        assert!(!initializes(&r, "b1"));
        let moved = GroupRecord {
            ids: vec![4, 2, 3],
            next_id: 5,
            ..record(&["b3", "b1", "b2"])
        };
        assert!(
            !initializes(&moved, "b3"),
            "a later membership was initialized before it changed"
        );
        let leaving = GroupRecord {
            leaving: vec![("b9".into(), 9)],
            ..record(&["b0", "b1", "b2"])
        };
        assert!(!initializes(&leaving, "b0"));
    }
}
