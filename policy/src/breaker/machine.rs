//! [`Breaker`]: the outage breaker's state machine. Closed → open (a trip
//! rule of the [`BreakerSpec`] fired) → half-open (one probe message out) →
//! closed (the probe was acked), or back to open with a doubled probe
//! interval (the probe failed). An operator may force it open or closed.
//! Pure: the caller passes the time (ms) and persists the [`BreakerSnapshot`].

use std::collections::VecDeque;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{BreakerSpec, next_probe_interval};

/// How one delivery was settled, as the breaker counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// Acked.
    Success,
    /// Nacked, timed out, or sent to reconsume later.
    Failure,
}

/// Who decides the breaker's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BreakerMode {
    /// The trip rules and probes.
    #[default]
    Auto,
    /// An operator: open, no probes.
    ForcedOpen,
    /// An operator: closed, never trips.
    ForcedClosed,
}

impl BreakerMode {
    /// `auto`, `forced_open`, `forced_closed`.
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerMode::Auto => "auto",
            BreakerMode::ForcedOpen => "forced_open",
            BreakerMode::ForcedClosed => "forced_closed",
        }
    }
}

/// The breaker's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BreakerPhase {
    /// Dispatching; settles are counted.
    #[default]
    Closed,
    /// Not dispatching; a probe goes out when the probe interval ends.
    Open,
    /// One probe message is out; nothing else is dispatched.
    HalfOpen,
}

impl BreakerPhase {
    /// `closed`, `open`, `half_open`.
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerPhase::Closed => "closed",
            BreakerPhase::Open => "open",
            BreakerPhase::HalfOpen => "half_open",
        }
    }

    /// 0 closed, 1 open, 2 half-open (the metrics gauge).
    pub fn code(self) -> u8 {
        match self {
            BreakerPhase::Closed => 0,
            BreakerPhase::Open => 1,
            BreakerPhase::HalfOpen => 2,
        }
    }
}

/// What a broker stores so that an open breaker stays open across a restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct BreakerSnapshot {
    /// Who decides.
    pub mode: BreakerMode,
    /// The state.
    pub phase: BreakerPhase,
    /// When the breaker entered its current phase (ms).
    pub since_ms: u64,
    /// The current probe interval (ms).
    pub probe_interval_ms: u64,
    /// When the next probe may go out (ms), while open.
    pub next_probe_ms: u64,
    /// How many times it opened.
    pub trips: u64,
}

/// What the caller may dispatch now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Everything (closed).
    All,
    /// One probe message.
    Probe,
    /// Nothing.
    Nothing,
}

/// Why the breaker opened.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TripCause {
    /// `failed` of the last `of` settles failed.
    Ratio {
        /// Failures in the window.
        failed: u32,
        /// Settles in the window.
        of: u32,
    },
    /// `failures` failures within `within`.
    Burst {
        /// Failures counted.
        failures: u32,
        /// The time they fell within.
        within: Duration,
    },
    /// An operator forced it open.
    Forced,
}

impl std::fmt::Display for TripCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TripCause::Ratio { failed, of } => {
                write!(f, "{failed} of the last {of} settles failed")
            }
            TripCause::Burst { failures, within } => write!(
                f,
                "{failures} failures within {}",
                humantime::format_duration(*within)
            ),
            TripCause::Forced => f.write_str("forced open by an operator"),
        }
    }
}

/// A change the caller reports (event, metric, log line).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Transition {
    /// Closed (or half-open) → open.
    Opened(TripCause),
    /// Open → half-open: a probe went out.
    Probing,
    /// A probe failed: open again, the next probe after this long.
    ProbeFailed(Duration),
    /// → closed; `forced` when an operator closed it.
    Closed {
        /// Closed by an operator rather than by a probe's ack.
        forced: bool,
    },
}

/// The state machine. The windows of recent settles are in memory only: a
/// restarted closed breaker starts counting afresh; its phase, mode and
/// probe interval come back from the [`BreakerSnapshot`].
#[derive(Debug, Clone)]
pub struct Breaker {
    spec: BreakerSpec,
    snap: BreakerSnapshot,
    /// The last `window` settles, `true` for a failure.
    window: VecDeque<bool>,
    window_failures: u32,
    /// Times of the last `failures` failures.
    burst: VecDeque<u64>,
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Breaker {
    /// A closed breaker under automatic control.
    pub fn new(spec: BreakerSpec, now_ms: u64) -> Self {
        let snap = BreakerSnapshot {
            mode: BreakerMode::Auto,
            phase: BreakerPhase::Closed,
            since_ms: now_ms,
            probe_interval_ms: ms(spec.probe_interval),
            next_probe_ms: 0,
            trips: 0,
        };
        Self::restore(spec, snap)
    }

    /// A breaker in a stored state. A probe that was out (half-open) is
    /// taken as lost: open, probing again at once.
    pub fn restore(spec: BreakerSpec, mut snap: BreakerSnapshot) -> Self {
        if snap.phase == BreakerPhase::HalfOpen {
            snap.phase = BreakerPhase::Open;
        }
        snap.probe_interval_ms = snap
            .probe_interval_ms
            .clamp(ms(spec.probe_interval), ms(spec.max_probe_interval));
        Breaker {
            spec,
            snap,
            window: VecDeque::new(),
            window_failures: 0,
            burst: VecDeque::new(),
        }
    }

    /// New settings, keeping the state (the probe interval is clamped to
    /// the new bounds; the windows start afresh).
    pub fn set_spec(&mut self, spec: BreakerSpec) {
        let snap = self.snap;
        *self = Breaker::restore(spec, snap);
        // A probe in flight stays in flight.
        self.snap.phase = snap.phase;
    }

    /// The settings.
    pub fn spec(&self) -> &BreakerSpec {
        &self.spec
    }

    /// The state to store.
    pub fn snapshot(&self) -> BreakerSnapshot {
        self.snap
    }

    /// The phase.
    pub fn phase(&self) -> BreakerPhase {
        self.snap.phase
    }

    /// The mode.
    pub fn mode(&self) -> BreakerMode {
        self.snap.mode
    }

    /// Failures over settles in the ratio window (0 when empty).
    pub fn failure_ratio(&self) -> f64 {
        if self.window.is_empty() {
            0.0
        } else {
            f64::from(self.window_failures) / self.window.len() as f64
        }
    }

    /// Failures and settles in the ratio window.
    pub fn window_counts(&self) -> (u32, u32) {
        (self.window_failures, self.window.len() as u32)
    }

    /// What may be dispatched at `now_ms`.
    pub fn gate(&self, now_ms: u64) -> Gate {
        match (self.snap.mode, self.snap.phase) {
            (BreakerMode::ForcedClosed, _) | (BreakerMode::Auto, BreakerPhase::Closed) => Gate::All,
            (BreakerMode::Auto, BreakerPhase::Open) if now_ms >= self.snap.next_probe_ms => {
                Gate::Probe
            }
            _ => Gate::Nothing,
        }
    }

    /// Whether a failure now spends an attempt: only while closed.
    pub fn counts_attempts(&self) -> bool {
        self.snap.phase == BreakerPhase::Closed
    }

    /// When the caller must look at [`gate`](Self::gate) again (the next
    /// probe), if the breaker waits for one.
    pub fn next_wakeup(&self) -> Option<u64> {
        (self.snap.mode == BreakerMode::Auto && self.snap.phase == BreakerPhase::Open)
            .then_some(self.snap.next_probe_ms)
    }

    fn clear_windows(&mut self) {
        self.window.clear();
        self.window_failures = 0;
        self.burst.clear();
    }

    fn open(&mut self, cause: TripCause, now_ms: u64) -> Transition {
        self.snap.phase = BreakerPhase::Open;
        self.snap.since_ms = now_ms;
        self.snap.trips += 1;
        self.snap.probe_interval_ms = ms(self.spec.probe_interval);
        self.snap.next_probe_ms = now_ms.saturating_add(self.snap.probe_interval_ms);
        self.clear_windows();
        Transition::Opened(cause)
    }

    fn close(&mut self, forced: bool, now_ms: u64) -> Transition {
        self.snap.phase = BreakerPhase::Closed;
        self.snap.since_ms = now_ms;
        self.snap.probe_interval_ms = ms(self.spec.probe_interval);
        self.snap.next_probe_ms = 0;
        self.clear_windows();
        Transition::Closed { forced }
    }

    /// Counts an ordinary settle (not a probe's). Only a closed breaker
    /// under automatic control counts; it may trip.
    pub fn record(&mut self, settle: Settle, now_ms: u64) -> Option<Transition> {
        if self.snap.mode != BreakerMode::Auto || self.snap.phase != BreakerPhase::Closed {
            return None;
        }
        let failed = settle == Settle::Failure;
        self.window.push_back(failed);
        self.window_failures += u32::from(failed);
        if self.window.len() > self.spec.window as usize && self.window.pop_front() == Some(true) {
            self.window_failures -= 1;
        }
        if !failed {
            return None;
        }
        if let Some(ratio) = self.spec.ratio {
            let of = self.window.len() as u32;
            if of >= self.spec.min_settles
                && f64::from(self.window_failures) >= ratio * f64::from(of)
            {
                let failed = self.window_failures;
                return Some(self.open(TripCause::Ratio { failed, of }, now_ms));
            }
        }
        if let Some(n) = self.spec.failures {
            self.burst.push_back(now_ms);
            if self.burst.len() > n as usize {
                self.burst.pop_front();
            }
            if self.burst.len() == n as usize
                && self
                    .burst
                    .front()
                    .is_some_and(|t| now_ms.saturating_sub(*t) <= ms(self.spec.within))
            {
                let within = self.spec.within;
                return Some(self.open(
                    TripCause::Burst {
                        failures: n,
                        within,
                    },
                    now_ms,
                ));
            }
        }
        None
    }

    /// A probe went out (after [`gate`](Self::gate) said [`Gate::Probe`]).
    pub fn probe_sent(&mut self, now_ms: u64) -> Option<Transition> {
        if self.gate(now_ms) != Gate::Probe {
            return None;
        }
        self.snap.phase = BreakerPhase::HalfOpen;
        self.snap.since_ms = now_ms;
        Some(Transition::Probing)
    }

    /// The probe was settled: an ack closes the breaker, a failure opens it
    /// again with the probe interval doubled (capped).
    pub fn probe_settled(&mut self, settle: Settle, now_ms: u64) -> Option<Transition> {
        if self.snap.phase != BreakerPhase::HalfOpen {
            return None;
        }
        Some(match settle {
            Settle::Success => self.close(false, now_ms),
            Settle::Failure => {
                let next = next_probe_interval(
                    Duration::from_millis(self.snap.probe_interval_ms),
                    self.spec.max_probe_interval,
                );
                self.snap.phase = BreakerPhase::Open;
                self.snap.since_ms = now_ms;
                self.snap.probe_interval_ms = ms(next);
                self.snap.next_probe_ms = now_ms.saturating_add(ms(next));
                Transition::ProbeFailed(next)
            }
        })
    }

    /// The probe came back unsettled (its consumer left, or it was given
    /// back): open, another probe may go out at once.
    pub fn probe_returned(&mut self, now_ms: u64) {
        if self.snap.phase == BreakerPhase::HalfOpen {
            self.snap.phase = BreakerPhase::Open;
            self.snap.next_probe_ms = now_ms;
        }
    }

    /// An operator's decision. `Auto` hands control back: an open breaker
    /// probes after the first probe interval, a closed one counts afresh.
    pub fn force(&mut self, mode: BreakerMode, now_ms: u64) -> Option<Transition> {
        self.snap.mode = mode;
        match mode {
            BreakerMode::ForcedOpen if self.snap.phase != BreakerPhase::Open => {
                Some(self.open(TripCause::Forced, now_ms))
            }
            BreakerMode::ForcedClosed if self.snap.phase != BreakerPhase::Closed => {
                Some(self.close(true, now_ms))
            }
            BreakerMode::Auto => {
                if self.snap.phase != BreakerPhase::Closed {
                    self.snap.phase = BreakerPhase::Open;
                    self.snap.probe_interval_ms = ms(self.spec.probe_interval);
                    self.snap.next_probe_ms = now_ms.saturating_add(self.snap.probe_interval_ms);
                }
                self.clear_windows();
                None
            }
            _ => None,
        }
    }
}
