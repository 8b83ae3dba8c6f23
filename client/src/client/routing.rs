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
//! When a stream fails, [`reroute`] reads its error: the not-owner
//! redirect ([`ErrorKind::Redirect`]: the broker's structured details name
//! the owner, its URL and epoch), an owner that is down or fenced
//! ([`ErrorKind::OwnerDown`]), or a broker that cannot serve or cannot be
//! reached mean "look the topic up again"; the driver's reconnect then goes
//! through [`Client::route`] again, which in a cluster always asks. A topic
//! whose owner is down gives [`ErrorKind::OwnerDown`] with the broker's id.
//! Nothing here reads a message's text.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use ricochet_proto::cluster_client::ClusterClient;
use ricochet_proto::{ListBrokersRequest, ListBrokersResponse, LookupRequest, LookupResponse};
use tonic::transport::Channel;

use crate::client::Client;
use crate::credentials::Transport;
use crate::error::{Error, ErrorKind, Result};

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

/// What a failed call's error says about where its topic lives: see
/// [`Reroute`]. Decided from the error's kind and the owner the broker's
/// structured details name ([`Error::redirect`]), never from its text.
pub(crate) fn reroute(e: &Error) -> Reroute {
    match e.kind() {
        ErrorKind::Redirect => {
            let r = e.redirect();
            Reroute::NotOwner {
                owner: r.map(|r| r.owner.clone()).unwrap_or_default(),
                url: r.and_then(|r| r.url.clone()).unwrap_or_default(),
            }
        }
        ErrorKind::OwnerDown => Reroute::OwnerDown {
            broker_id: e.owner_down().unwrap_or_default().to_owned(),
        },
        ErrorKind::Unavailable | ErrorKind::Disconnected => Reroute::Unavailable,
        _ => Reroute::No,
    }
}

/// What a broker other than the service URL's that has no Cluster service
/// counts as when asked in its place: unreachable (ask the next one).
pub(crate) fn not_a_cluster_broker() -> Error {
    Error::disconnected("that broker has no Cluster service")
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
    /// [`ErrorKind::OwnerDown`]; a partitioned topic's base name is
    /// refused with [`ErrorKind::InvalidArgument`] (look up its partitions).
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
            Err(_) => Err(Error::timeout(format!("looking up {topic}"))),
            Ok(Err(s)) if s.code() == tonic::Code::Unimplemented => Ok(None),
            Ok(r) => Ok(Some(r.map_err(Error::from_status)?.into_inner())),
        }
    }

    /// Runs `call` on the service URL's broker; when that broker cannot be
    /// reached, on the brokers the client has connections to, in turn, until
    /// one answers (any broker of a cluster answers lookups, partition
    /// counts and the broker list). The first error when none answers.
    /// `call` is told whether it asks the service URL's broker: only that
    /// one may answer for a standalone broker (an UNIMPLEMENTED from another
    /// is no answer; `call` returns [`ErrorKind::Disconnected`] to skip it).
    pub(crate) async fn on_any_broker<T, F, Fut>(&self, mut call: F) -> Result<T>
    where
        F: FnMut(Transport, bool) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let unreachable =
            |e: &Error| matches!(e.kind(), ErrorKind::Disconnected | ErrorKind::Timeout);
        let first = match call(self.transport(), true).await {
            Err(e) if unreachable(&e) => e,
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
                Err(e) if unreachable(&e) => continue,
                r => return r,
            }
        }
        Err(first)
    }

    /// The brokers of the cluster (`Cluster.ListBrokers`), with the topics
    /// each owns when `with_topics`.
    pub(crate) async fn list_brokers(&self, with_topics: bool) -> Result<ListBrokersResponse> {
        self.on_any_broker(|t, service| async move {
            let mut cluster = ClusterClient::new(t);
            let call = cluster.list_brokers(ListBrokersRequest { with_topics });
            match tokio::time::timeout(self.config().request_timeout, call).await {
                Err(_) => Err(Error::timeout("listing the brokers")),
                Ok(Err(s)) if !service && s.code() == tonic::Code::Unimplemented => {
                    Err(not_a_cluster_broker())
                }
                Ok(Ok(r)) if !service && r.get_ref().cluster.is_empty() => {
                    Err(not_a_cluster_broker())
                }
                Ok(r) => Ok(r.map_err(Error::from_status)?.into_inner()),
            }
        })
        .await
    }

    /// The transport (channel with credentials) to `topic`'s owner, for
    /// generated clients of topic-scoped services (`RetentionClient`, …).
    /// On a standalone broker it is [`Client::transport`]; so it is for a
    /// partitioned topic's base name (the lookup answers INVALID_ARGUMENT),
    /// whose admin calls a standalone broker answers over the partitions
    /// (a cluster broker refuses them, naming the partitions).
    ///
    /// Not part of the API (no semver promise), as [`Client::transport`].
    #[doc(hidden)]
    pub async fn transport_for(&self, topic: &str) -> Result<Transport> {
        match self.route(topic).await {
            Err(e) if e.kind() == ErrorKind::InvalidArgument && e.grpc_code().is_some() => {
                Ok(self.transport())
            }
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
            Err(e) if e.kind() == crate::ErrorKind::PermissionDenied => {
                return Ok(self.transport());
            }
            r => r?,
        };
        if owner.is_standalone() {
            self.routes().standalone.store(true, Ordering::Release);
            return Ok(self.transport());
        }
        if !owner.live {
            return Err(Error::owner_is_down(
                owner.broker_id,
                format!(
                    "topic {} is placed on a broker that is not live",
                    owner.topic
                ),
            ));
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

    /// A stream on a topic broke with `status`: its error, after
    /// [`stream_failed`](Self::stream_failed). The driver's reconnect looks
    /// the topic up again: a redirect or an unavailable owner lands on the
    /// (new) owner.
    pub(crate) fn stream_broke(&self, status: tonic::Status) -> Error {
        let e = Error::from_status(status);
        let reroute = self.stream_failed(&e);
        if reroute.relookup() {
            tracing::debug!(?reroute, "the topic is looked up again before reconnecting");
        }
        e
    }

    /// A stream on a topic failed with `e`: in a client that took its
    /// broker for standalone, a redirect means that is no longer so (the
    /// broker joined a cluster), so the next open asks again.
    pub(crate) fn stream_failed(&self, e: &Error) -> Reroute {
        let r = reroute(e);
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
    use ricochet_proto::error_details::{Detail, Reason, attach};

    /// A status as a broker sends it, with text that means nothing.
    fn refused(code: tonic::Code, d: &Detail) -> Error {
        Error::from_status(attach(code, "x!y?z (no words to read)", d))
    }

    #[test]
    fn the_not_owner_redirect_means_relookup_at_the_owner() {
        let d = Detail {
            topic: Some("persistent://public/default/t".into()),
            owner: Some("b2".into()),
            owner_url: Some("http://10.0.0.2:6650".into()),
            epoch: Some(3),
            ..Detail::new(Reason::NotOwner)
        };
        let r = reroute(&refused(tonic::Code::FailedPrecondition, &d));
        assert_eq!(
            r,
            Reroute::NotOwner {
                owner: "b2".into(),
                url: "http://10.0.0.2:6650".into()
            }
        );
        assert!(r.relookup());
        // Without the URL the owner is not live.
        let d = Detail {
            owner_url: None,
            ..d
        };
        assert_eq!(
            reroute(&refused(tonic::Code::FailedPrecondition, &d)),
            Reroute::OwnerDown {
                broker_id: "b2".into()
            }
        );
    }

    #[test]
    fn statuses_without_details_are_not_about_owners_whatever_they_say() {
        // The words of the old contract, without details: nothing is read
        // from them.
        for s in [
            tonic::Status::failed_precondition("topic t is owned by broker b2"),
            tonic::Status::failed_precondition("subscription s has an exclusive consumer"),
            tonic::Status::not_found("topic t not found"),
            tonic::Status::invalid_argument("bad name"),
            tonic::Status::permission_denied("no"),
        ] {
            assert_eq!(
                reroute(&Error::from_status(s.clone())),
                Reroute::No,
                "{s:?}"
            );
        }
        for msg in [
            "broker b1 lost its etcd lease",
            "topic t is placed on broker 7f3a, which is down",
            "broker is shutting down",
        ] {
            assert_eq!(
                reroute(&Error::from_status(tonic::Status::unavailable(msg))),
                Reroute::Unavailable,
                "{msg}"
            );
        }
    }

    #[test]
    fn down_and_fenced_owners_are_named_by_the_details() {
        for reason in [Reason::OwnerDown, Reason::Fenced] {
            let d = Detail {
                owner: Some("b3".into()),
                ..Detail::new(reason)
            };
            let e = refused(tonic::Code::Unavailable, &d);
            assert_eq!(
                reroute(&e),
                Reroute::OwnerDown {
                    broker_id: "b3".into()
                }
            );
            assert_eq!(e.owner_down(), Some("b3"));
            assert!(e.is_retryable());
        }
        let moving = Detail {
            owner: Some("b1".into()),
            moving_to: Some("b2".into()),
            ..Detail::new(Reason::Moving)
        };
        let e = refused(tonic::Code::Unavailable, &moving);
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        assert_eq!(reroute(&e), Reroute::Unavailable);
        assert!(reroute(&e).relookup());
    }

    #[test]
    fn a_redirect_sent_as_a_frame_is_recognised_by_its_details() {
        let d = Detail {
            owner: Some("b4".into()),
            owner_url: Some("http://h:4".into()),
            ..Detail::new(Reason::NotOwner)
        };
        let s = attach(tonic::Code::FailedPrecondition, "ignored", &d);
        let e = Error::from_frame(s.code() as i32, "gibberish", s.details());
        assert_eq!(e.kind(), ErrorKind::Redirect, "{e:?}");
        assert_eq!(e.redirect().map(|r| r.owner.as_str()), Some("b4"));
        assert!(e.is_retryable());
        let e = Error::from_frame(
            tonic::Code::FailedPrecondition as i32,
            "topic persistent://public/default/t is owned by broker b4",
            &[],
        );
        assert_eq!(e.kind(), ErrorKind::FailedPrecondition, "{e:?}");
        assert!(!e.is_retryable());
    }

    #[test]
    fn pool_keys_ignore_a_trailing_slash() {
        assert_eq!(key("http://a:1/"), key("http://a:1"));
    }
}
