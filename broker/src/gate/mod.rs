//! The front of every gRPC service: one table ([`table`]) says, for each
//! RPC, what it needs of its caller (a [`Requirement`]), what it is about
//! (a [`Scope`] read from its request), how it is routed in a cluster (a
//! [`Route`]), how its answer is filtered for the caller, and the audit
//! line it writes once it succeeds. [`Gate::call`] runs those steps around
//! the service's own handler; the table's macro generates each service's
//! trait implementation from its rows, so a service's RPC without a row
//! does not compile, and [`check_table`] (run at start-up and by a test)
//! compares the rows with the proto descriptors, so a row naming no RPC, or
//! an RPC (of a service not generated, like the data plane's) without a
//! row, stops the broker before it serves.
//!
//! The permission check itself is [`Auth::authorize`]; routing is
//! [`Router`]; the services know nothing of either.

mod table;

pub use table::required;

use crate::auth::{Auth, Principal, Requirement, Scope, principal, who};
use crate::error::BrokerError;
use crate::service::{CallerRole, Route, Router};
use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// The answer of a call, filtered for a caller (not a superuser): only what
/// it may see.
pub(crate) type Filter<Resp> = fn(&Auth, Option<&Principal>, &mut Resp);

/// One row of the table: what an RPC taking `Req` and answering `Resp`
/// needs, is about, and how it is routed and filtered.
pub(crate) struct Rule<Req, Resp> {
    /// What the caller needs.
    pub need: Requirement,
    /// What the call is about.
    pub on: for<'a> fn(&'a Req) -> Scope<'a>,
    /// How it is routed in a cluster.
    pub route: Route,
    /// Other topics the call writes on the caller's behalf (the tiers a
    /// dead-letter policy names): each needs `produce`.
    pub writes_to: for<'a> fn(&'a Req) -> Vec<&'a str>,
    /// The answer's filter, if any.
    pub shown: Option<Filter<Resp>>,
}

impl<Req, Resp> Rule<Req, Resp> {
    /// Needs `need` on what `on` reads; answered here, unfiltered.
    pub fn new(need: Requirement, on: for<'a> fn(&'a Req) -> Scope<'a>) -> Self {
        Self {
            need,
            on,
            route: Route::Here,
            writes_to: |_| Vec::new(),
            shown: None,
        }
    }

    /// Routed `how` in a cluster.
    pub fn route(mut self, how: Route) -> Self {
        self.route = how;
        self
    }

    /// Also writes to the topics `to` reads.
    pub fn writes_to(mut self, to: for<'a> fn(&'a Req) -> Vec<&'a str>) -> Self {
        self.writes_to = to;
        self
    }

    /// Its answer filtered by `f` for callers other than superusers.
    pub fn shown(mut self, f: Filter<Resp>) -> Self {
        self.shown = Some(f);
        self
    }
}

/// What every call passes through: the permission check and the route.
#[derive(Debug, Clone)]
pub struct Gate {
    auth: Arc<Auth>,
    router: Router,
}

impl Gate {
    /// Checks against `auth`, routes with `router`.
    pub fn new(auth: Arc<Auth>, router: Router) -> Self {
        Self { auth, router }
    }

    /// Runs `method` (`Service/Method`) under `rule`: the caller's
    /// permission, then the route, then `inner`, then the answer's filter.
    /// Returns the caller with the answer.
    pub(crate) async fn call<Req, Resp, F, Fut>(
        &self,
        method: &'static str,
        rule: &Rule<Req, Resp>,
        mut r: Request<Req>,
        inner: F,
    ) -> Result<(Option<Principal>, Response<Resp>), Status>
    where
        F: FnOnce(Request<Req>) -> Fut,
        Fut: Future<Output = Result<Response<Resp>, Status>>,
    {
        let (p, topic) = {
            let p = principal(&self.auth, &r)?;
            let scope = (rule.on)(r.get_ref());
            self.auth.authorize(p.as_ref(), method, rule.need, scope)?;
            (p, scope.topic().map(str::to_owned))
        };
        if let Some(fan_out) = self.router.route(rule.route, topic.as_deref()).await? {
            r.extensions_mut().insert(fan_out);
        }
        for tier in (rule.writes_to)(r.get_ref()) {
            let tier = crate::name::TopicName::parse(tier)?;
            self.auth
                .check(p.as_ref(), &tier, crate::auth::Permission::Produce)?;
        }
        if let Some(p) = &p {
            // Named in a dead letter's edit history.
            r.extensions_mut().insert(CallerRole(p.role.clone()));
        }
        let mut resp = inner(r).await?;
        if let Some(shown) = rule.shown
            && !self.auth.is_superuser(p.as_ref())
        {
            shown(&self.auth, p.as_ref(), resp.get_mut());
        }
        Ok((p, resp))
    }

    /// [`Gate::call`], then `audit` with the caller's role, the request and
    /// the answer, once the call succeeded. A call refused as not permitted
    /// (PERMISSION_DENIED) writes an audit line too, with the role, the
    /// method and the reason: an attempt at a change is on record even when
    /// it changed nothing.
    pub(crate) async fn call_audited<Req, Resp, F, Fut>(
        &self,
        method: &'static str,
        rule: &Rule<Req, Resp>,
        r: Request<Req>,
        inner: F,
        audit: fn(&str, &Req, &Resp),
    ) -> Result<Response<Resp>, Status>
    where
        Req: Clone,
        F: FnOnce(Request<Req>) -> Fut,
        Fut: Future<Output = Result<Response<Resp>, Status>>,
    {
        let kept = r.get_ref().clone();
        let caller = r.extensions().get::<Principal>().cloned();
        match self.call(method, rule, r, inner).await {
            Ok((p, resp)) => {
                audit(who(p.as_ref()), &kept, resp.get_ref());
                Ok(resp)
            }
            Err(s) if s.code() == tonic::Code::PermissionDenied => {
                tracing::warn!(
                    target: crate::auth::AUDIT,
                    role = who(caller.as_ref()),
                    method,
                    reason = s.message(),
                    "refused"
                );
                Err(s)
            }
            Err(s) => Err(s),
        }
    }
}

/// A service behind the [`Gate`]: its RPCs run under the table's rows.
#[derive(Debug, Clone)]
pub struct Guarded<S> {
    inner: S,
    gate: Gate,
}

impl<S> Guarded<S> {
    /// `inner`, behind `gate`.
    pub fn new(inner: S, gate: Gate) -> Self {
        Self { inner, gate }
    }
}

/// Compares the table with the services of `descriptors` (an encoded
/// `FileDescriptorSet`): every RPC needs exactly one row, and every row an
/// RPC. The error lists what differs.
pub fn check_table_against(descriptors: &[u8]) -> Result<(), BrokerError> {
    use prost::Message as _;
    let fds = prost_types::FileDescriptorSet::decode(descriptors)
        .map_err(|e| BrokerError::Config(format!("the proto descriptors do not decode: {e}")))?;
    let rpcs: BTreeSet<String> = fds
        .file
        .iter()
        .flat_map(|f| &f.service)
        .flat_map(|s| {
            s.method
                .iter()
                .map(|m| format!("{}/{}", s.name(), m.name()))
        })
        .collect();
    let rows = table::rows();
    let named: BTreeSet<String> = rows.iter().map(|(m, _)| (*m).to_owned()).collect();
    let mut problems = Vec::new();
    if named.len() != rows.len() {
        problems.push("a method has two rows".to_owned());
    }
    let missing: Vec<_> = rpcs.difference(&named).collect();
    if !missing.is_empty() {
        problems.push(format!("no row for {missing:?}"));
    }
    let unknown: Vec<_> = named.difference(&rpcs).collect();
    if !unknown.is_empty() {
        problems.push(format!("rows for no RPC: {unknown:?}"));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(BrokerError::Config(format!(
            "the RPC table does not match the proto services: {}",
            problems.join("; ")
        )))
    }
}

/// [`check_table_against`] Ricochet's own descriptors.
pub fn check_table() -> Result<(), BrokerError> {
    check_table_against(ricochet_proto::FILE_DESCRIPTOR_SET)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message as _;

    #[test]
    fn every_rpc_of_the_descriptors_has_exactly_one_row() {
        check_table().unwrap();
    }

    #[test]
    fn an_rpc_without_a_row_or_a_row_without_an_rpc_is_refused() {
        let fds =
            prost_types::FileDescriptorSet::decode(ricochet_proto::FILE_DESCRIPTOR_SET).unwrap();
        let mut extra = fds.clone();
        let admin = extra
            .file
            .iter_mut()
            .flat_map(|f| &mut f.service)
            .find(|s| s.name() == "Admin")
            .unwrap();
        admin.method.push(prost_types::MethodDescriptorProto {
            name: Some("Frobnicate".into()),
            ..Default::default()
        });
        let e = check_table_against(&extra.encode_to_vec()).unwrap_err();
        assert!(
            e.to_string().contains("no row for [\"Admin/Frobnicate\"]"),
            "{e}"
        );
        let mut fewer = fds;
        for s in fewer.file.iter_mut().flat_map(|f| &mut f.service) {
            s.method.retain(|m| m.name() != "WhoAmI");
        }
        let e = check_table_against(&fewer.encode_to_vec()).unwrap_err();
        assert!(
            e.to_string().contains("rows for no RPC: [\"Auth/WhoAmI\"]"),
            "{e}"
        );
    }

    #[test]
    fn required_reads_the_table() {
        use crate::auth::Permission;
        assert_eq!(
            required("Admin/SetPolicy"),
            Some(Requirement::Permission(Permission::Policy))
        );
        assert_eq!(required("Cluster/Drain"), Some(Requirement::Superuser));
        assert_eq!(required("Admin/Frobnicate"), None);
    }
}
