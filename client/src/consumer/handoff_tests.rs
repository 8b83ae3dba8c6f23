//! Tests of the hand-off from the driver to the application: a frame's
//! messages arrive as one item (`Delivery`) and the [`Consumer`] hands them
//! out one at a time, each checked against the current stream generation
//! and counted for flow permits as it is taken, in the frame's order and
//! with the payload, properties and delivery count as decoded.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;

use super::shared::{ACTIVE_UNKNOWN, Cmd, Delivery, Shared, TakenTracking};
use super::{Acker, Consumer, SubscriptionType};
use crate::error::Error;
use crate::message::Message;

/// A consumer on hand-made channels, the deliveries' sender, the commands'
/// receiver and the state they share.
type Harness = (
    Consumer,
    mpsc::UnboundedSender<Delivery>,
    super::commands::CmdRx,
    Arc<Shared>,
);

/// A consumer on hand-made channels (no ack timeout). Permits go back every
/// `refill`.
fn consumer(refill: u32) -> Harness {
    consumer_tracking(refill, TakenTracking::Off)
}

/// [`consumer`], telling its driver of takes as `tracking` says.
fn consumer_tracking(refill: u32, tracking: TakenTracking) -> Harness {
    let (cmd_tx, cmd_rx) = super::commands::channel();
    let (out_tx, out_rx) = mpsc::unbounded_channel();
    let shared = Arc::new(Shared {
        topic: "t".into(),
        subscription: "s".into(),
        consumer_name: "c".into(),
        subscription_type: SubscriptionType::Shared,
        epoch: AtomicU64::new(1),
        consumed: AtomicU32::new(0),
        refill_threshold: refill,
        active: AtomicU8::new(ACTIVE_UNKNOWN),
        closed: AtomicBool::new(false),
        track_taken: tracking,
        receipts: false,
        keeps_copies: false,
        request_timeout: Duration::from_secs(5),
        outcome: std::sync::OnceLock::new(),
    });
    let acker = Acker {
        tx: cmd_tx,
        shared: shared.clone(),
        parts: None,
    };
    (Consumer::new(out_rx, acker), out_tx, cmd_rx, shared)
}

/// A message as the driver decodes it from the wire: entry `entry_id` of
/// `t`, a payload of every byte value, a property and a delivery count.
fn message(entry_id: u64, epoch: u64) -> Message {
    let m = ricochet_proto::Message {
        id: Some(ricochet_proto::MessageId {
            topic: "t".into(),
            entry_id,
        }),
        payload: (0..=255u8)
            .map(|b| b.wrapping_add(entry_id as u8))
            .collect(),
        properties: [("k".to_string(), format!("v{entry_id}"))].into(),
        delivery_count: u32::try_from(entry_id % 3).unwrap(),
        ..Default::default()
    };
    Message::from_proto(m, epoch, |t: &str| Arc::from(t)).unwrap()
}

fn frame(ids: std::ops::Range<u64>, epoch: u64, local: bool) -> Delivery {
    Delivery {
        epoch,
        item: Ok(ids.map(|i| message(i, epoch)).collect()),
        local,
    }
}

fn flows(cmds: &mut super::commands::CmdRx) -> Vec<u32> {
    let mut out = Vec::new();
    while let Some(c) = cmds.try_recv() {
        if let Cmd::Flow(n) = c {
            out.push(n);
        }
    }
    out
}

#[tokio::test]
async fn a_frame_is_handed_out_one_message_at_a_time_each_counted_for_permits() {
    let (mut c, out, mut cmds, shared) = consumer(4);
    out.send(frame(0..6, 1, false)).unwrap();
    out.send(frame(6..9, 1, false)).unwrap();
    for i in 0..9u64 {
        let m = c.receive().await.unwrap();
        let want = message(i, 1);
        assert_eq!(m.id().entry_id(), i, "the frames' order");
        assert_eq!(m.payload(), want.payload(), "payload of {i}");
        assert_eq!(m.properties(), want.properties(), "properties of {i}");
        assert_eq!(m.delivery_count(), want.delivery_count());
        if i == 3 {
            // The fourth message taken refills four permits, in the
            // middle of the first frame.
            assert_eq!(flows(&mut cmds), vec![4], "after taking {}", i + 1);
        }
    }
    assert_eq!(flows(&mut cmds), vec![4], "the eighth refills four more");
    assert_eq!(shared.consumed.load(Ordering::Acquire), 1, "the ninth");
}

#[tokio::test]
async fn messages_the_client_redelivers_itself_take_no_permits() {
    let (mut c, out, mut cmds, shared) = consumer(2);
    out.send(frame(0..3, 1, true)).unwrap();
    for i in 0..3 {
        assert_eq!(c.receive().await.unwrap().id().entry_id(), i);
    }
    assert!(flows(&mut cmds).is_empty());
    assert_eq!(shared.consumed.load(Ordering::Acquire), 0);
}

/// The stream broke after the application took part of a frame: the rest
/// of it (the broker redelivers those) is dropped, not handed out, and the
/// new stream's messages come next.
#[tokio::test]
async fn the_rest_of_a_frame_from_an_old_stream_is_dropped() {
    let (mut c, out, mut cmds, shared) = consumer(100);
    out.send(frame(0..4, 1, false)).unwrap();
    assert_eq!(c.receive().await.unwrap().id().entry_id(), 0);
    shared.epoch.store(2, Ordering::Release);
    out.send(frame(10..12, 2, false)).unwrap();
    assert_eq!(c.receive().await.unwrap().id().entry_id(), 10);
    assert_eq!(c.receive().await.unwrap().id().entry_id(), 11);
    assert_eq!(
        shared.consumed.load(Ordering::Acquire),
        3,
        "only messages handed out count for permits"
    );
    assert!(flows(&mut cmds).is_empty());
}

/// An error ending the consumer comes after the messages before it.
#[tokio::test]
async fn an_error_comes_after_the_frame_before_it() {
    let (mut c, out, _cmds, _shared) = consumer(100);
    out.send(frame(0..2, 1, false)).unwrap();
    out.send(Delivery {
        epoch: 1,
        item: Err(Error::invalid_argument("resubscribe failed")),
        local: false,
    })
    .unwrap();
    drop(out);
    assert_eq!(c.receive().await.unwrap().id().entry_id(), 0);
    assert_eq!(c.receive().await.unwrap().id().entry_id(), 1);
    assert!(c.receive().await.is_err(), "the error");
    let end = c.receive().await.unwrap_err();
    assert_eq!(end.kind(), crate::ErrorKind::Closed, "{end}");
}

/// Counts its wakes.
struct Wakes(std::sync::atomic::AtomicUsize);

impl std::task::Wake for Wakes {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// With an ack timeout longer than the ack group window a take is a quiet
/// command: while the driver allows quiet ones (a group armed) it is queued
/// without waking it. With a shorter timeout the first take wakes it (one
/// wake until the driver waits again). Either way each take reaches the
/// driver, in order, with its stream generation.
#[tokio::test]
async fn a_take_wakes_the_driver_only_when_its_ack_timeout_could_pass_unseen() {
    use std::future::Future;
    for (tracking, wakes) in [(TakenTracking::Quiet, 0), (TakenTracking::Wakes, 1)] {
        let (mut c, out, mut cmds, _) = consumer_tracking(1000, tracking);
        let count = Arc::new(Wakes(Default::default()));
        let waker = std::task::Waker::from(count.clone());
        cmds.allow_quiet(10);
        {
            // The driver waits on its queue.
            let mut recv = std::pin::pin!(cmds.recv());
            let polled = recv
                .as_mut()
                .poll(&mut std::task::Context::from_waker(&waker));
            assert!(polled.is_pending());
        }
        out.send(frame(0..3, 1, false)).unwrap();
        for _ in 0..3 {
            c.receive().await.unwrap();
        }
        assert_eq!(count.0.load(Ordering::SeqCst), wakes, "{tracking:?}");
        let mut taken = Vec::new();
        while let Some(cmd) = cmds.try_recv() {
            if let Cmd::Taken { id, epoch, .. } = cmd {
                taken.push((id.entry_id(), epoch));
            }
        }
        assert_eq!(taken, [(0, 1), (1, 1), (2, 1)], "{tracking:?}");
    }
}

#[test]
fn takes_are_quiet_only_when_the_ack_timeout_outlasts_the_ack_group_window() {
    let ms = Duration::from_millis;
    assert_eq!(TakenTracking::of(None, ms(100)), TakenTracking::Off);
    assert_eq!(
        TakenTracking::of(Some(ms(101)), ms(100)),
        TakenTracking::Quiet
    );
    assert_eq!(
        TakenTracking::of(Some(ms(100)), ms(100)),
        TakenTracking::Wakes
    );
    assert_eq!(
        TakenTracking::of(Some(ms(10)), ms(100)),
        TakenTracking::Wakes
    );
}
