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
//! [`ReplicaNode::submit`]: ricochet_replication::ReplicaNode::submit

use super::{PartitionCommand, PartitionReply, ReplicatedPartition};
use futures::StreamExt;
use futures::stream::FuturesOrdered;
use ricochet_replication::{decode, encode_sized};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch};

/// Most commands proposed and not yet answered at once.
pub(super) const MAX_IN_FLIGHT: usize = 512;

/// A command's outcome: its reply, or why it failed.
pub(super) type Outcome = Result<PartitionReply, String>;

struct Queued {
    seq: u64,
    command: Vec<u8>,
    reply: Option<oneshot::Sender<Outcome>>,
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
        let command = encode_sized(command, size_hint(command)).map_err(|e| e.to_string())?;
        self.submit_encoded(command, reply, raft)
    }

    /// [`Pipeline::submit`] of a command encoded already (a
    /// [`PartitionCommand`]'s CBOR).
    pub(super) fn submit_encoded(
        &self,
        command: Vec<u8>,
        reply: Option<oneshot::Sender<Outcome>>,
        raft: Option<&tokio::runtime::Handle>,
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
    progress: watch::Sender<Progress>,
}

type Answer = (
    u64,
    Option<oneshot::Sender<Outcome>>,
    Result<ricochet_replication::Result<Vec<u8>>, tokio::time::error::Elapsed>,
);

impl Proposer {
    async fn run(self, mut rx: mpsc::UnboundedReceiver<Queued>) {
        let mut in_flight = FuturesOrdered::new();
        let mut open = true;
        while open || !in_flight.is_empty() {
            tokio::select! {
                biased;
                Some(answer) = in_flight.next(), if !in_flight.is_empty() => {
                    self.answered(answer);
                }
                next = rx.recv(), if open && in_flight.len() < MAX_IN_FLIGHT => {
                    let Some(q) = next else {
                        open = false;
                        continue;
                    };
                    if self.poisoned.load(Ordering::Acquire) {
                        self.fail(q.reply, "an earlier replicated write failed, or this \
                                           replica no longer leads: not proposed".to_owned());
                        continue;
                    }
                    match self.partition.node().submit(q.command).await {
                        Ok(reply) => {
                            let timeout = self.timeout;
                            let (seq, tx) = (q.seq, q.reply);
                            in_flight.push_back(async move {
                                (seq, tx, tokio::time::timeout(timeout, reply).await)
                            });
                        }
                        Err(e) => self.fail(q.reply, e.to_string()),
                    }
                }
            }
        }
    }

    fn answered(&self, (seq, reply, result): Answer) {
        let outcome = match result {
            Ok(Ok(bytes)) => match decode::<PartitionReply>(&bytes) {
                Ok(PartitionReply::Refused(why)) => {
                    Err(format!("the group refused the write: {why}"))
                }
                Ok(r) => Ok(r),
                Err(e) => Err(e.to_string()),
            },
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!(
                "not committed by a majority within {:?}",
                self.timeout
            )),
        };
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
