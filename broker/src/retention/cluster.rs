//! Namespaces' retention policies shared by a cluster. In cluster mode a
//! namespace's policy is stored in etcd beside the cluster's keys
//! (`namespaces/<tenant>/<namespace>/retention`, the policy as JSON), as
//! Pulsar keeps namespace policies in its metadata store: `namespaces
//! set-retention` sent to any broker writes it there first, and every
//! broker reads the namespaces' policies every [`SYNC_EVERY`] and takes
//! them in force (storing them in its own store too, so a restart without
//! etcd keeps the last ones it saw). Reads (`GetRetention` on a namespace)
//! are answered from etcd.
//!
//! etcd is the truth once the key `retention-in-etcd` exists: a policy a
//! broker holds for a namespace that etcd has none for is dropped there.
//! The first broker of a cluster that reads the policies creates that key,
//! in one transaction with the namespace policies it held but etcd did not
//! (a cluster upgraded from brokers that kept them per broker keeps that
//! broker's; another broker's differing ones give way, each with a WARN).
//! A topic's own policy is not shared this way: it lives with the topic
//! (its owner, or its replicated topic's group).

use super::Retention;
use crate::error::{BrokerError, Result};
use crate::storage::RetentionRecord;
use ricochet_cluster::Cluster;
use ricochet_cluster::etcd::Created;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// How often a broker reads the namespaces' policies from etcd.
pub const SYNC_EVERY: Duration = Duration::from_secs(1);

const SUFFIX: &str = "/retention";

fn key(cluster: &Cluster, namespace: &str) -> String {
    cluster.key(&format!("namespaces/{namespace}{SUFFIX}"))
}

fn marker(cluster: &Cluster) -> String {
    cluster.key("retention-in-etcd")
}

fn encode(record: &RetentionRecord) -> Result<String> {
    serde_json::to_string(record)
        .map_err(|e| BrokerError::Etcd(format!("encoding a retention policy: {e}")))
}

/// Writes `namespace`'s policy to etcd, or with `None` removes it.
pub(super) async fn publish(
    cluster: &Cluster,
    namespace: &str,
    record: Option<&RetentionRecord>,
) -> Result<()> {
    let key = key(cluster, namespace);
    match record {
        Some(r) => {
            cluster.etcd().put(&key, &encode(r)?, 0).await?;
        }
        None => {
            cluster.etcd().delete(&key).await?;
        }
    }
    Ok(())
}

/// `namespace`'s policy in etcd, if any.
pub(super) async fn get(cluster: &Cluster, namespace: &str) -> Result<Option<RetentionRecord>> {
    let Some(kv) = cluster.etcd().get(&key(cluster, namespace)).await? else {
        return Ok(None);
    };
    decode(namespace, &kv.value).map(Some)
}

fn decode(namespace: &str, value: &str) -> Result<RetentionRecord> {
    let r: RetentionRecord = serde_json::from_str(value).map_err(|e| {
        BrokerError::Etcd(format!(
            "bad retention policy recorded for namespace {namespace}: {e}"
        ))
    })?;
    if r.target != namespace {
        return Err(BrokerError::Etcd(format!(
            "the retention policy recorded for namespace {namespace} names {}",
            r.target
        )));
    }
    Ok(r)
}

/// Every namespace's policy in etcd, by namespace. A record that does not
/// decode is skipped with a WARN (the others still apply).
async fn read_all(cluster: &Cluster) -> Result<BTreeMap<String, RetentionRecord>> {
    let prefix = cluster.key("namespaces/");
    let mut out = BTreeMap::new();
    for kv in cluster.etcd().get_prefix(&prefix).await? {
        let Some(namespace) = kv
            .key
            .strip_prefix(&prefix)
            .and_then(|k| k.strip_suffix(SUFFIX))
        else {
            continue;
        };
        match decode(namespace, &kv.value) {
            Ok(r) => {
                out.insert(namespace.to_owned(), r);
            }
            Err(e) => tracing::warn!(error = %e, "a namespace retention policy in etcd is skipped"),
        }
    }
    Ok(out)
}

/// The first read: makes etcd the truth, publishing the namespace
/// policies this broker holds that etcd lacks if it is the first broker
/// to read (see the module).
async fn first_read(
    cluster: &Cluster,
    held: Vec<RetentionRecord>,
) -> Result<BTreeMap<String, RetentionRecord>> {
    let mut shared = read_all(cluster).await?;
    let mut also = Vec::new();
    for r in held {
        if !shared.contains_key(&r.target) {
            also.push((key(cluster, &r.target), encode(&r)?));
            shared.insert(r.target.clone(), r);
        }
    }
    match cluster
        .etcd()
        .create_if_absent_with(&marker(cluster), "1", 0, &also)
        .await?
    {
        Created::Created(_) => {
            if !also.is_empty() {
                tracing::info!(
                    count = also.len(),
                    "namespace retention policies this broker held are now the cluster's (in etcd)"
                );
            }
            Ok(shared)
        }
        Created::Exists(_) => read_all(cluster).await,
    }
}

/// Reads the namespaces' policies every [`SYNC_EVERY`] and takes them in
/// force on `retention`'s broker, until it shuts down. A failed read is
/// logged (once until one succeeds) and the policies in force are kept.
pub(super) fn spawn_sync(retention: Retention, cluster: Arc<Cluster>) {
    let stop = retention.core.shutdown.clone();
    // Until the first reading succeeds, it is the one that may publish.
    let first = Arc::new(std::sync::atomic::AtomicBool::new(true));
    crate::util::spawn_every(
        SYNC_EVERY,
        stop,
        "cannot take the cluster's namespace retention policies: the ones in force here are kept",
        move || {
            let (retention, cluster, first) = (retention.clone(), cluster.clone(), first.clone());
            async move {
                let _taking = retention.namespaces.lock().await;
                let shared = if first.load(Ordering::Acquire) {
                    first_read(&cluster, retention.namespace_policies()).await?
                } else {
                    read_all(&cluster).await?
                };
                retention.take_namespaces(shared).await?;
                first.store(false, Ordering::Release);
                Ok(())
            }
        },
    );
}
