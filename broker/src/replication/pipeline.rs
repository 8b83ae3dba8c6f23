//! The write queue of a replicated partition's leader: every command its
//! [`super::ReplicatedStorage`] proposes goes through one queue, in the
//! order the callers submitted them, to one task that hands them to the
//! Raft core without waiting for each commit ([`ReplicaNode::submit`]):
//! up to [`MAX_IN_FLIGHT`] commands are in flight at once, and the leader
//! appends the entries that arrived together in one append (one flush) and
//! replicates them in one message. Their replies come back in log order,
//! and `done` (the highest sequence number such that it and every command
//! before it were committed and applied here) moves forward in that order.
//!
//! A command that fails (refused at apply, not committed within the
//! timeout, the node no longer leading) poisons the queue: the commands
//! behind it are failed without being proposed, and every wait for them
//! fails (the topic is then opened again from what the group applied).
//!
//! Coalescing: once every member of the group advertises
//! [`super::gate::COALESCED`] ([`Pipeline::set_coalescing`]), the commands
//! queued while [`ENTRIES_IN_FLIGHT`] entries are in flight are proposed
//! together as one [`PartitionCommand::Sequence`] (up to [`MAX_COALESCED`]
//! commands, [`MAX_COALESCED_BYTES`]), so one Raft entry — one append and
//! one flush on the leader, one replication round — carries several
//! client batches. Each command keeps its own reply and outcome, exactly
//! as if it had been an entry of its own: the entry's
//! [`PartitionReply::Each`] is split, and the replies go through the same
//! answer in the same order. A `Publish` is always proposed alone (its
//! anonymous sequence ids derive from the entry's index).
//!
//! [`ReplicaNode::submit`]: ricochet_replication::ReplicaNode::submit

use super::{PartitionCommand, PartitionReply, ReplicatedPartition, SequenceRef};
use futures::StreamExt;
use futures::stream::FuturesOrdered;
use ricochet_replication::{decode, encode_sized};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch};

/// Most commands proposed and not yet answered at once.
pub(super) const MAX_IN_FLIGHT: usize = 512;

/// Most entries proposed and not yet answered at once while coalescing:
/// what comes meanwhile waits in the queue and goes in the next entry.
/// `RICOCHET_RAFT_ENTRIES_IN_FLIGHT` overrides it (1 to 512; for
/// measurements).
pub(super) const ENTRIES_IN_FLIGHT: usize = 4;

/// Most commands in one coalesced entry.
pub(super) const MAX_COALESCED: usize = 64;

/// A coalesced entry takes no more command once it holds this many bytes.
pub(super) const MAX_COALESCED_BYTES: usize = 4 << 20;

/// [`ENTRIES_IN_FLIGHT`], or its override.
fn entries_in_flight() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        std::env::var("RICOCHET_RAFT_ENTRIES_IN_FLIGHT")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|n| (1..=MAX_IN_FLIGHT).contains(n))
            .unwrap_or(ENTRIES_IN_FLIGHT)
    })
}

/// A command's outcome: its reply, or why it failed.
pub(super) type Outcome = Result<PartitionReply, String>;

struct Queued {
    seq: u64,
    command: Vec<u8>,
    reply: Option<oneshot::Sender<Outcome>>,
    /// Never coalesced (a `Publish`).
    alone: bool,
}

/// How far the queue got.
#[derive(Debug, Clone, Copy, Default)]
struct Progress {
    /// Every command up to this sequence number was committed and applied.
    done: u64,
    /// A command failed: none after it will be.
    failed: bool,
}

#[derive(Debug)]
struct Queue {
    tx: mpsc::UnboundedSender<Queued>,
    last_seq: u64,
}

/// One partition's write queue (see the module).
#[derive(Debug)]
pub(super) struct Pipeline {
    partition: Arc<ReplicatedPartition>,
    timeout: Duration,
    poisoned: Arc<AtomicBool>,
    /// Every member applies a `Sequence`: queued commands may be coalesced.
    coalesce: Arc<AtomicBool>,
    /// The coalesced entries' counters, once named ([`Pipeline::count_as`]).
    counters: std::sync::OnceLock<crate::metrics::RaftCounters>,
    queue: Mutex<Option<Queue>>,
    progress: watch::Sender<Progress>,
}

impl Pipeline {
    /// The group this queue proposes to.
    pub(super) fn partition(&self) -> &Arc<ReplicatedPartition> {
        &self.partition
    }

    /// A queue proposing to `partition`'s group; a command not committed
    /// within `timeout` of its proposal fails. `poisoned` is set when one
    /// fails.
    pub(super) fn new(
        partition: Arc<ReplicatedPartition>,
        timeout: Duration,
        poisoned: Arc<AtomicBool>,
    ) -> Self {
        Self {
            partition,
            timeout,
            poisoned,
            coalesce: Arc::default(),
            counters: std::sync::OnceLock::new(),
            queue: Mutex::new(None),
            progress: watch::Sender::new(Progress::default()),
        }
    }

    /// Queues `command` behind every command submitted before; its outcome
    /// goes to `reply`, if given. Returns its sequence number. The task
    /// proposing them starts on `raft` (else the caller's runtime) at the
    /// first submit.
    pub(super) fn submit(
        &self,
        command: &PartitionCommand,
        reply: Option<oneshot::Sender<Outcome>>,
        raft: Option<&tokio::runtime::Handle>,
    ) -> Result<u64, String> {
        let alone = matches!(command, PartitionCommand::Publish(_));
        let command = encode_sized(command, size_hint(command)).map_err(|e| e.to_string())?;
        self.queue(command, reply, raft, alone)
    }

    /// [`Pipeline::submit`] of a command encoded already (a
    /// [`PartitionCommand`]'s CBOR, not a `Publish`).
    pub(super) fn submit_encoded(
        &self,
        command: Vec<u8>,
        reply: Option<oneshot::Sender<Outcome>>,
        raft: Option<&tokio::runtime::Handle>,
    ) -> Result<u64, String> {
        self.queue(command, reply, raft, false)
    }

    /// Whether queued commands may be coalesced into one entry (every
    /// member of the group advertises [`super::gate::COALESCED`]); off
    /// until set. Returns the previous setting.
    pub(super) fn set_coalescing(&self, on: bool) -> bool {
        self.coalesce.swap(on, Ordering::AcqRel)
    }

    /// Counts this queue's coalesced entries in `topic`'s series (see
    /// [`crate::metrics::RaftCounters`]); the first call wins.
    pub(super) fn count_as(&self, topic: &str) {
        let _ = self.counters.set(crate::metrics::RaftCounters::new(topic));
    }

    fn queue(
        &self,
        command: Vec<u8>,
        reply: Option<oneshot::Sender<Outcome>>,
        raft: Option<&tokio::runtime::Handle>,
        alone: bool,
    ) -> Result<u64, String> {
        if self.poisoned.load(Ordering::Acquire) {
            return Err(
                "this replica's topic is being reopened or no longer leads; write again".into(),
            );
        }
        let mut queue = crate::util::lock(&self.queue);
        if queue.is_none() {
            *queue = Some(self.start(raft)?);
        }
        let Some(q) = queue.as_mut() else {
            return Err("the write queue did not start".into());
        };
        let seq = q.last_seq + 1;
        q.tx.send(Queued {
            seq,
            command,
            reply,
            alone,
        })
        .map_err(|_| "the write queue ended (the group stopped here)".to_owned())?;
        q.last_seq = seq;
        Ok(seq)
    }

    fn start(&self, raft: Option<&tokio::runtime::Handle>) -> Result<Queue, String> {
        let handle = match raft {
            Some(h) => h.clone(),
            None => tokio::runtime::Handle::try_current()
                .map_err(|_| "a replicated write outside a tokio runtime".to_owned())?,
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let task = Proposer {
            partition: self.partition.clone(),
            timeout: self.timeout,
            poisoned: self.poisoned.clone(),
            coalesce: self.coalesce.clone(),
            counters: self.counters.get().cloned(),
            progress: self.progress.clone(),
        };
        handle.spawn(task.run(rx));
        Ok(Queue { tx, last_seq: 0 })
    }

    /// The sequence number of the last command submitted (0: none).
    pub(super) fn last_submitted(&self) -> u64 {
        crate::util::lock(&self.queue)
            .as_ref()
            .map_or(0, |q| q.last_seq)
    }

    /// Waits until every command up to `seq` was committed and applied
    /// here; fails once one of them failed.
    pub(super) async fn wait_for(&self, seq: u64) -> Result<(), String> {
        let mut rx = self.progress.subscribe();
        let p = *rx
            .wait_for(|p| p.done >= seq || p.failed)
            .await
            .map_err(|_| "the write queue ended".to_owned())?;
        if p.done >= seq {
            Ok(())
        } else {
            Err("an earlier replicated write failed; the topic is being reopened".into())
        }
    }
}

/// About how many bytes `command` takes encoded: a batch's encoding is
/// written into a buffer of that size at once rather than grown.
fn size_hint(command: &PartitionCommand) -> usize {
    match command {
        PartitionCommand::Append(b) => super::append_size_hint(b.entries.iter().map(|e| e.len())),
        PartitionCommand::Publish(b) => {
            b.messages
                .iter()
                .map(|m| m.payload.len() + m.key.len() + 96)
                .sum::<usize>()
                + 256
        }
        _ => 0,
    }
}

/// The task behind a [`Pipeline`].
struct Proposer {
    partition: Arc<ReplicatedPartition>,
    timeout: Duration,
    poisoned: Arc<AtomicBool>,
    coalesce: Arc<AtomicBool>,
    counters: Option<crate::metrics::RaftCounters>,
    progress: watch::Sender<Progress>,
}

/// The commands of one proposed entry (sequence number and reply each),
/// and the entry's outcome.
type Answer = (
    Vec<(u64, Option<oneshot::Sender<Outcome>>)>,
    Result<ricochet_replication::Result<Vec<u8>>, tokio::time::error::Elapsed>,
);

/// The entries proposed and not yet answered, in log order.
type InFlight = FuturesOrdered<futures::future::BoxFuture<'static, Answer>>;

/// The commands to propose as one entry: `first`, then (when `coalesce`
/// and neither is a `Publish`) those queued behind it, up to
/// [`MAX_COALESCED`] and [`MAX_COALESCED_BYTES`]. A `Publish` met goes to
/// `held`, the next to propose; `false` in the second place: the queue
/// closed.
fn take_group(
    first: Queued,
    rx: &mut mpsc::UnboundedReceiver<Queued>,
    coalesce: bool,
    held: &mut Option<Queued>,
) -> (Vec<Queued>, bool) {
    let mut bytes = first.command.len();
    let mut group = vec![first];
    if !coalesce || group[0].alone {
        return (group, true);
    }
    while group.len() < MAX_COALESCED && bytes < MAX_COALESCED_BYTES {
        match rx.try_recv() {
            Ok(q) if q.alone => {
                *held = Some(q);
                break;
            }
            Ok(q) => {
                bytes += q.command.len();
                group.push(q);
            }
            Err(mpsc::error::TryRecvError::Empty) => break,
            Err(mpsc::error::TryRecvError::Disconnected) => return (group, false),
        }
    }
    (group, true)
}

impl Proposer {
    async fn run(self, mut rx: mpsc::UnboundedReceiver<Queued>) {
        let mut in_flight: InFlight = FuturesOrdered::new();
        let mut open = true;
        // A `Publish` taken from the queue behind a coalesced group.
        let mut held: Option<Queued> = None;
        while open || held.is_some() || !in_flight.is_empty() {
            let coalesce = self.coalesce.load(Ordering::Acquire);
            let limit = if coalesce {
                entries_in_flight()
            } else {
                MAX_IN_FLIGHT
            };
            let room = in_flight.len() < limit;
            if room && let Some(q) = held.take() {
                self.propose(vec![q], &mut in_flight).await;
                continue;
            }
            tokio::select! {
                biased;
                Some(answer) = in_flight.next(), if !in_flight.is_empty() => {
                    self.answered(answer);
                }
                next = rx.recv(), if open && room => {
                    let Some(q) = next else {
                        open = false;
                        continue;
                    };
                    let (group, still_open) = take_group(q, &mut rx, coalesce, &mut held);
                    open = still_open;
                    self.propose(group, &mut in_flight).await;
                }
            }
        }
    }

    /// Proposes `group` as one entry (a `Sequence` when it holds more than
    /// one command), its answer pushed onto `in_flight`.
    async fn propose(&self, group: Vec<Queued>, in_flight: &mut InFlight) {
        let mut commands = Vec::with_capacity(group.len());
        let mut waiters = Vec::with_capacity(group.len());
        for q in group {
            commands.push(q.command);
            waiters.push((q.seq, q.reply));
        }
        if self.poisoned.load(Ordering::Acquire) {
            for (_, tx) in waiters {
                self.fail(
                    tx,
                    "an earlier replicated write failed, or this replica no longer leads: \
                     not proposed"
                        .to_owned(),
                );
            }
            return;
        }
        let entry = if commands.len() == 1 {
            commands.pop().unwrap_or_default()
        } else {
            let sequence = SequenceRef(&commands);
            match encode_sized(&sequence, sequence.size_hint()) {
                Ok(e) => e,
                Err(e) => {
                    for (_, tx) in waiters {
                        self.fail(tx, e.to_string());
                    }
                    return;
                }
            }
        };
        let carried = commands.len();
        drop(commands);
        match self.partition.node().submit(entry).await {
            Ok(reply) => {
                if carried > 1
                    && let Some(c) = &self.counters
                {
                    c.coalesced(carried);
                }
                let timeout = self.timeout;
                in_flight.push_back(Box::pin(async move {
                    (waiters, tokio::time::timeout(timeout, reply).await)
                }));
            }
            Err(e) => {
                for (_, tx) in waiters {
                    self.fail(tx, e.to_string());
                }
            }
        }
    }

    /// An entry's answer, to each of its commands in order.
    fn answered(&self, (mut waiters, result): Answer) {
        let bytes = match result {
            Ok(Ok(bytes)) => Ok(bytes),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!(
                "not committed by a majority within {:?}",
                self.timeout
            )),
        };
        if waiters.len() == 1
            && let Some((seq, tx)) = waiters.pop()
        {
            self.settle(seq, tx, bytes);
            return;
        }
        let replies = bytes.and_then(|b| match decode::<PartitionReply>(&b) {
            Ok(PartitionReply::Each(r)) if r.len() == waiters.len() => Ok(r),
            Ok(other) => Err(format!(
                "a coalesced entry of {} commands answered {other:?}",
                waiters.len()
            )),
            Err(e) => Err(e.to_string()),
        });
        match replies {
            Ok(replies) => {
                for ((seq, tx), r) in waiters.into_iter().zip(replies) {
                    self.settle(seq, tx, Ok(r.into_vec()));
                }
            }
            Err(why) => {
                for (seq, tx) in waiters {
                    self.settle(seq, tx, Err(why.clone()));
                }
            }
        }
    }

    /// One command's outcome: its reply's bytes, or why it has none.
    fn settle(
        &self,
        seq: u64,
        reply: Option<oneshot::Sender<Outcome>>,
        bytes: Result<Vec<u8>, String>,
    ) {
        let outcome = bytes.and_then(|b| match decode::<PartitionReply>(&b) {
            Ok(PartitionReply::Refused(why)) => Err(format!("the group refused the write: {why}")),
            Ok(r) => Ok(r),
            Err(e) => Err(e.to_string()),
        });
        match outcome {
            Ok(r) => {
                if !self.progress.borrow().failed {
                    self.progress.send_modify(|p| p.done = p.done.max(seq));
                }
                if let Some(tx) = reply {
                    let _ = tx.send(Ok(r));
                }
            }
            Err(e) => self.fail(reply, e),
        }
    }

    fn fail(&self, reply: Option<oneshot::Sender<Outcome>>, why: String) {
        self.poisoned.store(true, Ordering::Release);
        self.progress.send_modify(|p| p.failed = true);
        if let Some(tx) = reply {
            let _ = tx.send(Err(why));
        }
    }
}
