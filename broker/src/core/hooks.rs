//! What features built on the core give it when it opens, so the core
//! calls them without knowing what they are: a partitioned topic's base
//! name is not a topic ([`ReservedNames`]), a topic opened gets its backlog
//! quota ([`TopicOpened`]), and in a cluster a failure event is written on
//! its topic's owner ([`Placement`]).

use crate::error::{BrokerError, Result};
use crate::name::TopicName;
use crate::topic::Topic;
use std::sync::Arc;

/// Names no topic may be created under (a partitioned topic's base name);
/// asked under the registry's lock, so a reservation and a topic creation
/// never race.
pub trait ReservedNames: Send + Sync + std::fmt::Debug {
    /// The error refusing `name` as a topic, when it is reserved.
    fn refuse(&self, name: &TopicName) -> Option<BrokerError>;
}

/// Told of every topic the core opens (at start, on creation, on a move).
pub trait TopicOpened: Send + Sync + std::fmt::Debug {
    /// `topic` was just opened, before anyone can publish to it.
    fn opened(&self, topic: &Topic);
}

/// Where a topic is served, once the broker joined a cluster, and how
/// failure events reach a topic served elsewhere.
#[async_trait::async_trait]
pub trait Placement: Send + Sync + std::fmt::Debug {
    /// `Ok` when `topic` is served here (placing it here when it is placed
    /// nowhere yet); else the error saying where it is served
    /// ([`BrokerError::NotOwner`]).
    async fn serve_here(&self, topic: &TopicName) -> Result<()>;

    /// Writes failure events (`messages`) to the events topic `topic` on
    /// `owner` at `url`, the broker [`Placement::serve_here`] named; `Ok`
    /// once that broker has them durably.
    async fn write_there(
        &self,
        topic: &TopicName,
        (owner, url): (&str, &str),
        messages: Vec<ricochet_proto::OutboundMessage>,
    ) -> Result<()>;
}

/// The features' hooks a core opens with; [`Hooks::default`] has none
/// (nothing reserved, nothing told).
#[derive(Debug, Clone)]
pub struct Hooks {
    /// Names that are not topics.
    pub reserved: Arc<dyn ReservedNames>,
    /// Told of every topic opened.
    pub opened: Arc<dyn TopicOpened>,
}

impl Default for Hooks {
    fn default() -> Self {
        Self {
            reserved: Arc::new(Nothing),
            opened: Arc::new(Nothing),
        }
    }
}

/// No reserved names, no one told.
#[derive(Debug)]
struct Nothing;

impl ReservedNames for Nothing {
    fn refuse(&self, _: &TopicName) -> Option<BrokerError> {
        None
    }
}

impl TopicOpened for Nothing {
    fn opened(&self, _: &Topic) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BrokerConfig;
    use crate::core::BrokerCore;
    use crate::storage::{MemoryStorage, TopicKind};
    use std::sync::Mutex;

    /// Reserves one name; records every topic it is told of.
    #[derive(Debug, Default)]
    struct Recorder {
        reserved: Mutex<Vec<TopicName>>,
        opened: Mutex<Vec<String>>,
    }

    impl ReservedNames for Recorder {
        fn refuse(&self, name: &TopicName) -> Option<BrokerError> {
            crate::util::lock(&self.reserved)
                .contains(name)
                .then(|| BrokerError::Conflict(format!("{name} is reserved")))
        }
    }

    impl TopicOpened for Recorder {
        fn opened(&self, topic: &Topic) {
            crate::util::lock(&self.opened).push(topic.name().to_string());
        }
    }

    #[tokio::test]
    async fn the_core_asks_its_hooks_and_tells_them() {
        let recorder = Arc::new(Recorder::default());
        let hooks = Hooks {
            reserved: recorder.clone(),
            opened: recorder.clone(),
        };
        let dir = tempfile::tempdir().unwrap();
        let core = BrokerCore::open(
            BrokerConfig::for_dir(dir.path()),
            Arc::new(MemoryStorage::new()),
            Default::default(),
            Arc::new(crate::clock::SystemClock),
            hooks,
        )
        .await
        .unwrap();
        let free = TopicName::parse("t/ns/free").unwrap();
        let taken = TopicName::parse("t/ns/taken").unwrap();
        core.reserve_name(&taken, || {
            crate::util::lock(&recorder.reserved).push(taken.clone());
            Ok(())
        })
        .await
        .unwrap();
        // A reserved name is no topic, however it would be created.
        let e = core.create_topic(&taken).await.unwrap_err();
        assert!(matches!(e, BrokerError::TopicExists(_)), "{e}");
        let e = core.topic_for_use(&taken, |_| Ok(())).await.unwrap_err();
        assert!(e.to_string().contains("is reserved"), "{e}");
        let e = core.ensure_topic(&taken).await.unwrap_err();
        assert!(e.to_string().contains("is reserved"), "{e}");
        // A topic's name cannot be reserved.
        core.create_topic(&free).await.unwrap();
        let e = core.reserve_name(&free, || Ok(())).await.unwrap_err();
        assert!(matches!(e, BrokerError::TopicExists(_)), "{e}");
        assert_eq!(
            *crate::util::lock(&recorder.opened),
            vec![free.to_string()],
            "told of the one topic opened"
        );
        assert_eq!(core.all_topics().await[0].kind(), TopicKind::Normal);
    }
}
