//! The outage breaker in the subscription actor: it drives the pure
//! [`Breaker`] of `ricochet-policy` with this subscription's settles and
//! carries out what it says. Acks count as successes; nacks, ack timeouts
//! and `reconsume_later`s as failures (a terminate, "poison, dead-letter
//! now", and a lost consumer are not counted). While the breaker is not
//! closed, nothing is dispatched but one probe message when the probe
//! interval ends, and a failure spends no attempt: the message goes back
//! where it was, its delivery count unchanged. The breaker's state is part
//! of the subscription record, so an open breaker stays open across a
//! restart. Each change is a failure event, a metric and a log line.

use super::SubscriptionActor;
use super::failure::Failure;
use crate::error::{BrokerError, Result};
use crate::events::{EventKind, FailureEvent};
use crate::storage::TierEntry;
use metrics::{Counter, Gauge, counter, gauge};
use ricochet_policy::{
    Breaker, BreakerMode, BreakerSnapshot, BreakerSpec, FailureReason, Gate, Settle, Transition,
};

/// The breaker's run-time part in the actor.
#[derive(Debug, Default)]
pub(super) struct BreakerState {
    /// `None`: the subscription has no breaker.
    machine: Option<Breaker>,
    /// The probe message out, while half-open.
    probe: Option<TierEntry>,
    metrics: Option<BreakerMetrics>,
}

#[derive(Debug)]
struct BreakerMetrics {
    /// 0 closed, 1 open, 2 half-open.
    state: Gauge,
    trips: Counter,
}

/// A subscription's breaker, as its stats show it.
#[derive(Debug, Clone, PartialEq)]
pub struct BreakerStats {
    /// Its settings.
    pub spec: BreakerSpec,
    /// Its state.
    pub snapshot: BreakerSnapshot,
    /// Failures in the ratio window.
    pub window_failures: u32,
    /// Settles in the ratio window.
    pub window_settles: u32,
}

// `spec.ratio` is validated finite, so equality is total.
impl Eq for BreakerStats {}

impl SubscriptionActor {
    /// (Re)builds the breaker from the record (the operator's spec, else the
    /// config's rule for the topic) and its stored state.
    pub(super) fn resolve_breaker(&mut self) {
        let spec = self
            .rec
            .breaker
            .clone()
            .or_else(|| self.deps.link.configured_breaker(&self.rec.topic));
        let Some(spec) = spec else {
            if self.breaker.machine.take().is_some() {
                self.breaker.probe = None;
                self.rec.breaker_state = None;
                self.dirty = true;
            }
            if let Some(m) = &self.breaker.metrics {
                m.state.set(0.0);
            }
            return;
        };
        match (&mut self.breaker.machine, self.rec.breaker_state) {
            (Some(b), _) => b.set_spec(spec),
            (None, Some(snap)) => self.breaker.machine = Some(Breaker::restore(spec, snap)),
            (None, None) => {
                self.breaker.machine = Some(Breaker::new(spec, self.deps.clock.now_ms()));
            }
        }
        let labels = [
            ("topic", self.rec.topic.clone()),
            ("subscription", self.rec.name.clone()),
        ];
        let m = self.breaker.metrics.get_or_insert_with(|| BreakerMetrics {
            state: gauge!("ricochet_breaker_state", &labels),
            trips: counter!("ricochet_breaker_trips_total", &labels),
        });
        if let Some(b) = &self.breaker.machine {
            m.state.set(f64::from(b.phase().code()));
        }
    }

    /// Whether the subscription has an outage breaker.
    pub(super) fn has_breaker(&self) -> bool {
        self.breaker.machine.is_some()
    }

    /// How many ready messages dispatch may offer now: `None` for any,
    /// `Some(1)` for the probe, `Some(0)` for none.
    pub(super) fn breaker_budget(&self) -> Option<usize> {
        let b = self.breaker.machine.as_ref()?;
        match b.gate(self.deps.clock.now_ms()) {
            Gate::All => None,
            Gate::Probe => Some(1),
            Gate::Nothing => Some(0),
        }
    }

    /// `entry` went out as the probe.
    pub(super) fn breaker_probe_sent(&mut self, entry: TierEntry) {
        let now = self.deps.clock.now_ms();
        if let Some(t) = self
            .breaker
            .machine
            .as_mut()
            .and_then(|b| b.probe_sent(now))
        {
            self.breaker.probe = Some(entry);
            self.breaker_changed(t, Some(entry));
        }
    }

    /// When the actor must wake up for the next probe, from now.
    pub(super) fn breaker_wakeup(&self) -> Option<std::time::Duration> {
        let at = self.breaker.machine.as_ref()?.next_wakeup()?;
        Some(std::time::Duration::from_millis(
            at.saturating_sub(self.deps.clock.now_ms()),
        ))
    }

    /// Counts acked entries (those in flight) as successes; the probe's
    /// ack closes the breaker.
    pub(super) fn breaker_acked(&mut self, entries: &[TierEntry], cumulative: bool) {
        if self.breaker.machine.is_none() {
            return;
        }
        let acked: Vec<TierEntry> = if cumulative {
            entries
                .iter()
                .flat_map(|e| self.deliveries.in_flight_through(e.entry_id))
                .collect()
        } else {
            entries
                .iter()
                .filter(|e| self.deliveries.in_flight.contains_key(e))
                .copied()
                .collect()
        };
        let now = self.deps.clock.now_ms();
        for entry in acked {
            let t = if self.breaker.probe == Some(entry) {
                self.breaker.probe = None;
                self.breaker
                    .machine
                    .as_mut()
                    .and_then(|b| b.probe_settled(Settle::Success, now))
            } else {
                self.breaker
                    .machine
                    .as_mut()
                    .and_then(|b| b.record(Settle::Success, now))
            };
            if let Some(t) = t {
                self.breaker_changed(t, Some(entry));
            }
        }
    }

    /// Counts `failures` and splits them: those that spend an attempt (the
    /// breaker was closed), and those it spares (open, half-open, or the
    /// probe), which the caller gives back unchanged.
    pub(super) fn breaker_screen(
        &mut self,
        failures: Vec<Failure>,
    ) -> (Vec<Failure>, Vec<Failure>) {
        if self.breaker.machine.is_none() {
            return (failures, Vec::new());
        }
        let now = self.deps.clock.now_ms();
        let mut counted = Vec::with_capacity(failures.len());
        let mut spared = Vec::new();
        for f in failures {
            let counts = matches!(
                f.reason,
                FailureReason::Nack | FailureReason::AckTimeout | FailureReason::ReconsumeLater
            );
            let Some(b) = self.breaker.machine.as_mut() else {
                counted.push(f);
                continue;
            };
            if self.breaker.probe == Some(f.entry) {
                self.breaker.probe = None;
                if counts {
                    if let Some(t) = b.probe_settled(Settle::Failure, now) {
                        self.breaker_changed(t, Some(f.entry));
                    }
                } else {
                    b.probe_returned(now);
                }
            } else if counts && let Some(t) = b.record(Settle::Failure, now) {
                // The failure that trips the breaker happened while closed.
                self.breaker_changed(t, Some(f.entry));
                counted.push(f);
                continue;
            }
            let open = !self
                .breaker
                .machine
                .as_ref()
                .is_some_and(Breaker::counts_attempts);
            if open && f.reason != FailureReason::Terminate {
                spared.push(f);
            } else {
                counted.push(f);
            }
        }
        (counted, spared)
    }

    /// A message given back without a settle (its consumer closed): if it
    /// was the probe, another may go out.
    pub(super) fn breaker_released(&mut self, entry: TierEntry) {
        if self.breaker.probe == Some(entry) {
            self.breaker.probe = None;
            let now = self.deps.clock.now_ms();
            if let Some(b) = self.breaker.machine.as_mut() {
                b.probe_returned(now);
                self.rec.breaker_state = Some(b.snapshot());
                self.dirty = true;
            }
        }
    }

    /// An operator's decision; stored before the answer.
    pub(super) fn breaker_force(&mut self, mode: BreakerMode) -> Result<BreakerStats> {
        let now = self.deps.clock.now_ms();
        let Some(b) = self.breaker.machine.as_mut() else {
            return Err(BrokerError::Conflict(format!(
                "subscription {} on {} has no breaker; set one with `ricochet policy set TOPIC SUB SPEC --breaker breaker:...`",
                self.rec.name, self.rec.topic
            )));
        };
        let t = b.force(mode, now);
        if b.phase() != ricochet_policy::BreakerPhase::HalfOpen {
            self.breaker.probe = None;
        }
        self.rec.breaker_state = Some(b.snapshot());
        if let Some(t) = t {
            self.breaker_changed(t, None);
        }
        tracing::info!(
            target: "ricochet::audit",
            topic = %self.rec.topic, sub = %self.rec.name, mode = mode.as_str(),
            "breaker mode set"
        );
        self.deps.storage.put_subscription(&self.rec)?;
        self.dirty = false;
        self.breaker_stats().ok_or_else(|| {
            BrokerError::Conflict(format!("subscription {} has no breaker", self.rec.name))
        })
    }

    /// The breaker for the stats, if there is one.
    pub(super) fn breaker_stats(&self) -> Option<BreakerStats> {
        let b = self.breaker.machine.as_ref()?;
        let (window_failures, window_settles) = b.window_counts();
        Some(BreakerStats {
            spec: b.spec().clone(),
            snapshot: b.snapshot(),
            window_failures,
            window_settles,
        })
    }

    /// Stores the new state and tells of the change: a log line, the
    /// metrics and a failure event.
    fn breaker_changed(&mut self, t: Transition, entry: Option<TierEntry>) {
        let Some(b) = self.breaker.machine.as_ref() else {
            return;
        };
        let snap = b.snapshot();
        let ratio = b.failure_ratio();
        self.rec.breaker_state = Some(snap);
        self.dirty = true;
        if let Some(m) = &self.breaker.metrics {
            m.state.set(f64::from(snap.phase.code()));
        }
        let (topic, sub) = (&self.rec.topic, &self.rec.name);
        let probe = entry.map(|e| self.wire_id(e));
        let (kind, cause) = match t {
            Transition::Opened(cause) => {
                if let Some(m) = &self.breaker.metrics {
                    m.trips.increment(1);
                }
                tracing::warn!(
                    topic = %topic, sub = %sub, cause = %cause,
                    probe_in_ms = snap.probe_interval_ms,
                    "breaker opened: dispatch stopped, failures spend no attempts"
                );
                (EventKind::BreakerOpened, cause.to_string())
            }
            Transition::Probing => {
                tracing::info!(
                    topic = %topic, sub = %sub, probe = ?probe,
                    "breaker probing: one message sent to test the dependency"
                );
                (EventKind::BreakerProbing, "probe sent".to_owned())
            }
            Transition::ProbeFailed(next) => {
                tracing::info!(
                    topic = %topic, sub = %sub, next_probe_in_ms = next.as_millis() as u64,
                    "breaker probe failed: stays open"
                );
                let cause = format!(
                    "probe failed; next probe in {}",
                    humantime::format_duration(next)
                );
                (EventKind::BreakerOpened, cause)
            }
            Transition::Closed { forced } => {
                let cause = if forced {
                    "forced closed by an operator"
                } else {
                    "probe acked"
                };
                tracing::info!(topic = %topic, sub = %sub, cause, ratio, "breaker closed: dispatch resumed");
                (EventKind::BreakerClosed, cause.to_owned())
            }
        };
        let mut ev = FailureEvent::new(kind, self.deps.clock.now_ms(), topic, sub);
        ev.cause = Some(cause);
        ev.message_id = probe;
        self.deps.link.emit(vec![ev]);
    }

    /// Replaces the operator's breaker (`None`: none; the config's rule for
    /// the topic applies, if any). Validated first; nothing changes on error.
    pub(super) fn set_breaker_spec(&mut self, spec: Option<BreakerSpec>) -> Result<()> {
        if let Some(s) = &spec {
            s.validate()?;
        }
        if self.rec.breaker != spec {
            self.rec.breaker = spec;
            self.resolve_breaker();
            if let Some(b) = &self.breaker.machine {
                self.rec.breaker_state = Some(b.snapshot());
            }
            self.dirty = true;
        }
        Ok(())
    }

    /// Gives spared failures back where they were, their counts unchanged.
    pub(super) fn give_back_spared(&mut self, spared: Vec<Failure>) {
        let entries: Vec<TierEntry> = spared.into_iter().map(|f| f.entry).collect();
        self.give_back(entries);
    }
}

/// Sleeps `wait`, or forever when `None` (a `select!` branch for the probe).
pub(super) async fn wake_after(wait: Option<std::time::Duration>) {
    match wait {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}
