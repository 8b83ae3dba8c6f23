//! Crash test for tier moves: the broker runs as a child process and is killed
//! with SIGKILL while messages sit scheduled in the retry tier and while a
//! consumer keeps failing messages (so moves main → retry, retry → retry and
//! retry → DLQ are in progress), then restarted on the same directory, many
//! times over.
//!
//! A delay-level policy on a millisecond table (`max_reconsume_times = 3`)
//! governs every failure, so each message is delivered with counts 0, 1, 2, 3
//! and then dead-lettered, except a known subset that the consumer acks when it
//! sees count 2. New messages are published in every round, so each kill finds
//! some messages fresh on the topic and others scheduled or moving.
//!
//! Checked, per message (by payload, cross-checked against
//! `ORIGIN_MESSAGE_ID`):
//! * the delivery counts observed never go backwards, across restarts
//!   included, and a failure the broker confirmed (durable) is never forgotten:
//!   the next delivery carries a higher count;
//! * a message whose ack the broker confirmed is never delivered again;
//! * no retry-tier delivery is early (`deliver_at_ms`), none exceeds the limit;
//! * at the end every message is exactly once either acked (the ack subset)
//!   or in the DLQ (all others): no duplicate, none missing, nothing left
//!   scheduled or pending;
//! * retries scheduled before a kill fired after the restart.
//!
//! `CRASH_MOVES_SEED` picks another kill schedule; `CRASH_MOVES_LOG` sets the
//! broker's `RUST_LOG` (default `error`).

use crate::common;
use common::*;
use ricochet_proto::admin_client::AdminClient;
use ricochet_proto::*;
use ricochet_testkit::{BrokerProcess, InProcessBroker, now_ms};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

const TOPIC: &str = "moves";
const FULL_TOPIC: &str = "persistent://public/default/moves";
const SUB: &str = "s";
/// Kill-and-restart rounds before the final, uninterrupted one.
const ROUNDS: usize = 8;
/// Messages published at the start of each round.
const PER_ROUND: usize = 25;
const MESSAGES: usize = ROUNDS * PER_ROUND;
/// Retries before the DLQ (deliveries carry counts 0..=MAX_RETRIES).
const MAX_RETRIES: u32 = 3;
/// Messages `n` with `n % ACK_EVERY == 0` are acked when seen with `ACK_AT`.
const ACK_EVERY: usize = 10;
const ACK_AT: u32 = 2;

/// The broker with `RUST_LOG` from `CRASH_MOVES_LOG`: its log (on stdout)
/// is copied to stderr when a level is given, and discarded otherwise (by
/// default only errors are logged: every dead letter is a warning).
async fn spawn_broker(dir: &std::path::Path) -> BrokerProcess {
    let log = std::env::var("CRASH_MOVES_LOG").ok();
    let options = options()
        .rust_log(log.as_deref().unwrap_or("error"))
        .echo_log(log.is_some());
    BrokerProcess::spawn(dir, &options).await
}

/// A small deterministic generator for the kill schedule and failure kinds.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn policy() -> DeadLetterPolicyConfig {
    // Attempt k waits levels_ms[k - 1]; attempt 4 exceeds the limit: DLQ.
    DeadLetterPolicyConfig {
        kind: Some(dead_letter_policy_config::Kind::DelayLevels(
            DelayLevelPolicyConfig {
                levels_ms: vec![150, 300, 500],
                start_level: 1,
                max_reconsume_times: MAX_RETRIES,
            },
        )),
        ..Default::default()
    }
}

async fn admin(url: &str) -> AdminClient<tonic::transport::Channel> {
    AdminClient::new(channel(url).await)
}

async fn all_dead_letters(url: &str) -> Vec<DeadLetter> {
    let mut a = admin(url).await;
    let mut out: Vec<DeadLetter> = Vec::new();
    loop {
        let after = out
            .last()
            .and_then(|d| d.message.as_ref())
            .and_then(|m| m.id.as_ref())
            .map(|id| id.entry_id);
        let page = a
            .list_dead_letters(ListDeadLettersRequest {
                topic: TOPIC.into(),
                subscription: SUB.into(),
                limit: 1000,
                after_entry_id: after,
                ..Default::default()
            })
            .await
            .expect("list dead letters")
            .into_inner()
            .dead_letters;
        if page.is_empty() {
            return out;
        }
        out.extend(page);
    }
}

async fn stats(url: &str) -> SubscriptionStatsResponse {
    admin(url)
        .await
        .subscription_stats(SubscriptionRequest {
            topic: TOPIC.into(),
            subscription: SUB.into(),
        })
        .await
        .expect("subscription stats")
        .into_inner()
}

#[derive(Debug, Default)]
struct Track {
    /// Main-topic entry id from the publish receipt.
    entry_id: u64,
    /// Every delivery: (round, count, from the retry tier).
    deliveries: Vec<(usize, u32, bool)>,
    /// Highest count delivered so far.
    max_seen: Option<u32>,
    /// Highest count whose failure the broker confirmed (durable), and in which round.
    confirmed_failure: Option<(u32, usize)>,
    ack_sent: bool,
    ack_confirmed: bool,
}

#[derive(Debug, Clone, Copy)]
enum Request {
    Fail(usize, u32),
    Ack(usize),
}

struct State {
    tracks: Vec<Track>,
    by_payload: HashMap<String, usize>,
    requests: HashMap<u64, Request>,
    next_request: u64,
    violations: Vec<String>,
    /// Per round: retry-tier deliveries of messages whose failure was confirmed
    /// in an earlier round (scheduled before the kill, fired after the restart).
    fired_after_restart: BTreeMap<usize, usize>,
    rng: Lcg,
}

impl State {
    fn violation(&mut self, v: String) {
        if self.violations.len() < 50 {
            eprintln!("VIOLATION: {v}");
        }
        self.violations.push(v);
    }

    fn on_result(&mut self, r: CommandResult) {
        let Some(req) = self.requests.remove(&r.request_id) else {
            return;
        };
        if r.code != 0 {
            self.violation(format!("request {req:?} failed: {} {}", r.code, r.message));
            return;
        }
        match req {
            Request::Fail(n, count) => {
                let t = &mut self.tracks[n];
                if t.confirmed_failure.is_none_or(|(c, _)| c < count) {
                    let round = t
                        .deliveries
                        .iter()
                        .rev()
                        .find(|d| d.1 == count)
                        .map_or(0, |d| d.0);
                    t.confirmed_failure = Some((count, round));
                }
            }
            Request::Ack(n) => self.tracks[n].ack_confirmed = true,
        }
    }

    /// Checks one delivery and answers it (ack or one of the failure kinds).
    async fn on_message(&mut self, c: &RawConsumer, m: Message, round: usize) {
        let received_ms = now_ms();
        let payload = text(&m);
        let Some(&n) = self.by_payload.get(&payload) else {
            self.violation(format!("unknown payload {payload:?}"));
            return;
        };
        let id = m.id.clone().expect("delivered with an id");
        let retry = id.topic.ends_with("-RETRY");
        let count = m.delivery_count;
        let t = &self.tracks[n];
        let mut bad = Vec::new();
        if let Some(max) = t.max_seen
            && count < max
        {
            bad.push(format!(
                "{payload}: count went backwards: {count} after {max} (round {round}, history {:?})",
                t.deliveries
            ));
        }
        if let Some((k, r)) = t.confirmed_failure
            && count <= k
        {
            bad.push(format!(
                "{payload}: delivered with count {count} after its failure at count {k} was confirmed in round {r} (round {round}, history {:?})",
                t.deliveries
            ));
        }
        if t.ack_confirmed {
            bad.push(format!(
                "{payload}: delivered again (count {count}, round {round}) after its ack was confirmed"
            ));
        }
        if count > MAX_RETRIES {
            bad.push(format!(
                "{payload}: delivered with count {count} > max_reconsume_times {MAX_RETRIES}"
            ));
        }
        if retry {
            let origin = format!("{FULL_TOPIC}:{}", t.entry_id);
            if m.properties.get("ORIGIN_MESSAGE_ID") != Some(&origin) {
                bad.push(format!(
                    "{payload}: ORIGIN_MESSAGE_ID {:?}, expected {origin}",
                    m.properties.get("ORIGIN_MESSAGE_ID")
                ));
            }
            if m.properties.get("RECONSUMETIMES") != Some(&count.to_string()) {
                bad.push(format!(
                    "{payload}: RECONSUMETIMES {:?} on a delivery with count {count}",
                    m.properties.get("RECONSUMETIMES")
                ));
            }
            if received_ms < m.deliver_at_ms {
                bad.push(format!(
                    "{payload}: delivered {} ms before its due time",
                    m.deliver_at_ms - received_ms
                ));
            }
            if let Some((_, r)) = t.confirmed_failure
                && r < round
                && !t.deliveries.iter().any(|d| d.0 == round)
            {
                *self.fired_after_restart.entry(round).or_default() += 1;
            }
        } else if id.entry_id != t.entry_id {
            bad.push(format!(
                "{payload}: main-topic id {} but published as {}",
                id.entry_id, t.entry_id
            ));
        }
        for b in bad {
            self.violation(b);
        }
        let t = &mut self.tracks[n];
        t.deliveries.push((round, count, retry));
        t.max_seen = Some(t.max_seen.map_or(count, |m| m.max(count)));

        let request_id = self.next_request;
        self.next_request += 1;
        if n % ACK_EVERY == 0 && count == ACK_AT {
            t.ack_sent = true;
            self.requests.insert(request_id, Request::Ack(n));
            c.ack(vec![id], request_id).await;
            return;
        }
        self.requests.insert(request_id, Request::Fail(n, count));
        match self.rng.below(3) {
            0 => {
                c.reconsume_later(id, reconsume_later::Delay::DelayLevel(0), request_id)
                    .await
            }
            1 => {
                let ms = 50 + self.rng.below(200);
                c.reconsume_later(id, reconsume_later::Delay::DelayMs(ms), request_id)
                    .await
            }
            _ => c.nack(id, &format!("fail #{count}"), request_id).await,
        }
    }

    /// Consumes (and answers) until `until`.
    async fn consume(&mut self, c: &mut RawConsumer, round: usize, until: Instant) {
        while Instant::now() < until {
            let wait = until
                .saturating_duration_since(Instant::now())
                .min(Duration::from_millis(50));
            let m = c.next(wait).await;
            while let Some(r) = c.results.pop_front() {
                self.on_result(r);
            }
            if let Some(m) = m {
                self.on_message(c, m, round).await;
            }
        }
    }
}

async fn subscribe(url: &str) -> RawConsumer {
    let opts = SubOpts {
        sub_type: SubscriptionType::Shared,
        policy: Some(policy()),
        name: "crashy".into(),
        ..Default::default()
    };
    let c = RawConsumer::subscribe(url, TOPIC, SUB, opts)
        .await
        .expect("subscribe");
    c.flow(1_000_000).await;
    c
}

#[tokio::test]
async fn kill_9_during_scheduled_retries_and_tier_moves_loses_and_duplicates_nothing() {
    let seed: u64 = std::env::var("CRASH_MOVES_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_2024);
    eprintln!("crash_moves: seed {seed}");
    // CRASH_MOVES_DIR keeps the data for inspection; by default a temporary dir.
    let tmp = tempfile::tempdir().unwrap();
    let dir = match std::env::var_os("CRASH_MOVES_DIR") {
        Some(d) => std::path::PathBuf::from(d),
        None => tmp.path().to_owned(),
    };
    let started = Instant::now();
    let mut st = State {
        tracks: Vec::new(),
        by_payload: HashMap::new(),
        requests: HashMap::new(),
        next_request: 1,
        violations: Vec::new(),
        fired_after_restart: BTreeMap::new(),
        rng: Lcg(seed),
    };

    for round in 0..=ROUNDS {
        let broker = spawn_broker(&dir).await;
        let url = broker.url();
        let mut c = subscribe(url).await;
        if round < ROUNDS {
            let mut p = RawProducer::open(url, TOPIC, "p").await.unwrap();
            let payloads: Vec<String> = (0..PER_ROUND)
                .map(|i| format!("msg-{:03}", round * PER_ROUND + i))
                .collect();
            let refs: Vec<&str> = payloads.iter().map(String::as_str).collect();
            let ids = p.send(&refs).await;
            for (payload, id) in payloads.into_iter().zip(ids) {
                st.by_payload.insert(payload, st.tracks.len());
                st.tracks.push(Track {
                    entry_id: id.entry_id,
                    ..Default::default()
                });
            }
            // Run for a random-ish while, then kill mid-flight.
            let run = Duration::from_millis(150 + st.rng.below(550));
            st.consume(&mut c, round, Instant::now() + run).await;
            let s = stats(url).await;
            eprintln!(
                "round {round}: killed after {run:?} with {} scheduled, {} unacked, {} dead-lettered, {} requests unanswered",
                s.scheduled_retries,
                s.unacked,
                s.dead_lettered,
                st.requests.len()
            );
            drop(c);
            broker.kill9();
            // Answers that never came: the broker died first.
            st.requests.clear();
            continue;
        }

        // Final round: no kill; run until every message is settled.
        let expected_dlq = (0..MESSAGES).filter(|n| n % ACK_EVERY != 0).count() as u64;
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut last = stats(url).await;
        while Instant::now() < deadline {
            st.consume(&mut c, round, Instant::now() + Duration::from_millis(200))
                .await;
            last = stats(url).await;
            if last.dead_lettered >= expected_dlq
                && last.backlog == 0
                && last.unacked == 0
                && st.requests.is_empty()
            {
                break;
            }
        }
        // Quiet period: nothing else may arrive.
        st.consume(&mut c, round, Instant::now() + Duration::from_millis(500))
            .await;
        let after = stats(url).await;
        let dead = all_dead_letters(url).await;
        drop(c);
        broker.kill9();

        eprintln!(
            "crash_moves: {} rounds in {:?}; retries fired after restart per round: {:?}",
            ROUNDS + 1,
            started.elapsed(),
            st.fired_after_restart
        );
        let stuck: Vec<String> = st
            .tracks
            .iter()
            .enumerate()
            .filter(|(n, t)| {
                let acked = n % ACK_EVERY == 0 && t.ack_sent;
                let dead = t.max_seen == Some(MAX_RETRIES) && t.confirmed_failure.is_some();
                !acked && !dead
            })
            .map(|(n, t)| {
                format!(
                    "msg-{n:03} (entry {}): deliveries {:?}, confirmed failure {:?}",
                    t.entry_id, t.deliveries, t.confirmed_failure
                )
            })
            .take(10)
            .collect();
        assert_eq!(
            (after.backlog, after.scheduled_retries, after.unacked),
            (0, 0, 0),
            "nothing may be left pending or scheduled: {after:?} (before the quiet period: {last:?}); \
             messages never seen to finish, e.g. {stuck:#?}"
        );

        // The DLQ: exactly the messages outside the ack subset, once each.
        let mut origins: BTreeMap<u64, usize> = BTreeMap::new();
        for d in &dead {
            let m = d
                .message
                .as_ref()
                .expect("a dead letter carries its message");
            let payload = text(m);
            let origin = d.origin.as_ref().expect("a dead letter has an origin");
            let Some(&n) = st.by_payload.get(&payload) else {
                panic!("unknown dead letter {payload:?}");
            };
            assert_eq!(
                (origin.topic.as_str(), origin.entry_id),
                (FULL_TOPIC, st.tracks[n].entry_id),
                "{payload}: origin"
            );
            *origins.entry(origin.entry_id).or_default() += 1;
            let counts: Vec<u32> = d.attempts.iter().map(|a| a.delivery_count).collect();
            assert_eq!(
                counts.last().copied(),
                Some(MAX_RETRIES + 1),
                "{payload}: dead-lettered by the failure that exceeded the limit: {counts:?}"
            );
            assert!(
                counts.windows(2).all(|w| w[0] < w[1]),
                "{payload}: history counts must increase: {counts:?}"
            );
        }
        let dup: Vec<_> = origins.iter().filter(|(_, k)| **k > 1).collect();
        assert!(dup.is_empty(), "dead-lettered more than once: {dup:?}");
        let expected: BTreeSet<u64> = st
            .tracks
            .iter()
            .enumerate()
            .filter(|(n, _)| n % ACK_EVERY != 0)
            .map(|(_, t)| t.entry_id)
            .collect();
        let got: BTreeSet<u64> = origins.keys().copied().collect();
        let missing: Vec<_> = expected.difference(&got).collect();
        let extra: Vec<_> = got.difference(&expected).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "DLQ origins: missing {missing:?}, unexpected (acked subset) {extra:?}"
        );
        assert_eq!(
            (after.dead_lettered, dead.len()),
            (expected.len() as u64, expected.len()),
            "dead-letter records (stats) and listed dead letters"
        );
        // The ack subset: every one acked, none dead-lettered (checked above),
        // and nothing is pending (stats), so each was acked exactly once.
        for (n, t) in st.tracks.iter().enumerate() {
            if n % ACK_EVERY == 0 {
                assert!(t.ack_sent, "msg-{n:03} never reached count {ACK_AT}");
            }
        }
        assert!(
            st.violations.is_empty(),
            "{} violations, first: {:#?}",
            st.violations.len(),
            &st.violations[..st.violations.len().min(10)]
        );
        let fired: usize = st.fired_after_restart.values().sum();
        assert!(
            fired > 0,
            "no retry scheduled before a kill was delivered after the restart"
        );
        let restarted_rounds_with_fires = st.fired_after_restart.len();
        assert!(
            restarted_rounds_with_fires >= ROUNDS / 2,
            "scheduled retries fired after only {restarted_rounds_with_fires} of {ROUNDS} restarts: {:?}",
            st.fired_after_restart
        );
    }
}

/// At start-up the scheduler's first refill fires every overdue entry at once;
/// a subscription whose actor starts later (here: behind a thousand topics
/// that load first) must still get its overdue retries, not only after the
/// next restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overdue_retries_fire_after_a_restart_that_loads_many_topics() {
    use ricochet_broker::storage::{TopicKind, TopicRecord};
    let b = InProcessBroker::start().await;
    // Topics are loaded in name order: these come before "zz".
    for i in 0..1000 {
        b.core
            .storage
            .put_topic(&TopicRecord {
                name: format!("persistent://public/default/a-{i:04}"),
                created_ms: 0,
                kind: TopicKind::Normal,
                replicas: 1,
                trimmed_below: 0,
            })
            .unwrap();
    }
    let mut c = RawConsumer::simple(&b.url(), "zz", "s", SubscriptionType::Shared).await;
    c.flow(10).await;
    let mut p = RawProducer::open(&b.url(), "zz", "p").await.unwrap();
    p.send(&["later"]).await;
    let m = c.next(WAIT).await.unwrap();
    let due = now_ms() + 200;
    c.reconsume_later(
        m.id.clone().unwrap(),
        reconsume_later::Delay::DelayMs(200),
        1,
    )
    .await;
    assert_eq!(c.result(WAIT).await.unwrap().code, 0);
    drop(c);
    drop(p);
    let dir = b.shutdown().await;
    // Overdue by the time the broker is back.
    tokio::time::sleep(Duration::from_millis(400)).await;

    let b = InProcessBroker::start_in(dir, |_| {}).await;
    let mut c = RawConsumer::simple(&b.url(), "zz", "s", SubscriptionType::Shared).await;
    c.flow(10).await;
    let m = c
        .next(WAIT)
        .await
        .expect("the overdue retry is delivered after the restart");
    assert_eq!(text(&m), "later");
    assert_eq!(m.delivery_count, 1);
    assert!(m.id.as_ref().unwrap().topic.ends_with("-RETRY"));
    assert!(now_ms() >= due);
    b.shutdown().await;
}
