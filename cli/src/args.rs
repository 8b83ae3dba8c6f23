//! The command-line grammar: every command, flag and default of `ricochet`,
//! as clap derive types. Values are parsed and checked here (durations,
//! `k=v` pairs, policy specs, times), so a malformed argument is a usage
//! error (exit code 2) reported by clap before anything is sent.

use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgGroup, Args, Parser, Subcommand};
use ricochet_policy::{FailureReason, PolicySpec};
use ricochet_proto::{InitialPosition, SubscriptionType};

use crate::output::OutputFormat;
use crate::timearg::TimeArg;

/// Operate a Ricochet broker: produce and consume, inspect topics and
/// subscriptions, handle dead letters, explain and set dead-letter
/// policies, and measure throughput.
#[derive(Debug, Parser)]
#[command(name = "ricochet", version, propagate_version = true)]
pub struct Cli {
    /// Broker URL.
    #[arg(
        long,
        global = true,
        env = "RICOCHET_URL",
        default_value = "http://127.0.0.1:6650"
    )]
    pub url: String,
    /// Output format: `table` for people, `json` for scripts (one JSON
    /// document, or one JSON object per line for `consume`).
    #[arg(long, short = 'o', global = true, value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
    /// Credentials (`--token`, `--token-file`).
    #[command(flatten)]
    pub credentials: crate::auth::CredentialArgs,
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// Top-level commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Publish messages to a topic.
    Produce(ProduceArgs),
    /// Subscribe and print messages; ack them, or fail them with `--nack`.
    Consume(ConsumeArgs),
    /// List, create, delete topics and show their statistics.
    #[command(subcommand, visible_alias = "topic")]
    Topics(TopicsCommand),
    /// List subscriptions, show a subscription's progress, delete one.
    #[command(subcommand, visible_alias = "subscription")]
    Subscriptions(SubscriptionsCommand),
    /// Look a message up by id, with its state in every subscription.
    #[command(subcommand)]
    Message(MessageCommand),
    /// Inspect, replay and purge a subscription's dead letters.
    #[command(subcommand)]
    Dlq(DlqCommand),
    /// Explain a policy's schedule; read or change a subscription's policy.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Load generators: publish, consume and nack→redelivery throughput and latency.
    #[command(subcommand)]
    Perf(PerfCommand),
    /// Sign a JWT for a role (development and tests).
    #[command(subcommand)]
    Token(crate::auth::TokenCommand),
    /// Grant, revoke and list permissions; show who you are.
    #[command(subcommand)]
    Auth(crate::auth::AuthCommand),
    /// Namespace-wide settings: retention, offload, replication factor.
    #[command(subcommand, visible_alias = "namespace")]
    Namespaces(NamespacesCommand),
    /// A cluster of brokers: the brokers and their load, who owns a topic.
    #[command(subcommand)]
    Cluster(crate::cluster::ClusterCommand),
    /// A namespace's failure events: messages dead-lettered, dead letters
    /// replayed or purged.
    Events(EventsArgs),
}

/// `namespaces …`.
#[derive(Debug, Subcommand)]
pub enum NamespacesCommand {
    /// Set how much of every topic of a namespace is kept (topics with a
    /// policy of their own follow theirs).
    SetRetention {
        /// `tenant/namespace`.
        namespace: String,
        /// The limits.
        #[command(flatten)]
        limits: RetentionArgs,
    },
    /// The retention policy set on a namespace.
    GetRetention {
        /// `tenant/namespace`.
        namespace: String,
    },
    /// Set when the sealed segments of a namespace's topics are offloaded
    /// to the object store (tiered storage).
    SetOffload {
        /// `tenant/namespace`.
        namespace: String,
        /// The thresholds.
        #[command(flatten)]
        policy: crate::tiered::OffloadArgs,
    },
    /// The offload policy set on a namespace.
    GetOffload {
        /// `tenant/namespace`.
        namespace: String,
    },
    /// Set the replication factor of every topic created in a namespace
    /// without one (auto-created ones too); cluster mode above 1.
    SetReplication {
        /// `tenant/namespace`.
        namespace: String,
        /// Replicas, 1 to 7: each topic is a Raft group of that many brokers.
        replicas: u32,
    },
    /// A namespace's default replication factor, and the one in force.
    GetReplication {
        /// `tenant/namespace`.
        namespace: String,
    },
}

/// The limits of `set-retention`; at least one, or `--clear`.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("limits").required(true).multiple(true).args(["max_age", "max_size", "backlog_quota", "clear"])))]
pub struct RetentionArgs {
    /// Drop messages published longer ago than this (`1h`, `7days`).
    #[arg(long, value_name = "DURATION", value_parser = parse_positive_duration)]
    pub max_age: Option<Duration>,
    /// Keep at most this many message bytes, dropping the oldest (`1GiB`, `512MiB`, `10MB`).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub max_size: Option<u64>,
    /// Backlog quota: the most message bytes a topic may hold (`512MiB`).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub backlog_quota: Option<u64>,
    /// At the backlog quota: refuse publishes, or drop the oldest messages.
    #[arg(long, value_enum, requires = "backlog_quota")]
    pub quota_action: Option<QuotaActionArg>,
    /// Remove the policy: keep every message until consumed (a topic then
    /// follows its namespace's policy).
    #[arg(long, conflicts_with_all = ["max_age", "max_size", "backlog_quota"])]
    pub clear: bool,
}

/// `--quota-action`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum QuotaActionArg {
    /// Publishes are refused (RESOURCE_EXHAUSTED) until the backlog shrinks.
    Refuse,
    /// The oldest segments are dropped.
    DropOldest,
}

/// `produce TOPIC`.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("payload").required(true).multiple(true).args(["messages", "files"])))]
pub struct ProduceArgs {
    /// Topic (`orders` means `persistent://public/default/orders`).
    pub topic: String,
    /// A message payload (repeatable).
    #[arg(short = 'm', long = "message", value_name = "TEXT")]
    pub messages: Vec<String>,
    /// A file whose whole content is one message (repeatable).
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// Send each message this many times.
    #[arg(
        short = 'n',
        long = "num-produce",
        value_name = "COUNT",
        default_value_t = 1
    )]
    pub count: u64,
    /// Routing key (Key_Shared) of every message.
    #[arg(short = 'k', long)]
    pub key: Option<String>,
    /// A property `name=value` (repeatable).
    #[arg(short = 'p', long = "property", value_name = "K=V", value_parser = parse_key_value)]
    pub properties: Vec<(String, String)>,
    /// Deliver no earlier than this long from now (`30s`, `5m`).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub deliver_after: Option<Duration>,
}

/// `events [NAMESPACE]`.
#[derive(Debug, Args)]
pub struct EventsArgs {
    /// `tenant/namespace`.
    #[arg(default_value = "public/default")]
    pub namespace: String,
    /// Only events of this topic (full, or bare for `public/default`).
    #[arg(long)]
    pub topic: Option<String>,
    /// Only events of this subscription.
    #[arg(long)]
    pub subscription: Option<String>,
    /// Only events of this kind.
    #[arg(long, value_parser = [
        "dead_lettered",
        "replayed",
        "purged",
        "breaker_opened",
        "breaker_probing",
        "breaker_closed",
        "key_blocked",
        "key_released",
        "key_poisoned",
    ])]
    pub kind: Option<String>,
    /// Keep waiting for new events (until Ctrl-C).
    #[arg(short = 'f', long)]
    pub follow: bool,
    /// Without `--follow`, stop once nothing arrived for this long.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub idle: std::time::Duration,
    /// The CLI's subscription on the events topic: a later run with the
    /// same name starts where this one stopped.
    #[arg(long, default_value = "ricochet-events")]
    pub reader: String,
}

/// `consume TOPIC -s SUB`.
#[derive(Debug, Args)]
pub struct ConsumeArgs {
    /// Topic.
    pub topic: String,
    /// Subscription name.
    #[arg(short = 's', long)]
    pub subscription: String,
    /// Subscription type: exclusive, shared, failover or key_shared.
    #[arg(short = 't', long = "type", default_value = "exclusive")]
    pub sub_type: SubscriptionType,
    /// Stop after this many messages (redeliveries count); 0 means no limit.
    #[arg(
        short = 'n',
        long = "num-messages",
        value_name = "COUNT",
        default_value_t = 1
    )]
    pub count: u64,
    /// Fail every message (negative ack) instead of acking it.
    #[arg(long)]
    pub nack: bool,
    /// The failure detail recorded with each `--nack`.
    #[arg(long, value_name = "TEXT", default_value = "ricochet consume --nack")]
    pub nack_reason: String,
    /// The subscription's dead-letter policy, sent when subscribing (an
    /// operator's `policy set` takes precedence), e.g. `backoff:fixed=1s,max=3`
    /// or `delay-levels:levels=1s 2s 4s,start=1,max=3`.
    #[arg(long, value_name = "SPEC", value_parser = parse_policy)]
    pub policy: Option<PolicySpec>,
    /// Nack delay when no policy is in force (the client's default is 60s).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub nack_delay: Option<Duration>,
    /// Stop when no message has arrived for this long (default: wait forever).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub timeout: Option<Duration>,
    /// Where a new subscription starts: earliest or latest.
    #[arg(long, default_value = "earliest")]
    pub position: InitialPosition,
    /// Consumer name (default: generated).
    #[arg(long)]
    pub name: Option<String>,
    /// Read a dead-letter tier topic (`…-DLQ`); the broker refuses it
    /// otherwise. `dlq list|peek` shows dead letters without consuming them.
    #[arg(long)]
    pub dead_letter_reader: bool,
}

/// `topics …`.
#[derive(Debug, Subcommand)]
pub enum TopicsCommand {
    /// List topics (retry and dead-letter tiers included); in a cluster,
    /// every live broker's.
    List {
        /// Only topics of this `tenant/namespace`.
        #[arg(long)]
        namespace: Option<String>,
        /// Also list system topics (`__failure_events`).
        #[arg(long)]
        include_system_topics: bool,
    },
    /// Create a topic.
    Create {
        /// Topic.
        topic: String,
        /// Create a partitioned topic of this many partitions
        /// (`<topic>-partition-0` ..); producers route to them by key.
        #[arg(long)]
        partitions: Option<u32>,
        /// Replication factor: how many brokers of a cluster hold the topic
        /// (each partition, with --partitions; default: the namespace's,
        /// else 1). Above 1 needs cluster mode and that many live brokers.
        #[arg(long)]
        replicas: Option<u32>,
    },
    /// Raise a partitioned topic's partition count (it is never lowered).
    UpdatePartitions {
        /// Partitioned topic.
        topic: String,
        /// The new count, at least the current one.
        partitions: u32,
    },
    /// Delete a topic and its messages.
    Delete {
        /// Topic.
        topic: String,
        /// Delete even if it has subscriptions or connected clients.
        #[arg(long)]
        force: bool,
        /// Do not ask for confirmation.
        #[arg(short = 'y', long)]
        yes: bool,
    },
    /// A topic's counters and its subscriptions' progress.
    Stats {
        /// Topic.
        topic: String,
    },
    /// Set how much of a topic is kept, replacing its namespace's policy.
    SetRetention {
        /// Topic.
        topic: String,
        /// The limits.
        #[command(flatten)]
        limits: RetentionArgs,
    },
    /// The retention policy set on a topic and the one in force.
    GetRetention {
        /// Topic.
        topic: String,
    },
    /// Offload a topic's sealed segments to the object store now (tiered storage).
    Offload {
        /// Topic.
        topic: String,
    },
    /// Where a topic's segments are: local, offloaded, or both.
    OffloadStatus {
        /// Topic.
        topic: String,
    },
    /// Set when a topic's sealed segments are offloaded, replacing its namespace's policy.
    SetOffload {
        /// Topic.
        topic: String,
        /// The thresholds.
        #[command(flatten)]
        policy: crate::tiered::OffloadArgs,
    },
    /// The offload policy set on a topic and the one in force.
    GetOffload {
        /// Topic.
        topic: String,
    },
}

/// `subscriptions …`.
#[derive(Debug, Subcommand)]
pub enum SubscriptionsCommand {
    /// A topic's subscriptions.
    List {
        /// Topic.
        topic: String,
    },
    /// One subscription's progress: backlog, unacked, scheduled retries,
    /// dead letters, consumers.
    Stats {
        /// Topic.
        topic: String,
        /// Subscription.
        subscription: String,
    },
    /// Delete a subscription with its retry and dead-letter tiers.
    Delete {
        /// Topic.
        topic: String,
        /// Subscription.
        subscription: String,
        /// Delete even if consumers are connected (they are disconnected) or
        /// it holds dead letters or scheduled retries (they are dropped).
        #[arg(long)]
        force: bool,
        /// Do not ask for confirmation.
        #[arg(short = 'y', long)]
        yes: bool,
    },
    /// Force the outage breaker open or closed, or back to its rules.
    Breaker(crate::breaker::BreakerArgs),
}

/// `message …`.
#[derive(Debug, Subcommand)]
pub enum MessageCommand {
    /// A message, its properties, and per subscription its state, delivery
    /// count and attempt history.
    Get {
        /// Topic the message is stored in (a main topic, a retry or a
        /// dead-letter tier).
        topic: String,
        /// Entry id (the number after the last `:` of a message id).
        id: u64,
    },
}

/// Filters shared by the `dlq` commands.
#[derive(Debug, Clone, Default, Args)]
pub struct DlqFilterArgs {
    /// Only this dead-letter entry id (repeatable).
    #[arg(long = "id", value_name = "ID")]
    pub ids: Vec<u64>,
    /// Only dead letters whose reason or any attempt's detail contains TEXT.
    #[arg(long, value_name = "TEXT")]
    pub reason: Option<String>,
    /// Only those dead-lettered at or after TIME (RFC 3339, or a duration
    /// ago such as `1h`).
    #[arg(long, value_name = "TIME")]
    pub since: Option<TimeArg>,
    /// Only those dead-lettered before TIME (RFC 3339, or a duration ago).
    #[arg(long, value_name = "TIME")]
    pub until: Option<TimeArg>,
}

/// Fix and resend: changes made to dead letters as they are replayed.
#[derive(Debug, Clone, Default, Args)]
pub struct ReplayEditArgs {
    /// A new payload from FILE (`-` for stdin; then `--yes` is needed).
    #[arg(long, value_name = "FILE")]
    pub payload_file: Option<String>,
    /// Set a property, `k=v` (repeatable).
    #[arg(long = "set-property", value_name = "K=V", value_parser = parse_key_value)]
    pub set_properties: Vec<(String, String)>,
    /// Remove a property (repeatable).
    #[arg(long = "unset-property", value_name = "K")]
    pub unset_properties: Vec<String>,
    /// A new key.
    #[arg(long, value_name = "KEY")]
    pub key: Option<String>,
}

/// What a replay does to the delivery count. By default an edited dead
/// letter starts again from 0 (an edit is a new attempt at a fixed message,
/// so its first failure must not dead-letter it again) and an unchanged one
/// keeps its count.
#[derive(Debug, Clone, Copy, Default, Args)]
pub struct CountArgs {
    /// Start the replayed messages' delivery count from 0 again (the
    /// default for edited ones).
    #[arg(long, conflicts_with = "keep_count")]
    pub reset_count: bool,
    /// Keep the replayed messages' delivery count, even when edited.
    #[arg(long)]
    pub keep_count: bool,
}

impl CountArgs {
    /// The admin API's `reset_delivery_count`: `None` leaves it to the
    /// broker's default (reset when edited).
    pub fn wire(self) -> Option<bool> {
        match (self.reset_count, self.keep_count) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        }
    }

    /// Whether the count is reset for a replay that `edited` or not.
    pub fn resets(self, edited: bool) -> bool {
        self.wire().unwrap_or(edited)
    }
}

/// What `dlq list --group-by` counts by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum GroupBy {
    /// Why it died as the consumer saw it: the last failed attempt's detail
    /// (a nack's text), else that attempt's kind.
    Reason,
    /// The policy's verdict (`attempt 4 exceeds max_reconsume_times 3`).
    Verdict,
    /// The consumer of the last failed attempt.
    Consumer,
    /// The hour it was dead-lettered (UTC).
    Hour,
}

fn parse_rate(s: &str) -> std::result::Result<u32, String> {
    let n = s.strip_suffix("/s").unwrap_or(s);
    match n.trim().parse::<u32>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(v) => Ok(v),
        Err(_) => Err(format!("`{s}` is not a rate (`100` or `100/s`)")),
    }
}

fn parse_at(s: &str) -> std::result::Result<u64, String> {
    let t = humantime::parse_rfc3339_weak(s)
        .map_err(|e| format!("`{s}` is not an RFC 3339 time: {e}"))?;
    Ok(crate::timearg::time_to_ms(t))
}

/// A subscription named by topic and name.
#[derive(Debug, Clone, Args)]
pub struct SubscriptionArgs {
    /// Topic.
    pub topic: String,
    /// Subscription.
    pub subscription: String,
}

/// `dlq …`.
#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// One line per dead letter: id, origin, reason, time, failures.
    List {
        #[command(flatten)]
        target: SubscriptionArgs,
        #[command(flatten)]
        filter: DlqFilterArgs,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: u32,
        /// Start after this dead-letter entry id (paging).
        #[arg(long, value_name = "ID")]
        after: Option<u64>,
        /// Counts instead of a list: by `reason`, `consumer` (of the last
        /// failed attempt) or `hour` (when dead-lettered, UTC).
        #[arg(long, value_name = "BY")]
        group_by: Option<GroupBy>,
    },
    /// Dead letters in full: payload, properties and every failed attempt.
    Peek {
        #[command(flatten)]
        target: SubscriptionArgs,
        #[command(flatten)]
        filter: DlqFilterArgs,
        /// How many.
        #[arg(short = 'n', long = "count", default_value_t = 1)]
        count: u32,
    },
    /// Send dead letters again: by default into this subscription's own
    /// retry tier (only it sees them again, due now or at `--at`/`--delay`);
    /// with `--to-topic`, published again on the topic for every
    /// subscription. Optionally fixed first (`--payload-file`,
    /// `--set-property`, `--unset-property`, `--key`).
    Replay {
        #[command(flatten)]
        target: SubscriptionArgs,
        #[command(flatten)]
        filter: DlqFilterArgs,
        /// At most this many messages per second, `N` or `N/s` (default:
        /// the broker's, 1000). A long replay is a job kept across restarts.
        #[arg(long, value_name = "N/s", value_parser = parse_rate)]
        rate: Option<u32>,
        #[command(flatten)]
        count: CountArgs,
        /// Publish them again on the topic (every subscription sees them)
        /// instead of this subscription's retry tier.
        #[arg(long, conflicts_with_all = ["at", "delay"])]
        to_topic: bool,
        /// Deliver them at this time (RFC 3339) instead of now.
        #[arg(long, value_name = "TIME", value_parser = parse_at, conflicts_with = "delay")]
        at: Option<u64>,
        /// Deliver them after this delay (`10m`) instead of now.
        #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
        delay: Option<std::time::Duration>,
        #[command(flatten)]
        edit: ReplayEditArgs,
        /// Say what would be replayed (count and ids) and change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Start the replay and return at once with its job id.
        #[arg(long)]
        detach: bool,
        /// Do not ask for confirmation.
        #[arg(short = 'y', long)]
        yes: bool,
    },
    /// Delete dead letters for good.
    Purge {
        #[command(flatten)]
        target: SubscriptionArgs,
        #[command(flatten)]
        filter: DlqFilterArgs,
        /// Say what would be purged (count and ids) and change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Do not ask for confirmation.
        #[arg(short = 'y', long)]
        yes: bool,
    },
    /// Dead letters as JSON lines (`id`, `reason`, `attempts`, `key`,
    /// `properties`, `payload` in base64), to fix with ordinary tools and
    /// send back with `dlq import`.
    Export {
        #[command(flatten)]
        target: SubscriptionArgs,
        #[command(flatten)]
        filter: DlqFilterArgs,
    },
    /// Replays dead letters from JSON lines as `dlq export` writes them
    /// (file or `-` for stdin), each with the payload, key and properties
    /// of its line: what changed is recorded in its history.
    Import {
        #[command(flatten)]
        target: SubscriptionArgs,
        /// The JSON lines file, or `-` for stdin (then `--yes` is needed).
        #[arg(short = 'f', long = "file", value_name = "FILE")]
        file: String,
        #[command(flatten)]
        count: CountArgs,
        /// Publish them again on the topic instead of the retry tier.
        #[arg(long)]
        to_topic: bool,
        /// Say what would be replayed and changed, and change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Do not ask for confirmation.
        #[arg(short = 'y', long)]
        yes: bool,
    },
    /// Replay jobs in progress (all, in a cluster every live broker's; or
    /// one topic's or subscription's).
    Jobs {
        /// Topic (a partitioned topic's base name: every partition's jobs).
        topic: Option<String>,
        /// Subscription.
        subscription: Option<String>,
    },
    /// Stops a replay job (what it replayed stays replayed).
    CancelJob {
        /// The job id (`dlq jobs`).
        id: u64,
        /// The job's topic (needed with authentication unless a superuser);
        /// a partitioned topic's base name finds the job among its partitions'.
        #[arg(long)]
        topic: Option<String>,
    },
}

/// `policy …`.
#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// A policy's schedule: each attempt's delay, cumulative time, tier,
    /// and when it dead-letters.
    Explain {
        /// Compact spec (`delay-levels`, `backoff:min=1s,max-delay=1m,max=5`,
        /// `delay-levels:levels=10ms 20ms,start=1,max=2`) or JSON.
        #[arg(value_parser = parse_policy)]
        spec: PolicySpec,
        /// The failure to explain (`nack`, `ack-timeout`, `consumer-lost`,
        /// `reconsume-later`, `terminate`); default `reconsume-later` for
        /// delay levels, `nack` otherwise.
        #[arg(long, value_parser = parse_reason)]
        reason: Option<FailureReason>,
        /// Also describe an outage breaker (`breaker:ratio=0.5,window=200`).
        #[arg(long, value_name = "BREAKER", value_parser = crate::breaker::parse_breaker)]
        breaker: Option<ricochet_policy::BreakerSpec>,
    },
    /// The policy in force on a subscription and where it came from.
    Get {
        #[command(flatten)]
        target: SubscriptionArgs,
    },
    /// Set a subscription's policy at runtime (overrides client and config
    /// policies), or `--clear` the operator's choice.
    Set {
        #[command(flatten)]
        target: SubscriptionArgs,
        /// The policy spec.
        #[arg(value_parser = parse_policy, required_unless_present_any = ["clear", "key_order", "breaker"])]
        spec: Option<PolicySpec>,
        /// Remove the operator's policy, key order and breaker (the
        /// client's or config's apply again).
        #[arg(long, conflicts_with_all = ["spec", "key_order", "breaker"])]
        clear: bool,
        /// Keep per-key order through retries (Key_Shared, Failover,
        /// Exclusive): later messages of a key wait while one is retried.
        #[arg(long)]
        key_order: bool,
        /// With --key-order: a key blocked this long (e.g. `10m`) sends its
        /// failed and held messages to the dead-letter tier.
        #[arg(long, value_parser = parse_duration, requires = "key_order")]
        poison_key_after: Option<Duration>,
        /// An outage breaker (`breaker:ratio=0.5,window=200,probe=5s`). The
        /// operator's policy, key order and breaker are set together:
        /// without it, the subscription keeps no breaker of the operator's.
        #[arg(long, value_name = "BREAKER", value_parser = crate::breaker::parse_breaker)]
        breaker: Option<ricochet_policy::BreakerSpec>,
    },
}

/// `perf …`.
#[derive(Debug, Subcommand)]
pub enum PerfCommand {
    /// Publish as fast as allowed; measures publish latency (send → receipt).
    Produce(PerfProduceArgs),
    /// Consume and ack; measures end-to-end latency (publish → receive)
    /// from the timestamp `perf produce` puts in each payload.
    Consume(PerfConsumeArgs),
    /// Producers feed a topic, consumers nack every message once and ack its
    /// redelivery; measures the nack → redelivery loop.
    Redeliver(PerfRedeliverArgs),
}

/// Options every perf mode shares.
#[derive(Debug, Clone, Args)]
pub struct PerfCommon {
    /// Topic.
    #[arg(long, default_value = "perf")]
    pub topic: String,
    /// Stop after this long (`0s`: run until Ctrl-C).
    #[arg(long, value_parser = parse_duration, default_value = "0s")]
    pub duration: Duration,
}

/// `perf produce`.
#[derive(Debug, Clone, Args)]
pub struct PerfProduceArgs {
    #[command(flatten)]
    pub common: PerfCommon,
    /// Total messages per second over all producers; 0 means as fast as possible.
    #[arg(long, default_value_t = 0)]
    pub rate: u64,
    /// Payload size in bytes (at least 24: the timestamp header).
    #[arg(long, default_value_t = 1024)]
    pub size: usize,
    /// Concurrent producers.
    #[arg(long, default_value_t = 1)]
    pub producers: usize,
    /// Unreceipted sends allowed per producer.
    #[arg(long, default_value_t = 1000)]
    pub max_pending: usize,
    /// Stop after this many messages (0: no limit).
    #[arg(long, default_value_t = 0)]
    pub messages: u64,
    /// Create the topic as a partitioned topic of this many partitions
    /// first (kept if it exists); producers then route over them.
    #[arg(long, default_value_t = 0)]
    pub partitions: u32,
}

/// `perf consume`.
#[derive(Debug, Clone, Args)]
pub struct PerfConsumeArgs {
    #[command(flatten)]
    pub common: PerfCommon,
    /// Subscription.
    #[arg(short = 's', long, default_value = "perf-sub")]
    pub subscription: String,
    /// Subscription type: exclusive, shared, failover or key_shared.
    #[arg(short = 't', long = "type", default_value = "shared")]
    pub sub_type: SubscriptionType,
    /// Concurrent consumers.
    #[arg(long, default_value_t = 1)]
    pub consumers: usize,
    /// Messages prefetched per consumer.
    #[arg(long, default_value_t = 1000)]
    pub receiver_queue_size: u32,
}

/// `perf redeliver`.
#[derive(Debug, Clone, Args)]
pub struct PerfRedeliverArgs {
    #[command(flatten)]
    pub common: PerfCommon,
    /// Subscription.
    #[arg(short = 's', long, default_value = "perf-redeliver")]
    pub subscription: String,
    /// The subscription's policy; its first delay is part of every
    /// nack → redelivery time.
    #[arg(long, value_parser = parse_policy, default_value = "backoff:fixed=100ms,max=3")]
    pub policy: PolicySpec,
    /// Total messages per second fed by the producers; 0 means as fast as possible.
    #[arg(long, default_value_t = 1000)]
    pub rate: u64,
    /// Payload size in bytes (at least 24).
    #[arg(long, default_value_t = 128)]
    pub size: usize,
    /// Concurrent producers.
    #[arg(long, default_value_t = 1)]
    pub producers: usize,
    /// Concurrent consumers (one Shared subscription).
    #[arg(long, default_value_t = 1)]
    pub consumers: usize,
}

/// A humantime duration (`100ms`, `30s`, `1h 30m`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim()).map_err(|e| format!("bad duration {s:?}: {e}"))
}

/// A positive humantime duration.
fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d.is_zero() {
        return Err("must be longer than zero".into());
    }
    Ok(d)
}

/// A positive size: bytes, or with a unit (`512KiB`, `1GiB`, `10MB`).
pub fn parse_size(s: &str) -> Result<u64, String> {
    match parse_size::parse_size(s.trim()) {
        Ok(0) => Err("must be more than zero bytes".into()),
        Ok(n) if n > i64::MAX as u64 => Err(format!("{s:?} is too large")),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("bad size {s:?}: {e}")),
    }
}

fn parse_key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("expected NAME=VALUE, got {s:?}")),
    }
}

fn parse_policy(s: &str) -> Result<PolicySpec, String> {
    s.parse::<PolicySpec>().map_err(|e| e.to_string())
}

fn parse_reason(s: &str) -> Result<FailureReason, String> {
    s.parse::<FailureReason>().map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn grammar_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("10MB"), Ok(10_000_000));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("0").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("lots").is_err());
        assert!(parse_positive_duration("0s").is_err());
    }

    #[test]
    fn key_values() {
        assert_eq!(
            parse_key_value("a=b=c"),
            Ok(("a".to_owned(), "b=c".to_owned()))
        );
        assert!(parse_key_value("=x").is_err());
        assert!(parse_key_value("x").is_err());
    }
}
