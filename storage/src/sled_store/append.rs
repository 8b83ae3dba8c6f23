//! Appending a producer batch: its entries, cut into frames per segment
//! tree, and the producer's sequence id, written so that a crash keeps all
//! of them or none (one sled batch when the entries go to one tree and no
//! sequence id goes with them, one transaction over the segment trees and
//! `prodseq` otherwise).

use super::codec::{be, seal};
use super::frame;
use super::*;

/// A segment tree and the sealed frames (key, value) going into it.
type SegmentWrites = (Tree, Vec<([u8; 8], Vec<u8>)>);

impl SledStorage {
    pub(super) fn append_atomically(
        &self,
        topic: &str,
        first_id: u64,
        entries: &[Vec<u8>],
        producer: Option<(&str, u64)>,
    ) -> Result<()> {
        // The values to write, per segment tree (a frame never spans two);
        // runs of at most `frame::MAX_VALUE` bytes keep sled's leaves off
        // its blob files. Encoded before any write: a transaction's closure
        // may re-run.
        let mut segments: Vec<SegmentWrites> = Vec::new();
        let mut id = first_id;
        let mut rest = entries;
        while !rest.is_empty() {
            let seg = id / self.segment_entries;
            let room = ((seg + 1) * self.segment_entries - id) as usize;
            let (now, later) = rest.split_at(room.min(rest.len()));
            let mut values = Vec::new();
            for run in frame::runs(now) {
                values.push((be(id), seal(&be(id), &frame::encode(run))));
                id += run.len() as u64;
            }
            segments.push((self.segment(topic, seg)?, values));
            rest = later;
        }
        let sequence = producer.map(|(name, seq)| {
            let key = format!("{topic}\0{name}").into_bytes();
            let value = seal(&key, &be(seq));
            (key, value)
        });
        // The common case, one segment and no producer state: one sled
        // batch, which a crash keeps whole or drops whole.
        if let ([(tree, values)], None) = (segments.as_slice(), &sequence) {
            if let [(k, v)] = values.as_slice() {
                tree.insert(k, v.as_slice())?;
                return Ok(());
            }
            let mut batch = Batch::default();
            for (k, v) in values {
                batch.insert(k, v.as_slice());
            }
            tree.apply_batch(batch)?;
            return Ok(());
        }
        // Otherwise the segment trees and the producer's sequence id in one
        // transaction: after a crash the batch is there whole with its
        // sequence id, or not at all (issue #28: a resend of a message
        // whose entry survived without its sequence id was stored twice).
        let mut trees: Vec<Tree> = segments.iter().map(|(t, _)| t.clone()).collect();
        trees.push(self.prodseq.clone());
        // A failpoint inside the transaction cannot flush (sled's flush
        // waits on the transaction); it flushes everything before it here,
        // and the transaction's own writes are staged, not yet logged.
        for step in ["publish.append.first_segment", "publish.append.entries"] {
            if crate::util::failpoint_armed(step) {
                self.db.flush()?;
            }
        }
        let result = trees.as_slice().transaction(|t| {
            for (i, (_, values)) in segments.iter().enumerate() {
                for (k, v) in values {
                    t[i].insert(k, v.as_slice())?;
                }
                if i + 1 < segments.len() {
                    crate::util::failpoint("publish.append.first_segment");
                }
            }
            crate::util::failpoint("publish.append.entries");
            if let Some((k, v)) = &sequence {
                t[segments.len()].insert(k.as_slice(), v.as_slice())?;
            }
            Ok::<_, ConflictableTransactionError<StorageError>>(())
        });
        match result {
            Ok(()) => {}
            Err(TransactionError::Abort(e)) => return Err(e),
            Err(TransactionError::Storage(e)) => return Err(e.into()),
        }
        self.crash_point("publish.append.sequence");
        Ok(())
    }

    /// Flushes sled and waits for it (for test failpoints: what a
    /// concurrent writer's flush could make durable at that instant).
    pub(crate) fn flush_blocking(&self) {
        let _ = self.db.flush();
    }

    /// A test failpoint on the publish path: when `RICOCHET_FAILPOINT`
    /// names `name`, makes what is written so far durable (as a concurrent
    /// writer's flush could at that instant) and aborts.
    fn crash_point(&self, name: &str) {
        if crate::util::failpoint_armed(name) {
            self.flush_blocking();
            crate::util::failpoint(name);
        }
    }
}
