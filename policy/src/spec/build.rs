//! Validating and building a [`PolicySpec`]: a built-in spec is valid
//! exactly when its policy builds, so validation builds it and drops the
//! result; a `Named` spec only has its name checked here (a
//! [`PolicyRegistry`](crate::PolicyRegistry) resolves it).

use std::sync::Arc;

use crate::{Backoff, BackoffPolicy, DeadLetterPolicy, DelayLevelPolicy, PolicyError, PolicySpec};

/// Checks a registered policy name: non-empty, no whitespace, no `:`.
pub(crate) fn validate_name(name: &str) -> Result<(), PolicyError> {
    if name.is_empty() || name.contains(|c: char| c == ':' || c.is_whitespace()) {
        return Err(PolicyError::InvalidPolicyName {
            name: name.to_owned(),
        });
    }
    Ok(())
}

impl PolicySpec {
    /// Checks every rule a built-in policy enforces, without building it.
    /// For `Named` only the name's syntax is checked.
    pub fn validate(&self) -> Result<(), PolicyError> {
        match self {
            PolicySpec::DelayLevels { .. } | PolicySpec::Backoff { .. } => {
                self.build_builtin().map(|_| ())
            }
            PolicySpec::Named { name, .. } => validate_name(name),
        }
    }

    /// Builds the policy. `Named` specs fail with
    /// [`PolicyError::UnknownPolicy`] here; resolve them with a
    /// [`PolicyRegistry`](crate::PolicyRegistry).
    pub fn build(&self) -> Result<Arc<dyn DeadLetterPolicy>, PolicyError> {
        match self.build_builtin()? {
            Some(p) => Ok(p),
            None => Err(PolicyError::UnknownPolicy {
                name: match self {
                    PolicySpec::Named { name, .. } => name.clone(),
                    _ => String::new(),
                },
            }),
        }
    }

    /// The longest delay the policy can ask for (its longest level, its
    /// fixed delay or its backoff's max); `None` for a `Named` policy, whose
    /// delays only it knows. A broker refuses a policy longer than its own
    /// `max_delay`.
    pub fn max_delay(&self) -> Option<std::time::Duration> {
        match self {
            PolicySpec::DelayLevels { levels, .. } => {
                Some(levels.clone().unwrap_or_default().max_delay())
            }
            PolicySpec::Backoff {
                fixed, multiplier, ..
            } => Some(match (fixed, multiplier) {
                (Some(d), _) => *d,
                (None, Some(m)) => m.max,
                (None, None) => Backoff::default().max_delay(),
            }),
            PolicySpec::Named { .. } => None,
        }
    }

    /// Builds a built-in policy; `Ok(None)` for a (syntactically valid) `Named`.
    pub(crate) fn build_builtin(&self) -> Result<Option<Arc<dyn DeadLetterPolicy>>, PolicyError> {
        match self {
            PolicySpec::DelayLevels {
                levels,
                start_level,
                max_reconsume_times,
            } => Ok(Some(Arc::new(DelayLevelPolicy::new(
                levels.clone().unwrap_or_default(),
                *start_level,
                *max_reconsume_times,
            )?))),
            PolicySpec::Backoff {
                fixed,
                multiplier,
                max_redeliver_count,
            } => {
                let backoff = match (fixed, multiplier) {
                    (Some(_), Some(_)) => return Err(PolicyError::ConflictingBackoff),
                    (Some(d), None) => Backoff::Fixed(*d),
                    (None, Some(m)) => Backoff::Multiplier(*m),
                    (None, None) => Backoff::default(),
                };
                Ok(Some(Arc::new(BackoffPolicy::new(
                    backoff,
                    *max_redeliver_count,
                )?)))
            }
            PolicySpec::Named { name, .. } => validate_name(name).map(|()| None),
        }
    }
}
