//! Starting and stopping a broker: open storage, load state, serve gRPC
//! (data plane, admin, grants, health; every call authenticated by
//! [`AuthLayer`] when auth is on) until a shutdown signal, then flush.

use crate::auth::{AuthLayer, AuthService};
use crate::clock::{SharedClock, SystemClock};
use crate::config::{BrokerConfig, LogEngine, VerifyOnStart};
use crate::core::BrokerCore;
use crate::error::{BrokerError, Result};
use crate::gate::{Gate, Guarded};
use crate::node::Node;
use crate::service::{AdminService, BrokerService, Router};
use crate::storage::SledStorage;
use crate::storage::{MetaStore, Storage, StorageError};
use ricochet_policy::PolicyRegistry;
use ricochet_proto::admin_server::AdminServer;
use ricochet_proto::auth_server::AuthServer;
use ricochet_proto::broker_server::BrokerServer;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;

use ricochet_proto::MAX_GRPC_MESSAGE_BYTES as MAX_FRAME_BYTES;

/// Builds a [`Broker`].
#[derive(Debug)]
pub struct BrokerBuilder {
    config: BrokerConfig,
    policies: PolicyRegistry,
    clock: SharedClock,
}

impl BrokerBuilder {
    /// Registers policies an embedding application provides by name.
    pub fn policies(mut self, policies: PolicyRegistry) -> Self {
        self.policies = policies;
        self
    }

    /// The wall clock (default: the system's); tests pass a
    /// [`TokioClock`](crate::clock::TokioClock) to run on virtual time.
    pub fn clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// Opens storage and loads every topic and subscription.
    /// Damage found on the way (a checksum mismatch, a file sled misses)
    /// refuses the store like a manifest mismatch:
    /// [`BrokerError::DataLoss`](crate::BrokerError::DataLoss).
    pub async fn open(self) -> Result<Broker> {
        self.config.validate()?;
        std::fs::create_dir_all(&self.config.data_dir)?;
        let opened = async {
            let mode = self.config.verify_on_start;
            // sled's open and what reads sled alone before serving; with the
            // segment-file log, its open runs beside this (other files).
            let open_sled =
                || -> Result<Arc<SledStorage>> {
                    let started = std::time::Instant::now();
                    let sled = Arc::new(SledStorage::open(
                        &self.config.data_dir,
                        self.config.segment_entries,
                        self.config.cache_capacity,
                    )?);
                    tracing::info!(
                        took_ms = started.elapsed().as_millis() as u64,
                        "start: storage opened (sled's recovery)"
                    );
                    // The one scan of every subscription's failure heads at start
                    // keeps only the holds ending within the retry window with
                    // their counts; later ones as entry ids (a bitmap).
                    sled.gather_heads_by(self.clock.now_ms().saturating_add(
                        crate::subscription::holds_ahead(self.config.retry_window),
                    ));
                    if mode == VerifyOnStart::Before {
                        verify(&sled, self.config.accept_data_loss)?;
                    }
                    // A store written before held messages took one key each is
                    // converted (once; logged when anything moved).
                    sled.upgrade_held()?;
                    // What the manifest check (counts, after a clean stop) and
                    // the subscriptions' start (failure heads) read from the
                    // schedule, read now, beside the segment-file log's check
                    // rather than after it; damage met here is met and refused
                    // again where it always was.
                    let counted = mode != VerifyOnStart::Off
                        && matches!(sled.load_manifest(), Ok(Some(m)) if m.clean);
                    sled.read_ahead_of_start(counted);
                    Ok(sled)
                };
            let mut tiered = None;
            let (sled, storage): (Arc<SledStorage>, Arc<dyn Storage>) = match self.config.log_engine
            {
                LogEngine::Segments => {
                    let started = std::time::Instant::now();
                    let mut opened_sled = None;
                    let log = crate::storage::LogStorage::open_beside(
                        || {
                            let sled = open_sled()?;
                            opened_sled = Some(sled.clone());
                            Ok::<_, BrokerError>(sled)
                        },
                        &self.config.data_dir,
                        self.config.log_settings(),
                        self.config.tiered.as_ref(),
                    )
                    .await?;
                    tiered = log.tiered().cloned();
                    tracing::info!(
                        took_ms = started.elapsed().as_millis() as u64,
                        topics = log.log().topics().len(),
                        "start: sled and the segment-file log opened (every segment checked)"
                    );
                    let sled = opened_sled.expect("the log opens only once sled has");
                    (sled, Arc::new(log))
                }
                LogEngine::Sled => {
                    let sled = open_sled()?;
                    (sled.clone(), sled)
                }
            };
            let node = Node::open(self.config, storage, self.policies, self.clock).await?;
            if mode == VerifyOnStart::Background {
                verify_in_background(sled, &node.core);
            }
            if let Some(t) = &tiered {
                t.spawn(node.core.shutdown.clone());
            }
            Ok((node, tiered))
        };
        match opened.await {
            Ok((node, tiered)) => Ok(Broker {
                core: node.core.clone(),
                node,
                tiered,
            }),
            Err(BrokerError::Storage(StorageError::Corrupt(what))) => Err(BrokerError::DataLoss(
                format!("{what} (`ricochet-broker check` lists everything)"),
            )),
            Err(e) => Err(e),
        }
    }
}

/// How long [`Broker::shutdown`] waits for the store to be released.
pub const SHUTDOWN_RELEASE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Reads every stored value once (sled checks its pages only when they are
/// read, so damage inside the log would otherwise surface as a failed read
/// after start): refuses on any problem unless `accept_loss`.
fn verify(sled: &SledStorage, accept_loss: bool) -> Result<()> {
    let started = std::time::Instant::now();
    let report = sled.verify();
    tracing::info!(
        values = report.values,
        entries = report.entries,
        problems = report.problem_count,
        took_ms = started.elapsed().as_millis() as u64,
        "store verified"
    );
    if report.problem_count == 0 {
        return Ok(());
    }
    if accept_loss {
        for p in &report.problems {
            tracing::warn!(problem = %p, "accepting damaged data (--accept-data-loss): reads of it fail");
        }
        return Ok(());
    }
    let first = report.problems.first().cloned().unwrap_or_default();
    Err(BrokerError::DataLoss(format!(
        "{} damaged value(s), the first: {first} (`ricochet-broker check` lists them; \
         --accept-data-loss starts anyway, and reads of them fail)",
        report.problem_count
    )))
}

/// `verify_on_start = "background"`: the verify pass on a blocking thread
/// while the broker serves. Damage it finds is logged and makes storage
/// unhealthy (`ricochet_storage_healthy 0`, gRPC health NOT_SERVING), as a
/// damaged read does; it does not stop the broker (reads of a damaged value
/// fail on their own, with DATA_LOSS). The pass ends early when the broker
/// shuts down or is dropped, and holds the broker's storage handle until
/// then, so a shutdown that waits for storage to close waits for it.
fn verify_in_background(sled: Arc<SledStorage>, core: &Arc<BrokerCore>) {
    let stop = core.shutdown.clone();
    let weak = Arc::downgrade(core);
    // Held until the pass has let go of the store: whoever waits for the
    // broker's storage to close (a shutdown) waits for the pass too.
    let storage = core.storage.clone();
    tokio::task::spawn_blocking(move || {
        let started = std::time::Instant::now();
        // The pass's threads run at idle priority (`SCHED_IDLE`, else nice
        // 19): serving goes first, and on a busy machine the pass takes
        // longer.
        let report = sled.verify_live_on(
            &|| stop.is_cancelled() || weak.strong_count() == 0,
            &crate::idle::lower_this_thread,
        );
        drop(sled);
        drop(storage);
        let took_ms = started.elapsed().as_millis() as u64;
        if !report.complete {
            tracing::info!(
                values = report.values,
                took_ms,
                "store verification stopped by shutdown"
            );
        }
        if report.problem_count == 0 {
            if report.complete {
                tracing::info!(
                    values = report.values,
                    entries = report.entries,
                    took_ms,
                    "store verified (in the background, while serving)"
                );
            }
            return;
        }
        for p in &report.problems {
            tracing::error!(problem = %p, "the store holds damaged data: reads of it fail");
        }
        tracing::error!(
            problems = report.problem_count,
            values = report.values,
            took_ms,
            "store verification found damage (`ricochet-broker check` on the stopped store lists it); storage is marked unhealthy"
        );
        if let Some(core) = weak.upgrade() {
            core.report_damage();
        }
    });
}

/// A broker with its state loaded, ready to serve.
#[derive(Debug, Clone)]
pub struct Broker {
    node: Arc<Node>,
    /// `node.core`.
    core: Arc<BrokerCore>,
    /// The object-store tier, when `[tiered]` is configured.
    tiered: Option<Arc<crate::storage::tiered::Tiered>>,
}

impl Broker {
    /// Starts building a broker with `config`.
    pub fn builder(config: BrokerConfig) -> BrokerBuilder {
        BrokerBuilder {
            config,
            policies: PolicyRegistry::default(),
            clock: Arc::new(SystemClock),
        }
    }

    /// Shared state (for embedding and tests).
    pub fn core(&self) -> &Arc<BrokerCore> {
        &self.core
    }

    /// The core with the features composed over it.
    pub fn node(&self) -> &Arc<Node> {
        &self.node
    }

    /// Serves on `listener` until `shutdown` resolves, then stops accepting,
    /// flushes storage and returns.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<()> {
        // An RPC without a row in the table (or a row for none) is a bug
        // caught here, before any call could meet it.
        crate::gate::check_table()?;
        let url = match &self.core.config.advertise {
            Some(a) => a.clone(),
            None => {
                let scheme = if self.core.config.tls.cert_file.is_some() {
                    "https"
                } else {
                    "http"
                };
                format!("{scheme}://{}", listener.local_addr()?)
            }
        };
        self.node.join_cluster(url.clone()).await?;
        let cluster = self.node.cluster().cloned();
        if let Some(groups) = self.node.groups() {
            // Replicated topics' age rolls are their leaders' (the group's).
            crate::replication::seal::spawn_seal_pass(
                groups.clone(),
                crate::replication::seal::every(self.core.config.segment_max_age),
                self.core.shutdown.clone(),
            );
            // Whether each group's members all apply a coalesced entry,
            // re-read on its own clock.
            crate::replication::coalescing::spawn_level_pass(
                groups.clone(),
                self.core.shutdown.clone(),
            );
        }
        if let (Some(groups), Some(t)) = (self.node.groups(), &self.tiered) {
            // The replicated topics this broker leads, by their policies.
            crate::replication::offload::spawn_leader_pass(
                groups.clone(),
                t.clone(),
                t.interval(),
                self.core.shutdown.clone(),
            );
        }
        // Namespaces' offload policies: in a cluster, the cluster's.
        let namespaces = self.tiered.as_ref().map(|t| {
            crate::offload_policies::NamespaceOffload::start(
                t.clone(),
                self.core.flusher.clone(),
                cluster.clone(),
                self.core.shutdown.clone(),
            )
        });
        let (health, health_service) = tonic_health::server::health_reporter();
        health.set_serving::<BrokerServer<BrokerService>>().await;
        let broker = BrokerServer::new(BrokerService::new(self.node.clone()))
            .max_decoding_message_size(MAX_FRAME_BYTES)
            .max_encoding_message_size(MAX_FRAME_BYTES);
        crate::replay_jobs::resume_all(&self.core);
        // Every service but the data plane's runs behind the RPC table.
        let gate = Gate::new(
            self.node.auth.clone(),
            Router::new(cluster.clone(), self.node.groups().cloned()),
        );
        let admin = AdminServer::new(Guarded::new(
            AdminService::new(self.node.clone()),
            gate.clone(),
        ))
        .max_decoding_message_size(MAX_FRAME_BYTES)
        .max_encoding_message_size(MAX_FRAME_BYTES);
        let partitions = ricochet_proto::partitions_server::PartitionsServer::new(Guarded::new(
            crate::service::PartitionsService::new(self.node.clone()),
            gate.clone(),
        ));
        let retention = ricochet_proto::retention_server::RetentionServer::new(Guarded::new(
            crate::service::RetentionService::new(self.node.clone()),
            gate.clone(),
        ));
        let tiered = ricochet_proto::tiered_server::TieredServer::new(Guarded::new(
            crate::service::TieredService::new(self.node.clone(), self.tiered.clone(), namespaces),
            gate.clone(),
        ));
        let cluster_service = ricochet_proto::cluster_server::ClusterServer::new(Guarded::new(
            crate::service::ClusterService::new(self.node.clone(), url),
            gate.clone(),
        ));
        // Health turns bad for good when storage fails; the storage gauges
        // follow every half second.
        let grants = AuthServer::new(Guarded::new(
            AuthService::new(self.node.auth.clone(), self.core.flusher.clone()),
            gate,
        ))
        .max_decoding_message_size(MAX_FRAME_BYTES)
        .max_encoding_message_size(MAX_FRAME_BYTES);
        // Broker-to-broker Raft calls, in cluster mode; with auth on, the
        // auth layer admits superusers only (a broker's peer token), and
        // each request only from the role its node's broker registered.
        let replication = cluster.is_some().then(|| {
            let service = crate::replication::ReplicationService::new(self.node.registry.clone());
            match self.node.groups() {
                Some(groups) if self.node.auth.enabled() => {
                    let guard: Arc<dyn ricochet_replication::PeerGuard> = groups.clone();
                    service.with_guard(guard)
                }
                _ => service,
            }
            .into_server()
        });
        let core = self.core.clone();
        let health_task = tokio::spawn(async move {
            let mut reported_bad = false;
            loop {
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                let healthy = core.healthy();
                let bytes = core.storage.size_on_disk().unwrap_or(0);
                crate::metrics::record_storage(bytes, healthy);
                core.flusher.disk().record();
                if !healthy && !reported_bad {
                    reported_bad = true;
                    health
                        .set_not_serving::<BrokerServer<BrokerService>>()
                        .await;
                }
            }
        });
        tracing::info!(
            addr = %listener.local_addr()?,
            security = %self.core.config.security_summary(),
            "ricochet broker serving"
        );
        let token = self.core.shutdown.clone();
        let shutdown = async move {
            shutdown.await;
            tracing::info!("shutting down: ending open streams");
            token.cancel();
        };
        // `Server::tcp_nodelay` only reaches listeners tonic binds itself; a
        // listener handed in must set it on each accepted socket, or small
        // frames (a lone redelivery) wait up to 40 ms for the peer's delayed ACK.
        let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
        let config = &self.core.config;
        let registry = crate::connections::Registry::new(crate::connections::ConnLimits {
            max_connections: config.max_connections,
            max_streams: config.max_streams_per_connection,
            idle_timeout: config.idle_timeout,
        });
        let incoming = crate::connections::admit_all(incoming, registry);
        let nonzero = |d: std::time::Duration| (!d.is_zero()).then_some(d);
        // HTTP/2 lets a client open twice the calls the broker serves, so the
        // extra ones reach it and are told RESOURCE_EXHAUSTED rather than
        // wait for a slot.
        let h2_streams = match config.max_streams_per_connection {
            0 => None,
            n => Some(u32::try_from(n.saturating_mul(2)).unwrap_or(u32::MAX)),
        };
        let mut server = tonic::transport::Server::builder();
        if let Some(tls) = config.tls.server_config()? {
            server = server
                .tls_config(tls)
                .map_err(|e| BrokerError::Config(format!("TLS: {e}")))?;
        }
        let result = server
            .http2_keepalive_interval(nonzero(config.keepalive_interval))
            .http2_keepalive_timeout(nonzero(config.keepalive_timeout))
            .max_concurrent_streams(h2_streams)
            .layer(crate::connections::StreamLimitLayer)
            .layer(AuthLayer::new(self.node.auth.clone()))
            .add_service(health_service)
            .add_service(broker)
            .add_service(admin)
            .add_service(partitions)
            .add_service(retention)
            .add_service(tiered)
            .add_service(cluster_service)
            .add_service(grants)
            .add_optional_service(replication)
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await;
        health_task.abort();
        if let Some(c) = &cluster {
            // Ownership goes at once (placements stay): clients are told
            // this broker is down rather than wait for the lease to expire.
            c.leave().await;
        }
        self.core.stop_clean().await?;
        tracing::info!("ricochet broker stopped");
        result.map_err(|e| crate::error::BrokerError::Io(std::io::Error::other(e)))
    }

    /// Binds the configured address (and the metrics address, if set) and
    /// serves until `shutdown`.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<()> {
        if let Some(addr) = self.core.config.metrics_listen {
            let token = self.node.auth.metrics_token().map(<[u8]>::to_vec);
            crate::metrics::install_prometheus_secured(addr, token)?;
        }
        self.start_console().await?;
        let listener = TcpListener::bind(self.core.config.listen).await?;
        self.serve(listener, shutdown).await
    }
}

impl Broker {
    /// Binds and starts the web console if `console_listen` is set (it
    /// stops when the broker shuts down); where it listens, if it does.
    pub async fn start_console(&self) -> Result<Option<SocketAddr>> {
        let Some(addr) = self.core.config.console_listen else {
            return Ok(None);
        };
        Ok(Some(crate::console::start(self.node.clone(), addr).await?))
    }
}

/// A broker serving in the background on `127.0.0.1:0`, for tests and examples.
#[derive(Debug)]
pub struct TestBroker {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its shared state.
    pub core: Arc<BrokerCore>,
    /// The core with the features composed over it.
    pub node: Arc<Node>,
    /// Where its web console listens, when the config set `console_listen`
    /// (port 0 picks a free one).
    pub console_addr: Option<SocketAddr>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<Result<()>>>,
}

impl TestBroker {
    /// Starts a broker with `config` (its `listen` is ignored: port 0 is used).
    pub async fn start(config: BrokerConfig) -> Result<Self> {
        Self::start_with(Broker::builder(config)).await
    }

    /// Starts a broker from a builder.
    pub async fn start_with(builder: BrokerBuilder) -> Result<Self> {
        let broker = builder.open().await?;
        let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
        let addr = listener.local_addr()?;
        let core = broker.core().clone();
        let node = broker.node().clone();
        let console_addr = broker.start_console().await?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(broker.serve(listener, async {
            let _ = stopped.await;
        }));
        Ok(Self {
            addr,
            core,
            node,
            console_addr,
            stop: Some(stop),
            task: Some(task),
        })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Clean shutdown: stop serving, flush, and wait until storage is closed
    /// (so the same directory can be opened again in this process), at most
    /// [`SHUTDOWN_RELEASE_WAIT`].
    pub async fn shutdown(mut self) -> Result<()> {
        let storage = Arc::downgrade(&self.core.storage);
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let served = match self.task.take() {
            Some(t) => t
                .await
                .map_err(|e| crate::error::BrokerError::Io(std::io::Error::other(e)))?,
            None => Ok(()),
        };
        drop(self);
        // The background verify pass lets go of the store at its next check
        // of the shutdown; it runs at a lower priority, so on a busy
        // machine that can take seconds (a restart then found sled's lock
        // still held after the 5 s this waited before).
        let waited = std::time::Instant::now();
        let mut warned = false;
        while storage.upgrade().is_some() {
            let long = waited.elapsed();
            if long >= SHUTDOWN_RELEASE_WAIT {
                tracing::warn!(
                    waited_ms = long.as_millis() as u64,
                    "storage still referenced after shutdown: its directory may still be locked"
                );
                return served;
            }
            if !warned && long >= std::time::Duration::from_secs(5) {
                warned = true;
                tracing::warn!(
                    "storage still referenced 5 s after shutdown; waiting for it to close"
                );
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        served
    }

    /// Stops serving without flushing anything (a crash as far as
    /// un-flushed writes are concerned; the process's page cache survives,
    /// so real crash tests use a child process and SIGKILL).
    pub fn abort(mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::prelude::*;
    use prost::Message as _;
    use std::time::Duration;

    /// A store (with its manifest) whose only damage is one flipped bit in
    /// a stored message of its one topic: sled opens it and the manifest
    /// matches it.
    async fn store_with_a_damaged_value(dir: &std::path::Path) {
        store(dir, true).await
    }

    /// One topic with three messages (one a frame), the middle one damaged or not.
    async fn store(dir: &std::path::Path, damaged: bool) {
        const TOPIC: &str = "persistent://public/default/t";
        let sled = SledStorage::open(dir, 16_384, 8 << 20).unwrap();
        sled.set_store_id("test-store").unwrap();
        sled.put_topic(&crate::storage::TopicRecord {
            name: TOPIC.into(),
            created_ms: 0,
            kind: crate::storage::TopicKind::Normal,
            replicas: 1,
            trimmed_below: 0,
        })
        .unwrap();
        for id in 0..3 {
            let entry = ricochet_proto::Message {
                payload: format!("message {id}").into_bytes(),
                ..Default::default()
            }
            .encode_to_vec();
            sled.append(TOPIC, id, &[entry], None).unwrap();
        }
        // The middle one: the topic's first and last entries are read at start.
        if damaged {
            sled.damage_entry(TOPIC, 1, 7);
        }
        sled.flush().await.unwrap();
        sled.save_manifest(&crate::storage::manifest::Manifest {
            store_id: "test-store".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    }

    /// The store above keeps its entries in sled trees, the layout these
    /// tests damage: the broker keeps that layout (with the segment files
    /// it would convert it first, and a damaged value refuses the upgrade).
    fn config(dir: &std::path::Path, mode: VerifyOnStart) -> BrokerConfig {
        BrokerConfig {
            verify_on_start: mode,
            log_engine: LogEngine::Sled,
            ..BrokerConfig::for_dir(dir)
        }
    }

    #[tokio::test]
    async fn before_serving_a_damaged_value_refuses_the_store() {
        let dir = tempfile::tempdir().unwrap();
        store_with_a_damaged_value(dir.path()).await;
        let e = Broker::builder(config(dir.path(), VerifyOnStart::Before))
            .open()
            .await
            .unwrap_err();
        assert!(matches!(e, BrokerError::DataLoss(_)), "{e}");
        assert!(e.to_string().contains("damaged value"), "{e}");
    }

    #[tokio::test]
    async fn in_the_background_a_damaged_value_turns_storage_unhealthy_once_found() {
        let dir = tempfile::tempdir().unwrap();
        store_with_a_damaged_value(dir.path()).await;
        let broker = Broker::builder(config(dir.path(), VerifyOnStart::Background))
            .open()
            .await
            .expect("the store opens: the pass runs after");
        let core = broker.core().clone();
        let t = std::time::Instant::now();
        while core.healthy() {
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "the background pass never reported the damaged value"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn off_or_in_the_background_an_intact_store_stays_healthy() {
        for mode in [VerifyOnStart::Background, VerifyOnStart::Off] {
            let dir = tempfile::tempdir().unwrap();
            store(dir.path(), false).await;
            let broker = Broker::builder(config(dir.path(), mode))
                .open()
                .await
                .unwrap();
            // Long enough for the pass over this tiny store to finish.
            tokio::time::sleep(Duration::from_millis(500)).await;
            assert!(broker.core().healthy(), "{mode:?}");
        }
    }

    #[test]
    fn verify_on_start_reads_the_modes_and_the_former_flag() {
        let read = |v: &str| {
            toml::from_str::<BrokerConfig>(&format!("verify_on_start = {v}"))
                .map(|c| c.verify_on_start)
        };
        assert_eq!(read("\"before\"").unwrap(), VerifyOnStart::Before);
        assert_eq!(read("\"background\"").unwrap(), VerifyOnStart::Background);
        assert_eq!(read("\"off\"").unwrap(), VerifyOnStart::Off);
        assert_eq!(read("true").unwrap(), VerifyOnStart::Before);
        assert_eq!(read("false").unwrap(), VerifyOnStart::Off);
        assert!(read("\"later\"").is_err());
        assert_eq!(
            BrokerConfig::default().verify_on_start,
            VerifyOnStart::Background
        );
    }
}
