//! The one permission check every RPC goes through: a [`Requirement`]
//! (what the call needs) against a [`Scope`] (what the call is about, read
//! from its request), for the caller [`principal`] finds. Which RPC needs
//! what is not decided here but in the table of [`crate::gate`].

use super::grants::Resource;
use super::{Auth, Permission, Principal};
use crate::error::BrokerError;
use crate::name::Target;
use crate::name::TopicName;
use tonic::{Request, Status};

/// What an RPC asks of its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requirement {
    /// Only to be authenticated (what it returns is filtered).
    Authenticated,
    /// Some permission on the topic or namespace (to see it and its stats).
    Visible,
    /// This permission on the topic or namespace.
    Permission(Permission),
    /// A superuser (cluster operations).
    Superuser,
}

/// What a call is about, as its request names it: the resource a
/// [`Requirement::Permission`] or [`Requirement::Visible`] is checked on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope<'a> {
    /// Nothing (calls that need a superuser or only a signed-in caller).
    None,
    /// A topic, which must be named.
    Topic(&'a str),
    /// A topic, or when empty every topic: the check is then left to the
    /// answer's filter.
    TopicOrAll(&'a str),
    /// A namespace, or when empty every namespace (filtered likewise).
    NamespaceOrAll(&'a str),
    /// Exactly one of a namespace or a topic (retention, offload policies).
    Target {
        /// The `tenant/namespace`, or empty.
        namespace: &'a str,
        /// The topic, or empty.
        topic: &'a str,
    },
    /// A grant's resource (a namespace or a topic): checked on its
    /// namespace.
    Grant(&'a str),
    /// A required field is missing: INVALID_ARGUMENT with this message.
    Missing(&'static str),
    /// The service checks it itself: a producer's or consumer's topic when
    /// its stream opens, a grant listing that may show the caller's own.
    Service,
}

impl<'a> Scope<'a> {
    /// The topic a call about it is routed by (cluster mode), if named.
    pub fn topic(&self) -> Option<&'a str> {
        match *self {
            Scope::Topic(t) | Scope::TopicOrAll(t) | Scope::Target { topic: t, .. } => {
                (!t.is_empty()).then_some(t)
            }
            _ => None,
        }
    }
}

/// The caller of `r`: `None` with auth off; UNAUTHENTICATED if auth is on
/// and the call carries no principal (the layer refuses those before).
pub(crate) fn principal<T>(auth: &Auth, r: &Request<T>) -> Result<Option<Principal>, Status> {
    if !auth.enabled() {
        return Ok(None);
    }
    r.extensions()
        .get::<Principal>()
        .cloned()
        .map(Some)
        .ok_or_else(|| Status::unauthenticated("no credentials"))
}

/// The role to log for `p`.
pub(crate) fn who(p: Option<&Principal>) -> &str {
    p.map_or("-", |p| p.role.as_str())
}

/// The refusal of a superuser-only `method` to `p` (not a superuser).
pub(crate) fn superusers_only(method: &str, p: Option<&Principal>) -> BrokerError {
    let who = p.map_or("anonymous", |p| p.role.as_str());
    BrokerError::PermissionDenied(format!(
        "{method} is for superusers; role \"{who}\" is not one"
    ))
}

impl Auth {
    /// Checks that `p` may call `method`, which needs `need` on `scope`.
    /// A superuser passes every check without its scope being read.
    pub fn authorize(
        &self,
        p: Option<&Principal>,
        method: &str,
        need: Requirement,
        scope: Scope<'_>,
    ) -> Result<(), BrokerError> {
        if self.is_superuser(p) {
            return Ok(());
        }
        let perm = match need {
            Requirement::Authenticated => return Ok(()),
            Requirement::Superuser => return Err(superusers_only(method, p)),
            Requirement::Permission(perm) => Some(perm),
            Requirement::Visible => None,
        };
        match scope {
            Scope::Service | Scope::TopicOrAll("") | Scope::NamespaceOrAll("") => Ok(()),
            Scope::Topic(t) | Scope::TopicOrAll(t) => self.on_topic(p, &TopicName::parse(t)?, perm),
            Scope::NamespaceOrAll(ns) => {
                self.on_namespace(p, crate::name::parse_namespace(ns)?, perm)
            }
            Scope::Target { namespace, topic } => match Target::parse(namespace, topic)? {
                Target::Namespace(ns) => self.on_namespace(p, &ns, perm),
                Target::Topic(t) => self.on_topic(p, &t, perm),
            },
            Scope::Grant(resource) => {
                self.on_namespace(p, Resource::parse(resource)?.namespace(), perm)
            }
            Scope::Missing(what) => Err(BrokerError::InvalidArgument(what.into())),
            Scope::None => Err(BrokerError::PermissionDenied(format!(
                "{method} names no topic or namespace to check a permission on"
            ))),
        }
    }

    /// `perm` on `topic`, or (`None`) any permission there.
    fn on_topic(
        &self,
        p: Option<&Principal>,
        topic: &TopicName,
        perm: Option<Permission>,
    ) -> Result<(), BrokerError> {
        match perm {
            Some(perm) => self.check(p, topic, perm),
            None => self.check_visible(p, topic),
        }
    }

    /// `perm` on namespace `ns`, or (`None`) any grant in it.
    fn on_namespace(
        &self,
        p: Option<&Principal>,
        ns: &str,
        perm: Option<Permission>,
    ) -> Result<(), BrokerError> {
        match perm {
            Some(perm) => self.check_namespace(p, ns, perm),
            None => self.check_namespace_visible(p, ns),
        }
    }

    /// Whether `p` may see the topic stored as `name` (a filter of
    /// listings: an unparseable name is not shown).
    pub(crate) fn may_see(&self, p: Option<&Principal>, name: &str) -> bool {
        TopicName::parse_stored(name).is_ok_and(|t| self.check_visible(p, &t).is_ok())
    }

    /// Whether `p` holds `perm` on the topic stored as `name`.
    pub(crate) fn holds(&self, p: Option<&Principal>, name: &str, perm: Permission) -> bool {
        TopicName::parse_stored(name).is_ok_and(|t| self.check(p, &t, perm).is_ok())
    }
}
