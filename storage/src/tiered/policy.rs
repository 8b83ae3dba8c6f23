//! Offload policies: when a topic's sealed segments go to the object store
//! and when their local copies go. Set per namespace (`tenant/namespace`)
//! or per topic, stored in sled's `meta` (`o:p:<target>`) like retention
//! policies; a topic's own replaces its namespace's, which replaces the
//! `[tiered]` section's default. Pure decisions live here too.

use crate::{SledStorage, StorageResult as Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Mutex;

/// When to offload and when to delete the local copy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffloadPolicy {
    /// Offload a sealed segment this long after its creation.
    pub offload_after_ms: Option<u64>,
    /// Offload the oldest sealed segments while the topic's local segments
    /// hold more bytes than this.
    pub local_limit_bytes: Option<u64>,
    /// Delete the local copy this long after the offload (unset: at once).
    pub delete_lag_ms: Option<u64>,
    /// Never delete local copies.
    #[serde(default)]
    pub keep_local: bool,
}

impl OffloadPolicy {
    /// Whether nothing is set (such a policy is removed).
    pub fn is_empty(&self) -> bool {
        self.offload_after_ms.is_none()
            && self.local_limit_bytes.is_none()
            && self.delete_lag_ms.is_none()
            && !self.keep_local
    }

    /// Which of `sealed` (oldest first: created ms, bytes, offloaded
    /// already) to offload at `now_ms`, given `local_bytes` on disk.
    pub fn choose(&self, now_ms: u64, local_bytes: u64, sealed: &[(u64, u64, bool)]) -> Vec<usize> {
        let mut over = self
            .local_limit_bytes
            .map(|limit| local_bytes.saturating_sub(limit));
        let mut out = Vec::new();
        for (i, &(created, bytes, done)) in sealed.iter().enumerate() {
            let by_size = over.is_some_and(|o| o > 0);
            if let Some(o) = over.as_mut() {
                *o = o.saturating_sub(bytes);
            }
            let by_age = self
                .offload_after_ms
                .is_some_and(|age| now_ms.saturating_sub(created) >= age);
            if !done && (by_size || by_age) {
                out.push(i);
            }
        }
        out
    }

    /// Whether a local copy offloaded at `offloaded_ms` may go at `now_ms`.
    pub fn may_delete_local(&self, now_ms: u64, offloaded_ms: u64) -> bool {
        self.local_copies().may_delete(now_ms, offloaded_ms)
    }

    /// What the policy says of local copies once offloaded (what a
    /// replicated topic's leader stamps in the group's record).
    pub fn local_copies(&self) -> LocalCopies {
        LocalCopies {
            keep_local: self.keep_local,
            delete_lag_ms: self.delete_lag_ms,
        }
    }
}

/// When the local copies of an offloaded segment go: the part of an
/// [`OffloadPolicy`] every replica of a replicated topic must agree on.
/// Its leader resolves the policy in force (the topic's, its namespace's,
/// the `[tiered]` default) and stamps this in the group's offload record
/// ([`super::SegmentState::local`]), so every replica follows the leader's
/// decision rather than its own namespace policy or defaults.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalCopies {
    /// Never delete the local copies.
    #[serde(default)]
    pub keep_local: bool,
    /// Delete them this long after the offload (unset: at once).
    #[serde(default)]
    pub delete_lag_ms: Option<u64>,
}

impl LocalCopies {
    /// Whether a local copy offloaded at `offloaded_ms` may go at `now_ms`.
    pub fn may_delete(&self, now_ms: u64, offloaded_ms: u64) -> bool {
        !self.keep_local && now_ms.saturating_sub(offloaded_ms) >= self.delete_lag_ms.unwrap_or(0)
    }
}

/// A stored policy.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Stored {
    target: String,
    policy: OffloadPolicy,
}

/// The policies in force.
#[derive(Debug, Default)]
pub struct Policies {
    by_target: Mutex<BTreeMap<String, OffloadPolicy>>,
    default: Option<OffloadPolicy>,
}

const PREFIX: &str = "p:";

impl Policies {
    /// The stored policies, over the config's `default`.
    pub fn load(sled: &SledStorage, default: Option<OffloadPolicy>) -> Result<Self> {
        let by_target = sled
            .tiered_records::<Stored>(PREFIX)?
            .into_iter()
            .map(|s| (s.target, s.policy))
            .collect();
        Ok(Self {
            by_target: Mutex::new(by_target),
            default,
        })
    }

    /// The policy set on exactly `target`.
    pub fn get(&self, target: &str) -> Option<OffloadPolicy> {
        crate::util::lock(&self.by_target).get(target).cloned()
    }

    /// The namespaces' policies (targets without a scheme: topics' stored
    /// names have one), by namespace.
    pub fn namespaces(&self) -> BTreeMap<String, OffloadPolicy> {
        crate::util::lock(&self.by_target)
            .iter()
            .filter(|(target, _)| !target.contains("://"))
            .map(|(target, p)| (target.clone(), p.clone()))
            .collect()
    }

    /// The policy in force for `topic` (full name) and where it comes
    /// from: the topic, its namespace (`tenant/namespace`), or "config".
    pub fn effective(&self, topic: &str, namespace: &str) -> Option<(OffloadPolicy, String)> {
        let map = crate::util::lock(&self.by_target);
        if let Some(p) = map.get(topic) {
            return Some((p.clone(), topic.to_owned()));
        }
        if let Some(p) = map.get(namespace) {
            return Some((p.clone(), namespace.to_owned()));
        }
        self.default.clone().map(|p| (p, "config".to_owned()))
    }

    /// Stores (or, when empty, removes) `target`'s policy; durable after
    /// the next flush, in force at once.
    pub fn set(&self, sled: &SledStorage, target: &str, policy: OffloadPolicy) -> Result<()> {
        let key = format!("{PREFIX}{target}");
        if policy.is_empty() {
            sled.remove_tiered(&key)?;
            crate::util::lock(&self.by_target).remove(target);
        } else {
            sled.put_tiered(
                &key,
                &Stored {
                    target: target.to_owned(),
                    policy: policy.clone(),
                },
            )?;
            crate::util::lock(&self.by_target).insert(target.to_owned(), policy);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn age_and_size_choose_the_oldest_not_yet_offloaded() {
        let p = OffloadPolicy {
            offload_after_ms: Some(100),
            ..Default::default()
        };
        // created at 0, 50, 150; now 200: the first two are old enough.
        let sealed = [(0, 10, false), (50, 10, false), (150, 10, false)];
        assert_eq!(p.choose(200, 30, &sealed), vec![0, 1]);
        // One already offloaded is not chosen again.
        let sealed = [(0, 10, true), (50, 10, false), (150, 10, false)];
        assert_eq!(p.choose(200, 30, &sealed), vec![1]);
        let p = OffloadPolicy {
            local_limit_bytes: Some(15),
            ..Default::default()
        };
        // 30 bytes local, limit 15: the oldest two bring it to 10.
        let sealed = [(0, 10, false), (50, 10, false), (150, 10, false)];
        assert_eq!(p.choose(200, 30, &sealed), vec![0, 1]);
        assert!(p.choose(200, 15, &sealed).is_empty());
    }

    #[test]
    fn local_copies_wait_for_the_lag_and_stay_with_keep_local() {
        let p = OffloadPolicy {
            delete_lag_ms: Some(1000),
            ..Default::default()
        };
        assert!(!p.may_delete_local(1500, 1000));
        assert!(p.may_delete_local(2000, 1000));
        let keep = OffloadPolicy {
            keep_local: true,
            ..Default::default()
        };
        assert!(!keep.may_delete_local(u64::MAX, 0));
        assert!(OffloadPolicy::default().may_delete_local(5, 5));
    }
}
