//! A subscription's consumers: who is connected, how many permits and
//! unacked messages each has, and which one is active (Exclusive and
//! Failover). Election is deterministic: Failover sorts the consumers by
//! name, then join order, and picks the first, as Pulsar does for a
//! non-partitioned topic; on partition `i` of a partitioned topic it picks
//! the `i mod n`-th, as Pulsar does, so the partitions spread over the
//! consumers (each active on about `partitions / n` of them).

use super::requests::{ConsumerEvent, ConsumerId, ConsumerTx};
use crate::error::{BrokerError, Result};
use ricochet_proto::SubscriptionType;

/// One connected consumer.
#[derive(Debug)]
pub(super) struct ConsumerState {
    pub id: ConsumerId,
    pub name: String,
    pub tx: ConsumerTx,
    pub permits: u32,
    pub unacked: usize,
    /// Whether it receives messages from the retry tier.
    pub retry: bool,
    /// Whether it was at the unacked cap when last looked at
    /// (`SubscriptionActor::watch_blocked`).
    pub blocked: bool,
}

impl ConsumerState {
    /// Whether dispatch may hand it one more message.
    pub fn can_take(&self, max_unacked: usize) -> bool {
        self.permits > 0 && self.unacked < max_unacked
    }
}

/// The connected consumers of one subscription.
#[derive(Debug, Default)]
pub(super) struct Consumers {
    list: Vec<ConsumerState>,
    next_id: ConsumerId,
    active: Option<ConsumerId>,
    /// The partition index when the topic is a partition.
    partition: Option<u32>,
}

impl Consumers {
    /// No consumers yet, for a subscription on `topic`.
    pub fn for_topic(topic: &str) -> Self {
        Self {
            partition: ricochet_proto::partitions::parse_partition(topic).map(|(_, i)| i),
            ..Self::default()
        }
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = &ConsumerState> {
        self.list.iter()
    }

    pub fn as_mut_slice(&mut self) -> &mut [ConsumerState] {
        &mut self.list
    }

    pub fn get(&self, id: ConsumerId) -> Option<&ConsumerState> {
        self.list.iter().find(|c| c.id == id)
    }

    pub fn get_mut(&mut self, id: ConsumerId) -> Option<&mut ConsumerState> {
        self.list.iter_mut().find(|c| c.id == id)
    }

    /// The active consumer (Exclusive: the only one; Failover: the elected one).
    pub fn active(&self) -> Option<ConsumerId> {
        self.active
    }

    /// The name of consumer `id` (empty once it left).
    pub fn name_of(&self, id: ConsumerId) -> String {
        self.get(id).map(|c| c.name.clone()).unwrap_or_default()
    }

    /// Sends `event` to consumer `id`, if it is still connected.
    pub fn send(&self, id: ConsumerId, event: ConsumerEvent) {
        if let Some(c) = self.get(id) {
            let _ = c.tx.send(event);
        }
    }

    /// Checks that a consumer of `wanted` type may join a subscription of
    /// type `current` with these consumers.
    pub fn admit(
        &self,
        subscription: &str,
        current: SubscriptionType,
        wanted: SubscriptionType,
    ) -> Result<()> {
        let Some(first) = self.list.first() else {
            return Ok(());
        };
        if current != wanted {
            return Err(BrokerError::Conflict(format!(
                "subscription {subscription} is {} and has consumers; cannot attach a {} consumer",
                current.as_str_name(),
                wanted.as_str_name()
            )));
        }
        if current == SubscriptionType::Exclusive {
            return Err(BrokerError::Conflict(format!(
                "subscription {subscription} is Exclusive and already has consumer {:?}",
                first.name
            )));
        }
        Ok(())
    }

    /// Adds a consumer (already admitted) and returns its id.
    pub fn add(&mut self, name: String, tx: ConsumerTx, retry: bool) -> ConsumerId {
        self.next_id += 1;
        let id = self.next_id;
        self.list.push(ConsumerState {
            id,
            name,
            tx,
            permits: 0,
            unacked: 0,
            retry,
            blocked: false,
        });
        id
    }

    /// Removes a consumer; `None` if it already left.
    pub fn remove(&mut self, id: ConsumerId) -> Option<ConsumerState> {
        let pos = self.list.iter().position(|c| c.id == id)?;
        Some(self.list.remove(pos))
    }

    /// Elects the active consumer and tells those whose role changed (and
    /// `joined`, whatever its role) with an [`ConsumerEvent::Active`].
    /// Only Failover consumers are told; other types take the first.
    pub fn elect(&mut self, sub_type: SubscriptionType, joined: Option<ConsumerId>) {
        if sub_type != SubscriptionType::Failover {
            self.active = self.list.first().map(|c| c.id);
            return;
        }
        let mut sorted: Vec<&ConsumerState> = self.list.iter().collect();
        sorted.sort_by(|a, b| a.name.cmp(&b.name).then(a.id.cmp(&b.id)));
        let new = match sorted.len() {
            0 => None,
            n => Some(sorted[self.partition.unwrap_or(0) as usize % n].id),
        };
        let old = std::mem::replace(&mut self.active, new);
        for c in &self.list {
            let changed = old != new && (Some(c.id) == old || Some(c.id) == new);
            if changed || Some(c.id) == joined {
                let _ = c.tx.send(ConsumerEvent::Active(Some(c.id) == new));
            }
        }
    }

    /// Whether consumer `c` counts as active in stats.
    pub fn is_active(&self, sub_type: SubscriptionType, c: &ConsumerState) -> bool {
        match sub_type {
            SubscriptionType::Failover | SubscriptionType::Exclusive => Some(c.id) == self.active,
            _ => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;

    fn join(
        cs: &mut Consumers,
        name: &str,
    ) -> (ConsumerId, mpsc::UnboundedReceiver<ConsumerEvent>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (cs.add(name.into(), tx.into(), true), rx)
    }

    fn actives(rx: &mut mpsc::UnboundedReceiver<ConsumerEvent>) -> Vec<bool> {
        let mut out = Vec::new();
        while let Ok(ev) = rx.try_recv() {
            if let ConsumerEvent::Active(a) = ev {
                out.push(a);
            }
        }
        out
    }

    #[test]
    fn failover_elects_the_lowest_name_and_tells_only_who_changed() {
        let mut cs = Consumers::default();
        let (b, mut rb) = join(&mut cs, "b");
        cs.elect(SubscriptionType::Failover, Some(b));
        assert_eq!(cs.active(), Some(b));
        assert_eq!(actives(&mut rb), vec![true]);

        let (a, mut ra) = join(&mut cs, "a");
        cs.elect(SubscriptionType::Failover, Some(a));
        assert_eq!(cs.active(), Some(a));
        assert_eq!(actives(&mut ra), vec![true]);
        assert_eq!(actives(&mut rb), vec![false], "b is demoted");

        let (c, mut rc) = join(&mut cs, "c");
        cs.elect(SubscriptionType::Failover, Some(c));
        assert_eq!(actives(&mut rc), vec![false], "a standby is told so");
        assert!(actives(&mut ra).is_empty() && actives(&mut rb).is_empty());

        cs.remove(a);
        cs.elect(SubscriptionType::Failover, None);
        assert_eq!(cs.active(), Some(b));
        assert_eq!(actives(&mut rb), vec![true]);
        assert!(actives(&mut rc).is_empty());
    }

    #[test]
    fn failover_on_partition_i_picks_the_i_mod_n_th_by_name() {
        let mut elected = Vec::new();
        for i in 0..6 {
            let mut cs = Consumers::for_topic(&format!("persistent://a/b/t-partition-{i}"));
            let (b, _rb) = join(&mut cs, "b");
            let (a, _ra) = join(&mut cs, "a");
            let (c, _rc) = join(&mut cs, "c");
            cs.elect(SubscriptionType::Failover, None);
            let name = [(a, "a"), (b, "b"), (c, "c")]
                .into_iter()
                .find(|(id, _)| Some(*id) == cs.active())
                .map(|(_, n)| n);
            elected.push(name.unwrap());
        }
        assert_eq!(elected, ["a", "b", "c", "a", "b", "c"]);
        // A topic that is not a partition keeps the lowest name.
        let mut cs = Consumers::for_topic("persistent://a/b/t");
        let (_b, _rb) = join(&mut cs, "b");
        let (a, _ra) = join(&mut cs, "a");
        cs.elect(SubscriptionType::Failover, None);
        assert_eq!(cs.active(), Some(a));
    }

    #[test]
    fn same_names_fall_back_to_join_order() {
        let mut cs = Consumers::default();
        let (first, _r1) = join(&mut cs, "same");
        let (_second, _r2) = join(&mut cs, "same");
        cs.elect(SubscriptionType::Failover, None);
        assert_eq!(cs.active(), Some(first));
    }

    #[test]
    fn admission_rules() {
        let mut cs = Consumers::default();
        let t = SubscriptionType::Shared;
        assert!(
            cs.admit("s", t, SubscriptionType::Exclusive).is_ok(),
            "empty: anything"
        );
        let _r = join(&mut cs, "x");
        assert!(cs.admit("s", t, SubscriptionType::Shared).is_ok());
        let e = cs.admit("s", t, SubscriptionType::KeyShared).unwrap_err();
        assert!(
            e.to_string()
                .contains("cannot attach a SUBSCRIPTION_TYPE_KEY_SHARED"),
            "{e}"
        );
        let e = cs
            .admit(
                "s",
                SubscriptionType::Exclusive,
                SubscriptionType::Exclusive,
            )
            .unwrap_err();
        assert!(e.to_string().contains("already has consumer \"x\""), "{e}");
    }

    #[test]
    fn capacity_needs_permits_and_room() {
        let (tx, _rx) = mpsc::unbounded_channel();
        let mut c = ConsumerState {
            id: 1,
            name: "c".into(),
            tx: tx.into(),
            permits: 0,
            unacked: 0,
            retry: true,
            blocked: false,
        };
        assert!(!c.can_take(10));
        c.permits = 1;
        assert!(c.can_take(10));
        c.unacked = 10;
        assert!(!c.can_take(10));
    }
}
