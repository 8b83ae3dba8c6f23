//! The subscription actor on virtual time (its tests live with the core
//! they run through): a broker core over
//! [`MemoryStorage`](crate::storage::MemoryStorage) and a
//! [`TokioClock`](crate::clock::TokioClock), driven through the same
//! handle API the gRPC service uses. An hour-long retry takes an hour of
//! virtual time and no real time.

use crate::clock::{Clock, TokioClock};
use crate::config::BrokerConfig;
use crate::core::{BrokerCore, TopicEntry};
use crate::name::{SubscriptionName, TopicName};
use crate::storage::prelude::*;
use crate::storage::{MemoryStorage, TierEntry};
use crate::subscription::*;
use ricochet_policy::{AttemptOverride, PolicyRegistry, PolicySpec};
use ricochet_proto::{InitialPosition, Message, OutboundMessage, SubscriptionType, props};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

pub(super) struct Harness<S = MemoryStorage> {
    pub(super) core: Arc<BrokerCore>,
    pub(super) storage: Arc<S>,
    pub(super) clock: Arc<TokioClock>,
    pub(super) entry: Arc<TopicEntry>,
}

const TOPIC: &str = "persistent://public/default/orders";
const RETRY: &str = "persistent://public/default/orders-billing-RETRY";

pub(super) async fn harness() -> Harness {
    harness_on(Arc::new(MemoryStorage::new())).await
}

/// A broker core on `storage` (a restart when a core used it before).
pub(super) async fn harness_on<S: Storage + 'static>(storage: Arc<S>) -> Harness<S> {
    let clock = Arc::new(TokioClock::starting_at_us(1_700_000_000_000_000));
    // Sync durability; the periodic flush would only add virtual-time ticks.
    let config = BrokerConfig {
        flush_interval: Duration::from_secs(3600),
        ..BrokerConfig::for_dir("unused")
    };
    let core = BrokerCore::open(
        config,
        storage.clone(),
        PolicyRegistry::default(),
        clock.clone(),
        crate::core::Hooks::default(),
    )
    .await
    .unwrap();
    let entry = core
        .topic_for_use(&TopicName::parse(TOPIC).unwrap(), |_| Ok(()))
        .await
        .unwrap();
    Harness {
        core,
        storage,
        clock,
        entry,
    }
}

pub(super) struct TestConsumer {
    id: ConsumerId,
    pub(super) handle: SubscriptionHandle,
    rx: mpsc::UnboundedReceiver<ConsumerEvent>,
    next_request: u64,
}

/// Receives `n` messages on `c`.
pub(super) async fn receive(c: &mut TestConsumer, n: usize) -> Vec<Message> {
    let mut got = Vec::with_capacity(n);
    while got.len() < n {
        got.extend(c.messages().await);
    }
    got
}

/// `reconsume_later`s of `msgs`, `delay` each, all answered; the messages
/// that came back meanwhile.
pub(super) async fn reconsume_all(
    c: &mut TestConsumer,
    msgs: &[Message],
    delay: Duration,
) -> Vec<Message> {
    let rids: Vec<u64> = msgs.iter().map(|m| c.reconsume(m, delay)).collect();
    let mut got = Vec::new();
    c.all_done_keeping(&rids, &mut got).await;
    got
}

impl<S: Storage> Harness<S> {
    /// The due times (ms) of the first ten schedule entries, in the
    /// schedule's order.
    pub(super) fn due_times(&self) -> Vec<u64> {
        self.storage
            .scheduled(None, u64::MAX, 10)
            .unwrap()
            .into_iter()
            .map(|k| k.due_ms)
            .collect()
    }
}

impl<S> Harness<S> {
    /// Publishes `m0`..`m{n-1}`, subscribes one Shared consumer with
    /// permits for `permits` and receives the first `n` deliveries.
    pub(super) async fn shared_burst(
        &self,
        n: usize,
        permits: u32,
    ) -> (TestConsumer, Vec<Message>) {
        let payloads: Vec<String> = (0..n).map(|i| format!("m{i}")).collect();
        self.publish(&payloads.iter().map(String::as_str).collect::<Vec<_>>())
            .await;
        let mut c = self.consumer(SubscriptionType::Shared, None).await;
        if permits > 0 {
            c.flow(permits);
        }
        let first = receive(&mut c, n).await;
        (c, first)
    }

    pub(super) async fn publish(&self, payloads: &[&str]) {
        let msgs = payloads
            .iter()
            .enumerate()
            .map(|(i, p)| OutboundMessage {
                payload: p.as_bytes().to_vec(),
                key: format!("k{i}"),
                sequence_id: i as u64,
                ..Default::default()
            })
            .collect();
        self.entry.topic.publish("", msgs).await.unwrap();
    }

    pub(super) async fn consumer(
        &self,
        sub_type: SubscriptionType,
        policy: Option<&str>,
    ) -> TestConsumer {
        let handle = self
            .core
            .subscription_or_create(
                &self.entry,
                &SubscriptionName::parse("billing").unwrap(),
                sub_type,
                InitialPosition::Earliest,
                &Default::default(),
            )
            .await
            .unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let spec = ConsumerSpec {
            name: "c1".into(),
            sub_type,
            tx: tx.into(),
            policy: policy.map(|p| p.parse::<PolicySpec>().unwrap()),
            retry_enabled: true,
            key_order: None,
        };
        let (id, _) = handle.add_consumer(spec).await.unwrap();
        assert!(matches!(
            rx.recv().await,
            Some(ConsumerEvent::Subscribed { .. })
        ));
        handle.request(id, ConsumerRequest::Flow(100)).unwrap();
        TestConsumer {
            id,
            handle,
            rx,
            next_request: 1,
        }
    }
}

impl TestConsumer {
    /// The next messages, skipping other events.
    pub(super) async fn messages(&mut self) -> Vec<ricochet_proto::Message> {
        loop {
            match self.rx.recv().await.expect("consumer stream open") {
                ConsumerEvent::Messages(m) => return m,
                ConsumerEvent::Done {
                    outcome: Err(e), ..
                } => panic!("request failed: {e}"),
                _ => {}
            }
        }
    }

    /// Messages arriving within `wait` of virtual time, if any.
    pub(super) async fn messages_within(
        &mut self,
        wait: Duration,
    ) -> Option<Vec<ricochet_proto::Message>> {
        tokio::time::timeout(wait, self.messages()).await.ok()
    }

    fn send(&mut self, make: impl FnOnce(u64) -> ConsumerRequest) -> u64 {
        let rid = self.next_request;
        self.next_request += 1;
        self.handle.request(self.id, make(rid)).unwrap();
        rid
    }

    /// Waits for the outcome of request `rid`.
    pub(super) async fn done(&mut self, rid: u64) -> Outcome {
        loop {
            if let ConsumerEvent::Done {
                request_id,
                outcome,
            } = self.rx.recv().await.expect("consumer stream open")
                && request_id == rid
            {
                return outcome;
            }
        }
    }

    /// Waits until requests `rids` are all answered (in whichever order),
    /// asserting each succeeded, keeping the messages that arrive meanwhile
    /// in `kept`.
    pub(super) async fn all_done_keeping(
        &mut self,
        rids: &[u64],
        kept: &mut Vec<ricochet_proto::Message>,
    ) {
        let mut left: std::collections::HashSet<u64> = rids.iter().copied().collect();
        while !left.is_empty() {
            match self.rx.recv().await.expect("consumer stream open") {
                ConsumerEvent::Done {
                    request_id,
                    outcome,
                } => {
                    assert!(outcome.is_ok(), "request {request_id}: {outcome:?}");
                    left.remove(&request_id);
                }
                ConsumerEvent::Messages(m) => kept.extend(m),
                _ => {}
            }
        }
    }

    pub(super) fn id(&self) -> ConsumerId {
        self.id
    }

    /// Grants more flow permits.
    pub(super) fn flow(&self, permits: u32) {
        self.handle
            .request(self.id, ConsumerRequest::Flow(permits))
            .unwrap();
    }

    pub(super) fn nack(&mut self, m: &ricochet_proto::Message) -> u64 {
        self.nack_held(m, Duration::ZERO)
    }

    /// Nacks whose delays the broker serves, in one request.
    pub(super) fn nack_all_held(
        &mut self,
        msgs: &[ricochet_proto::Message],
        hold: Duration,
    ) -> u64 {
        let items = msgs
            .iter()
            .map(|m| FailedItem {
                id: wire(m),
                reason: ricochet_policy::FailureReason::Nack,
                detail: "nope".into(),
                hold,
                ahead: false,
                local: false,
            })
            .collect();
        self.send(|request_id| ConsumerRequest::Redeliver { request_id, items })
    }

    /// A cumulative ack through `m`.
    pub(super) fn ack_through(&mut self, m: &ricochet_proto::Message) -> u64 {
        let id = wire(m);
        self.send(|request_id| ConsumerRequest::Ack {
            request_id,
            ids: vec![id],
            cumulative: true,
        })
    }

    /// A nack whose delay the broker serves.
    pub(super) fn nack_held(&mut self, m: &ricochet_proto::Message, hold: Duration) -> u64 {
        let id = wire(m);
        self.send(|request_id| ConsumerRequest::Redeliver {
            request_id,
            items: vec![FailedItem {
                id,
                reason: ricochet_policy::FailureReason::Nack,
                detail: "nope".into(),
                hold,
                ahead: false,
                local: false,
            }],
        })
    }

    /// A client-held nack announced when made (`FailedItem::ahead`).
    fn nack_ahead(&mut self, m: &ricochet_proto::Message) -> u64 {
        self.held_nack(m, true, false)
    }

    /// A nack counted ahead that the client redelivered itself when due
    /// (`FailedItem::local`).
    fn redelivered_locally(&mut self, m: &ricochet_proto::Message) -> u64 {
        self.held_nack(m, false, true)
    }

    fn held_nack(&mut self, m: &ricochet_proto::Message, ahead: bool, local: bool) -> u64 {
        let id = wire(m);
        self.send(|request_id| ConsumerRequest::Redeliver {
            request_id,
            items: vec![FailedItem {
                id,
                reason: ricochet_policy::FailureReason::Nack,
                detail: "held".into(),
                hold: Duration::ZERO,
                ahead,
                local,
            }],
        })
    }

    /// The next `CountedAhead` notice: (entry id, delivery count) pairs.
    async fn counted_ahead(&mut self) -> Vec<(u64, u32)> {
        let notice = async {
            loop {
                if let ConsumerEvent::CountedAhead(c) =
                    self.rx.recv().await.expect("consumer stream open")
                {
                    return c.into_iter().map(|(id, n)| (id.entry_id, n)).collect();
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(60), notice)
            .await
            .expect("a CountedAhead notice")
    }

    pub(super) fn reconsume(&mut self, m: &ricochet_proto::Message, delay: Duration) -> u64 {
        self.reconsume_waited(m, delay, Duration::ZERO)
    }

    /// A `reconsume_later` that waited `waited` in the client before it was sent.
    pub(super) fn reconsume_waited(
        &mut self,
        m: &ricochet_proto::Message,
        delay: Duration,
        waited: Duration,
    ) -> u64 {
        let id = wire(m);
        self.send(|request_id| ConsumerRequest::ReconsumeLater {
            request_id,
            id,
            delay: AttemptOverride::Delay(delay),
            properties: Default::default(),
            detail: "later".into(),
            waited,
        })
    }

    pub(super) fn ack(&mut self, m: &ricochet_proto::Message) -> u64 {
        let id = wire(m);
        self.send(|request_id| ConsumerRequest::Ack {
            request_id,
            ids: vec![id],
            cumulative: false,
        })
    }
}

pub(super) fn wire(m: &ricochet_proto::Message) -> MessageRef {
    let id = m.id.clone().unwrap();
    MessageRef {
        topic: id.topic,
        entry_id: id.entry_id,
    }
}

pub(super) fn text(m: &ricochet_proto::Message) -> &str {
    std::str::from_utf8(&m.payload).unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_nack_without_policy_redelivers_in_place_with_a_persisted_count() {
    let h = harness().await;
    h.publish(&["a", "b"]).await;
    let mut c = h.consumer(SubscriptionType::Exclusive, None).await;
    let first = c.messages().await;
    assert_eq!(first.iter().map(text).collect::<Vec<_>>(), ["a", "b"]);
    assert!(first.iter().all(|m| m.delivery_count == 0));
    let rid = c.nack(&first[0]);
    assert!(c.done(rid).await.is_ok());
    let again = c.messages().await;
    assert_eq!(again.len(), 1);
    assert_eq!((text(&again[0]), again[0].delivery_count), ("a", 1));
    assert_eq!(
        again[0].id.as_ref().unwrap().topic,
        TOPIC,
        "redelivered in place"
    );
    let stored = h
        .storage
        .failure(TierEntry::main(0).of(c.handle.id()), None)
        .unwrap()
        .unwrap();
    assert_eq!(stored.count, 1);
    assert_eq!(stored.attempts[0].detail, "nope");
    // Acking settles it: the record goes.
    let rid = c.ack(&again[0]);
    assert!(c.done(rid).await.is_ok());
    assert_eq!(
        h.storage
            .failure(TierEntry::main(0).of(c.handle.id()), None)
            .unwrap(),
        None
    );
}

#[tokio::test(start_paused = true)]
async fn a_nack_the_broker_holds_comes_back_in_place_after_its_delay() {
    let h = harness().await;
    h.publish(&["a", "b"]).await;
    let mut c = h.consumer(SubscriptionType::Exclusive, None).await;
    let first = c.messages().await;
    let rid = c.nack_held(&first[0], Duration::from_secs(600));
    // The hold starts at the next whole millisecond (never ends early).
    let asked = h.clock.now_us().div_ceil(1000);
    assert!(
        c.done(rid).await.is_ok(),
        "confirmed once the count is durable"
    );
    let sub = c.handle.id();
    let stored = h
        .storage
        .failure(TierEntry::main(0).of(sub), None)
        .unwrap()
        .unwrap();
    assert_eq!((stored.count, stored.hold_until_ms), (1, asked + 600_000));
    let status = c.handle.message_status(0).await.unwrap();
    assert_eq!(status.state, MessageState::Scheduled);
    assert!(
        c.messages_within(Duration::from_secs(599)).await.is_none(),
        "held for its delay"
    );
    let again = c.messages().await.remove(0);
    assert_eq!((text(&again), again.delivery_count), ("a", 1));
    assert_eq!(
        again.id.as_ref().unwrap().topic,
        TOPIC,
        "in place, not in the retry tier"
    );
    assert!(h.clock.now_ms() - (asked + 600_000) <= 5);
    // Acking it removes its schedule entry too.
    let rid = c.ack(&again);
    assert!(c.done(rid).await.is_ok());
    assert!(h.storage.scheduled(None, u64::MAX, 10).unwrap().is_empty());
}

/// A nack the broker holds is parked compactly: its failure record (with
/// the attempt history) stays in storage only, and the actor keeps the
/// delivery count. Status reads come from storage, and the message comes
/// back with its count.
#[tokio::test(start_paused = true)]
async fn a_held_nack_keeps_its_failure_record_in_storage_only() {
    let h = harness().await;
    h.publish(&["a"]).await;
    let mut c = h.consumer(SubscriptionType::Exclusive, None).await;
    let m = c.messages().await.remove(0);
    let rid = c.nack_held(&m, Duration::from_secs(60));
    assert!(c.done(rid).await.is_ok());
    let key = TierEntry::main(0).of(c.handle.id());
    let mut stored = h.storage.failure(key, None).unwrap().unwrap();
    assert_eq!(stored.attempts.len(), 1);
    // Change the stored record behind the actor's back: a status read that
    // sees the change read storage, not a copy held in memory.
    stored.attempts[0].detail = "edited in storage".into();
    h.storage.put_failures(&[(key, Some(stored))]).unwrap();
    let status = c.handle.message_status(0).await.unwrap();
    assert_eq!(status.state, MessageState::Scheduled);
    let failures = status.failures.expect("a failure record");
    assert_eq!(failures.attempts[0].detail, "edited in storage");
    let again = c.messages().await.remove(0);
    assert_eq!((text(&again), again.delivery_count), ("a", 1));
    // Failing it again counts on from the stored record.
    let rid = c.nack_held(&again, Duration::from_secs(60));
    assert!(c.done(rid).await.is_ok());
    let stored = h.storage.failure(key, None).unwrap().unwrap();
    assert_eq!(stored.count, 2);
    assert_eq!(stored.attempts[0].detail, "edited in storage");
    let third = c.messages().await.remove(0);
    assert_eq!(third.delivery_count, 2);
}

/// After a restart a subscription reads its backlog again from its mark:
/// a stretch of more than a read-ahead of held nacks (skipped, the schedule
/// brings them back) must not stop it from reaching the message after them.
#[tokio::test(start_paused = true)]
async fn a_fresh_message_behind_many_held_nacks_is_delivered_after_a_restart() {
    const HELD: usize = 6_000;
    let h = harness().await;
    let payloads = vec!["held"; HELD];
    h.publish(&payloads).await;
    let mut c = h.consumer(SubscriptionType::Shared, None).await;
    let mut held = 0;
    while held < HELD {
        let batch = c.messages().await;
        let n = batch.len();
        let items = batch
            .iter()
            .map(|m| FailedItem {
                id: wire(m),
                reason: ricochet_policy::FailureReason::Nack,
                detail: String::new(),
                hold: Duration::from_secs(3600),
                ahead: false,
                local: false,
            })
            .collect();
        let rid = c.send(|request_id| ConsumerRequest::Redeliver { request_id, items });
        assert!(c.done(rid).await.is_ok());
        held += n;
        c.handle
            .request(c.id, ConsumerRequest::Flow(n as u32))
            .unwrap();
    }
    let storage = h.storage.clone();
    h.core.stop_clean().await.unwrap();
    drop((c, h));
    let read_before = storage.entries_read();
    let h = harness_on(storage.clone()).await;
    let mut c = h.consumer(SubscriptionType::Shared, None).await;
    h.publish(&["fresh"]).await;
    let got = c
        .messages_within(Duration::from_secs(10))
        .await
        .expect("the fresh message is delivered");
    assert_eq!(text(&got[0]), "fresh");
    assert_eq!(got[0].id.as_ref().unwrap().entry_id, HELD as u64);
    // The held messages were passed in memory, not read from the log to
    // be skipped (that read all 6 000 of them).
    let read = storage.entries_read() - read_before;
    assert!(
        read < 10,
        "{read} log entries read to reach the fresh message"
    );
}

#[tokio::test(start_paused = true)]
async fn an_hour_long_retry_waits_an_hour_of_virtual_time() {
    let h = harness().await;
    h.publish(&["order"]).await;
    let mut c = h.consumer(SubscriptionType::Shared, None).await;
    let m = c.messages().await.remove(0);
    let rid = c.reconsume(&m, Duration::from_secs(3600));
    assert!(c.done(rid).await.is_ok());
    let asked = h.clock.now_ms();
    assert!(
        c.messages_within(Duration::from_secs(3599)).await.is_none(),
        "nothing before the hour is up"
    );
    let retry = c.messages().await.remove(0);
    let late = h.clock.now_ms() - (asked + 3_600_000);
    assert!(late <= 5, "{late} ms late");
    assert_eq!(retry.id.as_ref().unwrap().topic, RETRY);
    assert_eq!(retry.delivery_count, 1);
    let p = &retry.properties;
    assert_eq!(p[props::RECONSUME_TIMES], "1");
    assert_eq!(p[props::DELAY_TIME], "3600000");
    assert_eq!(p[props::ORIGIN_MESSAGE_ID], format!("{TOPIC}:0"));
    assert_eq!(p[props::REAL_TOPIC], TOPIC);
    let stats = c.handle.stats(h.storage.clone()).await.unwrap();
    assert_eq!(stats.unacked, 1);
}

#[tokio::test(start_paused = true)]
async fn delay_levels_walk_a_message_into_the_dead_letter_tier() {
    let h = harness().await;
    h.publish(&["poison"]).await;
    let policy = "delay-levels:levels=1m 10m,start=1,max=2";
    let mut c = h.consumer(SubscriptionType::Failover, Some(policy)).await;
    let mut m = c.messages().await.remove(0);
    for (attempt, wait) in [(1, 60_000), (2, 600_000)] {
        let before = h.clock.now_ms();
        let rid = c.nack(&m);
        assert!(c.done(rid).await.is_ok());
        m = c.messages().await.remove(0);
        let waited = h.clock.now_ms() - before;
        assert!(
            (wait..wait + 10).contains(&waited),
            "attempt {attempt}: waited {waited} ms"
        );
        assert_eq!(m.delivery_count, attempt);
        assert_eq!(m.id.as_ref().unwrap().topic, RETRY);
    }
    let rid = c.nack(&m);
    assert!(c.done(rid).await.is_ok());
    assert!(
        c.messages_within(Duration::from_secs(24 * 3600))
            .await
            .is_none()
    );
    let sub = c.handle.id();
    let dead = h.storage.dead_letters(sub, None).unwrap();
    assert_eq!(dead.len(), 1);
    let (_, record) = &dead[0];
    assert_eq!(record.reason, "attempt 3 exceeds max_reconsume_times 2");
    assert_eq!(
        (record.origin_topic.as_str(), record.origin_entry_id),
        (TOPIC, 0)
    );
    assert_eq!(record.failures.attempts.len(), 3);
    let stats = c.handle.stats(h.storage.clone()).await.unwrap();
    assert_eq!(
        (stats.dead_lettered, stats.unacked, stats.scheduled_retries),
        (1, 0, 0)
    );
}

#[tokio::test(start_paused = true)]
async fn a_lost_consumer_is_charged_an_attempt_a_closed_one_is_not() {
    let h = harness().await;
    h.publish(&["x"]).await;
    let mut c = h.consumer(SubscriptionType::Shared, None).await;
    let m = c.messages().await.remove(0);
    assert_eq!(m.delivery_count, 0);
    c.handle.request(c.id, ConsumerRequest::Close).unwrap();
    let mut c2 = h.consumer(SubscriptionType::Shared, None).await;
    let m = c2.messages().await.remove(0);
    assert_eq!(m.delivery_count, 0, "a clean close gives it back uncounted");
    c2.handle.remove_consumer(c2.id).unwrap();
    let mut c3 = h.consumer(SubscriptionType::Shared, None).await;
    let m = c3.messages().await.remove(0);
    assert_eq!(m.delivery_count, 1, "a lost consumer costs an attempt");
}

#[tokio::test(start_paused = true)]
async fn the_actor_stops_once_every_handle_is_gone() {
    let h = harness().await;
    let c = h.consumer(SubscriptionType::Shared, None).await;
    crate::util::lock(&h.entry.subscriptions).remove("billing");
    assert!(
        c.handle.policy().await.is_ok(),
        "alive while a handle remains"
    );
    let TestConsumer { handle, mut rx, .. } = c;
    drop(handle);
    // The actor held the consumer's sender: once it stops, the stream ends.
    let ended = tokio::time::timeout(Duration::from_secs(1), async {
        while rx.recv().await.is_some() {}
    })
    .await;
    assert!(ended.is_ok(), "the actor kept running without handles");
}

/// Requests queued faster than the actor takes them are handled in
/// bounded rounds, and every one is answered (none is dropped between
/// rounds).
#[tokio::test(start_paused = true)]
async fn every_queued_request_is_answered_across_rounds() {
    let h = harness().await;
    let mut c = h.consumer(SubscriptionType::Shared, None).await;
    let never = MessageRef {
        topic: h.entry.topic.name().to_string(),
        entry_id: 99,
    };
    let n = 3 * crate::subscription::COMMANDS_PER_ROUND as u64 + 1;
    for _ in 0..n {
        let id = never.clone();
        c.send(|request_id| ConsumerRequest::Ack {
            request_id,
            ids: vec![id],
            cumulative: false,
        });
    }
    let mut answered = std::collections::BTreeSet::new();
    while answered.len() < n as usize {
        match tokio::time::timeout(Duration::from_secs(5), c.rx.recv()).await {
            Ok(Some(ConsumerEvent::Done {
                request_id,
                outcome,
            })) => {
                assert!(outcome.is_err(), "an ack of an undelivered id");
                assert!(answered.insert(request_id), "{request_id} twice");
            }
            Ok(Some(_)) => {}
            other => panic!("{} of {n} answered, then {other:?}", answered.len()),
        }
    }
}

/// A client-held nack announced when made is counted then (its record
/// stored while the message stays in flight); the redelivery the client
/// asks for at the due time comes at once with that count, not counted again.
#[tokio::test(start_paused = true)]
async fn a_nack_counted_ahead_is_stored_at_once_and_not_counted_again() {
    let h = harness().await;
    h.publish(&["a"]).await;
    let mut c = h.consumer(SubscriptionType::Shared, None).await;
    let m = c.messages().await.remove(0);
    let rid = c.nack_ahead(&m);
    assert!(c.done(rid).await.is_ok());
    let key = TierEntry::main(0).of(c.handle.id());
    let stored = h.storage.failure(key, None).unwrap().unwrap();
    assert_eq!(stored.count, 1, "counted when made");
    assert_eq!(stored.attempts[0].detail, "held");
    assert!(
        c.messages_within(Duration::from_secs(5)).await.is_none(),
        "still in flight: the client holds the delay"
    );
    let status = c.handle.message_status(0).await.unwrap();
    assert_eq!(status.state, MessageState::InFlight);
    assert_eq!(status.failures.map(|f| f.count), Some(1));

    // Redelivered at once (the record is durable): the messages may come
    // before the request's answer, which `messages` skips (or fails on).
    c.nack(&m);
    let again = c.messages().await;
    assert_eq!((text(&again[0]), again[0].delivery_count), ("a", 1));
    assert_eq!(h.storage.failure(key, None).unwrap().unwrap().count, 1);
}

/// One message "a" received on a Shared consumer and nacked ahead, the
/// broker's `CountedAhead` notice (count 1) received.
async fn nacked_and_confirmed() -> (Harness, TestConsumer, ricochet_proto::Message) {
    let h = harness().await;
    h.publish(&["a"]).await;
    let mut c = h.consumer(SubscriptionType::Shared, None).await;
    let m = c.messages().await.remove(0);
    c.nack_ahead(&m);
    assert_eq!(c.counted_ahead().await, vec![(0, 1)]);
    (h, c, m)
}

/// Once a nack counted ahead is durable the holder is told it may
/// redeliver the message itself, with the count the broker would send; a
/// local redelivery keeps it in flight at that count with nothing sent, and
/// the next nack of it counts the next attempt.
#[tokio::test(start_paused = true)]
async fn a_nack_counted_ahead_may_be_redelivered_by_the_client_itself() {
    let (h, mut c, m) = nacked_and_confirmed().await;
    let rid = c.redelivered_locally(&m);
    assert!(c.done(rid).await.is_ok());
    assert!(
        c.messages_within(Duration::from_secs(5)).await.is_none(),
        "the broker sends nothing for a local redelivery"
    );
    let status = c.handle.message_status(0).await.unwrap();
    assert_eq!(status.state, MessageState::InFlight);
    assert_eq!(status.failures.map(|f| f.count), Some(1));

    // The local delivery failed too: counted ahead again, as attempt 2.
    c.nack_ahead(&m);
    assert_eq!(c.counted_ahead().await, vec![(0, 2)]);
    let key = TierEntry::main(0).of(c.handle.id());
    assert_eq!(h.storage.failure(key, None).unwrap().unwrap().count, 2);
    // This time the client asks the broker: redelivered at count 2.
    c.nack(&m);
    let again = c.messages().await;
    assert_eq!((text(&again[0]), again[0].delivery_count), ("a", 2));
}

/// A consumer lost after a local redelivery is charged from the count it
/// was redelivered at: the next consumer gets the message at count 2.
#[tokio::test(start_paused = true)]
async fn a_consumer_lost_after_a_local_redelivery_counts_from_it() {
    let (h, mut c, m) = nacked_and_confirmed().await;
    let rid = c.redelivered_locally(&m);
    assert!(c.done(rid).await.is_ok());
    c.handle.remove_consumer(c.id).unwrap();
    let mut c2 = h.consumer(SubscriptionType::Shared, None).await;
    let again = c2.messages().await;
    assert_eq!((text(&again[0]), again[0].delivery_count), ("a", 2));
}

/// A local redelivery from a consumer that no longer holds the message
/// (its stream was replaced, the message went to another consumer) changes
/// nothing: the other consumer's delivery and count stand.
#[tokio::test(start_paused = true)]
async fn a_local_redelivery_of_a_message_held_elsewhere_changes_nothing() {
    let (h, mut c, m) = nacked_and_confirmed().await;
    c.handle.remove_consumer(c.id).unwrap();
    let mut c2 = h.consumer(SubscriptionType::Shared, None).await;
    let again = c2.messages().await;
    assert_eq!(again[0].delivery_count, 1);
    // The old consumer's notice, then the new one's (not counted ahead):
    // the actor takes them in this order.
    c.redelivered_locally(&m);
    let rid = c2.redelivered_locally(&again[0]);
    assert!(c2.done(rid).await.is_ok());
    let status = c2.handle.message_status(0).await.unwrap();
    assert_eq!(status.state, MessageState::InFlight);
    assert_eq!(status.failures.map(|f| f.count), Some(1));
    // c2's nack is counted from there: attempt 2, not 3.
    c2.nack_ahead(&again[0]);
    assert_eq!(c2.counted_ahead().await, vec![(0, 2)]);
}

/// An ack after a nack counted ahead (the client cancelled the nack)
/// settles the message and drops the record stored for the nack.
#[tokio::test(start_paused = true)]
async fn an_ack_after_a_nack_counted_ahead_drops_its_record() {
    let h = harness().await;
    h.publish(&["a"]).await;
    let mut c = h.consumer(SubscriptionType::Shared, None).await;
    let m = c.messages().await.remove(0);
    let rid = c.nack_ahead(&m);
    assert!(c.done(rid).await.is_ok());
    let key = TierEntry::main(0).of(c.handle.id());
    assert!(h.storage.failure(key, None).unwrap().is_some());
    let rid = c.ack(&m);
    assert!(c.done(rid).await.is_ok());
    assert_eq!(h.storage.failure(key, None).unwrap(), None);
    assert!(c.messages_within(Duration::from_secs(5)).await.is_none());
}

/// A consumer lost while it holds a nack counted ahead: the message goes
/// back counted once (consumer lost, from the record before the nack), as
/// when the nack was only held by the client.
#[tokio::test(start_paused = true)]
async fn a_consumer_lost_after_a_nack_counted_ahead_counts_once() {
    let h = harness().await;
    h.publish(&["a"]).await;
    let mut c = h.consumer(SubscriptionType::Shared, None).await;
    let m = c.messages().await.remove(0);
    let rid = c.nack_ahead(&m);
    assert!(c.done(rid).await.is_ok());
    c.handle.remove_consumer(c.id).unwrap();
    let mut c2 = h.consumer(SubscriptionType::Shared, None).await;
    let again = c2.messages().await;
    assert_eq!((text(&again[0]), again[0].delivery_count), ("a", 1));
    let key = TierEntry::main(0).of(c2.handle.id());
    let stored = h.storage.failure(key, None).unwrap().unwrap();
    assert_eq!(stored.count, 1);
    assert_eq!(
        stored.attempts[0].reason,
        ricochet_policy::FailureReason::ConsumerLost
    );
}

/// A broker-held nack's hold and a `reconsume_later`'s delay run from when
/// the request was queued for the subscription, not from when the actor got
/// to it: here the clock moves 300 ms between the two (as when the actor is
/// busy with a burst ahead of it), and the due times do not move with it.
#[tokio::test(start_paused = true)]
async fn delays_run_from_when_the_request_was_queued_not_handled() {
    let h = harness().await;
    h.publish(&["a", "b"]).await;
    let mut c = h.consumer(SubscriptionType::Shared, None).await;
    let got = c.messages().await;
    let sub = c.handle.id();
    // Queued now; `advance` moves the clock before the actor runs.
    let asked = h.clock.now_us().div_ceil(1000);
    let nack = c.nack_held(&got[0], Duration::from_secs(600));
    let retry = c.reconsume(&got[1], Duration::from_secs(600));
    tokio::time::advance(Duration::from_millis(300)).await;
    // Both answered, in whichever order.
    let mut answered = Vec::new();
    while answered.len() < 2 {
        let event = tokio::time::timeout(Duration::from_secs(5), c.rx.recv()).await;
        if let Ok(Some(ConsumerEvent::Done {
            request_id,
            outcome,
        })) = event
        {
            assert!(outcome.is_ok(), "request {request_id}: {outcome:?}");
            answered.push(request_id);
        } else {
            assert!(event.is_ok(), "answered only {answered:?}");
        }
    }
    answered.sort_unstable();
    assert_eq!(answered, vec![nack, retry]);
    assert!(
        h.clock.now_ms() >= asked + 300,
        "handled after the clock moved"
    );
    let stored = h
        .storage
        .failure(TierEntry::main(0).of(sub), None)
        .unwrap()
        .unwrap();
    assert_eq!(stored.hold_until_ms, asked + 600_000, "the nack's hold");
    let dues = h.due_times();
    assert_eq!(dues, vec![asked + 600_000; 2], "hold and retry alike");
}
