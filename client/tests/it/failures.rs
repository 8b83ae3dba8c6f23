//! Failure paths: ack timeout, nack (policy delays, fixed delay, DLQ),
//! reconsume_later (retry tier), terminate, and grouped acks on close.
//!
//! Timing assertions are on measured elapsed times: a redelivery must never
//! come before its delay, and must come within a bound after it.

use crate::common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::{Env, assert_quiet, recv, start, text, topic};
use ricochet_client::{Consumer, ErrorKind, InitialPosition, PolicySpec, SubscriptionType};
use ricochet_policy::MultiplierBackoff;

const T: Duration = Duration::from_secs(5);
/// How late a redelivery may be (timer, fsync, dispatch), generous enough
/// for a loaded CI machine; the nack delays under test are 100-400 ms and
/// the default would be 60 s.
const LATE: Duration = Duration::from_millis(750);

async fn produce(env: &Env, t: &str, n: usize) {
    let p = env.client.producer(t).create().await.unwrap();
    for i in 0..n {
        drop(p.send_async(format!("m{i}")).await.unwrap());
    }
    p.flush().await.unwrap();
    p.close().await.unwrap();
}

async fn dead_letters(env: &Env, t: &str, sub: &str) -> Vec<ricochet_client::proto::DeadLetter> {
    env.client
        .admin()
        .list_dead_letters(t, sub, &Default::default(), 0, None)
        .await
        .unwrap()
        .dead_letters
}

#[tokio::test]
async fn ack_timeout_redelivers_exactly_the_unacked() {
    let env = start().await;
    let t = topic("f-acktimeout");
    let timeout = Duration::from_millis(400);
    let tick = Duration::from_millis(50);
    let mut c = env
        .client
        .consumer(&t)
        .subscription("s")
        .ack_timeout(timeout)
        .ack_timeout_tick(tick)
        .ack_group_time(Duration::from_millis(10))
        .subscribe()
        .await
        .unwrap();
    produce(&env, &t, 10).await;
    let mut unacked = std::collections::HashMap::new();
    for i in 0..10 {
        // The timeout runs from when the application takes the message,
        // which is after this instant.
        let before = Instant::now();
        let m = recv(&mut c, T).await;
        if i % 2 == 0 {
            c.ack(&m).await.unwrap();
        } else {
            unacked.insert(m.id().clone(), before);
        }
    }
    let mut again = HashSet::new();
    for _ in 0..5 {
        let m = recv(&mut c, T).await;
        let received = unacked.get(m.id()).expect("only unacked ids come back");
        let waited = received.elapsed();
        assert_eq!(m.delivery_count(), 1, "{}", m.id());
        assert!(again.insert(m.id().clone()), "redelivered once");
        assert!(waited >= timeout, "early: {waited:?}");
        assert!(waited <= timeout + tick + LATE, "late: {waited:?}");
        c.ack(&m).await.unwrap();
    }
    let unacked: HashSet<_> = unacked.into_keys().collect();
    assert_eq!(again, unacked);
    assert_quiet(&mut c, timeout + tick * 2).await;
}

#[tokio::test]
async fn extending_the_ack_deadline_holds_off_the_timeout_without_counting_an_attempt() {
    let env = start().await;
    let t = topic("f-extend");
    let timeout = Duration::from_millis(300);
    let tick = Duration::from_millis(20);
    let mut c = env
        .client
        .consumer(&t)
        .subscription("s")
        .ack_timeout(timeout)
        .ack_timeout_tick(tick)
        .subscribe()
        .await
        .unwrap();
    produce(&env, &t, 1).await;
    let m = recv(&mut c, T).await;
    let taken = Instant::now();
    // Keep working for three timeouts, extending each time it would expire.
    for _ in 0..3 {
        tokio::time::sleep(timeout / 2).await;
        c.extend_ack_deadline(&m).await.unwrap();
        tokio::time::sleep(timeout / 2).await;
        c.extend_ack_deadline(&m).await.unwrap();
    }
    assert!(taken.elapsed() >= timeout * 3);
    assert_quiet(&mut c, timeout / 2).await;
    // Stop extending: the timeout fires once, and the count shows no attempt
    // was charged for the extensions.
    let again = recv(&mut c, T).await;
    assert_eq!(again.id(), m.id());
    assert_eq!(again.delivery_count(), 1);
    c.ack(&again).await.unwrap();
}

async fn nack_consumer(env: &Env, t: &str, spec: Option<PolicySpec>) -> Consumer {
    let b = env
        .client
        .consumer(t)
        .subscription("s")
        .subscription_type(SubscriptionType::Shared)
        .initial_position(InitialPosition::Earliest)
        .negative_ack_delay(Duration::from_millis(200));
    match spec {
        Some(s) => b.policy(s),
        None => b,
    }
    .subscribe()
    .await
    .unwrap()
}

#[tokio::test]
async fn nack_waits_the_fixed_delay_without_a_policy() {
    let env = start().await;
    let t = topic("f-nack-fixed");
    produce(&env, &t, 1).await;
    let mut c = nack_consumer(&env, &t, None).await;
    let m = recv(&mut c, T).await;
    c.nack(&m).await.unwrap();
    let nacked = Instant::now();
    let m2 = recv(&mut c, T).await;
    let waited = nacked.elapsed();
    assert_eq!(m2.id(), m.id());
    assert_eq!(m2.delivery_count(), 1);
    assert!(waited >= Duration::from_millis(200), "early: {waited:?}");
    assert!(
        waited < Duration::from_millis(200) + LATE,
        "late: {waited:?}"
    );
    c.ack(&m2).await.unwrap();
}

/// A nack held by the client goes to the broker `nack_lead` before it is
/// due: from then on the broker holds it with its new delivery count
/// already stored (the message reads `scheduled`, count 1), and still
/// redelivers it no earlier than the full delay.
#[tokio::test]
async fn a_client_held_nack_reaches_the_broker_ahead_of_its_due_time() {
    let env = start().await;
    let t = topic("f-nack-lead");
    produce(&env, &t, 1).await;
    let delay = Duration::from_millis(2_000);
    let mut c = env
        .client
        .consumer(&t)
        .subscription("s")
        .subscription_type(SubscriptionType::Shared)
        .initial_position(InitialPosition::Earliest)
        .negative_ack_delay(delay)
        .nack_lead(Duration::from_millis(1_700))
        .subscribe()
        .await
        .unwrap();
    let m = recv(&mut c, T).await;
    c.nack(&m).await.unwrap();
    let nacked = Instant::now();
    // Well before the due time the broker holds it, its count stored.
    loop {
        let info = env.client.admin().message(m.id()).await.unwrap();
        let s = &info.subscriptions[0];
        if s.state == "scheduled" {
            assert_eq!(s.delivery_count, 1);
            break;
        }
        assert!(
            nacked.elapsed() < Duration::from_millis(1_500),
            "not handed to the broker ahead of its due time: {} after {:?}",
            s.state,
            nacked.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let again = recv(&mut c, T).await;
    let waited = nacked.elapsed();
    assert_eq!(again.id(), m.id());
    assert_eq!(again.delivery_count(), 1);
    assert!(waited >= delay, "early: {waited:?}");
    assert!(waited < delay + LATE, "late: {waited:?}");
    c.ack(&again).await.unwrap();
}

/// A nack the client holds is counted by the broker when it is made (the
/// broker takes `FailedDelivery.ahead`): its stored count reads 1 at once
/// while the message stays in flight with the consumer, and the redelivery
/// at the due time comes no earlier than the delay, counted once.
#[tokio::test]
async fn a_client_held_nack_is_counted_when_made_and_not_again_when_due() {
    let env = start().await;
    let t = topic("f-nack-ahead");
    produce(&env, &t, 1).await;
    let delay = Duration::from_millis(2_000);
    let mut c = env
        .client
        .consumer(&t)
        .subscription("s")
        .subscription_type(SubscriptionType::Shared)
        .initial_position(InitialPosition::Earliest)
        .negative_ack_delay(delay)
        .subscribe()
        .await
        .unwrap();
    let m = recv(&mut c, T).await;
    c.nack(&m).await.unwrap();
    let nacked = Instant::now();
    loop {
        let info = env.client.admin().message(m.id()).await.unwrap();
        let s = &info.subscriptions[0];
        if s.delivery_count == 1 {
            assert_eq!(s.state, "in_flight", "the client holds the delay");
            break;
        }
        assert!(
            nacked.elapsed() < Duration::from_millis(1_500),
            "not counted ahead of its due time: {} count {} after {:?}",
            s.state,
            s.delivery_count,
            nacked.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let again = recv(&mut c, T).await;
    let waited = nacked.elapsed();
    assert_eq!(again.id(), m.id());
    assert_eq!(again.delivery_count(), 1, "counted once");
    assert!(waited >= delay, "early: {waited:?}");
    assert!(waited < delay + LATE, "late: {waited:?}");
    c.ack(&again).await.unwrap();
}

#[tokio::test]
async fn nack_follows_the_multiplier_backoff_then_dead_letters() {
    let env = start().await;
    let t = topic("f-nack-backoff");
    produce(&env, &t, 1).await;
    let spec = PolicySpec::multiplier_backoff(
        MultiplierBackoff {
            min: Duration::from_millis(100),
            max: Duration::from_secs(10),
            multiplier: 2.0,
            jitter: 0.0,
        },
        3,
    );
    let mut c = nack_consumer(&env, &t, Some(spec)).await;
    let mut m = recv(&mut c, T).await;
    for (count, delay_ms) in [(1u32, 100u64), (2, 200), (3, 400)] {
        c.nack_with_reason(&m, format!("try {count}"))
            .await
            .unwrap();
        let nacked = Instant::now();
        let next = recv(&mut c, T).await;
        let waited = nacked.elapsed();
        let delay = Duration::from_millis(delay_ms);
        assert_eq!(next.id(), m.id());
        assert_eq!(next.delivery_count(), count);
        assert!(
            waited >= delay,
            "attempt {count} early: {waited:?} < {delay:?}"
        );
        assert!(waited < delay + LATE, "attempt {count} late: {waited:?}");
        m = next;
    }
    // The fourth failure exceeds max_redeliver_count = 3: dead-lettered at once.
    c.nack_with_reason(&m, "try 4").await.unwrap();
    assert_quiet(&mut c, Duration::from_millis(300)).await;
    // The Redeliver carries no request id: wait for the move to show.
    let deadline = Instant::now() + T;
    let mut dl = dead_letters(&env, &t, "s").await;
    while dl.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        dl = dead_letters(&env, &t, "s").await;
    }
    assert_eq!(dl.len(), 1);
    assert_eq!(dl[0].attempts.len(), 4);
    assert_eq!(dl[0].attempts[3].detail, "try 4");
}

#[tokio::test]
async fn nacks_are_grouped_and_acks_cancel_them() {
    let env = start().await;
    let t = topic("f-nack-group");
    produce(&env, &t, 20).await;
    let mut c = nack_consumer(&env, &t, None).await;
    let mut nacked = HashSet::new();
    for i in 0..20 {
        let m = recv(&mut c, T).await;
        c.nack(&m).await.unwrap();
        if i % 4 == 0 {
            // A later ack of a nacked message cancels the redelivery.
            c.ack(&m).await.unwrap();
        } else {
            nacked.insert(m.id().clone());
        }
    }
    let mut back = HashSet::new();
    for _ in 0..nacked.len() {
        let m = recv(&mut c, T).await;
        assert_eq!(m.delivery_count(), 1);
        back.insert(m.id().clone());
        c.ack(&m).await.unwrap();
    }
    assert_eq!(back, nacked);
    assert_quiet(&mut c, Duration::from_millis(400)).await;
}

#[tokio::test]
async fn reconsume_later_goes_through_the_retry_tier() {
    let env = start().await;
    let t = topic("f-reconsume");
    produce(&env, &t, 1).await;
    let mut c = nack_consumer(&env, &t, None).await;
    let m = recv(&mut c, T).await;
    let asked = Instant::now();
    let mut extra = std::collections::HashMap::new();
    extra.insert("why".to_owned(), "busy".to_owned());
    c.reconsume_later_with(&m, Duration::from_millis(300), extra)
        .await
        .unwrap();
    let r = recv(&mut c, T).await;
    let waited = asked.elapsed();
    // The broker schedules on wall-clock milliseconds: allow the truncation.
    assert!(
        waited + Duration::from_millis(2) >= Duration::from_millis(300),
        "early: {waited:?}"
    );
    assert!(r.topic().ends_with("-s-RETRY"), "{}", r.topic());
    assert_eq!(r.real_topic(), Some(m.topic()));
    assert_eq!(r.origin_message_id(), Some(m.id().to_string().as_str()));
    assert_eq!(r.reconsume_times(), Some(1));
    assert_eq!(r.property("why"), Some("busy"));
    assert!(r.is_retry());
    assert_eq!(text(&r), "m0");
    c.ack(&r).await.unwrap();
    assert_quiet(&mut c, Duration::from_millis(300)).await;
    // The ack of the retry-tier id held.
    c.close().await.unwrap();
    drop(c);
    let mut c = nack_consumer(&env, &t, None).await;
    assert_quiet(&mut c, Duration::from_millis(300)).await;
}

#[tokio::test]
async fn terminate_and_level_minus_one_dead_letter() {
    let env = start().await;
    let t = topic("f-terminate");
    produce(&env, &t, 2).await;
    let mut c = nack_consumer(&env, &t, None).await;
    let a = recv(&mut c, T).await;
    let b = recv(&mut c, T).await;
    c.terminate(&a, "poison").await.unwrap();
    c.reconsume_later_level(&b, -1).await.unwrap();
    // Queued like an ack: the flush confirms it.
    c.flush().await.unwrap();
    let dl = dead_letters(&env, &t, "s").await;
    assert_eq!(dl.len(), 2);
    assert!(dl.iter().any(|d| d.reason.contains("poison")), "{dl:?}");
    // Terminating an id the broker does not have in flight is rejected.
    let err = c.terminate(&a, "again").await.unwrap_err();
    assert_eq!(
        err.grpc_code(),
        Some(tonic::Code::InvalidArgument as i32),
        "{err}"
    );
    assert_quiet(&mut c, Duration::from_millis(200)).await;
}

#[tokio::test]
async fn a_refused_reconsume_later_fails_with_receipts_and_is_reported_by_flush_without() {
    let env = start().await;
    let t = topic("f-reconsume-refused");
    produce(&env, &t, 2).await;
    // Queued (the default): the second move of one message is refused by
    // the broker; the call cannot know, the flush reports it.
    let mut c = nack_consumer(&env, &t, None).await;
    let m = recv(&mut c, T).await;
    c.reconsume_later(&m, Duration::from_secs(3600))
        .await
        .unwrap();
    c.reconsume_later(&m, Duration::from_secs(3600))
        .await
        .unwrap();
    match c.flush().await {
        Err(ref e) if e.kind() == ErrorKind::Unconfirmed => {
            assert_eq!(e.unconfirmed_count().unwrap(), 1)
        }
        other => panic!("expected one refused move, got {other:?}"),
    }
    c.flush().await.expect("reported once");
    c.close().await.unwrap();
    drop(c);

    // With receipts, the refused call fails itself.
    let mut c = env
        .client
        .consumer(&t)
        .subscription("r")
        .initial_position(InitialPosition::Earliest)
        .ack_receipts(true)
        .subscribe()
        .await
        .unwrap();
    let m = recv(&mut c, T).await;
    c.reconsume_later(&m, Duration::from_secs(3600))
        .await
        .unwrap();
    let err = c
        .reconsume_later(&m, Duration::from_secs(3600))
        .await
        .unwrap_err();
    assert_eq!(
        err.grpc_code(),
        Some(tonic::Code::InvalidArgument as i32),
        "{err}"
    );
    c.flush().await.unwrap();
}

#[tokio::test]
async fn grouped_acks_are_flushed_on_close() {
    let env = start().await;
    let t = topic("f-close");
    produce(&env, &t, 50).await;
    let sub = || {
        env.client
            .consumer(&t)
            .subscription("s")
            .initial_position(InitialPosition::Earliest)
            // Only close can flush these in time.
            .ack_group_time(Duration::from_secs(60))
            .ack_group_max(10_000)
            .subscribe()
    };
    let mut c = sub().await.unwrap();
    for _ in 0..50 {
        let m = recv(&mut c, T).await;
        c.ack(&m).await.unwrap();
    }
    c.close().await.unwrap();
    drop(c);
    let mut c = sub().await.unwrap();
    assert_quiet(&mut c, Duration::from_millis(500)).await;
}

#[tokio::test]
async fn close_reports_held_nacks_and_gives_back_the_rest_uncounted() {
    let env = start().await;
    let t = topic("f-close-release");
    let c = |env: &Env| {
        env.client
            .consumer(&t)
            .subscription("s")
            .subscription_type(SubscriptionType::Shared)
            .initial_position(InitialPosition::Earliest)
            // Held here (under the broker threshold), far longer than the
            // test: only close can report it.
            .negative_ack_delay(Duration::from_secs(60))
            .broker_nack_threshold(Duration::from_secs(120))
            .subscribe()
    };
    let mut first = c(&env).await.unwrap();
    produce(&env, &t, 3).await;
    let m = recv(&mut first, T).await;
    // Give the other two time to arrive in the prefetch queue.
    tokio::time::sleep(Duration::from_millis(200)).await;
    first.nack_with_reason(&m, "boom").await.unwrap();
    first.close().await.unwrap();

    let mut second = c(&env).await.unwrap();
    let mut got = Vec::new();
    for _ in 0..2 {
        got.push(recv(&mut second, T).await);
    }
    // The nacked message's attempt is recorded (NACK, with its reason), and
    // the broker serves the rest of its delay: it is scheduled, not back.
    let state = env.client.admin().message(m.id()).await.unwrap();
    let sub = &state.subscriptions[0];
    assert_eq!(sub.state, "scheduled", "{sub:?}");
    assert_eq!(
        sub.delivery_count, 1,
        "the held nack counted as one attempt"
    );
    assert_eq!(sub.attempts.len(), 1, "{sub:?}");
    assert_eq!(
        sub.attempts[0].reason,
        ricochet_client::proto::FailureReason::Nack as i32
    );
    assert_eq!(sub.attempts[0].detail, "boom");
    for g in &got {
        assert_ne!(text(g), text(&m));
        assert_eq!(
            g.delivery_count(),
            0,
            "never-seen messages were not charged"
        );
        second.ack(g).await.unwrap();
    }
    assert_quiet(&mut second, Duration::from_millis(500)).await;
    second.close().await.unwrap();
}

/// Receives `n` messages nacked at the instants in `nacked` (by text) with
/// hold `hold`, acking each; panics naming every one that came back before
/// its nack call plus its hold by this clock.
async fn expect_never_early(
    c: &mut Consumer,
    nacked: &std::collections::HashMap<String, Instant>,
    hold: Duration,
) {
    let mut early = Vec::new();
    for _ in 0..nacked.len() {
        let m = recv(c, hold + T).await;
        let at = Instant::now();
        let due = nacked[&text(&m)] + hold;
        if at < due {
            early.push((text(&m), due - at));
        }
        c.ack(&m).await.unwrap();
    }
    assert!(
        early.is_empty(),
        "{} of {} redelivered before their hold: {early:?}",
        early.len(),
        nacked.len()
    );
}

/// Nacks held by the broker (the hold sent in µs, served from when its
/// frame reached the broker, fired at that µs) never come back before the
/// nack call plus the hold by the client's own clock: many of them, with a
/// hold that is no whole millisecond, fired from memory, and again across a
/// broker restart (the stored due time is the µs rounded up to a ms).
#[tokio::test]
async fn broker_held_nacks_never_come_back_before_their_hold() {
    const N: usize = 300;
    let env = start().await;
    let t = topic("f-held-never-early");
    let sub = |env: &Env, hold: Duration| {
        env.client
            .consumer(&t)
            .subscription("s")
            .subscription_type(SubscriptionType::Shared)
            .initial_position(InitialPosition::Earliest)
            .receiver_queue_size(2 * N as u32)
            .negative_ack_delay(hold)
            .broker_nack_threshold(Duration::ZERO)
            .subscribe()
    };
    async fn nack_all(c: &mut Consumer, n: usize) -> std::collections::HashMap<String, Instant> {
        let mut got = Vec::with_capacity(n);
        for _ in 0..n {
            got.push(recv(c, T).await);
        }
        let mut nacked = std::collections::HashMap::with_capacity(n);
        for m in got {
            // Before the call: the hold runs from the call, no sooner.
            nacked.insert(text(&m), Instant::now());
            c.nack(&m).await.unwrap();
        }
        c.flush().await.unwrap();
        nacked
    }

    // Fired from memory at the µs.
    let hold = Duration::from_micros(300_700);
    let mut c = sub(&env, hold).await.unwrap();
    produce(&env, &t, N).await;
    let nacked = nack_all(&mut c, N).await;
    expect_never_early(&mut c, &nacked, hold).await;
    c.close().await.unwrap();
    drop(c);

    // Held across a restart: fired at the stored ms.
    let hold = Duration::from_micros(2_500_300);
    let mut c = sub(&env, hold).await.unwrap();
    produce(&env, &t, N).await;
    let nacked = nack_all(&mut c, N).await;
    let first_due = *nacked.values().min().unwrap() + hold;
    c.close().await.unwrap();
    drop(c);
    let Env { broker, client } = env;
    drop(client);
    let dir = broker.shutdown().await;
    let broker = ricochet_testkit::InProcessBroker::start_in(dir, |_| {}).await;
    let env = Env {
        client: common::client(&broker.url()).await,
        broker,
    };
    let mut c = sub(&env, hold).await.unwrap();
    assert!(
        Instant::now() < first_due,
        "the restart outlasted the hold: nothing was due after it"
    );
    expect_never_early(&mut c, &nacked, hold).await;
    assert_quiet(&mut c, Duration::from_millis(300)).await;
}

/// The due time the broker stores for a broker-held nack (what a restart
/// goes by: the hold's µs rounded up to a ms) is never before the nack call
/// plus the hold by this machine's wall clock, nacks one at a time (each
/// the only one scheduled, so the subscription's next due time is its).
/// A hold that ended before the stats were read (a loaded machine) leaves
/// no due time to check: such rounds are counted, and most must be checked.
#[tokio::test]
async fn a_broker_held_nacks_stored_due_time_is_never_before_its_hold() {
    const N: usize = 40;
    let env = start().await;
    let t = topic("f-held-stored-due");
    let hold = Duration::from_micros(100_300);
    let mut c = env
        .client
        .consumer(&t)
        .subscription("s")
        .subscription_type(SubscriptionType::Shared)
        .negative_ack_delay(hold)
        .broker_nack_threshold(Duration::ZERO)
        .subscribe()
        .await
        .unwrap();
    let wall_us = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros() as u64
    };
    let (mut early, mut unchecked) = (Vec::new(), 0);
    for _ in 0..N {
        // One at a time: the next to arrive is this one again.
        produce(&env, &t, 1).await;
        let m = recv(&mut c, T).await;
        let (called, called_us) = (Instant::now(), wall_us());
        c.nack(&m).await.unwrap();
        c.flush().await.unwrap();
        let stats = env
            .client
            .admin()
            .subscription_stats(&t, "s")
            .await
            .unwrap();
        let due_us = stats.next_retry_due_ms * 1000;
        if due_us == 0 {
            // Fired already: nothing scheduled to read.
            unchecked += 1;
        } else if due_us < called_us + hold.as_micros() as u64 {
            early.push(called_us + hold.as_micros() as u64 - due_us);
        }
        let again = recv(&mut c, T).await;
        assert_eq!(text(&again), text(&m));
        assert!(called.elapsed() >= hold, "redelivered early");
        c.ack(&again).await.unwrap();
        // Its schedule entry goes with the ack: the next one is alone.
        c.flush().await.unwrap();
    }
    assert!(
        early.is_empty(),
        "{} of {N} stored due times before the hold (µs early: {early:?})",
        early.len()
    );
    assert!(
        unchecked <= N / 4,
        "{unchecked} of {N} holds ended before their due time could be read"
    );
}
