//! The admin API's dead-letter decisions, on the wire: replay (into the
//! retry tier or onto the topic, with edits, at a rate, as a durable job),
//! purge, dry runs of both, group-by views and replay jobs. The
//! [`super::AdminService`] RPCs delegate here; nothing happens
//! automatically.
//!
//! Who made a change is the caller's role: a [`CallerRole`] request
//! extension (set by an authentication layer), else `anonymous`.

use crate::core::BrokerCore;
use crate::error::BrokerError;
use crate::events::{EventKind, FailureEvent};
use crate::name::{SubscriptionName, TopicName};
use crate::replay_jobs;
use crate::storage::{
    DeadLetterRecord, EditRecord, MessageEdit, ReplayJobRecord, ReplayOrder, ReplayTarget,
};
use crate::subscription::SubscriptionHandle;
use ricochet_proto::*;
use std::collections::BTreeMap;
use std::sync::Arc;
use tonic::{Request, Status};

/// The authenticated caller's role, as a request extension; recorded in a
/// dead letter's edit history.
#[derive(Debug, Clone)]
pub struct CallerRole(pub String);

/// Who makes `r`: its [`CallerRole`], or `anonymous`.
pub(super) fn caller<T>(r: &Request<T>) -> String {
    r.extensions()
        .get::<CallerRole>()
        .map_or_else(|| "anonymous".to_owned(), |c| c.0.clone())
}

/// The history entries of a failure record, as the wire shows them.
pub(super) fn edits(list: &[EditRecord]) -> Vec<DeadLetterEdit> {
    list.iter()
        .map(|e| DeadLetterEdit {
            time_ms: e.time_ms,
            by: e.by.clone(),
            payload_size_before: e.payload_size_before,
            payload_size_after: e.payload_size_after,
            properties_set: e.properties_set.clone(),
            properties_removed: e.properties_removed.clone(),
            key_changed: e.key_changed,
        })
        .collect()
}

async fn subscription(
    core: &BrokerCore,
    topic: &str,
    sub: &str,
) -> Result<SubscriptionHandle, BrokerError> {
    let t = TopicName::parse(topic)?;
    let s = SubscriptionName::parse(sub)?;
    core.subscription(&t, &s).await
}

/// Whether a dead letter passes `filter`.
pub(super) fn passes(filter: Option<&DeadLetterFilter>, id: u64, rec: &DeadLetterRecord) -> bool {
    let Some(f) = filter else { return true };
    if !f.entry_ids.is_empty() && !f.entry_ids.contains(&id) {
        return false;
    }
    if !f.reason_contains.is_empty()
        && !rec.reason.contains(&f.reason_contains)
        && !rec
            .failures
            .attempts
            .iter()
            .any(|a| a.detail.contains(&f.reason_contains))
    {
        return false;
    }
    if f.since_ms != 0 && rec.at_ms < f.since_ms {
        return false;
    }
    if f.until_ms != 0 && rec.at_ms >= f.until_ms {
        return false;
    }
    true
}

fn matching(
    core: &BrokerCore,
    h: &SubscriptionHandle,
    filter: Option<&DeadLetterFilter>,
) -> Result<Vec<(u64, DeadLetterRecord)>, BrokerError> {
    Ok(core
        .storage
        .dead_letters(h.id(), None)?
        .into_iter()
        .filter(|(id, rec)| passes(filter, *id, rec))
        .collect())
}

/// A wire edit as the broker's, checked: property names must be non-empty
/// and the edited message must fit the broker's message size limit (checked
/// on the payload, key and properties the edit brings).
fn edit_of(e: ReplayEdit, max_size: usize) -> Result<Option<MessageEdit>, Status> {
    if e.set_properties.keys().any(String::is_empty)
        || e.unset_properties.iter().any(String::is_empty)
    {
        return Err(Status::invalid_argument("edit: empty property name"));
    }
    let size = e.payload.as_ref().map_or(0, Vec::len)
        + e.key.as_ref().map_or(0, String::len)
        + e.set_properties
            .iter()
            .map(|(k, v)| k.len() + v.len())
            .sum::<usize>();
    if size > max_size {
        return Err(Status::invalid_argument(format!(
            "edit: {size} bytes exceeds the broker's max_message_size ({max_size})"
        )));
    }
    let edit = MessageEdit {
        payload: e.payload,
        set_properties: e.set_properties.into_iter().collect::<BTreeMap<_, _>>(),
        unset_properties: e.unset_properties,
        key: e.key,
    };
    Ok((edit != MessageEdit::default()).then_some(edit))
}

/// `ReplayDeadLetters`.
pub(super) async fn replay(
    core: &Arc<BrokerCore>,
    req: Request<ReplayDeadLettersRequest>,
) -> Result<ReplayDeadLettersResponse, Status> {
    let by = caller(&req);
    let r = req.into_inner();
    let mode = ReplayMode::try_from(r.mode)
        .map_err(|_| Status::invalid_argument(format!("unknown replay mode {}", r.mode)))?;
    let now = core.clock.now_ms();
    let target = match mode {
        ReplayMode::RetryTier => {
            let latest = now.saturating_add(core.config.max_delay.as_millis() as u64);
            if r.deliver_at_ms > latest {
                return Err(Status::invalid_argument(format!(
                    "deliver_at_ms is beyond the broker's max_delay ({:?} from now)",
                    core.config.max_delay
                )));
            }
            ReplayTarget::RetryTier {
                due_ms: r.deliver_at_ms,
            }
        }
        ReplayMode::Topic => {
            if r.deliver_at_ms != 0 {
                return Err(Status::invalid_argument(
                    "deliver_at_ms applies to the retry-tier mode only",
                ));
            }
            ReplayTarget::Topic
        }
    };
    let edit = r
        .edit
        .map(|e| edit_of(e, core.config.max_message_size))
        .transpose()?
        .flatten();
    let h = subscription(core, &r.topic, &r.subscription).await?;
    let ids: Vec<u64> = matching(core, &h, r.filter.as_ref())?
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    if r.dry_run || ids.is_empty() {
        return Ok(ReplayDeadLettersResponse {
            replayed: 0,
            new_ids: Vec::new(),
            dead_letter_ids: ids,
            dry_run: r.dry_run,
            job_id: 0,
            jobs: Vec::new(),
        });
    }
    let rate = if r.rate_per_second == 0 {
        core.config.replay_rate_per_second
    } else {
        r.rate_per_second
    }
    .max(1);
    let job = ReplayJobRecord {
        id: core.storage.next_id().map_err(BrokerError::from)?,
        topic: full_topic_name(&r.topic)?,
        subscription: r.subscription.clone(),
        total: ids.len() as u64,
        dead_letter_ids: ids.clone(),
        cursor: 0,
        replayed: 0,
        rate_per_second: rate,
        order: ReplayOrder {
            target,
            // An edit is a new attempt at a fixed message: unless told
            // otherwise, its first failure must not dead-letter it again.
            reset_count: r.reset_delivery_count.unwrap_or(edit.is_some()),
            edit,
            by,
        },
        created_ms: now,
    };
    let job_id = job.id;
    let started = job_wire(&job);
    let task = replay_jobs::start(core, job).await?;
    if r.detach {
        return Ok(ReplayDeadLettersResponse {
            replayed: 0,
            new_ids: Vec::new(),
            dead_letter_ids: ids,
            dry_run: false,
            job_id,
            jobs: vec![started],
        });
    }
    let outcome = task
        .await
        .map_err(|e| Status::internal(format!("replay job {job_id} failed: {e}")))??;
    if !outcome.finished {
        return Err(Status::unavailable(format!(
            "replay job {job_id} stopped after {} dead letter(s) (cancelled, or the broker is stopping; a stored job resumes at the next start)",
            outcome.replayed
        )));
    }
    Ok(ReplayDeadLettersResponse {
        replayed: outcome.replayed,
        new_ids: outcome
            .new_ids
            .into_iter()
            .map(|id| MessageId {
                topic: id.topic,
                entry_id: id.entry_id,
            })
            .collect(),
        dead_letter_ids: ids,
        dry_run: false,
        job_id,
        jobs: Vec::new(),
    })
}

/// The fully qualified topic name (as jobs store it).
fn full_topic_name(topic: &str) -> Result<String, Status> {
    Ok(TopicName::parse(topic)?.to_string())
}

/// `PurgeDeadLetters`.
pub(super) async fn purge(
    core: &Arc<BrokerCore>,
    r: PurgeDeadLettersRequest,
    by: String,
) -> Result<PurgeDeadLettersResponse, Status> {
    let h = subscription(core, &r.topic, &r.subscription).await?;
    let ids: Vec<u64> = matching(core, &h, r.filter.as_ref())?
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    if r.dry_run {
        return Ok(PurgeDeadLettersResponse {
            purged: 0,
            dead_letter_ids: ids,
            dry_run: true,
        });
    }
    let info = h.policy().await?;
    // A replicated topic's dead letters go through its group.
    let storage = core.storage_for(&full_topic_name(&r.topic)?);
    storage
        .remove_dead_letters(h.id(), &ids)
        .map_err(BrokerError::from)?;
    storage
        .remove_entries(&info.dead_letter_topic, &ids)
        .map_err(BrokerError::from)?;
    core.flusher.durable().await?;
    h.dead_letters_purged(ids.len() as u64)?;
    tracing::warn!(topic = %r.topic, subscription = %r.subscription, purged = ids.len(), "dead letters purged");
    let mut ev = FailureEvent::new(
        EventKind::Purged,
        core.clock.now_ms(),
        &full_topic_name(&r.topic)?,
        &r.subscription,
    );
    ev.dead_letter_ids = ids.clone();
    ev.by = Some(by);
    core.emit_events(vec![ev]);
    Ok(PurgeDeadLettersResponse {
        purged: ids.len() as u64,
        dead_letter_ids: ids,
        dry_run: false,
    })
}

/// The hour `at_ms` falls in, as `2026-11-30T20:00:00Z`.
fn hour_key(at_ms: u64) -> String {
    let hour = at_ms / 3_600_000 * 3_600;
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_secs(hour))
        .to_string()
}

/// Verdicts a group lists at most.
pub(super) const MAX_VERDICTS: usize = 5;

/// The `n` most frequent keys of `counts`, most frequent first (ties by key).
fn most_frequent(counts: BTreeMap<String, u64>, n: usize) -> Vec<String> {
    let mut v: Vec<(String, u64)> = counts.into_iter().collect();
    v.sort_by_key(|(_, c)| std::cmp::Reverse(*c));
    v.into_iter().take(n).map(|(k, _)| k).collect()
}

/// `GroupDeadLetters`.
pub(super) async fn group(
    core: &Arc<BrokerCore>,
    r: GroupDeadLettersRequest,
) -> Result<GroupDeadLettersResponse, Status> {
    let by = DeadLetterGroupBy::try_from(r.group_by)
        .map_err(|_| Status::invalid_argument(format!("unknown group_by {}", r.group_by)))?;
    let per_group = if r.ids_per_group == 0 {
        10
    } else {
        r.ids_per_group as usize
    };
    let h = subscription(core, &r.topic, &r.subscription).await?;
    let letters = matching(core, &h, r.filter.as_ref())?;
    let total = letters.len() as u64;
    // Each group with the count of each verdict in it.
    let mut groups: BTreeMap<String, (DeadLetterGroup, BTreeMap<String, u64>)> = BTreeMap::new();
    for (id, rec) in letters {
        let key = match by {
            DeadLetterGroupBy::Reason => rec.cause(),
            DeadLetterGroupBy::Verdict => rec.reason.clone(),
            DeadLetterGroupBy::Consumer => rec
                .failures
                .attempts
                .last()
                .map(|a| a.consumer.clone())
                .filter(|c| !c.is_empty())
                .unwrap_or_else(|| "-".to_owned()),
            DeadLetterGroupBy::Hour => hour_key(rec.at_ms),
        };
        let (g, verdicts) = groups.entry(key.clone()).or_insert_with(|| {
            let g = DeadLetterGroup {
                key,
                count: 0,
                first_at_ms: u64::MAX,
                last_at_ms: 0,
                entry_ids: Vec::new(),
                verdicts: Vec::new(),
            };
            (g, BTreeMap::new())
        });
        *verdicts.entry(rec.reason).or_insert(0) += 1;
        g.count += 1;
        g.first_at_ms = g.first_at_ms.min(rec.at_ms);
        g.last_at_ms = g.last_at_ms.max(rec.at_ms);
        if g.entry_ids.len() < per_group {
            g.entry_ids.push(id);
        }
    }
    let mut groups: Vec<DeadLetterGroup> = groups
        .into_values()
        .map(|(mut g, verdicts)| {
            g.verdicts = most_frequent(verdicts, MAX_VERDICTS);
            g
        })
        .collect();
    if by != DeadLetterGroupBy::Hour {
        // Largest first; ties by key (already the order).
        groups.sort_by_key(|g| std::cmp::Reverse(g.count));
    }
    Ok(GroupDeadLettersResponse { groups, total })
}

fn job_wire(j: &ReplayJobRecord) -> ReplayJob {
    ReplayJob {
        id: j.id,
        topic: j.topic.clone(),
        subscription: j.subscription.clone(),
        total: j.total,
        done: j.cursor as u64,
        replayed: j.replayed,
        rate_per_second: j.rate_per_second,
        mode: match j.order.target {
            ReplayTarget::RetryTier { .. } => ReplayMode::RetryTier,
            ReplayTarget::Topic => ReplayMode::Topic,
        } as i32,
        created_ms: j.created_ms,
        by: j.order.by.clone(),
    }
}

/// `ListReplayJobs`.
pub(super) fn list_jobs(
    core: &BrokerCore,
    r: ListReplayJobsRequest,
) -> Result<ListReplayJobsResponse, Status> {
    let topic = if r.topic.is_empty() {
        None
    } else {
        Some(full_topic_name(&r.topic)?)
    };
    // A replica's copy of another leader's jobs is not listed here: its
    // leader lists them.
    let elsewhere: std::collections::HashSet<String> = core
        .storage
        .list_topics()
        .map_err(BrokerError::from)?
        .into_iter()
        .filter(|t| t.replicas > 1 && !core.is_replicated(&t.name))
        .map(|t| t.name)
        .collect();
    let jobs = core
        .storage
        .replay_jobs(false)
        .map_err(BrokerError::from)?
        .iter()
        .filter(|j| !elsewhere.contains(&j.topic))
        .filter(|j| topic.as_ref().is_none_or(|t| *t == j.topic))
        .filter(|j| r.subscription.is_empty() || r.subscription == j.subscription)
        .map(job_wire)
        .collect();
    Ok(ListReplayJobsResponse { jobs })
}

/// `CancelReplayJob`.
pub(super) async fn cancel_job(
    core: &BrokerCore,
    r: CancelReplayJobRequest,
) -> Result<CancelReplayJobResponse, Status> {
    let topic = if r.topic.is_empty() {
        None
    } else {
        Some(full_topic_name(&r.topic)?)
    };
    let jobs = core.storage.replay_jobs(false).map_err(BrokerError::from)?;
    let found = jobs
        .iter()
        .find(|j| j.id == r.id && topic.as_ref().is_none_or(|t| *t == j.topic));
    let Some(job) = found else {
        return Err(Status::not_found(match &topic {
            Some(t) => format!("no replay job {} on {t}", r.id),
            None => format!("no replay job {}", r.id),
        }));
    };
    core.writer_for(&job.topic)?
        .remove_replay_job(r.id)
        .map_err(BrokerError::from)?;
    core.flusher.durable().await?;
    tracing::warn!(
        job = r.id,
        "dead-letter replay job cancelled by an operator"
    );
    Ok(CancelReplayJobResponse {})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn who_edits_is_the_callers_role_or_anonymous() {
        let mut r = Request::new(());
        assert_eq!(caller(&r), "anonymous");
        r.extensions_mut().insert(CallerRole("ops-oncall".into()));
        assert_eq!(caller(&r), "ops-oncall");
    }

    #[test]
    fn hours_are_keyed_by_their_start_in_utc() {
        // 2026-11-30T20:13:53Z
        assert_eq!(hour_key(1_796_069_633_000), "2026-11-30T20:00:00Z");
        assert_eq!(hour_key(0), "1970-01-01T00:00:00Z");
    }

    #[test]
    fn an_edit_with_an_empty_property_name_is_refused() {
        let e = ReplayEdit {
            unset_properties: vec![String::new()],
            ..Default::default()
        };
        assert_eq!(
            edit_of(e, 100).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
    }

    #[test]
    fn an_edit_larger_than_a_message_may_be_is_refused() {
        let e = ReplayEdit {
            payload: Some(vec![0; 101]),
            ..Default::default()
        };
        assert_eq!(
            edit_of(e, 100).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
        let empty = edit_of(ReplayEdit::default(), 100).unwrap();
        assert!(empty.is_none(), "an edit that changes nothing is none");
    }
}
