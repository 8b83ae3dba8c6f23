//! The consumer's background task: one event loop per consumer that reads
//! the broker's frames and the handles' commands, fires the ack-flush,
//! nack and ack-timeout timers, and handles the stream's life: connected,
//! lost, reconnect ([`stream`], `driver_stream.rs`), close ([`close`],
//! `driver_close.rs`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};

use ricochet_policy::{DeadLetterPolicy, Tier};
use ricochet_proto::{
    Ack, AckType, ConsumeResponse, Flow, ReconsumeLater, Redeliver, Subscribed, Terminate,
    consume_request, consume_response,
};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::acks::AckGroup;
use super::conn::Conn;
use super::redelivery::{InFlight, plan_nack};
use super::requests::{Checking, Pending, PendingMove, Requests};
use super::shared::{
    ACTIVE_NO, ACTIVE_UNKNOWN, ACTIVE_YES, Cmd, Delivery, Reply, Shared, TakenTracking,
};
use super::{Acker, Consumer, ConsumerConfig};
use crate::client::{Client, next_frame, sleep_opt};
use crate::error::{Error, Result};
use crate::ids::{Key, TopicIds};
use crate::message::{Message, MessageId};
use crate::reconnect::Reconnector;

#[path = "driver_close.rs"]
mod close;
#[path = "driver_stream.rs"]
mod stream;

/// The default [`nack_lead`](super::ConsumerBuilder::nack_lead): none, a
/// held nack goes to the broker at its due time. A lead (the nack sent early
/// with the rest of its delay for the broker to serve) saved 3–5 ms of a
/// 35–60 ms lateness in the one measurement taken, and an ack in the lead's
/// window no longer cancels the redelivery, so it is an option, not the
/// default.
pub(super) const NACK_LEAD: Duration = Duration::ZERO;

/// Starts the driver task on a freshly opened stream and returns the
/// application's handle.
pub(super) fn spawn(
    client: Client,
    topic: String,
    cfg: ConsumerConfig,
    conn: Conn,
    subscribed: &Subscribed,
    reconnect: Reconnector,
) -> Consumer {
    let cfg = Arc::new(cfg);
    let (cmd_tx, cmd_rx) = super::commands::channel();
    let (out_tx, out_rx) = mpsc::unbounded_channel();
    let shared = Arc::new(Shared {
        topic: subscribed.topic.clone(),
        subscription: subscribed.subscription.clone(),
        consumer_name: subscribed.consumer_name.clone(),
        subscription_type: cfg.subscription_type,
        epoch: AtomicU64::new(1),
        consumed: AtomicU32::new(0),
        refill_threshold: (cfg.receiver_queue_size / 2).max(1),
        active: AtomicU8::new(ACTIVE_UNKNOWN),
        closed: AtomicBool::new(false),
        track_taken: TakenTracking::of(cfg.ack_timeout, cfg.ack_group_time),
        receipts: cfg.ack_receipts,
        keeps_copies: cfg.local_budget() > 0,
        request_timeout: client.config().request_timeout,
        outcome: std::sync::OnceLock::new(),
    });
    let ids = TopicIds::new(&subscribed.topic);
    let acks = AckGroup::new(cfg.ack_group_time, cfg.ack_group_max);
    let mut inflight = InFlight::new(cfg.ack_timeout, cfg.ack_timeout_tick);
    inflight.set_local_budget(cfg.local_budget());
    let mut driver = Driver {
        client,
        topic,
        cfg,
        shared: shared.clone(),
        rx: cmd_rx,
        out: out_tx,
        conn: None,
        epoch: 1,
        ids,
        policy: None,
        inflight,
        acks,
        requests: Requests::new(),
        to_check: Vec::new(),
        checking: Checking::default(),
        acks_lost: 0,
        moves_lost: 0,
        reconnect,
        closing: None,
        close_waiters: Vec::new(),
    };
    driver.connected(conn, subscribed);
    tokio::spawn(driver.run());
    Consumer::new(
        out_rx,
        Acker {
            tx: cmd_tx,
            shared,
            parts: None,
        },
    )
}

enum Event {
    Response(Result<Option<ConsumeResponse>, tonic::Status>),
    Cmd(Option<Cmd>),
    AckFlush,
    NackDue,
    AckTimeout,
    Reconnect,
    CloseDeadline,
}

struct Driver {
    client: Client,
    topic: String,
    cfg: Arc<ConsumerConfig>,
    shared: Arc<Shared>,
    rx: super::commands::CmdRx,
    out: mpsc::UnboundedSender<Delivery>,
    conn: Option<Conn>,
    epoch: u64,
    ids: TopicIds,
    policy: Option<Arc<dyn DeadLetterPolicy>>,
    inflight: InFlight,
    acks: AckGroup,
    requests: Requests,
    /// Acks made before the stream broke and never confirmed: the new
    /// stream asks the broker which of them were applied.
    to_check: Vec<MessageId>,
    /// Acks lost (with broken streams, or refused) since a `flush` or
    /// `close` last reported them.
    /// Callers of acks sent on a broken stream, until the check answers.
    checking: Checking,
    acks_lost: u64,
    /// Queued `reconsume_later`s refused by the broker or unanswered when
    /// a stream broke, since a `flush` or `close` last reported them.
    moves_lost: u64,
    reconnect: Reconnector,
    closing: Option<Instant>,
    /// The callers of `close` waiting for its outcome.
    close_waiters: Vec<Reply>,
}

impl Driver {
    async fn run(mut self) {
        let mut rx_open = true;
        loop {
            let nack_due = self
                .inflight
                .nack_deadline()
                .map(|d| d.checked_sub(self.cfg.nack_lead).unwrap_or(d));
            let ack_timeout_due = self.inflight.ack_timeout_deadline();
            let reconnect = if self.conn.is_none() {
                self.reconnect.due()
            } else {
                None
            };
            // Plain acks may wait in the queue unwoken while a group is
            // armed, up to its room: taken at the next wake, at the latest
            // at the flush deadline (`commands`).
            let quiet_room = match self.acks.deadline() {
                Some(_) if self.conn.is_some() => {
                    self.cfg.ack_group_max.saturating_sub(self.acks.unsent())
                }
                _ => 0,
            };
            self.rx.allow_quiet(quiet_room);
            let event = tokio::select! {
                biased;
                r = next_frame(self.conn.as_mut().map(|c| &mut c.inbound)) => Event::Response(r),
                // Before every timer: queued commands (quiet acks among
                // them, `commands`) are taken before a timer acts.
                c = self.rx.recv(), if rx_open => Event::Cmd(c),
                _ = sleep_opt(self.acks.deadline()) => Event::AckFlush,
                _ = sleep_opt(nack_due) => Event::NackDue,
                _ = sleep_opt(ack_timeout_due) => Event::AckTimeout,
                _ = sleep_opt(reconnect) => Event::Reconnect,
                _ = sleep_opt(self.closing) => Event::CloseDeadline,
            };
            match event {
                Event::Response(Ok(Some(r))) => {
                    let messages =
                        matches!(r.response, Some(consume_response::Response::Messages(_)));
                    self.on_response(r);
                    if messages {
                        // Let the application take what was handed over
                        // before the next frame is decoded: a task woken
                        // from here waits in this worker's LIFO slot, which
                        // no other worker steals, so a burst's first frame
                        // was not received until its last was decoded.
                        tokio::task::yield_now().await;
                        // And take the commands the application queued
                        // meanwhile (flow permits, acks): the biased select
                        // left them behind every frame still coming, so a
                        // burst's refill of permits reached the broker only
                        // once the consumer had decoded the whole burst.
                        self.take_queued(rx_open);
                    }
                }
                Event::Response(Ok(None)) => {
                    self.take_queued(rx_open);
                    self.lost("the broker ended the consumer stream".into())
                }
                Event::Response(Err(s)) => {
                    self.take_queued(rx_open);
                    let e = self.client.stream_broke(s);
                    self.lost(e.to_string());
                }
                Event::Cmd(Some(cmd)) => {
                    self.on_cmd(cmd);
                    self.take_queued(rx_open);
                }
                Event::Cmd(None) => {
                    // Every handle is gone: flush acks and stop.
                    rx_open = false;
                    self.start_close(None);
                }
                // No command is queued when a timer wins: the biased select
                // takes queued ones first (quiet acks make this flush, and a
                // message acked is never timed out or redelivered).
                Event::AckFlush => self.flush_acks(),
                Event::NackDue => self.fire_nacks(Instant::now()),
                Event::AckTimeout => self.fire_ack_timeouts(),
                Event::Reconnect => self.reconnect().await,
                Event::CloseDeadline => {
                    let r = self.confirmed("the broker did not confirm them in time");
                    self.finish_close(r);
                }
            }
            self.send_redeliveries();
            if self.closing.is_some()
                && self.close_waiters.is_empty()
                && !self.requests.close_pending()
            {
                break;
            }
            if self.out.is_closed() && self.closing.is_none() {
                // The Consumer was dropped (only ackers remain): close.
                self.start_close(None);
            }
        }
        self.shared.closed.store(true, Ordering::Release);
        if self.shared.outcome.get().is_none() {
            // Stopped without a close (it could not resubscribe): a later
            // `close` reports what was never confirmed.
            let r = self.confirmed("the consumer stopped before the broker confirmed them");
            let _ = self.shared.outcome.set(r);
        }
        let _ = self.fail_waiting(Error::closed, false);
        self.checking.fail(Error::closed);
    }

    /// Handles up to 1 024 commands already queued (none once the queue
    /// has ended).
    fn take_queued(&mut self, rx_open: bool) {
        for _ in 0..if rx_open { 1024 } else { 0 } {
            match self.rx.try_recv() {
                Some(cmd) => self.on_cmd(cmd),
                None => break,
            }
        }
        // Acks someone awaits (ack receipts) go once every command queued
        // so far is in: those awaited together share a frame, and none
        // waits out the window.
        if self.cfg.ack_flush_on_idle && self.acks.awaited() {
            self.flush_acks();
        }
    }

    fn on_response(&mut self, r: ConsumeResponse) {
        match r.response {
            Some(consume_response::Response::Messages(batch)) => {
                tracing::trace!(target: "ricochet::burst", n = batch.messages.len(), "client: a frame of messages decoded");
                let mut messages = Vec::with_capacity(batch.messages.len());
                for m in batch.messages {
                    let Some(msg) = Message::from_proto(m, self.epoch, |t| self.ids.intern(t))
                    else {
                        tracing::warn!("dropping a message without an id");
                        continue;
                    };
                    let Some(key) = self.ids.key(&msg.id) else {
                        tracing::warn!(id = %msg.id, "dropping a message from an unexpected topic");
                        continue;
                    };
                    self.inflight.delivered(key);
                    messages.push(msg);
                }
                // One send per frame (see `Delivery`).
                if !messages.is_empty() {
                    let _ = self.out.send(Delivery {
                        epoch: self.epoch,
                        item: Ok(messages),
                        local: false,
                    });
                }
            }
            Some(consume_response::Response::Result(r)) => self.on_result(r),
            Some(consume_response::Response::ActiveChange(a)) => {
                if !a.active {
                    // Its held nacks are redelivered by the broker, to
                    // the consumer that is active now.
                    self.inflight.forget_local_copies();
                }
                self.shared.active.store(
                    if a.active { ACTIVE_YES } else { ACTIVE_NO },
                    Ordering::Relaxed,
                );
            }
            Some(consume_response::Response::AckedIds(a)) => self.on_acked_ids(a),
            Some(consume_response::Response::CountedAhead(c)) => {
                for m in c.messages {
                    let Some(id) = m.id else { continue };
                    let id = MessageId::new(self.ids.intern(&id.topic), id.entry_id);
                    if let Some(key) = self.ids.key(&id) {
                        self.inflight.counted_ahead(key, m.delivery_count);
                    }
                }
            }
            Some(consume_response::Response::Subscribed(_)) | None => {
                tracing::debug!("ignoring an unexpected consumer frame");
            }
        }
    }

    fn on_result(&mut self, r: ricochet_proto::CommandResult) {
        let request_id = r.request_id;
        if request_id == 0 {
            if r.code != 0 {
                tracing::warn!(code = r.code, message = %r.message, sub = %self.shared.subscription, "the broker rejected a consumer request");
            }
            return;
        }
        let result = if r.code == 0 {
            Ok(())
        } else {
            Err(Error::from_frame(r.code, r.message, &r.details))
        };
        let Some((pending, result)) = self.requests.answer(request_id, result) else {
            return;
        };
        if result.is_ok() {
            // Everything sent before it is durable too.
            for w in self.requests.confirm_before(request_id) {
                let _ = w.send(Ok(()));
            }
        }
        match pending {
            Pending::Move(m) => {
                if let Err(e) = &result {
                    if let Some(k) = m.key.filter(|_| m.epoch == self.epoch) {
                        // Still in flight on the broker: track it again.
                        self.inflight.track(k, Instant::now());
                    }
                    if m.reply.is_none() {
                        // Queued: nobody waits, so the next flush or close
                        // reports it.
                        self.moves_lost += 1;
                        tracing::warn!(error = %e, sub = %self.shared.subscription, "the broker refused a queued reconsume_later");
                    }
                }
                if let Some(reply) = m.reply {
                    let _ = reply.send(result);
                }
            }
            Pending::Settled { waiters, ids } => {
                if let Err(e) = &result {
                    // Refused: those acks did not apply.
                    self.acks_lost += ids.len() as u64;
                    tracing::warn!(error = %e, acks = ids.len(), sub = %self.shared.subscription, "the broker refused acks");
                }
                for w in waiters {
                    let _ = w.send(result.clone());
                }
            }
            Pending::Flush(reply) => {
                let r = result.and_then(|()| self.confirmed(""));
                let _ = reply.send(r);
            }
            Pending::Close => {
                let r = result.and_then(|()| self.confirmed(""));
                self.finish_close(r);
            }
            // Answered by `AckedIds`, not a `CommandResult`.
            Pending::Check { .. } => {}
        }
    }

    /// Which acks from a broken stream the broker had applied: the others
    /// are lost (their messages are redelivered); the applied ones become
    /// durable with the next confirmed request.
    fn on_acked_ids(&mut self, a: ricochet_proto::AckedIds) {
        let Some((Pending::Check { ids: asked }, _)) = self.requests.answer(a.request_id, Ok(()))
        else {
            return;
        };
        self.acks_lost += asked.len().saturating_sub(a.ids.len()) as u64;
        let applied: Vec<MessageId> = a
            .ids
            .iter()
            .map(|id| MessageId::new(self.ids.intern(&id.topic), id.entry_id))
            .collect();
        // Callers whose acks were all applied learn so once they are durable.
        let waiters = self.checking.answer(&applied);
        if applied.is_empty() {
            return;
        }
        let someone_waits = !waiters.is_empty();
        let pending = Pending::Settled {
            waiters,
            ids: applied,
        };
        if someone_waits {
            self.barrier(pending);
        } else {
            self.requests.start(pending);
        }
    }

    /// Acks not yet confirmed (sent and unanswered, held, or being
    /// checked) and queued moves not yet answered.
    fn unconfirmed(&self) -> u64 {
        (self.requests.unconfirmed_acks()
            + self.acks.unsent()
            + self.to_check.len()
            + self.requests.unconfirmed_moves()) as u64
    }

    /// `Ok` when no ack is unconfirmed or lost, else
    /// [`ErrorKind::Unconfirmed`](crate::ErrorKind::Unconfirmed) explaining with `why` (lost acks are reported
    /// once).
    fn confirmed(&mut self, why: &str) -> Result<()> {
        let pending = self.unconfirmed();
        let lost = std::mem::take(&mut self.acks_lost);
        let moves = std::mem::take(&mut self.moves_lost);
        if pending + lost + moves == 0 {
            return Ok(());
        }
        let mut reasons = Vec::new();
        if lost > 0 {
            reasons.push(format!(
                "{lost} lost with a broken stream or refused (the broker redelivers those messages)"
            ));
        }
        if moves > 0 {
            reasons.push(format!(
                "{moves} queued reconsume_later refused, or unanswered when the stream broke \
                 (a message not moved is redelivered)"
            ));
        }
        if pending > 0 {
            reasons.push(format!(
                "{pending} unanswered{}{why}",
                if why.is_empty() { "" } else { ": " }
            ));
        }
        Err(Error::unconfirmed(
            pending + lost + moves,
            reasons.join("; "),
        ))
    }

    /// Answers everything still waiting on this stream with `error()`, but
    /// with `hold` the callers of acks sent (they learn from the next
    /// stream's check); returns the acks made and never confirmed, to check
    /// on the next one.
    fn fail_waiting(&mut self, error: impl Fn() -> Error, hold: bool) -> Vec<MessageId> {
        let (mut unconfirmed, held) = self.acks.reset();
        for w in held {
            let _ = w.send(Err(error()));
        }
        for w in self.inflight.clear() {
            let _ = w.send(Err(error()));
        }
        for p in self.requests.drain() {
            match p {
                Pending::Move(m) => match m.reply {
                    Some(reply) => {
                        let _ = reply.send(Err(error()));
                    }
                    // Applied or not, nobody can tell now; if not, the
                    // broker redelivers the message.
                    None => self.moves_lost += 1,
                },
                Pending::Settled { waiters, ids } => {
                    unconfirmed.extend(ids.iter().cloned());
                    if hold && !ids.is_empty() && !waiters.is_empty() {
                        self.checking.hold(ids, waiters);
                    } else {
                        for w in waiters {
                            let _ = w.send(Err(error()));
                        }
                    }
                }
                Pending::Flush(reply) => {
                    let _ = reply.send(Err(error()));
                }
                // Asked again on the next stream.
                Pending::Check { ids } => unconfirmed.extend(ids),
                Pending::Close => {}
            }
        }
        unconfirmed
    }

    fn is_stale(&self, epoch: Option<u64>) -> bool {
        epoch.is_some_and(|e| e != self.epoch)
    }

    fn on_cmd(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Ack { id, epoch, reply } => {
                // An ack taken before a reconnect never applies to a message
                // delivered after it.
                let Some(reply) = self.refuse_stale(&id, epoch, reply) else {
                    return;
                };
                match self.ids.key(&id) {
                    Some(key) if self.inflight.settle(&key) => self.acks.add(id, reply),
                    _ => self.acks.add_loose(id, reply),
                }
                self.schedule_ack_flush();
            }
            Cmd::Idle => {
                if self.cfg.ack_flush_on_idle && self.acks.unsent() > 0 {
                    self.flush_acks();
                }
            }
            Cmd::AckCumulative { id, epoch, reply } => {
                let Some(reply) = self.refuse_stale(&id, epoch, reply) else {
                    return;
                };
                self.acks.add_cumulative(id, reply);
                self.schedule_ack_flush();
            }
            Cmd::Nack {
                id,
                epoch,
                delivery_count,
                detail,
                reply,
                copy,
                at,
            } => {
                let Some(reply) = self.refuse_stale(&id, Some(epoch), reply) else {
                    return;
                };
                let Some(key) = self.ids.key(&id).filter(|k| self.inflight.settle(k)) else {
                    if let Some(r) = reply {
                        let _ = r.send(Err(Error::invalid_argument(format!(
                            "{id} is not outstanding on this consumer (already settled)"
                        ))));
                    }
                    return;
                };
                let copy = copy.map(|c| *c);
                self.nack(key, &id, delivery_count, detail, reply, copy, at);
            }
            Cmd::ReconsumeLater {
                id,
                epoch,
                delay,
                properties,
                detail,
                reply,
                at,
            } => {
                let key = self.ids.key(&id);
                self.command(key, epoch, reply, Some(at), |request_id| {
                    consume_request::Request::ReconsumeLater(ReconsumeLater {
                        request_id,
                        id: Some(id.to_proto()),
                        delay: Some(delay),
                        properties,
                        detail,
                        // Set when the transport takes the frame.
                        waited_us: 0,
                    })
                });
            }
            Cmd::Terminate {
                id,
                epoch,
                detail,
                reply,
            } => {
                let key = self.ids.key(&id);
                self.command(key, epoch, Some(reply), None, |request_id| {
                    consume_request::Request::Terminate(Terminate {
                        request_id,
                        id: Some(id.to_proto()),
                        detail,
                    })
                });
            }
            Cmd::Taken { id, epoch, at } => {
                if epoch != self.epoch {
                    return;
                }
                let Some(key) = self.ids.key(&id) else {
                    return;
                };
                self.inflight.taken(key, at);
            }
            Cmd::Flow(n) => {
                if let Some(c) = &self.conn {
                    c.send(consume_request::Request::Flow(Flow { permits: n }));
                }
            }
            Cmd::Flush(reply) => self.flush(reply),
            Cmd::Close(reply) => self.start_close(Some(reply)),
        }
    }

    /// `Some(reply)` to go on with a command of stream `epoch`; `None` when
    /// the message came on an earlier stream (its caller is told).
    fn refuse_stale(
        &self,
        id: &MessageId,
        epoch: Option<u64>,
        reply: Option<Reply>,
    ) -> Option<Option<Reply>> {
        if !self.is_stale(epoch) {
            return Some(reply);
        }
        if let Some(r) = reply {
            let _ = r.send(Err(Error::stale_delivery(id.to_string())));
        }
        None
    }

    /// Sends the held acks and a barrier whose answer confirms every ack so far.
    fn flush(&mut self, reply: Reply) {
        if self.closing.is_some() {
            let _ = reply.send(Err(Error::closed()));
            return;
        }
        if self.conn.is_none() {
            let _ = reply.send(self.confirmed("the consumer is reconnecting"));
            return;
        }
        self.flush_acks();
        self.barrier(Pending::Flush(reply));
    }

    /// Plans the nack of `key` made by the application at `now` (its delay
    /// runs from then, not from when this driver got to it).
    #[allow(clippy::too_many_arguments)]
    fn nack(
        &mut self,
        key: Key,
        id: &MessageId,
        delivery_count: u32,
        detail: Option<String>,
        reply: Option<Reply>,
        copy: Option<Message>,
        now: Instant,
    ) {
        let tier = if self.ids.is_main(key) {
            Tier::Main
        } else {
            Tier::Retry
        };
        let plan = plan_nack(
            self.policy.as_deref(),
            self.cfg.negative_ack_delay,
            id,
            tier,
            delivery_count,
            detail.as_deref(),
        )
        .holder(self.cfg.broker_nack_threshold, self.cfg.ack_receipts);
        self.inflight.nack(key, id, plan, detail, now, reply, copy);
    }

    /// Sends a move request (built by `request` from its id) for the
    /// message `key` of stream `epoch`; `reply` gets the broker's answer
    /// (`None`: queued, counted until answered and reported by `flush`);
    /// `made`: when the application asked (see `Conn::send_made`).
    fn command(
        &mut self,
        key: Option<Key>,
        epoch: u64,
        reply: Option<Reply>,
        made: Option<Instant>,
        request: impl FnOnce(u64) -> consume_request::Request,
    ) {
        if epoch != self.epoch {
            // The broker redelivers the message after the reconnect; only
            // that delivery can be moved.
            if let Some(reply) = reply {
                let id = request(0);
                let _ = reply.send(Err(Error::stale_delivery(format!("{id:?}"))));
            }
            return;
        }
        let Some(conn) = &self.conn else {
            match reply {
                Some(reply) => {
                    let _ = reply.send(Err(Error::disconnected("the consumer is reconnecting")));
                }
                None => self.moves_lost += 1,
            }
            return;
        };
        let rid = self
            .requests
            .start(Pending::Move(PendingMove { reply, key, epoch }));
        conn.send_made(request(rid), made);
        if let Some(k) = &key {
            self.inflight.settle(k);
        }
    }

    fn schedule_ack_flush(&mut self) {
        if self.acks.due_now(Instant::now()) {
            self.flush_acks();
        }
    }

    /// Sends the held acks, each frame with a request id: its answer
    /// confirms it (and, under ack receipts, answers its callers).
    fn flush_acks(&mut self) {
        if self.conn.is_none() {
            self.acks.disarm();
            return;
        }
        let flush = self.acks.take();
        if let Some(through) = flush.cumulative_through {
            // Drop what the cumulative ack covers from the trackers.
            let ids = &self.ids;
            self.inflight.settle_through(through, |k| ids.is_main(k));
        }
        for frame in flush.frames {
            let mut ack = frame.ack;
            ack.request_id = self.requests.start(Pending::Settled {
                waiters: frame.waiters,
                ids: frame.ids,
            });
            self.send(consume_request::Request::Ack(ack));
        }
    }

    /// Sends an empty ack frame whose answer (the broker answers once
    /// everything before it is durable) goes to `pending`.
    fn barrier(&mut self, pending: Pending) {
        let request_id = self.requests.start(pending);
        self.send(consume_request::Request::Ack(Ack {
            request_id,
            ack_type: AckType::Individual as i32,
            ids: Vec::new(),
        }));
    }

    fn send(&self, request: consume_request::Request) {
        if let Some(conn) = &self.conn {
            conn.send(request);
        }
    }

    /// Readies for redelivery every held nack due by `until`, with its
    /// reason; those the broker counted ahead, with a copy kept here, go
    /// straight back to the application.
    fn fire_nacks(&mut self, until: Instant) {
        let covered = cumulative_covers(&self.ids, &self.acks);
        let here = self
            .inflight
            .fire_nacks(until, self.cfg.nack_lead, &self.ids, covered);
        if !here.is_empty() {
            let _ = self.out.send(Delivery {
                epoch: self.epoch,
                item: Ok(here),
                local: true,
            });
        }
    }

    /// Readies for redelivery every outstanding id past its ack timeout.
    fn fire_ack_timeouts(&mut self) {
        let covered = cumulative_covers(&self.ids, &self.acks);
        self.inflight
            .fire_ack_timeouts(Instant::now(), &self.ids, covered);
    }

    /// Sends the failures gathered this turn in one `Redeliver` request
    /// (with a request id when some caller waits for its confirmation).
    fn send_redeliveries(&mut self) {
        let ready = self.inflight.take_failures();
        if ready.is_empty() {
            return;
        }
        let mut messages = Vec::with_capacity(ready.len());
        let mut due = Vec::with_capacity(ready.len());
        let mut waiters = Vec::new();
        for r in ready {
            messages.push(r.failure);
            due.push(r.due);
            waiters.extend(r.reply);
        }
        let Some(conn) = &self.conn else {
            for w in waiters {
                let _ = w.send(Err(Error::disconnected("the consumer is reconnecting")));
            }
            return;
        };
        let request_id = if waiters.is_empty() {
            0
        } else {
            self.requests.start(Pending::Settled {
                waiters,
                ids: Vec::new(),
            })
        };
        // Each broker-held hold is set again from its end when the
        // transport takes the frame (`conn::stamped`).
        conn.send_redeliver(
            Redeliver {
                request_id,
                messages,
            },
            due,
        );
    }
}

/// Whether a cumulative ack on this stream covers a key: main-topic ids
/// through its entry.
fn cumulative_covers<'a>(ids: &'a TopicIds, acks: &'a AckGroup) -> impl Fn(Key) -> bool + 'a {
    move |k| ids.is_main(k) && acks.covers(k.1)
}
