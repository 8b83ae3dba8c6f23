//! The cluster's side of moving topics between brokers (drain and
//! `MoveTopic`; the broker copies the data, in its `transfer` module): a topic that is
//! moving is served by nobody — this broker stops at once (its streams end
//! with UNAVAILABLE, new calls are refused), the target only once etcd
//! places the topic there; the hand-over is one etcd transaction that
//! changes the placement and drops this broker's ownership key, and only if
//! the topic is still placed here. A draining broker is registered as such,
//! so placement leaves it out.

use crate::Host;
use crate::cluster::Cluster;
use crate::error::{ClusterError, Result};
use crate::membership::Registration;
use crate::placement;
use crate::sync::{read, write};
use std::sync::atomic::Ordering;

impl Cluster {
    /// What a stream serving `topic` ends with once this broker released it.
    pub fn released_error(&self, topic: &str) -> ClusterError {
        ClusterError::Moving {
            topic: topic.to_owned(),
            from: self.id.clone(),
            to: read(&self.moving)
                .get(topic)
                .cloned()
                .unwrap_or_else(|| "another broker".into()),
        }
    }

    /// Starts moving `topic` to broker `to`: from now on this broker does
    /// not serve it (the streams serving it end).
    pub fn begin_move(&self, topic: &str, to: &str) -> Result<()> {
        if !self.fence.holds() {
            return Err(self.fence.fenced());
        }
        {
            let mut moving = write(&self.moving);
            if let Some(other) = moving.get(topic) {
                return Err(ClusterError::Conflict(format!(
                    "{topic} is already moving to broker {other}"
                )));
            }
            moving.insert(topic.to_owned(), to.to_owned());
        }
        if let Some(o) = write(&self.owned).remove(topic) {
            o.released.cancel();
        }
        Ok(())
    }

    /// The move of `topic` is over (done, or failed before the hand-over:
    /// then the next call about it claims it here again).
    pub fn end_move(&self, topic: &str) {
        write(&self.moving).remove(topic);
    }

    /// Places `topic` on broker `to` and drops this broker's claim, in one
    /// etcd transaction that applies only while the topic is placed here.
    pub async fn hand_over(&self, topic: &str, to: &str) -> Result<()> {
        let moved = self
            .etcd
            .swap_and_delete(
                &self.placement_key(topic),
                &self.id,
                to,
                &self.owner_key(topic),
            )
            .await?;
        if !moved {
            return Err(ClusterError::Conflict(format!(
                "{topic} is no longer placed on broker {}",
                self.id
            )));
        }
        tracing::info!(%topic, from = %self.id, %to, "topic handed over");
        Ok(())
    }

    /// The broker `topic` is placed on, if any (no placing).
    pub async fn placement(&self, topic: &str) -> Result<Option<String>> {
        Ok(self
            .etcd
            .get(&self.placement_key(topic))
            .await?
            .map(|kv| kv.value))
    }

    /// The advertised URL of live broker `id`; `None` when it is not live.
    pub async fn url_of(&self, id: &str) -> Result<Option<String>> {
        Ok(self
            .etcd
            .get(&self.broker_key(id))
            .await?
            .map(|kv| Registration::parse(&kv.value).url)
            .filter(|u| !u.is_empty()))
    }

    /// Where topics leaving this broker go, `n` of them: `to` for all when
    /// given (it must be live, another broker, and not draining), else
    /// spread over the other live brokers that take topics, fewest placed
    /// first. With their URLs.
    pub async fn move_targets(&self, to: Option<&str>, n: usize) -> Result<Vec<(String, String)>> {
        let live: Vec<placement::Candidate> = self
            .live()
            .await?
            .into_iter()
            .filter(|c| c.id != self.id)
            .collect();
        let chosen = match to {
            Some(to) if to == self.id => {
                return Err(ClusterError::InvalidArgument(format!(
                    "the topic is on broker {to} already"
                )));
            }
            Some(to) => {
                if !live.iter().any(|c| c.id == to) {
                    return Err(ClusterError::InvalidArgument(format!(
                        "broker {to} is not live, or is draining"
                    )));
                }
                vec![to.to_owned(); n]
            }
            None => placement::spread(&live, &self.placed_counts().await?, n),
        };
        if chosen.len() < n {
            return Err(ClusterError::Etcd(
                "no other live broker to move topics to".into(),
            ));
        }
        let mut out = Vec::with_capacity(n);
        for id in chosen {
            let url = self
                .url_of(&id)
                .await?
                .ok_or_else(|| ClusterError::Etcd(format!("broker {id} went down")))?;
            out.push((id, url));
        }
        Ok(out)
    }

    /// Registers this broker as draining: no new topic is placed here
    /// (until it restarts).
    pub async fn start_draining(&self) -> Result<()> {
        self.draining.store(true, Ordering::Relaxed);
        self.register().await
    }

    /// Deletes this broker's copies of topics that etcd places elsewhere:
    /// left by a move this broker (the source) crashed in before deleting
    /// its copy, or received (as the target) without the move finishing.
    /// Never served either way; run when the broker joins.
    pub(crate) async fn sweep_moved_away(&self, host: &dyn Host) {
        let strip = format!("{}placement/", self.prefix);
        let placements: std::collections::HashMap<String, String> =
            match self.etcd.get_prefix(&strip).await {
                Ok(kvs) => kvs
                    .into_iter()
                    .filter_map(|kv| Some((kv.key.strip_prefix(&strip)?.to_owned(), kv.value)))
                    .collect(),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read placements to find stale copies");
                    return;
                }
            };
        for topic in host.topics().await {
            let Some(owner) = placements.get(&topic) else {
                continue;
            };
            if *owner == self.id {
                continue;
            }
            tracing::warn!(topic = %topic, %owner, "deleting the stale copy of a topic placed on another broker (an unfinished move)");
            if let Err(e) = host.forget_moved(&topic).await {
                tracing::warn!(topic = %topic, error = %e, "cannot delete a stale copy");
            }
        }
    }
}
