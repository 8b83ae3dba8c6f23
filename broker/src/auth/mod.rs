//! Authentication and authorization: who a caller is, and what it may do.
//!
//! A caller proves a role with a JWT in the `authorization: Bearer …` gRPC
//! metadata (HS256 with a shared secret, or RS256/ES256 checked with a
//! public key; the subject is the role, an `exp` is enforced), checked once
//! per call by [`AuthLayer`] before any service sees the request. Roles
//! listed as superusers may do anything; every other role holds grants of
//! [`Permission`]s per `tenant/namespace` or per topic, stored durably
//! through [`crate::storage::Storage`] and held in memory by [`Auth`].
//! [`Auth::authorize`] checks a call against its requirement, which the
//! RPC table of [`crate::gate`] gives for every RPC; the data plane checks a
//! producer's or consumer's topic once when its stream opens (never per
//! message), and [`AuthService`] manages grants; in a cluster the grants
//! are the cluster's, kept in etcd (`shared`). With `auth.enabled` off
//! (the default) every caller may do everything, as before.
//!
//! Every dead-letter replay and purge, policy change and grant or revoke
//! is logged under the tracing target `ricochet::audit` with the role.

mod check;
mod grants;
mod layer;
mod service;
mod shared;
mod token;

pub use crate::config::{AuthConfig, metrics_token};
pub use check::{Requirement, Scope};
pub(crate) use check::{principal, who};
pub use grants::{Auth, Permission};
pub use layer::AuthLayer;
pub use service::AuthService;
pub use token::{TokenClaims, Verifier};

/// Who made a call, as [`AuthLayer`] established it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The authenticated role.
    pub role: String,
}

/// The tracing target of audit events.
pub const AUDIT: &str = "ricochet::audit";
