//! The manifest: a small record of what a store must hold, kept apart from
//! the store (for sled, a file beside its files, written to a temporary
//! name, fsynced, renamed and the directory fsynced), so damage that makes
//! the engine quietly forget data cannot also forget that the data existed.
//!
//! It holds a store identity (a random id also written into the store, so a
//! manifest is never checked against another store's data), per topic the
//! ids reserved for it (ids below are never handed out again, crash or not),
//! and what a snapshot found durable: the entry range's end, the segments
//! and the subscriptions. At a clean stop it also holds exact counts of dead
//! letters and scheduled messages, per subscription. [`verify`] compares a manifest with what a
//! store holds (an [`Inventory`]) and lists every problem; what is exact and
//! what is a lower bound is said on each field.

use super::TopicKind;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// The manifest's file name in the data directory.
pub const FILE_NAME: &str = "ricochet.manifest";
/// The first word of a manifest file.
const MAGIC: &str = "ricochet-manifest";
/// The version of the manifest's layout.
const VERSION: u32 = 1;

/// What a store must hold.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// The store's identity (also stored in the store itself).
    pub store_id: String,
    /// When it was written, ms since the epoch.
    pub written_ms: u64,
    /// Written by a clean stop, with nothing changed since: the counts are exact.
    pub clean: bool,
    /// Per topic: reserved ids and recorded facts.
    pub topics: BTreeMap<String, TopicFacts>,
    /// Dead letters stored at the clean stop (exact; `None` while running).
    pub dead_letters: Option<u64>,
    /// Scheduled retries stored at the clean stop (exact; `None` while running).
    pub scheduled: Option<u64>,
}

/// One topic's entry in the manifest.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TopicFacts {
    /// Every entry id handed out (in a receipt or a delivery) is below
    /// this; it is made durable before ids up to it are used, so it is an
    /// exact upper bound across crashes. A topic opened again starts at or
    /// above it.
    pub reserved: u64,
    /// What a snapshot found durable (`None` until the first one after the
    /// topic was created).
    pub recorded: Option<Recorded>,
}

/// What a topic held at a snapshot, once durable: lower bounds the store
/// must meet at the next start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Recorded {
    /// What the topic is for.
    pub kind: TopicKind,
    /// Entries below this were durable (the stored log must reach it).
    pub next: u64,
    /// The engine's segments then, as inclusive ranges: each one at or above
    /// the lowest segment still stored must still exist (segments are only
    /// dropped from the bottom).
    pub segments: Vec<(u64, u64)>,
    /// Subscriptions then (deleting one updates the manifest first).
    pub subscriptions: BTreeSet<String>,
    /// Per subscription, its dead letters and scheduled messages: exact,
    /// recorded by a clean stop only (empty while running, since retries
    /// fire and dead letters are purged between snapshots).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub counts: BTreeMap<String, SubCounts>,
}

/// A subscription's dead letters and scheduled messages (retries, delayed
/// messages, held nacks), counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubCounts {
    /// Dead-letter records.
    pub dead_letters: u64,
    /// Schedule entries.
    pub scheduled: u64,
}

/// What a store holds, as the manifest describes it: the engine's answer
/// to [`super::Storage::inventory`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Inventory {
    /// The identity written into the store, if any.
    pub store_id: Option<String>,
    /// Whether the store holds any record at all.
    pub has_data: bool,
    /// Every topic with a stored record.
    pub topics: BTreeMap<String, TopicInventory>,
    /// Dead letters, when counted.
    pub dead_letters: Option<u64>,
    /// Schedule entries, when counted.
    pub scheduled: Option<u64>,
}

/// One stored topic.
#[derive(Debug, Clone, PartialEq)]
pub struct TopicInventory {
    /// What the topic is for.
    pub kind: TopicKind,
    /// First entry id stored.
    pub first: u64,
    /// One past the last entry id stored (or the id floor).
    pub next: u64,
    /// Segment numbers stored, ascending (empty for engines without segments).
    pub segments: Vec<u64>,
    /// Subscription names.
    pub subscriptions: BTreeSet<String>,
    /// Per subscription name, when counted (`Storage::inventory` with
    /// `counts`): every subscription of the topic is in it.
    pub counts: Option<BTreeMap<String, SubCounts>>,
}

impl TopicInventory {
    /// The facts a snapshot records for this topic (with the counts when
    /// they were counted).
    pub fn recorded(&self) -> Recorded {
        Recorded {
            kind: self.kind,
            next: self.next,
            segments: ranges(&self.segments),
            subscriptions: self.subscriptions.clone(),
            counts: self.counts.clone().unwrap_or_default(),
        }
    }
}

/// Ascending numbers as inclusive ranges.
fn ranges(numbers: &[u64]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &n in numbers {
        match out.last_mut() {
            Some((_, end)) if end.checked_add(1) == Some(n) => *end = n,
            _ => out.push((n, n)),
        }
    }
    out
}

impl Manifest {
    /// The file's bytes: a header line with the version and a CRC-32C of
    /// the body, then the body as JSON (readable with any tool).
    pub fn encode(&self) -> Vec<u8> {
        // Serialising plain records cannot fail.
        let body = serde_json::to_vec_pretty(self).unwrap_or_default();
        let mut out =
            format!("{MAGIC} {VERSION} crc32c={:08x}\n", crc32c::crc32c(&body)).into_bytes();
        out.extend_from_slice(&body);
        out.push(b'\n');
        out
    }

    /// Parses and verifies a manifest file; the error says what is wrong.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let newline = bytes
            .iter()
            .position(|b| *b == b'\n')
            .ok_or("no header line")?;
        let header = std::str::from_utf8(&bytes[..newline]).map_err(|_| "unreadable header")?;
        let mut words = header.split(' ');
        if words.next() != Some(MAGIC) {
            return Err("not a ricochet manifest".into());
        }
        let version: u32 = words
            .next()
            .and_then(|v| v.parse().ok())
            .ok_or("no version in the header")?;
        if version != VERSION {
            return Err(format!(
                "manifest version {version}; this broker reads version {VERSION}"
            ));
        }
        let crc = words
            .next()
            .and_then(|w| w.strip_prefix("crc32c="))
            // Exactly as written: eight lower-case hex digits.
            .filter(|h| h.len() == 8 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
            .and_then(|h| u32::from_str_radix(h, 16).ok())
            .ok_or("no checksum in the header")?;
        let body = bytes[newline + 1..]
            .strip_suffix(b"\n")
            .ok_or("truncated (no final newline)")?;
        let actual = crc32c::crc32c(body);
        if actual != crc {
            return Err(format!(
                "checksum mismatch (header {crc:08x}, body {actual:08x})"
            ));
        }
        serde_json::from_slice(body).map_err(|e| format!("unreadable body: {e}"))
    }

    /// Number of topics with recorded facts.
    pub fn recorded_topics(&self) -> usize {
        self.topics
            .values()
            .filter(|t| t.recorded.is_some())
            .count()
    }
}

/// Everything that `inventory` lacks of what `manifest` says must exist,
/// one readable sentence each; empty when the store is whole. `None` for
/// the manifest means none was found.
pub fn verify(manifest: Option<&Manifest>, inv: &Inventory) -> Vec<String> {
    let mut problems = Vec::new();
    let Some(m) = manifest else {
        if inv.store_id.is_none() && inv.has_data {
            problems.push(
                "the store holds data but no store id: it was written by a ricochet broker \
                 without checksums (before storage format 2), which this broker cannot verify; \
                 drain it with the broker that wrote it"
                    .to_owned(),
            );
        } else if inv.has_data || !inv.topics.is_empty() {
            problems.push(format!(
                "the manifest ({FILE_NAME}) is missing, but the store holds {} topic(s)",
                inv.topics.len()
            ));
        }
        return problems;
    };
    match &inv.store_id {
        None if m.recorded_topics() > 0 => {
            problems.push(format!(
                "the database is missing or empty, but the manifest of store {} records {} topic(s)",
                m.store_id,
                m.recorded_topics()
            ));
            return problems;
        }
        Some(id) if *id != m.store_id => {
            problems.push(format!(
                "the manifest belongs to store {}, the database is store {id}",
                m.store_id
            ));
            return problems;
        }
        _ => {}
    }
    for (name, facts) in &m.topics {
        let Some(rec) = &facts.recorded else { continue };
        let Some(stored) = inv.topics.get(name) else {
            problems.push(format!(
                "topic {name} is missing (the manifest records entries up to {})",
                rec.next
            ));
            continue;
        };
        if stored.next < rec.next {
            problems.push(format!(
                "topic {name} ends at entry {}, the manifest records entries up to {}",
                stored.next, rec.next
            ));
        }
        if let Some(lowest) = stored.segments.first() {
            let missing: Vec<u64> = rec
                .segments
                .iter()
                .flat_map(|(a, b)| *a.max(lowest)..=*b)
                .filter(|s| stored.segments.binary_search(s).is_err())
                .take(3)
                .collect();
            if !missing.is_empty() {
                problems.push(format!(
                    "topic {name} lacks segment(s) {missing:?} the manifest records"
                ));
            }
        } else if !rec.segments.is_empty() && stored.next > stored.first {
            problems.push(format!("topic {name} holds no segment"));
        }
        for sub in rec.subscriptions.difference(&stored.subscriptions) {
            problems.push(format!("subscription {sub} on {name} is missing"));
        }
        if let Some(counted) = &stored.counts {
            for (sub, r) in &rec.counts {
                let Some(s) = counted.get(sub) else { continue };
                let pairs = [
                    ("dead letters", r.dead_letters, s.dead_letters),
                    ("scheduled messages", r.scheduled, s.scheduled),
                ];
                for (what, recorded, stored) in pairs {
                    if stored < recorded {
                        problems.push(format!(
                            "subscription {sub} on {name} holds {stored} {what}, the manifest \
                             records {recorded} at the last clean stop ({} missing)",
                            recorded - stored
                        ));
                    }
                }
            }
        }
    }
    // Totals: what a manifest without per-subscription counts recorded.
    let per_subscription = m
        .topics
        .values()
        .any(|t| t.recorded.as_ref().is_some_and(|r| !r.counts.is_empty()));
    let counts = [
        ("dead letters", m.dead_letters, inv.dead_letters),
        ("scheduled retries", m.scheduled, inv.scheduled),
    ];
    for (what, recorded, stored) in counts {
        if let (Some(r), Some(s)) = (recorded, stored)
            && !per_subscription
            && s < r
        {
            problems.push(format!(
                "{s} {what} stored, the manifest records {r} at the last clean stop"
            ));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inventory(next: u64, segments: Vec<u64>, subs: &[&str]) -> Inventory {
        let mut topics = BTreeMap::new();
        topics.insert(
            "t".to_owned(),
            TopicInventory {
                kind: TopicKind::Normal,
                first: 0,
                next,
                segments,
                subscriptions: subs.iter().map(|s| s.to_string()).collect(),
                counts: None,
            },
        );
        Inventory {
            store_id: Some("abc".into()),
            has_data: true,
            topics,
            dead_letters: Some(3),
            scheduled: Some(2),
        }
    }

    fn manifest_of(inv: &Inventory) -> Manifest {
        Manifest {
            store_id: "abc".into(),
            written_ms: 1,
            clean: true,
            topics: inv
                .topics
                .iter()
                .map(|(n, t)| {
                    (
                        n.clone(),
                        TopicFacts {
                            reserved: t.next,
                            recorded: Some(t.recorded()),
                        },
                    )
                })
                .collect(),
            dead_letters: inv.dead_letters,
            scheduled: inv.scheduled,
        }
    }

    #[test]
    fn the_file_round_trips_and_any_damage_is_refused() {
        let m = manifest_of(&inventory(40, vec![0, 1, 2], &["s"]));
        let bytes = m.encode();
        assert_eq!(Manifest::decode(&bytes).unwrap(), m);
        assert!(bytes.starts_with(b"ricochet-manifest 1 crc32c="));
        for at in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[at] ^= 0x20;
            assert!(Manifest::decode(&bad).is_err(), "flip at {at} accepted");
        }
        for len in 0..bytes.len() {
            assert!(
                Manifest::decode(&bytes[..len]).is_err(),
                "truncation at {len}"
            );
        }
    }

    #[test]
    fn a_whole_store_passes_and_each_loss_is_named() {
        let whole = inventory(40, vec![1, 2], &["s"]);
        let m = manifest_of(&whole);
        assert!(verify(Some(&m), &whole).is_empty());
        // More than recorded is fine: later writes, trimmed segments.
        assert!(verify(Some(&m), &inventory(50, vec![2, 3], &["s", "u"])).is_empty());

        let shorter = verify(Some(&m), &inventory(30, vec![1, 2], &["s"]));
        assert_eq!(
            shorter,
            vec!["topic t ends at entry 30, the manifest records entries up to 40"]
        );
        let hole = verify(Some(&m), &inventory(40, vec![0, 2], &["s"]));
        assert_eq!(
            hole,
            vec!["topic t lacks segment(s) [1] the manifest records"]
        );
        let no_sub = verify(Some(&m), &inventory(40, vec![1, 2], &[]));
        assert_eq!(no_sub, vec!["subscription s on t is missing"]);
        let mut fewer = whole.clone();
        fewer.dead_letters = Some(2);
        assert_eq!(
            verify(Some(&m), &fewer),
            vec!["2 dead letters stored, the manifest records 3 at the last clean stop"]
        );
        let mut gone = whole.clone();
        gone.topics.clear();
        assert_eq!(
            verify(Some(&m), &gone),
            vec!["topic t is missing (the manifest records entries up to 40)"]
        );
    }

    #[test]
    fn a_subscription_that_lost_dead_letters_or_scheduled_messages_is_named() {
        let counted = |dead_letters, scheduled| {
            let mut inv = inventory(40, vec![0], &["s"]);
            let t = inv.topics.get_mut("t").unwrap();
            t.counts = Some(
                [(
                    "s".to_owned(),
                    SubCounts {
                        dead_letters,
                        scheduled,
                    },
                )]
                .into(),
            );
            inv
        };
        let m = manifest_of(&counted(3, 2));
        assert_eq!(m.topics["t"].recorded.as_ref().unwrap().counts.len(), 1);
        assert!(verify(Some(&m), &counted(3, 2)).is_empty());
        assert!(verify(Some(&m), &counted(4, 9)).is_empty(), "more is fine");
        assert_eq!(
            verify(Some(&m), &counted(1, 2)),
            vec![
                "subscription s on t holds 1 dead letters, the manifest records 3 at the last \
                 clean stop (2 missing)"
            ]
        );
        assert_eq!(
            verify(Some(&m), &counted(3, 0)),
            vec![
                "subscription s on t holds 0 scheduled messages, the manifest records 2 at the \
                 last clean stop (2 missing)"
            ]
        );
        // Not counted (a store opened without counting): nothing compared,
        // and the totals are not compared twice.
        let mut uncounted = counted(0, 0);
        uncounted.topics.get_mut("t").unwrap().counts = None;
        uncounted.dead_letters = Some(0);
        assert!(verify(Some(&m), &uncounted).is_empty());
    }

    #[test]
    fn identity_and_missing_pieces() {
        let whole = inventory(40, vec![0], &[]);
        let m = manifest_of(&whole);
        let empty = Inventory::default();
        assert!(verify(None, &empty).is_empty(), "a fresh directory");
        assert!(verify(None, &whole)[0].contains("manifest (ricochet.manifest) is missing"));
        let mut legacy = whole.clone();
        legacy.store_id = None;
        assert!(verify(None, &legacy)[0].contains("without checksums"));
        assert!(verify(Some(&m), &empty)[0].contains("database is missing or empty"));
        let mut other = whole.clone();
        other.store_id = Some("xyz".into());
        assert_eq!(
            verify(Some(&m), &other),
            vec!["the manifest belongs to store abc, the database is store xyz"]
        );
        // A manifest that records nothing yet accepts an empty store.
        let mut bare = m.clone();
        bare.topics.clear();
        assert!(verify(Some(&bare), &empty).is_empty());
    }

    #[test]
    fn segments_collapse_into_ranges() {
        assert_eq!(ranges(&[0, 1, 2, 5, 7, 8]), vec![(0, 2), (5, 5), (7, 8)]);
        assert_eq!(ranges(&[]), vec![]);
    }
}
