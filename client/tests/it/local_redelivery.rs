//! Local redelivery of nacks the broker counted ahead: once the broker has
//! stored a held nack's new delivery count, the client hands its own copy
//! back to the application when the delay is over, and tells the broker
//! afterwards. Shown with the broker's answers cut off by a fault proxy: a
//! redelivery that still arrives came from the client.

use crate::common;

use std::time::{Duration, Instant};

use common::{assert_quiet, client, recv, topic};
use ricochet_client::{Consumer, InitialPosition, SubscriptionType};
use ricochet_testkit::{Direction, FaultProxy, InProcessBroker};

const T: Duration = Duration::from_secs(5);
const DELAY: Duration = Duration::from_millis(1_000);

/// How one consumer is set up for local redelivery.
struct Setup {
    name: &'static str,
    sub_type: SubscriptionType,
    local: Option<bool>,
    budget: Option<usize>,
}

/// The message's (state, delivery count) for subscription "s", asked of
/// the broker directly.
async fn broker_view(broker: &InProcessBroker, m: &ricochet_client::Message) -> (String, u32) {
    let info = client(&broker.url())
        .await
        .admin()
        .message(m.id())
        .await
        .unwrap();
    let s = &info.subscriptions[0];
    (s.state.clone(), s.delivery_count)
}

/// Waits until the broker shows `m` in flight at `count`.
async fn until_counted(broker: &InProcessBroker, m: &ricochet_client::Message, count: u32) {
    let deadline = Instant::now() + T;
    loop {
        let view = broker_view(broker, m).await;
        if view == ("in_flight".to_owned(), count) {
            return;
        }
        assert!(Instant::now() < deadline, "never counted ahead: {view:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A consumer behind a proxy that nacked its one message, the nack counted
/// ahead and confirmed; then the broker's answers are cut off. Returns the
/// proxy, broker, consumer and the nacked message.
async fn nacked_then_cut(
    s: &Setup,
) -> (
    FaultProxy,
    InProcessBroker,
    Consumer,
    ricochet_client::Message,
) {
    let broker = InProcessBroker::start().await;
    let upstream = broker.url().trim_start_matches("http://").parse().unwrap();
    let proxy = FaultProxy::start(upstream).await;
    let c = client(&proxy.url()).await;
    let t = topic(s.name);
    let mut b = c
        .consumer(&t)
        .subscription("s")
        .subscription_type(s.sub_type)
        .initial_position(InitialPosition::Earliest)
        .negative_ack_delay(DELAY);
    if let Some(on) = s.local {
        b = b.local_redelivery(on);
    }
    if let Some(bytes) = s.budget {
        b = b.local_redelivery_budget(bytes);
    }
    let mut consumer = b.subscribe().await.unwrap();
    let p = c.producer(&t).create().await.unwrap();
    p.send("payload").await.unwrap();
    let m = recv(&mut consumer, T).await;
    assert_eq!(m.delivery_count(), 0);
    consumer.nack(&m).await.unwrap();
    until_counted(&broker, &m, 1).await;
    // The broker confirms the count once it is durable: give that notice
    // time to arrive before the answers stop.
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.cut(Direction::FromUpstream);
    (proxy, broker, consumer, m)
}

/// On Exclusive (the default there) the redelivery comes from the client
/// while nothing comes from the broker, with the broker's count and the
/// payload; the broker takes the notice: the message stays in flight at
/// count 1, and the next nack of it is counted as attempt 2.
#[tokio::test]
async fn a_counted_nack_comes_back_from_the_client_while_the_broker_is_cut_off() {
    let s = Setup {
        name: "local-exclusive",
        sub_type: SubscriptionType::Exclusive,
        local: None,
        budget: None,
    };
    let (_proxy, broker, mut c, m) = nacked_then_cut(&s).await;
    let again = recv(&mut c, T).await;
    assert_eq!(again.id(), m.id());
    assert_eq!(again.delivery_count(), 1);
    assert_eq!(again.payload().as_ref(), b"payload");
    c.nack(&again).await.unwrap();
    until_counted(&broker, &m, 2).await;
}

/// Where local redelivery is off (Shared by default, a zero budget, or
/// turned off) nothing comes back while the broker's answers are cut off;
/// Shared with it turned on does get it back.
#[tokio::test]
async fn without_local_redelivery_the_nack_waits_for_the_broker() {
    let setups = [
        (SubscriptionType::Shared, None, None, false),
        (SubscriptionType::Exclusive, None, Some(0), false),
        (SubscriptionType::Failover, Some(false), None, false),
        (SubscriptionType::Shared, Some(true), None, true),
    ];
    for (sub_type, local, budget, comes_back) in setups {
        let s = Setup {
            name: "local-off",
            sub_type,
            local,
            budget,
        };
        let (_proxy, _broker, mut c, m) = nacked_then_cut(&s).await;
        if comes_back {
            let again = recv(&mut c, T).await;
            assert_eq!((again.id(), again.delivery_count()), (m.id(), 1));
        } else {
            assert_quiet(&mut c, DELAY + Duration::from_millis(1_500)).await;
        }
    }
}
