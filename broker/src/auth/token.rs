//! JWT verification with `jsonwebtoken`: HS256 with a shared secret, RS256
//! or ES256 with a public key. The subject is the role; `exp`, when the
//! token has one, is enforced (tokens without one never expire, as in
//! Pulsar).

use crate::config::{AuthConfig, read_secret};
use crate::error::BrokerError;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::{Deserialize, Serialize};

/// The JWT claims Ricochet reads (and `ricochet token create` writes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenClaims {
    /// The role.
    pub sub: String,
    /// Expiry, seconds since the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exp: Option<u64>,
}

/// Checks tokens against the configured key.
pub struct Verifier {
    key: DecodingKey,
    validation: Validation,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier")
            .field("algorithms", &self.validation.algorithms)
            .finish_non_exhaustive()
    }
}

impl Verifier {
    /// The verifier `config` names (its key file read now, so a missing or
    /// unreadable key stops the broker at start).
    pub fn from_config(config: &AuthConfig) -> Result<Self, BrokerError> {
        if let Some(path) = &config.token_secret_file {
            let secret = read_secret(path, "token secret file")?;
            return Self::hs256(&secret).map_err(|e| {
                BrokerError::Config(format!("token secret file {}: {e}", path.display()))
            });
        }
        if let Some(path) = &config.token_public_key_file {
            let pem = std::fs::read(path).map_err(|e| {
                BrokerError::Config(format!(
                    "cannot read token public key file {}: {e}",
                    path.display()
                ))
            })?;
            return Self::public_key(&pem).map_err(|why| {
                BrokerError::Config(format!("token public key file {}: {why}", path.display()))
            });
        }
        Err(BrokerError::Config(
            "auth.enabled needs token_secret_file or token_public_key_file".into(),
        ))
    }

    /// HS256 with `secret` (which must not be empty).
    pub fn hs256(secret: &[u8]) -> Result<Self, String> {
        DecodingKey::from_secret(secret)
            .map(|key| Self::with(key, Algorithm::HS256))
            .map_err(|e| e.to_string())
    }

    /// RS256 or ES256, whichever key `pem` holds.
    pub fn public_key(pem: &[u8]) -> Result<Self, String> {
        if let Ok(key) = DecodingKey::from_rsa_pem(pem) {
            return Ok(Self::with(key, Algorithm::RS256));
        }
        match DecodingKey::from_ec_pem(pem) {
            Ok(key) => Ok(Self::with(key, Algorithm::ES256)),
            Err(e) => Err(format!("not a PEM RSA or EC public key ({e})")),
        }
    }

    fn with(key: DecodingKey, alg: Algorithm) -> Self {
        let mut validation = Validation::new(alg);
        validation.required_spec_claims = ["sub".to_owned()].into_iter().collect();
        validation.validate_exp = true;
        validation.leeway = 5;
        Self { key, validation }
    }

    /// The role `token` proves, or why it does not (a short reason for the
    /// client).
    pub fn verify(&self, token: &str) -> Result<String, &'static str> {
        let data = jsonwebtoken::decode::<TokenClaims>(token, &self.key, &self.validation)
            .map_err(|e| match e.kind() {
                ErrorKind::ExpiredSignature => "token expired",
                ErrorKind::InvalidSignature => "token signature does not verify",
                ErrorKind::InvalidAlgorithm | ErrorKind::InvalidAlgorithmName => {
                    "token signed with an algorithm this broker does not accept"
                }
                ErrorKind::MissingRequiredClaim(_) => "token has no subject (sub)",
                ErrorKind::ImmatureSignature => "token not valid yet",
                _ => "malformed token",
            })?;
        if data.claims.sub.is_empty() {
            return Err("token has an empty subject");
        }
        Ok(data.claims.sub)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{EncodingKey, Header};

    fn now() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    }

    fn hs(secret: &[u8], sub: &str, exp: Option<u64>) -> String {
        let claims = TokenClaims {
            sub: sub.into(),
            exp,
        };
        jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(secret).unwrap(),
        )
        .unwrap()
    }

    #[test]
    fn hs256_tokens_prove_their_subject_until_they_expire() {
        let v = Verifier::hs256(b"s3cret").unwrap();
        assert_eq!(
            v.verify(&hs(b"s3cret", "app", Some(now() + 60))),
            Ok("app".into())
        );
        assert_eq!(v.verify(&hs(b"s3cret", "app", None)), Ok("app".into()));
        assert_eq!(
            v.verify(&hs(b"s3cret", "app", Some(now() - 3600))),
            Err("token expired")
        );
        assert_eq!(
            v.verify(&hs(b"other", "app", None)),
            Err("token signature does not verify")
        );
        assert_eq!(v.verify("not.a.token"), Err("malformed token"));
        assert_eq!(v.verify(""), Err("malformed token"));
        // A token whose payload was edited (another subject) no longer verifies.
        let good = hs(b"s3cret", "app", None);
        let forged = hs(b"x", "root", None);
        let mut parts: Vec<&str> = good.split('.').collect();
        let forged_payload = forged.split('.').nth(1).unwrap();
        parts[1] = forged_payload;
        assert_eq!(
            v.verify(&parts.join(".")),
            Err("token signature does not verify")
        );
    }
}
