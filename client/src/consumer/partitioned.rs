//! A consumer of a partitioned topic: one ordinary consumer (stream,
//! driver, flow permits, trackers, reconnects) per partition, all under the
//! same subscription and consumer name, merged into one [`Consumer`].
//!
//! One stream per partition rather than one multiplexed stream: each
//! partition is an ordinary topic on the broker with its own subscription
//! actor, so a stream per partition reuses the whole single-topic consumer
//! (flow control, ack grouping, nack and ack-timeout trackers, reconnects)
//! unchanged, and it is what a later cluster needs, where partitions live
//! on different brokers. Settling goes to the partition the message came
//! from: [`Ackers`] maps each topic a message arrived from (a partition,
//! or its retry tier) to that partition's acker. The broker's rules apply
//! per partition: Failover elects consumer `i mod n` (by name) on partition
//! `i`, spreading partitions over consumers as Pulsar does; Key_Shared
//! hashes keys within a partition, and since a producer sends a key to one
//! partition, a key stays with one consumer.
//!
//! A task looks the partition count up every `partitions_refresh` and
//! subscribes to partitions added since (the broker gave them the
//! subscription when they were added, from their first message).

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64};
use std::sync::{Arc, RwLock, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::stream::{SelectAll, Stream, StreamExt};
use ricochet_proto::partitions::partition_name;
use tokio::sync::mpsc;

use super::shared::{ACTIVE_UNKNOWN, Shared, TakenTracking};
use super::{Acker, Consumer, ConsumerConfig};
use crate::client::Client;
use crate::error::{Error, Result};
use crate::message::Message;

type Tagged = Pin<Box<dyn Stream<Item = (usize, Result<Message>)> + Send + Sync>>;

/// The partitions' ackers, and which partition each topic belongs to.
#[derive(Debug, Default)]
pub(crate) struct Ackers {
    inner: RwLock<AckersInner>,
}

#[derive(Debug, Default)]
struct AckersInner {
    /// By partition index.
    ackers: Vec<Acker>,
    /// Topic a message came from (partition or tier) → partition index.
    topics: HashMap<String, usize>,
}

impl Ackers {
    /// The acker for messages of `topic`.
    pub(crate) fn for_topic(&self, topic: &str) -> Result<Acker> {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        inner
            .topics
            .get(topic)
            .and_then(|i| inner.ackers.get(*i))
            .cloned()
            .ok_or_else(|| {
                Error::invalid_argument(format!(
                    "no message of {topic} was delivered to this consumer"
                ))
            })
    }

    /// Every partition's acker.
    pub(crate) fn all(&self) -> Vec<Acker> {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .ackers
            .clone()
    }

    fn add(&self, acker: Acker) -> usize {
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let i = inner.ackers.len();
        inner.topics.insert(acker.shared.topic.clone(), i);
        inner.ackers.push(acker);
        i
    }

    fn note(&self, topic: &str, i: usize) {
        if self
            .inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .topics
            .contains_key(topic)
        {
            return;
        }
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        inner.topics.insert(topic.to_owned(), i);
    }
}

/// The merged deliveries of every partition.
pub(crate) struct Merged {
    streams: SelectAll<Tagged>,
    added: mpsc::UnboundedReceiver<Tagged>,
    ackers: Arc<Ackers>,
}

impl std::fmt::Debug for Merged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Merged")
            .field("partitions", &self.streams.len())
            .finish_non_exhaustive()
    }
}

impl Merged {
    /// The partitions subscribed at first are in the set from the start,
    /// never behind the channel: a receive that found the channel
    /// `Pending` (tokio's cooperative budget makes a non-empty channel
    /// answer `Pending` once a task has used its budget) would have polled
    /// an empty set, which ends, and the consumer answered `Closed`. Only
    /// partitions added later come through `added`; the set ends once every
    /// stream in it has ended.
    fn new(
        first: Vec<Tagged>,
        added: mpsc::UnboundedReceiver<Tagged>,
        ackers: Arc<Ackers>,
    ) -> Self {
        let mut streams = SelectAll::new();
        streams.extend(first);
        Self {
            streams,
            added,
            ackers,
        }
    }

    pub(crate) fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Message>>> {
        while let Poll::Ready(Some(s)) = self.added.poll_recv(cx) {
            self.streams.push(s);
        }
        match self.streams.poll_next_unpin(cx) {
            Poll::Ready(Some((i, item))) => {
                if let Ok(m) = &item {
                    self.ackers.note(m.id().topic(), i);
                }
                Poll::Ready(Some(item))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// What the refresh task needs to subscribe to new partitions.
struct Grower {
    client: Client,
    topic: String,
    cfg: ConsumerConfig,
    ackers: Weak<Ackers>,
    added: mpsc::UnboundedSender<Tagged>,
    closed: Arc<Shared>,
}

impl Grower {
    /// Subscribes to partitions `have..n`, pushing each one's tagged stream
    /// onto `streams` as it subscribes (those before a failure stay there).
    async fn grow(&self, have: usize, n: u32, streams: &mut Vec<Tagged>) -> Result<()> {
        for i in have as u32..n {
            let c =
                super::ConsumerBuilder::new(self.client.clone(), partition_name(&self.topic, i))
                    .with_config(self.cfg.clone())
                    .subscribe_topic()
                    .await?;
            let Some(ackers) = self.ackers.upgrade() else {
                return Err(Error::closed());
            };
            let index = ackers.add(c.acker());
            streams.push(Box::pin(c.map(move |m| (index, m))));
        }
        Ok(())
    }

    /// Subscribes to partitions `have..n` and hands their streams to the
    /// merged consumer, those subscribed before a failure too.
    async fn add(&self, have: usize, n: u32) -> Result<()> {
        let mut streams = Vec::new();
        let grown = self.grow(have, n, &mut streams).await;
        for s in streams {
            self.added.send(s).map_err(|_| Error::closed())?;
        }
        grown
    }
}

/// Subscribes to the `n` partitions of `topic` and merges them.
pub(crate) async fn subscribe(
    client: Client,
    topic: String,
    cfg: ConsumerConfig,
    n: u32,
) -> Result<Consumer> {
    if cfg.retry_topic.is_some() || cfg.dead_letter_topic.is_some() {
        return Err(Error::invalid_argument(
            "retry and dead-letter topic overrides name one topic, but each partition of a partitioned topic has its own tiers; leave them to the broker",
        ));
    }
    let ackers = Arc::new(Ackers::default());
    let (added_tx, added_rx) = mpsc::unbounded_channel();
    let shared = Arc::new(Shared {
        topic: topic.clone(),
        subscription: cfg.subscription.clone(),
        consumer_name: cfg.consumer_name.clone().unwrap_or_default(),
        subscription_type: cfg.subscription_type,
        epoch: AtomicU64::new(1),
        consumed: AtomicU32::new(0),
        refill_threshold: u32::MAX,
        active: AtomicU8::new(ACTIVE_UNKNOWN),
        closed: AtomicBool::new(false),
        track_taken: TakenTracking::of(cfg.ack_timeout, cfg.ack_group_time),
        receipts: cfg.ack_receipts,
        keeps_copies: false,
        request_timeout: client.config().request_timeout,
        outcome: std::sync::OnceLock::new(),
    });
    let refresh = cfg.partitions_refresh;
    let grower = Grower {
        client,
        topic,
        cfg,
        ackers: Arc::downgrade(&ackers),
        added: added_tx,
        closed: shared.clone(),
    };
    let mut first = Vec::new();
    if let Err(e) = grower.grow(0, n, &mut first).await {
        for a in ackers.all() {
            let _ = a.close_partition().await;
        }
        return Err(e);
    }
    if !refresh.is_zero() {
        tokio::spawn(refresh_task(grower, n as usize, refresh));
    }
    // The outer acker's own channel is never used: every call goes to a
    // partition's acker.
    let (tx, _) = super::commands::channel();
    let acker = Acker {
        tx,
        shared,
        parts: Some(ackers.clone()),
    };
    Ok(Consumer::partitioned(
        Merged::new(first, added_rx, ackers),
        acker,
    ))
}

async fn refresh_task(grower: Grower, mut have: usize, every: Duration) {
    use std::sync::atomic::Ordering;
    loop {
        tokio::time::sleep(every).await;
        if grower.closed.closed.load(Ordering::Acquire) || grower.ackers.strong_count() == 0 {
            return;
        }
        match crate::partitions::count_once(&grower.client, &grower.topic).await {
            Ok(Some((_, n))) if n as usize > have => {
                tracing::info!(topic = %grower.topic, from = have, to = n, "partitions added; subscribing to them");
                match grower.add(have, n).await {
                    Ok(()) => have = n as usize,
                    Err(e) => {
                        tracing::warn!(topic = %grower.topic, error = %e, "could not subscribe to a new partition; retrying at the next refresh");
                        // The ones that did subscribe are counted.
                        if let Some(a) = grower.ackers.upgrade() {
                            have = a.all().len();
                        }
                    }
                }
            }
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(topic = %grower.topic, error = %e, "partition look-up failed")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending_stream() -> Tagged {
        Box::pin(futures::stream::pending())
    }

    /// A task that used its cooperative budget before it receives still
    /// sees its partitions: the merge is not empty, so it waits rather
    /// than ends (it ended, and the consumer answered `Closed` mid-run).
    #[tokio::test]
    async fn a_receive_after_the_budget_is_used_waits_rather_than_ends() {
        let (_added_tx, added_rx) = mpsc::unbounded_channel();
        let mut merged = Merged::new(
            vec![pending_stream(), pending_stream()],
            added_rx,
            Arc::default(),
        );
        let (tx, mut rx) = mpsc::unbounded_channel();
        for i in 0..1000 {
            tx.send(i).unwrap();
        }
        let polled = std::future::poll_fn(|cx| {
            // Use the task's budget on a channel that has items: it
            // answers `Pending` once the budget is gone.
            let mut taken = 0;
            while let Poll::Ready(Some(_)) = rx.poll_recv(cx) {
                taken += 1;
            }
            assert!(taken < 1000, "the budget ran out before the channel did");
            Poll::Ready(merged.poll_next(cx).map(|m| m.map(|r| r.is_ok())))
        })
        .await;
        assert_eq!(
            polled,
            Poll::Pending,
            "two pending partitions: nothing yet, not the end"
        );
    }

    /// Partitions added later come through the channel and are merged.
    #[tokio::test]
    async fn partitions_added_later_are_merged_and_the_set_ends_with_them() {
        let (added_tx, added_rx) = mpsc::unbounded_channel();
        let mut merged = Merged::new(Vec::new(), added_rx, Arc::default());
        let later: Tagged = Box::pin(futures::stream::iter([(
            0,
            Err(Error::invalid_argument("a partition's item")),
        )]));
        added_tx.send(later).unwrap();
        let first = std::future::poll_fn(|cx| merged.poll_next(cx)).await;
        assert!(matches!(first, Some(Err(_))), "{first:?}");
        let end = std::future::poll_fn(|cx| merged.poll_next(cx)).await;
        assert!(end.is_none(), "every stream ended");
    }
}
