//! The admin lists that are the cluster's, not one broker's: `ListTopics`
//! and `ListReplayJobs` without a topic. In cluster mode the broker asked
//! answers the union of its own list and every other live broker's, asked
//! through [`Owners`] (the caller's credential and deadline) with
//! `local_only` set, so that broker answers with its own and asks no one.
//! Topics are listed once by name (a replicated topic is held by each of
//! its replicas); the partitioned topics are etcd's, where their counts
//! live in a cluster, with any a broker holds from its standalone days.
//! Replay jobs keep their topic: each broker numbers its own, so a job is
//! named by topic and id. A broker that does not answer fails the list
//! UNAVAILABLE naming it, as a partition's owner fails a base name's call:
//! a list lacking one broker's topics would read as complete.

use super::owners::Owners;
use crate::name::TopicName;
use ricochet_cluster::Cluster;
use ricochet_proto::admin_server::Admin;
use ricochet_proto::*;
use std::collections::{BTreeMap, BTreeSet};
use tonic::Status;

/// `ListTopics` over the cluster: `mine` (this broker's answer to `r`,
/// whose namespace is `ns`) with every other live broker's.
pub(super) async fn list_topics<H: Admin>(
    at: &Owners<H>,
    cluster: &Cluster,
    mine: ListTopicsResponse,
    r: &ListTopicsRequest,
    ns: Option<&str>,
) -> Result<ListTopicsResponse, Status> {
    let asked = ListTopicsRequest {
        local_only: true,
        ..r.clone()
    };
    let counted = async {
        at.bounded(cluster.partitioned_topics())
            .await
            .ok_or_else(|| {
                Status::unavailable(
                    "ListTopics: etcd's partitioned topics were not read before the call's deadline",
                )
            })?
            .map_err(|e| Status::from(crate::error::BrokerError::from(e)))
    };
    let others = at.at_every_broker("ListTopics", asked, |mut c, r| async move {
        c.list_topics(r).await
    });
    let (others, counted) = tokio::try_join!(others, counted)?;
    Ok(union(std::iter::once(mine).chain(others), counted, ns))
}

/// The union of `lists` (each broker's) and the partition counts
/// `counted` (etcd's) of namespace `ns`: each name once, in order.
fn union(
    lists: impl IntoIterator<Item = ListTopicsResponse>,
    counted: Vec<(String, u32)>,
    ns: Option<&str>,
) -> ListTopicsResponse {
    let mut topics = BTreeSet::new();
    let mut partitioned = BTreeMap::new();
    for listed in lists {
        topics.extend(listed.topics);
        for p in listed.partitioned {
            partitioned.insert(p.topic, p.partitions);
        }
    }
    for (base, partitions) in counted {
        let Ok(name) = TopicName::parse(&base) else {
            continue;
        };
        if ns.is_none_or(|ns| name.namespace() == ns) {
            partitioned.insert(name.to_string(), partitions);
        }
    }
    ListTopicsResponse {
        topics: topics.into_iter().collect(),
        partitioned: partitioned
            .into_iter()
            .map(|(topic, partitions)| PartitionedTopicMetadata { topic, partitions })
            .collect(),
    }
}

/// `ListReplayJobs` without a topic over the cluster: `mine` (this
/// broker's answer to `r`) with every other live broker's, oldest first.
pub(super) async fn list_replay_jobs<H: Admin>(
    at: &Owners<H>,
    mine: ListReplayJobsResponse,
    r: ListReplayJobsRequest,
) -> Result<ListReplayJobsResponse, Status> {
    let asked = ListReplayJobsRequest {
        local_only: true,
        ..r
    };
    let others = at
        .at_every_broker("ListReplayJobs", asked, |mut c, r| async move {
            c.list_replay_jobs(r).await
        })
        .await?;
    // A job in a leader's hand-over may be listed by two brokers: once.
    let mut jobs = BTreeMap::new();
    for j in std::iter::once(mine).chain(others).flat_map(|l| l.jobs) {
        jobs.entry((j.topic.clone(), j.id)).or_insert(j);
    }
    let mut jobs: Vec<ReplayJob> = jobs.into_values().collect();
    jobs.sort_by(|a, b| (a.created_ms, &a.topic, a.id).cmp(&(b.created_ms, &b.topic, b.id)));
    Ok(ListReplayJobsResponse { jobs })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(topics: &[&str], partitioned: &[(&str, u32)]) -> ListTopicsResponse {
        ListTopicsResponse {
            topics: topics.iter().map(|t| t.to_string()).collect(),
            partitioned: partitioned
                .iter()
                .map(|(t, n)| PartitionedTopicMetadata {
                    topic: t.to_string(),
                    partitions: *n,
                })
                .collect(),
        }
    }

    #[test]
    fn a_topic_two_brokers_list_is_listed_once_with_etcds_counts_of_the_namespace() {
        let p = |t: &str| format!("persistent://public/default/{t}");
        let (a, b, c) = (p("a"), p("b"), p("c"));
        let merged = union(
            [listed(&[&b, &a], &[]), listed(&[&a, &c], &[(&p("old"), 2)])],
            vec![(p("orders"), 4), ("persistent://public/other/x".into(), 3)],
            Some("public/default"),
        );
        assert_eq!(merged.topics, vec![a, b, c]);
        let counts: Vec<(String, u32)> = merged
            .partitioned
            .into_iter()
            .map(|m| (m.topic, m.partitions))
            .collect();
        assert_eq!(counts, vec![(p("old"), 2), (p("orders"), 4)]);
    }
}
