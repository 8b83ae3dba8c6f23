//! Which replication-group commands a group's leader may propose while a
//! rolling upgrade is under way. A broker that does not know a command
//! cannot decode it and stops applying its group, so every broker
//! advertises the level of group commands it applies in its etcd
//! registration (`Registration::group_commands`, [`GROUP_COMMANDS`] for
//! this build), and a leader proposes a command of level `n` only when
//! every member of the group (its members and those being moved out, so
//! voters and learners) is registered with a level of `n` or more
//! ([`behind`]). A registration without the field (a broker from before
//! it) reads as level 0; a member not registered at all (down) counts as
//! behind too, since the build it comes back with is unknown.
//!
//! Levels: 1 knows `PartitionCommand::Seal` (session 17, no longer
//! proposed), 2 knows `PartitionCommand::SealBelow` (the group's seal of a
//! segment, proposed by the seal pass and by an on-demand offload), 3
//! knows `PartitionCommand::Sequence` (commands the leader's write queue
//! coalesced into one entry, proposed only while every member advertises
//! it: `ReplicatedStorage::set_coalescing`).

use std::collections::HashMap;
use std::fmt;

/// Knows `PartitionCommand::Seal`.
pub const SEAL: u32 = 1;
/// Knows `PartitionCommand::SealBelow`.
pub const SEAL_BELOW: u32 = 2;
/// Knows `PartitionCommand::Sequence`.
pub const COALESCED: u32 = 3;
/// The level this build applies, and registers.
pub const GROUP_COMMANDS: u32 = COALESCED;

/// A member that does not advertise the level a command needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Behind {
    /// Its broker id.
    pub broker: String,
    /// The level it advertises; `None`: it is not registered.
    pub level: Option<u32>,
    /// The level needed.
    pub needed: u32,
}

impl fmt::Display for Behind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.level {
            Some(l) => write!(
                f,
                "member {} advertises group commands level {l}, {} needed (upgrade it)",
                self.broker, self.needed
            ),
            None => write!(
                f,
                "member {} is not registered (down?): its group commands level is unknown, {} needed",
                self.broker, self.needed
            ),
        }
    }
}

/// Whether a broker advertising `level` may be added to a group by this
/// build (as a move's target or a dead member's replacement): a joining
/// replica catches up from the leader's log and snapshot, which may hold
/// any command this build proposes, and a broker that cannot decode one
/// stops applying the group. The gate of [`behind`] covers only the
/// members already in the group.
pub fn may_join(level: u32) -> bool {
    level >= GROUP_COMMANDS
}

/// The first of `members` whose registration (in `levels`: broker id and
/// advertised level, as `Cluster::group_commands` reads them) does not
/// advertise `needed`; `None`: every member does, the command may be
/// proposed.
pub fn behind<'a>(
    members: impl IntoIterator<Item = &'a str>,
    levels: &[(String, u32)],
    needed: u32,
) -> Option<Behind> {
    members.into_iter().find_map(|m| {
        let level = levels.iter().find(|(b, _)| b == m).map(|(_, l)| *l);
        (level.unwrap_or(0) < needed).then(|| Behind {
            broker: m.to_owned(),
            level,
            needed,
        })
    })
}

/// What a leader last logged about the commands it holds back, per topic:
/// the seal pass asks again on each pass, and only a change of answer is
/// logged ([`HeldBack::note`]). A topic leaves it when this broker stops
/// leading it ([`HeldBack::forget`]), so a leadership that comes back to a
/// group still held back warns again.
#[derive(Debug, Default)]
pub struct HeldBack(HashMap<String, String>);

/// What [`HeldBack::note`] found changed, to be logged.
#[derive(Debug, PartialEq, Eq)]
pub enum Change {
    /// Newly held back, or for another reason than last logged.
    Held,
    /// No longer held back.
    Released,
    /// As last logged.
    Same,
}

impl HeldBack {
    /// Records `topic`'s answer now (`Some(reason)`: held back).
    pub fn note(&mut self, topic: &str, unready: Option<String>) -> Change {
        match unready {
            Some(why) if self.0.get(topic) == Some(&why) => Change::Same,
            Some(why) => {
                self.0.insert(topic.to_owned(), why);
                Change::Held
            }
            None if self.0.remove(topic).is_some() => Change::Released,
            None => Change::Same,
        }
    }

    /// `topic` is no longer led here.
    pub fn forget(&mut self, topic: &str) {
        self.0.remove(topic);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn levels(of: &[(&str, u32)]) -> Vec<(String, u32)> {
        of.iter().map(|(b, l)| ((*b).to_owned(), *l)).collect()
    }

    #[test]
    fn a_command_is_proposed_only_when_every_member_advertises_its_level() {
        let members = ["b0", "b1", "b2"];
        let all = levels(&[("b0", 2), ("b1", 2), ("b2", 3), ("b9", 0)]);
        assert_eq!(behind(members, &all, SEAL_BELOW), None);
        // An old registration (no field) reads as 0.
        let old = levels(&[("b0", 2), ("b1", 0), ("b2", 2)]);
        let b = behind(members, &old, SEAL_BELOW).unwrap();
        assert_eq!((b.broker.as_str(), b.level), ("b1", Some(0)));
        assert!(
            b.to_string()
                .contains("member b1 advertises group commands level 0, 2 needed")
        );
        // A member knowing `Seal` only is behind for `SealBelow`, not for `Seal`.
        let seal = levels(&[("b0", 2), ("b1", 1), ("b2", 2)]);
        assert_eq!(behind(members, &seal, SEAL_BELOW).unwrap().broker, "b1");
        assert_eq!(behind(members, &seal, SEAL), None);
        // A member not registered is behind: its build is unknown.
        let down = levels(&[("b0", 2), ("b1", 2)]);
        let b = behind(members, &down, SEAL_BELOW).unwrap();
        assert_eq!((b.broker.as_str(), b.level), ("b2", None));
        assert!(b.to_string().contains("not registered"));
        // A broker outside the group does not matter.
        assert_eq!(behind(["b0"], &old, SEAL_BELOW), None);
    }

    #[test]
    fn only_a_broker_applying_every_command_of_this_build_may_join_a_group() {
        assert!(may_join(GROUP_COMMANDS));
        assert!(may_join(GROUP_COMMANDS + 1));
        assert!(!may_join(SEAL));
        assert!(!may_join(0));
        // A broker of session 18-20 (it cannot decode a `Sequence`) is not
        // admitted into a group this build may coalesce into.
        assert!(!may_join(SEAL_BELOW));
        assert!(may_join(COALESCED));
    }

    #[test]
    fn a_hold_is_logged_once_per_change_and_again_after_the_leadership_came_back() {
        let mut held = HeldBack::default();
        let why = || Some("member b1 advertises group commands level 0, 2 needed".to_owned());
        assert_eq!(held.note("t", why()), Change::Held);
        assert_eq!(held.note("t", why()), Change::Same);
        assert_eq!(
            held.note("t", Some("member b2 is not registered".into())),
            Change::Held
        );
        assert_eq!(held.note("t", None), Change::Released);
        assert_eq!(held.note("t", None), Change::Same);
        // Leadership moved away while held back, then came back: warned again.
        assert_eq!(held.note("t", why()), Change::Held);
        held.forget("t");
        assert_eq!(held.note("t", why()), Change::Held);
        // Other topics are their own.
        assert_eq!(held.note("u", None), Change::Same);
    }
}
