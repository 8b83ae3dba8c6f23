//! Namespaces' default replication factors, in etcd beside the cluster's
//! keys (`namespaces/<tenant>/<namespace>/replicas`, the factor in
//! decimal, persistent), so every broker sees the one
//! `namespaces set-replication` set. A namespace without one takes the
//! cluster's `default_replicas`.

use crate::error::{BrokerError, Result};
use ricochet_cluster::Cluster;

fn key(cluster: &Cluster, namespace: &str) -> String {
    cluster.key(&format!("namespaces/{namespace}/replicas"))
}

/// The default factor `namespace` (`tenant/namespace`) was given, if any.
pub async fn get(cluster: &Cluster, namespace: &str) -> Result<Option<u32>> {
    let Some(kv) = cluster.etcd().get(&key(cluster, namespace)).await? else {
        return Ok(None);
    };
    kv.value.parse().map(Some).map_err(|_| {
        BrokerError::Etcd(format!(
            "bad replication factor {:?} recorded for namespace {namespace}",
            kv.value
        ))
    })
}

/// Records `replicas` (checked by the caller) as `namespace`'s default.
pub async fn set(cluster: &Cluster, namespace: &str, replicas: u32) -> Result<()> {
    cluster
        .etcd()
        .put(&key(cluster, namespace), &replicas.to_string(), 0)
        .await?;
    Ok(())
}

/// The factor a topic of `namespace` created without one gets, with
/// `cluster_default` the broker's `[cluster] default_replicas`.
pub async fn default_factor(
    cluster: &Cluster,
    namespace: &str,
    cluster_default: u32,
) -> Result<u32> {
    let own = get(cluster, namespace).await?;
    Ok(super::factor::default_for(own, cluster_default))
}
