//! Moving topics off this broker: one topic (`MoveTopic`), or every topic
//! placed here (`Drain`, a few at a time). For each: stream its log's
//! entries to the target broker's `ImportTopic` while it is still served,
//! then stop serving it, seal its logs, capture its state, stream that and
//! the rest (answered once durable there), switch the placement in
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
use crate::node::{Moving, Node};
use futures::StreamExt;
use ricochet_cluster::Cluster;
use ricochet_proto::ImportTopicResponse;
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
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A topic that moved.
#[derive(Debug, Clone, PartialEq)]
pub struct Moved {
    /// Its name.
    pub topic: String,
    /// The broker it lives on now.
    pub to: String,
    /// Entries handed over.
    pub entries: u64,
    /// How long it was not served, ms (from when it stopped to when the
    /// placement switched and the target was asked to claim it).
    pub millis: u64,
    /// Of `entries`, those copied while it was not served.
    pub entries_while_stopped: u64,
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
        entries_while_stopped: 0,
        millis: m.unavailable_ms,
    }
}

/// Holds a topic in [`Moving`] until dropped.
struct Precopying<'a> {
    moving: &'a Moving,
    topic: String,
}

impl<'a> Precopying<'a> {
    fn take(moving: &'a Moving, topic: &TopicName) -> Result<Self> {
        if !moving.insert(topic.as_str()) {
            return Err(BrokerError::Conflict(format!("{topic} is already moving")));
        }
        Ok(Self {
            moving,
            topic: topic.to_string(),
        })
    }
}

impl Drop for Precopying<'_> {
    fn drop(&mut self) {
        self.moving.remove(&self.topic);
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
    let _precopying = Precopying::take(&node.moving, name)?;
    let channel = connect(&core.config, url).await?;
    // Phase 1, served meanwhile: the log's entries as they are now.
    let mut import = None;
    if core.topic(name).await.is_ok() {
        let pre = super::precapture(node, name)?;
        let mut started = Import::start(channel.clone(), auth);
        let pre_log = pre.logs[0].clone();
        let span = (pre_log.first, pre_log.next);
        let sent = started
            .send(
                core,
                cluster.id(),
                url,
                pre,
                vec![(pre_log.record.name.clone(), span.0, span.1)],
            )
            .await;
        match sent {
            Ok(()) => import = Some((started, pre_log)),
            Err(e) => {
                started.cancel();
                return Err(e);
            }
        }
    }
    // Phase 2: the topic stops here.
    let stopped = Instant::now();
    if let Err(e) = cluster.begin_move(name.as_str(), to) {
        if let Some((i, _)) = import {
            i.cancel();
        }
        return Err(e.into());
    }
    let mut sealed = HashMap::new();
    let handed = async {
        let (mut entries, mut while_stopped) = (0, 0);
        if let Some((mut import, pre_log)) = import {
            sealed = core.seal_for_move(name).await?;
            let state = capture(node, name, &sealed)?;
            let mut logs: Vec<(String, u64, u64)> = state
                .logs
                .iter()
                .map(|l| (l.record.name.clone(), l.first, l.next))
                .collect();
            logs[0].1 = super::tail_start(&pre_log, &state.logs[0]);
            if logs[0].1 != pre_log.next {
                // Trimmed meanwhile: the target drops its pre-copy.
                import.counts.remove(&logs[0].0);
            }
            while_stopped = logs.iter().map(|(_, a, b)| b.saturating_sub(*a)).sum();
            let sent = import.send(core, cluster.id(), url, state, logs).await;
            if let Err(e) = sent {
                import.cancel();
                return Err(e);
            }
            (entries, while_stopped) = import.finish(url, while_stopped).await?;
        }
        cluster.hand_over(name.as_str(), to).await?;
        Ok::<_, BrokerError>((entries, while_stopped))
    }
    .await;
    match handed {
        Ok((entries, entries_while_stopped)) => {
            claim_there(channel, auth, name).await;
            let millis = stopped.elapsed().as_millis() as u64;
            if let Err(e) = node.forget_moved(name).await {
                tracing::warn!(topic = %name, error = %e, "moved, but the local copy could not be deleted (it is not served)");
            }
            cluster.end_move(name.as_str());
            tracing::info!(topic = %name, %to, entries, entries_while_stopped, millis, "topic moved");
            Ok(Moved {
                topic: name.to_string(),
                to: to.to_owned(),
                entries,
                entries_while_stopped,
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
pub(crate) async fn connect(config: &crate::config::BrokerConfig, url: &str) -> Result<Channel> {
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
pub(crate) fn authorized<T>(message: T, auth: Option<&AsciiMetadataValue>) -> tonic::Request<T> {
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

/// One `ImportTopic` call under way: its parts go out as they are read.
struct Import {
    tx: tokio::sync::mpsc::Sender<TopicTransferPart>,
    answer: tokio::task::JoinHandle<
        std::result::Result<tonic::Response<ImportTopicResponse>, tonic::Status>,
    >,
    /// Entries sent per log.
    counts: HashMap<String, u64>,
}

impl Import {
    /// Opens the call over `channel`.
    fn start(channel: Channel, auth: Option<&AsciiMetadataValue>) -> Self {
        let (tx, rx) = tokio::sync::mpsc::channel::<TopicTransferPart>(4);
        let request = authorized(tokio_stream::wrappers::ReceiverStream::new(rx), auth);
        let answer =
            tokio::spawn(async move { ClusterClient::new(channel).import_topic(request).await });
        Self {
            tx,
            answer,
            counts: HashMap::new(),
        }
    }

    /// Ends the call (the target drops what it received).
    fn cancel(self) {
        self.answer.abort();
    }

    /// Sends `state`, then entries `from..next` of each log in `logs`. A
    /// target that stops reading (paused, partitioned away) must not hold
    /// the move: past a deadline set by the entries' count this fails.
    async fn send(
        &mut self,
        core: &BrokerCore,
        from: &str,
        url: &str,
        state: TopicState,
        logs: Vec<(String, u64, u64)>,
    ) -> Result<()> {
        let encoded = serde_json::to_vec(&state).map_err(|e| {
            BrokerError::InvalidArgument(format!("cannot encode the topic's state: {e}"))
        })?;
        let begin: Vec<TransferBegin> = encoded
            .chunks(STATE_PIECE)
            .map(|piece| TransferBegin {
                topic: state.topic().to_owned(),
                from_broker: from.to_owned(),
                state: piece.to_vec(),
            })
            .collect();
        let held: u64 = logs.iter().map(|(_, a, b)| b.saturating_sub(*a)).sum();
        let storage = core.storage.clone();
        let tx = self.tx.clone();
        let mut counts = std::mem::take(&mut self.counts);
        let reader = tokio::task::spawn_blocking(move || -> (HashMap<String, u64>, Result<()>) {
            let send = |part| {
                tx.blocking_send(TopicTransferPart { part: Some(part) })
                    .map_err(|_| BrokerError::Peer("the target stopped receiving".into()))
            };
            let r = (|| {
                for piece in begin {
                    send(topic_transfer_part::Part::Begin(piece))?;
                }
                for (log, first, next) in logs {
                    let count: &mut u64 = counts.entry(log.clone()).or_default();
                    let mut from = first;
                    while from < next {
                        let mut chunk = storage.read(&log, from, CHUNK_ENTRIES, CHUNK_BYTES)?;
                        chunk.retain(|(id, _)| *id < next);
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
                Ok(())
            })();
            (counts, r)
        });
        let deadline = IMPORT_BASE_WAIT + Duration::from_millis(held / IMPORT_MIN_ENTRIES_PER_MS);
        match tokio::time::timeout(deadline, reader).await {
            Ok(Ok((counts, r))) => {
                self.counts = counts;
                match r {
                    Ok(()) => Ok(()),
                    Err(e) => Err(self.refused_or(url, e).await),
                }
            }
            Ok(Err(e)) => Err(BrokerError::Peer(format!("reading the topic failed: {e}"))),
            Err(_) => Err(BrokerError::Peer(format!(
                "broker at {url} took no more of the topic within {deadline:?}"
            ))),
        }
    }

    /// `e`, or the target's answer when it ended the call (its refusal says
    /// more than "stopped receiving").
    async fn refused_or(&mut self, url: &str, e: BrokerError) -> BrokerError {
        match tokio::time::timeout(CONNECT_TIMEOUT, &mut self.answer).await {
            Ok(Ok(Err(s))) => BrokerError::Peer(format!(
                "broker at {url} refused the topic: {}",
                s.message()
            )),
            _ => e,
        }
    }

    /// Sends the end and waits for the target to store it all (`tail`:
    /// entries sent while stopped, for the deadline); the entries it
    /// stored, and `tail`.
    async fn finish(self, url: &str, tail: u64) -> Result<(u64, u64)> {
        let expected: u64 = self.counts.values().sum();
        let end = TopicTransferPart {
            part: Some(topic_transfer_part::Part::End(TransferEnd {
                entries: self.counts,
            })),
        };
        let Self { tx, mut answer, .. } = self;
        // A call that ended already says why in its answer.
        let _ = tx.send(end).await;
        drop(tx);
        let deadline = IMPORT_BASE_WAIT + Duration::from_millis(tail / IMPORT_MIN_ENTRIES_PER_MS);
        let answer = match tokio::time::timeout(deadline, &mut answer).await {
            Ok(Ok(a)) => a,
            Ok(Err(e)) => return Err(BrokerError::Peer(format!("the transfer failed: {e}"))),
            Err(_) => {
                answer.abort();
                Err(tonic::Status::deadline_exceeded(format!(
                    "no answer within {deadline:?}"
                )))
            }
        };
        let stored = answer
            .map_err(|s| {
                BrokerError::Peer(format!(
                    "broker at {url} refused the topic: {}",
                    s.message()
                ))
            })?
            .into_inner()
            .entries;
        if stored != expected {
            return Err(BrokerError::Peer(format!(
                "broker at {url} stored {stored} entries of {expected}"
            )));
        }
        Ok((stored, tail))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_topic_being_precopied_is_refused_a_second_move_until_the_first_ends() {
        let (here, there) = (Moving::default(), Moving::default());
        let t = TopicName::parse("persistent://public/default/t").unwrap();
        let first = Precopying::take(&here, &t).unwrap();
        let again = Precopying::take(&here, &t);
        assert!(
            matches!(again, Err(BrokerError::Conflict(ref m)) if m.contains("already moving")),
            "{:?}",
            again.err()
        );
        // Another broker in the same process moves its own copy freely.
        let _elsewhere = Precopying::take(&there, &t).unwrap();
        drop(first);
        Precopying::take(&here, &t).unwrap();
    }
}
