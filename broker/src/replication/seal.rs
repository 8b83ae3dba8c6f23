//! The age rolls of the replicated topics this broker leads. A replicated
//! topic's segments roll at an append by id block and size only
//! (`Storage::append_replicated`: every replica applies the same entries,
//! so with equal settings each rolls at the same ids), and by age only
//! when its leader seals them through the group
//! ([`PartitionCommand::SealBelow`](super::PartitionCommand::SealBelow),
//! every replica at the same place in the log, so at the same id): every
//! [`every`] the leader's pass ([`spawn_seal_pass`]) seals each topic it
//! serves whose active segment holds entries and is `segment_max_age` old
//! by the leader's clock, busy or idle. The leader's offload pass
//! (`super::offload`) seals the same way before it offloads. Neither
//! proposes the seal while a member of the group does not advertise that
//! it applies it ([`super::gate`]: a rolling upgrade); the segment then
//! stays active, and the leader logs once which member holds it back.
//! (Whether a group's members all apply a coalesced entry is re-read on
//! its own clock: [`super::coalescing`].)

use super::gate;
use super::groups::Groups;
use crate::storage::{Storage, StorageResult};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// At most one WARN about a failing seal this often.
const WARN_EVERY: Duration = Duration::from_secs(30);

/// How often the leader's pass looks for segments to seal: a tenth of
/// `segment_max_age`, between 100 ms and a minute (a replicated topic's
/// segment is sealed up to this long after it reached its age).
pub fn every(max_age: Duration) -> Duration {
    (max_age / 10).clamp(Duration::from_millis(100), Duration::from_secs(60))
}

/// Seals `topic`'s active segment through its group when it is due
/// (`Storage::seal_due` on the leader's applied log) and every member of
/// the group advertises that it applies the seal
/// ([`Groups::may_propose`] with [`gate::SEAL_BELOW`]: a member that
/// predates it would stop applying the group); returns whether a seal
/// was proposed (and applied here).
pub async fn seal_if_due(
    topic: &str,
    storage: &dyn Storage,
    groups: &Groups,
) -> StorageResult<bool> {
    let Some(below) = storage.seal_due(topic)? else {
        return Ok(false);
    };
    if !groups.may_propose(topic, gate::SEAL_BELOW).await {
        return Ok(false);
    }
    storage.seal_segment(topic, below)?;
    Ok(true)
}

/// Every `every` until `stop`: each replicated topic this broker leads and
/// serves is sealed through its group once its active segment is
/// `segment_max_age` old ([`seal_if_due`]). Runs on the caller's
/// (multi-thread) runtime: a seal waits in place for its commit.
pub fn spawn_seal_pass(groups: Arc<Groups>, every: Duration, stop: CancellationToken) {
    tokio::spawn(async move {
        let mut warned: Option<Instant> = None;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = stop.cancelled() => break,
            }
            for (topic, storage) in groups.served() {
                if let Err(e) = seal_if_due(&topic, &storage, &groups).await
                    && warned.is_none_or(|w| w.elapsed() >= WARN_EVERY)
                {
                    warned = Some(Instant::now());
                    tracing::warn!(%topic, error = %e, "the leader's age roll of a replicated topic failed; retried at the next pass");
                }
            }
        }
    });
}
