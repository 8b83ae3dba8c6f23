//! The typed admin API, [`Admin`] (from [`Client::admin`]): topics,
//! subscriptions, policies, messages, dead letters and replay jobs,
//! retention, partitioned topics, grants, and the cluster's brokers. Each
//! concern is a file here adding methods to [`Admin`]; this one owns the
//! handle, the re-exported answer types and the two ways a call is sent:
//! to the topic's owner (`on_topic`: the client's routing, then once more
//! at the owner a redirect names, should the topic have moved between the
//! look-up and the call) or to the service URL's broker (`on_service`).
//!
//! No tonic type is part of this API: arguments are plain (`&str` names,
//! option structs where many are optional), answers are the protocol's
//! messages re-exported under their names here (a wrapper would add
//! nothing) or plain values, and every failure is the client's
//! [`Error`](crate::Error) with its [`ErrorKind`](crate::ErrorKind).
//! Admin calls have no deadline of their own (a replay or a drain may take
//! long): wrap one in `tokio::time::timeout` to bound it.

mod breaker;
mod cluster;
mod dead_letters;
mod grants;
mod namespaces;
mod partitions;
mod policies;
mod replay_jobs;
mod retention;
mod subscriptions;
mod topics;

use std::future::Future;

use ricochet_proto::admin_client::AdminClient;

use crate::client::Client;
use crate::credentials::Transport;
use crate::error::{Error, ErrorKind, Result};

pub use dead_letters::ReplayOptions;
pub use retention::RetentionTarget;

/// The answer types of the admin API: the protocol's messages, re-exported
/// under the names the admin API uses.
pub use ricochet_proto::{
    Attempt, BreakerStatus, BrokerInfo, ConsumerStats, DeadLetter, DeadLetterEdit,
    DeadLetterFilter, DeadLetterGroup, DeadLetterGroupBy, DeadLetterPolicyConfig,
    DrainResponse as DrainReport, DueBucket, GetMessageResponse as MessageInfo, Grant,
    GroupDeadLettersResponse as DeadLetterGroups, ListBrokersResponse as Brokers,
    ListDeadLettersResponse as DeadLetterPage, ListTopicsResponse as TopicList,
    Message as StoredMessage, MessageId as StoredMessageId, NamespaceReplication,
    PartitionedTopicMetadata as PartitionedTopic, PolicyResponse as PolicyInForce,
    PurgeDeadLettersResponse as PurgeOutcome, ReplayDeadLettersResponse as ReplayOutcome,
    ReplayEdit, ReplayJob, ReplayMode, RetentionPolicy, RetentionResponse as RetentionInfo,
    SubscriptionMessageState, SubscriptionStatsResponse as SubscriptionStats, TopicInfo,
    TopicMoved, TopicNotMoved, TopicStatsResponse as TopicStats, WhoAmIResponse as WhoAmI,
};

/// The admin API is reached from a [`Client`].
impl Client {
    /// The admin API (topics, subscriptions, policies, dead letters,
    /// replay jobs, retention, partitions, grants, the cluster's brokers)
    /// through this client: see [`Admin`].
    pub fn admin(&self) -> Admin {
        Admin::new(self.clone())
    }
}

/// The admin API of a broker (or of a cluster, through any of its brokers),
/// on the connection of the [`Client`] it came from, with its credentials.
/// Cheap to clone.
///
/// A call about one topic goes to the broker that owns it, looked up as
/// producers and consumers do; other calls go to the client's broker.
///
/// ```no_run
/// # async fn run() -> ricochet_client::Result<()> {
/// use ricochet_client::{Client, ErrorKind};
/// use ricochet_client::admin::DeadLetterFilter;
///
/// let client = Client::connect("http://127.0.0.1:6650").await?;
/// let admin = client.admin();
/// admin.create_topic("orders").await?;
/// let stats = admin.subscription_stats("orders", "billing").await;
/// match stats {
///     Ok(s) => println!("backlog {}, dead letters {}", s.backlog, s.dead_lettered),
///     Err(e) if e.kind() == ErrorKind::NotFound => println!("no such subscription"),
///     Err(e) => return Err(e),
/// }
/// let page = admin
///     .list_dead_letters("orders", "billing", &DeadLetterFilter::default(), 10, None)
///     .await?;
/// println!("{} dead letters", page.total);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Admin {
    client: Client,
}

/// What a generated client's call answers.
type Answer<T> = std::result::Result<tonic::Response<T>, tonic::Status>;

impl Admin {
    pub(crate) fn new(client: Client) -> Self {
        Self { client }
    }

    /// The client this admin API calls through.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The generated admin client on `transport`, with the client's frame
    /// size limits.
    fn rpc(transport: Transport) -> AdminClient<Transport> {
        Client::admin_on(transport)
    }

    /// Sends `req` with `call` to the broker that owns `topic` (the
    /// client's own on a standalone broker, and for a partitioned topic's
    /// base name, which a broker answers over its partitions). Should the
    /// owner have changed between the look-up and the call, the refusal
    /// names the new owner: the call is made once more there.
    async fn on_topic<R, T, F, Fut>(&self, topic: &str, req: R, call: F) -> Result<T>
    where
        R: Clone,
        F: Fn(Transport, R) -> Fut,
        Fut: Future<Output = Answer<T>>,
    {
        let transport = self.client.transport_for(topic).await?;
        match answer(call(transport, req.clone()).await) {
            Err(e) if e.kind() == ErrorKind::Redirect => {
                // A client that took its broker for standalone asks again
                // from now on.
                self.client.stream_failed(&e);
                let Some(url) = e.redirect().and_then(|r| r.url.clone()) else {
                    return Err(e);
                };
                tracing::debug!(topic, %url, "admin call redirected to the topic's new owner");
                answer(call(self.client.transport_to(&url)?, req).await)
            }
            r => r,
        }
    }

    /// Sends `req` with `call` to the client's own broker.
    async fn on_service<R, T, F, Fut>(&self, req: R, call: F) -> Result<T>
    where
        F: FnOnce(Transport, R) -> Fut,
        Fut: Future<Output = Answer<T>>,
    {
        answer(call(self.client.transport(), req).await)
    }
}

/// A generated client's answer as the client's result: the message, or the
/// [`Error`] its status stands for.
fn answer<T>(r: Answer<T>) -> Result<T> {
    r.map(tonic::Response::into_inner)
        .map_err(Error::from_status)
}

/// An optional name as the protocol sends it: empty means none.
fn or_empty(s: Option<&str>) -> String {
    s.unwrap_or_default().to_owned()
}
