//! `ricochet-broker check` on a stopped store: [`SledStorage::verify`]
//! reads every stored value of every tree, checks its checksum and that it
//! decodes as what its tree holds, and reports what it found.

use super::codec::{self, decode_failures, from_json, read_be, unseal};
use super::*;

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
    /// `ricochet-broker check`. Writes nothing.
    pub fn verify(&self) -> VerifyReport {
        let mut report = VerifyReport::default();
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
            ("deadletters".into(), self.deadletters.clone()),
        ];
        for (topic, segs) in crate::util::lock(&self.segments).iter() {
            if !topics.contains(topic) {
                report.problem(format!(
                    "{} segment(s) of topic {topic}, which has no topic record",
                    segs.len()
                ));
            }
            for (seg, tree) in segs {
                trees.push((seg_tree_name(topic, *seg), tree.clone()));
            }
        }
        for (name, tree) in trees {
            for kv in tree.iter() {
                let (k, v) = match kv {
                    Ok(kv) => kv,
                    Err(e) => {
                        report.problem(format!("{name}: {}", StorageError::from(e)));
                        break;
                    }
                };
                report.values += 1;
                match check_value(&name, &k, &v) {
                    Ok(entries) => report.entries += entries,
                    Err(e) => report.problem(format!("{name}: {e}")),
                }
            }
        }
        report
    }
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
        "meta" if k == STORE_ID_KEY => std::str::from_utf8(body)
            .map(|_| 0)
            .map_err(|_| StorageError::Corrupt("unreadable store id".into())),
        "meta" => Err(bad_key()),
        "prodseq" => read_be(body).map(|_| 0),
        "failures" => {
            SubMessage::from_key(k).ok_or_else(bad_key)?;
            decode_failures(body).map(|_| 0)
        }
        "schedule" => {
            ScheduleKey::from_key(k).ok_or_else(bad_key)?;
            if body.is_empty() {
                Ok(0)
            } else {
                decode_failures(body).map(|_| 0)
            }
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
                ricochet_proto::Message::decode(entry).map_err(|e| {
                    StorageError::Corrupt(format!("entry {id} does not decode: {e}"))
                })?;
                n += 1;
            }
            Ok(n)
        }
    }
}
