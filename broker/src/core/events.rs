//! Failure events leaving the core: published in the background to their
//! namespace's events topic (here, or in a cluster on its owner, through
//! the [`Placement`](super::Placement) hook), and tracked so a clean stop
//! can wait for them.

use super::BrokerCore;
use crate::error::{BrokerError, Result};
use crate::events::FailureEvent;
use crate::name::TopicName;
use crate::storage::TopicKind;
use ricochet_proto::OutboundMessage;
use std::time::Duration;

impl BrokerCore {
    /// Publishes failure events to their namespaces' events topics in the
    /// background (a failure is a WARN line, never an error of the change);
    /// in a cluster, on the topic's owner ([`Placement::write_there`](super::Placement::write_there)).
    pub(crate) fn emit_events(&self, events: Vec<FailureEvent>) {
        if events.is_empty() {
            return;
        }
        let Some(core) = self.me.upgrade() else {
            return;
        };
        self.events_in_flight.spawn(async move {
            if crate::util::failpoint_armed("events.publish.slow") {
                // Tests: an event still being published when a stop begins.
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            for (name, messages) in crate::events::by_events_topic(events) {
                let written = core.publish_events(&name, messages).await;
                if let Err(e) = written {
                    tracing::warn!(topic = %name, error = %e, "failure events not published");
                }
            }
        });
    }

    /// Writes events to the events topic `name`: here when this broker
    /// owns it (or it is placed here now), else on its owner.
    async fn publish_events(&self, name: &TopicName, messages: Vec<OutboundMessage>) -> Result<()> {
        if let Some(placement) = self.placement.get() {
            match placement.serve_here(name).await {
                Ok(()) => {}
                Err(BrokerError::NotOwner {
                    owner,
                    url: Some(url),
                    ..
                }) => {
                    return placement.write_there(name, (&owner, &url), messages).await;
                }
                Err(e) => return Err(e),
            }
        }
        let entry = self
            .topic_or_create(name, TopicKind::Normal, &|_| Ok(()))
            .await?;
        entry.topic.publish("", messages).await.map(|_| ())
    }
}
