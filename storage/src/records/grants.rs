//! Authorization grants as stored: the permissions a role holds on a
//! namespace or a topic, kept as the names the wire uses.

use serde::{Deserialize, Serialize};

/// Something a role may be allowed to do in a namespace or on a topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Permission {
    /// Publish.
    Produce,
    /// Subscribe and receive; look messages up.
    Consume,
    /// List, peek, replay and purge dead letters; read a dead-letter tier.
    DeadLetters,
    /// Set a subscription's dead-letter policy.
    Policy,
    /// Create and delete topics and subscriptions; grant in the namespace.
    Admin,
}

impl Permission {
    /// Every permission.
    pub const ALL: [Permission; 5] = [
        Permission::Produce,
        Permission::Consume,
        Permission::DeadLetters,
        Permission::Policy,
        Permission::Admin,
    ];

    /// The name on the wire, on the command line and in a stored grant.
    pub fn name(self) -> &'static str {
        match self {
            Permission::Produce => "produce",
            Permission::Consume => "consume",
            Permission::DeadLetters => "dead-letters",
            Permission::Policy => "policy",
            Permission::Admin => "admin",
        }
    }

    /// The permission named `name`, if this version knows it.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == name)
    }

    /// Its bit in a [`Permissions`] set.
    pub fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

impl std::fmt::Display for Permission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A set of [`Permission`]s, stored as their names in [`Permission::ALL`]'s
/// order. A stored name this version does not know is left out when read:
/// it grants nothing here.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Permissions(u8);

impl Permissions {
    /// The set whose members' [`Permission::bit`]s are `bits`.
    pub fn from_bits(bits: u8) -> Self {
        Self(bits & Self::all_bits())
    }

    /// Its members' bits.
    pub fn bits(self) -> u8 {
        self.0
    }

    /// Whether it holds `p`.
    pub fn contains(self, p: Permission) -> bool {
        self.0 & p.bit() != 0
    }

    /// Whether it holds nothing.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Its members, in [`Permission::ALL`]'s order.
    pub fn iter(self) -> impl Iterator<Item = Permission> {
        Permission::ALL
            .into_iter()
            .filter(move |p| self.contains(*p))
    }

    /// Its members' names, in [`Permission::ALL`]'s order.
    pub fn names(self) -> Vec<String> {
        self.iter().map(|p| p.name().to_owned()).collect()
    }

    fn all_bits() -> u8 {
        Permission::ALL.iter().fold(0, |a, p| a | p.bit())
    }
}

impl FromIterator<Permission> for Permissions {
    fn from_iter<I: IntoIterator<Item = Permission>>(ps: I) -> Self {
        Self(ps.into_iter().fold(0, |a, p| a | p.bit()))
    }
}

impl Serialize for Permissions {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter().map(Permission::name))
    }
}

impl<'de> Deserialize<'de> for Permissions {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let names = Vec::<String>::deserialize(d)?;
        Ok(names
            .iter()
            .filter_map(|n| Permission::from_name(n))
            .collect())
    }
}

/// An authorization grant: the permissions one role holds on one resource
/// (`tenant/namespace`, or a full topic name).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrantRecord {
    /// The role (a token's subject).
    pub role: String,
    /// `tenant/namespace` or `persistent://tenant/namespace/topic`.
    pub resource: String,
    /// What the role may do there (stored as the names the wire uses).
    pub permissions: Permissions,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permissions_are_stored_as_their_names_and_unknown_names_grant_nothing() {
        let set: Permissions = [Permission::Admin, Permission::Produce]
            .into_iter()
            .collect();
        assert_eq!(
            serde_json::to_string(&set).unwrap(),
            r#"["produce","admin"]"#
        );
        // A grant stored by a version that knew more permissions.
        let read: Permissions =
            serde_json::from_str(r#"["consume","fly","dead-letters"]"#).unwrap();
        assert_eq!(
            read.iter().collect::<Vec<_>>(),
            [Permission::Consume, Permission::DeadLetters]
        );
        for p in Permission::ALL {
            assert_eq!(Permission::from_name(p.name()), Some(p));
        }
        assert_eq!(Permission::from_name("write"), None);
    }
}
