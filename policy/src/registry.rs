//! [`PolicyRegistry`]: resolves [`PolicySpec::Named`] specs to policies an
//! embedding application registered by name, and builds built-in specs
//! directly. Pure: no I/O, no global state; the broker owns one instance.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use crate::spec::validate_name;
use crate::{DeadLetterPolicy, PolicyError, PolicySpec};

/// Builds a named policy from its optional parameters (the spec's `params`).
pub type PolicyFactory =
    Arc<dyn Fn(Option<&str>) -> Result<Arc<dyn DeadLetterPolicy>, PolicyError> + Send + Sync>;

/// Named policy factories.
///
/// ```
/// use std::sync::Arc;
/// use ricochet_policy::{BackoffPolicy, PolicyError, PolicyRegistry, PolicySpec};
///
/// let mut registry = PolicyRegistry::new();
/// registry.register("five-quick-retries", |params| {
///     let count = match params {
///         None => 5,
///         Some(p) => p.trim().parse().map_err(|_| PolicyError::InvalidParams {
///             name: "five-quick-retries".into(),
///             reason: format!("expected a retry count, got `{p}`"),
///         })?,
///     };
///     Ok(Arc::new(BackoffPolicy::fixed(std::time::Duration::from_secs(1), count)?))
/// })?;
/// let policy = registry.build(&"named:five-quick-retries:3".parse()?)?;
/// assert_eq!(policy.max_attempts(), Some(3));
/// // Built-in specs build without a registration.
/// assert!(registry.build(&PolicySpec::delay_levels_default()).is_ok());
/// # Ok::<(), PolicyError>(())
/// ```
#[derive(Clone, Default)]
pub struct PolicyRegistry {
    factories: BTreeMap<String, PolicyFactory>,
}

impl fmt::Debug for PolicyRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PolicyRegistry")
            .field("names", &self.factories.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl PolicyRegistry {
    /// An empty registry (built-in specs still build).
    pub fn new() -> Self {
        PolicyRegistry::default()
    }

    /// Registers `factory` under `name`. Errors when the name is empty or
    /// contains whitespace or `:`, or is already registered.
    pub fn register<F>(&mut self, name: impl Into<String>, factory: F) -> Result<(), PolicyError>
    where
        F: Fn(Option<&str>) -> Result<Arc<dyn DeadLetterPolicy>, PolicyError>
            + Send
            + Sync
            + 'static,
    {
        let name = name.into();
        validate_name(&name)?;
        if self.factories.contains_key(&name) {
            return Err(PolicyError::DuplicatePolicy { name });
        }
        self.factories.insert(name, Arc::new(factory));
        Ok(())
    }

    /// Whether `name` is registered.
    pub fn contains(&self, name: &str) -> bool {
        self.factories.contains_key(name)
    }

    /// The registered names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.factories.keys().map(String::as_str)
    }

    /// Builds `spec`: built-ins directly, `Named` through its factory.
    /// Errors with [`PolicyError::UnknownPolicy`] for an unregistered name,
    /// and with whatever the factory or the built-in's validation returns.
    pub fn build(&self, spec: &PolicySpec) -> Result<Arc<dyn DeadLetterPolicy>, PolicyError> {
        if let Some(policy) = spec.build_builtin()? {
            return Ok(policy);
        }
        match spec {
            PolicySpec::Named { name, params } => {
                let factory = self
                    .factories
                    .get(name)
                    .ok_or_else(|| PolicyError::UnknownPolicy { name: name.clone() })?;
                factory(params.as_deref())
            }
            // `build_builtin` returns `Some` for every other variant.
            PolicySpec::DelayLevels { .. } | PolicySpec::Backoff { .. } => spec.build(),
        }
    }

    /// Checks that `spec` builds (for `Named`: that the name is registered
    /// and its factory accepts the parameters).
    pub fn validate(&self, spec: &PolicySpec) -> Result<(), PolicyError> {
        self.build(spec).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BackoffPolicy, DelayLevelPolicy};
    use std::time::Duration;

    fn registry() -> PolicyRegistry {
        let mut r = PolicyRegistry::new();
        r.register("quick", |params| {
            if let Some(p) = params {
                return Err(PolicyError::InvalidParams {
                    name: "quick".into(),
                    reason: format!("takes no parameters, got `{p}`"),
                });
            }
            Ok(Arc::new(BackoffPolicy::fixed(Duration::from_secs(1), 2)?))
        })
        .expect("fresh name");
        r.register("levels", |_| Ok(Arc::new(DelayLevelPolicy::default())))
            .expect("fresh name");
        r
    }

    #[test]
    fn resolves_named_and_builtins() {
        let r = registry();
        assert_eq!(r.names().collect::<Vec<_>>(), ["levels", "quick"]);
        assert!(r.contains("quick"));
        let p = r
            .build(&PolicySpec::named("quick", None))
            .expect("registered");
        assert_eq!(p.max_attempts(), Some(2));
        let p = r
            .build(&PolicySpec::fixed_backoff(Duration::from_secs(5), 7))
            .expect("built-in");
        assert_eq!(p.max_attempts(), Some(7));
        assert!(format!("{r:?}").contains("quick"));
    }

    #[test]
    fn errors() {
        let mut r = registry();
        assert_eq!(
            r.build(&PolicySpec::named("nope", None)).err(),
            Some(PolicyError::UnknownPolicy {
                name: "nope".into()
            })
        );
        assert!(matches!(
            r.build(&PolicySpec::named("quick", Some("x".into()))),
            Err(PolicyError::InvalidParams { .. })
        ));
        assert_eq!(
            r.register("quick", |_| Ok(Arc::new(DelayLevelPolicy::default()))),
            Err(PolicyError::DuplicatePolicy {
                name: "quick".into()
            })
        );
        assert_eq!(
            r.register("a:b", |_| Ok(Arc::new(DelayLevelPolicy::default()))),
            Err(PolicyError::InvalidPolicyName { name: "a:b".into() })
        );
        assert_eq!(
            r.validate(&PolicySpec::fixed_backoff(Duration::from_secs(5), 0)),
            Err(PolicyError::ZeroMaxAttempts {
                field: "max_redeliver_count"
            })
        );
        assert_eq!(r.validate(&PolicySpec::named("levels", None)), Ok(()));
    }
}
