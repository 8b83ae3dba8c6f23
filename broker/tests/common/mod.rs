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
