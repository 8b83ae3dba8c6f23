//! The offload of replicated topics this broker leads: their segments go
//! to the object store by commands of their groups
//! ([`PartitionCommand::Offloaded`](super::PartitionCommand::Offloaded)),
//! on demand (`Tiered/Offload`) or by the topic's offload policy, in a
//! pass of the leader every `[tiered] interval` ([`spawn_leader_pass`]).
//! The broker's own background offloader skips replicated topics (but
//! drops a replica's local copies once the policy's lag passed, and
//! counts the offload lag of the topics this pass says it leads); the
//! pass seals a led topic's active segment once `segment_max_age` old
//! through the group first ([`super::seal`]: every replica seals at the
//! same id; no replica rolls a replicated topic's segment by age on its
//! own), and deletes orphan objects under the topics' prefixes
//! ([`Tiered::sweep_orphans`]). An on-demand offload seals the active
//! segment through the group too ([`ThroughGroup`]'s `seal`).

use super::groups::Groups;
use crate::storage::tiered::group::GroupRecorder;
use crate::storage::tiered::{SegmentState, Tiered};
use crate::storage::{Storage, StorageResult};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// At most one WARN about a failing pass this often.
const WARN_EVERY: Duration = Duration::from_secs(30);

/// Records a replicated topic's offloaded segment through the storage
/// its leader writes through ([`super::ReplicatedStorage`] proposes it
/// and waits until it is applied here).
#[derive(Debug)]
pub struct ThroughGroup(pub Arc<dyn Storage>);

impl GroupRecorder for ThroughGroup {
    fn record(&self, state: &SegmentState) -> StorageResult<()> {
        self.0.put_offload_record(state)
    }

    /// [`PartitionCommand::SealBelow`](super::PartitionCommand::SealBelow),
    /// awaited until applied here.
    fn seal(&self, topic: &str, below: u64) -> StorageResult<()> {
        self.0.seal_segment(topic, below)
    }
}

/// Every `tiered`'s `interval` until `stop`: each replicated topic this
/// broker leads and serves is offloaded as its policy says
/// ([`Tiered::offload_due_through`]). Runs on the caller's (multi-thread)
/// runtime: a record waits in place for its commit.
pub fn spawn_leader_pass(
    groups: Arc<Groups>,
    tiered: Arc<Tiered>,
    every: Duration,
    stop: CancellationToken,
) {
    tokio::spawn(async move {
        let mut warned: Option<Instant> = None;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = stop.cancelled() => break,
            }
            let served = groups.served();
            // Their offload lag counts here (the followers' copies do not).
            tiered.set_leading(served.iter().map(|(t, _)| t.clone()));
            for (topic, storage) in served {
                if !tiered.is_grouped(&topic) {
                    continue;
                }
                let leader = storage.clone();
                // An active segment `segment_max_age` old is sealed by the
                // group (every replica at the same id), so it offloads by
                // age in this pass as a factor-1 topic's does.
                let sealed = super::seal::seal_if_due(&topic, &leader, &groups)
                    .await
                    .map(|_| ());
                let recorder = ThroughGroup(Arc::new(storage) as Arc<dyn Storage>);
                let offloaded = match sealed {
                    Ok(()) => tiered.offload_due_through(&topic, &recorder).await,
                    Err(e) => Err(e),
                };
                let done = match offloaded {
                    // The sweep deletes what no record names: only once a
                    // majority confirmed this broker leads and every
                    // committed record is applied here (a deposed leader,
                    // or one behind its log, would take a live object for
                    // an orphan).
                    Ok(_) => match leader.confirm_leading().await {
                        Ok(()) => tiered.sweep_orphans(&topic, tiered.orphan_after()).await,
                        Err(e) => Err(e),
                    },
                    Err(e) => Err(e),
                };
                if let Err(e) = done
                    && warned.is_none_or(|w| w.elapsed() >= WARN_EVERY)
                {
                    warned = Some(Instant::now());
                    tracing::warn!(%topic, error = %e, "tiered: the leader's offload of a replicated topic failed; its segments stay local, retried at the next pass");
                }
            }
        }
    });
}
