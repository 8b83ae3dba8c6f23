//! Namespaces' offload policies in a cluster are the cluster's, kept in
//! etcd (`namespaces/<tenant>/<namespace>/offload`, the policy as JSON) as
//! namespaces' retention policies are ([`crate::ns_shared`]): a namespace's
//! `SetOffloadPolicy` sent to any broker writes etcd first, then its own
//! store; every broker reads them every [`crate::ns_shared::SYNC_EVERY`]
//! and takes them in force (stored in its tier's records too, so a restart
//! without etcd keeps the last ones it saw); `GetOffloadPolicy` on a
//! namespace answers etcd's. A broker back from downtime drops a namespace
//! policy the cluster no longer has once the key `offload-in-etcd` exists;
//! the first broker to read creates it with the namespace policies it held
//! (an upgrade keeps them). So a replicated topic's leader, whichever
//! broker it is, stamps the same namespace policy into its group's
//! records. A topic's own policy is not shared this way (its owner's, or
//! its group's command). Standalone, a namespace's policy is the broker's.

use crate::error::{BrokerError, Result};
use crate::flusher::Flusher;
use crate::ns_shared::{self, Kind};
use crate::storage::tiered::Tiered;
use crate::storage::tiered::policy::OffloadPolicy;
use ricochet_cluster::Cluster;
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Namespaces' offload policies in etcd.
struct OffloadKind;

impl Kind for OffloadKind {
    type Record = OffloadPolicy;
    const SUFFIX: &'static str = "/offload";
    const MARKER: &'static str = "offload-in-etcd";
    const WHAT: &'static str = "offload policy";
    const FAILED: &'static str =
        "cannot take the cluster's namespace offload policies: the ones in force here are kept";
}

/// The namespaces' offload policies of a broker's tier, shared by its
/// cluster when it has one.
#[derive(Debug, Clone)]
pub struct NamespaceOffload {
    tiered: Arc<Tiered>,
    flusher: Flusher,
    cluster: Option<Arc<Cluster>>,
    /// Held while a namespace's policy is changed here and while the
    /// cluster's are read and taken: a read from before a set is never
    /// taken after it.
    lock: Arc<tokio::sync::Mutex<()>>,
}

impl NamespaceOffload {
    /// The namespaces' policies of `tiered`; with a `cluster`, the
    /// cluster's, taken in force here every second until `stop`.
    pub fn start(
        tiered: Arc<Tiered>,
        flusher: Flusher,
        cluster: Option<Arc<Cluster>>,
        stop: CancellationToken,
    ) -> Self {
        let this = Self {
            tiered,
            flusher,
            cluster,
            lock: Arc::default(),
        };
        if let Some(c) = &this.cluster {
            let (held, taker) = (this.clone(), this.clone());
            ns_shared::spawn_sync::<OffloadKind, _, _, _>(
                c.clone(),
                stop,
                this.lock.clone(),
                move || held.tiered.policies().namespaces(),
                move |shared| {
                    let taker = taker.clone();
                    async move { taker.take(shared).await }
                },
            );
        }
        this
    }

    /// Sets (or, when empty, removes) `namespace`'s policy: in a cluster
    /// in etcd first (a failure there changes nothing), then here,
    /// durably before returning.
    pub async fn set(&self, namespace: &str, policy: OffloadPolicy) -> Result<()> {
        let _changing = self.lock.lock().await;
        if let Some(c) = &self.cluster {
            let record = (!policy.is_empty()).then_some(&policy);
            ns_shared::publish::<OffloadKind>(c, namespace, record).await?;
        }
        self.tiered
            .set_policy(namespace, policy)
            .map_err(BrokerError::from)?;
        self.flusher.durable().await
    }

    /// `namespace`'s own policy: in a cluster, the cluster's (in etcd).
    pub async fn get(&self, namespace: &str) -> Result<Option<OffloadPolicy>> {
        match &self.cluster {
            Some(c) => ns_shared::get::<OffloadKind>(c, namespace).await,
            None => Ok(self.tiered.policies().get(namespace)),
        }
    }

    /// Takes `shared` (the cluster's namespace policies) in force here,
    /// stored durably: changed and new ones put, ones it lacks removed.
    /// Nothing is written when nothing differs.
    async fn take(&self, mut shared: BTreeMap<String, OffloadPolicy>) -> Result<()> {
        // An empty policy is none (never published so; written by hand).
        shared.retain(|_, p| !p.is_empty());
        let held = self.tiered.policies().namespaces();
        if held == shared {
            return Ok(());
        }
        for (ns, p) in &shared {
            if held.get(ns) != Some(p) {
                self.tiered
                    .set_policy(ns, p.clone())
                    .map_err(BrokerError::from)?;
                tracing::info!(namespace = %ns, policy = ?p, "namespace offload policy taken from the cluster");
            }
        }
        for ns in held.keys().filter(|ns| !shared.contains_key(*ns)) {
            self.tiered
                .set_policy(ns, OffloadPolicy::default())
                .map_err(BrokerError::from)?;
            tracing::info!(namespace = %ns, "namespace offload policy removed: the cluster has none");
        }
        self.flusher.durable().await
    }
}
