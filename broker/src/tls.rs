//! TLS on the gRPC listener (rustls through tonic), optionally verifying
//! client certificates (mTLS), and the role a client certificate names;
//! the web console is served with the same certificate.
//!
//! ```toml
//! [tls]
//! cert_file = "/etc/ricochet/broker.pem"     # PEM chain, leaf first
//! key_file = "/etc/ricochet/broker.key"      # PEM private key
//! client_ca_file = "/etc/ricochet/ca.pem"    # verify client certificates against it
//! require_client_cert = true                 # refuse clients without one
//! role_from_client_cert = true               # a verified certificate's CN is the role
//! ```

use crate::error::BrokerError;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

/// TLS settings; off unless `cert_file` and `key_file` are set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// The broker's certificate chain (PEM).
    pub cert_file: Option<PathBuf>,
    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key_file: Option<PathBuf>,
    /// CA certificates (PEM) client certificates are verified against;
    /// none: client certificates are not asked for.
    pub client_ca_file: Option<PathBuf>,
    /// With `client_ca_file`: refuse a client without a valid certificate
    /// (otherwise a certificate is verified when one is presented).
    pub require_client_cert: bool,
    /// With `client_ca_file` and auth on: a caller without a token is the
    /// role its verified certificate's subject common name (CN) names.
    /// With `require_client_cert` and no `[cluster] peer_token_file`, the
    /// CN of `cert_file` is then the role this broker's Raft calls prove.
    pub role_from_client_cert: bool,
}

impl TlsConfig {
    /// Whether TLS is configured.
    pub fn enabled(&self) -> bool {
        self.cert_file.is_some() || self.key_file.is_some()
    }

    /// The rustls setup for tonic, with every file read now; a missing file,
    /// a file that is not PEM, or a key that does not match the certificate
    /// is an error naming it.
    pub fn server_config(&self) -> Result<Option<ServerTlsConfig>, BrokerError> {
        let (cert, key) = match (&self.cert_file, &self.key_file) {
            (None, None) => {
                if self.client_ca_file.is_some() {
                    return Err(BrokerError::Config(
                        "tls.client_ca_file needs tls.cert_file and tls.key_file".into(),
                    ));
                }
                return Ok(None);
            }
            (Some(c), Some(k)) => (c, k),
            _ => {
                return Err(BrokerError::Config(
                    "TLS needs both tls.cert_file and tls.key_file".into(),
                ));
            }
        };
        let cert_pem = read_pem(cert, "tls.cert_file", "CERTIFICATE")?;
        let key_pem = read_pem(key, "tls.key_file", "PRIVATE KEY")?;
        let mut tls = ServerTlsConfig::new().identity(Identity::from_pem(cert_pem, key_pem));
        if let Some(ca) = &self.client_ca_file {
            let ca_pem = read_pem(ca, "tls.client_ca_file", "CERTIFICATE")?;
            tls = tls
                .client_ca_root(Certificate::from_pem(ca_pem))
                .client_auth_optional(!self.require_client_cert);
        }
        // Check the pair now (tonic builds the rustls config lazily), so a
        // key that does not match the certificate stops the broker at start.
        tonic::transport::Server::builder()
            .tls_config(tls.clone())
            .map_err(|e| {
                let mut why = e.to_string();
                let mut src = std::error::Error::source(&e);
                while let Some(s) = src {
                    why = format!("{why}: {s}");
                    src = s.source();
                }
                BrokerError::Config(format!(
                    "TLS: {} and {} do not make a usable identity ({why})",
                    cert.display(),
                    key.display()
                ))
            })?;
        Ok(Some(tls))
    }
}

impl TlsConfig {
    /// The rustls setup for the web console (same certificate and key as
    /// the gRPC listener; no client certificates: the console signs in by
    /// token), or `None` without TLS.
    pub fn console_config(
        &self,
    ) -> Result<Option<std::sync::Arc<rustls::ServerConfig>>, BrokerError> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let (Some(cert), Some(key)) = (&self.cert_file, &self.key_file) else {
            return Ok(None);
        };
        let certs =
            CertificateDer::pem_slice_iter(&read_pem(cert, "tls.cert_file", "CERTIFICATE")?)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| {
                    BrokerError::Config(format!("tls.cert_file {}: {e}", cert.display()))
                })?;
        let key_der = PrivateKeyDer::from_pem_slice(&read_pem(key, "tls.key_file", "PRIVATE KEY")?)
            .map_err(|e| BrokerError::Config(format!("tls.key_file {}: {e}", key.display())))?;
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .and_then(|b| b.with_no_client_auth().with_single_cert(certs, key_der))
            .map_err(|e| BrokerError::Config(format!("TLS for the web console: {e}")))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Some(std::sync::Arc::new(config)))
    }
}

impl TlsConfig {
    /// The TLS setup this broker calls the other brokers of its cluster
    /// with (Raft), when it listens with TLS itself: their certificates
    /// verified against `peer_ca` (`[cluster] peer_ca_file`), else
    /// `client_ca_file`; when clients must show a certificate, this
    /// broker's own is shown. `None` without TLS, or with no CA to trust
    /// (then `https://` peers are unreachable, and replicated topics are
    /// refused, see [`crate::replication::factor::check_peers`]).
    pub fn peer_client_config(
        &self,
        peer_ca: Option<&Path>,
    ) -> Result<Option<ClientTlsConfig>, BrokerError> {
        if !self.enabled() {
            return Ok(None);
        }
        let (ca, what) = match (peer_ca, &self.client_ca_file) {
            (Some(ca), _) => (ca, "cluster.peer_ca_file"),
            (None, Some(ca)) => (ca.as_path(), "tls.client_ca_file"),
            (None, None) => return Ok(None),
        };
        let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read_pem(
            ca,
            what,
            "CERTIFICATE",
        )?));
        if self.require_client_cert
            && let (Some(cert), Some(key)) = (&self.cert_file, &self.key_file)
        {
            tls = tls.identity(Identity::from_pem(
                read_pem(cert, "tls.cert_file", "CERTIFICATE")?,
                read_pem(key, "tls.key_file", "PRIVATE KEY")?,
            ));
        }
        Ok(Some(tls))
    }
}

impl TlsConfig {
    /// Whether this broker's Raft calls prove its role with its own
    /// certificate (no peer token needed): the peers ask for client
    /// certificates (`require_client_cert`, so this broker shows
    /// `cert_file` as one) and take a verified certificate's CN as the
    /// role (`role_from_client_cert`). The brokers of a cluster are
    /// expected to share these settings.
    pub fn peer_identity_from_cert(&self) -> bool {
        self.require_client_cert
            && self.role_from_client_cert
            && self.client_ca_file.is_some()
            && self.cert_file.is_some()
    }

    /// The subject CN of `cert_file`'s first certificate: the role this
    /// broker's Raft calls prove when [`Self::peer_identity_from_cert`].
    pub fn own_common_name(&self) -> Result<String, BrokerError> {
        let path = self
            .cert_file
            .as_deref()
            .ok_or_else(|| BrokerError::Config("tls.cert_file is not set".into()))?;
        let pem = read_pem(path, "tls.cert_file", "CERTIFICATE")?;
        let bad =
            |why: &str| BrokerError::Config(format!("tls.cert_file {}: {why}", path.display()));
        let (_, block) =
            x509_parser::pem::parse_x509_pem(&pem).map_err(|_| bad("no PEM certificate"))?;
        common_name(&block.contents).ok_or_else(|| bad("its certificate has no subject CN"))
    }
}

fn read_pem(path: &Path, what: &str, label: &str) -> Result<Vec<u8>, BrokerError> {
    let bytes = std::fs::read(path)
        .map_err(|e| BrokerError::Config(format!("cannot read {what} {}: {e}", path.display())))?;
    if !String::from_utf8_lossy(&bytes).contains(&format!("{label}-----")) {
        return Err(BrokerError::Config(format!(
            "{what} {} holds no PEM {label}",
            path.display()
        )));
    }
    Ok(bytes)
}

/// The subject common name of a DER certificate.
pub(crate) fn common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    cert.subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_brokers_own_certificate_names_its_peer_role() {
        let dir = tempfile::tempdir().unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["localhost".into()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "broker-b1");
        let cert = params.self_signed(&key).unwrap();
        let pem = dir.path().join("b1.pem");
        std::fs::write(&pem, cert.pem()).unwrap();
        let mut tls = TlsConfig {
            cert_file: Some(pem),
            key_file: Some(dir.path().join("b1.key")),
            client_ca_file: Some(dir.path().join("ca.pem")),
            ..Default::default()
        };
        assert_eq!(tls.own_common_name().unwrap(), "broker-b1");
        // Only when the peers ask for certificates and take their CN as the role.
        assert!(!tls.peer_identity_from_cert());
        tls.require_client_cert = true;
        assert!(!tls.peer_identity_from_cert());
        tls.role_from_client_cert = true;
        assert!(tls.peer_identity_from_cert());
        tls.client_ca_file = None;
        assert!(!tls.peer_identity_from_cert());
        // A file without a certificate: a config error naming it.
        let bad = dir.path().join("bad.pem");
        std::fs::write(&bad, "not a certificate").unwrap();
        tls.cert_file = Some(bad);
        let e = tls.own_common_name().unwrap_err().to_string();
        assert!(e.contains("tls.cert_file"), "{e}");
    }
}
