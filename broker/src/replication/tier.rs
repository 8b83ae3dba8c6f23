//! One second tier per replication group: every member of a replicated
//! topic's group must have a `[tiered]` section naming the same object
//! store (the identity each broker registers in etcd,
//! [`TieredConfig::identity`](crate::storage::tiered::TieredConfig::identity):
//! bucket and prefix, or directory, and endpoint; never credentials).
//! A member without a tier would stop applying the group at its first
//! offload record; one with another store would record keys it cannot
//! read. So a group is formed, and a member added (a replacement, a
//! move), only of brokers whose identity is the forming broker's, and a
//! create that cannot find enough of them is FAILED_PRECONDITION naming
//! each broker left out and how it differs. A group formed before (or a
//! broker restarted with another section) is reported by its leader: a
//! WARN and the member's health in `ricochet cluster`. The identities
//! are canonical (one store under two spellings, or with its endpoint
//! given only by `AWS_ENDPOINT`, is one identity). Pure: the callers read
//! the registrations.

use crate::error::BrokerError;

/// How `theirs` differs from `mine` (`None`: the same store, or neither
/// has a tier), in words naming both.
pub fn difference(mine: Option<&str>, theirs: Option<&str>) -> Option<String> {
    match (mine, theirs) {
        (Some(m), Some(t)) if m == t => None,
        (Some(m), None) => Some(format!("it has no [tiered] section (this broker's is {m})")),
        (None, Some(t)) => Some(format!(
            "its [tiered] store is {t} and this broker has no [tiered] section"
        )),
        (Some(m), Some(t)) => Some(format!("its [tiered] store is {t}, this broker's is {m}")),
        (None, None) => None,
    }
}

/// The brokers of `candidates` (id, registered tier) whose tier differs
/// from `mine`, with how.
pub fn differing<'a>(
    mine: Option<&str>,
    candidates: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
) -> Vec<(String, String)> {
    candidates
        .into_iter()
        .filter_map(|(id, theirs)| difference(mine, theirs).map(|d| (id.to_owned(), d)))
        .collect()
}

/// The refusal of a group of `replicas` that `matching` brokers (this one
/// included) could form, `left_out` differing: FAILED_PRECONDITION naming
/// each left out broker and its difference.
pub fn refusal(replicas: u32, matching: usize, left_out: &[(String, String)]) -> BrokerError {
    let why: Vec<String> = left_out
        .iter()
        .map(|(id, d)| format!("broker {id}: {d}"))
        .collect();
    BrokerError::Conflict(format!(
        "replication factor {replicas} needs {replicas} live brokers sharing this broker's \
         [tiered] object store; {matching} do (a group's members offload to and read from \
         one store); left out: {}",
        why.join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "s3://b/replicated endpoint=http://127.0.0.1:9000";
    const B: &str = "s3://b/other endpoint=http://127.0.0.1:9000";

    #[test]
    fn the_same_store_or_none_on_both_is_no_difference() {
        assert_eq!(difference(Some(A), Some(A)), None);
        assert_eq!(difference(None, None), None);
    }

    #[test]
    fn a_missing_or_other_store_is_named_with_both_sides() {
        let d = difference(Some(A), None).unwrap();
        assert!(d.contains("no [tiered] section") && d.contains(A), "{d}");
        let d = difference(None, Some(B)).unwrap();
        assert!(d.contains(B) && d.contains("this broker has no"), "{d}");
        let d = difference(Some(A), Some(B)).unwrap();
        assert!(d.contains(A) && d.contains(B), "{d}");
    }

    #[test]
    fn one_store_under_two_spellings_makes_one_group() {
        use crate::storage::tiered::TieredConfig;
        let none = Vec::<(String, String)>::new;
        let s3 = |url: &str, endpoint: Option<&str>| TieredConfig {
            url: url.into(),
            endpoint: endpoint.map(Into::into),
            ..Default::default()
        };
        // b0 names its endpoint in the section, b1 only in AWS_ENDPOINT,
        // b2 with another spelling; b3 names another server.
        let b0 = s3("s3://b/replicated/", Some("http://MinIO:9000/")).identity_in(none());
        let b1 = s3("s3://b//replicated", None).identity_in(vec![(
            "AWS_ENDPOINT".to_owned(),
            "http://minio:9000".to_owned(),
        )]);
        let b2 = s3("s3://b/replicated", Some("http://minio:9000")).identity_in(none());
        let b3 = s3("s3://b/replicated", None).identity_in(vec![(
            "AWS_ENDPOINT".to_owned(),
            "http://other:9000".to_owned(),
        )]);
        let out = differing(
            Some(&b0),
            [
                ("b1", Some(b1.as_str())),
                ("b2", Some(b2.as_str())),
                ("b3", Some(b3.as_str())),
            ],
        );
        let ids: Vec<&str> = out.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(ids, ["b3"], "{out:?}");
        assert!(out[0].1.contains("endpoint=http://other:9000"), "{out:?}");
    }

    #[test]
    fn only_the_differing_brokers_are_listed_and_the_refusal_names_them() {
        let out = differing(Some(A), [("b1", Some(A)), ("b2", Some(B)), ("b3", None)]);
        let ids: Vec<&str> = out.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(ids, ["b2", "b3"]);
        let e = refusal(3, 2, &out);
        assert!(matches!(e, BrokerError::Conflict(_)), "{e:?}");
        let text = e.to_string();
        assert!(
            text.contains("broker b2: its [tiered] store is s3://b/other"),
            "{text}"
        );
        assert!(
            text.contains("broker b3: it has no [tiered] section"),
            "{text}"
        );
        assert!(text.contains("2 do"), "{text}");
    }
}
