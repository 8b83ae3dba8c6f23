//! The [`DeadLetterPolicy`] trait: the one question the broker and the client
//! ask when a message fails ("redeliver, when and where, or dead-letter?").

use std::fmt::Debug;

use crate::{Decision, FailureContext, PolicySpec};

/// Decides what happens to a message that failed for the n-th time.
///
/// The trait is synchronous on purpose: a policy is pure arithmetic on the
/// [`FailureContext`], and the broker calls it on its dispatch hot path
/// (possibly for thousands of messages in one batch). A policy that needs
/// I/O (a remote rule table, a database of poison keys…) must fetch and cache
/// that data outside `decide` and read only the cache here.
///
/// Rules every implementation must follow (the broker relies on them):
/// - [`FailureReason::Terminate`](crate::FailureReason::Terminate) and
///   [`AttemptOverride::DeadLetter`](crate::AttemptOverride::DeadLetter)
///   always give [`Decision::DeadLetter`]
///   ([`FailureContext::mandatory_dead_letter`] implements this);
/// - the decision depends only on the context (use
///   [`FailureContext::jitter_seed`] for randomness), so it can be reproduced;
/// - `decide` does not block and does not panic.
pub trait DeadLetterPolicy: Send + Sync + Debug {
    /// The decision for one failure.
    fn decide(&self, ctx: &FailureContext<'_>) -> Decision;

    /// The largest attempt number that is still redelivered (`None` =
    /// unbounded). Used for display and [`explain`](crate::explain).
    fn max_attempts(&self) -> Option<u32>;

    /// The serializable spec of a built-in policy; `None` for user policies.
    fn spec(&self) -> Option<PolicySpec> {
        None
    }

    /// A short name for logs and tools (`delay_levels`, `backoff`, or the
    /// name a user policy is registered under).
    fn name(&self) -> &str;

    /// How many delay levels the policy's table has: an explicit level
    /// ([`AttemptOverride::Level`](crate::AttemptOverride::Level), RocketMQ's
    /// `delayLevelWhenNextConsume`) must be one of `1..=n`, and others are
    /// refused ([`AttemptOverride::checked_for`](crate::AttemptOverride::checked_for)).
    /// `Some(0)`: the policy has no levels. `None` (the default, for user
    /// policies): not said; any level is passed to [`decide`](Self::decide).
    fn delay_levels(&self) -> Option<u32> {
        None
    }
}
