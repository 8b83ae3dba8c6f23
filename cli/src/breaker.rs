//! The outage breaker on the command line: `subscriptions breaker TOPIC SUB
//! --open|--close|--auto` (the `SetBreaker` RPC), the breaker's part of
//! `subscriptions stats` and `policy get|set` ([`BreakerView`]), and its
//! description under `policy explain --breaker`.

use std::io::Write;

use clap::Args;
use ricochet_policy::{BreakerMode, BreakerSpec};
use ricochet_proto as pb;
use serde::Serialize;

use crate::Ctx;
use crate::error::{CliError, Result};
use crate::output::{Block, write_json};
use crate::timearg::{fmt_ms, fmt_relative};

/// `subscriptions breaker`: force the breaker open or closed, or back to
/// its rules.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("mode").required(true).args(["open", "close", "auto"])))]
pub struct BreakerArgs {
    /// Topic.
    pub topic: String,
    /// Subscription.
    pub subscription: String,
    /// Force it open: nothing is dispatched, no probes, failures of messages
    /// out spend no attempt.
    #[arg(long)]
    pub open: bool,
    /// Force it closed: dispatch as usual, never trips.
    #[arg(long)]
    pub close: bool,
    /// Hand it back to its trip rules (an open breaker probes after its
    /// first probe interval).
    #[arg(long)]
    pub auto: bool,
}

/// A subscription's breaker, as `subscriptions stats` and `breaker` show it.
#[derive(Debug, Clone, Serialize)]
pub struct BreakerView {
    /// `closed`, `open` or `half_open`.
    pub state: String,
    /// `auto`, `forced_open` or `forced_closed`.
    pub mode: String,
    /// When it entered its state (ms since the epoch).
    pub since_ms: u64,
    /// Failures / settles in its window (while closed).
    pub failure_ratio: f64,
    /// Settles in its window.
    pub window_settles: u32,
    /// Times it opened.
    pub trips: u64,
    /// The next probe (ms since the epoch), 0 when none is waited for.
    pub next_probe_ms: u64,
    /// Its settings, compact form.
    pub spec: Option<String>,
}

impl BreakerView {
    /// From the wire.
    pub fn from_proto(b: &pb::BreakerStatus) -> Self {
        let mode = pb::BreakerMode::try_from(b.mode).unwrap_or(pb::BreakerMode::Unspecified);
        BreakerView {
            state: b.state.clone(),
            mode: mode
                .as_str_name()
                .trim_start_matches("BREAKER_MODE_")
                .to_ascii_lowercase(),
            since_ms: b.since_ms,
            failure_ratio: if b.window_settles == 0 {
                0.0
            } else {
                f64::from(b.window_failures) / f64::from(b.window_settles)
            },
            window_settles: b.window_settles,
            trips: b.trips,
            next_probe_ms: b.next_probe_ms,
            spec: b
                .config
                .as_ref()
                .and_then(|c| BreakerSpec::try_from(c).ok())
                .map(|s| s.to_string()),
        }
    }

    /// `open since … (…), forced` and so on, on one line.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "{} since {} ({})",
            self.state,
            fmt_ms(self.since_ms),
            fmt_relative(self.since_ms)
        );
        if self.mode != "auto" {
            s.push_str(&format!(", {}", self.mode.replace('_', " ")));
        }
        if self.state == "closed" {
            s.push_str(&format!(
                ", failure ratio {:.0}% of {} settles",
                self.failure_ratio * 100.0,
                self.window_settles
            ));
        }
        if self.next_probe_ms != 0 {
            s.push_str(&format!(
                ", next probe {}",
                fmt_relative(self.next_probe_ms)
            ));
        }
        s.push_str(&format!(", {} trip(s)", self.trips));
        s
    }

    fn write_table(&self, out: &mut dyn Write) -> Result<()> {
        let mut b = Block::new();
        b.kv("breaker", self.summary());
        if let Some(s) = &self.spec {
            b.kv("settings", s);
        }
        b.write(out, 0)
    }
}

/// `subscriptions breaker`.
pub(crate) async fn force(ctx: &mut Ctx<'_>, a: BreakerArgs) -> Result<()> {
    let mode = match (a.open, a.close, a.auto) {
        (true, false, false) => BreakerMode::ForcedOpen,
        (false, true, false) => BreakerMode::ForcedClosed,
        (false, false, true) => BreakerMode::Auto,
        _ => {
            return Err(CliError::Usage(
                "give one of --open, --close, --auto".into(),
            ));
        }
    };
    let r = ctx
        .admin()
        .await?
        .set_breaker(&a.topic, &a.subscription, mode)
        .await?;
    let view = BreakerView::from_proto(&r);
    if ctx.json() {
        return write_json(ctx.out, &view);
    }
    view.write_table(ctx.out)
}

/// `policy explain --breaker`: what the breaker does, as text.
pub(crate) fn explain(out: &mut dyn Write, spec: &BreakerSpec) -> Result<()> {
    writeln!(out)?;
    writeln!(out, "{spec}")?;
    writeln!(out, "{}", spec.describe())?;
    Ok(())
}

/// The breaker part of `policy explain --breaker -o json`.
#[derive(Debug, Serialize)]
pub(crate) struct BreakerExplainView {
    spec: String,
    description: String,
    /// The first probe waits while it stays open.
    probe_waits_ms: Vec<u64>,
}

impl BreakerExplainView {
    pub(crate) fn new(spec: &BreakerSpec) -> Self {
        BreakerExplainView {
            spec: spec.to_string(),
            description: spec.describe(),
            probe_waits_ms: spec
                .probe_schedule(8)
                .iter()
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
                .collect(),
        }
    }
}

/// Parses `--breaker`.
pub(crate) fn parse_breaker(s: &str) -> std::result::Result<BreakerSpec, String> {
    s.parse::<BreakerSpec>().map_err(|e| e.to_string())
}
