//! Namespaces' default replication factors, in etcd beside the cluster's
//! keys (`namespaces/<tenant>/<namespace>/replicas`, the factor in
//! decimal, persistent), so every broker sees the one
//! `namespaces set-replication` set. A namespace without one takes the
//! cluster's `default_replicas`.
//!
//! Also each partitioned topic's factor (`partitioned-replicas/<topic>`,
//! written with its partition count, in one transaction, when above 1):
//! every partition is formed as its own group of that factor when the
//! topic is created or its count raised (`service::partitions`), or at
//! first use if that did not finish. A partitioned topic without one (its
//! factor was 1, or it was created before factors) keeps factor 1.

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

fn partitioned_key(cluster: &Cluster, base: &str) -> String {
    cluster.key(&format!("partitioned-replicas/{base}"))
}

/// The factor partitioned topic `base` (stored name) was created with,
/// if above 1.
pub async fn partitioned_factor(cluster: &Cluster, base: &str) -> Result<Option<u32>> {
    let Some(kv) = cluster.etcd().get(&partitioned_key(cluster, base)).await? else {
        return Ok(None);
    };
    kv.value.parse().map(Some).map_err(|_| {
        BrokerError::Etcd(format!(
            "bad replication factor {:?} recorded for partitioned topic {base}",
            kv.value
        ))
    })
}

/// The key of partitioned topic `base`'s factor, removed with its count
/// when it is deleted (`Cluster::delete_partitioned`).
pub fn partitioned_factor_key(cluster: &Cluster, base: &str) -> String {
    partitioned_key(cluster, base)
}

/// The record to write with partitioned topic `base`'s count (in the same
/// etcd transaction, see `Cluster::create_partitioned`) when its
/// partitions get factor `replicas` (checked by the caller): none at 1.
pub fn partitioned_factor_record(
    cluster: &Cluster,
    base: &str,
    replicas: u32,
) -> Option<(String, String)> {
    (replicas > 1).then(|| (partitioned_key(cluster, base), replicas.to_string()))
}
