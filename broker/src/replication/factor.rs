//! A topic's replication factor: what `CreateTopic`'s `replicas` field
//! asks for, checked against where the broker runs. Pure: the caller says
//! how many brokers are live (none on a standalone broker).

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
    fn above_the_maximum_is_invalid() {
        let e = check(MAX_REPLICAS + 1, Some(100)).unwrap_err();
        assert!(matches!(e, BrokerError::InvalidArgument(_)), "{e:?}");
        assert_eq!(check(MAX_REPLICAS, Some(100)).unwrap(), MAX_REPLICAS);
    }
}
