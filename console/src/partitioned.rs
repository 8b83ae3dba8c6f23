//! Partitioned topics in the console. The topics page lists a partitioned
//! topic once, by its base name, with its partitions' counters summed (the
//! broker answers a base name's stats for all its partitions); its topic
//! page adds a table of the partitions. Dead letters are numbered per
//! partition (each partition has its own dead-letter tier), so on a base
//! name the list shows each one's partition and links every row to it,
//! pages and acts per partition (a table of the partitions with their
//! counts leads there), and a confirmation names a partition, never the
//! base name, whose ids would be ambiguous.

use super::format::link;
use super::{ConsoleError, ConsoleState};
use maud::{Markup, html};
use ricochet_proto::partitions::{PARTITION_SUFFIX, parse_partition, partition_name};
use ricochet_proto::{DeadLetter, ReplayJob, TopicStatsResponse};

/// The partition of `base` a dead letter came from, by the topic of its
/// origin (the partition, or a tier of it: `<base>-partition-<i>-…`).
pub(crate) fn letter_partition(d: &DeadLetter, base: &str) -> Option<(u32, String)> {
    let origin = d.origin.as_ref()?.topic.as_str();
    let rest = origin.strip_prefix(base)?.strip_prefix(PARTITION_SUFFIX)?;
    let digits = rest.split(|c: char| !c.is_ascii_digit()).next()?;
    let i: u32 = digits.parse().ok()?;
    (digits.len() == 1 || !digits.starts_with('0')).then(|| (i, partition_name(base, i)))
}

/// The index shown for a partition's name (`—` for another name).
fn index_of(name: &str) -> String {
    parse_partition(name).map_or_else(|| "—".to_owned(), |(_, i)| i.to_string())
}

/// Whether `name` is a partition of one of `bases`.
pub(crate) fn is_partition_of(name: &str, bases: &[(String, u32)]) -> bool {
    parse_partition(name).is_some_and(|(base, i)| bases.iter().any(|(b, n)| b == base && i < *n))
}

/// Refuses an action that names dead letters by id on a base name.
pub(crate) async fn refuse_base_name(st: &ConsoleState, topic: &str) -> Result<(), ConsoleError> {
    if let Some(n) = st.api.partitions(topic).await? {
        return Err(ConsoleError::bad_request(format!(
            "{} is a partitioned topic of {n} partitions, and dead-letter ids are per partition: \
             act on one partition ({})",
            crate::echo(topic),
            crate::echo(&partition_name(topic, 0)),
        )));
    }
    Ok(())
}

/// The partitions table of a base name's topic page: each partition's
/// counters, read one by one (a partition not created yet shows zeros).
pub(crate) async fn partitions_section(
    st: &ConsoleState,
    topic: &str,
    n: u32,
) -> Result<Markup, ConsoleError> {
    let mut rows = Vec::with_capacity(n as usize);
    for i in 0..n {
        let name = partition_name(topic, i);
        let stats = match st.api.topic_stats(&name).await {
            Ok(s) => s,
            Err(s) if s.code() == tonic::Code::NotFound => TopicStatsResponse::default(),
            Err(s) => return Err(s.into()),
        };
        rows.push((i, name, stats));
    }
    Ok(html! {
        h2 { "Partitions" }
        table #partitions {
            tr { th { "Partition" } th { "Stored messages" } th { "Entry ids" } th { "Published since start" } th { "Producers" } }
            @for (i, name, s) in &rows {
                tr {
                    td { a href=(link("/topic", &[("topic", name)])) { (i) } }
                    td.n { (s.message_count) }
                    td { (s.first_entry_id) " to " (s.next_entry_id) }
                    td.n { (s.messages_in) }
                    td.n { (s.producers) }
                }
            }
        }
    })
}

/// The dead-letters page of a base name, above its list: each partition's
/// count of the matching dead letters, with links to its own list (which
/// pages and acts) keeping the filter.
pub(crate) async fn letters_by_partition(
    st: &ConsoleState,
    topic: &str,
    sub: &str,
    n: u32,
    query: &super::api::DeadLetterQuery,
    filter: &[(&str, &str)],
) -> Result<Markup, ConsoleError> {
    let mut rows = Vec::with_capacity(n as usize);
    for i in 0..n {
        let name = partition_name(topic, i);
        let total = match st.api.dead_letters(&name, sub, query, 1, None).await {
            Ok(r) => r.total,
            // The subscription is not on every partition (or the
            // partition was not created yet).
            Err(s) if s.code() == tonic::Code::NotFound => continue,
            Err(s) => return Err(s.into()),
        };
        rows.push((i, name, total));
    }
    Ok(html! {
        p.note #per-partition {
            "Dead letters are numbered per partition: the list below shows the oldest of all partitions; "
            "page through them, select them by id, replay or discard them on each partition's own list."
        }
        table #partition-letters {
            tr { th { "Partition" } th { "Matching dead letters" } th {} }
            @for (i, name, total) in &rows {
                @let pairs: Vec<(&str, &str)> = [("topic", name.as_str()), ("sub", sub)]
                    .into_iter()
                    .chain(filter.iter().copied())
                    .collect();
                tr {
                    td { (i) }
                    td.n { (total) }
                    td { a.partition-letters href=(link("/dead-letters", &pairs)) { "dead letters of partition " (i) " →" } }
                }
            }
        }
    })
}

/// The partition column of a base name's dead-letter row.
pub(crate) fn partition_cell(d: &DeadLetter, base: &str) -> Markup {
    match letter_partition(d, base) {
        Some((i, _)) => html! { td.partition { (i) } },
        None => html! { td.partition { "—" } },
    }
}

/// A replay job's partition, for the jobs table of a base name.
pub(crate) fn job_partition(j: &ReplayJob) -> String {
    index_of(&j.topic)
}
