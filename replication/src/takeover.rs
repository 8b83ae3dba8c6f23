//! Standing for election at once when this member refused a candidate
//! because the candidate's log is behind its own.
//!
//! After a leader dies, the member whose election timer fires first
//! stands; when it does not hold the last entries the dead leader sent
//! (the other member does), the other refuses it by log. openraft 0.9
//! then makes things slow: the refused candidate waits an extra
//! `2 × election_timeout_max` before it stands again (it "saw a greater
//! log"), and the member with the longer log, refusing, keeps its vote and
//! its own timer (lease + election timeout since the last heartbeat), so
//! when it stands it does so in the same term the candidate already voted
//! for itself in, and is refused in turn; only its next candidacy, an
//! election timeout later, wins. That is 3.7-4.3 s from the kill instead
//! of 1.6-2.0 s (the bench's logs, `docs/src/replication-history-failover.md`).
//!
//! Here the member that refused by log stands at once, in a term the
//! candidate grants: it first records the candidate's term as seen
//! (openraft's `vote` with the candidate's vote and this member's own last
//! log id, so openraft's own checks run: a member still holding a live
//! leader's lease refuses it and nothing happens), which is what standard
//! Raft does on any request of a higher term, then triggers an election,
//! one term above. Nothing about what a vote or a commit requires changes:
//! every vote is still granted or refused by openraft's rules, and a leader
//! never does this.

use crate::{NodeId, Raft};
use openraft::ServerState;
use openraft::raft::{VoteRequest, VoteResponse};

/// What a member does after answering a vote request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stand {
    /// Nothing.
    No,
    /// Record the candidate's (higher) term as seen, then stand.
    AdoptThenElect,
    /// Stand (this member's term is the candidate's already).
    Elect,
}

/// Whether member `me` (in `state`, a voter or not), having answered
/// `resp` to `req`, stands at once: only when it refused a candidate whose
/// log is strictly behind its own, in a term not below its own, and it
/// does not lead.
pub(crate) fn decide(
    me: NodeId,
    voter: bool,
    state: ServerState,
    req: &VoteRequest<NodeId>,
    resp: &VoteResponse<NodeId>,
) -> Stand {
    let candidate = req.vote.leader_id();
    let mine = resp.vote.leader_id();
    if resp.vote_granted
        || !voter
        || state == ServerState::Leader
        || candidate.node_id == me
        || resp.last_log_id <= req.last_log_id
        || candidate.term < mine.term
    {
        return Stand::No;
    }
    if candidate.term > mine.term {
        Stand::AdoptThenElect
    } else {
        Stand::Elect
    }
}

/// Whether the node these metrics are of is a voter of its group.
pub(crate) fn is_voter(m: &openraft::RaftMetrics<NodeId, openraft::BasicNode>) -> bool {
    m.membership_config
        .membership()
        .voter_ids()
        .any(|v| v == m.id)
}

/// Called by the `Replication` service after `raft` answered `resp` to
/// `req`: stands for election at once when [`decide`] says so (in a task
/// of its own: the answer is not delayed).
pub(crate) fn after_vote(
    group: &str,
    raft: &Raft,
    req: &VoteRequest<NodeId>,
    resp: &VoteResponse<NodeId>,
) {
    let (me, voter, state) = {
        let m = raft.metrics();
        let m = m.borrow();
        (m.id, is_voter(&m), m.state)
    };
    let stand = decide(me, voter, state, req, resp);
    if stand == Stand::No {
        return;
    }
    let (raft, group) = (raft.clone(), group.to_owned());
    let (vote, mine) = (req.vote, resp.last_log_id);
    let theirs = req.last_log_id;
    tokio::spawn(async move {
        if stand == Stand::AdoptThenElect {
            match raft.vote(VoteRequest::new(vote, mine)).await {
                Ok(r) if r.vote_granted => {}
                // A live leader's lease, or a newer vote meanwhile: stay.
                _ => return,
            }
        }
        tracing::info!(
            %group,
            candidate = %vote,
            candidate_last_log = ?theirs.map(|l| l.index),
            my_last_log = ?mine.map(|l| l.index),
            "refused a candidate whose log is behind this member's: standing for election at once"
        );
        if let Err(e) = raft.trigger().elect().await {
            tracing::debug!(%group, error = %e, "cannot stand for election");
        }
    });
}

#[cfg(test)]
mod tests {
    use super::{Stand, decide};
    use openraft::raft::{VoteRequest, VoteResponse};
    use openraft::{CommittedLeaderId, LogId, ServerState, Vote};

    fn log(term: u64, index: u64) -> Option<LogId<u64>> {
        Some(LogId::new(CommittedLeaderId::new(term, 1), index))
    }

    fn req(term: u64, node: u64, last: Option<LogId<u64>>) -> VoteRequest<u64> {
        VoteRequest::new(Vote::new(term, node), last)
    }

    fn resp(vote: Vote<u64>, granted: bool, last: Option<LogId<u64>>) -> VoteResponse<u64> {
        VoteResponse::new(vote, last, granted)
    }

    #[test]
    fn a_follower_with_the_longer_log_takes_the_candidates_term_and_stands() {
        // Follower 1 of the dead leader 3 (term 5), candidate 2 in term 6
        // holding less.
        let r = req(6, 2, log(5, 99));
        let a = resp(Vote::new_committed(5, 3), false, log(5, 100));
        assert_eq!(
            decide(1, true, ServerState::Follower, &r, &a),
            Stand::AdoptThenElect
        );
        // Already a candidate in that term itself (a split): one term up.
        let a = resp(Vote::new(6, 1), false, log(5, 100));
        assert_eq!(
            decide(1, true, ServerState::Candidate, &r, &a),
            Stand::Elect
        );
    }

    #[test]
    fn nothing_happens_otherwise() {
        let r = req(6, 2, log(5, 99));
        // The candidate's log is as long (refused for another reason: a
        // lease, a vote given), or longer.
        for mine in [log(5, 99), log(5, 98), log(4, 120), None] {
            let a = resp(Vote::new_committed(5, 3), false, mine);
            assert_eq!(decide(1, true, ServerState::Follower, &r, &a), Stand::No);
        }
        let longer = resp(Vote::new_committed(5, 3), false, log(5, 100));
        // Granted; a leader; a learner; its own request; a stale term.
        let granted = resp(Vote::new(6, 2), true, log(5, 100));
        assert_eq!(
            decide(1, true, ServerState::Follower, &r, &granted),
            Stand::No
        );
        assert_eq!(decide(1, true, ServerState::Leader, &r, &longer), Stand::No);
        assert_eq!(
            decide(1, false, ServerState::Learner, &r, &longer),
            Stand::No
        );
        assert_eq!(
            decide(2, true, ServerState::Candidate, &r, &longer),
            Stand::No
        );
        let newer = resp(Vote::new_committed(7, 3), false, log(5, 100));
        assert_eq!(
            decide(1, true, ServerState::Follower, &r, &newer),
            Stand::No
        );
    }
}
