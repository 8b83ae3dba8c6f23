//! Namespace policies a cluster keeps in etcd, whatever their kind
//! (retention, offload): one key per namespace and kind beside the
//! cluster's keys (`namespaces/<tenant>/<namespace>/<kind>`, the policy as
//! JSON), as Pulsar keeps namespace policies in its metadata store. A
//! change is written there first ([`publish`]); every broker reads the
//! kind's policies every [`SYNC_EVERY`] and takes them in force
//! ([`spawn_sync`]); reads of a namespace's policy are answered from etcd
//! ([`get`]).
//!
//! etcd is the truth once the kind's marker key exists: a policy a broker
//! holds for a namespace that etcd has none for is dropped there. The
//! first broker of a cluster that reads the kind creates the marker, in
//! one transaction with the namespace policies it held but etcd did not
//! (a cluster upgraded from brokers that kept them per broker keeps that
//! broker's; another broker's differing ones give way).

use crate::error::{BrokerError, Result};
use ricochet_cluster::Cluster;
use ricochet_cluster::etcd::Created;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often a broker reads a kind's namespace policies from etcd.
pub const SYNC_EVERY: Duration = Duration::from_secs(1);

/// A kind of namespace policy kept in etcd.
pub(crate) trait Kind: Send + Sync + 'static {
    /// The policy as stored (JSON in etcd).
    type Record: Serialize + DeserializeOwned + Clone + PartialEq + Send + Sync + 'static;
    /// The key's last segment, with its slash (`/retention`).
    const SUFFIX: &'static str;
    /// The key that makes etcd the truth for this kind.
    const MARKER: &'static str;
    /// What the policy is called in messages (`retention policy`).
    const WHAT: &'static str;
    /// The WARN of a failed read (the policies in force are kept).
    const FAILED: &'static str;

    /// Whether a record decoded from `namespace`'s key fits it.
    fn check(_namespace: &str, _record: &Self::Record) -> std::result::Result<(), String> {
        Ok(())
    }
}

fn key<K: Kind>(cluster: &Cluster, namespace: &str) -> String {
    cluster.key(&format!("namespaces/{namespace}{}", K::SUFFIX))
}

fn encode<K: Kind>(record: &K::Record) -> Result<String> {
    serde_json::to_string(record)
        .map_err(|e| BrokerError::Etcd(format!("encoding a {}: {e}", K::WHAT)))
}

fn decode<K: Kind>(namespace: &str, value: &str) -> Result<K::Record> {
    let bad = |e: String| {
        BrokerError::Etcd(format!(
            "bad {} recorded for namespace {namespace}: {e}",
            K::WHAT
        ))
    };
    let r: K::Record = serde_json::from_str(value).map_err(|e| bad(e.to_string()))?;
    K::check(namespace, &r).map_err(bad)?;
    Ok(r)
}

/// Writes `namespace`'s policy of kind `K` to etcd, or with `None`
/// removes it.
pub(crate) async fn publish<K: Kind>(
    cluster: &Cluster,
    namespace: &str,
    record: Option<&K::Record>,
) -> Result<()> {
    let key = key::<K>(cluster, namespace);
    match record {
        Some(r) => {
            cluster.etcd().put(&key, &encode::<K>(r)?, 0).await?;
        }
        None => {
            cluster.etcd().delete(&key).await?;
        }
    }
    Ok(())
}

/// `namespace`'s policy of kind `K` in etcd, if any.
pub(crate) async fn get<K: Kind>(cluster: &Cluster, namespace: &str) -> Result<Option<K::Record>> {
    let Some(kv) = cluster.etcd().get(&key::<K>(cluster, namespace)).await? else {
        return Ok(None);
    };
    decode::<K>(namespace, &kv.value).map(Some)
}

/// Every namespace's policy of kind `K` in etcd, by namespace. A record
/// that does not decode is skipped with a WARN (the others still apply).
async fn read_all<K: Kind>(cluster: &Cluster) -> Result<BTreeMap<String, K::Record>> {
    let prefix = cluster.key("namespaces/");
    let mut out = BTreeMap::new();
    for kv in cluster.etcd().get_prefix(&prefix).await? {
        let Some(namespace) = kv
            .key
            .strip_prefix(&prefix)
            .and_then(|k| k.strip_suffix(K::SUFFIX))
        else {
            continue;
        };
        match decode::<K>(namespace, &kv.value) {
            Ok(r) => {
                out.insert(namespace.to_owned(), r);
            }
            Err(e) => tracing::warn!(error = %e, "a namespace policy in etcd is skipped"),
        }
    }
    Ok(out)
}

/// The first read: makes etcd the truth, publishing the namespace
/// policies this broker `held` that etcd lacks if it is the first broker
/// to read (see the module).
async fn first_read<K: Kind>(
    cluster: &Cluster,
    held: BTreeMap<String, K::Record>,
) -> Result<BTreeMap<String, K::Record>> {
    let mut shared = read_all::<K>(cluster).await?;
    let mut also = Vec::new();
    for (ns, r) in held {
        if let Entry::Vacant(e) = shared.entry(ns) {
            also.push((key::<K>(cluster, e.key()), encode::<K>(&r)?));
            e.insert(r);
        }
    }
    match cluster
        .etcd()
        .create_if_absent_with(&cluster.key(K::MARKER), "1", 0, &also)
        .await?
    {
        Created::Created(_) => {
            if !also.is_empty() {
                tracing::info!(
                    count = also.len(),
                    kind = K::WHAT,
                    "namespace policies this broker held are now the cluster's (in etcd)"
                );
            }
            Ok(shared)
        }
        Created::Exists(_) => read_all::<K>(cluster).await,
    }
}

/// Reads the namespaces' policies of kind `K` every [`SYNC_EVERY`] and
/// gives them to `take`, until `stop`. `held` lists the namespace
/// policies in force here (published on the cluster's first read, see the
/// module); `lock` is held from before the read until `take` is done, so
/// that a change made here under it is never undone by an older read. A
/// failed read or take is logged (once until one succeeds).
pub(crate) fn spawn_sync<K, H, T, F>(
    cluster: Arc<Cluster>,
    stop: CancellationToken,
    lock: Arc<tokio::sync::Mutex<()>>,
    held: H,
    take: T,
) where
    K: Kind,
    H: Fn() -> BTreeMap<String, K::Record> + Send + Sync + 'static,
    T: Fn(BTreeMap<String, K::Record>) -> F + Send + Sync + 'static,
    F: Future<Output = Result<()>> + Send,
{
    // Until the first reading succeeds, it is the one that may publish.
    let first = Arc::new(AtomicBool::new(true));
    let (held, take) = (Arc::new(held), Arc::new(take));
    crate::util::spawn_every(SYNC_EVERY, stop, K::FAILED, move || {
        let (cluster, first, lock) = (cluster.clone(), first.clone(), lock.clone());
        let (held, take) = (held.clone(), take.clone());
        async move {
            let _taking = lock.lock().await;
            let shared = if first.load(Ordering::Acquire) {
                first_read::<K>(&cluster, held()).await?
            } else {
                read_all::<K>(&cluster).await?
            };
            take(shared).await?;
            first.store(false, Ordering::Release);
            Ok(())
        }
    });
}
