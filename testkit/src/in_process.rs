//! Brokers in this process: a [`TestBroker`] on 127.0.0.1:0 whose data
//! lives in a temporary directory owned alongside it, so the directory lasts
//! exactly as long as the broker (and across a restart, when the caller keeps
//! it). For tests that need a broker but no process boundary; crash tests
//! use [`crate::BrokerProcess`] (an in-process "crash" keeps the page cache).

use std::ops::Deref;
use std::path::Path;

use ricochet_broker::{BrokerConfig, TestBroker};
use tempfile::TempDir;

/// A [`TestBroker`] with its temporary data directory. Derefs to the
/// `TestBroker` (`addr`, `core`). Dropping it stops serving, then removes the
/// directory.
#[derive(Debug)]
pub struct InProcessBroker {
    // Dropped before `dir`: the broker lets go of its files first.
    broker: TestBroker,
    dir: TempDir,
}

impl InProcessBroker {
    /// A broker with the test defaults ([`BrokerConfig::for_dir`]) on a new
    /// temporary directory.
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    /// Like [`start`](Self::start), with the config changed by `configure`
    /// first (durability, limits, …; its `listen` is ignored: port 0).
    pub async fn start_with(configure: impl FnOnce(&mut BrokerConfig)) -> Self {
        Self::start_in(tempfile::tempdir().expect("tempdir"), configure).await
    }

    /// Like [`start`](Self::start), with the web console served on a free
    /// loopback port ([`TestBroker::console_addr`], [`console_url`](Self::console_url)).
    pub async fn start_with_console() -> Self {
        Self::start_with(|c| {
            c.console_listen = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))
        })
        .await
    }

    /// `http://127.0.0.1:PORT` of the web console (panics if it has none).
    pub fn console_url(&self) -> String {
        let addr = self
            .broker
            .console_addr
            .expect("a broker started with a console");
        format!("http://{addr}")
    }

    /// A broker on an existing directory, e.g. the one a
    /// [`shutdown`](Self::shutdown) handed back: a restart.
    pub async fn start_in(dir: TempDir, configure: impl FnOnce(&mut BrokerConfig)) -> Self {
        let mut config = BrokerConfig::for_dir(dir.path());
        configure(&mut config);
        let broker = TestBroker::start(config).await.expect("broker starts");
        Self { broker, dir }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        self.broker.url()
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Clean shutdown (panics if it fails): returns once storage is closed,
    /// with the directory, for [`start_in`](Self::start_in).
    pub async fn shutdown(self) -> TempDir {
        self.broker.shutdown().await.expect("clean shutdown");
        self.dir
    }

    /// Stops serving without flushing or waiting (see
    /// [`TestBroker::abort`]); returns the directory.
    pub fn abort(self) -> TempDir {
        self.broker.abort();
        self.dir
    }
}

impl Deref for InProcessBroker {
    type Target = TestBroker;

    fn deref(&self) -> &TestBroker {
        &self.broker
    }
}
