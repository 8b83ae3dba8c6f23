//! The producer of a partitioned topic: one [`TopicProducer`] per
//! partition, all under one name, and the routing between them. A message
//! with a key goes to `ricochet_proto::partitions::partition_for_key` (the
//! broker's and every client's Murmur3 rule); one without goes
//! round-robin, switching partition after a batch's worth of messages so
//! batches stay full. A task looks the partition count up every
//! `partitions_refresh` and opens producers on partitions added since.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, Weak};

use ricochet_proto::partitions::{partition_for_key, partition_name};

use super::queue::Queue;
use super::{ProducerBuilder, ProducerConfig, TopicProducer};
use crate::client::Client;
use crate::error::{Error, Result};
use crate::message::OutgoingMessage;

/// The partitions' producers and the round-robin position.
#[derive(Debug)]
pub(crate) struct Router {
    topic: String,
    name: String,
    client: Client,
    config: ProducerConfig,
    /// The queue shared by every partition.
    queue: Arc<Queue>,
    producers: RwLock<Vec<TopicProducer>>,
    /// Messages sent without a key so far (round-robin position).
    unkeyed: AtomicU64,
    /// Round-robin starts at a random partition, as Pulsar's does, so many
    /// short-lived producers do not all load partition 0.
    start: u64,
}

impl Router {
    /// Opens a producer on each of the `n` partitions of `topic`.
    pub(crate) async fn open(
        client: Client,
        mut config: ProducerConfig,
        topic: String,
        n: u32,
        queue: Arc<Queue>,
    ) -> Result<Arc<Self>> {
        let name = config
            .name
            .clone()
            .unwrap_or_else(|| format!("producer-{}", crate::unique_suffix()));
        config.name = Some(name.clone());
        let router = Arc::new(Self {
            topic,
            name,
            client,
            config,
            queue,
            producers: RwLock::new(Vec::new()),
            unkeyed: AtomicU64::new(0),
            start: rand::random::<u32>().into(),
        });
        router.grow(n).await?;
        let refresh = router.config.partitions_refresh;
        if !refresh.is_zero() {
            tokio::spawn(refresh_task(Arc::downgrade(&router), refresh));
        }
        Ok(router)
    }

    /// Opens producers on partitions `len..n`.
    async fn grow(&self, n: u32) -> Result<()> {
        let have = self.len() as u32;
        for i in have..n {
            let mut builder =
                ProducerBuilder::new(self.client.clone(), partition_name(&self.topic, i))
                    .with_config(self.config.clone());
            builder.queue = Some(self.queue.clone());
            let p = builder.create_topic_producer().await?;
            let mut producers = self.producers.write().unwrap_or_else(|e| e.into_inner());
            // Only one grower runs at a time (open, then the refresh task).
            if producers.len() as u32 == i {
                producers.push(p);
            }
        }
        Ok(())
    }

    pub(crate) fn topic(&self) -> &str {
        &self.topic
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn len(&self) -> usize {
        self.producers
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// The queue its partitions share.
    pub(crate) fn queue(&self) -> &Queue {
        &self.queue
    }

    pub(crate) fn all(&self) -> Vec<TopicProducer> {
        self.producers
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(crate) fn last_sequence_id(&self) -> u64 {
        self.all()
            .iter()
            .map(TopicProducer::last_sequence_id)
            .max()
            .unwrap_or(0)
    }

    /// The producer of the partition `msg` goes to.
    pub(crate) fn route(&self, msg: &OutgoingMessage) -> TopicProducer {
        let producers = self.producers.read().unwrap_or_else(|e| e.into_inner());
        let n = producers.len() as u64;
        let i = if msg.key.is_empty() {
            let per_batch = if self.config.batching {
                self.config.batch_max_messages.max(1) as u64
            } else {
                1
            };
            let k = self.unkeyed.fetch_add(1, Ordering::Relaxed);
            (self.start + k / per_batch) % n
        } else {
            u64::from(partition_for_key(&msg.key, n as u32))
        };
        producers[i as usize].clone()
    }

    /// Closes every partition's producer; the first error is returned.
    pub(crate) async fn close(&self) -> Result<()> {
        let mut first: Option<Error> = None;
        for p in self.all() {
            if let Err(e) = p.close().await {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

/// Looks the partition count up every `every` while the router lives, and
/// opens producers on new partitions.
async fn refresh_task(router: Weak<Router>, every: std::time::Duration) {
    loop {
        tokio::time::sleep(every).await;
        let Some(r) = router.upgrade() else { return };
        if r.all().first().is_some_and(TopicProducer::is_closed) {
            return;
        }
        match crate::partitions::count_once(&r.client, &r.topic).await {
            Ok(Some((_, n))) if n as usize > r.len() => {
                tracing::info!(topic = %r.topic, from = r.len(), to = n, "partitions added; producing to them");
                if let Err(e) = r.grow(n).await {
                    tracing::warn!(topic = %r.topic, error = %e, "could not open a producer on a new partition; retrying at the next refresh");
                }
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(topic = %r.topic, error = %e, "partition look-up failed"),
        }
    }
}
