//! A replicated topic's group record in etcd (`groups/<topic>`): its
//! factor, member brokers and their Raft node ids.

use ricochet_replication::NodeId;
use serde::{Deserialize, Serialize};

/// A replicated topic's group, as etcd records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupRecord {
    /// The replication factor.
    pub replicas: u32,
    /// The member brokers' ids; the first initialized the group.
    pub members: Vec<String>,
    /// Which group of this topic's name it is (its creation time, ms): a
    /// topic deleted and created again is a new group with a Raft log of
    /// its own. 0 in records written before it existed.
    #[serde(default)]
    pub incarnation: u64,
    /// Each member's Raft node id, in `members`' order; empty in records
    /// of groups that never changed members (then a member's id is its
    /// position plus one).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ids: Vec<NodeId>,
    /// The node id the next member added gets (ids are never reused: a
    /// replaced member's id may still sit in a returning broker's log);
    /// 0: one past the members.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub next_id: NodeId,
    /// Brokers being moved out of the group (a move or a drain) with
    /// their node ids: no longer in `members`, they keep their replica
    /// running until the group's leader switched the membership without
    /// them and cleared this list.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub leaving: Vec<(String, NodeId)>,
}

fn is_zero(n: &NodeId) -> bool {
    *n == 0
}

impl GroupRecord {
    /// The Raft group's name (its log's, and what its RPCs are routed by):
    /// the topic, with the incarnation when it has one.
    pub fn raft_group(&self, topic: &str) -> String {
        if self.incarnation == 0 {
            topic.to_owned()
        } else {
            format!("{topic}@{}", self.incarnation)
        }
    }

    /// Broker `id`'s Raft node id in this group.
    pub fn node_id(&self, id: &str) -> Option<NodeId> {
        let i = self.members.iter().position(|m| m == id)?;
        Some(self.id_at(i))
    }

    fn id_at(&self, i: usize) -> NodeId {
        self.ids.get(i).copied().unwrap_or(i as NodeId + 1)
    }

    /// Broker `id`'s Raft node id in this group, a leaving member's
    /// included (its replica runs until the membership switched).
    pub fn holding_id(&self, id: &str) -> Option<NodeId> {
        self.node_id(id)
            .or_else(|| self.leaving.iter().find(|(b, _)| b == id).map(|(_, n)| *n))
    }

    /// The record moving member `old` out and broker `new` in: `new` takes
    /// `old`'s place under a node id never used, `old` is listed as
    /// leaving; `None` when `old` is no member or `new` is one already.
    pub fn moving(&self, old: &str, new: &str) -> Option<GroupRecord> {
        if self.members.iter().any(|m| m == new) {
            return None;
        }
        let id = self.node_id(old)?;
        let mut next = self.replacing(old, new)?;
        next.leaving.retain(|(b, _)| b != old && b != new);
        next.leaving.push((old.to_owned(), id));
        Some(next)
    }

    /// The broker id of Raft node `node`.
    pub fn broker_of(&self, node: NodeId) -> Option<&str> {
        let i = (0..self.members.len()).find(|i| self.id_at(*i) == node)?;
        self.members.get(i).map(String::as_str)
    }

    /// The broker holding Raft node `node`: a member, or a member being
    /// moved out (its replica runs until the membership switched).
    pub fn holder_of(&self, node: NodeId) -> Option<&str> {
        self.broker_of(node).or_else(|| {
            self.leaving
                .iter()
                .find(|(_, n)| *n == node)
                .map(|(b, _)| b.as_str())
        })
    }

    /// Each member with its Raft node id, in the record's order.
    pub fn member_ids(&self) -> Vec<(String, NodeId)> {
        (0..self.members.len())
            .map(|i| (self.members[i].clone(), self.id_at(i)))
            .collect()
    }

    /// The record with member `old` replaced by broker `new`, under a node
    /// id never used in this group; `None` when `old` is no member.
    pub fn replacing(&self, old: &str, new: &str) -> Option<GroupRecord> {
        let i = self.members.iter().position(|m| m == old)?;
        let mut ids: Vec<NodeId> = (0..self.members.len()).map(|i| self.id_at(i)).collect();
        let fresh = self.next_id.max(ids.iter().copied().max().unwrap_or(0) + 1);
        ids[i] = fresh;
        let mut members = self.members.clone();
        members[i] = new.to_owned();
        Some(GroupRecord {
            members,
            ids,
            next_id: fresh + 1,
            ..self.clone()
        })
    }
}

#[cfg(test)]
impl GroupRecord {
    /// A first membership of `members` (factor their count, incarnation 1),
    /// for tests.
    pub(crate) fn of(members: &[&str]) -> Self {
        Self {
            ids: Vec::new(),
            next_id: 0,
            leaving: Vec::new(),
            incarnation: 1,
            replicas: members.len() as u32,
            members: members.iter().map(|m| m.to_string()).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replaced_member_gets_an_id_never_used() {
        let r = GroupRecord {
            replicas: 3,
            members: vec!["b0".into(), "b1".into(), "b2".into()],
            incarnation: 1,
            ids: Vec::new(),
            next_id: 0,
            leaving: Vec::new(),
        };
        assert_eq!(r.node_id("b1"), Some(2));
        let r2 = r.replacing("b2", "b3").expect("b2 is a member");
        assert_eq!(r2.node_id("b3"), Some(4));
        assert_eq!(r2.node_id("b2"), None);
        assert_eq!(r2.broker_of(4), Some("b3"));
        assert_eq!(r2.broker_of(3), None);
        // b3 replaced in turn: 5, not 4 again nor 3.
        let r3 = r2.replacing("b3", "b2").expect("b3 is a member");
        assert_eq!(r3.node_id("b2"), Some(5));
        assert_eq!(r3.member_ids()[..2], [("b0".into(), 1), ("b1".into(), 2)]);
        assert!(r.replacing("b9", "b3").is_none());
        // An old record (no ids) reads as before.
        let old: GroupRecord =
            serde_json::from_str(r#"{"replicas":3,"members":["a","b","c"]}"#).unwrap();
        assert_eq!(old.node_id("c"), Some(3));
        assert!(old.leaving.is_empty());
    }

    #[test]
    fn a_moved_member_leaves_under_its_id_and_its_place_gets_a_new_one() {
        let r: GroupRecord =
            serde_json::from_str(r#"{"replicas":3,"members":["b0","b1","b2"]}"#).unwrap();
        let m = r.moving("b1", "b3").expect("b1 is a member");
        assert_eq!(m.members, ["b0", "b3", "b2"]);
        assert_eq!(m.node_id("b3"), Some(4));
        assert_eq!(m.node_id("b1"), None);
        assert_eq!(m.holding_id("b1"), Some(2));
        assert_eq!(m.leaving, [("b1".to_owned(), 2)]);
        // Not to a member, not from a broker outside the group.
        assert!(r.moving("b1", "b2").is_none());
        assert!(r.moving("b9", "b3").is_none());
        // The record round-trips through etcd's JSON.
        let json = serde_json::to_string(&m).unwrap();
        assert_eq!(serde_json::from_str::<GroupRecord>(&json).unwrap(), m);
    }
}
