//! Permissions, grants and the checks on them. Grants are kept in storage
//! and mirrored in memory; a check is a hash lookup, made once per RPC or
//! once per stream.

use super::{AUDIT, AuthConfig, Principal, Verifier};
use crate::error::BrokerError;
use crate::name::TopicName;
use crate::storage::{GrantRecord, Storage};
use ricochet_cluster::Cluster;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock, RwLock};

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
    /// Held across one grant change (storage write, flush, table), and
    /// while the cluster's grants are taken.
    changes: tokio::sync::Mutex<()>,
    /// Set once the broker joined a cluster: grants are then the
    /// cluster's ([`super::shared`]).
    cluster: OnceLock<Arc<Cluster>>,
    /// The etcd revision of the cluster's grants last taken here.
    taken: std::sync::atomic::AtomicI64,
    /// The broker will join a cluster: until it has, grants cannot change.
    clustered: std::sync::atomic::AtomicBool,
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
            cluster: OnceLock::new(),
            taken: std::sync::atomic::AtomicI64::new(0),
            clustered: std::sync::atomic::AtomicBool::new(false),
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
        let apply = |before: u8| match (add, mask) {
            (true, m) => before | m,
            (false, 0) => 0,
            (false, m) => before & !m,
        };
        // One change at a time: the storage write and the table follow each other.
        let _serial = self.changes.lock().await;
        let after = match self.cluster.get() {
            Some(c) => {
                // The cluster's list first: a failure there changes nothing.
                let (shared, after) =
                    super::shared::change(c, self.grants(), role, resource.as_str(), apply).await?;
                self.take_locked(shared, flusher).await?;
                after
            }
            None if self.clustered.load(Ordering::Acquire) => {
                return Err(BrokerError::Etcd(
                    "this broker has not joined its cluster yet, whose grants it keeps: try again"
                        .into(),
                ));
            }
            None => {
                let after = apply(self.bits(role, &[resource.as_str()]));
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
                let mut table = self.table.write().unwrap_or_else(|e| e.into_inner());
                let held = table.entry(role.to_owned()).or_default();
                if after == 0 {
                    held.remove(resource.as_str());
                } else {
                    held.insert(resource.as_str().to_owned(), after);
                }
                after
            }
        };
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

    /// The broker runs in cluster mode: grant changes are refused until it
    /// joined ([`Self::join`]), since the cluster's grants would replace
    /// one stored here alone.
    pub(crate) fn expect_cluster(&self) {
        self.clustered.store(true, Ordering::Release);
    }

    /// In cluster mode: grants are the cluster's from now on (changed in
    /// etcd, read from it every [`super::shared::SYNC_EVERY`]).
    pub(crate) fn join(
        self: &Arc<Self>,
        cluster: Arc<Cluster>,
        flusher: crate::flusher::Flusher,
        stop: tokio_util::sync::CancellationToken,
    ) {
        if self.cluster.set(cluster.clone()).is_ok() {
            super::shared::spawn_sync(self.clone(), cluster, flusher, stop);
        }
    }

    /// Takes the cluster's grants in force here unless they are older
    /// than those taken last (a read from before a change made here).
    pub(super) async fn take_shared(
        &self,
        shared: super::shared::Shared,
        flusher: &crate::flusher::Flusher,
    ) -> Result<(), BrokerError> {
        let _serial = self.changes.lock().await;
        self.take_locked(shared, flusher).await
    }

    /// [`Self::take_shared`] with the change lock held: the store follows
    /// the list (durably), then the table is replaced whole.
    async fn take_locked(
        &self,
        shared: super::shared::Shared,
        flusher: &crate::flusher::Flusher,
    ) -> Result<(), BrokerError> {
        if shared.revision <= self.taken.load(Ordering::Acquire) {
            return Ok(());
        }
        let stored = self.storage.grants()?;
        let mut changed = 0usize;
        for g in &stored {
            let keep = shared
                .grants
                .iter()
                .any(|w| w.role == g.role && w.resource == g.resource);
            if !keep {
                self.storage.delete_grant(&g.role, &g.resource)?;
                changed += 1;
            }
        }
        for g in &shared.grants {
            if !stored.contains(g) {
                self.storage.put_grant(g)?;
                changed += 1;
            }
        }
        if changed > 0 {
            flusher.durable().await?;
        }
        let mut table = Table::new();
        for g in &shared.grants {
            table
                .entry(g.role.clone())
                .or_default()
                .insert(g.resource.clone(), g.permissions.bits());
        }
        *self.table.write().unwrap_or_else(|e| e.into_inner()) = table;
        self.taken.store(shared.revision, Ordering::Release);
        if changed > 0 {
            tracing::info!(target: AUDIT, changed, revision = shared.revision, "grants taken from the cluster");
        }
        Ok(())
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
