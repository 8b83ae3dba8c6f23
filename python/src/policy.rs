//! Policy specs from Python: `parse_policy` checks a spec and gives its
//! canonical compact form, `explain_policy` its schedule (attempt by
//! attempt, from `ricochet_policy::explain`), as rows and as the table the
//! CLI prints. Nothing is computed here: the policy crate decides.

use pyo3::prelude::*;
use ricochet_client::PolicySpec;
use ricochet_policy::{FailureReason, Outcome, ScheduleTable, explain};

use crate::errors::IntoPy;

fn parse(spec: &str) -> PyResult<PolicySpec> {
    spec.parse::<PolicySpec>()
        .map_err(ricochet_client::Error::from)
        .py()
}

/// Checks `spec` (the compact form, or JSON) and returns its canonical
/// compact form. Raises `PolicyError` if it does not validate.
#[pyfunction]
pub(crate) fn parse_policy(spec: &str) -> PyResult<String> {
    Ok(parse(spec)?.to_string())
}

/// One attempt of a schedule.
#[pyclass(name = "ScheduleRow", module = "ricochet", frozen, get_all)]
#[derive(Debug, Clone)]
pub(crate) struct PyScheduleRow {
    /// The failure number, from 1.
    attempt: u32,
    /// Seconds before the redelivery; `None` for the dead letter.
    delay: Option<f64>,
    /// Seconds of delay up to and including this attempt.
    cumulative: f64,
    /// `"main"` or `"retry"` for a redelivery, `None` for the dead letter.
    tier: Option<String>,
    /// Whether this attempt dead-letters the message.
    dead_letter: bool,
    /// What happens, as the CLI prints it.
    outcome: String,
}

#[pymethods]
impl PyScheduleRow {
    fn __repr__(&self) -> String {
        format!(
            "ScheduleRow(attempt={}, delay={:?}, outcome={:?})",
            self.attempt, self.delay, self.outcome
        )
    }
}

/// A policy's schedule for one failure reason; `str()` gives the table.
#[pyclass(name = "PolicySchedule", module = "ricochet", frozen, get_all)]
#[derive(Debug)]
pub(crate) struct PyPolicySchedule {
    /// The canonical spec.
    spec: String,
    /// The failure reason the schedule is for.
    reason: String,
    rows: Vec<PyScheduleRow>,
    /// True when the policy never dead-letters and the rows were cut.
    truncated: bool,
    /// The schedule as the CLI prints it.
    table: String,
}

#[pymethods]
impl PyPolicySchedule {
    fn __str__(&self) -> String {
        self.table.clone()
    }

    fn __repr__(&self) -> String {
        format!(
            "PolicySchedule(spec={:?}, reason={:?}, {} rows)",
            self.spec,
            self.reason,
            self.rows.len()
        )
    }
}

/// The schedule `spec` gives failures of `reason` (`nack`, `ack_timeout`,
/// `consumer_lost`, `reconsume_later`, `terminate`): attempt 1, 2, ... up
/// to the dead letter.
#[pyfunction]
#[pyo3(signature = (spec, reason = "nack"))]
pub(crate) fn explain_policy(spec: &str, reason: &str) -> PyResult<PyPolicySchedule> {
    let spec = parse(spec)?;
    let reason: FailureReason = reason.parse().map_err(ricochet_client::Error::from).py()?;
    let policy = spec.build().map_err(ricochet_client::Error::from).py()?;
    let rows = explain(&*policy, reason);
    let out = rows
        .iter()
        .map(|r| PyScheduleRow {
            attempt: r.attempt,
            delay: r.delay.map(|d| d.as_secs_f64()),
            cumulative: r.cumulative.as_secs_f64(),
            tier: match &r.outcome {
                Outcome::Redeliver(t) => Some(t.to_string()),
                Outcome::DeadLetter { .. } => None,
            },
            dead_letter: matches!(r.outcome, Outcome::DeadLetter { .. }),
            outcome: r.outcome.to_string(),
        })
        .collect();
    let table = ScheduleTable::new(&*policy, reason, rows);
    Ok(PyPolicySchedule {
        spec: spec.to_string(),
        reason: reason.to_string(),
        rows: out,
        truncated: table.is_truncated(),
        table: table.to_string(),
    })
}
