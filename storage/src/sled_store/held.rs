//! Held messages in one key each: a message the broker holds in place (a
//! broker-held nack) keeps its failure record as the value of its schedule
//! entry (`schedule`, keyed by the hold's end), not under its own key in
//! `failures`, because sled keeps some 45 bytes of page metadata in memory
//! per stored key and held nacks are what piles up (millions).
//!
//! Where a message's record is: under its own key in `failures` when one is
//! there (a failure that is not held, written by
//! [`SubscriptionStore::put_failures`]), else in the schedule entry of the
//! hold's end (written by [`SubscriptionStore::put_held`] in one
//! transaction that also removes the `failures` key), else in the schedule
//! entry of a retry-tier move. A subscription's start needs the heads
//! (count, hold) of its main-tier records; the schedule is keyed by due
//! time, so they come from one scan of both trees for all subscriptions,
//! kept in a [`HeadCache`] that each subscription takes its share of
//! (or from the verify pass, which reads both trees anyway). Holds ending
//! after the cut the broker sets ([`SledStorage::gather_heads_by`], about a
//! retry window ahead) are gathered as entry ids in a bitmap while the scan
//! reads them: millions of held nacks due later never make a list of heads.
//!
//! Upgrade: a store written before this layout holds a held nack's record
//! in `failures` beside an empty schedule entry. It reads as before (the
//! `failures` key comes first); [`SledStorage::upgrade_held`] moves such
//! records into their schedule entries at the broker's start, in
//! transactions of [`UPGRADE_CHUNK`], so a crash leaves each record in one
//! place or the other, and the next start finishes the job.

use super::codec::{decode_failure_head, encode_failures, unseal};
use super::*;
use std::collections::HashSet;

/// Records moved per transaction by [`SledStorage::upgrade_held`].
pub(super) const UPGRADE_CHUNK: usize = 1024;

/// Most threads the scan of the schedule for every subscription's heads
/// reads slices of it on.
const SCAN_THREADS: usize = 4;

/// A slice of the schedule by due time: from (included), to (excluded).
type Slice = (Option<u64>, Option<u64>);

/// Schedule entries per subscription id.
type Counted = HashMap<u64, u64>;

/// Main-tier failure heads per subscription, from one scan (or a verify
/// pass); a subscription's share is taken once.
#[derive(Debug, Default)]
pub(super) struct HeadCache {
    by_sub: HashMap<u64, HeadList>,
    /// Subscriptions whose share was taken or whose records were written
    /// since the scan: their heads are read afresh.
    stale: HashSet<u64>,
}

/// Heads of one subscription being gathered: those of records in schedule
/// entries, and those under their own keys (which win). Gathered as they
/// come (the schedule is ordered by due time) and sorted by entry once, in
/// [`Gathered::finish`], rather than kept in ordered maps entry by entry;
/// a schedule entry's record held past `cut` only as its entry id.
#[derive(Debug)]
pub(super) struct Gathered {
    scheduled: Vec<(u64, FailureHead)>,
    own: Vec<(u64, FailureHead)>,
    /// Entries of records in schedule entries held past `cut`.
    far: roaring::RoaringTreemap,
    /// The run of consecutive far entries (`start..end`) not yet in `far`:
    /// held nacks come as runs of ids (a chunk holds up to 64 consecutive
    /// ones), and one range insert costs what one id's insert does (the
    /// inserts id by id were an eighth of a 5-million-hold start's samples).
    run: Option<(u64, u64)>,
    /// Inserts into `far` (a test counts them).
    #[cfg(test)]
    pub(super) far_inserts: usize,
    cut: u64,
}

impl Default for Gathered {
    fn default() -> Self {
        Self::cut_at(u64::MAX)
    }
}

impl Gathered {
    /// Gathering that keeps holds ending after `cut` as entry ids only.
    pub(super) fn cut_at(cut: u64) -> Self {
        Self {
            scheduled: Vec::new(),
            own: Vec::new(),
            far: roaring::RoaringTreemap::new(),
            run: None,
            #[cfg(test)]
            far_inserts: 0,
            cut,
        }
    }

    /// Adds a far entry to the current run, or starts a new run.
    fn far_entry(&mut self, entry: u64) {
        match &mut self.run {
            Some((_, end)) if *end == entry && entry != u64::MAX => *end += 1,
            _ => {
                self.end_run();
                match entry.checked_add(1) {
                    Some(next) => self.run = Some((entry, next)),
                    None => self.insert_far(entry..=entry),
                }
            }
        }
    }

    /// Puts the current run of far entries into `far`.
    fn end_run(&mut self) {
        if let Some((start, end)) = self.run.take() {
            self.insert_far(start..=end - 1);
        }
    }

    fn insert_far(&mut self, ids: std::ops::RangeInclusive<u64>) {
        #[cfg(test)]
        {
            self.far_inserts += 1;
        }
        if ids.start() == ids.end() {
            self.far.insert(*ids.start());
        } else {
            self.far.insert_range(ids);
        }
    }

    /// The head of a record kept in a schedule entry. Two entries for one
    /// message (never written by this engine, but possible in a store
    /// restored from elsewhere) give the later count and hold (the later
    /// hold when one of them is past the cut).
    pub(super) fn scheduled(&mut self, entry: u64, head: FailureHead) {
        if head.hold_until_ms > self.cut {
            self.far_entry(entry);
        } else {
            self.scheduled.push((entry, head));
        }
    }

    /// The head of a record under its own key.
    pub(super) fn own(&mut self, entry: u64, head: FailureHead) {
        self.own.push((entry, head));
    }

    /// Adds what another tree's reader gathered (taking its vectors as
    /// they are when this one has none: no copy of millions of heads).
    pub(super) fn absorb(&mut self, mut other: Gathered) {
        self.end_run();
        other.end_run();
        #[cfg(test)]
        {
            self.far_inserts += other.far_inserts;
        }
        let join = |mine: &mut Vec<(u64, FailureHead)>, mut theirs: Vec<(u64, FailureHead)>| {
            if mine.len() < theirs.len() {
                std::mem::swap(mine, &mut theirs);
            }
            mine.append(&mut theirs);
        };
        join(&mut self.scheduled, other.scheduled);
        join(&mut self.own, other.own);
        if self.far.len() < other.far.len() {
            let mine = std::mem::replace(&mut self.far, other.far);
            self.far |= mine;
        } else {
            self.far |= other.far;
        }
        // The earlier cut applies to both (see `finish`).
        self.cut = self.cut.min(other.cut);
    }

    /// The heads, by entry id: per entry, the record under its own key if
    /// there is one (the last gathered), else the schedule entry held past
    /// the cut (its id only), else the schedule entry with the highest
    /// count and hold. Sorted and de-duplicated in place: the vector the
    /// scan filled is the one handed on (held nacks are millions, records
    /// under their own keys few).
    pub(super) fn finish(mut self) -> HeadList {
        self.end_run();
        let by_value = |(e, h): &(u64, FailureHead)| (*e, h.count, h.hold_until_ms);
        self.scheduled.sort_unstable_by_key(by_value);
        // Stable: of two own records for one entry, the later one wins.
        self.own.sort_by_key(|(e, _)| *e);
        let mut scheduled = self.scheduled;
        keep_last_per_entry(&mut scheduled);
        let (cut, mut far) = (self.cut, self.far);
        if cut != u64::MAX {
            // Gathered under a later cut (another reader's share).
            scheduled.retain(|(e, h)| {
                let near = h.hold_until_ms <= cut;
                if !near {
                    far.insert(*e);
                }
                near
            });
        }
        if !far.is_empty() {
            scheduled.retain(|(e, _)| !far.contains(*e));
        }
        let mut own = self.own;
        keep_last_per_entry(&mut own);
        for (e, _) in &own {
            far.remove(*e);
        }
        let heads = |near| MainHeads {
            near,
            far,
            cut_ms: cut,
        };
        if own.is_empty() {
            return heads(scheduled);
        }
        let mut out = Vec::with_capacity(scheduled.len() + own.len());
        let mut own = own.into_iter().peekable();
        for (e, h) in scheduled {
            while let Some(o) = own.next_if(|o| o.0 < e) {
                out.push(o);
            }
            match own.next_if(|o| o.0 == e) {
                Some(o) => out.push(o),
                None => out.push((e, h)),
            }
        }
        out.extend(own);
        heads(out)
    }
}

/// Keeps, of each run of heads with one entry id in `v` (sorted by
/// entry), the last one, in place.
fn keep_last_per_entry(v: &mut Vec<(u64, FailureHead)>) {
    let mut kept = 0;
    for i in 0..v.len() {
        if kept > 0 && v[kept - 1].0 == v[i].0 {
            v[kept - 1] = v[i];
        } else {
            v[kept] = v[i];
            kept += 1;
        }
    }
    v.truncate(kept);
}

/// Joins gathered heads per subscription into the cache's form.
pub(super) fn finish_all(gathered: HashMap<u64, Gathered>) -> Heads {
    gathered
        .into_iter()
        .map(|(sub, g)| (sub, g.finish()))
        .collect()
}

impl HeadCache {
    pub(super) fn new(by_sub: Heads) -> Self {
        Self {
            by_sub,
            stale: HashSet::new(),
        }
    }

    #[cfg(test)]
    pub(super) fn holds(&self, sub_id: u64) -> bool {
        !self.stale.contains(&sub_id)
    }
}

/// The head of a schedule value, when it holds a main-tier record.
fn scheduled_head(k: &[u8], v: &[u8]) -> Result<Option<(ScheduleKey, FailureHead)>> {
    let key =
        ScheduleKey::from_key(k).ok_or_else(|| StorageError::Corrupt("bad schedule key".into()))?;
    if key.message.tier != TierId::Main {
        return Ok(None);
    }
    match unseal(k, v)? {
        [] => Ok(None),
        body => Ok(Some((key, decode_failure_head(body)?))),
    }
}

/// Gathers into `into` the head a schedule value holds (a main-tier record;
/// an unreadable value is for the verify pass to report).
pub(super) fn gather_scheduled(into: &mut HashMap<u64, Gathered>, cut: u64, k: &[u8], v: &[u8]) {
    if let Ok(Some((key, head))) = scheduled_head(k, v) {
        into.entry(key.message.sub_id)
            .or_insert_with(|| Gathered::cut_at(cut))
            .scheduled(key.message.entry_id, head);
    }
}

/// Gathers into `into` the heads of a chunk's main-tier records, from the
/// heads stored beside them (an unreadable chunk is for the verify pass to
/// report, which also checks each head against its record).
pub(super) fn gather_chunk(into: &mut HashMap<u64, Gathered>, cut: u64, k: &[u8], v: &[u8]) {
    if k.get(16) != Some(&(TierId::Main as u8)) {
        return;
    }
    let Ok(body) = unseal(k, v) else {
        return;
    };
    let mut found = Vec::new();
    if sched::visit(body, |i| {
        if i.slot != sched::Slot::Empty {
            found.push((i.entry_id, i.head));
        }
    })
    .is_ok()
    {
        let mine = into
            .entry(sched::chunk_sub(k))
            .or_insert_with(|| Gathered::cut_at(cut));
        for (entry, head) in found {
            mine.scheduled(entry, head);
        }
    }
}

/// Gathers into `into` the head of a `failures` value (main tier only).
pub(super) fn gather_own(into: &mut HashMap<u64, Gathered>, cut: u64, k: &[u8], v: &[u8]) {
    if let Some(m) = SubMessage::from_key(k).filter(|m| m.tier == TierId::Main)
        && let Ok(head) = unseal(k, v).and_then(decode_failure_head)
    {
        into.entry(m.sub_id)
            .or_insert_with(|| Gathered::cut_at(cut))
            .own(m.entry_id, head);
    }
}

impl SledStorage {
    /// Sets where the one scan of every subscription's heads (at the
    /// counted inventory of a start, or a clean verify pass) splits them:
    /// records held past `cut_ms` (ms since the epoch; the broker's now
    /// plus about a retry window) are gathered as entry ids only. Before
    /// that scan; a later share ([`Self::main_heads`]) is cut where its
    /// caller asks.
    pub fn gather_heads_by(&self, cut_ms: u64) {
        self.heads_cut
            .store(cut_ms, std::sync::atomic::Ordering::Relaxed);
    }

    /// The cut of [`Self::gather_heads_by`].
    pub(super) fn heads_cut(&self) -> u64 {
        self.heads_cut.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Notes that the records of subscriptions `subs` were written: their
    /// cached heads are read afresh. Called after the write, so a scan
    /// running meanwhile cannot leave an old head behind.
    /// A write's records come grouped by subscription (a round of acks, a
    /// burst's moves: thousands of one subscription's), so a run of the same
    /// id is noted once, not hashed into the cache once per record.
    pub(super) fn touch_heads(&self, subs: impl IntoIterator<Item = u64>) {
        if let Some(cache) = crate::util::lock(&self.heads).as_mut() {
            let mut last = None;
            for sub in subs {
                if last == Some(sub) {
                    continue;
                }
                last = Some(sub);
                cache.by_sub.remove(&sub);
                cache.stale.insert(sub);
            }
        }
    }

    /// Hands the verify pass's heads to the subscriptions' start.
    pub(super) fn keep_verified_heads(&self, heads: Heads) {
        *crate::util::lock(&self.heads) = Some(HeadCache::new(heads));
    }

    /// Fills the heads cache, unless filled, by one scan of both trees
    /// for every subscription, cut at [`Self::gather_heads_by`].
    pub(super) fn fill_heads_once(&self) -> Result<()> {
        self.fill_heads(&mut crate::util::lock(&self.heads))
    }

    /// [`Self::fill_heads_once`] with the cache's lock held.
    fn fill_heads(&self, cache: &mut Option<HeadCache>) -> Result<()> {
        if cache.is_none() {
            let started = std::time::Instant::now();
            let all = self.scan_heads_with(None, false, self.heads_cut())?.0;
            tracing::info!(
                subscriptions = all.len(),
                heads = all.values().map(|h| h.near.len()).sum::<usize>(),
                held_later = all.values().map(|h| h.far.len()).sum::<u64>(),
                took_ms = started.elapsed().as_millis() as u64,
                "failure heads read for every subscription (a scan of failures and schedule)"
            );
            *cache = Some(HeadCache::new(all));
        }
        Ok(())
    }

    /// [`SubscriptionStore::main_failure_heads_by`]: the share of the
    /// cache (filled by one scan of both trees on the first call, cut at
    /// [`Self::gather_heads_by`]), or, once taken or written, a scan for
    /// this subscription cut at `horizon_ms`. A share cut earlier than
    /// `horizon_ms` is handed on as it is (its caller loads the rest as the
    /// holds come into its window), except to a caller that wants every
    /// head (`u64::MAX`), for whom it is read again whole.
    pub(super) fn main_heads(&self, sub_id: u64, horizon_ms: u64) -> Result<HeadList> {
        let mut guard = crate::util::lock(&self.heads);
        self.fill_heads(&mut guard)?;
        if let Some(cache) = guard.as_mut()
            && cache.stale.insert(sub_id)
        {
            let share = cache.by_sub.remove(&sub_id).unwrap_or(MainHeads {
                cut_ms: self.heads_cut(),
                ..MainHeads::default()
            });
            if share.far.is_empty() || horizon_ms != u64::MAX {
                return Ok(share);
            }
        }
        drop(guard);
        Ok(self
            .scan_heads_with(Some(sub_id), false, horizon_ms)?
            .0
            .remove(&sub_id)
            .unwrap_or(MainHeads {
                cut_ms: horizon_ms,
                ..MainHeads::default()
            }))
    }

    /// Main-tier heads of every subscription, from both trees, counting
    /// each subscription's schedule entries into `counts` on the way (one
    /// scan of the schedule for the manifest check and the heads).
    pub(super) fn scan_heads_counting(
        &self,
        counts: &mut HashMap<u64, crate::manifest::SubCounts>,
    ) -> Result<Heads> {
        let (heads, counted) = self.scan_heads_with(None, true, self.heads_cut())?;
        for (sub, c) in counted {
            counts.entry(sub).or_default().scheduled += c;
        }
        Ok(heads)
    }

    /// Main-tier heads of subscription `only` (or of all), from both
    /// trees, not cut.
    #[cfg(test)]
    pub(super) fn scan_heads(&self, only: Option<u64>) -> Result<Heads> {
        Ok(self.scan_heads_with(only, false, u64::MAX)?.0)
    }

    /// The heads of `only` (or of all), those of holds past `cut` as ids
    /// only, and with `counting` the schedule entries of each subscription.
    /// For all subscriptions the schedule is read in slices of due time on
    /// up to [`SCAN_THREADS`] threads (the heads are sorted by entry at the
    /// end, whatever order they came in).
    fn scan_heads_with(
        &self,
        only: Option<u64>,
        counting: bool,
        cut: u64,
    ) -> Result<(Heads, Counted)> {
        let slices = match only {
            Some(_) => vec![(None, None)],
            None => self.schedule_slices()?,
        };
        let parts: Vec<Result<(HashMap<u64, Gathered>, Counted)>> = if slices.len() == 1 {
            vec![self.scan_schedule_slice(slices[0], only, counting, cut)]
        } else {
            std::thread::scope(|scope| {
                let workers: Vec<_> = slices
                    .iter()
                    .map(|&slice| {
                        scope.spawn(move || self.scan_schedule_slice(slice, only, counting, cut))
                    })
                    .collect();
                workers
                    .into_iter()
                    .map(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                    .collect()
            })
        };
        let mut gathered: HashMap<u64, Gathered> = HashMap::new();
        let mut counted = Counted::new();
        for part in parts {
            let (g, c) = part?;
            for (sub, g) in g {
                gathered
                    .entry(sub)
                    .or_insert_with(|| Gathered::cut_at(cut))
                    .absorb(g);
            }
            for (sub, c) in c {
                *counted.entry(sub).or_default() += c;
            }
        }
        let failures = match only {
            Some(sub) => {
                let mut prefix = be(sub).to_vec();
                prefix.push(TierId::Main as u8);
                self.failures.scan_prefix(prefix)
            }
            None => self.failures.iter(),
        };
        for kv in failures {
            let (k, v) = kv?;
            let m = SubMessage::from_key(&k)
                .ok_or_else(|| StorageError::Corrupt("bad failure key".into()))?;
            if m.tier == TierId::Main {
                let head = decode_failure_head(unseal(&k, &v)?)?;
                gathered
                    .entry(m.sub_id)
                    .or_insert_with(|| Gathered::cut_at(cut))
                    .own(m.entry_id, head);
            }
        }
        Ok((finish_all(gathered), counted))
    }

    /// The schedule split into up to [`SCAN_THREADS`] slices of equal spans
    /// of due time (`(from, to)`: `to` excluded, `None` open), from its first
    /// and last keys; one slice when it is empty or its keys are malformed.
    fn schedule_slices(&self) -> Result<Vec<Slice>> {
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .clamp(1, SCAN_THREADS) as u64;
        let due = |k: &[u8]| k.get(..8).and_then(|b| super::codec::read_be(b).ok());
        let (Some((first, _)), Some((last, _))) = (self.sched.first()?, self.sched.last()?) else {
            return Ok(vec![(None, None)]);
        };
        let (Some(lo), Some(hi)) = (due(&first), due(&last)) else {
            return Ok(vec![(None, None)]);
        };
        if threads == 1 || hi <= lo {
            return Ok(vec![(None, None)]);
        }
        let span = u128::from(hi - lo) + 1;
        let bounds: Vec<u64> = (1..threads)
            .map(|i| lo + (span * u128::from(i) / u128::from(threads)) as u64)
            .collect();
        let mut slices = Vec::with_capacity(threads as usize);
        let mut from = None;
        for b in bounds {
            slices.push((from, Some(b)));
            from = Some(b);
        }
        slices.push((from, None));
        Ok(slices)
    }

    /// One slice of the schedule: the heads of `only` (or of all) and, with
    /// `counting`, every subscription's entries in it.
    fn scan_schedule_slice(
        &self,
        (from, to): Slice,
        only: Option<u64>,
        counting: bool,
        cut: u64,
    ) -> Result<(HashMap<u64, Gathered>, Counted)> {
        let mut gathered: HashMap<u64, Gathered> = HashMap::new();
        let mut counted = Counted::new();
        for kv in self.raw_chunks(from, to) {
            let (ck, v) = kv?;
            #[cfg(test)]
            self.chunks_scanned
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let body = unseal(&ck, &v)?;
            let sub = sched::chunk_sub(&ck);
            if counting {
                *counted.entry(sub).or_default() += sched::chunk_count(body)?;
            }
            if only.is_some_and(|o| o != sub) {
                continue;
            }
            if ck.get(16) != Some(&(TierId::Main as u8)) {
                // Only the layout is checked (the records are not read).
                sched::visit(body, |_| {})?;
                continue;
            }
            // Each record's head is stored beside it: nothing is decoded.
            let mine = gathered.entry(sub).or_insert_with(|| Gathered::cut_at(cut));
            sched::visit(body, |i| {
                if i.slot != sched::Slot::Empty {
                    mine.scheduled(i.entry_id, i.head);
                }
            })?;
        }
        Ok((gathered, counted))
    }

    /// Main-tier records kept in schedule entries of subscription `sub_id`
    /// (a scan of the schedule), for [`SubscriptionStore::failures_of`].
    pub(super) fn held_records(&self, sub_id: u64) -> Result<Vec<(SubMessage, FailureRecord)>> {
        let mut out: BTreeMap<u64, FailureRecord> = BTreeMap::new();
        let mut found: Vec<(ScheduleKey, Vec<u8>)> = Vec::new();
        for chunk in self.chunks_in(None, None) {
            let (ck, chunk) = chunk?;
            if sched::chunk_sub(&ck) != sub_id || ck[16] != TierId::Main as u8 {
                continue;
            }
            for (key, item) in chunk.keys(&ck) {
                match item.slot {
                    sched::Slot::Empty => {}
                    sched::Slot::Inline => found.push((key, item.body.clone())),
                    sched::Slot::Big => found.push((key, self.big_record(&key)?)),
                }
            }
        }
        for (key, body) in found {
            let r = decode_failures(&body)?;
            let slot = out.entry(key.message.entry_id).or_insert_with(|| r.clone());
            if (r.count, r.hold_until_ms) > (slot.count, slot.hold_until_ms) {
                *slot = r;
            }
        }
        Ok(out
            .into_iter()
            .map(|(entry_id, r)| {
                (
                    SubMessage {
                        sub_id,
                        tier: TierId::Main,
                        entry_id,
                    },
                    r,
                )
            })
            .collect())
    }

    /// [`SubscriptionStore::put_held`]: in one transaction, the schedule
    /// entries `unschedule` go, and each held record is stored as its
    /// schedule entry's value with its own `failures` key removed.
    pub(super) fn put_held_tx(
        &self,
        held: &[(ScheduleKey, FailureRecord)],
        unschedule: &[ScheduleKey],
    ) -> Result<()> {
        // Encoded before the transaction: its closure may re-run.
        let put: Vec<([u8; 17], &ScheduleKey, Vec<u8>)> = held
            .iter()
            .map(|(key, r)| (key.message.key(), key, encode_failures(r)))
            .collect();
        let result = sched::tx_result((&self.failures, &self.sched, &self.sched_big).transaction(
            |(failures, chunks, big)| {
                let mut w = sched::SchedWrites::new(chunks, big);
                for k in unschedule {
                    w.remove(k)?;
                }
                for (own, k, body) in &put {
                    failures.remove(own)?;
                    w.insert(k, body)?;
                }
                w.finish()
            },
        ))
        .map(|written| self.chunks_written(written));
        self.touch_heads(
            held.iter()
                .map(|(k, _)| k.message.sub_id)
                .chain(unschedule.iter().map(|k| k.message.sub_id)),
        );
        result
    }

    /// Main-tier records with a hold under their own keys (the layout
    /// before [`Self::upgrade_held`]; for tests).
    #[cfg(any(test, feature = "testing"))]
    #[doc(hidden)]
    pub fn held_under_own_keys(&self) -> usize {
        self.failures
            .iter()
            .filter_map(|kv| kv.ok())
            .filter(|(k, v)| {
                SubMessage::from_key(k).is_some_and(|m| m.tier == TierId::Main)
                    && unseal(k, v)
                        .and_then(decode_failure_head)
                        .is_ok_and(|h| h.hold_until_ms > 0)
            })
            .count()
    }

    /// The upgrade to one key per held message (see the module's text):
    /// every main-tier record under its own key whose hold has a schedule
    /// entry without a record moves into that entry. Returns how many
    /// moved; logs once when any did. A value that does not read is left
    /// where it is (the verify pass and `ricochet-broker check` report
    /// it). Not durable until the next flush; idempotent.
    pub fn upgrade_held(&self) -> Result<u64> {
        let started = std::time::Instant::now();
        let mut moved = 0u64;
        let mut chunk: Vec<([u8; 17], ScheduleKey, Vec<u8>)> = Vec::new();
        let mut after: Option<sled::IVec> = None;
        loop {
            let range = match &after {
                Some(a) => self.failures.range::<&[u8], _>((
                    std::ops::Bound::Excluded(a.as_ref()),
                    std::ops::Bound::Unbounded,
                )),
                None => self.failures.iter(),
            };
            chunk.clear();
            let mut last = None;
            for kv in range {
                let (k, v) = kv?;
                last = Some(k.clone());
                let Some(m) = SubMessage::from_key(&k).filter(|m| m.tier == TierId::Main) else {
                    continue;
                };
                let Ok(head) = unseal(&k, &v).and_then(decode_failure_head) else {
                    continue;
                };
                if head.hold_until_ms == 0 {
                    continue;
                }
                let sk = ScheduleKey {
                    due_ms: head.hold_until_ms,
                    message: m,
                };
                let empty = matches!(self.sched_get(&sk), Ok(Some(b)) if b.is_empty());
                if !empty {
                    continue;
                }
                let body = unseal(&k, &v)?.to_vec();
                chunk.push((m.key(), sk, body));
                if chunk.len() >= UPGRADE_CHUNK {
                    break;
                }
            }
            if !chunk.is_empty() {
                let written =
                    sched::tx_result((&self.failures, &self.sched, &self.sched_big).transaction(
                        |(failures, chunks, big)| {
                            let mut w = sched::SchedWrites::new(chunks, big);
                            for (own, sk, body) in &chunk {
                                failures.remove(own)?;
                                w.insert(sk, body)?;
                            }
                            w.finish()
                        },
                    ))?;
                self.chunks_written(written);
                moved += chunk.len() as u64;
                if crate::util::failpoint_armed("upgrade.held.after_chunk") {
                    self.flush_blocking();
                    crate::util::failpoint("upgrade.held.after_chunk");
                }
            }
            match last {
                Some(l) if chunk.len() >= UPGRADE_CHUNK => after = Some(l),
                _ => break,
            }
        }
        if moved > 0 {
            crate::util::lock(&self.heads).take();
            tracing::info!(
                moved,
                took_ms = started.elapsed().as_millis() as u64,
                "storage upgraded: held messages' failure records moved into their schedule entries (one key each; once)"
            );
        }
        Ok(moved)
    }
}

#[cfg(test)]
#[path = "held_tests.rs"]
mod tests;
