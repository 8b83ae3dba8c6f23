//! [`AuthService`]: the `Auth` gRPC service, granting, revoking and listing
//! permissions. A superuser may change any grant; a role with `admin` on a
//! namespace may change grants in it (checked by the RPC table,
//! [`crate::gate`], before a change reaches this service).

use super::check::{principal, who};
use super::grants::Resource;
use super::{Auth, Permission, Principal};
use crate::error::BrokerError;
use crate::flusher::Flusher;
use ricochet_proto::auth_server::Auth as AuthRpc;
use ricochet_proto::{
    Grant, GrantRequest, GrantResponse, ListGrantsRequest, ListGrantsResponse, RevokeRequest,
    WhoAmIRequest, WhoAmIResponse,
};
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// Grants management.
#[derive(Debug, Clone)]
pub struct AuthService {
    auth: Arc<Auth>,
    /// Makes a grant change durable before it is answered.
    flusher: Flusher,
}

impl AuthService {
    /// A service over `auth`'s grants, made durable through `flusher`.
    pub fn new(auth: Arc<Auth>, flusher: Flusher) -> Self {
        Self { auth, flusher }
    }

    fn auth(&self) -> &Auth {
        &self.auth
    }

    /// Parses a grant change (the caller's permission to make it is
    /// checked before).
    fn change_request<T>(
        &self,
        r: &Request<T>,
        role: &str,
        resource: &str,
        permissions: &[String],
    ) -> Result<(Option<Principal>, Resource, Vec<Permission>), Status> {
        let p = principal(self.auth(), r)?;
        check_role(role)?;
        let resource = Resource::parse(resource)?;
        let perms = permissions
            .iter()
            .map(|s| super::grants::parse_permission(s))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((p, resource, perms))
    }
}

fn check_role(role: &str) -> Result<(), BrokerError> {
    if role.is_empty() || role.len() > 256 || role.chars().any(|c| c.is_control()) {
        return Err(BrokerError::InvalidArgument(
            "role must be 1-256 characters, none of them control characters".into(),
        ));
    }
    Ok(())
}

fn grant_of(role: &str, resource: &Resource, permissions: Vec<String>) -> Grant {
    Grant {
        role: role.to_owned(),
        resource: resource.as_str().to_owned(),
        permissions,
    }
}

#[tonic::async_trait]
impl AuthRpc for AuthService {
    async fn grant_permission(
        &self,
        r: Request<GrantRequest>,
    ) -> Result<Response<GrantResponse>, Status> {
        let g = r.get_ref();
        let (p, resource, perms) = self.change_request(&r, &g.role, &g.resource, &g.permissions)?;
        if perms.is_empty() {
            return Err(Status::invalid_argument(
                "name at least one permission to grant",
            ));
        }
        let held = self
            .auth()
            .change(p.as_ref(), &g.role, &resource, &perms, true, &self.flusher)
            .await?;
        Ok(Response::new(GrantResponse {
            grant: Some(grant_of(&g.role, &resource, held)),
        }))
    }

    async fn revoke_permission(
        &self,
        r: Request<RevokeRequest>,
    ) -> Result<Response<GrantResponse>, Status> {
        let g = r.get_ref();
        let (p, resource, perms) = self.change_request(&r, &g.role, &g.resource, &g.permissions)?;
        let held = self
            .auth()
            .change(p.as_ref(), &g.role, &resource, &perms, false, &self.flusher)
            .await?;
        Ok(Response::new(GrantResponse {
            grant: Some(grant_of(&g.role, &resource, held)),
        }))
    }

    async fn list_grants(
        &self,
        r: Request<ListGrantsRequest>,
    ) -> Result<Response<ListGrantsResponse>, Status> {
        let p = principal(self.auth(), &r)?;
        let q = r.into_inner();
        let ns = match q.namespace.as_str() {
            "" => None,
            given => Some(crate::name::parse_namespace(given)?.to_owned()),
        };
        let superuser = self.auth().is_superuser(p.as_ref());
        // Others see a namespace's grants where they hold admin, or their own.
        let own = p.as_ref().is_some_and(|p| p.role == q.role);
        if !superuser && !own {
            match &ns {
                Some(ns) => self
                    .auth()
                    .check_namespace(p.as_ref(), ns, Permission::Admin)?,
                None => {
                    return Err(BrokerError::PermissionDenied(format!(
                        "role {:?} lacks the admin permission needed to list every grant: name a namespace or your own role",
                        who(p.as_ref())
                    ))
                    .into());
                }
            }
        }
        let grants = self
            .auth()
            .grants()
            .into_iter()
            .filter(|g| q.role.is_empty() || g.role == q.role)
            .filter(|g| {
                ns.as_deref().is_none_or(|ns| {
                    Resource::parse(&g.resource).is_ok_and(|r| r.namespace() == ns)
                })
            })
            .map(|g| Grant {
                role: g.role,
                resource: g.resource,
                permissions: g.permissions.names(),
            })
            .collect();
        Ok(Response::new(ListGrantsResponse { grants }))
    }

    async fn who_am_i(
        &self,
        r: Request<WhoAmIRequest>,
    ) -> Result<Response<WhoAmIResponse>, Status> {
        let p = principal(self.auth(), &r)?;
        Ok(Response::new(WhoAmIResponse {
            role: p.as_ref().map(|p| p.role.clone()).unwrap_or_default(),
            superuser: self.auth().is_superuser(p.as_ref()),
            auth_enabled: self.auth().enabled(),
        }))
    }
}
