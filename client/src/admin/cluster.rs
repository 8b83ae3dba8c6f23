//! A cluster's brokers: which one owns a topic ([`Admin::lookup`]), the
//! brokers and what each owns ([`Admin::brokers`]), and moving topics
//! between them: every topic off a broker ([`Admin::drain_broker`], `ricochet
//! cluster drain`) or one topic ([`Admin::move_topic`]). Both moves are
//! superuser calls sent to the broker the topics leave; they return once
//! every topic has moved (or failed to).

use ricochet_proto::cluster_client::ClusterClient;
use ricochet_proto::{DrainRequest, MoveTopicRequest};

use super::{Admin, Brokers, DrainReport, TopicMoved, answer};
use crate::client::TopicOwner;
use crate::error::{Error, ErrorKind, Result};

impl Admin {
    /// Which broker owns `topic`; see [`Client::lookup`](crate::Client::lookup).
    pub async fn lookup(&self, topic: &str) -> Result<TopicOwner> {
        self.client.lookup(topic).await
    }

    /// The brokers of the cluster, with the topics each owns when
    /// `with_topics` (a standalone broker answers with an empty cluster
    /// name and no broker).
    pub async fn brokers(&self, with_topics: bool) -> Result<Brokers> {
        self.client.list_brokers(with_topics).await
    }

    /// Drains broker `broker_id`: it takes no new topics, and every topic
    /// placed on it moves with its data to the other live brokers. The
    /// answer lists what moved where and what stayed (and why).
    pub async fn drain_broker(&self, broker_id: &str) -> Result<DrainReport> {
        let brokers = self.brokers(false).await?;
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
        let mut cluster = ClusterClient::new(self.client.transport_to(&b.url)?);
        answer(
            cluster
                .drain(DrainRequest {
                    broker_id: broker_id.to_owned(),
                })
                .await,
        )
    }

    /// Moves `topic` (one partition, or an ordinary topic) with its data to
    /// broker `to`, or with `None` to the live broker with the fewest
    /// topics.
    pub async fn move_topic(&self, topic: &str, to: Option<&str>) -> Result<TopicMoved> {
        let req = MoveTopicRequest {
            topic: topic.to_owned(),
            to_broker: to.unwrap_or_default().to_owned(),
        };
        self.on_topic(topic, req, |t, r| async move {
            ClusterClient::new(t).move_topic(r).await
        })
        .await?
        .moved
        .ok_or_else(|| Error::new(ErrorKind::Internal, "MoveTopic answered without the move"))
    }
}
