//! Moving a replicated topic's replica off a broker as a membership change
//! (`cluster move` of a topic with a factor above 1, and `cluster drain`
//! for every group the drained broker belongs to), with no copy by the
//! moving broker and no stop of the topic for the catch-up.
//!
//! The broker that leaves writes the group's record in etcd with the new
//! broker in its place (a node id never used in the group) and itself
//! under `leaving` (a compare-and-set on the record it read). From there
//! it is the path a replacement takes ([`super::members`]): the new broker
//! starts its member when it reads the record; the group's leader, seeing
//! its Raft voters differ from the record, adds it as a learner, waits
//! until it caught up (a snapshot and the log after it) while the topic is
//! served as before, and switches the membership (joint consensus), which
//! removes the leaving member. A leaving leader steps down once that
//! switch is committed (openraft 0.9) and the others elect a leader, which
//! takes the topic (placement, claim) and clears `leaving`; the leaving
//! broker, no longer named, stops its member and deletes its copy. The
//! caller waits until `leaving` no longer names the broker.
//!
//! A move to a broker that is a member already only moves the leadership
//! ([`super::transfer`]), and a leader that leaves first hands its
//! leadership to another live member the same way (when that fails, the
//! group elects a leader after the switch, as before).

use super::super::gate;
use super::{GroupRecord, Groups};
use crate::error::{BrokerError, Result};
use ricochet_cluster::BrokerView;
use std::time::{Duration, Instant};

/// How long a move waits for the new member to catch up and the
/// membership to switch.
pub const MOVE_WITHIN: Duration = Duration::from_secs(10 * 60);

/// How often a waiting move reads the record (and the placement).
const POLL: Duration = Duration::from_millis(100);

/// A replica moved off this broker.
#[derive(Debug, Clone, PartialEq)]
pub struct MemberMoved {
    /// The topic.
    pub topic: String,
    /// The broker that took this one's place in the group.
    pub to: String,
    /// How long the topic was served by nobody, as this broker saw it:
    /// from when it stopped serving it (it led and stepped down) until
    /// etcd placed it on the next leader; 0 when it did not lead.
    pub unavailable_ms: u64,
    /// The whole move (catch-up and switch), ms.
    pub millis: u64,
}

impl Groups {
    /// Moves this broker's replica of replicated `topic` to broker `to`
    /// (live, not draining, outside the group), or with `None` to the live
    /// broker outside the group with the fewest placed topics; answers once
    /// the membership switched.
    pub async fn move_out(&self, topic: &str, to: Option<&str>) -> Result<MemberMoved> {
        let me = self.cluster.id().to_owned();
        let record = self
            .read_group(topic)
            .await?
            .ok_or_else(|| BrokerError::TopicNotFound(format!("{topic} (no replication group)")))?;
        if !record.members.contains(&me) {
            return Err(BrokerError::Conflict(format!(
                "broker {me} is not a member of {topic}'s replication group {:?}",
                record.members
            )));
        }
        let brokers = self.cluster.brokers().await?;
        let target = match to {
            Some(t) if t == me => {
                return Err(BrokerError::InvalidArgument(format!(
                    "{topic} is on broker {t} already"
                )));
            }
            // A member already: only the leadership moves.
            Some(t) if record.members.iter().any(|m| m == t) => {
                return self.transfer_to(topic, &record, t).await;
            }
            Some(t) => {
                let Some(b) = brokers.iter().find(|b| b.id == t && b.live && !b.draining) else {
                    return Err(BrokerError::InvalidArgument(format!(
                        "broker {t} is not live, or is draining"
                    )));
                };
                if let Err(why) = joinable(b, self.cluster.tier()) {
                    return Err(BrokerError::Conflict(format!(
                        "broker {t} cannot join {topic}'s replication group: {why}"
                    )));
                }
                t.to_owned()
            }
            None => spare(
                &record,
                &brokers,
                &me,
                self.cluster.tier(),
                &Default::default(),
            )
            .ok_or_else(|| {
                BrokerError::Conflict(format!(
                    "no live, non-draining, upgraded broker sharing this broker's [tiered] \
                         store outside {topic}'s replication group {:?} to move its replica to",
                    record.members
                ))
            })?,
        };
        let started = Instant::now();
        let handover = self.hand_off_first(topic, &record, &brokers).await;
        self.begin_leaving(topic, &me, &target).await?;
        let mut moved = self.wait_moved(topic, &me, &target, started).await?;
        moved.unavailable_ms += handover;
        Ok(moved)
    }

    /// Moves this broker (draining) out of every replication group it is a
    /// member of, each to a live, non-draining broker outside the group
    /// (fewest placed topics first, counting the ones given here), all at
    /// once; per topic, where it went or why it stayed (no such broker:
    /// this broker stays a member). The records are read from etcd now (a
    /// group created a moment ago is not missed).
    pub async fn drain_out(&self) -> Result<Vec<(String, Result<MemberMoved>)>> {
        let me = self.cluster.id().to_owned();
        let prefix = self.cluster.key("groups/");
        let mut mine: Vec<(String, GroupRecord)> = Vec::new();
        for kv in self.cluster.etcd().get_prefix(&prefix).await? {
            let Some(topic) = kv.key.strip_prefix(&prefix) else {
                continue;
            };
            let record: GroupRecord = serde_json::from_str(&kv.value)
                .map_err(|e| BrokerError::Etcd(format!("bad group record of {topic}: {e}")))?;
            if record.members.contains(&me) {
                mine.push((topic.to_owned(), record));
            }
        }
        if mine.is_empty() {
            return Ok(Vec::new());
        }
        let brokers = match self.cluster.brokers().await {
            Ok(b) => b,
            Err(e) => {
                let e = e.to_string();
                return Ok(mine
                    .into_iter()
                    .map(|(t, _)| (t, Err(BrokerError::Etcd(e.clone()))))
                    .collect());
            }
        };
        let started = Instant::now();
        let mut given = std::collections::HashMap::new();
        let mut out = Vec::new();
        let mut waiting = Vec::new();
        for (topic, record) in mine {
            let Some(to) = spare(&record, &brokers, &me, self.cluster.tier(), &given) else {
                out.push((
                    topic.clone(),
                    Err(BrokerError::Conflict(format!(
                        "no live, non-draining, upgraded broker sharing this broker's [tiered] \
                         store outside its replication group {:?} to replace broker {me}: it \
                         stays a member",
                        record.members
                    ))),
                ));
                continue;
            };
            *given.entry(to.clone()).or_insert(0u64) += 1;
            // Leading it: another member leads before this one leaves.
            self.hand_off_first(&topic, &record, &brokers).await;
            match self.begin_leaving(&topic, &me, &to).await {
                Ok(()) => waiting.push((topic, to)),
                Err(e) => out.push((topic, Err(e))),
            }
        }
        let done = futures::future::join_all(waiting.into_iter().map(|(topic, to)| {
            let me = me.clone();
            async move {
                let r = self.wait_moved(&topic, &me, &to, started).await;
                (topic, r)
            }
        }))
        .await;
        out.extend(done);
        Ok(out)
    }

    /// The names of every replicated topic, from etcd now (one read).
    pub async fn replicated_topics(&self) -> Result<std::collections::HashSet<String>> {
        let prefix = self.cluster.key("groups/");
        Ok(self
            .cluster
            .etcd()
            .get_prefix(&prefix)
            .await?
            .into_iter()
            .filter_map(|kv| kv.key.strip_prefix(&prefix).map(str::to_owned))
            .collect())
    }

    /// Writes `topic`'s record with `me` leaving and `to` in its place (a
    /// compare-and-set on the record read now), and wakes the leader's
    /// side of it when that is this broker.
    async fn begin_leaving(&self, topic: &str, me: &str, to: &str) -> Result<()> {
        let key = self.group_key(topic);
        let etcd = self.cluster.etcd();
        for _ in 0..5 {
            let Some(kv) = etcd.get(&key).await? else {
                return Err(BrokerError::TopicNotFound(format!(
                    "{topic} (its replication group was deleted)"
                )));
            };
            let current: GroupRecord = serde_json::from_str(&kv.value)
                .map_err(|e| BrokerError::Etcd(format!("bad group record of {topic}: {e}")))?;
            if current.leaving.iter().any(|(b, _)| b == me) {
                // Under way already (an earlier call): wait for it.
                return Ok(());
            }
            let next = current.moving(me, to).ok_or_else(|| {
                BrokerError::Conflict(format!(
                    "cannot move broker {me}'s replica of {topic} to {to}: the group is {:?}",
                    current.members
                ))
            })?;
            let json = serde_json::to_string(&next)
                .map_err(|e| BrokerError::Etcd(format!("cannot encode a group record: {e}")))?;
            if etcd
                .replace_if_unchanged(&key, &json, kv.mod_revision, 0)
                .await?
            {
                tracing::info!(%topic, from = %me, %to, members = ?next.members, "moving a replica: membership change recorded");
                ricochet_storage::util::write(&self.known).insert(topic.to_owned(), next);
                self.leader_changed.notify_one();
                return Ok(());
            }
        }
        Err(BrokerError::Conflict(format!(
            "the replication group of {topic} kept changing; try again"
        )))
    }

    /// Waits until `topic`'s record no longer lists `me` as leaving (the
    /// group's leader switched the membership and cleared it) and, when
    /// this broker led, etcd places the topic on another broker (the next
    /// leader took it).
    async fn wait_moved(
        &self,
        topic: &str,
        me: &str,
        to: &str,
        started: Instant,
    ) -> Result<MemberMoved> {
        let placement = self.cluster.key(&format!("placement/{topic}"));
        let led = self.is_serving(topic);
        let mut stopped: Option<Instant> = None;
        let mut unavailable = None;
        loop {
            if led && unavailable.is_none() {
                if stopped.is_none() && !self.is_serving(topic) {
                    stopped = Some(Instant::now());
                }
                if let Some(s) = stopped {
                    let at = self.cluster.etcd().get(&placement).await?;
                    if at.is_some_and(|kv| kv.value != me) {
                        unavailable = Some(s.elapsed());
                    }
                }
            }
            let record = self.read_group(topic).await?.ok_or_else(|| {
                BrokerError::TopicNotFound(format!("{topic} (its replication group was deleted)"))
            })?;
            // Done once the membership switched without this broker and,
            // when it led, the next leader took the topic.
            if !record.leaving.iter().any(|(b, _)| b == me) && (!led || unavailable.is_some()) {
                if !record.members.iter().any(|m| m == to) {
                    return Err(BrokerError::Conflict(format!(
                        "{topic}'s replication group changed meanwhile: {:?}",
                        record.members
                    )));
                }
                let millis = started.elapsed().as_millis() as u64;
                tracing::info!(%topic, from = %me, %to, millis, "replica moved");
                return Ok(MemberMoved {
                    topic: topic.to_owned(),
                    to: to.to_owned(),
                    unavailable_ms: unavailable.map_or(0, |d| d.as_millis() as u64),
                    millis,
                });
            }
            if started.elapsed() > MOVE_WITHIN {
                return Err(BrokerError::Peer(format!(
                    "the membership change of {topic} ({me} out, {to} in) did not finish within \
                     {MOVE_WITHIN:?}; it goes on (`ricochet cluster brokers` shows the group)"
                )));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Clears `topic`'s `leaving` once the membership switched without
    /// them (run by the group's leader; a compare-and-set on `record`).
    pub(super) async fn clear_leaving(&self, topic: &str, record: &GroupRecord) -> Result<()> {
        let key = self.group_key(topic);
        let etcd = self.cluster.etcd();
        let Some(kv) = etcd.get(&key).await? else {
            return Ok(());
        };
        let current: GroupRecord = serde_json::from_str(&kv.value)
            .map_err(|e| BrokerError::Etcd(format!("bad group record of {topic}: {e}")))?;
        if current != *record {
            return Ok(());
        }
        let next = GroupRecord {
            leaving: Vec::new(),
            ..current
        };
        let json = serde_json::to_string(&next)
            .map_err(|e| BrokerError::Etcd(format!("cannot encode a group record: {e}")))?;
        if etcd
            .replace_if_unchanged(&key, &json, kv.mod_revision, 0)
            .await?
        {
            tracing::info!(%topic, left = ?record.leaving, "membership switched: the moved members may stop");
            ricochet_storage::util::write(&self.known).insert(topic.to_owned(), next);
        }
        Ok(())
    }
}

/// Why broker `b` may not be added to a group led from a broker with
/// second tier `tier`: it must share that store (a group's members
/// offload to and read from one store), and apply every group command
/// this build proposes ([`gate::may_join`]).
fn joinable(b: &BrokerView, tier: Option<&str>) -> std::result::Result<(), String> {
    if let Some(d) = super::super::tier::difference(tier, b.tier.as_deref()) {
        return Err(format!(
            "{d} (a group's members offload to and read from one store)"
        ));
    }
    if !gate::may_join(b.group_commands) {
        return Err(format!(
            "it advertises group commands level {}, {} needed (upgrade it: it could not apply \
             the group's log)",
            b.group_commands,
            gate::GROUP_COMMANDS
        ));
    }
    Ok(())
}

/// The live, non-draining broker outside `record`'s group (and not `me`)
/// that may join it (it shares this broker's second tier, and applies
/// every group command this build proposes: [`gate::may_join`]) with the
/// fewest placed topics, counting `given` more.
pub(super) fn spare(
    record: &GroupRecord,
    brokers: &[BrokerView],
    me: &str,
    tier: Option<&str>,
    given: &std::collections::HashMap<String, u64>,
) -> Option<String> {
    brokers
        .iter()
        .filter(|b| {
            b.live
                && !b.draining
                && b.id != me
                && !record.members.contains(&b.id)
                && !record.leaving.iter().any(|(l, _)| *l == b.id)
                && joinable(b, tier).is_ok()
        })
        .min_by_key(|b| {
            (
                b.placed + given.get(&b.id).copied().unwrap_or(0),
                b.id.clone(),
            )
        })
        .map(|b| b.id.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn broker(id: &str, placed: u64, level: u32) -> BrokerView {
        BrokerView {
            id: id.to_owned(),
            live: true,
            placed,
            group_commands: level,
            ..Default::default()
        }
    }

    #[test]
    fn a_spare_is_a_broker_that_applies_every_group_command_of_this_build() {
        let record = GroupRecord::of(&["b0", "b1", "b2"]);
        let level = gate::GROUP_COMMANDS;
        let none = Default::default();
        let mut brokers = vec![
            broker("b0", 0, level),
            broker("b1", 0, level),
            broker("b2", 0, level),
            // The least loaded outside the group, but from before the seal
            // through the group: it could not apply the log it catches up on.
            broker("b3", 0, gate::SEAL),
            broker("b4", 5, level),
        ];
        assert_eq!(
            spare(&record, &brokers, "b0", None, &none).as_deref(),
            Some("b4")
        );
        // Named as a move's target, it is refused with the reason.
        let why = joinable(&brokers[3], None).unwrap_err();
        let needed = format!("group commands level 1, {} needed", gate::GROUP_COMMANDS);
        assert!(why.contains(&needed), "{why}");
        // Registered without the field at all.
        brokers[4].group_commands = 0;
        assert_eq!(spare(&record, &brokers, "b0", None, &none), None);
        // Once upgraded, the least loaded is taken again.
        brokers[3].group_commands = level;
        assert_eq!(
            spare(&record, &brokers, "b0", None, &none).as_deref(),
            Some("b3")
        );
    }
}
