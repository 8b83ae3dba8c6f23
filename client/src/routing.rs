//! Topic routing: which broker a producer's or consumer's stream (and a
//! topic-scoped admin call) goes to.
//!
//! A client is given one *service URL*. Before opening a stream on a topic
//! (each partition of a partitioned topic is a topic) it asks that broker's
//! `Cluster.Lookup` for the topic's owner and opens the stream on the
//! owner's URL, through a pool of channels keyed by URL that share the
//! client's credentials, TLS settings and timeouts ([`Routes`]). A broker
//! that answers `cluster == ""` (a standalone broker) or `UNIMPLEMENTED` (one
//! older than clusters) serves every topic itself: the answer is kept, so a
//! standalone client makes one lookup in its life and then opens streams on
//! its one connection exactly as before (an atomic load per open, nothing
//! per message).
//!
//! When a stream fails, [`reroute`] reads the status: the not-owner
//! redirect (`FAILED_PRECONDITION` with the `ricochet-owner` and
//! `ricochet-owner-url` trailers) or `UNAVAILABLE` (an owner that is down or
//! fenced) mean "look the topic up again"; the driver's reconnect then goes
//! through [`Client::route`] again, which in a cluster always asks. A topic
//! whose owner is down gives [`Error::OwnerDown`] with the broker's id.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use ricochet_proto::admin_client::AdminClient;
use ricochet_proto::cluster_client::ClusterClient;
use ricochet_proto::{ListBrokersRequest, ListBrokersResponse, LookupRequest, LookupResponse};
use tonic::transport::Channel;

use crate::client::Client;
use crate::credentials::Transport;
use crate::error::{Error, Result};

/// Trailer of the not-owner redirect (and of an `UNAVAILABLE` naming a
/// down owner): the owner's broker id.
pub const OWNER_TRAILER: &str = "ricochet-owner";
/// Trailer of the not-owner redirect: the owner's advertised URL (absent
/// when the owner is not live).
pub const OWNER_URL_TRAILER: &str = "ricochet-owner-url";

/// Who serves a topic, as [`Client::lookup`] answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicOwner {
    /// The topic looked up (fully qualified when the broker answered; as
    /// given when the broker predates clusters).
    pub topic: String,
    /// The owner's broker id (empty when the broker predates clusters).
    pub broker_id: String,
    /// The owner's URL; the client's service URL for a standalone broker.
    pub url: String,
    /// Whether the owner holds its lease and serves the topic now.
    pub live: bool,
    /// The fencing epoch of the ownership (0 on a standalone broker).
    pub epoch: u64,
    /// The cluster's name; empty for a standalone broker (or an older one).
    pub cluster: String,
}

impl TopicOwner {
    /// Whether the answer came from a standalone broker (or one older than
    /// clusters), which serves every topic itself.
    pub fn is_standalone(&self) -> bool {
        self.cluster.is_empty()
    }
}

/// What a failed call's status says about where its topic lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reroute {
    /// Sent to a broker that does not own the topic: look it up again and
    /// go to the owner (`url`, as the answering broker knows it).
    NotOwner { owner: String, url: String },
    /// The owner is down or fenced (lost its lease): look it up again
    /// later; the topic is unavailable until that broker returns.
    OwnerDown { broker_id: String },
    /// `UNAVAILABLE` without a named owner (a broken connection, a broker
    /// shutting down): in a cluster the topic may have moved, so look it up
    /// again before reconnecting.
    Unavailable,
    /// Nothing about routing.
    No,
}

impl Reroute {
    /// Whether the topic should be looked up again before the next attempt.
    pub(crate) fn relookup(&self) -> bool {
        !matches!(self, Reroute::No)
    }
}

/// Reads a failed call's status: see [`Reroute`]. The owner's id comes from
/// the `ricochet-owner` trailer, or for an `UNAVAILABLE` without it from the
/// broker's message ("… broker B lost its etcd lease", "… placed on broker
/// B, which is down").
pub(crate) fn reroute(status: &tonic::Status) -> Reroute {
    let meta = |key: &str| {
        status
            .metadata()
            .get(key)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
    };
    match status.code() {
        tonic::Code::FailedPrecondition => match (meta(OWNER_TRAILER), meta(OWNER_URL_TRAILER)) {
            (Some(owner), Some(url)) => Reroute::NotOwner { owner, url },
            // The owner is known but not live.
            (Some(owner), None) => Reroute::OwnerDown { broker_id: owner },
            // A redirect without the owner's id: still worth a lookup.
            (None, Some(url)) => Reroute::NotOwner {
                owner: String::new(),
                url,
            },
            // Any other failed precondition (an Exclusive subscription
            // taken, …) is not about routing.
            (None, None) => Reroute::No,
        },
        tonic::Code::Unavailable => {
            if let Some(broker_id) = meta(OWNER_TRAILER) {
                return Reroute::OwnerDown { broker_id };
            }
            // A transport failure carries its cause as the source; only a
            // broker's own answer can name the owner.
            if std::error::Error::source(status).is_none()
                && let Some(broker_id) = named_down_broker(status.message())
            {
                return Reroute::OwnerDown { broker_id };
            }
            Reroute::Unavailable
        }
        _ => Reroute::No,
    }
}

/// The broker id in a broker's message about a down or fenced owner, in
/// the phrasings of the cluster contract ("owned by broker B", "placed on
/// broker B", "broker B lost its etcd lease", "broker B is down").
fn named_down_broker(message: &str) -> Option<String> {
    let about_owner = [
        "lost its etcd lease",
        "is down",
        "not live",
        "placed on broker",
        "owned by broker",
    ]
    .iter()
    .any(|p| message.contains(p));
    if !about_owner {
        return None;
    }
    id_after(message, "broker ")
}

/// The owner in a not-owner message ("topic T is owned by broker B"), as
/// a broker words its redirect.
pub(crate) fn owner_named(message: &str) -> Option<String> {
    id_after(message, "is owned by broker ")
}

/// The word after the first `prefix` in `message`, without quotes and
/// trailing punctuation.
fn id_after(message: &str, prefix: &str) -> Option<String> {
    let after = message.split(prefix).nth(1)?;
    let id: String = after
        .trim_start_matches(['"', '\'', '`'])
        .chars()
        .take_while(|c| {
            !c.is_whitespace() && !matches!(c, ',' | ';' | ':' | ')' | '"' | '\'' | '`')
        })
        .collect();
    let id = id.trim_end_matches('.');
    (!id.is_empty()).then(|| id.to_owned())
}

/// What a broker other than the service URL's that has no Cluster service
/// counts as when asked in its place: unreachable (ask the next one).
pub(crate) fn not_a_cluster_broker() -> Error {
    Error::Connection("that broker has no Cluster service".into())
}

/// A client's routing state: whether its broker is standalone (then every
/// topic is served on the client's one channel), and the channels to other
/// brokers, by URL.
#[derive(Debug, Default)]
pub(crate) struct Routes {
    standalone: AtomicBool,
    channels: Mutex<HashMap<String, Channel>>,
}

/// A URL as a pool key: without a trailing `/`.
fn key(url: &str) -> &str {
    url.trim_end_matches('/')
}

impl Client {
    /// Which broker owns `topic` (one partition of a partitioned topic, or
    /// an ordinary topic), asked of the service URL's broker
    /// (`Cluster.Lookup`). A standalone broker answers itself (with an
    /// empty [`TopicOwner::cluster`]); a broker older than clusters is
    /// answered for locally, with the service URL and an empty broker id.
    /// When the service URL's broker cannot be reached, the brokers the
    /// client has connections to are asked instead (any broker of a
    /// cluster answers).
    ///
    /// A topic placed on a broker that is down gives
    /// [`Error::OwnerDown`]; a partitioned topic's base name is
    /// [`Error::Rejected`] with `InvalidArgument` (look up its partitions).
    pub async fn lookup(&self, topic: &str) -> Result<TopicOwner> {
        let asked = self
            .on_any_broker(|t, service| async move {
                match self.ask(t, topic).await {
                    // Only the service URL's broker answers for a
                    // standalone broker: another one without the Cluster
                    // service, or answering as standalone itself, is skipped.
                    Ok(None) if !service => Err(not_a_cluster_broker()),
                    Ok(Some(r)) if !service && r.cluster.is_empty() => Err(not_a_cluster_broker()),
                    r => r,
                }
            })
            .await?;
        let r = match asked {
            Some(r) => r,
            None => {
                return Ok(TopicOwner {
                    topic: topic.to_owned(),
                    broker_id: String::new(),
                    url: self.url().to_owned(),
                    live: true,
                    epoch: 0,
                    cluster: String::new(),
                });
            }
        };
        Ok(TopicOwner {
            topic: r.topic,
            broker_id: r.broker_id,
            url: if r.url.is_empty() {
                self.url().to_owned()
            } else {
                r.url
            },
            live: r.live,
            epoch: r.epoch,
            cluster: r.cluster,
        })
    }

    /// One `Lookup` on `transport`; `None` when the broker has no Cluster
    /// service (UNIMPLEMENTED).
    async fn ask(&self, transport: Transport, topic: &str) -> Result<Option<LookupResponse>> {
        let mut cluster = ClusterClient::new(transport);
        let call = cluster.lookup(LookupRequest {
            topic: topic.to_owned(),
        });
        match tokio::time::timeout(self.config().request_timeout, call).await {
            Err(_) => Err(Error::Timeout(format!("looking up {topic}"))),
            Ok(Err(s)) if s.code() == tonic::Code::Unimplemented => Ok(None),
            Ok(r) => Ok(Some(r?.into_inner())),
        }
    }

    /// Runs `call` on the service URL's broker; when that broker cannot be
    /// reached, on the brokers the client has connections to, in turn, until
    /// one answers (any broker of a cluster answers lookups, partition
    /// counts and the broker list). The first error when none answers.
    /// `call` is told whether it asks the service URL's broker: only that
    /// one may answer for a standalone broker (an UNIMPLEMENTED from another
    /// is no answer; `call` returns [`Error::Connection`] to skip it).
    pub(crate) async fn on_any_broker<T, F, Fut>(&self, mut call: F) -> Result<T>
    where
        F: FnMut(Transport, bool) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let first = match call(self.transport(), true).await {
            Err(e @ (Error::Connection(_) | Error::Timeout(_))) => e,
            r => return r,
        };
        let others: Vec<Channel> = self
            .routes()
            .channels
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        for channel in others {
            match call(self.with_credentials(channel), false).await {
                Err(Error::Connection(_) | Error::Timeout(_)) => continue,
                r => return r,
            }
        }
        Err(first)
    }

    /// The brokers of the cluster (`Cluster.ListBrokers`), with the topics
    /// each owns when `with_topics`.
    pub async fn list_brokers(&self, with_topics: bool) -> Result<ListBrokersResponse> {
        self.on_any_broker(|t, service| async move {
            let mut cluster = ClusterClient::new(t);
            let call = cluster.list_brokers(ListBrokersRequest { with_topics });
            match tokio::time::timeout(self.config().request_timeout, call).await {
                Err(_) => Err(Error::Timeout("listing the brokers".into())),
                Ok(Err(s)) if !service && s.code() == tonic::Code::Unimplemented => {
                    Err(not_a_cluster_broker())
                }
                Ok(Ok(r)) if !service && r.get_ref().cluster.is_empty() => {
                    Err(not_a_cluster_broker())
                }
                Ok(r) => Ok(r?.into_inner()),
            }
        })
        .await
    }

    /// The admin client on the connection to `topic`'s owner, for
    /// topic-scoped calls (stats, subscriptions, dead letters, policies,
    /// retention); see [`transport_for`](Self::transport_for).
    pub async fn admin_for(&self, topic: &str) -> Result<AdminClient<Transport>> {
        Ok(Self::admin_on(self.transport_for(topic).await?))
    }

    /// The transport (channel with credentials) to `topic`'s owner, for
    /// generated clients of topic-scoped services (`RetentionClient`, …).
    /// On a standalone broker it is [`Client::transport`]; so it is for a
    /// partitioned topic's base name (the lookup answers INVALID_ARGUMENT),
    /// whose admin calls a standalone broker answers over the partitions
    /// (a cluster broker refuses them, naming the partitions).
    pub async fn transport_for(&self, topic: &str) -> Result<Transport> {
        match self.route(topic).await {
            Err(Error::Rejected {
                code: tonic::Code::InvalidArgument,
                ..
            }) => Ok(self.transport()),
            r => r,
        }
    }

    /// The transport a stream or call on `topic` goes over: the client's own
    /// on a standalone broker (one lookup per client, kept), otherwise the
    /// owner's from the pool (a lookup each time: ownership moves).
    pub(crate) async fn route(&self, topic: &str) -> Result<Transport> {
        if self.routes().standalone.load(Ordering::Acquire) {
            return Ok(self.transport());
        }
        let owner = match self.lookup(topic).await {
            // No permission on the topic at all: send the call to the
            // service URL's broker anyway, whose refusal names the
            // permission the call itself needs (every broker checks
            // permissions before it routes).
            Err(Error::Rejected {
                code: tonic::Code::PermissionDenied,
                ..
            }) => return Ok(self.transport()),
            r => r?,
        };
        if owner.is_standalone() {
            self.routes().standalone.store(true, Ordering::Release);
            return Ok(self.transport());
        }
        if !owner.live {
            return Err(Error::OwnerDown {
                broker_id: owner.broker_id,
                message: format!(
                    "topic {} is placed on a broker that is not live",
                    owner.topic
                ),
            });
        }
        tracing::debug!(topic = %owner.topic, owner = %owner.broker_id, url = %owner.url, epoch = owner.epoch, "routed");
        self.transport_to(&owner.url)
    }

    /// The transport to the broker at `url`: the client's own channel for
    /// its service URL, otherwise a pooled channel (connected on first use)
    /// with the client's settings and credentials.
    pub(crate) fn transport_to(&self, url: &str) -> Result<Transport> {
        if key(url) == key(self.url()) {
            return Ok(self.transport());
        }
        let mut channels = self
            .routes()
            .channels
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let channel = match channels.get(key(url)) {
            Some(c) => c.clone(),
            None => {
                let c = self.endpoints().endpoint(url)?.connect_lazy();
                channels.insert(key(url).to_owned(), c.clone());
                c
            }
        };
        Ok(self.with_credentials(channel))
    }

    /// A stream on a topic failed with `status`: in a client that took its
    /// broker for standalone, a redirect means that is no longer so (the
    /// broker joined a cluster), so the next open asks again.
    pub(crate) fn stream_failed(&self, status: &tonic::Status) -> Reroute {
        let r = reroute(status);
        if matches!(r, Reroute::NotOwner { .. } | Reroute::OwnerDown { .. }) {
            self.routes().standalone.store(false, Ordering::Release);
        }
        r
    }

    /// How many channels to other brokers the client holds (tests).
    #[doc(hidden)]
    pub fn pooled_connections(&self) -> usize {
        self.routes()
            .channels
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::metadata::MetadataValue;

    fn with_trailers(mut s: tonic::Status, pairs: &[(&'static str, &str)]) -> tonic::Status {
        for (k, v) in pairs {
            s.metadata_mut()
                .insert(*k, MetadataValue::try_from(*v).unwrap());
        }
        s
    }

    #[test]
    fn the_not_owner_redirect_means_relookup_at_the_owner() {
        let s = with_trailers(
            tonic::Status::failed_precondition("topic t is owned by broker b2"),
            &[
                (OWNER_TRAILER, "b2"),
                (OWNER_URL_TRAILER, "http://10.0.0.2:6650"),
            ],
        );
        let r = reroute(&s);
        assert_eq!(
            r,
            Reroute::NotOwner {
                owner: "b2".into(),
                url: "http://10.0.0.2:6650".into()
            }
        );
        assert!(r.relookup());
        // Without the URL the owner is not live.
        let s = with_trailers(
            tonic::Status::failed_precondition("topic t is owned by broker b2"),
            &[(OWNER_TRAILER, "b2")],
        );
        assert_eq!(
            reroute(&s),
            Reroute::OwnerDown {
                broker_id: "b2".into()
            }
        );
    }

    #[test]
    fn other_failed_preconditions_are_not_about_routing() {
        let s = tonic::Status::failed_precondition("subscription s has an exclusive consumer");
        assert_eq!(reroute(&s), Reroute::No);
        assert!(!reroute(&s).relookup());
        for s in [
            tonic::Status::not_found("topic t not found"),
            tonic::Status::invalid_argument("bad name"),
            tonic::Status::permission_denied("no"),
            tonic::Status::new(tonic::Code::Ok, ""),
        ] {
            assert_eq!(reroute(&s), Reroute::No, "{s:?}");
        }
    }

    #[test]
    fn unavailable_names_the_down_owner_when_it_can() {
        let s = with_trailers(
            tonic::Status::unavailable("whatever"),
            &[(OWNER_TRAILER, "b3")],
        );
        assert_eq!(
            reroute(&s),
            Reroute::OwnerDown {
                broker_id: "b3".into()
            }
        );
        for (msg, id) in [
            ("broker b1 lost its etcd lease", "b1"),
            (
                "topic persistent://public/default/t is placed on broker 7f3a, which is down",
                "7f3a",
            ),
            (
                "topic t is owned by broker \"b-2\", which is not live",
                "b-2",
            ),
        ] {
            assert_eq!(
                reroute(&tonic::Status::unavailable(msg)),
                Reroute::OwnerDown {
                    broker_id: id.into()
                },
                "{msg}"
            );
        }
        // A broker shutting down, or a broken connection: look up again,
        // but nobody is named.
        let s = tonic::Status::unavailable("broker is shutting down");
        assert_eq!(reroute(&s), Reroute::Unavailable);
        assert!(reroute(&s).relookup());
    }

    #[test]
    fn errors_from_statuses_carry_the_routing() {
        let s = with_trailers(
            tonic::Status::failed_precondition("topic t is owned by broker b2"),
            &[(OWNER_TRAILER, "b2"), (OWNER_URL_TRAILER, "http://h:1")],
        );
        let e = Error::from(s);
        assert!(
            matches!(&e, Error::NotOwner { owner, url, .. } if owner == "b2" && url == "http://h:1")
        );
        assert!(e.is_retryable());
        assert_eq!(e.code(), Some(tonic::Code::FailedPrecondition));
        let e = Error::from(tonic::Status::unavailable("broker b1 lost its etcd lease"));
        assert!(matches!(&e, Error::OwnerDown { broker_id, .. } if broker_id == "b1"));
        assert!(e.is_retryable());
        assert_eq!(e.code(), Some(tonic::Code::Unavailable));
        assert_eq!(e.owner_down(), Some("b1"));
    }

    #[test]
    fn a_redirect_sent_as_a_frame_is_recognised_by_its_words() {
        let e = Error::from_code(
            tonic::Code::FailedPrecondition as i32,
            "topic persistent://public/default/t is owned by broker b4",
        );
        assert!(
            matches!(&e, Error::NotOwner { owner, .. } if owner == "b4"),
            "{e:?}"
        );
        assert!(e.is_retryable());
        let e = Error::from_code(
            tonic::Code::FailedPrecondition as i32,
            "subscription s has an exclusive consumer",
        );
        assert!(matches!(e, Error::Rejected { .. }), "{e:?}");
        assert_eq!(
            owner_named("topic t is owned by broker \"b-1\"."),
            Some("b-1".into())
        );
        assert_eq!(owner_named("topic t is owned by broker "), None);
    }

    #[test]
    fn pool_keys_ignore_a_trailing_slash() {
        assert_eq!(key("http://a:1/"), key("http://a:1"));
    }
}
