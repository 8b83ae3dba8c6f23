//! Moving topics off this broker: one topic (`MoveTopic`), or every topic
//! placed here (`Drain`, a few at a time). For each: stop serving it,
//! seal its logs, capture its state, stream it to the target broker's
//! `ImportTopic` (answered once durable there), switch the placement in
//! etcd, then delete the local copy. A failure before the switch leaves the
//! topic here, served again; the caller is told which topics stayed and why.
//!
//! A replicated topic (factor above 1) is not copied: its replica moves as a
//! membership change of its group (`replication::groups`, the broker
//! leaving is this one), and a drain does that for every group this broker
//! is a member of before it copies the topics of factor 1.

use super::{CHUNK_BYTES, CHUNK_ENTRIES, TopicState, capture, runs};
use crate::core::BrokerCore;
use crate::error::{BrokerError, Result};
use crate::name::TopicName;
use crate::node::Node;
use futures::StreamExt;
use ricochet_cluster::Cluster;
use ricochet_proto::TransferEnd;
use ricochet_proto::cluster_client::ClusterClient;
use ricochet_proto::{TopicTransferPart, TransferBegin, TransferEntries, topic_transfer_part};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::Channel;

/// Topics moved at once by a drain.
const DRAIN_PARALLEL: usize = 4;
/// Largest piece of the encoded state per message.
const STATE_PIECE: usize = 1 << 20;
/// How long a target may take to store a moved topic: this, plus a
/// millisecond per [`IMPORT_MIN_ENTRIES_PER_MS`] entries.
const IMPORT_BASE_WAIT: Duration = Duration::from_secs(30);
/// The slowest import rate waited for (10 000 entries a second).
const IMPORT_MIN_ENTRIES_PER_MS: u64 = 10;
/// How long connecting to the target may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A topic that moved.
#[derive(Debug, Clone, PartialEq)]
pub struct Moved {
    /// Its name.
    pub topic: String,
    /// The broker it lives on now.
    pub to: String,
    /// Entries handed over.
    pub entries: u64,
    /// How long it was not served, ms.
    pub millis: u64,
}

/// What a drain did.
#[derive(Debug, Clone, Default)]
pub struct DrainReport {
    /// Topics moved.
    pub moved: Vec<Moved>,
    /// Topics that stayed, with why.
    pub not_moved: Vec<(String, String)>,
    /// How long it took, ms.
    pub millis: u64,
}

fn cluster_of(node: &Node) -> Result<Arc<Cluster>> {
    node.cluster().cloned().ok_or_else(|| {
        BrokerError::InvalidArgument(
            "this broker runs standalone: topics move only between brokers of a cluster".into(),
        )
    })
}

/// Moves `topic` (owned here) to broker `to`, or to the live broker with
/// the fewest topics. `auth`: the caller's credentials, shown to the target.
pub async fn move_topic(
    node: &Node,
    topic: &TopicName,
    to: Option<&str>,
    auth: Option<&AsciiMetadataValue>,
) -> Result<Moved> {
    let cluster = cluster_of(node)?;
    if let Some(groups) = node.groups()
        && groups.read_group(topic.as_str()).await?.is_some()
    {
        let m = groups.move_out(topic.as_str(), to).await?;
        return Ok(member_moved(m));
    }
    if cluster.route(topic.as_str(), false).await?.is_none() {
        return Err(BrokerError::TopicNotFound(format!(
            "{topic} (not placed on any broker)"
        )));
    }
    let (to, url) = cluster
        .move_targets(to, 1)
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| BrokerError::Etcd("no broker to move to".into()))?;
    transfer(node, &cluster, topic, &to, &url, auth).await
}

/// Drains this broker (`broker_id` must be its id): registers it as
/// draining, then moves every topic placed on it to the other live
/// brokers, spread evenly, [`DRAIN_PARALLEL`] at a time.
pub async fn drain(
    node: &Node,
    broker_id: &str,
    auth: Option<&AsciiMetadataValue>,
) -> Result<DrainReport> {
    let started = Instant::now();
    let cluster = cluster_of(node)?;
    if broker_id != cluster.id() {
        let url = cluster.url_of(broker_id).await?;
        return Err(BrokerError::Conflict(match url {
            Some(u) => format!(
                "this is broker {}; send the drain of broker {broker_id} to {u}",
                cluster.id()
            ),
            None => format!(
                "this is broker {}; broker {broker_id} is not live",
                cluster.id()
            ),
        }));
    }
    cluster.start_draining().await?;
    let mut report = DrainReport::default();
    // Replicated topics first: this broker's replicas move as membership
    // changes; the topics placed here because this broker led them are
    // then led elsewhere.
    let mut replicated = std::collections::HashSet::new();
    if let Some(groups) = node.groups() {
        for (topic, r) in groups.drain_out().await? {
            replicated.insert(topic.clone());
            match r {
                Ok(m) => report.moved.push(member_moved(m)),
                Err(e) => {
                    tracing::warn!(%topic, error = %e, "replica not moved off the draining broker");
                    report.not_moved.push((topic, e.to_string()));
                }
            }
        }
    }
    if let Some(groups) = node.groups() {
        replicated.extend(groups.replicated_topics().await?);
    }
    let topics: Vec<String> = cluster
        .placed_here()
        .await?
        .into_iter()
        .filter(|t| !replicated.contains(t))
        .collect();
    let targets = cluster.move_targets(None, topics.len()).await?;
    tracing::info!(broker = %broker_id, topics = topics.len(), "draining");
    let results: Vec<(String, Result<Moved>)> =
        futures::stream::iter(topics.into_iter().zip(targets))
            .map(|(topic, (to, url))| {
                let cluster = cluster.clone();
                async move {
                    let r = match TopicName::parse_stored(&topic) {
                        Ok(name) => transfer(node, &cluster, &name, &to, &url, auth).await,
                        Err(e) => Err(e),
                    };
                    (topic, r)
                }
            })
            .buffer_unordered(DRAIN_PARALLEL)
            .collect()
            .await;
    for (topic, r) in results {
        match r {
            Ok(m) => report.moved.push(m),
            Err(e) => {
                tracing::warn!(%topic, error = %e, "topic not moved off the draining broker");
                report.not_moved.push((topic, e.to_string()));
            }
        }
    }
    report.moved.sort_by(|a, b| a.topic.cmp(&b.topic));
    report.not_moved.sort();
    report.millis = started.elapsed().as_millis() as u64;
    tracing::info!(
        broker = %broker_id,
        moved = report.moved.len(),
        not_moved = report.not_moved.len(),
        millis = report.millis,
        "drain finished"
    );
    Ok(report)
}

/// A replica's move as a drain or a move reports it: no entries copied by
/// this broker; `millis`, how long nobody served the topic.
fn member_moved(m: crate::replication::groups::MemberMoved) -> Moved {
    Moved {
        topic: m.topic,
        to: m.to,
        entries: 0,
        millis: m.unavailable_ms,
    }
}

/// Moves `name` to broker `to` at `url` (see the module docs for the order).
async fn transfer(
    node: &Node,
    cluster: &Cluster,
    name: &TopicName,
    to: &str,
    url: &str,
    auth: Option<&AsciiMetadataValue>,
) -> Result<Moved> {
    let core = &node.core;
    if core
        .storage
        .replay_jobs(false)?
        .iter()
        .any(|j| j.topic == name.as_str())
    {
        return Err(BrokerError::Conflict(format!(
            "a dead-letter replay job is running on {name}; wait for it or cancel it first"
        )));
    }
    let started = Instant::now();
    let channel = connect(&core.config, url).await?;
    cluster.begin_move(name.as_str(), to)?;
    let mut sealed = HashMap::new();
    let handed = async {
        let mut entries = 0;
        if core.topic(name).await.is_ok() {
            sealed = core.seal_for_move(name).await?;
            let state = capture(node, name, &sealed)?;
            entries = send(core, cluster.id(), (url, channel.clone()), auth, state).await?;
        }
        cluster.hand_over(name.as_str(), to).await?;
        Ok::<_, BrokerError>(entries)
    }
    .await;
    match handed {
        Ok(entries) => {
            claim_there(channel, auth, name).await;
            if let Err(e) = node.forget_moved(name).await {
                tracing::warn!(topic = %name, error = %e, "moved, but the local copy could not be deleted (it is not served)");
            }
            cluster.end_move(name.as_str());
            let millis = started.elapsed().as_millis() as u64;
            tracing::info!(topic = %name, %to, entries, millis, "topic moved");
            Ok(Moved {
                topic: name.to_string(),
                to: to.to_owned(),
                entries,
                millis,
            })
        }
        Err(e) => {
            core.reopen(sealed.into_keys()).await;
            cluster.end_move(name.as_str());
            Err(e)
        }
    }
}

/// A channel to the broker at `url` (over TLS when it listens with it).
async fn connect(config: &crate::config::BrokerConfig, url: &str) -> Result<Channel> {
    let unreachable =
        |e: &dyn std::fmt::Display| BrokerError::Peer(format!("cannot reach {url}: {e}"));
    config
        .peer_endpoint(url)?
        .connect_timeout(CONNECT_TIMEOUT)
        .connect()
        .await
        .map_err(|e| unreachable(&e))
}

/// `message` as a request carrying the caller's credentials.
fn authorized<T>(message: T, auth: Option<&AsciiMetadataValue>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(a) = auth {
        request.metadata_mut().insert("authorization", a.clone());
    }
    request
}

/// Asks the new owner where `name` lives, which makes it claim the topic
/// now rather than on its clients' first call (best effort: it claims it
/// then anyway).
async fn claim_there(channel: Channel, auth: Option<&AsciiMetadataValue>, name: &TopicName) {
    let request = authorized(
        ricochet_proto::LookupRequest {
            topic: name.to_string(),
        },
        auth,
    );
    match tokio::time::timeout(CONNECT_TIMEOUT, ClusterClient::new(channel).lookup(request)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => {
            tracing::debug!(topic = %name, error = %e, "the new owner did not claim at once")
        }
        Err(_) => tracing::debug!(topic = %name, "the new owner did not answer the lookup in time"),
    }
}

/// Streams `state` and the entries of its logs to the broker at `url`
/// (over `channel`); the entries it stored.
async fn send(
    core: &BrokerCore,
    from: &str,
    (url, channel): (&str, Channel),
    auth: Option<&AsciiMetadataValue>,
    state: TopicState,
) -> Result<u64> {
    let encoded = serde_json::to_vec(&state).map_err(|e| {
        BrokerError::InvalidArgument(format!("cannot encode the topic's state: {e}"))
    })?;
    let (tx, rx) = tokio::sync::mpsc::channel::<TopicTransferPart>(4);
    let begin: Vec<TransferBegin> = encoded
        .chunks(STATE_PIECE)
        .map(|piece| TransferBegin {
            topic: state.topic().to_owned(),
            from_broker: from.to_owned(),
            state: piece.to_vec(),
        })
        .collect();
    let storage = core.storage.clone();
    let logs: Vec<(String, u64, u64)> = state
        .logs
        .iter()
        .map(|l| (l.record.name.clone(), l.first, l.next))
        .collect();
    let reader = tokio::task::spawn_blocking(move || -> Result<u64> {
        let send = |part| {
            tx.blocking_send(TopicTransferPart { part: Some(part) })
                .map_err(|_| BrokerError::Peer("the target stopped receiving".into()))
        };
        for piece in begin {
            send(topic_transfer_part::Part::Begin(piece))?;
        }
        let mut counts = HashMap::new();
        for (log, first, next) in logs {
            let count: &mut u64 = counts.entry(log.clone()).or_default();
            let mut from = first;
            while from < next {
                let chunk = storage.read(&log, from, CHUNK_ENTRIES, CHUNK_BYTES)?;
                let Some(last) = chunk.last().map(|(id, _)| *id) else {
                    break;
                };
                *count += chunk.len() as u64;
                for (first_id, entries) in runs(chunk) {
                    send(topic_transfer_part::Part::Entries(TransferEntries {
                        topic: log.clone(),
                        first_id,
                        entries,
                    }))?;
                }
                from = last + 1;
            }
        }
        let total = counts.values().sum();
        send(topic_transfer_part::Part::End(TransferEnd {
            entries: counts,
        }))?;
        Ok(total)
    });
    let request = authorized(tokio_stream::wrappers::ReceiverStream::new(rx), auth);
    // A target that stops answering (paused, partitioned away) must not
    // keep the topic unavailable: past the deadline the move fails and the
    // topic is served here again.
    let held: u64 = state
        .logs
        .iter()
        .map(|l| l.next.saturating_sub(l.first))
        .sum();
    let deadline = IMPORT_BASE_WAIT + Duration::from_millis(held / IMPORT_MIN_ENTRIES_PER_MS);
    let answer =
        match tokio::time::timeout(deadline, ClusterClient::new(channel).import_topic(request))
            .await
        {
            Ok(a) => a,
            Err(_) => Err(tonic::Status::deadline_exceeded(format!(
                "no answer within {deadline:?}"
            ))),
        };
    let read = reader
        .await
        .map_err(|e| BrokerError::Peer(format!("reading the topic failed: {e}")))?;
    let stored = answer
        .map_err(|s| {
            BrokerError::Peer(format!(
                "broker at {url} refused the topic: {}",
                s.message()
            ))
        })?
        .into_inner()
        .entries;
    let expected = read?;
    if stored != expected {
        return Err(BrokerError::Peer(format!(
            "broker at {url} stored {stored} entries of {expected}"
        )));
    }
    Ok(stored)
}
