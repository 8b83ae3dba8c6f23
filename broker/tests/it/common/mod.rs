//! What the broker's integration tests share: the testkit, with child
//! brokers run from the binary cargo built for this package.
#![allow(dead_code)]

pub use ricochet_testkit::raw::*;
use ricochet_testkit::{BrokerProcess, SpawnOptions};

/// Spawn options for this package's `ricochet-broker` binary.
pub fn options() -> SpawnOptions {
    SpawnOptions::new().bin(env!("CARGO_BIN_EXE_ricochet-broker"))
}

/// This package's broker binary on `dir`, with the default options.
pub async fn spawn(dir: &std::path::Path) -> BrokerProcess {
    BrokerProcess::spawn(dir, &options()).await
}

/// The stats of subscription `sub` on `topic`, from the broker at `url`.
pub async fn sub_stats(
    url: &str,
    topic: &str,
    sub: &str,
) -> ricochet_proto::SubscriptionStatsResponse {
    ricochet_proto::admin_client::AdminClient::new(channel(url).await)
        .subscription_stats(ricochet_proto::SubscriptionRequest {
            topic: topic.into(),
            subscription: sub.into(),
        })
        .await
        .expect("subscription stats")
        .into_inner()
}

/// One message to dead-letter with [`dead_letter_all`].
pub struct Doomed<'a> {
    pub payload: &'a [u8],
    pub key: &'a str,
    pub properties: &'a [(&'a str, &'a str)],
    /// The consumer's terminate detail (the dead letter's reason says it).
    pub detail: &'a str,
}

/// Publishes each of `doomed` to `topic` and has a consumer of `sub`
/// (Shared) terminate it, so each becomes a dead letter of `sub`; returns
/// the published ids. The consumer is dropped on return.
pub async fn dead_letter_all(
    url: &str,
    topic: &str,
    sub: &str,
    doomed: &[Doomed<'_>],
) -> Vec<ricochet_proto::MessageId> {
    use ricochet_proto::SubscriptionType;
    let mut c = RawConsumer::simple(url, topic, sub, SubscriptionType::Shared).await;
    c.flow(doomed.len() as u32).await;
    let mut p = RawProducer::open(url, topic, "").await.unwrap();
    let msgs = doomed
        .iter()
        .map(|d| {
            let mut m = p.msg(d.payload.to_vec());
            m.key = d.key.into();
            m.properties = d
                .properties
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect();
            m
        })
        .collect();
    let ids = p.send_messages(msgs).await;
    let got = c.take(doomed.len(), WAIT).await;
    for (i, m) in got.iter().enumerate() {
        let d = doomed
            .iter()
            .find(|d| d.payload == m.payload.as_slice())
            .expect("a message that was sent");
        c.terminate(m.id.clone().unwrap(), d.detail, i as u64 + 1)
            .await;
        assert_eq!(c.result(WAIT).await.unwrap().code, 0, "terminate accepted");
    }
    ids
}

/// How many dead letters `sub` holds, by the admin API.
pub async fn dead_letter_count(url: &str, topic: &str, sub: &str) -> u64 {
    ricochet_proto::admin_client::AdminClient::new(channel(url).await)
        .list_dead_letters(ricochet_proto::ListDeadLettersRequest {
            topic: topic.into(),
            subscription: sub.into(),
            ..Default::default()
        })
        .await
        .expect("list dead letters")
        .into_inner()
        .total
}
pub mod tiered;

/// The default namespace's failure-events topic.
pub const EVENTS_TOPIC: &str = "persistent://public/default/__failure_events";

/// An exclusive consumer `sub` of [`EVENTS_TOPIC`] on the broker at `url`,
/// with `permits` to receive.
pub async fn events_consumer(url: &str, sub: &str, permits: u32) -> RawConsumer {
    let events = RawConsumer::simple(
        url,
        EVENTS_TOPIC,
        sub,
        ricochet_proto::SubscriptionType::Exclusive,
    )
    .await;
    events.flow(permits).await;
    events
}
