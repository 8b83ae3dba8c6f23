//! Following a group's leadership on this broker: a member that becomes
//! its group's leader takes the topic (placement, claim) once it applied
//! everything committed; one that stops leading closes the topic and hands
//! it to the new leader; a leader whose write failed reopens it; and a
//! leader handing its leadership to a chosen member (a move to a member,
//! [`super::transfer`]) is left alone until the group elected it.

use super::{GroupRecord, Groups, Role, WRITE_TIMEOUT};
use crate::error::{BrokerError, Result};
use crate::name::TopicName;
use crate::replication::gate::{self, Change};
use crate::replication::{ReplicatedPartition, ReplicatedStorage};
use std::sync::Arc;

impl Groups {
    /// Acts on a change of `topic`'s leader as this member sees it: a
    /// member that now leads takes the topic; one that led and no longer
    /// does stops serving it and, once the new leader is known, hands it
    /// over.
    pub(super) async fn follow_leader(
        &self,
        topic: &str,
        partition: Arc<ReplicatedPartition>,
        record: &GroupRecord,
    ) {
        let me = partition.node().id();
        // A member moved out of the group (`leaving`) keeps its own vote
        // as the leader's once it stepped down: not a voter, it leads
        // nothing.
        let leader = partition
            .node()
            .leader()
            .filter(|l| *l != me || partition.node().voters().contains(&me));
        let state = crate::util::lock(&self.leaders)
            .get(topic)
            .copied()
            .unwrap_or(Role::Follower);
        // Handing the leadership to a member: the transfer decides until
        // another member leads.
        if state == Role::Handing && leader.is_none_or(|l| l == me) {
            return;
        }
        let next = match (state, leader) {
            (Role::Serving, Some(l)) if l == me => {
                if !self.poisoned(topic) {
                    return;
                }
                // A write failed or its outcome is unknown: open the topic
                // again from what the group applied here.
                tracing::info!(%topic, "reopening the replicated topic after a failed write");
                let _ = self.cluster.begin_move(topic, self.cluster.id());
                self.close(topic).await;
                self.cluster.end_move(topic);
                match self.take(topic, &partition, record).await {
                    Ok(()) => Role::Serving,
                    Err(e) => {
                        tracing::warn!(%topic, error = %e, "cannot reopen the topic yet");
                        Role::Follower
                    }
                }
            }
            (Role::Follower, l) if l != Some(me) => return,
            (Role::Parked, None) => return,
            (Role::Serving, None) => {
                tracing::info!(%topic, "no longer leading the replicated topic; no leader yet");
                self.close(topic).await;
                if let Err(e) = self.cluster.begin_move(topic, "the group's next leader") {
                    tracing::debug!(%topic, error = %e, "cannot mark the topic as moving");
                }
                let owner = self.cluster.key(&format!("owners/{topic}"));
                if let Err(e) = self.cluster.etcd().delete(&owner).await {
                    tracing::warn!(%topic, error = %e, "cannot drop this broker's claim");
                }
                Role::Parked
            }
            (Role::Serving | Role::Parked | Role::Handing, Some(l)) if l != me => {
                let to = record.broker_of(l).unwrap_or_default().to_owned();
                tracing::info!(%topic, %to, "no longer leading the replicated topic");
                self.close(topic).await;
                if state == Role::Serving
                    && let Err(e) = self.cluster.begin_move(topic, &to)
                {
                    tracing::debug!(%topic, error = %e, "cannot mark the topic as moving");
                }
                // Fails harmlessly when the new leader placed it already.
                if let Err(e) = self.cluster.hand_over(topic, &to).await {
                    tracing::debug!(%topic, error = %e, "topic not handed over");
                }
                self.cluster.end_move(topic);
                Role::Follower
            }
            (Role::Follower | Role::Parked | Role::Handing, _) | (Role::Serving, _) => {
                if state == Role::Parked {
                    self.cluster.end_move(topic);
                }
                match self.take(topic, &partition, record).await {
                    Ok(()) => {
                        tracing::info!(%topic, broker = %self.cluster.id(), "leading the replicated topic");
                        Role::Serving
                    }
                    Err(e) => {
                        tracing::warn!(%topic, error = %e, "cannot take the topic as its leader yet");
                        Role::Follower
                    }
                }
            }
        };
        crate::util::lock(&self.leaders).insert(topic.to_owned(), next);
    }

    /// Takes `topic` as its group's leader: once everything committed is
    /// applied here, opens it, points `placement/<topic>` at this broker,
    /// drops an owner key another broker left (a leader that died: Raft
    /// chose this one), and claims the topic. A take that fails once the
    /// topic is open closes it again ([`Self::retract`]): nothing half
    /// taken stays served here.
    pub(super) async fn take(
        &self,
        topic: &str,
        partition: &Arc<ReplicatedPartition>,
        record: &GroupRecord,
    ) -> Result<()> {
        partition
            .node()
            .raft()
            .ensure_linearizable()
            .await
            .map_err(|e| BrokerError::Peer(format!("not confirmed as leader: {e}")))?;
        let name = TopicName::parse_stored(topic)?;
        // The member that formed the group lost its first election before
        // it committed the topic's creation: the group's leader commits it
        // (idempotent, as every `CreateTopic`).
        if !self.holds_record(name.as_str())? {
            let command = super::create_command(&name, record.replicas);
            tokio::time::timeout(
                WRITE_TIMEOUT,
                super::propose_as_leader(partition, &command, None),
            )
            .await
            .map_err(|_| {
                BrokerError::Peer(format!("the creation of {name} was not committed in time"))
            })??;
        }
        let mut storage = ReplicatedStorage::new(partition.clone(), WRITE_TIMEOUT);
        if let Some(rt) = self.runtime.handle() {
            storage = storage.with_raft_runtime(rt);
        }
        storage.count_as(name.as_str());
        self.core
            .open_replicated(&name, Arc::new(storage.clone()), record.replicas)
            .await?;
        // Coalesced entries only once every member is known to apply them
        // (re-checked every 10 s: `coalescing::spawn_level_pass`).
        let coalesce = self.unready_in(record, gate::COALESCED).await.is_none();
        storage.set_coalescing(coalesce);
        crate::util::lock(&self.serving).insert(topic.to_owned(), storage);
        if let Err(e) = self.place_here(&name).await {
            self.retract(topic).await;
            return Err(e);
        }
        // Replay jobs stored through the group run where it is led.
        crate::replay_jobs::resume_topic(&self.core, topic);
        Ok(())
    }

    /// Points `placement/<topic>` at this broker, drops another broker's
    /// claim, and claims the topic here.
    async fn place_here(&self, name: &TopicName) -> Result<()> {
        let topic = name.as_str();
        let me = self.cluster.id();
        let etcd = self.cluster.etcd();
        let placement = self.cluster.key(&format!("placement/{topic}"));
        match etcd.get(&placement).await? {
            Some(kv) if kv.value == me => {}
            Some(kv) => {
                // The previous leader, seeing this one lead, hands the
                // topic over (`Cluster::hand_over`: placement here, its
                // claim dropped) at the same time: losing the
                // compare-and-set to that is the placement wanted.
                if !etcd
                    .replace_if_unchanged(&placement, me, kv.mod_revision, 0)
                    .await?
                {
                    if etcd.get(&placement).await?.is_none_or(|kv| kv.value != me) {
                        return Err(BrokerError::Conflict("placement changed meanwhile".into()));
                    }
                    tracing::info!(%topic, previous = %kv.value, "placed here meanwhile by the previous leader's hand-over");
                }
            }
            None => {
                etcd.create_if_absent(&placement, me, 0).await?;
            }
        }
        let owner = self.cluster.key(&format!("owners/{topic}"));
        if let Some(kv) = etcd.get(&owner).await?
            && kv.value != me
        {
            tracing::info!(%topic, previous = %kv.value, "dropping the previous leader's claim");
            etcd.delete(&owner).await?;
        }
        self.cluster.route(topic, false).await?;
        Ok(())
    }

    /// Undoes a take that failed once the topic was open: streams that
    /// reached it meanwhile (the placement may name this broker already)
    /// end as after a move, so their clients look the topic up again, and
    /// the topic is closed. Left open, it went on serving them until the
    /// next take opened it again over them: their writes in flight then
    /// got no receipt and no end (a producer stalled until its timeout).
    async fn retract(&self, topic: &str) {
        let marked = self.cluster.begin_move(topic, self.cluster.id()).is_ok();
        self.close(topic).await;
        if marked {
            self.cluster.end_move(topic);
        }
    }

    /// Stops serving `topic` here: its storage refuses writes from now on
    /// and the topic leaves the core's registry.
    pub(super) async fn close(&self, topic: &str) {
        crate::util::lock(&self.held).forget(topic);
        let storage = crate::util::lock(&self.serving).remove(topic);
        if let Some(s) = storage {
            s.retire();
        }
        if let Ok(name) = TopicName::parse_stored(topic) {
            self.core.close_replicated(&name).await;
        }
    }

    /// The replicated topics this broker leads and serves now, with the
    /// storage they write through.
    pub fn served(&self) -> Vec<(String, ReplicatedStorage)> {
        crate::util::lock(&self.serving)
            .iter()
            .filter(|(_, s)| !s.is_poisoned())
            .map(|(t, s)| (t.clone(), s.clone()))
            .collect()
    }

    pub(super) fn poisoned(&self, topic: &str) -> bool {
        crate::util::lock(&self.serving)
            .get(topic)
            .is_none_or(ReplicatedStorage::is_poisoned)
    }

    /// Why `topic`'s leader may not propose a command of level `needed`
    /// now: the first member (or member being moved out) whose
    /// registration does not advertise it ([`super::super::gate`]), or the
    /// registrations could not be read; `None`: it may.
    pub async fn unready_for(&self, topic: &str, needed: u32) -> Option<String> {
        let Some(record) = self
            .started
            .lock()
            .await
            .get(topic)
            .map(|m| m.record.clone())
        else {
            return Some("this broker holds no member of the group".to_owned());
        };
        self.unready_in(&record, needed).await
    }

    /// [`Groups::unready_for`] the group of `record`.
    async fn unready_in(&self, record: &GroupRecord, needed: u32) -> Option<String> {
        let levels = self.cluster.group_commands().await;
        unready_with(record, &levels, needed)
    }

    /// Sets, for every replicated topic served here, whether its write
    /// queue may coalesce (every member of its group advertises
    /// [`gate::COALESCED`]), from one read of the registrations for all;
    /// a change is logged (see [`super::super::coalescing`]).
    pub async fn recheck_coalescing(&self) {
        let served = self.served();
        if served.is_empty() {
            return;
        }
        let levels = self.cluster.group_commands().await;
        let records: Vec<Option<GroupRecord>> = {
            let started = self.started.lock().await;
            served
                .iter()
                .map(|(t, _)| started.get(t).map(|m| m.record.clone()))
                .collect()
        };
        for ((topic, storage), record) in served.into_iter().zip(records) {
            let unready = match record {
                Some(r) => unready_with(&r, &levels, gate::COALESCED),
                None => Some("this broker holds no member of the group".to_owned()),
            };
            let on = unready.is_none();
            if storage.set_coalescing(on) != on {
                match unready {
                    Some(why) => {
                        tracing::warn!(%topic, reason = %why, "replicated topic: its leader stops coalescing writes into one entry until every member advertises the level");
                    }
                    None => {
                        tracing::info!(%topic, "replicated topic: every member advertises the coalesced entry again; its leader coalesces queued writes");
                    }
                }
            }
        }
    }

    /// Whether `topic`'s leader may propose a command of level `needed`
    /// now ([`Groups::unready_for`]); a change of answer is logged once
    /// (WARN naming the member held back, INFO when every member
    /// advertises it again).
    pub async fn may_propose(&self, topic: &str, needed: u32) -> bool {
        let unready = self.unready_for(topic, needed).await;
        let proposes = unready.is_none();
        let why = unready.clone().unwrap_or_default();
        match crate::util::lock(&self.held).note(topic, unready) {
            Change::Held => {
                tracing::warn!(%topic, level = needed, reason = %why, "replicated topic: its leader holds back a group command a member may not apply (its segments are not sealed by age) until every member advertises the level");
            }
            Change::Released => {
                tracing::info!(%topic, level = needed, "replicated topic: every member advertises the level of the group command held back; its leader proposes it again");
            }
            Change::Same => {}
        }
        proposes
    }
}

/// Why a command of level `needed` may not be proposed to the group of
/// `record` given the registrations `levels` (the first member, or member
/// being moved out, not advertising it; or the registrations could not be
/// read); `None`: it may.
fn unready_with(
    record: &GroupRecord,
    levels: &ricochet_cluster::Result<Vec<(String, u32)>>,
    needed: u32,
) -> Option<String> {
    let levels = match levels {
        Ok(l) => l,
        Err(e) => return Some(format!("cannot read the members' registrations: {e}")),
    };
    let members = record
        .members
        .iter()
        .chain(record.leaving.iter().map(|(b, _)| b))
        .map(String::as_str);
    gate::behind(members, levels, needed).map(|b| b.to_string())
}
