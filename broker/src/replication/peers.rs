//! Per-broker identities for the Raft calls (issue 22): a caller of the
//! `Replication` service may speak only for the broker whose peer role it
//! proved. Each broker registers in etcd the role its own peer token
//! proves (`Registration::peer_role`, checked at start); every request
//! speaks for one node of its group (`ricochet_replication::claimed_node`);
//! the group's record in etcd names the broker of that node (a member, or
//! a member being moved out); and the caller's authenticated role must be
//! the role that broker registered. Anything else is PERMISSION_DENIED
//! naming the role and the broker (or node) it claimed, before the request
//! reaches its group.
//!
//! The registered roles are read with the group records (every
//! `WATCH_EVERY`, after them: a group record naming a broker is only
//! written once that broker registered, so its role is known by the time a
//! request for the group can be routed). A broker whose registration went
//! away (its lease lapsed) keeps its last role here. Brokers that share one
//! peer token register the same role: the check passes for all of them
//! (it cannot tell them apart) and one WARN says so. A broker that
//! registered no role (one from before this check) is let through as
//! before, with one WARN naming it.

use super::record::GroupRecord;
use crate::auth::Principal;
use ricochet_replication::{NodeId, PeerCall};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, RwLock};
use tonic::Status;

/// What a request's check found when it let the request through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Admitted {
    /// The caller's role is the one the broker registered.
    Bound,
    /// The broker (this id) registered no peer role: any superuser passes.
    Unbound(String),
}

/// The group record of Raft group `group` (a topic, with `@incarnation`
/// when its record has one) among `known` (records by topic).
pub(crate) fn record_of<'a>(
    known: &'a HashMap<String, GroupRecord>,
    group: &str,
) -> Option<&'a GroupRecord> {
    // As `GroupRecord::raft_group` names them, without formatting a name
    // per request.
    if let Some(r) = known.get(group).filter(|r| r.incarnation == 0) {
        return Some(r);
    }
    let (topic, incarnation) = group.rsplit_once('@')?;
    let incarnation: u64 = incarnation.parse().ok().filter(|i| *i != 0)?;
    known.get(topic).filter(|r| r.incarnation == incarnation)
}

/// Whether `caller` may make a `call` of `group` (whose record is
/// `record`) speaking for node `node`, given each broker's registered peer
/// role (`roles`); the reason, naming the role and what it claimed, when
/// it may not.
pub(crate) fn speaks_for(
    caller: &str,
    (group, call, node): (&str, PeerCall, NodeId),
    record: Option<&GroupRecord>,
    roles: &HashMap<String, Option<String>>,
) -> Result<Admitted, String> {
    let Some(record) = record else {
        return Err(format!(
            "role {caller:?} sent {call} for group {group}, whose record this broker \
             does not know: it cannot tell which broker node {node} is"
        ));
    };
    let Some(broker) = record.holder_of(node) else {
        return Err(format!(
            "role {caller:?} sent {call} as node {node} of group {group}, which is no \
             member of it"
        ));
    };
    match roles.get(broker) {
        Some(Some(registered)) if registered == caller => Ok(Admitted::Bound),
        Some(Some(registered)) => Err(format!(
            "role {caller:?} may not speak for broker {broker} (node {node} of group {group}, \
             {call}): that broker's peer role is {registered:?}"
        )),
        Some(None) => Ok(Admitted::Unbound(broker.to_owned())),
        None => Err(format!(
            "role {caller:?} claims broker {broker} (node {node} of group {group}, {call}), \
             which this broker has not seen register"
        )),
    }
}

/// Brokers registered under each peer role two or more of them share.
pub(crate) fn shared(roles: &HashMap<String, Option<String>>) -> BTreeMap<&str, Vec<&str>> {
    let mut by_role: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (broker, role) in roles {
        if let Some(role) = role {
            by_role.entry(role).or_default().push(broker);
        }
    }
    by_role.retain(|_, brokers| brokers.len() > 1);
    for brokers in by_role.values_mut() {
        brokers.sort_unstable();
    }
    by_role
}

/// The peer roles the cluster's brokers registered, as this broker last
/// read them, and the check of each `Replication` request against them.
#[derive(Debug, Default)]
pub struct PeerRoles {
    roles: RwLock<HashMap<String, Option<String>>>,
    warned_shared: AtomicBool,
    warned_unbound: Mutex<BTreeSet<String>>,
}

impl PeerRoles {
    /// Takes the registrations just read (a broker no longer registered
    /// keeps its last role); warns once if brokers share a peer role.
    pub fn update(&self, read: Vec<(String, Option<String>)>) {
        let mut roles = ricochet_storage::util::write(&self.roles);
        for (broker, role) in read {
            roles.insert(broker, role);
        }
        let shared = shared(&roles);
        if !shared.is_empty() && !self.warned_shared.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                shared = ?shared,
                "peer identities are shared: these brokers register the same peer role \
                 ([cluster] peer_token_file), so each of them can speak Raft for the others; \
                 give each broker a token of its own role (docs: security.md, between brokers)"
            );
        }
    }

    /// Admits a `call` of `group` speaking for node `node` from `caller`
    /// (`record`: the group's record), or refuses it PERMISSION_DENIED.
    pub fn check(
        &self,
        caller: Option<&Principal>,
        (group, call, node): (&str, PeerCall, NodeId),
        record: Option<&GroupRecord>,
    ) -> Result<(), Status> {
        let Some(caller) = caller else {
            return Err(Status::permission_denied(
                "the Replication service needs a broker's peer token",
            ));
        };
        let verdict = {
            let roles = ricochet_storage::util::read(&self.roles);
            speaks_for(&caller.role, (group, call, node), record, &roles)
        };
        match verdict {
            Ok(Admitted::Bound) => Ok(()),
            Ok(Admitted::Unbound(broker)) => {
                if ricochet_storage::util::lock(&self.warned_unbound).insert(broker.clone()) {
                    tracing::warn!(
                        %broker,
                        role = %caller.role,
                        "broker {broker} registered no peer role (a broker from before per-broker \
                         identities): any superuser may speak Raft for it"
                    );
                }
                Ok(())
            }
            Err(why) => {
                tracing::warn!(%group, node, role = %caller.role, reason = %why, "Raft call refused");
                Err(Status::permission_denied(why))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> GroupRecord {
        // b0, b1, b2 are nodes 1, 2, 3; b1 was then moved out to b3 (node 4).
        serde_json::from_str::<GroupRecord>(
            r#"{"replicas":3,"members":["b0","b1","b2"],"incarnation":77}"#,
        )
        .unwrap()
        .moving("b1", "b3")
        .unwrap()
    }

    fn roles(pairs: &[(&str, Option<&str>)]) -> HashMap<String, Option<String>> {
        pairs
            .iter()
            .map(|(b, r)| (b.to_string(), r.map(str::to_owned)))
            .collect()
    }

    #[test]
    fn a_broker_speaks_only_for_its_own_nodes() {
        let r = record();
        let roles = roles(&[
            ("b0", Some("broker-b0")),
            ("b1", Some("broker-b1")),
            ("b2", Some("broker-b2")),
            ("b3", Some("broker-b3")),
        ]);
        let g = "persistent://public/default/t@77";
        let ok = |role: &str, call, node| speaks_for(role, (g, call, node), Some(&r), &roles);
        assert_eq!(ok("broker-b0", PeerCall::Vote, 1), Ok(Admitted::Bound));
        assert_eq!(
            ok("broker-b3", PeerCall::AppendEntries, 4),
            Ok(Admitted::Bound)
        );
        // b1 is leaving: its replica still runs, under node 2.
        assert_eq!(ok("broker-b1", PeerCall::Elect, 2), Ok(Admitted::Bound));
        // Another broker's role claiming b0's node: refused, naming both.
        let e = ok("broker-b2", PeerCall::AppendEntries, 1).unwrap_err();
        assert!(
            e.contains("\"broker-b2\"") && e.contains("broker b0") && e.contains("\"broker-b0\""),
            "{e}"
        );
        // An admin (a superuser, but no broker) claiming a broker: refused.
        let e = ok("admin", PeerCall::InstallSnapshot, 3).unwrap_err();
        assert!(e.contains("\"admin\"") && e.contains("broker b2"), "{e}");
        // A node that is no member of the group: refused.
        let e = ok("broker-b0", PeerCall::Vote, 9).unwrap_err();
        assert!(e.contains("node 9") && e.contains("no member"), "{e}");
        // No record of the group: refused.
        let e = speaks_for("broker-b0", (g, PeerCall::Vote, 1), None, &roles).unwrap_err();
        assert!(e.contains("does not know"), "{e}");
        // A broker never seen registered: refused.
        let few = self::roles(&[("b0", Some("broker-b0"))]);
        let e = speaks_for("broker-b2", (g, PeerCall::Vote, 3), Some(&r), &few).unwrap_err();
        assert!(
            e.contains("broker b2") && e.contains("not seen register"),
            "{e}"
        );
    }

    #[test]
    fn shared_roles_pass_and_unbound_brokers_pass_as_before() {
        let r = record();
        let g = "persistent://public/default/t@77";
        let same = roles(&[
            ("b0", Some("broker")),
            ("b1", Some("broker")),
            ("b2", Some("broker")),
        ]);
        // One shared token: the check cannot tell the brokers apart.
        assert_eq!(
            speaks_for("broker", (g, PeerCall::Vote, 3), Some(&r), &same),
            Ok(Admitted::Bound)
        );
        assert!(speaks_for("admin", (g, PeerCall::Vote, 3), Some(&r), &same).is_err());
        assert_eq!(
            shared(&same),
            BTreeMap::from([("broker", vec!["b0", "b1", "b2"])])
        );
        let own = roles(&[
            ("b0", Some("broker-b0")),
            ("b1", Some("broker-b1")),
            ("b2", None),
        ]);
        assert!(shared(&own).is_empty());
        assert_eq!(
            speaks_for("admin", (g, PeerCall::Vote, 3), Some(&r), &own),
            Ok(Admitted::Unbound("b2".into()))
        );
    }

    #[test]
    fn a_raft_group_name_finds_its_record() {
        let mut known = HashMap::new();
        known.insert("persistent://public/default/t".to_owned(), record());
        let old: GroupRecord =
            serde_json::from_str(r#"{"replicas":3,"members":["a","b","c"]}"#).unwrap();
        known.insert("persistent://public/default/old".to_owned(), old);
        assert!(record_of(&known, "persistent://public/default/t@77").is_some());
        // Another incarnation of the same topic, the bare topic: not this group.
        assert!(record_of(&known, "persistent://public/default/t@78").is_none());
        assert!(record_of(&known, "persistent://public/default/t").is_none());
        // A record without an incarnation: its group is the topic.
        assert!(record_of(&known, "persistent://public/default/old").is_some());
        assert!(record_of(&known, "persistent://public/default/old@0").is_none());
        assert!(record_of(&known, "nothing@1").is_none());
    }

    #[test]
    fn a_check_without_a_caller_or_with_another_role_is_permission_denied() {
        let peers = PeerRoles::default();
        peers.update(vec![
            ("b0".into(), Some("broker-b0".into())),
            ("b2".into(), Some("broker-b2".into())),
        ]);
        // b0 left (its registration is gone): its last role is kept.
        peers.update(vec![("b2".into(), Some("broker-b2".into()))]);
        let r = record();
        let g = "persistent://public/default/t@77";
        let who = |role: &str| Principal { role: role.into() };
        assert!(
            peers
                .check(Some(&who("broker-b0")), (g, PeerCall::Vote, 1), Some(&r))
                .is_ok()
        );
        let e = peers
            .check(Some(&who("broker-b2")), (g, PeerCall::Vote, 1), Some(&r))
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        let e = peers
            .check(None, (g, PeerCall::AppendEntries, 1), Some(&r))
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
    }
}
