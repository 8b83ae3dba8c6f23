//! Ricochet's failure-handling policy: the [`DeadLetterPolicy`] trait that
//! the broker and the client both consult when a message fails, its two
//! built-in implementations ([`DelayLevelPolicy`], RocketMQ's delay levels,
//! and [`BackoffPolicy`], Pulsar's negative-ack backoff), their serializable
//! form [`PolicySpec`], a [`PolicyRegistry`] for user policies, and
//! [`explain`] for printing a schedule. No networking, no storage.
//!
//! # The question a policy answers
//!
//! A message has failed for the n-th time for a subscription (a nack, an ack
//! timeout, a lost consumer, a `reconsume_later`); what now? The caller fills
//! a [`FailureContext`] and gets a [`Decision`]: redeliver after a delay, in
//! the main tier or the subscription's retry tier ([`Tier`]), or dead-letter.
//!
//! Rules all built-in policies follow, and the broker relies on:
//! - [`FailureReason::Terminate`] and [`AttemptOverride::DeadLetter`] always
//!   dead-letter;
//! - attempt `n` is redelivered iff `n <= max` (`max_reconsume_times`,
//!   `max_redeliver_count`) and dead-lettered when `n > max`: with 16 retries
//!   attempt 17 goes to the DLQ. The comparison is made on every failure, so
//!   lowering a limit takes effect at once for messages already past it;
//! - attempt 0 is treated as attempt 1 (see [`FailureContext::effective_attempt`]);
//! - decisions are deterministic: jitter comes from
//!   [`FailureContext::jitter_seed`] (see [`jitter_seed`]), never a global RNG.
//!
//! # Why the trait is synchronous
//!
//! [`DeadLetterPolicy::decide`] is a plain `fn`, not an `async fn`: a policy
//! is pure arithmetic on its input, and the broker calls it on its dispatch
//! hot path, often for a whole batch of redeliveries at once. An async trait
//! would add a boxed future per call and invite I/O where none belongs. A
//! policy that needs outside data (a rule table, a list of poison keys) must
//! load and cache it outside `decide`, for example in a background task
//! that swaps an `Arc`, and only read the cache in `decide`.
//!
//! # Quickstart
//!
//! ```
//! use std::time::Duration;
//! use ricochet_policy::{
//!     AttemptOverride, Decision, FailureContext, FailureReason, PolicySpec, Tier,
//! };
//!
//! // From a config value, the compact CLI form or JSON.
//! let spec: PolicySpec = "delay-levels".parse()?; // RocketMQ: 10s, 30s, 1m ... 2h, then DLQ
//! let policy = spec.build()?;
//!
//! let first = policy.decide(&FailureContext::new(1, FailureReason::ReconsumeLater));
//! assert_eq!(first, Decision::Redeliver { after: Duration::from_secs(10), tier: Tier::Retry });
//!
//! let seventeenth = policy.decide(&FailureContext::new(17, FailureReason::ReconsumeLater));
//! assert!(seventeenth.is_dead_letter());
//!
//! // RocketMQ's per-attempt override: -1 = DLQ now, 0 = policy, k > 0 = level k
//! // (one of the policy's levels); any other level is refused.
//! let ctx = FailureContext::new(1, FailureReason::ReconsumeLater)
//!     .with_override(AttemptOverride::from_rocketmq_level(-1)?);
//! assert!(policy.decide(&ctx).is_dead_letter());
//! assert!(AttemptOverride::from_rocketmq_level(-7).is_err());
//! assert!(AttemptOverride::Level(19).checked_for(&*policy).is_err());
//!
//! // Pulsar: exponential nack backoff, 3 redeliveries then DLQ.
//! let pulsar = "backoff:min=10s,max-delay=10m,multiplier=2,max=3".parse::<PolicySpec>()?.build()?;
//! let d = pulsar.decide(&FailureContext::new(2, FailureReason::Nack));
//! assert_eq!(d, Decision::Redeliver { after: Duration::from_secs(20), tier: Tier::Main });
//! assert!(pulsar.decide(&FailureContext::new(4, FailureReason::Nack)).is_dead_letter());
//!
//! // A printable schedule.
//! println!("{}", ricochet_policy::explain_table(&*pulsar, FailureReason::Nack));
//! # Ok::<(), ricochet_policy::PolicyError>(())
//! ```
//!
//! # A custom policy
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use ricochet_policy::{
//!     DeadLetterPolicy, Decision, FailureContext, FailureReason, PolicyError, PolicyRegistry,
//!     PolicySpec, Tier,
//! };
//!
//! /// Retries validation errors never, everything else every 5 s, 10 times.
//! #[derive(Debug)]
//! struct SkipInvalid;
//!
//! impl DeadLetterPolicy for SkipInvalid {
//!     fn decide(&self, ctx: &FailureContext<'_>) -> Decision {
//!         // Terminate and an explicit DeadLetter override always win.
//!         if let Some(d) = ctx.mandatory_dead_letter() {
//!             return d;
//!         }
//!         if ctx.detail.is_some_and(|d| d.starts_with("invalid")) {
//!             return Decision::DeadLetter { reason: "invalid payload".into() };
//!         }
//!         if ctx.effective_attempt() > 10 {
//!             return Decision::DeadLetter { reason: "too many attempts".into() };
//!         }
//!         Decision::Redeliver { after: Duration::from_secs(5), tier: Tier::Retry }
//!     }
//!     fn max_attempts(&self) -> Option<u32> {
//!         Some(10)
//!     }
//!     fn name(&self) -> &str {
//!         "skip-invalid"
//!     }
//! }
//!
//! let mut registry = PolicyRegistry::new();
//! registry.register("skip-invalid", |_params| Ok(Arc::new(SkipInvalid)))?;
//! let policy = registry.build(&PolicySpec::named("skip-invalid", None))?;
//!
//! let nack = FailureContext::new(1, FailureReason::Nack);
//! assert_eq!(policy.decide(&nack).delay(), Some(Duration::from_secs(5)));
//! assert!(policy.decide(&nack.with_detail("invalid json")).is_dead_letter());
//! assert!(policy.decide(&FailureContext::new(1, FailureReason::Terminate)).is_dead_letter());
//! let schedule = ricochet_policy::explain(&*policy, FailureReason::Nack);
//! assert_eq!(schedule.len(), 11);
//! # Ok::<(), PolicyError>(())
//! ```

#![warn(missing_docs)]

mod backoff;
pub mod breaker;
mod context;
mod delay_levels;
mod error;
mod explain;
mod key_order;
mod policy;
mod registry;
pub mod spec;

pub use backoff::{Backoff, BackoffPolicy, DEFAULT_NACK_DELAY, MIN_FIXED_DELAY, MultiplierBackoff};
pub use breaker::{
    Breaker, BreakerMode, BreakerPhase, BreakerSnapshot, BreakerSpec, Gate, Settle, Transition,
    TripCause,
};
pub use context::{AttemptOverride, Decision, FailureContext, FailureReason, Tier, jitter_seed};
pub use delay_levels::{
    DEFAULT_LEVELS, DEFAULT_MAX_RECONSUME_TIMES, DEFAULT_START_LEVEL, DelayLevelPolicy, LevelTable,
};
pub use error::PolicyError;
pub use explain::{
    DEFAULT_MAX_ROWS, Outcome, ScheduleRow, ScheduleTable, explain, explain_table, explain_with,
};
pub use key_order::{KeyOrder, MIN_POISON_AFTER};
pub use policy::DeadLetterPolicy;
pub use registry::{PolicyFactory, PolicyRegistry};
pub use spec::PolicySpec;

/// The longest delay any built-in policy may wait (a level, a fixed delay, a
/// backoff's max): far beyond real use, so that no due time computed from a
/// policy can overflow. A broker bounds delays further with its own
/// `max_delay`.
pub const MAX_POLICY_DELAY: std::time::Duration = std::time::Duration::from_secs(365 * 24 * 3600);

/// The most levels a delay-level table may have (RocketMQ's has 18).
pub const MAX_LEVELS: usize = 1_000;
