//! Membership: this broker's etcd lease and what hangs on it. The broker
//! registers `brokers/<id>` (a JSON [`Registration`]) under its lease and
//! renews the lease every third of its TTL; each renewal whose request was
//! *sent* at `t` moves the local [`Fence`] deadline to `t + TTL − TTL/5`,
//! which is earlier than etcd can expire the lease. Every write the broker
//! acknowledges is checked against that deadline first (one clock read and
//! one atomic load, no etcd round trip), so a broker that cannot renew —
//! etcd unreachable, the process paused past the TTL — stops acknowledging
//! before etcd drops its keys and before anyone could take over.
//!
//! A renewal that answers TTL 0 means etcd has expired the lease: the
//! fence's generation moves on (streams opened under the old one fail),
//! the broker grants a new lease, registers again and re-claims its placed
//! topics, which gives them new epochs. The loop also refreshes the
//! registration (load, placed count) and claims topics placed on this
//! broker by others.

use crate::error::ClusterError;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The value of `brokers/<id>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct Registration {
    /// The advertised URL.
    pub url: String,
    /// When this process registered, ms since the Unix epoch.
    pub registered_at_ms: u64,
    /// Messages per second published to its topics over the last interval.
    pub load: f64,
    /// How many topics are placed on it.
    pub placed: u64,
    /// Being drained: no new topic is placed on it.
    pub draining: bool,
    /// The role its peer credential proves (`[cluster] peer_token_file`,
    /// verified by the broker itself at start): the only role other brokers
    /// let speak Raft for it. `None` with auth off, and in registrations of
    /// brokers from before per-broker identities.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer_role: Option<String>,
    /// The identity of its second tier's object store (`[tiered]`: the
    /// URL's bucket and prefix, or directory, and the endpoint; never a
    /// credential), which every member of a replication group must share.
    /// `None`: no `[tiered]` section (or a broker from before tiers were
    /// registered).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
    /// Which replication-group commands it applies, as a level (each level
    /// includes the ones below): 1 = `PartitionCommand::Seal`, 2 =
    /// `PartitionCommand::SealBelow`. A group's leader proposes a command
    /// only when every member advertises its level. 0: a broker from before
    /// the level was registered (the field is absent).
    pub group_commands: u32,
    /// Where it rolls a topic's active segment at an append (its
    /// `segment_entries` and `segment_max_bytes`): a replicated topic's
    /// replicas roll there, so members with different settings split the
    /// topic at different ids. `None`: a broker from before the field.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub segment_rolls: Option<SegmentRolls>,
}

/// Where a broker rolls a topic's active segment at an append: at each
/// block of `entries` ids, and once it holds `max_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentRolls {
    /// `segment_entries`.
    pub entries: u64,
    /// `segment_max_bytes`.
    pub max_bytes: u64,
}

impl std::fmt::Display for SegmentRolls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "segment_entries = {}, segment_max_bytes = {}",
            self.entries, self.max_bytes
        )
    }
}

/// The brokers among `registered` (id and advertised rolls, as
/// [`Cluster::segment_rolls`](crate::Cluster::segment_rolls) reads them)
/// other than `me` whose segment rolls differ from `mine`; one that
/// advertises none (an older build) is left out, its rolls being unknown.
pub fn differing_rolls(
    me: &str,
    mine: SegmentRolls,
    registered: &[(String, Option<SegmentRolls>)],
) -> Vec<(String, SegmentRolls)> {
    registered
        .iter()
        .filter(|(id, _)| id != me)
        .filter_map(|(id, r)| r.filter(|r| *r != mine).map(|r| (id.clone(), r)))
        .collect()
}

/// What a broker advertises in its registration besides its URL and load
/// (see [`Registration`]'s fields of the same names).
#[derive(Debug, Clone, Default)]
pub struct Advertised {
    /// The role its peer credential proves.
    pub peer_role: Option<String>,
    /// The identity of its second tier's store.
    pub tier: Option<String>,
    /// The level of replication-group commands it applies.
    pub group_commands: u32,
    /// Where it rolls a topic's active segment at an append.
    pub segment_rolls: Option<SegmentRolls>,
}

impl Registration {
    /// The registration stored in `value`; an unreadable one reads as the
    /// default (no URL, no load), as a broker that has not registered.
    pub fn parse(value: &str) -> Self {
        serde_json::from_str(value).unwrap_or_default()
    }
}

/// The local lease deadline and its generation: whether this broker may
/// still acknowledge writes under the ownership it claimed.
#[derive(Debug)]
pub struct Fence {
    broker: String,
    base: Instant,
    /// Ms after `base` until which the lease surely holds in etcd.
    deadline_ms: AtomicU64,
    /// Moves on each time the lease is lost; ownership claimed under an
    /// older generation is void.
    generation: AtomicU64,
    changed: tokio::sync::watch::Sender<u64>,
}

impl Fence {
    /// A fence that holds nothing yet.
    pub fn new(broker: &str) -> Self {
        Self {
            broker: broker.to_owned(),
            base: Instant::now(),
            deadline_ms: AtomicU64::new(0),
            generation: AtomicU64::new(1),
            changed: tokio::sync::watch::channel(1).0,
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// The current generation.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Whether the lease surely still holds.
    pub fn holds(&self) -> bool {
        self.now_ms() < self.deadline_ms.load(Ordering::Acquire)
    }

    /// Whether a claim made under `generation` may still acknowledge.
    pub fn valid(&self, generation: u64) -> bool {
        self.holds() && self.generation() == generation
    }

    /// `Ok` while a claim made under `generation` may acknowledge, else
    /// [`ClusterError::Fenced`].
    pub fn check(&self, generation: u64) -> Result<(), ClusterError> {
        if self.valid(generation) {
            Ok(())
        } else {
            Err(self.fenced())
        }
    }

    /// The error for acknowledging past the deadline.
    pub fn fenced(&self) -> ClusterError {
        ClusterError::Fenced(self.broker.clone())
    }

    /// A renewal (or grant) of `ttl` whose request was sent at `sent`.
    pub fn extend(&self, sent: Instant, ttl: Duration) {
        let holds_for = ttl - ttl / 5;
        let until = match sent.checked_duration_since(self.base) {
            Some(after) => after + holds_for,
            None => holds_for.saturating_sub(self.base.duration_since(sent)),
        };
        let until = u64::try_from(until.as_millis()).unwrap_or(u64::MAX);
        self.deadline_ms.fetch_max(until, Ordering::AcqRel);
    }

    /// The lease is gone: nothing claimed so far may acknowledge again.
    pub fn lose(&self) {
        self.deadline_ms.store(0, Ordering::Release);
        let g = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
        self.changed.send_replace(g);
    }

    /// Resolves once a claim made under `generation` may no longer
    /// acknowledge (the deadline passed, or the lease was lost).
    pub async fn lapsed(&self, generation: u64) {
        let mut changed = self.changed.subscribe();
        loop {
            if !self.valid(generation) {
                return;
            }
            let left = self
                .deadline_ms
                .load(Ordering::Acquire)
                .saturating_sub(self.now_ms());
            tokio::select! {
                r = changed.changed() => {
                    if r.is_err() {
                        tokio::time::sleep(Duration::from_millis(left)).await;
                    }
                }
                _ = tokio::time::sleep(Duration::from_millis(left)) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registration_carries_its_peer_role_and_older_ones_read_without() {
        let reg = Registration {
            url: "https://b1:6650".into(),
            peer_role: Some("broker-b1".into()),
            ..Default::default()
        };
        let json = serde_json::to_string(&reg).unwrap();
        assert_eq!(Registration::parse(&json), reg);
        let old = Registration::parse(r#"{"url":"http://b2:6650","load":1.5}"#);
        assert_eq!((old.url.as_str(), old.peer_role), ("http://b2:6650", None));
        let none = serde_json::to_string(&Registration::default()).unwrap();
        assert!(!none.contains("peer_role"), "{none}");
        assert!(!none.contains("tier"), "{none}");
        let tiered = Registration {
            tier: Some("s3://bucket/prefix endpoint=http://s3:9000".into()),
            ..Default::default()
        };
        let json = serde_json::to_string(&tiered).unwrap();
        assert_eq!(Registration::parse(&json), tiered);
    }

    #[test]
    fn a_registration_carries_its_group_command_level_and_older_ones_read_as_zero() {
        let reg = Registration {
            url: "http://b1:6650".into(),
            group_commands: 2,
            ..Default::default()
        };
        let json = serde_json::to_string(&reg).unwrap();
        assert!(json.contains(r#""group_commands":2"#), "{json}");
        assert_eq!(Registration::parse(&json).group_commands, 2);
        let old = Registration::parse(r#"{"url":"http://b2:6650","registered_at_ms":5}"#);
        assert_eq!(old.group_commands, 0);
    }

    #[test]
    fn segment_rolls_that_differ_from_this_brokers_are_named_and_unknown_ones_skipped() {
        let mine = SegmentRolls {
            entries: 16_384,
            max_bytes: 64 << 20,
        };
        let reg = Registration {
            segment_rolls: Some(mine),
            ..Default::default()
        };
        let json = serde_json::to_string(&reg).unwrap();
        assert_eq!(Registration::parse(&json), reg);
        let old = Registration::parse(r#"{"url":"http://b2:6650"}"#);
        assert_eq!(old.segment_rolls, None);
        let other = SegmentRolls {
            entries: 100_000,
            ..mine
        };
        let registered = vec![
            ("b0".to_owned(), Some(other)),
            ("b1".to_owned(), Some(mine)),
            ("b2".to_owned(), None),
            ("b3".to_owned(), Some(other)),
        ];
        assert_eq!(
            differing_rolls("b1", mine, &registered),
            vec![("b0".to_owned(), other), ("b3".to_owned(), other)]
        );
        // Seen from b0, b1 differs (b3 does not).
        assert_eq!(
            differing_rolls("b0", other, &registered),
            vec![("b1".to_owned(), mine)]
        );
        assert_eq!(
            other.to_string(),
            "segment_entries = 100000, segment_max_bytes = 67108864"
        );
    }

    #[test]
    fn the_deadline_is_the_send_instant_plus_four_fifths_of_the_ttl() {
        let fence = Fence::new("b1");
        assert!(!fence.holds(), "nothing granted yet");
        let g = fence.generation();
        fence.extend(Instant::now(), Duration::from_secs(10));
        assert!(fence.valid(g));
        // A renewal sent long ago does not move the deadline back.
        fence.extend(
            Instant::now() - Duration::from_secs(60),
            Duration::from_secs(10),
        );
        assert!(fence.valid(g));
        // One whose four fifths are already over leaves it where it was.
        let stale = Fence::new("b2");
        stale.extend(
            Instant::now() - Duration::from_secs(9),
            Duration::from_secs(10),
        );
        assert!(!stale.holds());
        let e = stale.check(stale.generation()).unwrap_err().to_string();
        assert_eq!(e, "broker b2 lost its etcd lease");
    }

    #[tokio::test]
    async fn losing_the_lease_voids_every_earlier_claim_at_once() {
        let fence = std::sync::Arc::new(Fence::new("b1"));
        fence.extend(Instant::now(), Duration::from_secs(60));
        let g = fence.generation();
        let lapsed = tokio::spawn({
            let f = fence.clone();
            async move { f.lapsed(g).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!lapsed.is_finished(), "the lease still holds");
        fence.lose();
        tokio::time::timeout(Duration::from_secs(10), lapsed)
            .await
            .expect("lapsed resolves on the loss")
            .unwrap();
        assert!(!fence.valid(g));
        assert!(!fence.holds());
        fence.extend(Instant::now(), Duration::from_secs(60));
        assert!(!fence.valid(g), "a new lease does not revive old claims");
        assert!(fence.valid(fence.generation()));
    }

    #[tokio::test]
    async fn lapsed_resolves_when_the_deadline_passes() {
        let fence = Fence::new("b1");
        fence.extend(Instant::now(), Duration::from_millis(500));
        let g = fence.generation();
        tokio::time::timeout(Duration::from_secs(10), fence.lapsed(g))
            .await
            .expect("the deadline (400 ms) passes");
        assert!(!fence.valid(g));
    }
}
