//! What every hostile case checks afterwards: the broker's visible state
//! (topics, their entry ranges, subscriptions and their counts, policies)
//! is what it was before, and the broker still answers a health check and a
//! normal publish.

use super::common::*;
use ricochet_proto::admin_client::AdminClient;
use ricochet_proto::*;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// The topic [`assert_serving`] publishes to; cases must not expect it
/// absent or unchanged.
pub const CANARY: &str = "persistent://public/default/canary";

/// One subscription as the admin API shows it.
#[derive(Debug, PartialEq)]
pub struct SubState {
    pub name: String,
    pub backlog: u64,
    pub unacked: u64,
    pub scheduled_retries: u64,
    pub dead_lettered: u64,
    pub retry_topic: String,
    pub dead_letter_topic: String,
    pub policy_source: String,
}

/// One topic as the admin API shows it.
#[derive(Debug, PartialEq)]
pub struct TopicState {
    pub name: String,
    pub first_entry_id: u64,
    pub next_entry_id: u64,
    pub subscriptions: Vec<SubState>,
}

/// Everything a client can see of the broker's state.
#[derive(Debug, PartialEq)]
pub struct Snapshot(pub Vec<TopicState>);

impl Snapshot {
    /// The topic names.
    pub fn topics(&self) -> Vec<&str> {
        self.0.iter().map(|t| t.name.as_str()).collect()
    }
}

/// The broker's visible state now.
pub async fn snapshot(channel: &Channel) -> Snapshot {
    let mut admin = AdminClient::new(channel.clone());
    let names = admin
        .list_topics(ListTopicsRequest::default())
        .await
        .expect("list topics")
        .into_inner()
        .topics;
    let mut topics = Vec::new();
    for name in names {
        let stats = admin
            .topic_stats(TopicRequest {
                topic: name.clone(),
            })
            .await
            .expect("topic stats")
            .into_inner();
        let mut subscriptions = Vec::new();
        for s in stats.subscriptions {
            let policy = admin
                .get_policy(SubscriptionRequest {
                    topic: name.clone(),
                    subscription: s.subscription.clone(),
                })
                .await
                .expect("policy")
                .into_inner();
            subscriptions.push(SubState {
                name: s.subscription,
                backlog: s.backlog,
                unacked: s.unacked,
                scheduled_retries: s.scheduled_retries,
                dead_lettered: s.dead_lettered,
                retry_topic: s.retry_topic,
                dead_letter_topic: s.dead_letter_topic,
                policy_source: policy.source,
            });
        }
        topics.push(TopicState {
            name,
            first_entry_id: stats.first_entry_id,
            next_entry_id: stats.next_entry_id,
            subscriptions,
        });
    }
    Snapshot(topics)
}

/// The broker answers a health check with SERVING and stores a normal
/// publish (on [`CANARY`]).
pub async fn assert_serving(url: &str) {
    let ch = channel(url).await;
    let health = HealthClient::new(ch)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("health check answered")
        .into_inner();
    assert_eq!(health.status, ServingStatus::Serving as i32);
    let mut p = RawProducer::open(url, CANARY, "")
        .await
        .expect("canary producer");
    let ids = p.send(&["still here"]).await;
    assert_eq!(ids.len(), 1);
}

/// Runs `case`, then checks the state is what it was before and the broker
/// still serves. `what` names the case in failure messages.
pub async fn unchanged<F: std::future::Future<Output = ()>>(url: &str, what: &str, case: F) {
    let ch = channel(url).await;
    let before = snapshot(&ch).await;
    case.await;
    let after = snapshot(&ch).await;
    assert_eq!(before, after, "{what}: the state changed");
    assert_serving(url).await;
}
