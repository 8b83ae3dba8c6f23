//! Topics ([`Admin::list_topics`], create, delete, stats) and one stored
//! message with its state per subscription ([`Admin::message`]).

use ricochet_proto::{
    CreateTopicRequest, DeleteTopicRequest, GetMessageRequest, ListTopicsRequest, TopicRequest,
};

use super::{Admin, MessageInfo, TopicInfo, TopicList, TopicStats, or_empty};
use crate::error::Result;
use crate::message::MessageId;

impl Admin {
    /// The topics of namespace `tenant/namespace` (`None`: every topic),
    /// with the partitioned topics among them; system topics (a
    /// namespace's `__failure_events`) only with `include_system_topics`.
    pub async fn list_topics(
        &self,
        namespace: Option<&str>,
        include_system_topics: bool,
    ) -> Result<TopicList> {
        let req = ListTopicsRequest {
            namespace: or_empty(namespace),
            include_system_topics,
            local_only: false,
        };
        self.on_service(req, |t, r| async move { Self::rpc(t).list_topics(r).await })
            .await
    }

    /// Creates `topic` (`orders` means `persistent://public/default/orders`);
    /// [`TopicInfo::created`] is false when it existed already.
    pub async fn create_topic(&self, topic: &str) -> Result<TopicInfo> {
        self.create_replicated_topic(topic, 0).await
    }

    /// Creates `topic` with replication factor `replicas` (0: the default,
    /// its namespace's if it has one, else the cluster's `default_replicas`,
    /// 1 unless configured). Above 1 it needs a cluster of at least that many live brokers:
    /// a standalone broker, or too few brokers, answer
    /// [`ErrorKind::FailedPrecondition`](crate::ErrorKind).
    pub async fn create_replicated_topic(&self, topic: &str, replicas: u32) -> Result<TopicInfo> {
        let req = CreateTopicRequest {
            topic: topic.to_owned(),
            replicas,
        };
        self.on_topic(topic, req, |t, r| async move {
            Self::rpc(t).create_topic(r).await
        })
        .await
    }

    /// Deletes `topic` and its messages. A topic with subscriptions is
    /// refused ([`ErrorKind::FailedPrecondition`](crate::ErrorKind)) unless
    /// `force`, which disconnects its clients and deletes every
    /// subscription with its retry and dead-letter tiers.
    pub async fn delete_topic(&self, topic: &str, force: bool) -> Result<()> {
        let req = DeleteTopicRequest {
            topic: topic.to_owned(),
            force,
        };
        self.on_topic(topic, req, |t, r| async move {
            Self::rpc(t).delete_topic(r).await
        })
        .await
        .map(drop)
    }

    /// The counters of `topic` and of each of its subscriptions (for a
    /// partitioned topic: totals, and each partition's own).
    pub async fn topic_stats(&self, topic: &str) -> Result<TopicStats> {
        let req = TopicRequest {
            topic: topic.to_owned(),
        };
        self.on_topic(topic, req, |t, r| async move {
            Self::rpc(t).topic_stats(r).await
        })
        .await
    }

    /// The stored message `id`, and for each subscription of its topic its
    /// state there, delivery count, failed attempts and edits.
    pub async fn message(&self, id: &MessageId) -> Result<MessageInfo> {
        let req = GetMessageRequest {
            id: Some(ricochet_proto::MessageId {
                topic: id.topic().to_owned(),
                entry_id: id.entry_id(),
            }),
        };
        self.on_topic(id.topic(), req, |t, r| async move {
            Self::rpc(t).get_message(r).await
        })
        .await
    }
}
