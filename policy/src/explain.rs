//! Schedules for humans: [`explain`] walks a policy through attempts 1, 2, …
//! until it dead-letters (or a row cap for unbounded policies) and returns
//! one [`ScheduleRow`] per attempt; [`explain_table`] renders that as a
//! [`ScheduleTable`] for CLIs and docs.

use std::fmt;
use std::time::Duration;

use crate::context::mix64;
use crate::{DeadLetterPolicy, Decision, FailureContext, FailureReason, Tier};

/// Rows [`explain`] produces at most (for policies that never dead-letter).
pub const DEFAULT_MAX_ROWS: usize = 1000;

/// What one attempt leads to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Redelivered from this tier.
    Redeliver(Tier),
    /// Dead-lettered, with the policy's reason.
    DeadLetter {
        /// The policy's reason.
        reason: String,
    },
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Redeliver(tier) => write!(f, "redeliver ({tier})"),
            Outcome::DeadLetter { reason } => write!(f, "dead-letter ({reason})"),
        }
    }
}

/// One attempt in a schedule.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ScheduleRow {
    /// The failure number, from 1.
    pub attempt: u32,
    /// The delay before the redelivery; `None` for a dead letter.
    pub delay: Option<Duration>,
    /// The sum of the delays up to and including this row (saturating).
    pub cumulative: Duration,
    /// What this attempt leads to.
    pub outcome: Outcome,
}

/// The schedule of `policy` for failures with `reason` and no overrides:
/// attempts 1, 2, … up to and including the first dead letter, or
/// [`DEFAULT_MAX_ROWS`] rows. Each attempt gets a jitter seed derived from
/// its number, so a jittered policy shows one plausible schedule.
pub fn explain(policy: &dyn DeadLetterPolicy, reason: FailureReason) -> Vec<ScheduleRow> {
    explain_with(policy, &FailureContext::new(1, reason), DEFAULT_MAX_ROWS)
}

/// Like [`explain`], from a `template` context (reason, tier, detail,
/// override, seed) and with at most `max_rows` rows. The template's attempt
/// is ignored; attempt `n`'s seed mixes the template's seed with `n`.
pub fn explain_with(
    policy: &dyn DeadLetterPolicy,
    template: &FailureContext<'_>,
    max_rows: usize,
) -> Vec<ScheduleRow> {
    let mut rows = Vec::new();
    let mut cumulative = Duration::ZERO;
    let mut attempt: u32 = 1;
    while rows.len() < max_rows {
        let mut ctx = *template;
        ctx.attempt = attempt;
        ctx.jitter_seed = mix64(template.jitter_seed ^ u64::from(attempt));
        let row = match policy.decide(&ctx) {
            Decision::Redeliver { after, tier } => {
                cumulative = cumulative.saturating_add(after);
                ScheduleRow {
                    attempt,
                    delay: Some(after),
                    cumulative,
                    outcome: Outcome::Redeliver(tier),
                }
            }
            Decision::DeadLetter { reason } => ScheduleRow {
                attempt,
                delay: None,
                cumulative,
                outcome: Outcome::DeadLetter { reason },
            },
        };
        let done = row.delay.is_none();
        rows.push(row);
        if done || attempt == u32::MAX {
            break;
        }
        attempt += 1;
    }
    rows
}

/// A rendered schedule: a header naming the policy, then one line per attempt.
///
/// ```
/// use ricochet_policy::{explain_table, DelayLevelPolicy, FailureReason};
/// let table = explain_table(&DelayLevelPolicy::default(), FailureReason::ReconsumeLater);
/// assert_eq!(table.rows().len(), 17);
/// let text = table.to_string();
/// assert!(text.contains("     16  2h     "));
/// assert!(text.contains("dead-letter (attempt 17 exceeds max_reconsume_times 16)"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleTable {
    title: String,
    reason: FailureReason,
    rows: Vec<ScheduleRow>,
    truncated: bool,
}

/// The schedule of `policy` for `reason` (see [`explain`]) as a table.
pub fn explain_table(policy: &dyn DeadLetterPolicy, reason: FailureReason) -> ScheduleTable {
    ScheduleTable::new(policy, reason, explain(policy, reason))
}

impl ScheduleTable {
    /// A table of `rows` computed from `policy` for `reason`.
    pub fn new(
        policy: &dyn DeadLetterPolicy,
        reason: FailureReason,
        rows: Vec<ScheduleRow>,
    ) -> Self {
        let title = match policy.spec() {
            Some(spec) => spec.to_string(),
            None => match policy.max_attempts() {
                Some(max) => format!("{} (max {max} attempts)", policy.name()),
                None => format!("{} (unbounded)", policy.name()),
            },
        };
        let truncated = rows.last().is_some_and(|r| r.delay.is_some());
        ScheduleTable {
            title,
            reason,
            rows,
            truncated,
        }
    }

    /// The rows.
    pub fn rows(&self) -> &[ScheduleRow] {
        &self.rows
    }

    /// True when the schedule was cut before reaching a dead letter.
    pub fn is_truncated(&self) -> bool {
        self.truncated
    }
}

impl fmt::Display for ScheduleTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "policy: {}", self.title)?;
        writeln!(f, "reason: {}", self.reason)?;
        let cells: Vec<[String; 4]> = self
            .rows
            .iter()
            .map(|r| {
                [
                    r.attempt.to_string(),
                    r.delay.map_or_else(
                        || "-".to_owned(),
                        |d| humantime::format_duration(d).to_string(),
                    ),
                    humantime::format_duration(r.cumulative).to_string(),
                    r.outcome.to_string(),
                ]
            })
            .collect();
        let header = ["attempt", "delay", "cumulative", "outcome"];
        let mut widths = header.map(str::len);
        for row in &cells {
            for (w, c) in widths.iter_mut().zip(row) {
                *w = (*w).max(c.len());
            }
        }
        let [wa, wd, wc, _] = widths;
        writeln!(
            f,
            "{:>wa$}  {:<wd$}  {:<wc$}  {}",
            header[0], header[1], header[2], header[3]
        )?;
        for [a, d, c, o] in &cells {
            writeln!(f, "{a:>wa$}  {d:<wd$}  {c:<wc$}  {o}")?;
        }
        if self.truncated {
            writeln!(
                f,
                "… cut after {} rows without a dead letter",
                self.rows.len()
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BackoffPolicy, DelayLevelPolicy};

    #[derive(Debug)]
    struct Forever;

    impl DeadLetterPolicy for Forever {
        fn decide(&self, ctx: &FailureContext<'_>) -> Decision {
            ctx.mandatory_dead_letter().unwrap_or(Decision::Redeliver {
                after: Duration::from_secs(1),
                tier: Tier::Main,
            })
        }
        fn max_attempts(&self) -> Option<u32> {
            None
        }
        fn name(&self) -> &str {
            "forever"
        }
    }

    #[test]
    fn rocketmq_schedule() {
        let rows = explain(&DelayLevelPolicy::default(), FailureReason::ReconsumeLater);
        assert_eq!(rows.len(), 17);
        assert_eq!(rows[0].delay, Some(Duration::from_secs(10)));
        assert_eq!(rows[15].delay, Some(Duration::from_secs(7200)));
        let total: u64 = [
            10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200,
        ]
        .iter()
        .sum();
        assert_eq!(rows[15].cumulative, Duration::from_secs(total));
        assert_eq!(rows[16].cumulative, Duration::from_secs(total));
        assert_eq!(rows[16].delay, None);
        assert!(matches!(rows[16].outcome, Outcome::DeadLetter { .. }));
        assert!(
            rows[..16]
                .iter()
                .all(|r| r.outcome == Outcome::Redeliver(Tier::Retry))
        );
    }

    #[test]
    fn terminate_is_one_row() {
        let rows = explain(
            &BackoffPolicy::pulsar_multiplier(3).expect("valid"),
            FailureReason::Terminate,
        );
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].delay, None);
    }

    #[test]
    fn unbounded_is_capped() {
        let rows = explain(&Forever, FailureReason::Nack);
        assert_eq!(rows.len(), DEFAULT_MAX_ROWS);
        let table = ScheduleTable::new(&Forever, FailureReason::Nack, rows);
        assert!(table.is_truncated());
        let text = table.to_string();
        assert!(text.starts_with("policy: forever (unbounded)\nreason: nack\n"));
        assert!(text.ends_with("… cut after 1000 rows without a dead letter\n"));
        assert!(explain_with(&Forever, &FailureContext::new(1, FailureReason::Nack), 0).is_empty());
    }

    #[test]
    fn table_layout() {
        let p = BackoffPolicy::pulsar_multiplier(3).expect("valid");
        let text = explain_table(&p, FailureReason::Nack).to_string();
        let expected = "\
policy: backoff:min=10s,max-delay=10m,multiplier=2,jitter=0,max=3
reason: nack
attempt  delay  cumulative  outcome
      1  10s    10s         redeliver (main)
      2  20s    30s         redeliver (main)
      3  40s    1m 10s      redeliver (main)
      4  -      1m 10s      dead-letter (attempt 4 exceeds max_redeliver_count 3)
";
        assert_eq!(text, expected);
    }
}
