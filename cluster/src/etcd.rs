//! A typed wrapper over the etcd v3 API subset in [`crate::proto`]:
//! reads of one key or a prefix, the "create if absent" transaction every
//! claim and placement goes through, puts under a lease, deletes, and the
//! lease calls (grant, keepalive, revoke). Every call has a deadline; an
//! etcd that does not answer, or answers with an error, becomes
//! [`ClusterError::Etcd`] (UNAVAILABLE to a client). Keys and values are
//! strings here: Ricochet stores UTF-8 names and JSON.

use crate::error::{ClusterError, Result};
use crate::proto::{
    Compare, DeleteRangeRequest, LeaseGrantRequest, LeaseKeepAliveRequest, LeaseKeepAliveResponse,
    LeaseRevokeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest, TxnResponse, compare,
    kv_client, lease_client, request_op, response_op,
};
use std::future::Future;
use std::time::Duration;
use tokio::sync::mpsc;
use tonic::transport::{Channel, Endpoint};

/// One stored key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kv {
    /// The key.
    pub key: String,
    /// Its value (lossily decoded as UTF-8).
    pub value: String,
    /// The revision of the key's creation (the fencing epoch of an owner key).
    pub create_revision: i64,
    /// The revision of its last change.
    pub mod_revision: i64,
    /// The lease it is attached to (0: none).
    pub lease: i64,
}

impl From<crate::proto::KeyValue> for Kv {
    fn from(kv: crate::proto::KeyValue) -> Self {
        Self {
            key: String::from_utf8_lossy(&kv.key).into_owned(),
            value: String::from_utf8_lossy(&kv.value).into_owned(),
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
            lease: kv.lease,
        }
    }
}

/// What [`Etcd::create_if_absent`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Created {
    /// The key was created at this revision.
    Created(i64),
    /// The key already existed (as it is now).
    Exists(Kv),
}

/// A connection to an etcd cluster (one or more client URLs, balanced).
#[derive(Debug, Clone)]
pub struct Etcd {
    kv: kv_client::KvClient<Channel>,
    lease: lease_client::LeaseClient<Channel>,
    timeout: Duration,
}

/// The end of a key range covering every key that starts with `prefix`.
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

impl Etcd {
    /// A client of the etcd cluster at `endpoints` (`http://host:port`);
    /// connects lazily, so this fails only on a malformed URL. Each call
    /// gives up after `timeout`.
    pub fn connect(endpoints: &[String], timeout: Duration) -> Result<Self> {
        if endpoints.is_empty() {
            return Err(ClusterError::Config(
                "cluster mode needs an etcd URL".into(),
            ));
        }
        let mut list = Vec::with_capacity(endpoints.len());
        for url in endpoints {
            let e = Endpoint::from_shared(url.clone())
                .map_err(|e| ClusterError::Config(format!("etcd URL {url:?}: {e}")))?
                .connect_timeout(timeout)
                .tcp_nodelay(true);
            list.push(e);
        }
        let channel = if list.len() == 1 {
            list.remove(0).connect_lazy()
        } else {
            Channel::balance_list(list.into_iter())
        };
        Ok(Self {
            kv: kv_client::KvClient::new(channel.clone()),
            lease: lease_client::LeaseClient::new(channel),
            timeout,
        })
    }

    async fn call<T>(
        &self,
        what: &str,
        f: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T> {
        match tokio::time::timeout(self.timeout, f).await {
            Ok(Ok(r)) => Ok(r.into_inner()),
            Ok(Err(s)) => Err(ClusterError::Etcd(format!("{what}: {}", s.message()))),
            Err(_) => Err(ClusterError::Etcd(format!(
                "{what}: no answer within {:?}",
                self.timeout
            ))),
        }
    }

    /// The value of `key`, if present.
    pub async fn get(&self, key: &str) -> Result<Option<Kv>> {
        let r = self
            .call(
                "range",
                self.kv.clone().range(RangeRequest {
                    key: key.as_bytes().to_vec(),
                    ..Default::default()
                }),
            )
            .await?;
        Ok(r.kvs.into_iter().next().map(Kv::from))
    }

    /// Every key starting with `prefix`, in key order.
    pub async fn get_prefix(&self, prefix: &str) -> Result<Vec<Kv>> {
        let r = self
            .call(
                "range",
                self.kv.clone().range(RangeRequest {
                    key: prefix.as_bytes().to_vec(),
                    range_end: prefix_end(prefix),
                    ..Default::default()
                }),
            )
            .await?;
        Ok(r.kvs.into_iter().map(Kv::from).collect())
    }

    /// Runs one transaction: `success` if `compare` holds, else `failure`.
    async fn txn(
        &self,
        compare: Compare,
        success: Vec<RequestOp>,
        failure: Vec<RequestOp>,
    ) -> Result<TxnResponse> {
        self.call(
            "txn",
            self.kv.clone().txn(TxnRequest {
                compare: vec![compare],
                success,
                failure,
            }),
        )
        .await
    }

    /// Creates `key` = `value` (under `lease`, 0 for none) unless it exists,
    /// in one transaction: either it is created (at the returned revision)
    /// or the existing key is returned untouched.
    pub async fn create_if_absent(&self, key: &str, value: &str, lease: i64) -> Result<Created> {
        self.create_if_absent_with(key, value, lease, &[]).await
    }

    /// [`Etcd::create_if_absent`], also putting `also` (key, value pairs,
    /// no lease) in the same transaction: all of them or none.
    pub async fn create_if_absent_with(
        &self,
        key: &str,
        value: &str,
        lease: i64,
        also: &[(String, String)],
    ) -> Result<Created> {
        let range = RequestOp {
            request: Some(request_op::Request::RequestRange(RangeRequest {
                key: key.as_bytes().to_vec(),
                ..Default::default()
            })),
        };
        let r = self
            .txn(
                equal(key, compare::TargetUnion::CreateRevision(0)),
                std::iter::once(put_op(key, value, lease))
                    .chain(also.iter().map(|(k, v)| put_op(k, v, 0)))
                    .collect(),
                vec![range],
            )
            .await?;
        if r.succeeded {
            return Ok(Created::Created(
                r.header.map(|h| h.revision).unwrap_or_default(),
            ));
        }
        let existing = r.responses.into_iter().find_map(|op| match op.response {
            Some(response_op::Response::ResponseRange(range)) => range.kvs.into_iter().next(),
            _ => None,
        });
        match existing {
            Some(kv) => Ok(Created::Exists(kv.into())),
            // Deleted between the compare and the read: try again.
            None => Box::pin(self.create_if_absent_with(key, value, lease, also)).await,
        }
    }

    /// Sets `key` = `value` only if the key was last changed at
    /// `mod_revision` (a compare-and-set); false when it changed meanwhile.
    pub async fn replace_if_unchanged(
        &self,
        key: &str,
        value: &str,
        mod_revision: i64,
        lease: i64,
    ) -> Result<bool> {
        let r = self
            .txn(
                equal(key, compare::TargetUnion::ModRevision(mod_revision)),
                vec![put_op(key, value, lease)],
                Vec::new(),
            )
            .await?;
        Ok(r.succeeded)
    }

    /// Sets `key` = `value` under `lease` (0: none); the revision written.
    pub async fn put(&self, key: &str, value: &str, lease: i64) -> Result<i64> {
        let r = self
            .call(
                "put",
                self.kv.clone().put(PutRequest {
                    key: key.as_bytes().to_vec(),
                    value: value.as_bytes().to_vec(),
                    lease,
                    prev_kv: false,
                }),
            )
            .await?;
        Ok(r.header.map(|h| h.revision).unwrap_or_default())
    }

    /// In one transaction, if `key` holds `expected`: sets it to `value`
    /// (no lease) and deletes `also_delete`. False when `key` holds
    /// something else (nothing changed).
    pub async fn swap_and_delete(
        &self,
        key: &str,
        expected: &str,
        value: &str,
        also_delete: &str,
    ) -> Result<bool> {
        let delete = RequestOp {
            request: Some(request_op::Request::RequestDeleteRange(
                DeleteRangeRequest {
                    key: also_delete.as_bytes().to_vec(),
                    ..Default::default()
                },
            )),
        };
        let r = self
            .txn(
                equal(
                    key,
                    compare::TargetUnion::Value(expected.as_bytes().to_vec()),
                ),
                vec![put_op(key, value, 0), delete],
                Vec::new(),
            )
            .await?;
        Ok(r.succeeded)
    }

    /// In one transaction, if `key` holds `expected`: deletes it and
    /// `also_delete`. False when `key` holds something else, or nothing
    /// (nothing changed).
    pub async fn delete_if_value(
        &self,
        key: &str,
        expected: &str,
        also_delete: &[String],
    ) -> Result<bool> {
        let delete = |k: &str| RequestOp {
            request: Some(request_op::Request::RequestDeleteRange(
                DeleteRangeRequest {
                    key: k.as_bytes().to_vec(),
                    ..Default::default()
                },
            )),
        };
        let r = self
            .txn(
                equal(
                    key,
                    compare::TargetUnion::Value(expected.as_bytes().to_vec()),
                ),
                std::iter::once(key)
                    .chain(also_delete.iter().map(String::as_str))
                    .map(delete)
                    .collect(),
                Vec::new(),
            )
            .await?;
        Ok(r.succeeded)
    }

    /// Deletes `key`; how many keys were deleted (0 or 1).
    pub async fn delete(&self, key: &str) -> Result<i64> {
        let r = self
            .call(
                "delete",
                self.kv.clone().delete_range(DeleteRangeRequest {
                    key: key.as_bytes().to_vec(),
                    ..Default::default()
                }),
            )
            .await?;
        Ok(r.deleted)
    }

    /// A new lease of `ttl` (whole seconds, at least one): its id and the
    /// TTL etcd granted.
    pub async fn grant(&self, ttl: Duration) -> Result<(i64, Duration)> {
        let secs = i64::try_from(ttl.as_secs().max(1)).unwrap_or(i64::MAX);
        let r = self
            .call(
                "lease grant",
                self.lease
                    .clone()
                    .lease_grant(LeaseGrantRequest { ttl: secs, id: 0 }),
            )
            .await?;
        if !r.error.is_empty() {
            return Err(ClusterError::Etcd(format!("lease grant: {}", r.error)));
        }
        Ok((r.id, Duration::from_secs(r.ttl.max(0) as u64)))
    }

    /// Revokes lease `id`, deleting every key attached to it; a lease that
    /// no longer exists is not an error.
    pub async fn revoke(&self, id: i64) -> Result<()> {
        match self
            .call(
                "lease revoke",
                self.lease.clone().lease_revoke(LeaseRevokeRequest { id }),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(ClusterError::Etcd(m)) if m.contains("not found") => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// A keepalive stream for lease `id` (opened on first renewal); each
    /// renewal gives up after `timeout`.
    pub fn keepalive(&self, id: i64, timeout: Duration) -> KeepAlive {
        KeepAlive {
            client: self.lease.clone(),
            id,
            timeout,
            open: None,
        }
    }
}

/// A lease's keepalive stream, opened on first use and again after it
/// breaks.
#[derive(Debug)]
pub struct KeepAlive {
    client: lease_client::LeaseClient<Channel>,
    id: i64,
    timeout: Duration,
    open: Option<(
        mpsc::Sender<LeaseKeepAliveRequest>,
        tonic::Streaming<LeaseKeepAliveResponse>,
    )>,
}

impl KeepAlive {
    /// Renews the lease once: the TTL left after renewal, 0 when the lease
    /// has expired (etcd no longer knows it).
    pub async fn renew(&mut self) -> Result<i64> {
        let result = tokio::time::timeout(self.timeout, self.renew_inner()).await;
        match result {
            Ok(Ok(ttl)) => Ok(ttl),
            Ok(Err(e)) => {
                self.open = None;
                Err(e)
            }
            Err(_) => {
                self.open = None;
                Err(ClusterError::Etcd(format!(
                    "lease keepalive: no answer within {:?}",
                    self.timeout
                )))
            }
        }
    }

    async fn renew_inner(&mut self) -> Result<i64> {
        let request = LeaseKeepAliveRequest { id: self.id };
        let etcd_err =
            |s: tonic::Status| ClusterError::Etcd(format!("lease keepalive: {}", s.message()));
        if self.open.is_none() {
            // etcd answers the call's headers with its first response, so the
            // first request goes in before the call is awaited.
            let (tx, rx) = mpsc::channel(4);
            let _ = tx.send(request).await;
            let stream = self
                .client
                .lease_keep_alive(tokio_stream::wrappers::ReceiverStream::new(rx))
                .await
                .map_err(etcd_err)?
                .into_inner();
            self.open = Some((tx, stream));
        } else if let Some((tx, _)) = &self.open {
            tx.send(request)
                .await
                .map_err(|_| ClusterError::Etcd("lease keepalive: stream closed".into()))?;
        }
        let Some((_, stream)) = &mut self.open else {
            return Err(ClusterError::Etcd("lease keepalive: stream closed".into()));
        };
        match stream.message().await.map_err(etcd_err)? {
            Some(r) => Ok(r.ttl),
            None => Err(ClusterError::Etcd("lease keepalive: stream ended".into())),
        }
    }
}

/// A compare that `key`'s create revision, mod revision or value (as
/// `what` says) equals the one given.
fn equal(key: &str, what: compare::TargetUnion) -> Compare {
    let target = match what {
        compare::TargetUnion::CreateRevision(_) => compare::CompareTarget::Create,
        compare::TargetUnion::ModRevision(_) => compare::CompareTarget::Mod,
        compare::TargetUnion::Value(_) => compare::CompareTarget::Value,
        compare::TargetUnion::Version(_) => compare::CompareTarget::Version,
        compare::TargetUnion::Lease(_) => compare::CompareTarget::Lease,
    };
    Compare {
        result: compare::CompareResult::Equal as i32,
        target: target as i32,
        key: key.as_bytes().to_vec(),
        target_union: Some(what),
        range_end: Vec::new(),
    }
}

/// A put of `key` = `value` under `lease` (0: none), as a transaction op.
fn put_op(key: &str, value: &str, lease: i64) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestPut(PutRequest {
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
            lease,
            prev_kv: false,
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_range_ends_past_every_key_with_the_prefix() {
        assert_eq!(prefix_end("/r/c/owners/"), b"/r/c/owners0".to_vec());
        assert_eq!(prefix_end("a\u{7f}"), b"a\x80".to_vec());
        assert_eq!(prefix_end(""), vec![0]);
    }
}
