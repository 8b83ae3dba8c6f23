//! The leader's re-check of whether the groups it leads may coalesce
//! queued writes into one entry ([`super::PartitionCommand::Sequence`],
//! [`super::gate::COALESCED`]). A broker checks a group's members when it
//! takes the topic as leader; a member may later be replaced by an older
//! build (a downgrade) or re-register at a lower level, so every
//! [`LEVELS_EVERY`], on its own clock (not the seal pass's, which may
//! sleep up to a minute), this pass reads the brokers' registrations once
//! and sets, for every replicated topic this broker serves, whether its
//! write queue coalesces (`ReplicatedStorage::set_coalescing`). A member
//! not advertising the level, or registrations that cannot be read, turn
//! coalescing off until a later pass sees every member at the level.

use super::groups::Groups;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often the pass re-reads the members' levels.
pub const LEVELS_EVERY: Duration = Duration::from_secs(10);

/// Every [`LEVELS_EVERY`] until `stop`: [`Groups::recheck_coalescing`].
pub fn spawn_level_pass(groups: Arc<Groups>, stop: CancellationToken) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(LEVELS_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick is immediate: the take already set each topic.
        tick.tick().await;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.cancelled() => break,
            }
            groups.recheck_coalescing().await;
        }
    });
}
