//! Tests of [`super`]: the nack plan, the trackers and what each readies.
use std::sync::Mutex;

use ricochet_policy::PolicySpec;

use super::*;

const MS: Duration = Duration::from_millis(1);

// Tests that read deadlines run on tokio's paused clock, so that the
// trackers' base instant and the test's `now` are the same instant and
// deadlines land exactly; nothing sleeps.

/// What a policy was told: attempt, tier, detail, jitter seed.
type Told = (u32, Tier, Option<String>, u64);

/// Decides by the nack's detail, and records what it was told.
#[derive(Debug, Default)]
struct ByDetail {
    seen: Mutex<Vec<Told>>,
}

impl DeadLetterPolicy for ByDetail {
    fn decide(&self, ctx: &FailureContext<'_>) -> Decision {
        self.seen.lock().unwrap().push((
            ctx.attempt,
            ctx.tier,
            ctx.detail.map(str::to_owned),
            ctx.jitter_seed,
        ));
        match ctx.detail {
            Some("retry") => Decision::Redeliver {
                after: MS * 500,
                tier: Tier::Retry,
            },
            Some("dead") => Decision::DeadLetter {
                reason: "said so".into(),
            },
            _ => Decision::Redeliver {
                after: MS * 100 * ctx.attempt,
                tier: Tier::Main,
            },
        }
    }
    fn max_attempts(&self) -> Option<u32> {
        None
    }
    fn name(&self) -> &str {
        "by-detail"
    }
}

fn setup() -> (TopicIds, MessageId, MessageId, Key, Key) {
    let mut ids = TopicIds::new("main");
    let a = MessageId::new(ids.intern("main"), 1);
    let b = MessageId::new(ids.intern("main-s-RETRY"), 2);
    let (ka, kb) = (ids.key(&a).unwrap(), ids.key(&b).unwrap());
    (ids, a, b, ka, kb)
}

fn entries(list: &[(FailedDelivery, Option<Reply>)]) -> Vec<(u64, i32, &str)> {
    list.iter()
        .map(|(f, _)| (f.id.as_ref().unwrap().entry_id, f.reason, f.detail.as_str()))
        .collect()
}

impl InFlight {
    /// The failures readied, as the tests read them.
    fn take_ready(&mut self) -> Vec<(FailedDelivery, Option<Reply>)> {
        self.take_failures()
            .into_iter()
            .map(|r| (r.failure, r.reply))
            .collect()
    }
}

const NACK: i32 = ricochet_proto::FailureReason::Nack as i32;
const TIMEOUT: i32 = ricochet_proto::FailureReason::AckTimeout as i32;

#[test]
fn without_a_policy_a_nack_waits_the_fixed_delay() {
    let id = MessageId::new("main", 1);
    let plan = plan_nack(None, MS * 60_000, &id, Tier::Main, 4, Some("x"));
    assert_eq!(plan, NackPlan::HoldFor(MS * 60_000));
}

#[test]
fn the_policy_decides_hold_or_send_now() {
    let p = ByDetail::default();
    let id = MessageId::new("main", 1);
    let plan = |tier, count, detail| plan_nack(Some(&p), MS, &id, tier, count, detail);
    assert_eq!(plan(Tier::Main, 0, None), NackPlan::HoldFor(MS * 100));
    assert_eq!(
        plan(Tier::Retry, 2, Some("slow")),
        NackPlan::HoldFor(MS * 300)
    );
    assert_eq!(plan(Tier::Main, 0, Some("retry")), NackPlan::SendNow);
    assert_eq!(plan(Tier::Main, 0, Some("dead")), NackPlan::SendNow);
    let seen = p.seen.lock().unwrap();
    assert_eq!(
        seen[1],
        (
            3,
            Tier::Retry,
            Some("slow".to_owned()),
            jitter_seed(b"main:1", 3)
        ),
        "the next attempt, the tier, the detail and the id's seed"
    );
    assert_eq!(seen[0].0, 1);
    assert_eq!(seen[0].2, None);

    // A built-in policy: held for its delay, then dead-lettered.
    let fixed = PolicySpec::fixed_backoff(MS * 200, 3).build().unwrap();
    let plan = |count| plan_nack(Some(&*fixed), MS, &id, Tier::Main, count, None);
    assert_eq!(plan(0), NackPlan::HoldFor(MS * 200));
    assert_eq!(plan(2), NackPlan::HoldFor(MS * 200));
    assert_eq!(
        plan(3),
        NackPlan::SendNow,
        "a 4th attempt is over the limit"
    );
}

#[tokio::test(start_paused = true)]
async fn held_nacks_come_due_with_their_reasons() {
    let (ids, a, b, ka, kb) = setup();
    let mut f = InFlight::new(None, None);
    let now = Instant::now();
    f.delivered(ka);
    f.delivered(kb);
    assert!(f.settle(&ka));
    f.nack(
        ka,
        &a,
        NackPlan::HoldFor(MS * 100),
        Some("boom".into()),
        now,
        None,
        None,
    );
    assert!(f.settle(&kb));
    f.nack(kb, &b, NackPlan::HoldFor(MS * 300), None, now, None, None);
    assert_eq!(f.nack_deadline(), Some(now + MS * 100));

    f.fire_nacks(now + MS * 99, Duration::ZERO, &ids, |_| false);
    assert!(f.take_ready().is_empty(), "never early");
    f.fire_nacks(now + MS * 100, Duration::ZERO, &ids, |_| false);
    assert_eq!(entries(&f.take_ready()), vec![(1, NACK, "boom")]);
    assert_eq!(f.nack_deadline(), Some(now + MS * 300));
    f.fire_nacks(now + MS * 300, Duration::ZERO, &ids, |_| false);
    let ready = f.take_ready();
    assert_eq!(entries(&ready), vec![(2, NACK, "")]);
    assert_eq!(ready[0].0.id.as_ref().unwrap().topic, "main-s-RETRY");
    assert_eq!(f.nack_deadline(), None);
}

/// A held nack goes to the broker `lead` before it is due, with what
/// is left of its delay for the broker to serve (never less, never early).
#[tokio::test(start_paused = true)]
async fn a_held_nack_goes_ahead_with_the_rest_of_its_delay() {
    let (ids, a, _, ka, _) = setup();
    let mut f = InFlight::new(None, None);
    let now = Instant::now();
    f.delivered(ka);
    assert!(f.settle(&ka));
    f.nack(ka, &a, NackPlan::HoldFor(MS * 1000), None, now, None, None);
    f.fire_nacks(now + MS * 949, MS * 50, &ids, |_| false);
    assert!(f.take_ready().is_empty(), "not before the lead");
    f.fire_nacks(now + MS * 960, MS * 50, &ids, |_| false);
    let ready = f.take_ready();
    assert_eq!(entries(&ready), vec![(1, NACK, "")]);
    assert_eq!(ready[0].0.delay_ms, 40, "the broker serves the last 40 ms");
}

/// With a broker that counts held nacks ahead, a held nack is announced
/// at once (`ahead`, nothing for the broker to hold) and still sent
/// again when due; without one, nothing goes before the due time.
#[tokio::test(start_paused = true)]
async fn a_held_nack_is_announced_at_once_when_the_broker_counts_ahead() {
    let (ids, a, _, ka, _) = setup();
    let now = Instant::now();
    for counts_ahead in [true, false] {
        let mut f = InFlight::new(None, None);
        f.set_counts_ahead(counts_ahead);
        f.delivered(ka);
        assert!(f.settle(&ka));
        f.nack(
            ka,
            &a,
            NackPlan::HoldFor(MS * 100),
            Some("x".into()),
            now,
            None,
            None,
        );
        let notice = f.take_ready();
        if counts_ahead {
            assert_eq!(entries(&notice), vec![(1, NACK, "x")]);
            assert!(notice[0].0.ahead);
            assert_eq!(notice[0].0.delay_ms, 0);
        } else {
            assert!(notice.is_empty(), "held until due");
        }
        f.fire_nacks(now + MS * 100, Duration::ZERO, &ids, |_| false);
        let due = f.take_ready();
        assert_eq!(entries(&due), vec![(1, NACK, "x")]);
        assert!(!due[0].0.ahead, "the redelivery itself");
    }
}

/// A held nack counted ahead whose count the broker confirmed comes
/// back here when due, at the confirmed count, outstanding again, with
/// a `local` notice for the broker; one never confirmed goes to the
/// broker as before.
#[tokio::test(start_paused = true)]
async fn a_confirmed_nack_is_redelivered_here_and_an_unconfirmed_one_by_the_broker() {
    let (ids, a, b, ka, kb) = setup();
    let copy = |id: &MessageId| {
        let m = ricochet_proto::Message {
            id: Some(id.to_proto()),
            payload: b"p".to_vec(),
            ..Default::default()
        };
        Message::from_proto(m, 1, |t: &str| std::sync::Arc::from(t)).unwrap()
    };
    let now = Instant::now();
    let mut f = InFlight::new(None, None);
    f.set_counts_ahead(true);
    f.set_local_budget(1024);
    for (k, id) in [(ka, &a), (kb, &b)] {
        f.delivered(k);
        assert!(f.settle(&k));
        let plan = NackPlan::HoldFor(MS * 100);
        f.nack(k, id, plan, None, now, None, Some(copy(id)));
    }
    assert_eq!(f.take_ready().len(), 2, "both announced ahead");
    f.counted_ahead(ka, 7);
    let here = f.fire_nacks(now + MS * 100, Duration::ZERO, &ids, |_| false);
    assert_eq!(here.len(), 1);
    assert_eq!((here[0].id(), here[0].delivery_count()), (&a, 7));
    assert!(f.settle(&ka), "outstanding again");
    let sent = f.take_ready();
    assert_eq!(sent.len(), 2);
    let (local, broker): (Vec<_>, Vec<_>) = sent.iter().partition(|(d, _)| d.local);
    assert_eq!(local[0].0.id, Some(a.to_proto()));
    assert_eq!(broker[0].0.id, Some(b.to_proto()));
    assert!(!broker[0].0.ahead && !broker[0].0.local);

    // Copies dropped (no longer the active consumer): a confirmed
    // nack goes back through the broker.
    f.delivered(ka);
    assert!(f.settle(&ka));
    let plan = NackPlan::HoldFor(MS * 100);
    f.nack(ka, &a, plan, None, now, None, Some(copy(&a)));
    f.counted_ahead(ka, 8);
    f.forget_local_copies();
    let later = now + MS * 300;
    assert!(
        f.fire_nacks(later, Duration::ZERO, &ids, |_| false)
            .is_empty()
    );
    let sent = f.take_ready();
    assert!(
        sent.iter()
            .any(|(d, _)| d.id == Some(a.to_proto()) && !d.local && !d.ahead)
    );
}

#[tokio::test(start_paused = true)]
async fn send_now_readies_at_once_and_covered_nacks_are_dropped() {
    let (ids, a, b, ka, kb) = setup();
    let mut f = InFlight::new(None, None);
    let now = Instant::now();
    f.nack(
        ka,
        &a,
        NackPlan::SendNow,
        Some("dead".into()),
        now,
        None,
        None,
    );
    assert_eq!(entries(&f.take_ready()), vec![(1, NACK, "dead")]);
    assert!(f.take_ready().is_empty(), "taken once");

    f.nack(
        ka,
        &a,
        NackPlan::HoldFor(MS),
        Some("x".into()),
        now,
        None,
        None,
    );
    f.nack(kb, &b, NackPlan::HoldFor(MS), None, now, None, None);
    f.fire_nacks(now + MS, Duration::ZERO, &ids, |k| k == ka);
    assert_eq!(entries(&f.take_ready()), vec![(2, NACK, "")]);
    // The covered nack's reason went with it.
    f.nack(ka, &a, NackPlan::HoldFor(MS), None, now, None, None);
    f.fire_nacks(now + MS, Duration::ZERO, &ids, |_| false);
    assert_eq!(entries(&f.take_ready()), vec![(1, NACK, "")]);
}

#[test]
fn long_delays_and_receipts_go_to_the_broker() {
    let hold = |d| NackPlan::HoldFor(MS * d);
    assert_eq!(hold(100).holder(MS * 10_000, false), hold(100));
    assert_eq!(
        hold(10_000).holder(MS * 10_000, false),
        NackPlan::BrokerHold(MS * 10_000)
    );
    assert_eq!(
        hold(100).holder(MS * 10_000, true),
        NackPlan::BrokerHold(MS * 100)
    );
    assert_eq!(NackPlan::SendNow.holder(MS, true), NackPlan::SendNow);
}

#[tokio::test(start_paused = true)]
async fn a_broker_held_nack_goes_at_once_with_its_delay_and_waiter() {
    let (_, a, _, ka, _) = setup();
    let mut f = InFlight::new(None, None);
    let (tx, _rx) = tokio::sync::oneshot::channel();
    f.nack(
        ka,
        &a,
        NackPlan::BrokerHold(MS * 60_000),
        Some("later".into()),
        Instant::now(),
        Some(tx),
        None,
    );
    assert_eq!(f.nack_deadline(), None, "not held here");
    let ready = f.take_ready();
    assert_eq!(entries(&ready), vec![(1, NACK, "later")]);
    assert_eq!(ready[0].0.delay_ms, 60_000);
    assert!(ready[0].1.is_some());
}

/// A broker-held nack that waited in the driver's queue goes with what is
/// left of its delay from the nack call: the wait is not served twice.
#[tokio::test(start_paused = true)]
async fn a_broker_held_nack_loses_the_time_it_waited_in_the_queue() {
    let (_, a, _, ka, _) = setup();
    let mut f = InFlight::new(None, None);
    held_nack_that_waited(&mut f, ka, &a).await;
    let ready = f.take_ready();
    assert_eq!(ready[0].0.delay_ms, 993);
}

/// Nacks `id` with a 1 s broker hold, the call made 7 ms before the
/// driver plans it (time paused); returns the call's instant.
async fn held_nack_that_waited(f: &mut InFlight, key: Key, id: &MessageId) -> Instant {
    let called = Instant::now();
    tokio::time::advance(MS * 7).await;
    f.nack(
        key,
        id,
        NackPlan::BrokerHold(MS * 1000),
        None,
        called,
        None,
        None,
    );
    called
}

/// Every hold the broker serves is readied with its end, from the nack
/// call, so the frame can carry what is left when the transport takes it
/// (`conn::stamped`); failures without a hold carry none.
#[tokio::test(start_paused = true)]
async fn broker_held_holds_are_readied_with_their_ends() {
    let (ids, a, b, ka, kb) = setup();
    let mut f = InFlight::new(None, None);
    let called = held_nack_that_waited(&mut f, ka, &a).await;
    f.nack(kb, &b, NackPlan::SendNow, None, called, None, None);
    let due: Vec<_> = f.take_failures().iter().map(|r| r.due).collect();
    assert_eq!(due, vec![Some(called + MS * 1000), None]);
    // A client-held nack sent ahead of its end (the lead) and one handed
    // over at a close carry their ends too.
    f.nack(
        ka,
        &a,
        NackPlan::HoldFor(MS * 100),
        None,
        called,
        None,
        None,
    );
    f.fire_nacks(called + MS * 60, MS * 50, &ids, |_| false);
    f.nack(
        kb,
        &b,
        NackPlan::HoldFor(MS * 900),
        None,
        called,
        None,
        None,
    );
    f.hand_over_nacks(called + MS * 70, &ids, |_| false);
    let due: Vec<_> = f.take_failures().iter().map(|r| r.due).collect();
    assert_eq!(due, vec![Some(called + MS * 100), Some(called + MS * 900)]);
}

#[tokio::test(start_paused = true)]
async fn close_hands_held_nacks_over_with_what_is_left_of_their_delay() {
    let (ids, a, b, ka, kb) = setup();
    let mut f = InFlight::new(None, None);
    let now = Instant::now();
    f.nack(
        ka,
        &a,
        NackPlan::HoldFor(MS * 1_000),
        Some("x".into()),
        now,
        None,
        None,
    );
    f.nack(kb, &b, NackPlan::HoldFor(MS * 5_000), None, now, None, None);
    f.hand_over_nacks(now + MS * 400, &ids, |_| false);
    let mut ready = f.take_ready();
    ready.sort_by_key(|(d, _)| d.delay_ms);
    let left: Vec<(u64, u64)> = ready
        .iter()
        .map(|(d, _)| (d.id.as_ref().unwrap().entry_id, d.delay_ms))
        .collect();
    assert_eq!(left, vec![(1, 600), (2, 4_600)]);
    assert_eq!(ready[0].0.detail, "x");
    assert_eq!(f.nack_deadline(), None);
}

#[tokio::test(start_paused = true)]
async fn settling_cancels_a_held_nack() {
    let (ids, a, _, ka, _) = setup();
    let mut f = InFlight::new(None, None);
    let now = Instant::now();
    f.nack(
        ka,
        &a,
        NackPlan::HoldFor(MS * 10),
        Some("x".into()),
        now,
        None,
        None,
    );
    assert!(!f.settle(&ka), "not outstanding any more");
    f.fire_nacks(now + MS * 10, Duration::ZERO, &ids, |_| false);
    assert!(f.take_ready().is_empty());
}

#[tokio::test(start_paused = true)]
async fn ack_timeouts_run_from_taking_and_fire_once() {
    let (ids, _, _, ka, kb) = setup();
    let mut f = InFlight::new(Some(MS * 400), Some(MS * 50));
    let now = Instant::now();
    f.delivered(ka);
    f.delivered(kb);
    assert_eq!(f.ack_timeout_deadline(), None, "not taken yet");
    f.taken(ka, now);
    f.taken(kb, now + MS * 100);
    f.taken((7, 7), now); // never delivered: ignored
    let first = f.ack_timeout_deadline().unwrap();
    assert!(
        first >= now + MS * 400 && first <= now + MS * 450,
        "{:?}",
        first - now
    );

    f.fire_ack_timeouts(now + MS * 399, &ids, |_| false);
    assert!(f.take_ready().is_empty(), "never early");
    f.fire_ack_timeouts(now + MS * 450, &ids, |_| false);
    assert_eq!(entries(&f.take_ready()), vec![(1, TIMEOUT, "")]);
    assert!(!f.settle(&ka), "a timed-out id is no longer outstanding");

    // Extending (taking again) moves the deadline.
    f.taken(kb, now + MS * 300);
    f.fire_ack_timeouts(now + MS * 600, &ids, |_| false);
    assert!(f.take_ready().is_empty());
    f.fire_ack_timeouts(now + MS * 750, &ids, |_| false);
    assert_eq!(entries(&f.take_ready()), vec![(2, TIMEOUT, "")]);
    assert_eq!(f.ack_timeout_deadline(), None);
}

#[tokio::test(start_paused = true)]
async fn covered_or_settled_ids_do_not_time_out() {
    let (ids, _, _, ka, kb) = setup();
    let mut f = InFlight::new(Some(MS * 10), Some(MS));
    let now = Instant::now();
    f.delivered(ka);
    f.delivered(kb);
    f.taken(ka, now);
    f.taken(kb, now);
    f.fire_ack_timeouts(now + MS * 10, &ids, |k| k == ka);
    assert_eq!(entries(&f.take_ready()), vec![(2, TIMEOUT, "")]);
    assert!(
        !f.settle(&ka),
        "covered: dropped from the outstanding set too"
    );

    f.track(kb, now);
    assert!(f.settle(&kb));
    f.fire_ack_timeouts(now + MS * 20, &ids, |_| false);
    assert!(f.take_ready().is_empty());
}

#[tokio::test(start_paused = true)]
async fn without_an_ack_timeout_nothing_times_out() {
    let (ids, _, _, ka, _) = setup();
    let mut f = InFlight::new(None, Some(MS));
    let now = Instant::now();
    f.delivered(ka);
    f.taken(ka, now);
    f.track(ka, now);
    assert_eq!(f.ack_timeout_deadline(), None);
    f.fire_ack_timeouts(now + MS * 1000, &ids, |_| false);
    assert!(f.take_ready().is_empty());
    assert!(f.settle(&ka));
}

#[test]
fn a_cumulative_ack_settles_main_topic_ids_through_its_entry() {
    let mut ids = TopicIds::new("main");
    let main = |e| MessageId::new("main", e);
    let keys: Vec<Key> = [main(1), main(2), main(3), MessageId::new("retry", 1)]
        .iter()
        .map(|id| ids.key(id).unwrap())
        .collect();
    let mut f = InFlight::new(None, None);
    for k in &keys {
        f.delivered(*k);
    }
    f.settle_through(2, |k| ids.is_main(k));
    let left: Vec<bool> = keys.iter().map(|k| f.settle(k)).collect();
    assert_eq!(left, vec![false, false, true, true]);
}

#[tokio::test(start_paused = true)]
async fn clear_forgets_everything() {
    let (ids, a, _, ka, kb) = setup();
    let mut f = InFlight::new(Some(MS * 10), Some(MS));
    let now = Instant::now();
    f.delivered(kb);
    f.taken(kb, now);
    f.nack(
        ka,
        &a,
        NackPlan::HoldFor(MS),
        Some("x".into()),
        now,
        None,
        None,
    );
    f.nack(ka, &a, NackPlan::SendNow, None, now, None, None);
    f.clear();
    assert!(f.take_ready().is_empty());
    assert_eq!(f.nack_deadline(), None);
    assert_eq!(f.ack_timeout_deadline(), None);
    assert!(!f.settle(&kb));
    f.fire_nacks(now + MS * 100, Duration::ZERO, &ids, |_| false);
    f.fire_ack_timeouts(now + MS * 100, &ids, |_| false);
    assert!(f.take_ready().is_empty());
}
