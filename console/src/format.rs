//! The small formatters every page shares: links with encoded query
//! strings, and times as UTC.

/// `path?k=v&...`, the values URL-encoded.
pub(crate) fn link(path: &str, pairs: &[(&str, &str)]) -> String {
    match serde_urlencoded::to_string(pairs) {
        Ok(q) if !q.is_empty() => format!("{path}?{q}"),
        _ => path.to_owned(),
    }
}

/// Milliseconds since the epoch as a UTC time; `—` for 0.
pub(crate) fn fmt_ms(ms: u64) -> String {
    if ms == 0 {
        return "—".to_owned();
    }
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    humantime::format_rfc3339_seconds(t)
        .to_string()
        .replace('T', " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_encode_their_values() {
        assert_eq!(
            link(
                "/x",
                &[("topic", "persistent://a/b/c"), ("reason", "a&b c")]
            ),
            "/x?topic=persistent%3A%2F%2Fa%2Fb%2Fc&reason=a%26b+c"
        );
    }
}
