//! Grants shared by a cluster. In cluster mode every grant lives in one
//! etcd key beside the cluster's (`grants`: the list of grants as JSON),
//! as Pulsar keeps permissions in its metadata store: a grant or revoke
//! sent to any broker changes that list by compare-and-set (retried when
//! another broker changed it meanwhile) before the broker's own store, and
//! every broker reads the list every [`SYNC_EVERY`] and takes it in force
//! (its store and its in-memory table), so a revoke reaches every broker
//! within about a second. A broker that cannot reach etcd keeps the grants
//! it last took (and refuses grant changes), with a WARN.
//!
//! The first broker to find no list in etcd (a new cluster, or one upgraded
//! from brokers that kept grants each) creates it from the grants it holds;
//! another broker's differing grants give way to that list.

use super::grants::Auth;
use crate::error::{BrokerError, Result};
use crate::flusher::Flusher;
use crate::storage::{GrantRecord, Permissions};
use ricochet_cluster::Cluster;
use ricochet_cluster::etcd::Created;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often a broker reads the cluster's grants.
pub const SYNC_EVERY: Duration = Duration::from_secs(1);

/// Most compare-and-set attempts of one change.
const ATTEMPTS: usize = 32;

fn key(cluster: &Cluster) -> String {
    cluster.key("grants")
}

/// The cluster's grants and the etcd revision they were last changed at.
pub(super) struct Shared {
    pub(super) grants: Vec<GrantRecord>,
    pub(super) revision: i64,
}

fn encode(grants: &[GrantRecord]) -> Result<String> {
    serde_json::to_string(grants).map_err(|e| BrokerError::Etcd(format!("encoding grants: {e}")))
}

/// The cluster's grants, if the list exists.
async fn read(cluster: &Cluster) -> Result<Option<Shared>> {
    let Some(kv) = cluster.etcd().get(&key(cluster)).await? else {
        return Ok(None);
    };
    let grants = serde_json::from_str(&kv.value)
        .map_err(|e| BrokerError::Etcd(format!("the cluster's grants do not decode: {e}")))?;
    Ok(Some(Shared {
        grants,
        revision: kv.mod_revision,
    }))
}

/// Creates the list from `held` unless it exists; the list as it is then.
async fn read_or_create(cluster: &Cluster, held: Vec<GrantRecord>) -> Result<Shared> {
    if let Some(s) = read(cluster).await? {
        return Ok(s);
    }
    match cluster
        .etcd()
        .create_if_absent(&key(cluster), &encode(&held)?, 0)
        .await?
    {
        Created::Created(revision) => {
            if !held.is_empty() {
                tracing::info!(
                    count = held.len(),
                    "the grants this broker held are now the cluster's (in etcd)"
                );
            }
            Ok(Shared {
                grants: held,
                revision,
            })
        }
        Created::Exists(_) => read(cluster)
            .await?
            .ok_or_else(|| BrokerError::Etcd("the cluster's grants vanished while read".into())),
    }
}

/// Sets `role`'s permissions on `resource` in the cluster's list to
/// `change(bits before)` by compare-and-set; the list afterwards and the
/// bits set. `held` seeds the list when there is none yet.
pub(super) async fn change(
    cluster: &Cluster,
    held: Vec<GrantRecord>,
    role: &str,
    resource: &str,
    change: impl Fn(u8) -> u8,
) -> Result<(Shared, u8)> {
    let mut seed = Some(held);
    for _ in 0..ATTEMPTS {
        let current = match seed.take() {
            Some(held) => read_or_create(cluster, held).await?,
            None => read(cluster).await?.ok_or_else(|| {
                BrokerError::Etcd("the cluster's grants vanished while changed".into())
            })?,
        };
        let mut grants = current.grants;
        let before = grants
            .iter()
            .find(|g| g.role == role && g.resource == resource)
            .map_or(0, |g| g.permissions.bits());
        let after = change(before);
        grants.retain(|g| !(g.role == role && g.resource == resource));
        if after != 0 {
            grants.push(GrantRecord {
                role: role.to_owned(),
                resource: resource.to_owned(),
                permissions: Permissions::from_bits(after),
            });
            grants.sort_by(|a, b| (&a.role, &a.resource).cmp(&(&b.role, &b.resource)));
        }
        let set = cluster
            .etcd()
            .replace_if_unchanged(&key(cluster), &encode(&grants)?, current.revision, 0)
            .await?;
        if set {
            let revision = read(cluster).await?.map_or(0, |s| s.revision);
            return Ok((Shared { grants, revision }, after));
        }
    }
    Err(BrokerError::Etcd(format!(
        "the cluster's grants changed under {ATTEMPTS} attempts in a row; try again"
    )))
}

/// Reads the cluster's grants every [`SYNC_EVERY`] and has `auth` take
/// them in force when they changed, until `stop`.
pub(super) fn spawn_sync(
    auth: Arc<Auth>,
    cluster: Arc<Cluster>,
    flusher: Flusher,
    stop: CancellationToken,
) {
    crate::util::spawn_every(
        SYNC_EVERY,
        stop,
        "cannot take the cluster's grants: the ones in force here are kept",
        move || {
            let (auth, cluster, flusher) = (auth.clone(), cluster.clone(), flusher.clone());
            async move {
                let shared = read_or_create(&cluster, auth.grants()).await?;
                auth.take_shared(shared, &flusher).await
            }
        },
    );
}
