//! A topic moving to another broker, on the broker it leaves: its logs
//! sealed and its subscriptions settled before the copy, and taking writes
//! again when the move fails.

use super::BrokerCore;
use crate::error::Result;
use crate::name::TopicName;
use crate::util::lock;
use std::collections::HashMap;

impl BrokerCore {
    /// Stops `name` and its subscriptions' tiers taking writes, lets its
    /// subscriptions settle (their streams have ended) and makes what they
    /// wrote durable; the next id of each log. [`Self::reopen`] undoes it.
    pub(crate) async fn seal_for_move(&self, name: &TopicName) -> Result<HashMap<String, u64>> {
        let entry = self.topic(name).await?;
        let mut next = HashMap::new();
        next.insert(name.to_string(), entry.topic.seal());
        let subs = entry.subscriptions();
        for sub in &subs {
            let tiers = lock(&self.tier_owners).tiers_of(name.as_str(), sub.name());
            if let Some((retry, dlq)) = tiers {
                for tier in [retry, dlq] {
                    if let Ok(t) = TopicName::parse_stored(&tier)
                        && let Some(e) = self.topics.lock().await.get(&t)
                    {
                        next.insert(tier, e.topic.seal());
                    }
                }
            }
        }
        // A round trip through each actor's queue once no log takes writes
        // (its tier moves included): what it was doing is then in storage.
        for sub in &subs {
            let _ = sub.policy().await;
        }
        self.storage.flush().await?;
        Ok(next)
    }

    /// Takes writes again on the logs [`Self::seal_for_move`] sealed (the
    /// move failed before the topic changed hands).
    pub(crate) async fn reopen(&self, logs: impl IntoIterator<Item = String>) {
        let topics = self.topics.lock().await;
        for log in logs {
            if let Some(e) = TopicName::parse_stored(&log)
                .ok()
                .and_then(|n| topics.get(&n))
            {
                e.topic.unseal();
            }
        }
    }
}
