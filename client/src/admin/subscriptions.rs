//! Subscriptions of a topic: [`Admin::list_subscriptions`], their
//! progress ([`Admin::subscription_stats`]) and deletion.

use ricochet_proto::{DeleteSubscriptionRequest, SubscriptionRequest, TopicRequest};

use super::{Admin, SubscriptionStats};
use crate::error::Result;

impl Admin {
    /// The names of `topic`'s subscriptions.
    pub async fn list_subscriptions(&self, topic: &str) -> Result<Vec<String>> {
        let req = TopicRequest {
            topic: topic.to_owned(),
        };
        self.on_topic(topic, req, |t, r| async move {
            Self::rpc(t).list_subscriptions(r).await
        })
        .await
        .map(|r| r.subscriptions)
    }

    /// The progress of `subscription` on `topic`: backlog, unacked and
    /// in-flight messages, scheduled retries by due time, dead letters,
    /// consumers.
    pub async fn subscription_stats(
        &self,
        topic: &str,
        subscription: &str,
    ) -> Result<SubscriptionStats> {
        let req = SubscriptionRequest {
            topic: topic.to_owned(),
            subscription: subscription.to_owned(),
        };
        self.on_topic(topic, req, |t, r| async move {
            Self::rpc(t).subscription_stats(r).await
        })
        .await
    }

    /// Deletes `subscription` of `topic`. One with connected consumers,
    /// dead letters or scheduled retries is refused
    /// ([`ErrorKind::FailedPrecondition`](crate::ErrorKind)) unless
    /// `force`, which disconnects the consumers and drops its tiers.
    pub async fn delete_subscription(
        &self,
        topic: &str,
        subscription: &str,
        force: bool,
    ) -> Result<()> {
        let req = DeleteSubscriptionRequest {
            topic: topic.to_owned(),
            subscription: subscription.to_owned(),
            force,
        };
        self.on_topic(topic, req, |t, r| async move {
            Self::rpc(t).delete_subscription(r).await
        })
        .await
        .map(drop)
    }
}
