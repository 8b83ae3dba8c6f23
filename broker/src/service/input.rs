//! Checks on what clients send that protobuf types cannot express: message
//! sizes (payload, key and properties counted together against
//! `max_message_size`), key length and property count, the length and
//! characters of producer and consumer names, and the length of the
//! free-text reasons a consumer attaches to a failure. Each refusal is
//! `INVALID_ARGUMENT` with a message that quotes at most a short prefix of
//! the offending input.

use crate::config::BrokerConfig;
use crate::error::BrokerError;
use crate::util::echo;
use ricochet_proto::OutboundMessage;
use std::collections::HashMap;

/// Longest producer or consumer name, in bytes.
pub(super) const MAX_LABEL_BYTES: usize = 256;
/// Longest failure reason text (nack, reconsume, terminate), in bytes: it is
/// kept in the message's failure history.
pub(super) const MAX_DETAIL_BYTES: usize = 4096;

fn invalid(message: String) -> BrokerError {
    BrokerError::InvalidArgument(message)
}

/// Message `i` of a batch against the size, key and property limits.
pub(super) fn check_message(
    i: usize,
    m: &OutboundMessage,
    config: &BrokerConfig,
) -> Result<(), BrokerError> {
    let which = || format!("message {i} (sequence id {})", m.sequence_id);
    if m.key.len() > config.max_key_size {
        return Err(invalid(format!(
            "{}: key is {} bytes; the limit is {}",
            which(),
            m.key.len(),
            config.max_key_size
        )));
    }
    if m.properties.len() > config.max_properties {
        return Err(invalid(format!(
            "{}: {} properties; the limit is {}",
            which(),
            m.properties.len(),
            config.max_properties
        )));
    }
    let size = m.counted_size();
    if size > config.max_message_size {
        return Err(invalid(format!(
            "{} is {size} bytes (payload {}, key and properties {}); the limit is {}",
            which(),
            m.payload.len(),
            size - m.payload.len(),
            config.max_message_size
        )));
    }
    Ok(())
}

/// Properties a consumer adds to a message it sends to the retry tier: the
/// same count limit as a producer's, and at most `max_message_size` bytes.
pub(super) fn check_extra_properties(
    properties: &HashMap<String, String>,
    config: &BrokerConfig,
) -> Result<(), BrokerError> {
    if properties.len() > config.max_properties {
        return Err(invalid(format!(
            "{} properties; the limit is {}",
            properties.len(),
            config.max_properties
        )));
    }
    let bytes = ricochet_proto::counted_size(&[], "", properties);
    if bytes > config.max_message_size {
        return Err(invalid(format!(
            "properties of {bytes} bytes; the limit is {}",
            config.max_message_size
        )));
    }
    Ok(())
}

/// A producer or consumer name: at most [`MAX_LABEL_BYTES`], no control
/// characters (it shows up in stats, logs and failure histories). Empty is
/// fine: the broker then picks one.
pub(super) fn check_label(what: &str, name: &str) -> Result<(), BrokerError> {
    if name.len() > MAX_LABEL_BYTES {
        return Err(invalid(format!(
            "{what} {} is too long; the limit is {MAX_LABEL_BYTES} bytes",
            echo(name)
        )));
    }
    if name.chars().any(char::is_control) {
        return Err(invalid(format!(
            "{what} {} contains control characters",
            echo(name)
        )));
    }
    Ok(())
}

/// A failure's reason text: at most [`MAX_DETAIL_BYTES`].
pub(super) fn check_detail(detail: &str) -> Result<(), BrokerError> {
    if detail.len() > MAX_DETAIL_BYTES {
        return Err(invalid(format!(
            "reason text of {} bytes; the limit is {MAX_DETAIL_BYTES}",
            detail.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> BrokerConfig {
        BrokerConfig {
            max_message_size: 100,
            max_key_size: 10,
            max_properties: 2,
            ..BrokerConfig::default()
        }
    }

    #[test]
    fn key_properties_and_payload_count_towards_the_size() {
        let c = config();
        let mut m = OutboundMessage {
            payload: vec![0; 60],
            key: "k".repeat(10),
            ..Default::default()
        };
        m.properties.insert("a".repeat(15), "b".repeat(15));
        assert!(check_message(0, &m, &c).is_ok(), "exactly 100 bytes");
        m.properties.insert("c".into(), String::new());
        let e = check_message(3, &m, &c).unwrap_err().to_string();
        assert!(e.contains("message 3") && e.contains("101 bytes"), "{e}");
        m.key.push('k');
        let e = check_message(0, &m, &c).unwrap_err().to_string();
        assert!(e.contains("key is 11 bytes"), "{e}");
        m.key.clear();
        m.properties.insert("d".into(), String::new());
        let e = check_message(0, &m, &c).unwrap_err().to_string();
        assert!(e.contains("3 properties"), "{e}");
    }

    #[test]
    fn labels_and_details_are_bounded() {
        assert!(check_label("producer name", "").is_ok());
        assert!(check_label("producer name", "billing-1 ü").is_ok());
        assert!(check_label("producer name", "a\nb").is_err());
        let e = check_label("consumer name", &"x".repeat(1 << 20)).unwrap_err();
        assert!(e.to_string().len() < 300, "{e}");
        assert!(check_detail(&"x".repeat(MAX_DETAIL_BYTES)).is_ok());
        assert!(check_detail(&"x".repeat(MAX_DETAIL_BYTES + 1)).is_err());
        let mut props = HashMap::new();
        for i in 0..3 {
            props.insert(i.to_string(), String::new());
        }
        assert!(check_extra_properties(&props, &config()).is_err());
    }
}
