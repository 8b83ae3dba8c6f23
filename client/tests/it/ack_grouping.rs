//! Ack grouping's idle flush (`ack_flush_on_idle`): acks held for a long
//! `ack_group_time` reach the broker as soon as the application waits on an
//! empty queue, on a plain and on a partitioned topic; turned off, they wait
//! for the window. Under key order, a consumer taking one message at a time
//! of a single key is not held to one message per `ack_group_time`.
//! Plain acks that waited in the command queue without waking the driver
//! (`consumer/commands.rs`) go with their group at its deadline.

use crate::common;

use std::time::{Duration, Instant};

use common::{Env, recv, start, text, topic};
use ricochet_client::{Consumer, InitialPosition, KeyOrder, OutgoingMessage, SubscriptionType};
use ricochet_proto::UpdatePartitionsRequest;
use ricochet_proto::partitions_client::PartitionsClient;

const T: Duration = Duration::from_secs(10);
/// Longer than any test runs: a group that waits for it never flushes here.
const LONG: Duration = Duration::from_secs(600);

async fn consumer(env: &Env, t: &str, on: bool, key_order: bool) -> Consumer {
    let mut b = env
        .client
        .consumer(t)
        .subscription("s")
        .subscription_type(SubscriptionType::Exclusive)
        .initial_position(InitialPosition::Earliest)
        .ack_group_time(LONG)
        .ack_flush_on_idle(on);
    if key_order {
        b = b.key_order(KeyOrder::new());
    }
    b.subscribe().await.unwrap()
}

async fn publish(env: &Env, t: &str, n: usize, key: &str) {
    let p = env.client.producer(t).create().await.unwrap();
    for i in 0..n {
        drop(
            p.send_async(OutgoingMessage::builder(format!("m{i}")).key(key).build())
                .await
                .unwrap(),
        );
    }
    p.flush().await.unwrap();
}

/// The subscription's unacked count (summed over partitions by the admin
/// API on a partitioned topic) once it settles at `want`, or what it still
/// is after `within`.
async fn unacked_settles(env: &Env, t: &str, want: u64, within: Duration) -> u64 {
    let start = Instant::now();
    loop {
        let s = env.client.admin().subscription_stats(t, "s").await.unwrap();
        if s.unacked == want || start.elapsed() > within {
            return s.unacked;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Receives `n`, acks each, then waits on the empty queue in the
/// background; returns the waiting task.
async fn ack_all_then_wait(mut c: Consumer, n: usize) -> tokio::task::JoinHandle<()> {
    for _ in 0..n {
        let m = recv(&mut c, T).await;
        c.ack(&m).await.unwrap();
    }
    tokio::spawn(async move {
        let _ = c.receive().await;
    })
}

#[tokio::test]
async fn held_acks_go_once_the_application_waits_on_an_empty_queue() {
    let env = start().await;
    let t = topic("ag-idle");
    publish(&env, &t, 3, "").await;
    let waiting = ack_all_then_wait(consumer(&env, &t, true, false).await, 3).await;
    assert_eq!(unacked_settles(&env, &t, 0, T).await, 0);
    waiting.abort();
}

#[tokio::test]
async fn without_the_idle_flush_acks_wait_for_the_group_window() {
    let env = start().await;
    let t = topic("ag-off");
    publish(&env, &t, 3, "").await;
    let waiting = ack_all_then_wait(consumer(&env, &t, false, false).await, 3).await;
    // The broker still counts the three as unacked a second later.
    assert_eq!(
        unacked_settles(&env, &t, 0, Duration::from_secs(1)).await,
        3
    );
    waiting.abort();
}

#[tokio::test]
async fn a_partitioned_consumer_flushes_every_partition_when_idle() {
    let env = start().await;
    let t = topic("ag-parts");
    PartitionsClient::new(env.client.channel())
        .create_partitioned_topic(UpdatePartitionsRequest {
            topic: t.clone(),
            partitions: 3,
            replicas: 0,
        })
        .await
        .unwrap();
    let p = env.client.producer(&t).create().await.unwrap();
    for i in 0..9 {
        let m = OutgoingMessage::builder(format!("m{i}")).key(format!("k{i}"));
        drop(p.send_async(m.build()).await.unwrap());
    }
    p.flush().await.unwrap();
    let waiting = ack_all_then_wait(consumer(&env, &t, true, false).await, 9).await;
    assert_eq!(unacked_settles(&env, &t, 0, T).await, 0);
    waiting.abort();
}

#[tokio::test]
async fn an_awaited_ack_receipt_does_not_wait_out_the_group_window() {
    let env = start().await;
    let t = topic("ag-receipts");
    publish(&env, &t, 3, "").await;
    let mut c = env
        .client
        .consumer(&t)
        .subscription("s")
        .initial_position(InitialPosition::Earliest)
        .ack_receipts(true)
        .ack_group_time(LONG)
        .subscribe()
        .await
        .unwrap();
    // Receive all three first, so no wait on an empty queue flushes them.
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(recv(&mut c, T).await);
    }
    for m in &got {
        tokio::time::timeout(T, c.ack(m))
            .await
            .expect("the receipt came before the group window")
            .unwrap();
    }
    assert_eq!(unacked_settles(&env, &t, 0, T).await, 0);
}

#[tokio::test]
async fn one_key_in_order_is_not_held_to_one_message_per_group_window() {
    // Key order lets one message of a key out at a time: the next goes
    // only once the broker has the ack. With a group window longer than
    // the test, only the idle flush can get the 20 through.
    let env = start().await;
    let t = topic("ag-key-order");
    publish(&env, &t, 20, "only-key").await;
    let mut c = consumer(&env, &t, true, true).await;
    for i in 0..20 {
        let m = recv(&mut c, T).await;
        assert_eq!(text(&m), format!("m{i}"));
        c.ack(&m).await.unwrap();
    }
    c.close().await.unwrap();
}

/// Five plain acks made while the application stays busy (it never waits
/// on the queue, so nothing else wakes the driver): the first arms the
/// group's flush, the other four, made 50 ms later, wait quietly in the
/// command queue, and the flush at the deadline takes them first, so all
/// five go in one frame. The broker's unacked count goes from 5 to 0 with nothing in
/// between (a flush without the queued four would leave 4 for a window).
#[tokio::test]
async fn quiet_acks_go_with_their_group_at_its_deadline() {
    let env = start().await;
    let t = topic("ag-quiet");
    publish(&env, &t, 5, "").await;
    let mut c = env
        .client
        .consumer(&t)
        .subscription("s")
        .subscription_type(SubscriptionType::Exclusive)
        .initial_position(InitialPosition::Earliest)
        .ack_group_time(Duration::from_millis(400))
        .ack_flush_on_idle(false)
        .subscribe()
        .await
        .unwrap();
    let mut got = Vec::new();
    for _ in 0..5 {
        got.push(recv(&mut c, T).await);
    }
    assert_eq!(unacked_settles(&env, &t, 5, T).await, 5);
    // The first ack arms the flush; once the driver is back waiting, the
    // other four queue without waking it.
    c.ack(&got[0]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    for m in &got[1..] {
        c.ack(m).await.unwrap();
    }
    let start = Instant::now();
    let mut seen = Vec::new();
    loop {
        let s = env
            .client
            .admin()
            .subscription_stats(&t, "s")
            .await
            .unwrap();
        if seen.last() != Some(&s.unacked) {
            seen.push(s.unacked);
        }
        if s.unacked == 0 || start.elapsed() > T {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(seen, vec![5, 0], "unacked counts seen, in order");
    drop(c);
}
