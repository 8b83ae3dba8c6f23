//! Looking up a topic's partition count (the broker's `Partitions`
//! service), for producers and consumers of partitioned topics. The names
//! and the key routing are `ricochet_proto::partitions`, shared with the
//! broker.

use crate::client::Client;
use crate::error::{Error, Result};
use crate::reconnect::open_with_retry;
use ricochet_proto::PartitionsRequest;
use ricochet_proto::partitions_client::PartitionsClient;

/// One look-up: the topic's fully qualified base name and partition count
/// when it is partitioned, `None` when it is not (or the broker predates
/// partitioned topics).
pub(crate) async fn count_once(client: &Client, topic: &str) -> Result<Option<(String, u32)>> {
    // Any broker of a cluster knows the count.
    client
        .on_any_broker(|transport, service| async move {
            let mut partitions = PartitionsClient::new(transport);
            let call = partitions.get_partitions(PartitionsRequest {
                topic: topic.to_owned(),
            });
            let r = match tokio::time::timeout(client.config().request_timeout, call).await {
                Err(_) => return Err(Error::timeout("partition look-up")),
                // A broker before partitioned topics: none is partitioned.
                // Another broker than the service URL's: skip it.
                Ok(Err(s)) if s.code() == tonic::Code::Unimplemented => {
                    return if service {
                        Ok(None)
                    } else {
                        Err(crate::client::not_a_cluster_broker())
                    };
                }
                Ok(r) => r.map_err(Error::from_status)?.into_inner(),
            };
            Ok((r.partitions > 0).then_some((r.topic, r.partitions)))
        })
        .await
}

/// [`count_once`], retrying transient failures until the client's request
/// timeout, as opening a stream does. A look-up refused for want of any
/// permission on the topic answers "not partitioned": the stream then opened
/// on the name is refused by the broker naming the permission it needs
/// (produce, consume), not the look-up's.
pub(crate) async fn count(client: &Client, topic: &str) -> Result<Option<(String, u32)>> {
    // The first call of every producer and consumer: a plaintext client of
    // a TLS broker is told so here, instead of retrying a protocol error.
    let found = open_with_retry(client.config(), "partition look-up", topic, || async {
        match count_once(client, topic).await {
            Err(e) => Err(crate::tls_probe::explain(client.url(), e).await),
            found => found,
        }
    })
    .await;
    match found {
        Ok((r, _)) => Ok(r),
        Err(e) if e.kind() == crate::ErrorKind::PermissionDenied => Ok(None),
        Err(e) => Err(e),
    }
}
