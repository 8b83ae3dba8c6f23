//! Each replicated topic's replication as its Raft leader sees it: the
//! leader's last log index, each member's matched index and a health word,
//! reported by the leader to etcd every [`REPORT_EVERY`]
//! (`replication-status/<topic>`, JSON) so that whichever broker answers
//! `ListBrokers` shows it (openraft knows the matched indexes on the leader
//! only).
//!
//! Health ([`health`], pure): `down` when the member's broker is not live
//! in the cluster, or it made no progress for [`DOWN_AFTER`] while behind;
//! `lagging` when it had not reached the index the leader had at its
//! previous report (a member keeping up reaches it within one interval);
//! `ok` otherwise. A report older than [`STALE_AFTER`] (its leader died or
//! was cut off) is not believed: the listing says `unknown` (or `down`
//! for a broker that is not live).

use crate::error::{BrokerError, Result};
use ricochet_cluster::Cluster;
use ricochet_replication::{NodeId, Progress};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// How often a leader reports its groups' replication.
pub const REPORT_EVERY: Duration = Duration::from_secs(2);

/// A report older than this is not believed.
pub const STALE_AFTER: Duration = Duration::from_secs(6);

/// A member behind the leader that made no progress for this long is down.
pub const DOWN_AFTER: Duration = Duration::from_secs(10);

/// A member's health word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Health {
    /// Holds what the leader had at its previous report, or all of it.
    Ok,
    /// Did not reach what the leader had at its previous report.
    Lagging,
    /// Its broker is not live, or it made no progress for [`DOWN_AFTER`].
    Down,
    /// No recent report from a leader.
    Unknown,
}

impl Health {
    /// The word shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Ok => "ok",
            Health::Lagging => "lagging",
            Health::Down => "down",
            Health::Unknown => "unknown",
        }
    }
}

/// The health of a member whose broker is `live`, holding up to `matched`
/// of the leader's `last` index; `previous` is the leader's last index at
/// its previous report, `stalled` how long `matched` has not moved.
pub fn health(
    live: bool,
    matched: u64,
    last: u64,
    previous: Option<u64>,
    stalled: Duration,
) -> Health {
    if !live {
        return Health::Down;
    }
    if matched >= last {
        return Health::Ok;
    }
    if stalled >= DOWN_AFTER {
        return Health::Down;
    }
    match previous {
        Some(p) if matched < p => Health::Lagging,
        _ => Health::Ok,
    }
}

/// One member in a report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberStatus {
    /// Its broker.
    pub broker: String,
    /// The highest log index the leader knows it holds.
    pub matched: u64,
    /// Its health when reported.
    pub health: Health,
}

/// A leader's report on its group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupStatus {
    /// The reporting leader's broker id.
    pub leader: String,
    /// When, ms since the epoch.
    pub at_ms: u64,
    /// Its last log index.
    pub last_index: u64,
    /// The members, in the group record's order.
    pub members: Vec<MemberStatus>,
    /// A member has been down longer than `replace_after` and no live
    /// broker outside the group can replace it: the group stays degraded.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unreplaced: bool,
    /// Members whose `[tiered]` store differs from the leader's, with how
    /// ([`super::tier`]): a group formed before the check, or a broker
    /// restarted with another section.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub tier_differs: std::collections::BTreeMap<String, String>,
}

/// What a leader remembers between two reports on one group.
#[derive(Debug, Default)]
pub struct Tracker {
    last_report: Option<(Instant, u64)>,
    /// Per member: its matched index and since when it has not moved.
    progress: HashMap<NodeId, (u64, Instant)>,
    /// The `[tiered]` differences warned about already, by member.
    tier_warned: HashMap<String, String>,
}

impl Tracker {
    /// Whether a report is due.
    pub fn due(&self, now: Instant) -> bool {
        self.last_report
            .is_none_or(|(at, _)| now.duration_since(at) >= REPORT_EVERY)
    }

    /// The report on the group of `members` (broker ids with their Raft
    /// node ids) from the leader's `progress`, as `me` (the leader's broker
    /// id); `live` holds the live brokers.
    pub fn report(
        &mut self,
        me: &str,
        members: &[(String, NodeId)],
        progress: &Progress,
        live: &HashSet<String>,
        now: Instant,
    ) -> GroupStatus {
        let last = progress.last_index;
        let previous = self.last_report.map(|(_, l)| l);
        let mut reported = Vec::with_capacity(members.len());
        for (broker, node) in members {
            let node = *node;
            let (matched, health) = if broker == me {
                (last, Health::Ok)
            } else {
                let matched = progress.matched.get(&node).copied().flatten().unwrap_or(0);
                let since = match self.progress.get(&node) {
                    Some((m, since)) if *m == matched => *since,
                    _ => now,
                };
                self.progress.insert(node, (matched, since));
                let stalled = now.duration_since(since);
                let h = health(live.contains(broker), matched, last, previous, stalled);
                (matched, h)
            };
            reported.push(MemberStatus {
                broker: broker.clone(),
                matched,
                health,
            });
        }
        self.last_report = Some((now, last));
        GroupStatus {
            leader: me.to_owned(),
            at_ms: ricochet_storage::util::wall_ms(),
            last_index: last,
            members: reported,
            unreplaced: false,
            tier_differs: Default::default(),
        }
    }

    /// Keeps `differs` (member → how its `[tiered]` store differs from
    /// the leader's) in `status`, with a WARN the first time each member
    /// differs in a way (again once it changed).
    pub fn note_tiers(
        &mut self,
        topic: &str,
        status: &mut GroupStatus,
        differs: std::collections::BTreeMap<String, String>,
    ) {
        self.tier_warned.retain(|m, _| differs.contains_key(m));
        for (member, how) in &differs {
            if self.tier_warned.get(member) != Some(how) {
                tracing::warn!(%topic, %member, difference = %how, "a member of this replication group does not share the leader's [tiered] object store: it cannot follow the group's offloads (give it the same [tiered] url and endpoint, or move its replica)");
                self.tier_warned.insert(member.clone(), how.clone());
            }
        }
        status.tier_differs = differs;
    }
}

fn key(cluster: &Cluster, topic: &str) -> String {
    cluster.key(&format!("replication-status/{topic}"))
}

/// Writes `status` as `topic`'s report.
pub async fn write(cluster: &Cluster, topic: &str, status: &GroupStatus) -> Result<()> {
    let json = serde_json::to_string(status)
        .map_err(|e| BrokerError::Etcd(format!("cannot encode a group status: {e}")))?;
    cluster.etcd().put(&key(cluster, topic), &json, 0).await?;
    Ok(())
}

/// Whether `topic`'s group has a report (it had a leader).
pub async fn exists(cluster: &Cluster, topic: &str) -> Result<bool> {
    Ok(cluster.etcd().get(&key(cluster, topic)).await?.is_some())
}

/// Removes `topic`'s report (its group was deleted).
pub async fn remove(cluster: &Cluster, topic: &str) -> Result<()> {
    cluster.etcd().delete(&key(cluster, topic)).await?;
    Ok(())
}

/// Every group's latest report, by topic.
pub async fn read_all(cluster: &Cluster) -> Result<HashMap<String, GroupStatus>> {
    let prefix = cluster.key("replication-status/");
    let mut all = HashMap::new();
    for kv in cluster.etcd().get_prefix(&prefix).await? {
        let Some(topic) = kv.key.strip_prefix(&prefix) else {
            continue;
        };
        match serde_json::from_str::<GroupStatus>(&kv.value) {
            Ok(s) => {
                all.insert(topic.to_owned(), s);
            }
            Err(e) => tracing::warn!(%topic, error = %e, "bad replication status"),
        }
    }
    Ok(all)
}

/// Whether a report made at `at_ms` is too old to believe at `now_ms`.
pub fn stale(at_ms: u64, now_ms: u64) -> bool {
    now_ms.saturating_sub(at_ms) > STALE_AFTER.as_millis() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn health_words() {
        let s = Duration::from_secs(1);
        assert_eq!(health(false, 10, 10, Some(10), s), Health::Down);
        assert_eq!(health(true, 10, 10, Some(5), s), Health::Ok);
        // Behind, but holds what the leader had at its previous report.
        assert_eq!(health(true, 8, 10, Some(8), s), Health::Ok);
        assert_eq!(health(true, 8, 10, None, s), Health::Ok);
        assert_eq!(health(true, 7, 10, Some(8), s), Health::Lagging);
        assert_eq!(health(true, 7, 10, Some(8), DOWN_AFTER), Health::Down);
    }

    fn record() -> Vec<(String, NodeId)> {
        vec![("b0".into(), 1), ("b1".into(), 2), ("b2".into(), 3)]
    }

    fn progress(last: u64, b1: Option<u64>, b2: Option<u64>) -> Progress {
        Progress {
            last_index: last,
            matched: BTreeMap::from([(2, b1), (3, b2)]),
        }
    }

    #[test]
    fn a_member_that_stops_keeping_up_lags_then_is_down() {
        let live: HashSet<String> = ["b0", "b1", "b2"].map(String::from).into();
        let mut t = Tracker::default();
        let t0 = Instant::now();
        assert!(t.due(t0));
        let r = t.report(
            "b0",
            &record(),
            &progress(10, Some(10), Some(10)),
            &live,
            t0,
        );
        let words: Vec<_> = r.members.iter().map(|m| (m.matched, m.health)).collect();
        assert_eq!(
            words,
            [(10, Health::Ok), (10, Health::Ok), (10, Health::Ok)]
        );
        let t1 = t0 + REPORT_EVERY;
        assert!(!t.due(t1 - Duration::from_millis(1)) && t.due(t1));
        // b1 keeps up (past the previous report's 10), b2 stopped at 10.
        let r = t.report(
            "b0",
            &record(),
            &progress(30, Some(25), Some(10)),
            &live,
            t1,
        );
        assert_eq!(r.members[1].health, Health::Ok, "{r:?}");
        assert_eq!(r.members[2].health, Health::Ok, "reached 10: {r:?}");
        let t2 = t1 + REPORT_EVERY;
        let r = t.report(
            "b0",
            &record(),
            &progress(50, Some(45), Some(10)),
            &live,
            t2,
        );
        assert_eq!(r.members[1].health, Health::Ok, "{r:?}");
        assert_eq!(r.members[2].health, Health::Lagging, "below 30: {r:?}");
        let t3 = t0 + DOWN_AFTER;
        let r = t.report(
            "b0",
            &record(),
            &progress(60, Some(60), Some(10)),
            &live,
            t3,
        );
        assert_eq!(r.members[2].health, Health::Down, "stalled 10 s: {r:?}");
        // Its broker gone from the cluster: down at once.
        let two: HashSet<String> = ["b0", "b2"].map(String::from).into();
        let r = t.report("b0", &record(), &progress(60, Some(60), Some(60)), &two, t3);
        assert_eq!(r.members[1].health, Health::Down, "{r:?}");
        assert_eq!(r.members[2].health, Health::Ok, "{r:?}");
    }
}
