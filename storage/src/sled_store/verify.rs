//! `ricochet-broker check` on a stopped store, and the broker's pass at
//! start (`verify_on_start`): [`SledStorage::verify`] reads every stored
//! value of every tree, checks its checksum and that it decodes as what its
//! tree holds, and reports what it found; [`SledStorage::verify_live`] does
//! the same while the broker serves (trees dropped meanwhile are skipped,
//! and it stops when told to).

use super::codec::{self, decode_failures, from_json, read_be, unseal};
use super::*;
use crate::manifest::SubCounts;

/// What [`SledStorage::verify`] found.
#[derive(Debug, Default)]
pub struct VerifyReport {
    /// Stored values read and checked.
    pub values: u64,
    /// Live log entries among them.
    pub entries: u64,
    /// Every problem found (the first [`MAX_LISTED`] are kept).
    pub problems: Vec<String>,
    /// Problems found in all.
    pub problem_count: u64,
    /// Keys in the schedule index and in the dead-letter tree (the counts
    /// the manifest records at a clean stop).
    pub scheduled: u64,
    /// See `scheduled`.
    pub dead_letters: u64,
    /// The same, per subscription id.
    pub by_subscription: HashMap<u64, SubCounts>,
    /// False when the pass was told to stop before reading everything.
    pub complete: bool,
}

/// Most problems a [`VerifyReport`] lists.
pub(crate) const MAX_LISTED: usize = 100;

impl VerifyReport {
    fn problem(&mut self, p: String) {
        self.problem_count += 1;
        if self.problems.len() < MAX_LISTED {
            self.problems.push(p);
        }
    }
}

impl SledStorage {
    /// Reads every stored value and checks its checksum and that it decodes
    /// as what its tree holds (log entries as messages), for
    /// `ricochet-broker check` and a check before serving. Writes nothing.
    /// The schedule and dead-letter counts it finds are kept for the next
    /// counted [`Storage::inventory`] (the manifest check at start), which
    /// then needs no second scan of those trees.
    pub fn verify(&self) -> VerifyReport {
        let mut heads = HashMap::new();
        let report = self.verify_with(false, &|| false, Some(&mut heads), &|| {});
        if report.complete && report.problem_count == 0 {
            *crate::util::lock(&self.verified_counts) = Some(report.by_subscription.clone());
            self.keep_verified_heads(held::finish_all(heads));
        }
        report
    }

    /// Dead letters and schedule entries per subscription id: from the
    /// verify pass that just ran clean, or one scan of the keys of both
    /// trees.
    pub(super) fn counts_by_subscription(&self) -> Result<HashMap<u64, SubCounts>> {
        if let Some(counted) = crate::util::lock(&self.verified_counts).take() {
            // Counted by the verify pass that just ran (nothing was written since).
            return Ok(counted);
        }
        let started = std::time::Instant::now();
        let mut by_sub: HashMap<u64, SubCounts> = HashMap::new();
        for k in self.deadletters.iter().keys() {
            by_sub.entry(dl_sub(&k?)).or_default().dead_letters += 1;
        }
        // At a start nobody has read the failure heads yet: the scan of the
        // schedule that counts its keys gathers them on its way (with those
        // of `failures`), so the subscriptions' start does not scan the
        // schedule a second time. The lock is held through the scan, as
        // `main_heads` does: a write meanwhile marks its subscription's
        // share stale once the cache is in place.
        let mut cache = crate::util::lock(&self.heads);
        let gather = cache.is_none();
        if gather {
            let counted = self.scan_heads_counting(&mut by_sub)?;
            *cache = Some(held::HeadCache::new(counted));
        } else {
            drop(cache);
            // Each chunk's count, from its header (its checksum checked).
            for kv in self.sched.iter() {
                let (k, v) = kv?;
                by_sub.entry(sched::chunk_sub(&k)).or_default().scheduled +=
                    sched::chunk_count(unseal(&k, &v)?)?;
            }
            for k in self.schedule.iter().keys() {
                by_sub.entry(schedule_sub(&k?)).or_default().scheduled += 1;
            }
        }
        tracing::info!(
            subscriptions = by_sub.len(),
            dead_letters = by_sub.values().map(|c| c.dead_letters).sum::<u64>(),
            scheduled = by_sub.values().map(|c| c.scheduled).sum::<u64>(),
            heads_gathered = gather,
            took_ms = started.elapsed().as_millis() as u64,
            "dead letters and schedule entries counted per subscription (a scan of both trees)"
        );
        Ok(by_sub)
    }

    /// [`SledStorage::verify`] on a store being written: segments dropped
    /// while the pass runs (retention, consumed segments) are skipped rather
    /// than reported, segments are not matched against topic records (a
    /// topic being created or deleted would look damaged; the manifest check
    /// covers them), and the pass ends early once `stop()` is true (checked
    /// every few thousand values). Damage in a value is reported as by
    /// `verify`.
    pub fn verify_live(&self, stop: &(dyn Fn() -> bool + Sync)) -> VerifyReport {
        self.verify_with(true, stop, None, &|| {})
    }

    /// [`Self::verify_live`], calling `on_worker` first on each thread
    /// the pass reads on (the broker lowers their priority there, so the
    /// pass yields the cores to serving).
    pub fn verify_live_on(
        &self,
        stop: &(dyn Fn() -> bool + Sync),
        on_worker: &(dyn Fn() + Sync),
    ) -> VerifyReport {
        self.verify_with(true, stop, None, on_worker)
    }

    /// The pass; with `heads`, the main-tier failure heads it decodes (of
    /// records under their own keys and in schedule entries) are gathered
    /// there per subscription.
    fn verify_with(
        &self,
        live: bool,
        stop: &(dyn Fn() -> bool + Sync),
        heads: Option<&mut HashMap<u64, held::Gathered>>,
        on_worker: &(dyn Fn() + Sync),
    ) -> VerifyReport {
        let want_heads = heads.is_some();
        let cut = self.heads_cut();
        let mut report = VerifyReport {
            complete: true,
            ..VerifyReport::default()
        };
        let topics: std::collections::BTreeSet<String> = match self.list_topics() {
            Ok(t) => t.into_iter().map(|t| t.name).collect(),
            Err(e) => {
                report.problem(format!("topic records: {e}"));
                Default::default()
            }
        };
        let mut trees: Vec<(String, Tree)> = vec![
            ("meta".into(), self.meta.clone()),
            ("prodseq".into(), self.prodseq.clone()),
            ("failures".into(), self.failures.clone()),
            ("schedule".into(), self.schedule.clone()),
            ("sched".into(), self.sched.clone()),
            ("sched_big".into(), self.sched_big.clone()),
            ("deadletters".into(), self.deadletters.clone()),
        ];
        for (topic, segs) in crate::util::lock(&self.segments).iter() {
            if !live && !topics.contains(topic) {
                report.problem(format!(
                    "{} segment(s) of topic {topic}, which has no topic record",
                    segs.len()
                ));
            }
            for (seg, tree) in segs {
                trees.push((seg_tree_name(topic, *seg), tree.clone()));
            }
        }
        // The trees are read on up to `VERIFY_THREADS` threads, each tree
        // by one; the reports are joined in the trees' order, so the pass
        // finds and lists exactly what one thread reading them in turn
        // would.
        let next = std::sync::atomic::AtomicUsize::new(0);
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .clamp(1, VERIFY_THREADS)
            .min(trees.len());
        #[allow(clippy::type_complexity)]
        let mut parts: Vec<(
            usize,
            VerifyReport,
            HashMap<u64, held::Gathered>,
            settle::Tail,
        )> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..threads)
                .map(|_| {
                    scope.spawn(|| {
                        on_worker();
                        let mut done = Vec::new();
                        loop {
                            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            let Some((name, tree)) = trees.get(i) else {
                                return done;
                            };
                            let mut found = HashMap::new();
                            let gather = (want_heads
                                && matches!(
                                    name.as_str(),
                                    "failures" | "schedule" | "sched" | "sched_big"
                                ))
                            .then_some(&mut found);
                            let mut tail = settle::Tail::default();
                            let report =
                                verify_tree(name, tree, live, stop, gather, cut, &mut tail);
                            done.push((i, report, found, tail));
                        }
                    })
                })
                .collect();
            workers
                .into_iter()
                .flat_map(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        });
        parts.sort_by_key(|(i, _, _, _)| *i);
        let mut heads = heads;
        let mut tails = Vec::new();
        for (i, part, found, tail) in parts {
            tails.push((&trees[i].1, tail));
            if let Some(heads) = heads.as_deref_mut() {
                for (sub, g) in found {
                    heads
                        .entry(sub)
                        .or_insert_with(|| held::Gathered::cut_at(cut))
                        .absorb(g);
                }
            }
            report.values += part.values;
            report.entries += part.entries;
            report.scheduled += part.scheduled;
            report.dead_letters += part.dead_letters;
            report.problem_count += part.problem_count;
            for p in part.problems {
                if report.problems.len() < MAX_LISTED {
                    report.problems.push(p);
                }
            }
            for (sub, c) in part.by_subscription {
                let mine = report.by_subscription.entry(sub).or_default();
                mine.scheduled += c.scheduled;
                mine.dead_letters += c.dead_letters;
            }
            report.complete &= part.complete;
        }
        // The live pass (the broker's, while serving) lets sled's cache
        // evict what it paged in, on a thread of the pass's priority.
        if live && report.complete {
            std::thread::scope(|scope| {
                let _ = scope
                    .spawn(|| {
                        on_worker();
                        settle::reread(tails, stop)
                    })
                    .join();
            });
        }
        report
    }
}

/// Most threads a verify pass reads trees on.
const VERIFY_THREADS: usize = 4;

/// One tree's share of a verify pass (see [`SledStorage::verify_live`]
/// for `live` and `stop`); with `heads`, the failure heads of the
/// main-tier records it checked.
fn verify_tree(
    name: &str,
    tree: &Tree,
    live: bool,
    stop: &dyn Fn() -> bool,
    mut heads: Option<&mut HashMap<u64, held::Gathered>>,
    cut: u64,
    tail: &mut settle::Tail,
) -> VerifyReport {
    let mut report = VerifyReport {
        complete: true,
        ..VerifyReport::default()
    };
    for kv in tree.iter() {
        let (k, v) = match kv {
            Ok(kv) => kv,
            // Dropped while the pass ran (a live store's segment).
            Err(sled::Error::CollectionNotFound(_)) if live => break,
            Err(e) => {
                report.problem(format!("{name}: {}", StorageError::from(e)));
                break;
            }
        };
        if report.values.is_multiple_of(4096) && stop() {
            report.complete = false;
            return report;
        }
        report.values += 1;
        tail.read(&k, v.len());
        match name {
            "schedule" => {
                report.scheduled += 1;
                let sub = schedule_sub(&k);
                report.by_subscription.entry(sub).or_default().scheduled += 1;
            }
            "sched" => {
                // An unreadable chunk counts nothing (and is reported below).
                let n = unseal(&k, &v).and_then(sched::chunk_count).unwrap_or(0);
                report.scheduled += n;
                let sub = sched::chunk_sub(&k);
                report.by_subscription.entry(sub).or_default().scheduled += n;
            }
            "deadletters" => {
                report.dead_letters += 1;
                let sub = dl_sub(&k);
                report.by_subscription.entry(sub).or_default().dead_letters += 1;
            }
            _ => {}
        }
        match check_value(name, &k, &v) {
            Ok(entries) => report.entries += entries,
            Err(e) => report.problem(format!("{name}: {e}")),
        }
        if let Some(heads) = heads.as_deref_mut() {
            if name == "schedule" {
                held::gather_scheduled(heads, cut, &k, &v);
            } else if name == "sched_big" {
                // Gathered from the chunk, which keeps each record's head.
            } else if name == "sched" {
                held::gather_chunk(heads, cut, &k, &v);
            } else {
                held::gather_own(heads, cut, &k, &v);
            }
        }
    }
    report
}

/// The subscription id a dead-letter key starts with (`u64::MAX` for a
/// malformed key, which the verify pass reports on its own).
fn dl_sub(k: &[u8]) -> u64 {
    k.get(..8).and_then(|b| read_be(b).ok()).unwrap_or(u64::MAX)
}

/// The subscription id of a schedule key (`u64::MAX` when malformed).
fn schedule_sub(k: &[u8]) -> u64 {
    ScheduleKey::from_key(k).map_or(u64::MAX, |s| s.message.sub_id)
}

/// Checks one stored value of tree `tree`; returns the live log entries it holds.
fn check_value(tree: &str, k: &[u8], v: &[u8]) -> Result<u64> {
    use prost::Message as _;
    let body = unseal(k, v)?;
    let bad_key = || StorageError::Corrupt(format!("bad key {}", codec::show_key(k)));
    match tree {
        "meta" if k.starts_with(b"t:") => from_json::<TopicRecord>(body).map(|_| 0),
        "meta" if k.starts_with(b"s:") => from_json::<SubscriptionRecord>(body).map(|_| 0),
        "meta" if k.starts_with(b"p:") => from_json::<PartitionedRecord>(body).map(|_| 0),
        "meta" if k.starts_with(b"n:") => read_be(body).map(|_| 0),
        "meta" if k.starts_with(returns::JOB_PREFIX) => {
            from_json::<ReplayJobRecord>(body).map(|_| 0)
        }
        "meta" if k.starts_with(returns::JOB_IDS_PREFIX) => {
            if body.len() % 8 == 0 {
                Ok(0)
            } else {
                Err(StorageError::Corrupt("bad replay job id list".into()))
            }
        }
        "meta" if k.starts_with(GRANT_PREFIX) => from_json::<GrantRecord>(body).map(|_| 0),
        "meta" if k.starts_with(RETENTION_PREFIX) => from_json::<RetentionRecord>(body).map(|_| 0),
        "meta" if k.starts_with(TIERED_PREFIX) => from_json::<serde_json::Value>(body).map(|_| 0),
        "meta" if k.starts_with(super::refs::INDEX_PREFIX) => {
            super::refs::check_index(k, body).map(|_| 0)
        }
        "meta" if k == STORE_ID_KEY => std::str::from_utf8(body)
            .map(|_| 0)
            .map_err(|_| StorageError::Corrupt("unreadable store id".into())),
        "meta" => Err(bad_key()),
        "prodseq" => read_be(body).map(|_| 0),
        "failures" => {
            SubMessage::from_key(k).ok_or_else(bad_key)?;
            decode_failures(body).map(|_| 0)
        }
        "schedule" | "sched_big" => {
            ScheduleKey::from_key(k).ok_or_else(bad_key)?;
            if body.is_empty() {
                Ok(0)
            } else {
                decode_failures(body).map(|_| 0)
            }
        }
        "sched" => {
            // Each inline record decodes and matches the head stored beside
            // it (a record in `sched_big` is checked there).
            let chunk = sched::read_chunk(k, v)?;
            for item in &chunk.items {
                if item.slot == sched::Slot::Inline {
                    let r = decode_failures(&item.body)?;
                    if FailureHead::of(&r) != item.head {
                        return Err(StorageError::Corrupt(format!(
                            "schedule entry of entry {} in chunk {}: its head does not match its record",
                            item.entry_id,
                            codec::show_key(k)
                        )));
                    }
                }
            }
            Ok(0)
        }
        "deadletters" => {
            if k.len() != 16 {
                return Err(bad_key());
            }
            from_json::<DeadLetterRecord>(body).map(|_| 0)
        }
        _ => {
            let first = read_be(k)?;
            let mut n = 0;
            for (id, entry) in frame::entries(first, body)? {
                if crate::refs::is_ref(&entry) {
                    crate::refs::RetryRef::parse(&entry)?;
                } else {
                    ricochet_proto::Message::decode(&*entry).map_err(|e| {
                        StorageError::Corrupt(format!("entry {id} does not decode: {e}"))
                    })?;
                }
                n += 1;
            }
            Ok(n)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message as _;

    fn entry(i: u64) -> Vec<u8> {
        ricochet_proto::Message {
            payload: format!("message {i}").into_bytes(),
            ..Default::default()
        }
        .encode_to_vec()
    }

    /// A store of two topics' segments, 4 entries per segment.
    fn store(dir: &std::path::Path) -> SledStorage {
        let s = SledStorage::open(dir, 4, 8 << 20).unwrap();
        for topic in ["a", "b"] {
            for id in 0..12 {
                s.append(topic, id, &[entry(id)], None).unwrap();
            }
        }
        s
    }

    #[test]
    fn the_live_pass_reports_a_damaged_value_as_the_stopped_one_does() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path());
        let clean = s.verify_live(&|| false);
        assert!(clean.complete);
        assert_eq!((clean.problem_count, clean.entries), (0, 24));
        s.damage_entry("b", 5, 7);
        let live = s.verify_live(&|| false);
        assert_eq!(live.problem_count, 1, "{:?}", live.problems);
        assert!(live.problems[0].contains("b"), "{:?}", live.problems);
        // The stopped pass also finds the segments without a topic record.
        let stopped = s.verify();
        assert!(
            stopped.problems.iter().any(|p| p == &live.problems[0]),
            "{:?}",
            stopped.problems
        );
    }

    #[test]
    fn a_counted_inventory_gathers_the_heads_on_its_scan_of_the_schedule() {
        use crate::MetaStore as _;
        let dir = tempfile::tempdir().unwrap();
        let s = SledStorage::open(dir.path(), 4, 8 << 20).unwrap();
        let mut held = crate::records::sample_history(2);
        held.hold_until_ms = 9_000;
        let m = |sub: u64, tier: TierId, id: u64| SubMessage {
            sub_id: sub,
            tier,
            entry_id: id,
        };
        s.put_failures(&[
            (m(1, TierId::Main, 3), Some(held.clone())),
            (m(2, TierId::Main, 5), Some(FailureRecord::default())),
        ])
        .unwrap();
        // Held messages (records in schedule entries), out of entry order by
        // due time, and a retry-tier schedule entry.
        let key = |due_ms, sub, id| ScheduleKey {
            due_ms,
            message: m(sub, TierId::Main, id),
        };
        s.put_held(
            &[
                (key(9_000, 1, 8), held.clone()),
                (key(9_500, 1, 6), held.clone()),
            ],
            &[],
        )
        .unwrap();
        s.put_schedule(&[(
            ScheduleKey {
                due_ms: 9_100,
                message: m(2, TierId::Retry, 1),
            },
            true,
        )])
        .unwrap();
        let want1 = s.scan_heads(Some(1)).unwrap().remove(&1).unwrap();
        let want2 = s.scan_heads(Some(2)).unwrap().remove(&2).unwrap();
        assert_eq!(want1.len(), 3);
        assert!(crate::util::lock(&s.heads).is_none());
        let inv = s.inventory(true).unwrap();
        assert_eq!(inv.scheduled, Some(3));
        let counts = s.counts_by_subscription().unwrap();
        assert_eq!(counts[&1].scheduled, 2);
        assert_eq!(counts[&2].scheduled, 1);
        // The inventory's scan left the heads for the subscriptions' start.
        let cached = |s: &SledStorage, sub| {
            crate::util::lock(&s.heads)
                .as_ref()
                .is_some_and(|c| c.holds(sub))
        };
        assert!(cached(&s, 1) && cached(&s, 2));
        assert_eq!(s.main_failure_heads(1).unwrap(), want1.near);
        assert_eq!(s.main_failure_heads(2).unwrap(), want2.near);
        // A damaged held record fails the counted inventory, as the
        // subscriptions' own scan would have failed their start.
        *crate::util::lock(&s.heads) = None;
        let k = sched::chunk_key(&key(9_000, 1, 8));
        let mut v = s.sched.get(k).unwrap().unwrap().to_vec();
        let last = v.len() - 1;
        v[last] ^= 0x5a;
        s.sched.insert(k, v).unwrap();
        assert!(s.inventory(true).is_err());
    }

    #[test]
    fn the_subscriptions_start_takes_the_heads_a_clean_pass_read_until_its_records_are_written() {
        let dir = tempfile::tempdir().unwrap();
        let s = SledStorage::open(dir.path(), 4, 8 << 20).unwrap();
        let mut held = crate::records::sample_history(2);
        held.hold_until_ms = 9_000;
        let m = |sub: u64, tier: TierId, id: u64| SubMessage {
            sub_id: sub,
            tier,
            entry_id: id,
        };
        s.put_failures(&[
            (m(1, TierId::Main, 3), Some(held.clone())),
            (m(1, TierId::Main, 4), Some(FailureRecord::default())),
            (m(1, TierId::Retry, 4), Some(held.clone())),
            (m(2, TierId::Main, 5), Some(held.clone())),
        ])
        .unwrap();
        // A held message: its record in its schedule entry.
        let key = ScheduleKey {
            due_ms: 9_000,
            message: m(1, TierId::Main, 6),
        };
        s.put_held(&[(key, held.clone())], &[]).unwrap();
        assert_eq!(s.verify().problem_count, 0);
        let cached = |s: &SledStorage, sub| {
            crate::util::lock(&s.heads)
                .as_ref()
                .is_some_and(|c| c.holds(sub))
        };
        assert!(cached(&s, 1) && cached(&s, 2));
        let want = vec![
            (m(1, TierId::Main, 3), FailureHead::of(&held)),
            (m(1, TierId::Main, 4), FailureHead::default()),
            (m(1, TierId::Main, 6), FailureHead::of(&held)),
        ];
        assert_eq!(s.failure_heads(1, TierId::Main).unwrap(), want);
        // Taken once; asked again, they are read afresh, not lost.
        assert!(!cached(&s, 1));
        assert_eq!(s.failure_heads(1, TierId::Main).unwrap(), want);
        // A write to a subscription's records drops its share only: its
        // next start reads the trees again and sees the write.
        s.put_failures(&[(m(2, TierId::Main, 6), Some(held.clone()))])
            .unwrap();
        assert!(!cached(&s, 2));
        assert_eq!(s.failure_heads(2, TierId::Main).unwrap().len(), 2);
        // A pass that finds damage hands nothing over.
        s.put_topic(&TopicRecord {
            name: "t".into(),
            created_ms: 0,
            kind: TopicKind::Normal,
            replicas: 1,
            trimmed_below: 0,
        })
        .unwrap();
        s.append("t", 0, &[entry(0)], None).unwrap();
        s.damage_entry("t", 0, 7);
        *crate::util::lock(&s.heads) = None;
        assert!(s.verify().problem_count > 0);
        assert!(crate::util::lock(&s.heads).is_none());
    }

    #[test]
    fn trees_read_in_parallel_report_as_one_reader_in_turn_would() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path());
        for topic in ["a", "b"] {
            s.put_topic(&TopicRecord {
                name: topic.into(),
                created_ms: 0,
                kind: TopicKind::Normal,
                replicas: 1,
                trimmed_below: 0,
            })
            .unwrap();
        }
        // Damage in several trees: each segment tree of both topics.
        for id in [1, 5, 9] {
            s.damage_entry("a", id, 7);
            s.damage_entry("b", id, 7);
        }
        let first = s.verify();
        assert_eq!(first.problem_count, 6, "{:?}", first.problems);
        assert!(first.complete);
        // Listed in the trees' order whichever thread read which tree.
        for _ in 0..20 {
            let again = s.verify();
            assert_eq!(again.problems, first.problems);
            assert_eq!((again.values, again.entries), (first.values, first.entries));
        }
    }

    #[test]
    fn the_live_pass_skips_segments_dropped_under_it_and_stops_when_told() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path());
        // A segment dropped while the pass holds it: its tree is gone.
        let seg = s.segment("a", 1).unwrap();
        s.db.drop_tree(seg_tree_name("a", 1)).unwrap();
        assert!(matches!(
            seg.iter().next(),
            Some(Err(sled::Error::CollectionNotFound(_)))
        ));
        let live = s.verify_live(&|| false);
        assert_eq!(live.problem_count, 0, "{:?}", live.problems);
        assert!(live.complete);
        let stopped = s.verify_live(&|| true);
        assert!(!stopped.complete);
        assert_eq!(stopped.values, 0);
    }

    #[test]
    fn a_clean_pass_hands_its_counts_to_the_next_counted_inventory_only() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path());
        let key = ScheduleKey {
            due_ms: 1,
            message: SubMessage {
                sub_id: 1,
                tier: TierId::Retry,
                entry_id: 1,
            },
        };
        s.put_schedule(&[(key, true)]).unwrap();
        let report = s.verify();
        assert_eq!((report.scheduled, report.dead_letters), (1, 0));
        assert_eq!(s.inventory(true).unwrap().scheduled, Some(1));
        // The next one counts afresh.
        s.put_schedule(&[(key, false)]).unwrap();
        assert_eq!(s.inventory(true).unwrap().scheduled, Some(0));
    }
}
