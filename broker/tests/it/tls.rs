//! TLS on the listener, with certificates made at test time by rcgen: a
//! client that trusts another CA is refused, a plaintext client is refused,
//! a broker that requires client certificates refuses a client without one
//! or with one another CA signed, a verified certificate's CN can be the
//! role, and a missing or mismatched key stops the broker at start. The
//! web console is served over TLS too, its sign-in cookie Secure.

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

/// An HTTP/1.1 `request` over TLS to `addr`, trusting `ca`: the whole
/// response as text.
fn https(addr: std::net::SocketAddr, ca: &str, request: &str) -> std::io::Result<String> {
    use rustls::pki_types::{CertificateDer, pem::PemObject};
    use std::io::{Read, Write};
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let conn =
        rustls::ClientConnection::new(std::sync::Arc::new(config), "localhost".try_into().unwrap())
            .unwrap();
    let sock = std::net::TcpStream::connect(addr)?;
    sock.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut tls = rustls::StreamOwned::new(conn, sock);
    tls.write_all(request.as_bytes())?;
    let mut out = Vec::new();
    match tls.read_to_end(&mut out) {
        Ok(_) => {}
        // A peer that closes without close_notify: what came is the answer.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {}
        Err(e) => return Err(e),
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// With `[tls]` the web console is served over TLS with the same
/// certificate (plaintext gets no page), and its sign-in cookie is Secure.
#[tokio::test]
async fn with_tls_the_console_is_served_over_tls_and_its_sign_in_cookie_is_secure() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("ricochet test ca");
    let (cert, key) = ca.leaf("broker", &["localhost"]);
    let (cert, key) = (
        write(dir.path(), "b.pem", &cert),
        write(dir.path(), "b.key", &key),
    );
    let secret = write(dir.path(), "secret.key", "console-tls-secret-0123456789");
    let broker = InProcessBroker::start_with(|c| {
        c.tls.cert_file = Some(cert);
        c.tls.key_file = Some(key);
        c.auth.enabled = true;
        c.auth.token_secret_file = Some(secret);
        c.auth.superusers = vec!["root".into()];
        c.console_listen = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
    })
    .await;
    let addr = broker.console_addr.expect("a console");
    let token = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &ricochet_broker::auth::TokenClaims {
            sub: "root".into(),
            exp: None,
        },
        &jsonwebtoken::EncodingKey::from_secret(b"console-tls-secret-0123456789").unwrap(),
    )
    .unwrap();
    let body = format!("token={token}");
    let request = format!(
        "POST /sign-in HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let ca_pem = ca.pem();
    let resp = tokio::task::spawn_blocking(move || https(addr, &ca_pem, &request))
        .await
        .unwrap()
        .expect("an answer over TLS");
    assert!(resp.starts_with("HTTP/1.1 303"), "{resp}");
    let cookie = resp
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("set-cookie:"))
        .unwrap_or_else(|| panic!("no cookie set: {resp}"));
    assert!(
        cookie.contains("; Secure") && cookie.contains("HttpOnly"),
        "{cookie}"
    );
    // Plaintext HTTP to the same port gets no page.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut plain = tokio::net::TcpStream::connect(addr).await.unwrap();
    plain
        .write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), plain.read_to_end(&mut got)).await;
    assert!(
        !String::from_utf8_lossy(&got).starts_with("HTTP/1.1"),
        "plaintext got a page"
    );
}
