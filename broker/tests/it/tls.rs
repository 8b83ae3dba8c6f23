//! TLS on the listener, with certificates made at test time by rcgen: a
//! client that trusts another CA is refused, a plaintext client is refused,
//! a broker that requires client certificates refuses a client without one
//! or with one another CA signed, a verified certificate's CN can be the
//! role, and a missing or mismatched key stops the broker at start.

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use ricochet_proto::WhoAmIRequest;
use ricochet_proto::auth_client::AuthClient;
use ricochet_testkit::InProcessBroker;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        Self {
            issuer: CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap(),
        }
    }

    fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A leaf certificate for `names` with CN `cn`: (cert PEM, key PEM).
    fn leaf(&self, cn: &str, names: &[&str]) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

async fn connect(
    addr: std::net::SocketAddr,
    ca: &str,
    identity: Option<&(String, String)>,
) -> Result<Channel, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name("localhost");
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Channel::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
}

/// Who the broker says the caller is, over `channel`.
async fn whoami(channel: Channel) -> Result<String, tonic::Status> {
    AuthClient::new(channel)
        .who_am_i(WhoAmIRequest {})
        .await
        .map(|r| r.into_inner().role)
}

/// Whether a call over a new connection works (a refused handshake may
/// show up at connect or at the first call).
async fn works(addr: std::net::SocketAddr, ca: &str, identity: Option<&(String, String)>) -> bool {
    match connect(addr, ca, identity).await {
        Ok(ch) => whoami(ch).await.is_ok(),
        Err(_) => false,
    }
}

#[tokio::test]
async fn tls_refuses_clients_that_trust_another_ca_and_plaintext() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("ricochet test ca");
    let (cert, key) = ca.leaf("broker", &["localhost"]);
    let (cert, key) = (
        write(dir.path(), "b.pem", &cert),
        write(dir.path(), "b.key", &key),
    );
    let broker = InProcessBroker::start_with(|c| {
        c.tls.cert_file = Some(cert);
        c.tls.key_file = Some(key);
    })
    .await;
    assert!(
        works(broker.addr, &ca.pem(), None).await,
        "the right CA connects"
    );
    let other = Ca::new("another ca");
    assert!(
        !works(broker.addr, &other.pem(), None).await,
        "a wrong CA is refused"
    );
    let plain = Channel::from_shared(format!("http://{}", broker.addr))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await;
    if let Ok(ch) = plain {
        assert!(whoami(ch).await.is_err(), "plaintext is refused");
    }
}

#[tokio::test]
async fn mtls_requires_a_client_certificate_from_the_client_ca_and_its_cn_is_the_role() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("ricochet test ca");
    let (cert, key) = ca.leaf("broker", &["localhost"]);
    let cert = write(dir.path(), "b.pem", &cert);
    let key = write(dir.path(), "b.key", &key);
    let client_ca = write(dir.path(), "ca.pem", &ca.pem());
    let secret = write(dir.path(), "secret", "s3cret");
    let broker = InProcessBroker::start_with(|c| {
        c.tls.cert_file = Some(cert);
        c.tls.key_file = Some(key);
        c.tls.client_ca_file = Some(client_ca);
        c.tls.require_client_cert = true;
        c.tls.role_from_client_cert = true;
        c.auth.enabled = true;
        c.auth.token_secret_file = Some(secret);
    })
    .await;
    let app = ca.leaf("app", &["app"]);
    assert!(
        !works(broker.addr, &ca.pem(), None).await,
        "no client certificate: refused"
    );
    let stranger = Ca::new("another ca").leaf("root", &["root"]);
    assert!(
        !works(broker.addr, &ca.pem(), Some(&stranger)).await,
        "a certificate another CA signed is refused"
    );
    let ch = connect(broker.addr, &ca.pem(), Some(&app)).await.unwrap();
    assert_eq!(
        whoami(ch).await.unwrap(),
        "app",
        "the certificate's CN is the role"
    );
}

#[tokio::test]
async fn a_missing_or_mismatched_key_stops_the_broker_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("ricochet test ca");
    let (cert, _) = ca.leaf("broker", &["localhost"]);
    let (_, other_key) = ca.leaf("other", &["localhost"]);
    let cert = write(dir.path(), "b.pem", &cert);
    let wrong = write(dir.path(), "wrong.key", &other_key);
    let mut config = ricochet_broker::BrokerConfig::for_dir(dir.path().join("data"));
    config.tls.cert_file = Some(cert.clone());
    config.tls.key_file = Some(wrong);
    let e = ricochet_broker::Broker::builder(config.clone())
        .open()
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("wrong.key") && e.contains("b.pem"), "{e}");
    config.tls.key_file = Some(dir.path().join("missing.key"));
    let e = ricochet_broker::Broker::builder(config.clone())
        .open()
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("missing.key"), "{e}");
    config.tls.key_file = None;
    let e = ricochet_broker::Broker::builder(config)
        .open()
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("key_file"), "{e}");
}
