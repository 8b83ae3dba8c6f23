//! Permissions, grants and the checks on them. Grants are kept in storage
//! and mirrored in memory; a check is a hash lookup, made once per RPC or
//! once per stream.

use super::{AUDIT, AuthConfig, Principal, Verifier};
use crate::error::BrokerError;
use crate::name::TopicName;
use crate::storage::{GrantRecord, Storage};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, RwLock};

pub use crate::storage::Permission;
use crate::storage::Permissions;

/// Parses a permission name, refusing one this version does not know.
pub fn parse_permission(name: &str) -> Result<Permission, BrokerError> {
    Permission::from_name(name).ok_or_else(|| {
        BrokerError::InvalidArgument(format!(
            "unknown permission {}: use produce, consume, dead-letters, policy or admin",
            crate::util::echo(name)
        ))
    })
}

fn names(bits: u8) -> Vec<String> {
    Permissions::from_bits(bits).names()
}

/// What a grant applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Resource {
    /// Every topic of `tenant/namespace`.
    Namespace(String),
    /// One topic.
    Topic(TopicName),
}

impl Resource {
    /// Parses `tenant/namespace` or a topic name with its `persistent://`.
    pub(crate) fn parse(s: &str) -> Result<Self, BrokerError> {
        if s.contains("://") {
            Ok(Resource::Topic(TopicName::parse(s)?))
        } else {
            Ok(Resource::Namespace(
                crate::name::parse_namespace(s)?.to_owned(),
            ))
        }
    }

    pub(crate) fn as_str(&self) -> &str {
        match self {
            Resource::Namespace(ns) => ns,
            Resource::Topic(t) => t.as_str(),
        }
    }

    pub(crate) fn namespace(&self) -> &str {
        match self {
            Resource::Namespace(ns) => ns,
            Resource::Topic(t) => t.namespace(),
        }
    }
}

/// `role -> resource -> permission bits`.
type Table = HashMap<String, HashMap<String, u8>>;

/// The broker's authentication and authorization state.
#[derive(Debug)]
pub struct Auth {
    enabled: bool,
    verifier: Option<Verifier>,
    superusers: HashSet<String>,
    table: RwLock<Table>,
    storage: Arc<dyn Storage>,
    metrics_token: Option<Vec<u8>>,
    /// A verified client certificate's CN is a role.
    role_from_cert: bool,
    /// Held across one grant change (storage write, flush, table).
    changes: tokio::sync::Mutex<()>,
}

impl Auth {
    /// Reads the key files `config` names and the stored grants.
    pub fn open(
        config: &AuthConfig,
        tls: &crate::tls::TlsConfig,
        storage: Arc<dyn Storage>,
    ) -> Result<Self, BrokerError> {
        let verifier = if config.enabled {
            Some(Verifier::from_config(config)?)
        } else {
            None
        };
        let metrics_token = super::metrics_token(config)?;
        let mut table = Table::new();
        for g in storage.grants()? {
            // A stored name this version does not know grants nothing.
            let bits = g.permissions.bits();
            table.entry(g.role).or_default().insert(g.resource, bits);
        }
        Ok(Self {
            enabled: config.enabled,
            verifier,
            superusers: config.superusers.iter().cloned().collect(),
            table: RwLock::new(table),
            storage,
            metrics_token,
            changes: tokio::sync::Mutex::new(()),
            role_from_cert: tls.role_from_client_cert && tls.client_ca_file.is_some(),
        })
    }

    /// Whether a verified client certificate's CN proves a role.
    pub fn role_from_client_cert(&self) -> bool {
        self.role_from_cert
    }

    /// Whether calls need credentials and permissions.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// The bearer token `/metrics` requires, if any.
    pub fn metrics_token(&self) -> Option<&[u8]> {
        self.metrics_token.as_deref()
    }

    /// The role a bearer token proves.
    pub fn verify_token(&self, token: &str) -> Result<String, &'static str> {
        match &self.verifier {
            Some(v) => v.verify(token),
            None => Err("this broker does not accept tokens"),
        }
    }

    /// Whether `p` may do everything (every caller, with auth off).
    pub fn is_superuser(&self, p: Option<&Principal>) -> bool {
        !self.enabled || p.is_some_and(|p| self.superusers.contains(&p.role))
    }

    fn bits(&self, role: &str, resources: &[&str]) -> u8 {
        let table = self.table.read().unwrap_or_else(|e| e.into_inner());
        let Some(held) = table.get(role) else {
            return 0;
        };
        resources
            .iter()
            .filter_map(|r| held.get(*r))
            .fold(0, |a, b| a | b)
    }

    fn denied(p: Option<&Principal>, what: &str, on: &str) -> BrokerError {
        match p {
            Some(p) => BrokerError::PermissionDenied(format!(
                "role {:?} lacks the {what} permission on {on}",
                p.role
            )),
            None => BrokerError::PermissionDenied(format!("anonymous callers lack {what} on {on}")),
        }
    }

    /// What a grant may name to cover `topic`: its namespace, the topic,
    /// and for a partition (`<base>-partition-<i>`) its partitioned topic,
    /// as in Pulsar, where a grant on a partitioned topic covers its
    /// partitions.
    fn covering(topic: &TopicName) -> Vec<&str> {
        let mut on = vec![topic.namespace(), topic.as_str()];
        if let Some((base, _)) = ricochet_proto::partitions::parse_partition(topic.as_str()) {
            on.push(base);
        }
        on
    }

    /// Whether `p` holds `perm` on `topic` (through its namespace, the
    /// topic itself, or for a partition its partitioned topic).
    pub fn check(
        &self,
        p: Option<&Principal>,
        topic: &TopicName,
        perm: Permission,
    ) -> Result<(), BrokerError> {
        if self.is_superuser(p) {
            return Ok(());
        }
        let role = p.map(|p| p.role.as_str()).unwrap_or_default();
        if self.bits(role, &Self::covering(topic)) & perm.bit() != 0 {
            return Ok(());
        }
        Err(Self::denied(p, perm.name(), topic.as_str()))
    }

    /// Whether `p` holds `perm` on the namespace itself.
    pub fn check_namespace(
        &self,
        p: Option<&Principal>,
        ns: &str,
        perm: Permission,
    ) -> Result<(), BrokerError> {
        if self.is_superuser(p) {
            return Ok(());
        }
        let role = p.map(|p| p.role.as_str()).unwrap_or_default();
        if self.bits(role, &[ns]) & perm.bit() != 0 {
            return Ok(());
        }
        Err(Self::denied(p, perm.name(), ns))
    }

    /// Whether `p` holds any permission on `topic`: it may see the topic
    /// and its stats.
    pub fn check_visible(
        &self,
        p: Option<&Principal>,
        topic: &TopicName,
    ) -> Result<(), BrokerError> {
        if self.is_superuser(p) {
            return Ok(());
        }
        let role = p.map(|p| p.role.as_str()).unwrap_or_default();
        if self.bits(role, &Self::covering(topic)) != 0 {
            return Ok(());
        }
        Err(Self::not_visible(p, topic.as_str()))
    }

    /// The refusal of a call that needs some permission on `on` (to see it)
    /// to a caller holding none there.
    fn not_visible(p: Option<&Principal>, on: &str) -> BrokerError {
        let who = match p {
            Some(p) => format!("role {:?} holds", p.role),
            None => "anonymous callers hold".to_owned(),
        };
        BrokerError::PermissionDenied(format!(
            "{who} no permission on {on}; seeing it needs one of produce, consume, \
             dead-letters, policy or admin there"
        ))
    }

    /// Whether `p` holds any grant in namespace `ns` (on it or on one of
    /// its topics).
    pub fn check_namespace_visible(
        &self,
        p: Option<&Principal>,
        ns: &str,
    ) -> Result<(), BrokerError> {
        if self.is_superuser(p) {
            return Ok(());
        }
        let role = p.map(|p| p.role.as_str()).unwrap_or_default();
        let table = self.table.read().unwrap_or_else(|e| e.into_inner());
        let visible = table.get(role).is_some_and(|held| {
            held.iter().any(|(r, bits)| {
                *bits != 0 && Resource::parse(r).is_ok_and(|r| r.namespace() == ns)
            })
        });
        if visible {
            Ok(())
        } else {
            Err(Self::not_visible(p, ns))
        }
    }

    /// Adds (`add`) or removes permissions of `role` on `resource`, durably
    /// before returning; returns the permissions left. Removing none
    /// removes them all.
    pub(crate) async fn change(
        &self,
        by: Option<&Principal>,
        role: &str,
        resource: &Resource,
        perms: &[Permission],
        add: bool,
        flusher: &crate::flusher::Flusher,
    ) -> Result<Vec<String>, BrokerError> {
        let mask = perms.iter().fold(0u8, |a, p| a | p.bit());
        // One change at a time: the storage write and the table follow each other.
        let _serial = self.changes.lock().await;
        let before = self.bits(role, &[resource.as_str()]);
        let after = match (add, mask) {
            (true, m) => before | m,
            (false, 0) => 0,
            (false, m) => before & !m,
        };
        if after == 0 {
            self.storage.delete_grant(role, resource.as_str())?;
        } else {
            self.storage.put_grant(&GrantRecord {
                role: role.to_owned(),
                resource: resource.as_str().to_owned(),
                permissions: Permissions::from_bits(after),
            })?;
        }
        flusher.durable().await?;
        {
            let mut table = self.table.write().unwrap_or_else(|e| e.into_inner());
            let held = table.entry(role.to_owned()).or_default();
            if after == 0 {
                held.remove(resource.as_str());
            } else {
                held.insert(resource.as_str().to_owned(), after);
            }
        }
        tracing::info!(
            target: AUDIT,
            by = by.map_or("-", |p| p.role.as_str()),
            action = if add { "grant" } else { "revoke" },
            role,
            resource = resource.as_str(),
            permissions = ?names(mask),
            now_held = ?names(after),
            "permissions changed"
        );
        Ok(names(after))
    }

    /// Every grant, sorted by role and resource.
    pub fn grants(&self) -> Vec<GrantRecord> {
        let table = self.table.read().unwrap_or_else(|e| e.into_inner());
        let mut out: BTreeMap<(String, String), GrantRecord> = BTreeMap::new();
        for (role, held) in table.iter() {
            for (resource, bits) in held {
                if *bits != 0 {
                    out.insert(
                        (role.clone(), resource.clone()),
                        GrantRecord {
                            role: role.clone(),
                            resource: resource.clone(),
                            permissions: Permissions::from_bits(*bits),
                        },
                    );
                }
            }
        }
        out.into_values().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permission_names_round_trip_and_unknown_ones_are_refused() {
        for p in Permission::ALL {
            assert_eq!(parse_permission(p.name()).unwrap(), p);
        }
        assert!(parse_permission("write").is_err());
        assert_eq!(
            names(Permission::Admin.bit() | Permission::Produce.bit()),
            vec!["produce", "admin"]
        );
    }

    #[test]
    fn resources_are_namespaces_or_topics() {
        assert_eq!(
            Resource::parse("acme/orders").unwrap(),
            Resource::Namespace("acme/orders".into())
        );
        let t = Resource::parse("persistent://acme/orders/new").unwrap();
        assert_eq!(t.namespace(), "acme/orders");
        assert!(Resource::parse("acme").is_err());
        assert!(Resource::parse("http://x/y/z").is_err());
    }
}
