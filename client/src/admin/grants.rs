//! Authorization: the grants of permissions to roles on namespaces and
//! topics ([`Admin::grant`], [`Admin::revoke`], [`Admin::list_grants`]) and
//! who the broker takes the caller for ([`Admin::who_am_i`]). All asked of
//! the client's broker (grants are the cluster's, not a topic's).

use ricochet_proto::auth_client::AuthClient;
use ricochet_proto::{GrantRequest, ListGrantsRequest, RevokeRequest, WhoAmIRequest};

use super::{Admin, Grant, WhoAmI, or_empty};
use crate::error::Result;

fn owned(permissions: &[&str]) -> Vec<String> {
    permissions.iter().map(|p| (*p).to_owned()).collect()
}

impl Admin {
    /// Adds `permissions` (`produce`, `consume`, `dead-letters`, `policy`,
    /// `admin`) to `role` on `resource` (`tenant/namespace` or a full topic
    /// name), durably. Answers the role's permissions there afterwards.
    pub async fn grant(&self, role: &str, resource: &str, permissions: &[&str]) -> Result<Grant> {
        let req = GrantRequest {
            role: role.to_owned(),
            resource: resource.to_owned(),
            permissions: owned(permissions),
        };
        self.on_service(req, |t, r| async move {
            AuthClient::new(t).grant_permission(r).await
        })
        .await
        .map(|r| r.grant.unwrap_or_default())
    }

    /// Removes `permissions` (none: all of them) from `role` on
    /// `resource`. Answers what the role keeps there (no permissions: none
    /// left).
    pub async fn revoke(&self, role: &str, resource: &str, permissions: &[&str]) -> Result<Grant> {
        let req = RevokeRequest {
            role: role.to_owned(),
            resource: resource.to_owned(),
            permissions: owned(permissions),
        };
        self.on_service(req, |t, r| async move {
            AuthClient::new(t).revoke_permission(r).await
        })
        .await
        .map(|r| r.grant.unwrap_or_default())
    }

    /// The grants in force, only `role`'s and only in `namespace` when
    /// given.
    pub async fn list_grants(
        &self,
        role: Option<&str>,
        namespace: Option<&str>,
    ) -> Result<Vec<Grant>> {
        let req = ListGrantsRequest {
            role: or_empty(role),
            namespace: or_empty(namespace),
        };
        self.on_service(req, |t, r| async move {
            AuthClient::new(t).list_grants(r).await
        })
        .await
        .map(|r| r.grants)
    }

    /// The caller as the broker sees it: its role (empty with
    /// authentication off), whether it is a superuser.
    pub async fn who_am_i(&self) -> Result<WhoAmI> {
        self.on_service(WhoAmIRequest {}, |t, r| async move {
            AuthClient::new(t).who_am_i(r).await
        })
        .await
    }
}
