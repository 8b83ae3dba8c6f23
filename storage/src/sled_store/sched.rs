//! The retry schedule in chunks: schedule entries are grouped per due-time
//! bucket, subscription, tier and run of entry ids into one sled value each
//! (tree `sched`), instead of one sled key per entry. sled keeps some 45
//! bytes of page metadata in memory per key, rebuilds its page table for
//! every page when it opens, and a scan pays per key; millions of parked
//! retries were millions of keys, now they are some `n / CHUNK_ENTRIES`.
//!
//! A chunk's key is computed from the entry's key alone ([`chunk_key`]:
//! bucket start, subscription, tier, entry id / [`CHUNK_ENTRIES`]), because
//! sled's transactions can only get, insert and remove single keys: a write
//! reads its chunk, changes it and writes it back inside the transaction
//! that also writes the failure record and the tier move, so they stay one
//! atomic write as before (sled's transactions are serialized with every
//! other write). A chunk holds at most [`CHUNK_ENTRIES`] entries of one
//! due-time bucket, each with its exact due time and its failure record
//! inline when that is at most [`INLINE_MAX`] bytes, else in `sched_big`
//! under the entry's own 25-byte schedule key: a chunk value stays under
//! `CHUNK_ENTRIES * (INLINE_MAX + 46) + 5` bytes (about 36 KiB), well under
//! sled's blob threshold, whatever the burst (10 000 nacks due at once are
//! some 160 chunks). Every chunk carries its entry count, and each entry
//! the head of its record (count, hold: what a subscription's start needs,
//! read without decoding the record); it is sealed with a CRC-32C of key
//! and body like every other value. Item headers are varints, due time and
//! entry id as differences from the previous item's ([`CHUNK_V2`], some 7
//! bytes for a parked retry); chunks stored with the fixed 33-byte headers
//! of [`CHUNK_V1`] read as before and are written in the new layout when
//! next changed.
//!
//! Upgrade: a store written before keeps one key per entry in `schedule`;
//! [`SledStorage::upgrade_schedule`] moves them into chunks at open, in one
//! pass over the old keys: chunks are written in rounds of [`UPGRADE_ROUND`]
//! entries (plain sled batches), made durable, and only then is the old
//! tree dropped. A crash before the clear leaves entries in both layouts;
//! the next open converts them again (an entry written into its chunk
//! twice replaces itself) and clears, so each entry ends up in its chunk
//! once. (It used transactions of 1 024 entries, each removing what it
//! added, and took 176 s at 5 million entries.)

use super::codec::{put_delta, read_be, seal, take_delta, unseal};
use super::*;
use prost::encoding::{decode_varint, encode_varint};
use sled::transaction::TransactionalTree;

/// Width of a due-time bucket, ms.
pub(super) const BUCKET_MS: u64 = 1_000;
/// Entry ids per chunk (a chunk holds ids `n * CHUNK_ENTRIES ..`).
pub(super) const CHUNK_ENTRIES: u64 = 64;
/// Largest failure record kept inside its chunk; larger ones go to `sched_big`.
pub(super) const INLINE_MAX: usize = 512;
/// Entries per transaction where many are written or removed at once (a
/// topic's transfer, a subscription's delete).
pub(super) const TX_BATCH: usize = 1024;
/// Legacy entries converted per round (one batch of chunks) by the upgrade
/// (in unit tests a small round, so that their stores take several).
pub(super) const UPGRADE_ROUND: usize = if cfg!(test) { 1024 } else { 65_536 };

/// The first chunk layout: fixed-width item headers ([`ITEM_HEADER`]).
const CHUNK_V1: u8 = 1;
/// The layout written now: item headers as varints, due time and entry id
/// as differences from the previous item's ([`encode`](Chunk::encode)).
const CHUNK_V2: u8 = 2;

/// Result inside a sled transaction.
pub(super) type TxResult<T> = std::result::Result<T, ConflictableTransactionError<StorageError>>;

fn abort(e: StorageError) -> ConflictableTransactionError<StorageError> {
    ConflictableTransactionError::Abort(e)
}

/// The chunk an entry belongs in.
pub(super) fn chunk_key(k: &ScheduleKey) -> [u8; 25] {
    let mut out = [0u8; 25];
    out[..8].copy_from_slice(&be(k.due_ms - k.due_ms % BUCKET_MS));
    out[8..16].copy_from_slice(&be(k.message.sub_id));
    out[16] = k.message.tier as u8;
    out[17..].copy_from_slice(&be(k.message.entry_id / CHUNK_ENTRIES));
    out
}

/// The subscription a chunk key names (`u64::MAX` when malformed).
pub(super) fn chunk_sub(ck: &[u8]) -> u64 {
    ck.get(8..16)
        .filter(|_| ck.len() == 25)
        .and_then(|b| read_be(b).ok())
        .unwrap_or(u64::MAX)
}

/// Where an entry's failure record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Slot {
    /// No record (an entry written by `put_schedule`).
    Empty = 0,
    /// In the chunk.
    Inline = 1,
    /// In `sched_big` under the entry's schedule key.
    Big = 2,
}

/// One entry of a chunk: due time, entry id, where its record is, the
/// record's head (count and hold, kept beside it so that a start gathers
/// heads without decoding records), and the record (inline only).
#[derive(Debug, Clone)]
pub(super) struct Item {
    pub due_ms: u64,
    pub entry_id: u64,
    pub slot: Slot,
    pub head: FailureHead,
    pub body: Vec<u8>,
}

/// An entry of a stored chunk, borrowed from its value.
#[derive(Debug, Clone, Copy)]
pub(super) struct ItemRef<'a> {
    pub due_ms: u64,
    pub entry_id: u64,
    pub slot: Slot,
    pub head: FailureHead,
    pub body: &'a [u8],
}

/// Bytes of an item before its record in a [`CHUNK_V1`] chunk: due time,
/// entry id, slot, count, hold, record length.
const ITEM_HEADER: usize = 8 + 8 + 1 + 4 + 8 + 4;
/// The fewest bytes of an item header in a [`CHUNK_V2`] chunk: six
/// varints of one byte.
const ITEM_HEADER_V2_MIN: usize = 6;

fn slot_of(b: u64) -> Option<Slot> {
    match b {
        0 => Some(Slot::Empty),
        1 => Some(Slot::Inline),
        2 => Some(Slot::Big),
        _ => None,
    }
}

/// Calls `f` with each item of chunk body `body`, in stored order, checking
/// the layout (not the records).
pub(super) fn visit<'a>(body: &'a [u8], mut f: impl FnMut(ItemRef<'a>)) -> Result<()> {
    let bad = || StorageError::Corrupt("bad schedule chunk".into());
    let n = chunk_count(body)?;
    if body[0] == CHUNK_V2 {
        if n > ((body.len() - 5) / ITEM_HEADER_V2_MIN) as u64 {
            return Err(bad());
        }
        let mut rest = &body[5..];
        let varint = |rest: &mut &'a [u8]| decode_varint(rest).map_err(|_| bad());
        let (mut due_ms, mut entry_id) = (0u64, 0u64);
        for _ in 0..n {
            take_delta(&mut rest, &mut due_ms).ok_or_else(bad)?;
            take_delta(&mut rest, &mut entry_id).ok_or_else(bad)?;
            let slot = slot_of(varint(&mut rest)?).ok_or_else(bad)?;
            let count = u32::try_from(varint(&mut rest)?).map_err(|_| bad())?;
            let hold_until_ms = varint(&mut rest)?;
            let len = usize::try_from(varint(&mut rest)?).map_err(|_| bad())?;
            if rest.len() < len || (slot != Slot::Inline && len != 0) {
                return Err(bad());
            }
            f(ItemRef {
                due_ms,
                entry_id,
                slot,
                head: FailureHead {
                    count,
                    hold_until_ms,
                },
                body: &rest[..len],
            });
            rest = &rest[len..];
        }
        return if rest.is_empty() { Ok(()) } else { Err(bad()) };
    }
    // Each item takes at least its header (a chunk may hold more than
    // `CHUNK_ENTRIES` items only when one entry id is scheduled at several
    // times of one bucket, which the broker does not write).
    if n > (body.len() / ITEM_HEADER) as u64 {
        return Err(bad());
    }
    let mut rest = &body[5..];
    for _ in 0..n {
        let h = rest.get(..ITEM_HEADER).ok_or_else(bad)?;
        let slot = match h[16] {
            0 => Slot::Empty,
            1 => Slot::Inline,
            2 => Slot::Big,
            _ => return Err(bad()),
        };
        let word = |at: usize| u64::from_be_bytes(h[at..at + 8].try_into().expect("8 bytes"));
        let count = u32::from_be_bytes(h[17..21].try_into().expect("4 bytes"));
        let len = u32::from_be_bytes(h[29..33].try_into().expect("4 bytes")) as usize;
        rest = &rest[ITEM_HEADER..];
        if rest.len() < len || (slot != Slot::Inline && len != 0) {
            return Err(bad());
        }
        f(ItemRef {
            due_ms: word(0),
            entry_id: word(8),
            slot,
            head: FailureHead {
                count,
                hold_until_ms: word(21),
            },
            body: &rest[..len],
        });
        rest = &rest[len..];
    }
    if !rest.is_empty() {
        return Err(bad());
    }
    Ok(())
}

/// The schedule key of an item of chunk `ck` (`None` when the key is malformed).
pub(super) fn key_of(ck: &[u8], due_ms: u64, entry_id: u64) -> Option<ScheduleKey> {
    Some(ScheduleKey {
        due_ms,
        message: SubMessage {
            sub_id: read_be(ck.get(8..16)?).ok()?,
            tier: TierId::from_byte(*ck.get(16)?)?,
            entry_id,
        },
    })
}

/// A decoded chunk, its items sorted by (due time, entry id).
#[derive(Debug, Clone, Default)]
pub(super) struct Chunk {
    pub items: Vec<Item>,
}

/// The entry count a chunk body records (its header only).
pub(super) fn chunk_count(body: &[u8]) -> Result<u64> {
    match body {
        [CHUNK_V1 | CHUNK_V2, a, b, c, d, ..] => {
            Ok(u64::from(u32::from_be_bytes([*a, *b, *c, *d])))
        }
        _ => Err(StorageError::Corrupt("bad schedule chunk header".into())),
    }
}

impl Chunk {
    pub(super) fn decode(body: &[u8]) -> Result<Self> {
        let mut items = Vec::new();
        visit(body, |i| {
            items.push(Item {
                due_ms: i.due_ms,
                entry_id: i.entry_id,
                slot: i.slot,
                head: i.head,
                body: i.body.to_vec(),
            })
        })?;
        Ok(Self { items })
    }

    /// The stored form ([`CHUNK_V2`]): format byte, `u32` item count, then
    /// per item varints of the due time's and entry id's differences from
    /// the previous item's (zigzag; from 0 for the first), slot, count,
    /// hold and record length, then the record. A parked retry's header
    /// takes some 7 bytes instead of [`CHUNK_V1`]'s 33.
    pub(super) fn encode(&self) -> Vec<u8> {
        let size: usize = self.items.iter().map(|i| 12 + i.body.len()).sum();
        let mut out = Vec::with_capacity(5 + size);
        out.push(CHUNK_V2);
        out.extend_from_slice(&(self.items.len() as u32).to_be_bytes());
        let (mut due_ms, mut entry_id) = (0u64, 0u64);
        for i in &self.items {
            put_delta(&mut out, i.due_ms, &mut due_ms);
            put_delta(&mut out, i.entry_id, &mut entry_id);
            encode_varint(i.slot as u64, &mut out);
            encode_varint(u64::from(i.head.count), &mut out);
            encode_varint(i.head.hold_until_ms, &mut out);
            encode_varint(i.body.len() as u64, &mut out);
            out.extend_from_slice(&i.body);
        }
        out
    }

    /// The [`CHUNK_V1`] form, as chunks were stored before (for tests of
    /// stores written then).
    #[cfg(test)]
    pub(super) fn encode_v1(&self) -> Vec<u8> {
        let mut out = vec![CHUNK_V1];
        out.extend_from_slice(&(self.items.len() as u32).to_be_bytes());
        for i in &self.items {
            out.extend_from_slice(&be(i.due_ms));
            out.extend_from_slice(&be(i.entry_id));
            out.push(i.slot as u8);
            out.extend_from_slice(&i.head.count.to_be_bytes());
            out.extend_from_slice(&be(i.head.hold_until_ms));
            out.extend_from_slice(&(i.body.len() as u32).to_be_bytes());
            out.extend_from_slice(&i.body);
        }
        out
    }

    fn find(&self, due_ms: u64, entry_id: u64) -> std::result::Result<usize, usize> {
        self.items
            .binary_search_by_key(&(due_ms, entry_id), |i| (i.due_ms, i.entry_id))
    }

    /// The schedule key of each item, given its chunk key.
    pub(super) fn keys<'a>(&'a self, ck: &[u8]) -> impl Iterator<Item = (ScheduleKey, &'a Item)> {
        let sub = chunk_sub(ck);
        let tier = ck.get(16).and_then(|b| TierId::from_byte(*b));
        self.items.iter().filter_map(move |i| {
            Some((
                ScheduleKey {
                    due_ms: i.due_ms,
                    message: SubMessage {
                        sub_id: sub,
                        tier: tier?,
                        entry_id: i.entry_id,
                    },
                },
                i,
            ))
        })
    }
}

/// A stored chunk, checked and decoded.
pub(super) fn read_chunk(ck: &[u8], v: &[u8]) -> Result<Chunk> {
    if ck.len() != 25 || TierId::from_byte(ck[16]).is_none() {
        return Err(StorageError::Corrupt(format!(
            "bad schedule chunk key {}",
            codec::show_key(ck)
        )));
    }
    Chunk::decode(unseal(ck, v)?)
}

/// A tree [`SchedWrites`] reads chunks from and writes to: a sled
/// transaction's, or ([`Batched`]) a tree read directly and written by one
/// batch.
pub(super) trait SchedTree {
    fn get(&self, k: &[u8]) -> TxResult<Option<sled::IVec>>;
    fn insert(&self, k: &[u8], v: Vec<u8>) -> TxResult<()>;
    fn remove(&self, k: &[u8]) -> TxResult<()>;
}

impl SchedTree for TransactionalTree {
    fn get(&self, k: &[u8]) -> TxResult<Option<sled::IVec>> {
        Ok(TransactionalTree::get(self, k)?)
    }

    fn insert(&self, k: &[u8], v: Vec<u8>) -> TxResult<()> {
        TransactionalTree::insert(self, k, v)?;
        Ok(())
    }

    fn remove(&self, k: &[u8]) -> TxResult<()> {
        TransactionalTree::remove(self, k)?;
        Ok(())
    }
}

/// A tree outside any transaction: reads see what is stored, writes gather
/// in one batch applied by [`Batched::apply`] (the upgrade's rounds).
pub(super) struct Batched<'a> {
    tree: &'a sled::Tree,
    batch: std::cell::RefCell<sled::Batch>,
}

impl<'a> Batched<'a> {
    pub(super) fn new(tree: &'a sled::Tree) -> Self {
        Self {
            tree,
            batch: Default::default(),
        }
    }

    /// Applies the writes gathered so far (atomically, for this tree).
    pub(super) fn apply(&self) -> Result<()> {
        Ok(self.tree.apply_batch(self.batch.take())?)
    }
}

impl SchedTree for Batched<'_> {
    fn get(&self, k: &[u8]) -> TxResult<Option<sled::IVec>> {
        self.tree
            .get(k)
            .map_err(ConflictableTransactionError::Storage)
    }

    fn insert(&self, k: &[u8], v: Vec<u8>) -> TxResult<()> {
        self.batch.borrow_mut().insert(k, v);
        Ok(())
    }

    fn remove(&self, k: &[u8]) -> TxResult<()> {
        self.batch.borrow_mut().remove(k);
        Ok(())
    }
}

/// The schedule's writes over `sched` and `sched_big`, inside one sled
/// transaction (or, for the upgrade, one round of [`Batched`] writes):
/// chunks are read once, changed in memory and written back by
/// [`SchedWrites::finish`] (an emptied chunk is removed). Made afresh in
/// every run of a transaction's closure.
pub(super) struct SchedWrites<'t, T: SchedTree = TransactionalTree> {
    chunks: &'t T,
    big: &'t T,
    /// The chunks read, each with whether it changed since.
    open: BTreeMap<[u8; 25], (Chunk, bool)>,
}

impl<'t, T: SchedTree> SchedWrites<'t, T> {
    pub(super) fn new(chunks: &'t T, big: &'t T) -> Self {
        Self {
            chunks,
            big,
            open: BTreeMap::new(),
        }
    }

    /// Chunk `ck`, read once; `change` marks it to be written back.
    fn chunk(&mut self, ck: [u8; 25], change: bool) -> TxResult<&mut Chunk> {
        if !self.open.contains_key(&ck) {
            let chunk = match self.chunks.get(&ck)? {
                Some(v) => read_chunk(&ck, &v).map_err(abort)?,
                None => Chunk::default(),
            };
            self.open.insert(ck, (chunk, false));
        }
        let (chunk, changed) = self.open.get_mut(&ck).expect("just inserted");
        *changed |= change;
        Ok(chunk)
    }

    /// Whether the entry is there.
    pub(super) fn contains(&mut self, key: &ScheduleKey) -> TxResult<bool> {
        let chunk = self.chunk(chunk_key(key), false)?;
        Ok(chunk.find(key.due_ms, key.message.entry_id).is_ok())
    }

    /// Removes an entry (and its record); nothing when it is not there.
    pub(super) fn remove(&mut self, key: &ScheduleKey) -> TxResult<()> {
        let ck = chunk_key(key);
        let chunk = self.chunk(ck, false)?;
        if let Ok(at) = chunk.find(key.due_ms, key.message.entry_id) {
            let item = chunk.items.remove(at);
            self.open.get_mut(&ck).expect("read above").1 = true;
            if item.slot == Slot::Big {
                self.big.remove(&key.key())?;
            }
        }
        Ok(())
    }

    /// Writes an entry with record `body` (empty: no record), replacing one
    /// there.
    pub(super) fn insert(&mut self, key: &ScheduleKey, body: &[u8]) -> TxResult<()> {
        let big = body.len() > INLINE_MAX;
        let k = key.key();
        let head = match body {
            [] => FailureHead::default(),
            body => codec::decode_failure_head(body).map_err(abort)?,
        };
        let chunk = self.chunk(chunk_key(key), true)?;
        let item = Item {
            head,
            due_ms: key.due_ms,
            entry_id: key.message.entry_id,
            slot: match (body.is_empty(), big) {
                (true, _) => Slot::Empty,
                (false, false) => Slot::Inline,
                (false, true) => Slot::Big,
            },
            body: if big { Vec::new() } else { body.to_vec() },
        };
        let was_big = match chunk.find(key.due_ms, key.message.entry_id) {
            Ok(at) => std::mem::replace(&mut chunk.items[at], item).slot == Slot::Big,
            Err(at) => {
                chunk.items.insert(at, item);
                false
            }
        };
        if big {
            self.big.insert(&k, seal(&k, body).to_vec())?;
        } else if was_big {
            self.big.remove(&k)?;
        }
        Ok(())
    }

    /// Writes back every chunk that changed (one read only, or a removal
    /// of an entry that was not there, writes nothing); returns how many.
    pub(super) fn finish(self) -> TxResult<usize> {
        let mut written = 0;
        for (ck, (chunk, changed)) in &self.open {
            if !changed {
                continue;
            }
            written += 1;
            if chunk.items.is_empty() {
                self.chunks.remove(ck)?;
            } else {
                self.chunks.insert(ck, seal(ck, &chunk.encode()).to_vec())?;
            }
        }
        Ok(written)
    }
}

/// A transaction's outcome as the engine's result.
pub(super) fn tx_result<T>(r: std::result::Result<T, TransactionError<StorageError>>) -> Result<T> {
    match r {
        Ok(v) => Ok(v),
        Err(TransactionError::Abort(e)) => Err(e),
        Err(TransactionError::Storage(e)) => Err(e.into()),
    }
}

impl SledStorage {
    /// The record of schedule entry `key` (empty for none), or `None` when
    /// there is no such entry.
    pub(super) fn sched_get(&self, key: &ScheduleKey) -> Result<Option<Vec<u8>>> {
        let ck = chunk_key(key);
        let Some(v) = self.sched.get(ck)? else {
            return Ok(None);
        };
        let chunk = read_chunk(&ck, &v)?;
        let Ok(at) = chunk.find(key.due_ms, key.message.entry_id) else {
            return Ok(None);
        };
        let item = &chunk.items[at];
        match item.slot {
            Slot::Empty => Ok(Some(Vec::new())),
            Slot::Inline => Ok(Some(item.body.clone())),
            Slot::Big => self.big_record(key).map(Some),
        }
    }

    /// [`Self::sched_get`] of each of `keys`, in the order asked: the keys
    /// of one chunk are taken together, so each chunk is read, checked and
    /// decoded once for all of them (a burst of retries due together is
    /// some `n / CHUNK_ENTRIES` chunks).
    pub(super) fn sched_get_many(&self, keys: &[ScheduleKey]) -> Result<Vec<Option<Vec<u8>>>> {
        let mut order: Vec<(usize, [u8; 25])> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| (i, chunk_key(k)))
            .collect();
        order.sort_unstable_by_key(|a| a.1);
        let mut out = vec![None; keys.len()];
        let mut at = 0;
        while at < order.len() {
            let ck = order[at].1;
            let run = order[at..].iter().take_while(|(_, c)| *c == ck).count();
            let group = &order[at..at + run];
            at += run;
            let Some(v) = self.sched.get(ck)? else {
                continue;
            };
            let chunk = read_chunk(&ck, &v)?;
            for &(i, _) in group {
                let key = &keys[i];
                let Ok(found) = chunk.find(key.due_ms, key.message.entry_id) else {
                    continue;
                };
                let item = &chunk.items[found];
                out[i] = Some(match item.slot {
                    Slot::Empty => Vec::new(),
                    Slot::Inline => item.body.clone(),
                    Slot::Big => self.big_record(key)?,
                });
            }
        }
        Ok(out)
    }

    /// The record of a schedule entry kept in `sched_big`.
    pub(super) fn big_record(&self, key: &ScheduleKey) -> Result<Vec<u8>> {
        let k = key.key();
        match self.sched_big.get(k)? {
            Some(v) => Ok(unseal(&k, &v)?.to_vec()),
            None => Err(StorageError::Corrupt(format!(
                "schedule entry {} without its record",
                codec::show_key(&k)
            ))),
        }
    }

    /// Every stored chunk whose bucket starts in `[from, to)` (`None`:
    /// open), as sled gives it: key and sealed body.
    pub(super) fn raw_chunks(
        &self,
        from: Option<u64>,
        to: Option<u64>,
    ) -> impl Iterator<Item = Result<(sled::IVec, sled::IVec)>> + '_ {
        use std::ops::Bound;
        let lower = from.map_or(Bound::Unbounded, |d| Bound::Included(be(d)));
        let upper = to.map_or(Bound::Unbounded, |d| Bound::Excluded(be(d)));
        self.sched
            .range::<[u8; 8], _>((lower, upper))
            .map(|kv| kv.map_err(StorageError::from))
    }

    /// Every chunk whose bucket starts in `[from, to)` (`None`: open), checked.
    pub(super) fn chunks_in(
        &self,
        from: Option<u64>,
        to: Option<u64>,
    ) -> impl Iterator<Item = Result<([u8; 25], Chunk)>> + '_ {
        use std::ops::Bound;
        let lower = from.map_or(Bound::Unbounded, |d| Bound::Included(be(d)));
        let upper = to.map_or(Bound::Unbounded, |d| Bound::Excluded(be(d)));
        self.sched.range::<[u8; 8], _>((lower, upper)).map(|kv| {
            let (k, v) = kv?;
            let chunk = read_chunk(&k, &v)?;
            let ck: [u8; 25] = k.as_ref().try_into().expect("checked length");
            Ok((ck, chunk))
        })
    }

    /// [`SubscriptionStore::held_heads_due`]: the heads stored beside the
    /// main-tier schedule entries of `sub_id` due in `(after_ms, to_ms]`,
    /// read from the chunks of those buckets without decoding the records
    /// (checksums checked); a record under its own key in `failures` wins.
    pub(super) fn sched_heads_due(
        &self,
        sub_id: u64,
        after_ms: u64,
        to_ms: u64,
    ) -> Result<Vec<(u64, FailureHead)>> {
        let mut out = Vec::new();
        if to_ms <= after_ms {
            return Ok(out);
        }
        let from = after_ms + 1;
        let range = self.raw_chunks(Some(from - from % BUCKET_MS), Some(to_ms.saturating_add(1)));
        for kv in range {
            let (ck, v) = kv?;
            if chunk_sub(&ck) != sub_id || ck.get(16) != Some(&(TierId::Main as u8)) {
                continue;
            }
            visit(unseal(&ck, &v)?, |i| {
                if i.slot != Slot::Empty && i.due_ms > after_ms && i.due_ms <= to_ms {
                    out.push((i.entry_id, i.head));
                }
            })?;
        }
        for (entry_id, head) in &mut out {
            let key = SubMessage {
                sub_id,
                tier: TierId::Main,
                entry_id: *entry_id,
            }
            .key();
            if let Some(v) = self.failures.get(key)? {
                *head = codec::decode_failure_head(unseal(&key, &v)?)?;
            }
        }
        Ok(out)
    }

    /// One transaction over `sched` and `sched_big`.
    pub(super) fn sched_tx(&self, f: impl Fn(&mut SchedWrites<'_>) -> TxResult<()>) -> Result<()> {
        let written = tx_result((&self.sched, &self.sched_big).transaction(|(chunks, big)| {
            let mut w = SchedWrites::new(chunks, big);
            f(&mut w)?;
            w.finish()
        }))?;
        self.chunks_written(written);
        Ok(())
    }

    /// Counts `n` chunks written by a committed write.
    pub(super) fn chunks_written(&self, n: usize) {
        tracing::trace!(target: "ricochet::burst", chunks = n, "storage: schedule chunks written");
        self.chunk_writes
            .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
    }

    /// Schedule chunks written (each a whole sled value: a chunk is
    /// rewritten by every write that adds an entry to it or takes one out)
    /// by committed writes since this store opened: what parking a burst
    /// costs in rewrites (`docs/src/parked-retries-memory.md`).
    pub fn schedule_chunk_writes(&self) -> u64 {
        self.chunk_writes.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The upgrade to chunks (see the module's text): one pass over the
    /// legacy `schedule` tree, every entry into its chunk with its record,
    /// the chunks written in rounds of [`UPGRADE_ROUND`] entries; flushed,
    /// then the legacy tree dropped and flushed again; logged when anything
    /// moved. A legacy value that does not read stops the open (as a
    /// damaged value does).
    pub(super) fn upgrade_schedule(&mut self) -> Result<u64> {
        if self.schedule.first()?.is_none() {
            return Ok(0);
        }
        let started = std::time::Instant::now();
        let (chunks, big) = (Batched::new(&self.sched), Batched::new(&self.sched_big));
        let mut moved = 0u64;
        let mut w = SchedWrites::new(&chunks, &big);
        for kv in self.schedule.iter() {
            let (k, v) = kv?;
            let key = ScheduleKey::from_key(&k).ok_or_else(|| {
                StorageError::Corrupt(format!("bad schedule key {}", codec::show_key(&k)))
            })?;
            outside_tx(w.insert(&key, unseal(&k, &v)?))?;
            moved += 1;
            if moved.is_multiple_of(UPGRADE_ROUND as u64) {
                self.chunks_written(outside_tx(w.finish())?);
                // A chunk's big records before the chunk naming them.
                big.apply()?;
                chunks.apply()?;
                w = SchedWrites::new(&chunks, &big);
            }
        }
        self.chunks_written(outside_tx(w.finish())?);
        big.apply()?;
        chunks.apply()?;
        self.sync.flush_blocking(&self.db)?;
        // Every entry is durable in its chunk: the old keys can go. A crash
        // from here leaves some in both layouts, converted again next open.
        crate::util::failpoint("upgrade.schedule.chunks_written");
        // Dropped whole (sled frees its pages; removing a million keys one
        // by one took as long as converting them), then opened empty.
        self.db.drop_tree("schedule")?;
        self.schedule = self.db.open_tree("schedule")?;
        self.sync.flush_blocking(&self.db)?;
        tracing::info!(
            moved,
            chunks = self.sched.len(),
            took_ms = started.elapsed().as_millis() as u64,
            "storage upgraded: the retry schedule's entries moved from one key each into chunks per due-time bucket (once)"
        );
        Ok(moved)
    }
}

/// A [`SchedWrites`] result outside a transaction (the upgrade): an abort's
/// error, or the engine's.
fn outside_tx<T>(r: TxResult<T>) -> Result<T> {
    match r {
        Ok(v) => Ok(v),
        Err(ConflictableTransactionError::Abort(e)) => Err(e),
        Err(ConflictableTransactionError::Storage(e)) => Err(e.into()),
        Err(ConflictableTransactionError::Conflict) => Err(StorageError::Corrupt(
            "a transaction conflict outside any transaction".into(),
        )),
    }
}

#[cfg(test)]
#[path = "sched_tests.rs"]
mod tests;
