//! The `[auth]` section of the broker's configuration.

use crate::error::BrokerError;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::PathBuf;

/// Authentication and authorization settings.
///
/// ```toml
/// [auth]
/// enabled = true
/// token_secret_file = "/etc/ricochet/secret.key"        # HS256, or:
/// # token_public_key_file = "/etc/ricochet/public.pem"  # RS256 or ES256
/// superusers = ["admin"]
/// metrics_token_file = "/etc/ricochet/metrics.token"    # /metrics needs this bearer token
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// Require a credential on every call (health checks excepted) and
    /// check permissions. Off: everyone may do everything.
    pub enabled: bool,
    /// A file holding the HS256 secret (its bytes as they are, a trailing
    /// newline removed).
    pub token_secret_file: Option<PathBuf>,
    /// A PEM file holding the RSA (RS256) or EC P-256 (ES256) public key
    /// tokens are checked with.
    pub token_public_key_file: Option<PathBuf>,
    /// Roles that may do everything, grants or not.
    pub superusers: Vec<String>,
    /// Serve on a non-loopback address without authentication. Refused
    /// otherwise, so a broker is not exposed unprotected by mistake.
    pub allow_insecure: bool,
    /// A file holding the bearer token `/metrics` requires (a trailing
    /// newline removed); none: `/metrics` is open.
    pub metrics_token_file: Option<PathBuf>,
}

impl AuthConfig {
    /// Rejects settings that cannot work, and an exposed broker without
    /// authentication (unless `allow_insecure`).
    pub fn validate(&self, listen: SocketAddr) -> Result<(), BrokerError> {
        let bad = |m: String| Err(BrokerError::Config(m));
        if self.enabled {
            match (&self.token_secret_file, &self.token_public_key_file) {
                (Some(_), Some(_)) => {
                    return bad(
                        "auth: set token_secret_file or token_public_key_file, not both".into(),
                    );
                }
                (None, None) => {
                    return bad(
                        "auth.enabled needs a token verification key: token_secret_file (HS256) or token_public_key_file (RS256/ES256)"
                            .into(),
                    );
                }
                _ => {}
            }
        }
        if !self.enabled && !self.allow_insecure && !listen.ip().is_loopback() {
            return bad(format!(
                "refusing to listen on {listen} without authentication: enable [auth] \
                 (or --auth-secret-file/--auth-public-key-file), or pass --allow-insecure \
                 (auth.allow_insecure = true) to serve it unprotected"
            ));
        }
        Ok(())
    }
}

/// The bearer token `/metrics` requires, read from `metrics_token_file`.
pub fn metrics_token(config: &AuthConfig) -> Result<Option<Vec<u8>>, BrokerError> {
    config
        .metrics_token_file
        .as_deref()
        .map(|p| read_secret(p, "metrics token file"))
        .transpose()
}

/// Reads a secret or token file, without a trailing newline.
pub(crate) fn read_secret(path: &std::path::Path, what: &str) -> Result<Vec<u8>, BrokerError> {
    let mut bytes = std::fs::read(path)
        .map_err(|e| BrokerError::Config(format!("cannot read {what} {}: {e}", path.display())))?;
    while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        bytes.pop();
    }
    if bytes.is_empty() {
        return Err(BrokerError::Config(format!(
            "{what} {} is empty",
            path.display()
        )));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exposed_broker_needs_auth_or_an_explicit_insecure() {
        let any: SocketAddr = "0.0.0.0:6650".parse().unwrap();
        let local: SocketAddr = "127.0.0.1:6650".parse().unwrap();
        let off = AuthConfig::default();
        off.validate(local).unwrap();
        let err = off.validate(any).unwrap_err().to_string();
        assert!(err.contains("--allow-insecure"), "{err}");
        AuthConfig {
            allow_insecure: true,
            ..AuthConfig::default()
        }
        .validate(any)
        .unwrap();
        let keyless = AuthConfig {
            enabled: true,
            ..AuthConfig::default()
        };
        assert!(keyless.validate(any).is_err());
        AuthConfig {
            enabled: true,
            token_secret_file: Some("/x".into()),
            ..AuthConfig::default()
        }
        .validate(any)
        .unwrap();
    }
}
