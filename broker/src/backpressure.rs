//! Backpressure on a client stream: a [`StreamBudget`] bounds what one
//! stream has taken off the wire and the broker has not finished with, so a
//! client that sends faster than the broker handles (or never reads its
//! answers) cannot grow the broker's memory without bound.
//!
//! Two counts share one limit. Requests: each request read from the stream
//! takes [`Admitted`] units from a semaphore (one per message id it names,
//! at least one), and the units travel with the request to the subscription
//! actor, which drops them once it has handled the request. Answers: every
//! event queued back to the client other than messages (which flow permits
//! bound) is counted until the stream's writer takes it. While either count
//! is at the limit the stream's reader stops polling the stream, so HTTP/2
//! flow control pushes back on the client. The actor and the writer never
//! wait on the budget: only the reader does, so a client that reads its
//! stream always makes progress.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// Units held by a request between the stream's reader and the end of its
/// handling; dropping it gives them back.
#[derive(Debug)]
pub struct Admitted {
    _units: OwnedSemaphorePermit,
}

/// The budget of one client stream (see the module docs).
#[derive(Debug)]
pub struct StreamBudget {
    limit: usize,
    intake: Arc<Semaphore>,
    /// Answers queued to the client, not yet taken by the writer.
    answers: AtomicUsize,
    /// Signalled when `answers` drops below the limit.
    answer_taken: Notify,
    /// Who the stream is, for the log and the metric labels.
    topic: String,
    subscription: String,
    /// Whether this stream was throttled before (the first time logs at
    /// INFO, later ones at DEBUG).
    throttled_before: AtomicBool,
    metrics: OnceLock<ThrottleMetrics>,
}

#[derive(Debug)]
struct ThrottleMetrics {
    throttled: metrics::Counter,
    paused: metrics::Gauge,
}

/// Why a stream's reader paused.
#[derive(Debug, Clone, Copy)]
enum Cause {
    Requests,
    Answers,
}

impl StreamBudget {
    /// A budget of `limit` units (at least one) for a consumer stream on
    /// `topic` and `subscription`.
    pub fn new(limit: u32, topic: String, subscription: String) -> Arc<Self> {
        let limit = limit.max(1) as usize;
        Arc::new(Self {
            limit,
            intake: Arc::new(Semaphore::new(limit)),
            answers: AtomicUsize::new(0),
            answer_taken: Notify::new(),
            topic,
            subscription,
            throttled_before: AtomicBool::new(false),
            metrics: OnceLock::new(),
        })
    }

    /// Units of a request naming `ids` message ids: one per id, at least
    /// one, at most the whole budget (a request larger than the budget is
    /// admitted alone).
    fn units(&self, ids: usize) -> u32 {
        // `limit` came from a u32.
        ids.clamp(1, self.limit) as u32
    }

    /// The units for a request naming `ids` message ids, if neither the
    /// requests nor the answers of the stream are at the limit.
    pub fn try_admit(&self, ids: usize) -> Option<Admitted> {
        if self.answers.load(Ordering::Acquire) >= self.limit {
            return None;
        }
        let permit = self
            .intake
            .clone()
            .try_acquire_many_owned(self.units(ids))
            .ok()?;
        Some(Admitted { _units: permit })
    }

    /// Takes the units for a request naming `ids` message ids, waiting
    /// while the requests or the answers of the stream are at the limit.
    /// `None` only if the budget was closed (it never is).
    pub async fn admit(&self, ids: usize) -> Option<Admitted> {
        if let Some(admitted) = self.try_admit(ids) {
            return Some(admitted);
        }
        let n = self.units(ids);
        let permit = match self.intake.clone().try_acquire_many_owned(n) {
            Ok(p) => p,
            Err(_) => {
                let _paused = self.pause(Cause::Requests);
                self.intake.clone().acquire_many_owned(n).await.ok()?
            }
        };
        if self.answers.load(Ordering::Acquire) >= self.limit {
            let _paused = self.pause(Cause::Answers);
            while self.answers.load(Ordering::Acquire) >= self.limit {
                self.answer_taken.notified().await;
            }
        }
        Some(Admitted { _units: permit })
    }

    /// An answer was queued to the client.
    pub fn answer_queued(&self) {
        self.answers.fetch_add(1, Ordering::AcqRel);
    }

    /// The writer took an answer off the queue (or it was never queued).
    pub fn answer_taken(&self) {
        let before = self.answers.fetch_sub(1, Ordering::AcqRel);
        if before == self.limit {
            // Stored when the reader is not waiting yet: it finds it.
            self.answer_taken.notify_one();
        }
    }

    /// Request units held now (read from the stream, not yet handled).
    pub fn requests_pending(&self) -> usize {
        self.limit - self.intake.available_permits()
    }

    /// Answers queued now, not yet taken by the writer.
    pub fn answers_pending(&self) -> usize {
        self.answers.load(Ordering::Acquire)
    }

    /// Counts and logs a pause of the reader; the guard marks its end.
    fn pause(&self, cause: Cause) -> Paused<'_> {
        let m = self.metrics.get_or_init(|| {
            let labels = [
                ("topic", self.topic.clone()),
                ("subscription", self.subscription.clone()),
            ];
            ThrottleMetrics {
                throttled: metrics::counter!("ricochet_consumer_stream_throttled_total", &labels),
                paused: metrics::gauge!("ricochet_consumer_streams_throttled", &labels),
            }
        });
        m.throttled.increment(1);
        m.paused.increment(1.0);
        let (requests, answers) = (self.requests_pending(), self.answers_pending());
        if self.throttled_before.swap(true, Ordering::Relaxed) {
            tracing::debug!(topic = %self.topic, subscription = %self.subscription, ?cause, requests, answers, limit = self.limit,
                "consumer stream throttled: not read until the broker catches up");
        } else {
            tracing::info!(topic = %self.topic, subscription = %self.subscription, ?cause, requests, answers, limit = self.limit,
                "consumer stream throttled: not read until the broker catches up (max_pending_requests_per_consumer); later pauses of this stream log at DEBUG");
        }
        Paused(&m.paused)
    }
}

/// A reader's pause, for the gauge of streams paused now.
struct Paused<'a>(&'a metrics::Gauge);

impl Drop for Paused<'_> {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn budget(limit: u32) -> Arc<StreamBudget> {
        StreamBudget::new(limit, "t".into(), "s".into())
    }

    #[tokio::test]
    async fn requests_wait_for_units_handed_back() {
        let b = budget(10);
        let first = b.admit(4).await.unwrap();
        let second = b.admit(6).await.unwrap();
        assert_eq!(b.requests_pending(), 10);
        let waiting = tokio::spawn({
            let b = b.clone();
            async move { b.admit(1).await.map(|_| ()) }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "admitted past the limit");
        drop(first);
        waiting.await.unwrap().unwrap();
        drop(second);
        assert_eq!(b.requests_pending(), 0);
    }

    #[tokio::test]
    async fn a_request_larger_than_the_budget_is_admitted_alone() {
        let b = budget(10);
        let big = b.admit(1_000).await.unwrap();
        assert_eq!(b.requests_pending(), 10);
        drop(big);
        // An empty request (a flow frame) costs one unit.
        let _flow = b.admit(0).await.unwrap();
        assert_eq!(b.requests_pending(), 1);
    }

    #[tokio::test]
    async fn answers_at_the_limit_hold_the_reader_until_one_is_taken() {
        let b = budget(2);
        b.answer_queued();
        b.answer_queued();
        let waiting = tokio::spawn({
            let b = b.clone();
            async move { b.admit(1).await.map(|_| ()) }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "read past the answers' limit");
        b.answer_taken();
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("woken when an answer was taken")
            .unwrap()
            .unwrap();
        assert_eq!(b.answers_pending(), 1);
    }
}
