//! [`Client`]: one HTTP/2 connection to a broker, shared by every producer
//! and consumer made from it, and [`ClientBuilder`] for its timeouts and
//! reconnect backoff. In a cluster the client also keeps a pool of
//! connections to the topics' owners, keyed by URL and made with the same
//! settings (see [`routing`]).

use std::sync::Arc;
use std::time::Duration;

use ricochet_proto::admin_client::AdminClient;
use ricochet_proto::broker_client::BrokerClient;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use crate::credentials::{Credentials, Transport};
use crate::error::{Error, Result};
pub(crate) mod routing;

use routing::Routes;
pub use routing::TopicOwner;
pub(crate) use routing::not_a_cluster_broker;

use ricochet_proto::MAX_GRPC_MESSAGE_BYTES as MAX_FRAME_BYTES;

/// Connection settings shared by a client's producers and consumers.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ClientConfig {
    /// How long to wait for the TCP + HTTP/2 connection (also on reconnects).
    pub connect_timeout: Duration,
    /// How long to wait for the broker to answer a request: opening a
    /// producer or a consumer, a `reconsume_later`/`terminate`
    /// confirmation, the final acks of `close`.
    pub request_timeout: Duration,
    /// First delay between reconnect attempts of a broken stream.
    pub reconnect_min: Duration,
    /// Largest delay between reconnect attempts (the delay doubles, with
    /// ±20 % jitter, up to this).
    pub reconnect_max: Duration,
    /// HTTP/2 keep-alive ping interval, so a silently dead connection is
    /// noticed (and the streams on it reconnected).
    pub keep_alive_interval: Duration,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            reconnect_min: Duration::from_millis(100),
            reconnect_max: Duration::from_secs(30),
            keep_alive_interval: Duration::from_secs(15),
        }
    }
}

/// Builds a [`Client`].
///
/// ```no_run
/// # async fn run() -> ricochet_client::Result<()> {
/// use std::time::Duration;
/// let client = ricochet_client::Client::builder("http://127.0.0.1:6650")
///     .connect_timeout(Duration::from_secs(5))
///     .request_timeout(Duration::from_secs(10))
///     .reconnect_backoff(Duration::from_millis(50), Duration::from_secs(5))
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    url: String,
    fallbacks: Vec<String>,
    config: ClientConfig,
    token: Option<String>,
    tls_ca: Option<Vec<u8>>,
    tls_identity: Option<(Vec<u8>, Vec<u8>)>,
    tls_domain: Option<String>,
}

impl ClientBuilder {
    /// Connection timeout (default 10 s).
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.config.connect_timeout = d;
        self
    }

    /// Request timeout (default 30 s), see [`ClientConfig::request_timeout`].
    pub fn request_timeout(mut self, d: Duration) -> Self {
        self.config.request_timeout = d;
        self
    }

    /// Reconnect backoff bounds (default 100 ms to 30 s).
    pub fn reconnect_backoff(mut self, min: Duration, max: Duration) -> Self {
        self.config.reconnect_min = min.max(Duration::from_millis(1));
        self.config.reconnect_max = max.max(self.config.reconnect_min);
        self
    }

    /// Another broker of the cluster, asked for lookups (and the broker
    /// list) when the service URL's broker cannot be reached; repeatable.
    /// Without one, a client whose service URL's broker is down finds
    /// topics only through brokers it already has connections to (the
    /// owners it was sent to), and none if its service URL's broker owned
    /// them all. Connected on first use.
    pub fn fallback_url(mut self, url: impl Into<String>) -> Self {
        self.fallbacks.push(url.into());
        self
    }

    /// HTTP/2 keep-alive interval (default 15 s).
    pub fn keep_alive_interval(mut self, d: Duration) -> Self {
        self.config.keep_alive_interval = d;
        self
    }

    /// A bearer token (JWT) sent with every call, for a broker with
    /// authentication on (`ricochet token create` makes one).
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// The CA certificates (PEM) a `https://` broker's certificate must
    /// chain to.
    pub fn tls_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_ca = Some(pem.into());
        self
    }

    /// A client certificate chain and its private key (PEM), for a broker
    /// that verifies client certificates (mTLS).
    pub fn tls_identity_pem(mut self, cert: impl Into<Vec<u8>>, key: impl Into<Vec<u8>>) -> Self {
        self.tls_identity = Some((cert.into(), key.into()));
        self
    }

    /// The name the broker's certificate must carry (default: the URL's
    /// host). In a cluster it applies to every broker the client connects
    /// to, so set it only when all their certificates carry that name.
    pub fn tls_domain(mut self, name: impl Into<String>) -> Self {
        self.tls_domain = Some(name.into());
        self
    }

    fn endpoints(&self) -> Endpoints {
        Endpoints {
            config: self.config.clone(),
            tls_ca: self.tls_ca.clone(),
            tls_identity: self.tls_identity.clone(),
            tls_domain: self.tls_domain.clone(),
        }
    }

    fn credentials(&self) -> Result<Credentials> {
        match &self.token {
            Some(t) => Credentials::token(t),
            None => Ok(Credentials::none()),
        }
    }

    /// Connects now; fails if the broker cannot be reached within the
    /// connect timeout.
    pub async fn connect(self) -> Result<Client> {
        let endpoints = self.endpoints();
        let ep = endpoints.endpoint(&self.url)?;
        let credentials = self.credentials()?;
        let channel = match tokio::time::timeout(self.config.connect_timeout, ep.connect()).await {
            Ok(Ok(channel)) => channel,
            Ok(Err(e)) => {
                let e = Error::from_transport(e);
                return Err(crate::tls_probe::explain(&self.url, e).await);
            }
            Err(_) => return Err(Error::timeout(format!("connecting to {}", self.url))),
        };
        Client::from_parts(channel, credentials, self.url, self.fallbacks, endpoints)
    }

    /// A client that connects on first use (and never fails here, except
    /// for a malformed URL).
    pub fn connect_lazy(self) -> Result<Client> {
        let endpoints = self.endpoints();
        let channel = endpoints.endpoint(&self.url)?.connect_lazy();
        Client::from_parts(
            channel,
            self.credentials()?,
            self.url,
            self.fallbacks,
            endpoints,
        )
    }
}

/// What a channel to any broker is made with: the builder's timeouts and
/// TLS settings (never the token, which the [`Credentials`] carry).
#[derive(Clone)]
pub(crate) struct Endpoints {
    config: ClientConfig,
    tls_ca: Option<Vec<u8>>,
    tls_identity: Option<(Vec<u8>, Vec<u8>)>,
    tls_domain: Option<String>,
}

impl std::fmt::Debug for Endpoints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoints")
            .field("config", &self.config)
            .field("tls_ca", &self.tls_ca.is_some())
            .field("tls_identity", &self.tls_identity.is_some())
            .field("tls_domain", &self.tls_domain)
            .finish()
    }
}

impl Endpoints {
    fn tls(&self, url: &str) -> Result<Option<tonic::transport::ClientTlsConfig>> {
        use tonic::transport::{Certificate, ClientTlsConfig, Identity};
        let https = url.starts_with("https://");
        let any = self.tls_ca.is_some() || self.tls_identity.is_some() || self.tls_domain.is_some();
        if !https {
            if any {
                return Err(Error::invalid_argument(format!(
                    "TLS options need an https:// broker URL, not {url:?}"
                )));
            }
            return Ok(None);
        }
        let Some(ca) = &self.tls_ca else {
            return Err(Error::invalid_argument(
                "an https:// broker URL needs the CA certificate that signed the broker's (tls_ca_pem, --tls-ca)",
            ));
        };
        let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
        if let Some((cert, key)) = &self.tls_identity {
            tls = tls.identity(Identity::from_pem(cert, key));
        }
        if let Some(d) = &self.tls_domain {
            tls = tls.domain_name(d.clone());
        }
        Ok(Some(tls))
    }

    /// A channel endpoint for `url` with the client's settings.
    pub(crate) fn endpoint(&self, url: &str) -> Result<Endpoint> {
        let mut ep = Endpoint::from_shared(url.to_owned())
            .map_err(|e| Error::invalid_argument(format!("bad broker URL {url:?}: {e}")))?;
        if let Some(tls) = self.tls(url)? {
            ep = ep
                .tls_config(tls)
                .map_err(|e| Error::invalid_argument(format!("TLS setup: {e}")))?;
        }
        Ok(ep
            .connect_timeout(self.config.connect_timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(self.config.keep_alive_interval)
            .keep_alive_timeout(self.config.keep_alive_interval.max(Duration::from_secs(1)))
            .keep_alive_while_idle(true))
    }
}

/// A connection to a Ricochet broker.
///
/// Cheap to clone: clones share one `tonic` [`Channel`] (one HTTP/2
/// connection, re-established on its own after a failure), which every
/// producer and consumer made from the client multiplexes its stream over.
///
/// # Example
///
/// Connect, publish one message and read it back. The URL is a broker's
/// (`http://127.0.0.1:6650` for one started with `cargo run --release -p
/// ricochet-broker -- --data-dir ./data`); here a broker runs in the test.
///
/// ```
/// # #[tokio::main] async fn main() -> ricochet_client::Result<()> {
/// # let broker = ricochet_testkit::InProcessBroker::start().await;
/// # let url = broker.url();
/// use ricochet_client::{Client, InitialPosition};
///
/// let client = Client::connect(url).await?;
/// let producer = client.producer("orders").create().await?;
/// let id = producer.send("order 1").await?;
/// assert_eq!(id.to_string(), "persistent://public/default/orders:0");
///
/// let mut consumer = client
///     .consumer("orders")
///     .subscription("billing")
///     .initial_position(InitialPosition::Earliest)
///     .subscribe()
///     .await?;
/// let msg = consumer.receive().await?;
/// assert_eq!(msg.payload_str(), Some("order 1"));
/// consumer.ack(&msg).await?;
/// consumer.close().await?;
/// producer.close().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Client {
    inner: Arc<ClientInner>,
}

#[derive(Debug)]
struct ClientInner {
    channel: Channel,
    credentials: Credentials,
    url: String,
    endpoints: Endpoints,
    /// Where topics are served (the standalone answer, the owners'
    /// channels); see [`routing`].
    routes: Routes,
}

impl Client {
    /// Connects with default settings.
    pub async fn connect(url: impl Into<String>) -> Result<Client> {
        Self::builder(url).connect().await
    }

    /// Starts configuring a client.
    pub fn builder(url: impl Into<String>) -> ClientBuilder {
        ClientBuilder {
            url: url.into(),
            fallbacks: Vec::new(),
            config: ClientConfig::default(),
            token: None,
            tls_ca: None,
            tls_identity: None,
            tls_domain: None,
        }
    }

    fn from_parts(
        channel: Channel,
        credentials: Credentials,
        url: String,
        fallbacks: Vec<String>,
        endpoints: Endpoints,
    ) -> Result<Self> {
        let client = Self {
            inner: Arc::new(ClientInner {
                channel,
                credentials,
                url,
                endpoints,
                routes: Routes::default(),
            }),
        };
        // Pooled like an owner's channel: the lookups' fallback asks every
        // pooled broker.
        for f in &fallbacks {
            client.transport_to(f)?;
        }
        Ok(client)
    }

    /// The underlying channel, without the client's credentials.
    ///
    /// Not part of the API (no semver promise: its type is tonic's): for
    /// tests and tools that call generated gRPC clients themselves.
    #[doc(hidden)]
    pub fn channel(&self) -> Channel {
        self.inner.channel.clone()
    }

    /// The channel with the client's credentials added to every call, for
    /// generated clients (e.g. `AuthClient::new(client.transport())`).
    ///
    /// Not part of the API (no semver promise: its type is tonic's): for
    /// tests and tools that call generated gRPC clients themselves; the
    /// typed [`Admin`] covers the admin services.
    #[doc(hidden)]
    pub fn transport(&self) -> Transport {
        InterceptedService::new(self.inner.channel.clone(), self.inner.credentials.clone())
    }

    /// The broker URL.
    pub fn url(&self) -> &str {
        &self.inner.url
    }

    /// The settings in force.
    pub fn config(&self) -> &ClientConfig {
        &self.inner.endpoints.config
    }

    /// The broker stream client on `transport` (the service URL's, or a
    /// topic owner's from [`routing`]).
    pub(crate) fn broker_on(transport: Transport) -> BrokerClient<Transport> {
        BrokerClient::new(transport)
            .max_decoding_message_size(MAX_FRAME_BYTES)
            .max_encoding_message_size(MAX_FRAME_BYTES)
    }

    /// The admin client on `transport`.
    pub(crate) fn admin_on(transport: Transport) -> AdminClient<Transport> {
        AdminClient::new(transport)
            .max_decoding_message_size(MAX_FRAME_BYTES)
            .max_encoding_message_size(MAX_FRAME_BYTES)
    }

    pub(crate) fn endpoints(&self) -> &Endpoints {
        &self.inner.endpoints
    }

    pub(crate) fn routes(&self) -> &Routes {
        &self.inner.routes
    }

    /// `channel` with the client's credentials.
    pub(crate) fn with_credentials(&self, channel: Channel) -> Transport {
        InterceptedService::new(channel, self.inner.credentials.clone())
    }
}

/// The next frame of a driver's stream; never resolves while disconnected,
/// so it can sit in a `select!` next to the driver's timers.
pub(crate) async fn next_frame<T>(
    inbound: Option<&mut tonic::Streaming<T>>,
) -> std::result::Result<Option<T>, tonic::Status> {
    match inbound {
        Some(s) => s.message().await,
        None => std::future::pending().await,
    }
}

/// Sleeps until `at`; never resolves for `None` (a timer that is not armed).
pub(crate) async fn sleep_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
