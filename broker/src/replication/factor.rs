//! A topic's replication factor: what `CreateTopic`'s `replicas` field
//! asks for (or, without one, its namespace's default, else the cluster's),
//! checked against where the broker runs, and whether the broker can reach
//! its peers as they listen (a token with auth on, a CA with TLS). Pure
//! but for [`peers_ready`], which reads the broker's configuration: the
//! caller says how many brokers are live (none on a standalone broker) and
//! what the defaults are.

use crate::config::BrokerConfig;
use crate::error::{BrokerError, Result};

/// The largest factor accepted: a Raft group of more members only costs
/// more round trips for the same fault tolerance a cluster of this size
/// gets from 7 (three failures).
pub const MAX_REPLICAS: u32 = 7;

/// The factor a create asking for `requested` (0: the default, 1) gets, or
/// why it cannot be had: above [`MAX_REPLICAS`] is INVALID_ARGUMENT; above
/// 1 on a standalone broker (`live` is `None`), or above the number of
/// live brokers that take topics, is FAILED_PRECONDITION.
pub fn check(requested: u32, live: Option<usize>) -> Result<u32> {
    let r = requested.max(1);
    if r > MAX_REPLICAS {
        return Err(BrokerError::InvalidArgument(format!(
            "replication factor {r} is above the maximum of {MAX_REPLICAS}"
        )));
    }
    if r == 1 {
        return Ok(1);
    }
    match live {
        None => Err(BrokerError::Conflict(format!(
            "replication factor {r} needs cluster mode: this broker is standalone, where every topic has factor 1"
        ))),
        Some(n) if (r as usize) > n => Err(BrokerError::Conflict(format!(
            "replication factor {r} needs {r} live brokers; {n} {} live (and not draining)",
            if n == 1 { "is" } else { "are" }
        ))),
        Some(_) => Ok(r),
    }
}

/// Whether this broker's Raft calls can reach its peers as they listen,
/// for a factor above 1: with `[auth]` on it needs a peer token
/// (`[cluster] peer_token_file`) or its own certificate as its identity
/// (`TlsConfig::peer_identity_from_cert`), with `[tls]` a CA to verify them
/// (`peer_ca_file` or `tls.client_ca_file`). Otherwise FAILED_PRECONDITION
/// naming the missing setting.
pub fn check_peers(replicas: u32, auth: bool, token: bool, tls: bool, ca: bool) -> Result<()> {
    if replicas <= 1 {
        return Ok(());
    }
    if auth && !token {
        return Err(BrokerError::Conflict(format!(
            "replication factor {replicas} with [auth] on needs [cluster] peer_token_file: \
             a superuser's token the brokers' Raft calls to each other carry (or, with \
             tls.require_client_cert and tls.role_from_client_cert, a tls.cert_file whose CN \
             is a superuser)"
        )));
    }
    if tls && !ca {
        return Err(BrokerError::Conflict(format!(
            "replication factor {replicas} with [tls] on needs a CA to verify the other brokers: \
             [cluster] peer_ca_file or [tls] client_ca_file"
        )));
    }
    Ok(())
}

/// [`check_peers`] for this broker's configuration.
pub fn peers_ready(config: &BrokerConfig, replicas: u32) -> Result<()> {
    let cluster = config.cluster.as_ref();
    check_peers(
        replicas,
        config.auth.enabled,
        cluster.is_some_and(|c| c.peer_token_file.is_some())
            || config.tls.peer_identity_from_cert(),
        config.tls.enabled(),
        cluster.is_some_and(|c| c.peer_ca_file.is_some()) || config.tls.client_ca_file.is_some(),
    )
}

/// The factor a topic created without one gets: its namespace's default
/// when it has one, else the cluster's `default_replicas` (1 standalone).
pub fn default_for(namespace: Option<u32>, cluster_default: u32) -> u32 {
    namespace
        .filter(|n| *n > 0)
        .unwrap_or(cluster_default)
        .max(1)
}

/// A namespace's default factor as `namespaces set-replication` asks for
/// it, checked like a topic's: 0 is INVALID_ARGUMENT (there is no "default
/// of the default"), the rest as [`check`].
pub fn check_namespace(requested: u32, live: Option<usize>) -> Result<u32> {
    if requested == 0 {
        return Err(BrokerError::InvalidArgument(
            "a namespace's replication factor is 1 to 7, not 0".into(),
        ));
    }
    check(requested, live)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_and_one_are_factor_one_anywhere() {
        assert_eq!(check(0, None).unwrap(), 1);
        assert_eq!(check(1, None).unwrap(), 1);
        assert_eq!(check(0, Some(0)).unwrap(), 1);
        assert_eq!(check(1, Some(3)).unwrap(), 1);
    }

    #[test]
    fn above_one_standalone_is_a_failed_precondition_naming_standalone() {
        let e = check(3, None).unwrap_err();
        assert!(matches!(e, BrokerError::Conflict(_)), "{e:?}");
        assert!(e.to_string().contains("standalone"), "{e}");
    }

    #[test]
    fn above_the_live_brokers_is_a_failed_precondition_with_both_numbers() {
        let e = check(3, Some(2)).unwrap_err();
        assert!(matches!(e, BrokerError::Conflict(_)), "{e:?}");
        assert!(
            e.to_string().contains("needs 3 live brokers; 2 are live"),
            "{e}"
        );
        assert_eq!(check(3, Some(3)).unwrap(), 3);
        assert_eq!(check(2, Some(5)).unwrap(), 2);
    }

    #[test]
    fn a_namespace_default_comes_before_the_clusters() {
        assert_eq!(default_for(None, 1), 1);
        assert_eq!(default_for(None, 3), 3);
        assert_eq!(default_for(Some(3), 1), 3);
        assert_eq!(default_for(Some(1), 3), 1);
        assert_eq!(default_for(Some(0), 2), 2);
    }

    #[test]
    fn a_namespace_factor_is_checked_like_a_topics_but_zero_is_invalid() {
        let e = check_namespace(0, Some(3)).unwrap_err();
        assert!(matches!(e, BrokerError::InvalidArgument(_)), "{e:?}");
        let e = check_namespace(3, None).unwrap_err();
        assert!(e.to_string().contains("standalone"), "{e}");
        let e = check_namespace(4, Some(3)).unwrap_err();
        assert!(e.to_string().contains("needs 4 live brokers"), "{e}");
        assert_eq!(check_namespace(1, None).unwrap(), 1);
        assert_eq!(check_namespace(3, Some(3)).unwrap(), 3);
    }

    #[test]
    fn peers_need_a_token_with_auth_and_a_ca_with_tls_above_one() {
        check_peers(1, true, false, true, false).unwrap();
        check_peers(3, false, false, false, false).unwrap();
        check_peers(3, true, true, true, true).unwrap();
        let e = check_peers(3, true, false, false, false).unwrap_err();
        assert!(matches!(e, BrokerError::Conflict(_)), "{e:?}");
        assert!(e.to_string().contains("peer_token_file"), "{e}");
        let e = check_peers(3, false, false, true, false).unwrap_err();
        assert!(e.to_string().contains("peer_ca_file"), "{e}");
        check_peers(2, false, false, true, true).unwrap();
    }

    #[test]
    fn above_the_maximum_is_invalid() {
        let e = check(MAX_REPLICAS + 1, Some(100)).unwrap_err();
        assert!(matches!(e, BrokerError::InvalidArgument(_)), "{e:?}");
        assert_eq!(check(MAX_REPLICAS, Some(100)).unwrap(), MAX_REPLICAS);
    }
}
