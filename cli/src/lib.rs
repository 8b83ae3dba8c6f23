//! The `ricochet` command line, as a library: [`Cli`] is the grammar (clap
//! derive) and [`run`] executes one parsed command against a broker,
//! writing its result to the given output. The binary (`src/main.rs`) only
//! parses the arguments, runs this on a tokio runtime and turns a
//! [`CliError`] into `error: …` on stderr and an exit code.
//!
//! | command | what it does | Pulsar / RocketMQ analogue |
//! |---|---|---|
//! | `produce`, `consume` | publish; subscribe, print, ack or `--nack` | `pulsar-client produce/consume` |
//! | `topics list/create/delete/stats` | topics and their counters | `pulsar-admin topics` |
//! | `subscriptions list/stats/delete` | progress of a subscription: backlog, unacked, scheduled retries, dead letters, consumers | `mqadmin consumerProgress` |
//! | `message get` | a message and its state, delivery count and history per subscription | `mqadmin queryMsgById` |
//! | `dlq list/peek/replay/purge` | dead letters, filtered by id, reason text and time | — (a human decision, never a loop) |
//! | `policy explain/get/set` | a policy's schedule; a subscription's policy at runtime | — |
//! | `perf produce/consume/redeliver` | throughput and HDR latency percentiles | `pulsar-perf` |
//! | `namespaces set-retention/get-retention`, `topics set-retention/get-retention` | how much of a topic is kept, by age and size | `pulsar-admin namespaces set-retention`, Kafka `retention.ms` |
//! | `namespaces set-replication/get-replication`, `topics create --replicas` | how many brokers hold each topic (a Raft group; cluster mode) | `pulsar-admin namespaces set-persistence`, Kafka `replication.factor` |
//! | `topics offload/offload-status`, `namespaces/topics set-offload/get-offload` | tiered storage: sealed segments in an object store, read back transparently | `pulsar-admin topics offload`, `namespaces set-offload-threshold` |
//! | `token create`, `auth grant/revoke/list/whoami` | tokens and permissions (`--token`, `--token-file` on every command) | `pulsar tokens`, `pulsar-admin namespaces grant-permission` |
//! | `cluster brokers`, `cluster lookup` | the brokers of a cluster and what each owns; a topic's owner | `pulsar-admin brokers list`, `pulsar-admin topics lookup` |
//!
//! In a cluster, a command about one topic sends its calls to the broker
//! that owns the topic (looked up through `--url` by the typed admin API,
//! see [`Ctx::admin`]).

use std::io::Write;
use std::time::Duration;

use ricochet_client::Client;

mod admin;
pub mod args;
pub mod auth;
pub mod breaker;
pub mod cluster;
mod confirm;
mod dlq;
mod dlq_decide;
mod error;
mod events;
pub mod output;
mod partitions;
mod perf;
mod pubsub;
mod retention;
mod tiered;
pub mod timearg;
pub mod view;

pub use args::Cli;
pub use error::{CliError, Result};
pub use output::OutputFormat;

use args::Command;

/// Where a command runs: the broker URL, the output format, and where
/// results go (progress and prompts go to stderr).
pub struct Ctx<'a> {
    /// Broker URL.
    pub url: String,
    /// `--output`.
    pub output: OutputFormat,
    /// `--token` / `--token-file`.
    pub token: Option<String>,
    /// `--tls-ca`, `--tls-cert`, `--tls-key`.
    pub tls: auth::TlsFiles,
    /// The topic the command is about (see [`cluster::topic_of`]): its
    /// calls go to the broker that owns it.
    pub topic: Option<String>,
    /// Results.
    pub out: &'a mut (dyn Write + Send),
}

impl std::fmt::Debug for Ctx<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ctx")
            .field("url", &self.url)
            .field("output", &self.output)
            .finish_non_exhaustive()
    }
}

impl Ctx<'_> {
    /// Whether `--output json` was given.
    pub fn json(&self) -> bool {
        self.output == OutputFormat::Json
    }

    /// Connects to the broker (5 s connect timeout).
    pub async fn client(&self) -> Result<Client> {
        let mut builder = Client::builder(self.url.clone()).connect_timeout(Duration::from_secs(5));
        if let Some(t) = &self.token {
            builder = builder.token(t.clone());
        }
        if let Some(ca) = &self.tls.ca {
            builder = builder.tls_ca_pem(ca.clone());
        }
        if let Some((cert, key)) = &self.tls.identity {
            builder = builder.tls_identity_pem(cert.clone(), key.clone());
        }
        builder
            .connect()
            .await
            .map_err(|e| match CliError::from(e) {
                CliError::Status { code, message } => CliError::Status {
                    code,
                    message: format!("cannot reach the broker at {}: {message}", self.url),
                },
                other => other,
            })
    }
}

impl Ctx<'_> {
    /// The typed admin API on `--url`'s connection: a call about one topic
    /// goes to the broker that owns it ([`ricochet_client::Admin`]).
    pub async fn admin(&self) -> Result<ricochet_client::Admin> {
        Ok(self.client().await?.admin())
    }
}

/// Runs one command, writing its result to `out`.
pub async fn run(cli: Cli, out: &mut (dyn Write + Send)) -> Result<()> {
    let mut ctx = Ctx {
        url: cli.url,
        output: cli.output,
        token: cli.credentials.resolve()?,
        tls: cli.credentials.tls()?,
        topic: cluster::topic_of(&cli.command),
        out,
    };
    let r = match cli.command {
        Command::Produce(a) => pubsub::produce(&mut ctx, a).await,
        Command::Consume(a) => pubsub::consume(&mut ctx, a).await,
        Command::Topics(c) => admin::topics(&mut ctx, c).await,
        Command::Subscriptions(c) => admin::subscriptions(&mut ctx, c).await,
        Command::Message(c) => admin::message(&mut ctx, c).await,
        Command::Policy(c) => admin::policy(&mut ctx, c).await,
        Command::Dlq(c) => dlq::run(&mut ctx, c).await,
        Command::Perf(c) => perf::run(&mut ctx, c).await,
        Command::Token(c) => auth::token(&mut ctx, c),
        Command::Auth(c) => auth::auth(&mut ctx, c).await,
        Command::Namespaces(c) => retention::namespaces(&mut ctx, c).await,
        Command::Cluster(c) => cluster::run(&mut ctx, c).await,
        Command::Events(a) => events::run(&mut ctx, a).await,
    };
    ctx.out.flush()?;
    let advice = ricochet_client::tls_advice(&ctx.url);
    match r {
        // Told so by the client already (opening a producer or consumer).
        Err(CliError::Status { message, .. }) if message == advice => Err(CliError::Usage(advice)),
        Err(e) if broken_exchange(&e) && ricochet_client::speaks_tls(&ctx.url).await => {
            Err(CliError::Usage(advice))
        }
        r => r,
    }
}

/// What a plaintext (`http://`) call to a TLS broker fails with: a protocol
/// error, a cancelled call, a broken or refused connection (the TLS answer
/// to the HTTP/2 preface reads as garbage), never a broker's own answer.
fn broken_exchange(e: &CliError) -> bool {
    use tonic::Code;
    matches!(
        e.code(),
        Some(Code::Internal | Code::Cancelled | Code::Unknown | Code::Unavailable)
    )
}
