//! What a start reads from sled before serving, read as soon as sled is
//! open ([`SledStorage::read_ahead_of_start`]). A start needs two things
//! from the schedule and the dead letters: after a clean stop, their counts
//! per subscription (the manifest check compares them with what the stop
//! recorded), and every subscription's main-tier failure heads (the
//! subscriptions' start). Both come from one scan of the schedule's chunks
//! (each chunk's checksum checked), which the manifest check or the first
//! subscription's start made until now: after the segment-file log's check,
//! which reads other files. The broker now makes that scan right after
//! sled's open, on the thread that opened sled, while the log's check runs
//! on its own, and keeps what it read for the inventory and the heads'
//! first reader, as a clean verify pass's counts and heads are kept.
//!
//! Nothing is refused here and nothing is weakened: a scan that meets
//! damage keeps nothing, so the inventory (or the subscriptions' start)
//! scans again, meets it again and refuses the store with the error it
//! always gave. The counts kept are right only while nothing writes the
//! schedule or the dead letters before the inventory takes them; a start
//! writes neither before its manifest check (the held-layout upgrade runs
//! before this scan; the segment upgrade moves topic entries only), and
//! any write to a subscription's failure records marks its heads stale as
//! before ([`held`]).

use super::*;

impl SledStorage {
    /// Reads what the start's manifest check (with `count`: after a clean
    /// stop, unless verification is off) and its subscriptions' start take
    /// from the schedule, now (see the module's documentation). Returns
    /// whether it was kept (false when the scan met damage or an error:
    /// the later reads meet it again and refuse the store as before).
    pub fn read_ahead_of_start(&self, count: bool) -> bool {
        let started = std::time::Instant::now();
        let read = if count {
            self.counts_by_subscription().map(|counted| {
                *crate::util::lock(&self.verified_counts) = Some(counted);
            })
        } else {
            self.fill_heads_once()
        };
        tracing::info!(
            counted = count,
            kept = read.is_ok(),
            took_ms = started.elapsed().as_millis() as u64,
            "start: schedule read ahead (counts and failure heads), beside the log's check"
        );
        read.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::sample_history;
    use std::sync::atomic::Ordering;

    fn key(due_ms: u64, sub_id: u64, entry_id: u64) -> ScheduleKey {
        ScheduleKey {
            due_ms,
            message: SubMessage {
                sub_id,
                tier: TierId::Main,
                entry_id,
            },
        }
    }

    /// A store with held records of subscriptions 1 and 2 and a retry of
    /// 3's, some due within a cut at 50 000 and most after it.
    fn store(dir: &std::path::Path) -> SledStorage {
        let s = SledStorage::open(dir, 64, 8 << 20).unwrap();
        let mut held = sample_history(2);
        let mut put = Vec::new();
        for i in 0..300u64 {
            held.hold_until_ms = 10_000 + i * 1_000;
            put.push((key(held.hold_until_ms, 1 + i % 2, i), held.clone()));
        }
        s.put_held(&put, &[]).unwrap();
        s.put_schedule(&[(
            ScheduleKey {
                due_ms: 9_100,
                message: SubMessage {
                    sub_id: 3,
                    tier: TierId::Retry,
                    entry_id: 1,
                },
            },
            true,
        )])
        .unwrap();
        s
    }

    #[test]
    fn counts_and_heads_read_ahead_are_what_the_start_takes_without_a_second_scan() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path());
        s.gather_heads_by(50_000);
        let want_inv = s.inventory(true).unwrap();
        let want_heads: Vec<_> = (1..=2)
            .map(|sub| s.main_failure_heads_by(sub, 50_000).unwrap())
            .collect();
        *crate::util::lock(&s.heads) = None;
        assert!(want_heads[0].far.len() > 100 && !want_heads[0].near.is_empty());

        assert!(s.read_ahead_of_start(true));
        s.chunks_scanned.store(0, Ordering::Relaxed);
        let inv = s.inventory(true).unwrap();
        assert_eq!(inv.scheduled, want_inv.scheduled);
        assert_eq!(inv.scheduled, Some(301));
        assert_eq!(inv.dead_letters, want_inv.dead_letters);
        for sub in 1..=2 {
            assert_eq!(
                s.main_failure_heads_by(sub, 50_000).unwrap(),
                want_heads[sub as usize - 1]
            );
        }
        let scanned = s.chunks_scanned.load(Ordering::Relaxed);
        assert_eq!(
            scanned, 0,
            "{scanned} chunks read again after the read-ahead"
        );
    }

    #[test]
    fn heads_read_ahead_of_a_start_after_a_crash_are_the_subscriptions_share() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path());
        s.gather_heads_by(50_000);
        let want = s.main_failure_heads_by(2, 50_000).unwrap();
        *crate::util::lock(&s.heads) = None;

        assert!(s.read_ahead_of_start(false));
        assert!(
            crate::util::lock(&s.verified_counts).is_none(),
            "no counts are kept for a start that does not compare them"
        );
        s.chunks_scanned.store(0, Ordering::Relaxed);
        assert_eq!(s.main_failure_heads_by(2, 50_000).unwrap(), want);
        assert_eq!(s.chunks_scanned.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn damage_met_ahead_keeps_nothing_and_the_store_is_refused_as_before() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path());
        let ck = sched::chunk_key(&key(10_000, 1, 0));
        let mut v = s.sched.get(ck).unwrap().unwrap().to_vec();
        let last = v.len() - 1;
        v[last] ^= 0x5a;
        s.sched.insert(ck, v).unwrap();
        let refused = |s: &SledStorage| match s.inventory(true) {
            Err(StorageError::Corrupt(why)) => why,
            other => panic!("not refused: {other:?}"),
        };
        let want = refused(&s);
        *crate::util::lock(&s.heads) = None;

        for count in [true, false] {
            assert!(!s.read_ahead_of_start(count));
            assert!(crate::util::lock(&s.verified_counts).is_none());
            assert!(crate::util::lock(&s.heads).is_none());
            assert_eq!(refused(&s), want);
            assert!(s.main_failure_heads_by(1, 50_000).is_err());
        }
    }
}
