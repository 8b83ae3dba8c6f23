//! Retention policies (how much of a topic's log the broker keeps whether
//! or not its subscriptions consumed it), set on a namespace or a topic
//! ([`RetentionTarget`]): [`Admin::set_retention`],
//! [`Admin::retention`], [`Admin::remove_retention`].

use ricochet_proto::retention_client::RetentionClient;
use ricochet_proto::{GetRetentionRequest, SetRetentionRequest};

use super::{Admin, RetentionInfo, RetentionPolicy};
use crate::credentials::Transport;
use crate::error::Result;

/// What a retention policy is set on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RetentionTarget {
    /// A namespace, `tenant/namespace`: the policy of each of its topics
    /// that has none of its own.
    Namespace(String),
    /// A topic (asked of its owner): its own policy replaces its
    /// namespace's.
    Topic(String),
}

impl RetentionTarget {
    /// The request's `namespace` and `topic` fields (exactly one set).
    fn fields(&self) -> (String, String) {
        match self {
            RetentionTarget::Namespace(n) => (n.clone(), String::new()),
            RetentionTarget::Topic(t) => (String::new(), t.clone()),
        }
    }
}

impl Admin {
    /// Sets `target`'s retention policy, durably. A policy with no limit
    /// set removes it (see [`remove_retention`](Self::remove_retention)).
    /// Answers the policy set and, for a topic, the one in force.
    pub async fn set_retention(
        &self,
        target: &RetentionTarget,
        policy: RetentionPolicy,
    ) -> Result<RetentionInfo> {
        let (namespace, topic) = target.fields();
        let req = SetRetentionRequest {
            namespace,
            topic,
            policy: Some(policy),
        };
        let call = |t: Transport, r: SetRetentionRequest| async move {
            RetentionClient::new(t).set_retention(r).await
        };
        match target {
            RetentionTarget::Topic(topic) => self.on_topic(topic, req, call).await,
            RetentionTarget::Namespace(_) => self.on_service(req, call).await,
        }
    }

    /// Removes `target`'s own policy: a topic follows its namespace again,
    /// a namespace keeps every message until consumed.
    pub async fn remove_retention(&self, target: &RetentionTarget) -> Result<RetentionInfo> {
        self.set_retention(target, RetentionPolicy::default()).await
    }

    /// The policy set on `target` and, for a topic, the one in force and
    /// where it comes from.
    pub async fn retention(&self, target: &RetentionTarget) -> Result<RetentionInfo> {
        let (namespace, topic) = target.fields();
        let req = GetRetentionRequest { namespace, topic };
        let call = |t: Transport, r: GetRetentionRequest| async move {
            RetentionClient::new(t).get_retention(r).await
        };
        match target {
            RetentionTarget::Topic(topic) => self.on_topic(topic, req, call).await,
            RetentionTarget::Namespace(_) => self.on_service(req, call).await,
        }
    }
}
