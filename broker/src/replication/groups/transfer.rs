//! Moving a replicated topic's leadership to another member: `cluster
//! move T --to B` where B holds a replica of T already.
//!
//! openraft 0.9 has no leadership transfer; this one is built on its
//! `trigger().elect()`. The leader marks the topic as moving to B and
//! closes it (its streams end with UNAVAILABLE, moving; no write is
//! proposed from then on), waits until B holds its whole log, and asks B
//! (the `Elect` call of the peers' `Replication` service) to stand for
//! election at once. B's log being as long as any, the old leader grants
//! its vote (once it has led longer than its lease, 1 s) and steps down on
//! the higher term; the third member's vote is not needed (it refuses
//! while its lease of the old leader runs). B takes the topic as any new
//! leader does (placement, claim) and clients follow through `Lookup`.
//! When B does not lead within [`TRANSFER_WITHIN`], this broker takes the
//! topic back if it still leads (else whoever leads takes it) and the call
//! fails, naming why.
//!
//! A leader moving its own replica out (`cluster move` to a broker outside
//! the group, `cluster drain`) first hands the leadership to another live
//! member the same way ([`Groups::hand_off_first`]), so the membership
//! change that removes it is made by a leader that stays, and the topic
//! does not wait for an election after the switch.

use super::{GroupRecord, Groups, MemberMoved, Role};
use crate::error::{BrokerError, Result};
use ricochet_cluster::BrokerView;
use std::time::{Duration, Instant};

/// How long the handover may take (B catching up on the last entries,
/// then its election) before this broker takes the topic back.
const TRANSFER_WITHIN: Duration = Duration::from_secs(10);

/// How long the call then waits for B to take the topic (etcd placing it
/// on B).
const PLACED_WITHIN: Duration = Duration::from_secs(30);

/// How often that wait reads the placement.
const POLL: Duration = Duration::from_millis(20);

impl Groups {
    /// Hands `topic`'s leadership, held here, to its member `to`; answers
    /// once etcd places the topic on `to`, with the time the topic was
    /// served by nobody as this broker saw it (from its close to that
    /// placement).
    pub(super) async fn transfer_to(
        &self,
        topic: &str,
        record: &GroupRecord,
        to: &str,
    ) -> Result<MemberMoved> {
        let started = Instant::now();
        let me = self.cluster.id().to_owned();
        let to_id = record.node_id(to).ok_or_else(|| {
            BrokerError::InvalidArgument(format!("broker {to} is not a member of {topic}"))
        })?;
        let partition = self.member(topic).await.ok_or_else(|| {
            BrokerError::Conflict(format!("broker {me} runs no member of {topic} yet"))
        })?;
        let node = partition.node();
        {
            let mut leaders = crate::util::lock(&self.leaders);
            let serving = leaders.get(topic) == Some(&Role::Serving);
            if !serving || node.leader() != Some(node.id()) {
                return Err(BrokerError::Conflict(format!(
                    "broker {me} does not lead {topic}: send the move to the broker it is placed on"
                )));
            }
            leaders.insert(topic.to_owned(), Role::Handing);
        }
        if let Err(e) = self.cluster.begin_move(topic, to) {
            crate::util::lock(&self.leaders).insert(topic.to_owned(), Role::Serving);
            return Err(e.into());
        }
        self.close(topic).await;
        let stopped = Instant::now();
        tracing::info!(%topic, %to, "handing the leadership to a member");
        if let Err(e) = node.transfer_leadership(to_id, TRANSFER_WITHIN).await {
            tracing::warn!(%topic, %to, error = %e, "the leadership did not move; taking the topic back");
            self.cluster.end_move(topic);
            // Taken again at the next look at the leader if this member
            // still leads; else the member that leads takes it.
            crate::util::lock(&self.leaders).insert(topic.to_owned(), Role::Follower);
            self.leader_changed.notify_one();
            return Err(BrokerError::Peer(format!(
                "the leadership of {topic} did not move to broker {to}: {e}"
            )));
        }
        self.leader_changed.notify_one();
        let placement = self.cluster.key(&format!("placement/{topic}"));
        let deadline = Instant::now() + PLACED_WITHIN;
        loop {
            let placed = self.cluster.etcd().get(&placement).await?;
            if placed.is_some_and(|kv| kv.value == to) {
                break;
            }
            if Instant::now() >= deadline {
                return Err(BrokerError::Peer(format!(
                    "broker {to} leads {topic}'s group but did not take the topic within \
                     {PLACED_WITHIN:?}"
                )));
            }
            tokio::time::sleep(POLL).await;
        }
        let ms = |d: Duration| d.as_millis() as u64;
        Ok(MemberMoved {
            topic: topic.to_owned(),
            to: to.to_owned(),
            unavailable_ms: ms(stopped.elapsed()),
            millis: ms(started.elapsed()),
        })
    }

    /// When this broker serves `topic` as its leader, hands the leadership
    /// to another live, non-draining member first (see the module doc);
    /// answers the time the topic was served by nobody during the handover
    /// (0 when this broker did not lead). A failed handover is logged and
    /// answers 0: the move goes on as before (the group elects a leader
    /// after the switch).
    pub(super) async fn hand_off_first(
        &self,
        topic: &str,
        record: &GroupRecord,
        brokers: &[BrokerView],
    ) -> u64 {
        let me = self.cluster.id();
        if crate::util::lock(&self.leaders).get(topic) != Some(&Role::Serving) {
            return 0;
        }
        let Some(other) = record.members.iter().find(|m| {
            m.as_str() != me && brokers.iter().any(|b| b.id == **m && b.live && !b.draining)
        }) else {
            return 0;
        };
        match self.transfer_to(topic, record, other).await {
            Ok(m) => {
                tracing::info!(%topic, to = %other, unavailable_ms = m.unavailable_ms, "leadership handed over before the membership change");
                m.unavailable_ms
            }
            Err(e) => {
                tracing::warn!(%topic, to = %other, error = %e, "no handover before the membership change; the group will elect");
                0
            }
        }
    }
}
