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
//!
//! A job on a replicated topic is stored through the topic's group, like
//! every change of its dead letters, so every replica holds it: it runs on
//! the group's leader, is skipped at a broker's start, and resumes on the
//! member that takes the topic over ([`resume_topic`]).

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
    core.writer_for(&job.topic)?.put_replay_job(&job)?;
    core.flusher.durable().await?;
    let running = Running::claim(core, job.id);
    Ok(tokio::spawn(async move {
        let outcome = run(running.core.clone(), job).await;
        drop(running);
        outcome
    }))
}

/// The jobs running in this process, by broker core and job id: a job is
/// resumed only when no runner has it (a replicated topic reopened on its
/// leader resumes its jobs again).
static RUNNING: std::sync::Mutex<Vec<(usize, u64)>> = std::sync::Mutex::new(Vec::new());

/// A running job's place in [`RUNNING`], left when dropped.
struct Running {
    core: Arc<BrokerCore>,
    id: u64,
}

impl Running {
    /// Claims job `id` for a runner; `None` when one runs it already.
    fn try_claim(core: &Arc<BrokerCore>, id: u64) -> Option<Self> {
        let key = (Arc::as_ptr(core) as usize, id);
        let mut running = RUNNING.lock().unwrap_or_else(|p| p.into_inner());
        if running.contains(&key) {
            return None;
        }
        running.push(key);
        Some(Self {
            core: core.clone(),
            id,
        })
    }

    /// Claims a new job's id (no runner can have it yet).
    fn claim(core: &Arc<BrokerCore>, id: u64) -> Self {
        Self::try_claim(core, id).unwrap_or(Self {
            core: core.clone(),
            id,
        })
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let key = (Arc::as_ptr(&self.core) as usize, self.id);
        RUNNING
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|k| *k != key);
    }
}

/// Resumes every stored job (at broker start), but those of replicated
/// topics: their group's leader runs them once it takes the topic.
pub fn resume_all(core: &Arc<BrokerCore>) {
    let replicated: std::collections::HashSet<String> = match core.storage.list_topics() {
        Ok(topics) => topics
            .into_iter()
            .filter(|t| t.replicas > 1)
            .map(|t| t.name)
            .collect(),
        Err(e) => {
            tracing::error!(error = %e, "cannot read topics to resume replay jobs");
            return;
        }
    };
    resume(core, |topic| !replicated.contains(topic));
}

/// Resumes the stored jobs of replicated `topic`, now served here (its
/// group's leader took it).
pub fn resume_topic(core: &Arc<BrokerCore>, topic: &str) {
    resume(core, |t| t == topic);
}

fn resume(core: &Arc<BrokerCore>, wanted: impl Fn(&str) -> bool) {
    let jobs = match core.storage.replay_jobs(true) {
        Ok(jobs) => jobs,
        Err(e) => {
            tracing::error!(error = %e, "cannot read replay jobs to resume");
            return;
        }
    };
    for job in jobs.into_iter().filter(|j| wanted(&j.topic)) {
        let Some(running) = Running::try_claim(core, job.id) else {
            continue;
        };
        tracing::warn!(job = job.id, topic = %job.topic, subscription = %job.subscription,
            done = job.cursor, total = job.dead_letter_ids.len(), "resuming dead-letter replay job");
        tokio::spawn(async move {
            let id = job.id;
            if let Err(e) = run(running.core.clone(), job).await {
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
            core.writer_for(&job.topic)?.remove_replay_job(job.id)?;
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
                    core.writer_for(&job.topic)?.remove_replay_job(job.id)?;
                    core.flusher.durable().await?;
                    return Err(e);
                }
            }
        }
        job.cursor = end;
        job.replayed += n;
        // Durable with the next chunk's flush (or the removal's below).
        core.writer_for(&job.topic)?.put_replay_job(&job)?;
    }
    core.writer_for(&job.topic)?.remove_replay_job(job.id)?;
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
