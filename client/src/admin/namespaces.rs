//! A namespace's default replication factor:
//! [`Admin::set_namespace_replication`], [`Admin::namespace_replication`].

use ricochet_proto::{GetNamespaceReplicationRequest, SetNamespaceReplicationRequest};

use super::{Admin, NamespaceReplication};
use crate::error::Result;

impl Admin {
    /// Makes `replicas` (1 to 7) the replication factor of every topic
    /// created in `namespace` (`tenant/namespace`) without one, auto-created
    /// ones included. Stored in the cluster's etcd, so every broker applies
    /// it; topics that exist keep their factor. Above 1 on a standalone
    /// broker, or above the number of live brokers, is
    /// [`ErrorKind::FailedPrecondition`](crate::ErrorKind); 0 is
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind).
    pub async fn set_namespace_replication(
        &self,
        namespace: &str,
        replicas: u32,
    ) -> Result<NamespaceReplication> {
        let req = SetNamespaceReplicationRequest {
            namespace: namespace.to_owned(),
            replicas,
        };
        self.on_service(req, |t, r| async move {
            Self::rpc(t).set_namespace_replication(r).await
        })
        .await
    }

    /// `namespace`'s own default factor (0: none) and the one a topic
    /// created in it without a factor gets.
    pub async fn namespace_replication(&self, namespace: &str) -> Result<NamespaceReplication> {
        let req = GetNamespaceReplicationRequest {
            namespace: namespace.to_owned(),
        };
        self.on_service(req, |t, r| async move {
            Self::rpc(t).get_namespace_replication(r).await
        })
        .await
    }
}
