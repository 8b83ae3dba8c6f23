//! Moving topics between the brokers of a cluster: [`Client::drain_broker`]
//! (`ricochet cluster drain`) and [`Client::move_topic`]. Both are
//! superuser calls sent to the broker the topics leave; they return once
//! every topic has moved (or failed to), so they have no request timeout.

use ricochet_proto::cluster_client::ClusterClient;
use ricochet_proto::{DrainRequest, DrainResponse, MoveTopicRequest, TopicMoved};

use crate::client::Client;
use crate::error::{Error, ErrorKind, Result};

impl Client {
    /// Drains broker `broker_id`: it takes no new topics, and every topic
    /// placed on it moves to the other live brokers with its data. The
    /// answer lists what moved where and what stayed (and why).
    pub async fn drain_broker(&self, broker_id: &str) -> Result<DrainResponse> {
        let brokers = self.list_brokers(false).await?;
        let Some(b) = brokers.brokers.iter().find(|b| b.id == broker_id) else {
            return Err(Error::invalid_argument(format!(
                "no broker {broker_id} in cluster {}",
                brokers.cluster
            )));
        };
        if !b.live || b.url.is_empty() {
            return Err(Error::owner_is_down(
                broker_id,
                format!("broker {broker_id} is not live: nothing can be moved off it"),
            ));
        }
        let mut cluster = ClusterClient::new(self.transport_to(&b.url)?);
        Ok(cluster
            .drain(DrainRequest {
                broker_id: broker_id.to_owned(),
            })
            .await
            .map_err(Error::from_status)?
            .into_inner())
    }

    /// Moves `topic` (one partition, or an ordinary topic) with its data to
    /// broker `to`, or with `None` to the live broker with the fewest topics.
    pub async fn move_topic(&self, topic: &str, to: Option<&str>) -> Result<TopicMoved> {
        let mut cluster = ClusterClient::new(self.transport_for(topic).await?);
        cluster
            .move_topic(MoveTopicRequest {
                topic: topic.to_owned(),
                to_broker: to.unwrap_or_default().to_owned(),
            })
            .await
            .map_err(Error::from_status)?
            .into_inner()
            .moved
            .ok_or_else(|| Error::new(ErrorKind::Internal, "MoveTopic answered without the move"))
    }
}
