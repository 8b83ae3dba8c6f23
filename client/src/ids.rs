//! Compact message ids for the consumer's trackers. [`TopicIds`] numbers
//! the topics a consumer sees ids from (its main topic, its retry tier)
//! and shares one allocation per topic name between the ids of its
//! messages; a [`Key`] is an id as (topic number, entry id).

use std::sync::Arc;

use crate::message::MessageId;

/// A compact id: (the topic's number in [`TopicIds`], entry id).
pub(crate) type Key = (u32, u64);

/// The topics one consumer sees ids from, numbered in the order first
/// seen. The main topic is whatever number it got; ask [`is_main`](Self::is_main).
///
/// Bounded: past [`CAP`](Self::CAP) names (a broker sending odd topics, an
/// application acking ids of other topics) a new topic gets no number and
/// its name is not shared.
#[derive(Debug)]
pub(crate) struct TopicIds {
    names: Vec<Arc<str>>,
    main: u32,
}

impl TopicIds {
    pub(crate) const CAP: usize = 64;

    /// A table holding `main`, the consumer's main topic.
    pub(crate) fn new(main: &str) -> Self {
        Self {
            names: vec![Arc::from(main)],
            main: 0,
        }
    }

    /// The shared name for `topic`, numbered if new (a new allocation,
    /// without a number, once the table is full).
    pub(crate) fn intern(&mut self, topic: &str) -> Arc<str> {
        if let Some(t) = self.names.iter().find(|t| ***t == *topic) {
            return t.clone();
        }
        let t: Arc<str> = Arc::from(topic);
        self.add(t.clone());
        t
    }

    /// The key of `id`, its topic numbered if new; `None` once the table
    /// is full.
    pub(crate) fn key(&mut self, id: &MessageId) -> Option<Key> {
        let topic = id.topic_arc();
        let i = match self
            .names
            .iter()
            .position(|t| Arc::ptr_eq(t, topic) || **t == **topic)
        {
            Some(i) => i,
            None => self.add(topic.clone())?,
        };
        Some((u32::try_from(i).ok()?, id.entry_id()))
    }

    /// The id a key stands for.
    pub(crate) fn id(&self, key: Key) -> Option<MessageId> {
        let t = self.names.get(key.0 as usize)?;
        Some(MessageId::new(t.clone(), key.1))
    }

    /// Whether `key` is an id of the main topic.
    pub(crate) fn is_main(&self, key: Key) -> bool {
        key.0 == self.main
    }

    fn add(&mut self, topic: Arc<str>) -> Option<usize> {
        if self.names.len() >= Self::CAP {
            return None;
        }
        self.names.push(topic);
        Some(self.names.len() - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_share_names() {
        let mut ids = TopicIds::new("main");
        let retry = ids.intern("main-s-RETRY");
        let again = ids.intern("main-s-RETRY");
        assert!(Arc::ptr_eq(&retry, &again), "one allocation per topic");

        let a = MessageId::new(ids.intern("main"), 7);
        let b = MessageId::new(retry, 7);
        let (ka, kb) = (ids.key(&a).unwrap(), ids.key(&b).unwrap());
        assert_ne!(ka, kb, "same entry id, other topic");
        assert!(ids.is_main(ka));
        assert!(!ids.is_main(kb));
        assert_eq!(ids.id(ka), Some(a));
        assert_eq!(ids.id(kb), Some(b));
        assert_eq!(ids.id((99, 1)), None);

        // An id built by the application (its own allocation) maps to the
        // same key.
        let own = MessageId::new("main", 7);
        assert_eq!(ids.key(&own), Some(ka));
    }

    #[test]
    fn bounded_and_the_main_topic_keeps_its_number() {
        let mut ids = TopicIds::new("main");
        for i in 1..TopicIds::CAP {
            let id = MessageId::new(format!("t{i}"), 1);
            assert_eq!(ids.key(&id), Some((u32::try_from(i).unwrap(), 1)));
        }
        let id = MessageId::new("one-too-many", 1);
        assert_eq!(ids.key(&id), None);
        let extra = ids.intern("one-too-many");
        assert_eq!(&*extra, "one-too-many", "still a valid name");
        assert_eq!(ids.key(&id), None, "not added");
        // Known topics still resolve, the main one as the main one.
        assert_eq!(ids.key(&MessageId::new("t3", 9)), Some((3, 9)));
        let main = ids.key(&MessageId::new("main", 5)).unwrap();
        assert!(ids.is_main(main));
    }
}
