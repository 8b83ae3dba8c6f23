//! Namespaces' retention policies shared by a cluster. In cluster mode a
//! namespace's policy is stored in etcd beside the cluster's keys
//! (`namespaces/<tenant>/<namespace>/retention`, the policy as JSON), as
//! Pulsar keeps namespace policies in its metadata store: `namespaces
//! set-retention` sent to any broker writes it there first, and every
//! broker reads the namespaces' policies every [`ns_shared::SYNC_EVERY`] and takes
//! them in force (storing them in its own store too, so a restart without
//! etcd keeps the last ones it saw). Reads (`GetRetention` on a namespace)
//! are answered from etcd. The etcd side is shared with the namespaces'
//! offload policies ([`crate::ns_shared`]).
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
use crate::error::Result;
use crate::ns_shared::{self, Kind};
use crate::storage::RetentionRecord;
use ricochet_cluster::Cluster;
use std::sync::Arc;

/// Namespaces' retention policies in etcd.
pub(super) struct RetentionKind;

impl Kind for RetentionKind {
    type Record = RetentionRecord;
    const SUFFIX: &'static str = "/retention";
    const MARKER: &'static str = "retention-in-etcd";
    const WHAT: &'static str = "retention policy";
    const FAILED: &'static str =
        "cannot take the cluster's namespace retention policies: the ones in force here are kept";

    fn check(namespace: &str, r: &RetentionRecord) -> std::result::Result<(), String> {
        if r.target == namespace {
            Ok(())
        } else {
            Err(format!("it names {}", r.target))
        }
    }
}

/// Writes `namespace`'s policy to etcd, or with `None` removes it.
pub(super) async fn publish(
    cluster: &Cluster,
    namespace: &str,
    record: Option<&RetentionRecord>,
) -> Result<()> {
    ns_shared::publish::<RetentionKind>(cluster, namespace, record).await
}

/// `namespace`'s policy in etcd, if any.
pub(super) async fn get(cluster: &Cluster, namespace: &str) -> Result<Option<RetentionRecord>> {
    ns_shared::get::<RetentionKind>(cluster, namespace).await
}

/// Reads the namespaces' policies every [`ns_shared::SYNC_EVERY`] and takes them in
/// force on `retention`'s broker, until it shuts down. A failed read is
/// logged (once until one succeeds) and the policies in force are kept.
pub(super) fn spawn_sync(retention: Retention, cluster: Arc<Cluster>) {
    let stop = retention.core.shutdown.clone();
    let lock = retention.namespaces.clone();
    let held = retention.clone();
    ns_shared::spawn_sync::<RetentionKind, _, _, _>(
        cluster,
        stop,
        lock,
        move || {
            held.namespace_policies()
                .into_iter()
                .map(|r| (r.target.clone(), r))
                .collect()
        },
        move |shared| {
            let retention = retention.clone();
            async move { retention.take_namespaces(shared).await }
        },
    );
}
