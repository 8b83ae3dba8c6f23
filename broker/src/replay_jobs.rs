//! Replay jobs: a dead-letter replay run at a rate, with its progress kept
//! durably so that a long replay resumes after a broker restart, neither
//! starting over nor doubling.
//!
//! A job ([`ReplayJobRecord`]) holds the dead-letter ids that matched when
//! the operator asked, the order (mode, reset, edit, who) and a cursor. It
//! is stored (durably) before the first message moves; then chunks of at
//! most a tenth of the rate go through the subscription actor (each chunk
//! atomic in its mode), and the cursor is stored after each. A crash between
//! a chunk and its cursor is harmless: on resume, ids no longer in the
//! dead-letter tier are skipped, so nothing is replayed twice. Jobs still
//! stored when the broker starts are resumed. Cancelling a job removes its
//! record; the runner stops before its next chunk.

use crate::core::BrokerCore;
use crate::error::{BrokerError, Result};
use crate::events::{EventKind, FailureEvent};
use crate::name::{SubscriptionName, TopicName};
use crate::storage::ReplayJobRecord;
use crate::subscription::MessageRef;
use std::sync::Arc;
use std::time::Duration;

/// What a job did (in this run of the broker).
#[derive(Debug, Default)]
pub struct JobOutcome {
    /// Dead letters replayed by the job overall (earlier runs included).
    pub replayed: u64,
    /// The new ids of those replayed in this run.
    pub new_ids: Vec<MessageRef>,
    /// False when it stopped early (cancelled, or the broker stopping).
    pub finished: bool,
}

/// Stores `job` durably, then runs it in its own task (it goes on if the
/// caller goes away); the handle yields its outcome.
pub async fn start(
    core: &Arc<BrokerCore>,
    job: ReplayJobRecord,
) -> Result<tokio::task::JoinHandle<Result<JobOutcome>>> {
    core.storage.put_replay_job(&job)?;
    core.flusher.durable().await?;
    Ok(tokio::spawn(run(core.clone(), job)))
}

/// Resumes every stored job (at broker start).
pub fn resume_all(core: &Arc<BrokerCore>) {
    let jobs = match core.storage.replay_jobs(true) {
        Ok(jobs) => jobs,
        Err(e) => {
            tracing::error!(error = %e, "cannot read replay jobs to resume");
            return;
        }
    };
    for job in jobs {
        tracing::warn!(job = job.id, topic = %job.topic, subscription = %job.subscription,
            done = job.cursor, total = job.dead_letter_ids.len(), "resuming dead-letter replay job");
        let core = core.clone();
        tokio::spawn(async move {
            let id = job.id;
            if let Err(e) = run(core, job).await {
                tracing::error!(job = id, error = %e, "dead-letter replay job failed");
            }
        });
    }
}

/// Whether job `id` is still stored (not cancelled); reads no id lists.
fn still_wanted(core: &BrokerCore, id: u64) -> Result<bool> {
    Ok(core.storage.replay_jobs(false)?.iter().any(|j| j.id == id))
}

/// Chunk size and pause for `rate` messages per second: a tenth of a
/// second's worth at a time.
fn pacing(rate: u32) -> (usize, Duration) {
    let rate = rate.max(1);
    let chunk = (rate as usize).div_ceil(10).max(1);
    (
        chunk,
        Duration::from_secs_f64(chunk as f64 / f64::from(rate)),
    )
}

async fn run(core: Arc<BrokerCore>, mut job: ReplayJobRecord) -> Result<JobOutcome> {
    let topic = TopicName::parse(&job.topic)?;
    let sub = SubscriptionName::parse(&job.subscription)?;
    let handle = match core.subscription(&topic, &sub).await {
        Ok(h) => h,
        Err(BrokerError::TopicNotFound(_) | BrokerError::SubscriptionNotFound { .. }) => {
            // Deleted meanwhile: nothing is left to replay.
            core.storage.remove_replay_job(job.id)?;
            core.flusher.durable().await?;
            return Ok(JobOutcome::default());
        }
        Err(e) => return Err(e),
    };
    let (chunk, pause) = pacing(job.rate_per_second);
    let mut out = JobOutcome::default();
    let mut first = true;
    while job.cursor < job.dead_letter_ids.len() {
        if !first {
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = core.shutdown.cancelled() => return Ok(out),
            }
        }
        first = false;
        if !still_wanted(&core, job.id)? {
            tracing::warn!(job = job.id, "dead-letter replay job cancelled");
            out.replayed = job.replayed;
            return Ok(out);
        }
        let end = (job.cursor + chunk).min(job.dead_letter_ids.len());
        let ids = &job.dead_letter_ids[job.cursor..end];
        let letters = core.storage.dead_letters_by_id(handle.id(), ids)?;
        let n = letters.len() as u64;
        if !letters.is_empty() {
            match handle.replay(letters, job.order.clone()).await {
                Ok(new_ids) => {
                    let mut ev = FailureEvent::new(
                        EventKind::Replayed,
                        core.clock.now_ms(),
                        &job.topic,
                        &job.subscription,
                    );
                    ev.dead_letter_ids = ids.to_vec();
                    ev.by = Some(job.order.by.clone());
                    core.emit_events(vec![ev]);
                    out.new_ids.extend(new_ids);
                }
                // Stopping: the job resumes at the next start.
                Err(BrokerError::ShuttingDown) => return Ok(out),
                Err(e) => {
                    // Not retried at every start: the operator decides again.
                    tracing::error!(job = job.id, error = %e, "dead-letter replay job stopped");
                    core.storage.remove_replay_job(job.id)?;
                    core.flusher.durable().await?;
                    return Err(e);
                }
            }
        }
        job.cursor = end;
        job.replayed += n;
        // Durable with the next chunk's flush (or the removal's below).
        core.storage.put_replay_job(&job)?;
    }
    core.storage.remove_replay_job(job.id)?;
    core.flusher.durable().await?;
    out.replayed = job.replayed;
    out.finished = true;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::pacing;
    use std::time::Duration;

    #[test]
    fn pacing_sends_a_tenth_of_a_second_at_a_time() {
        assert_eq!(pacing(1000), (100, Duration::from_millis(100)));
        assert_eq!(pacing(5), (1, Duration::from_millis(200)));
        // Zero is taken as one per second, never a division by zero.
        assert_eq!(pacing(0), (1, Duration::from_secs(1)));
    }
}
