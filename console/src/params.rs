//! The query strings of the console's pages and confirmations: every
//! parameter any of them takes ([`Params`]), and the parsing of what a user
//! types into them (times, entry ids). A bad value is a 400 naming the
//! field, never a guess.

use super::ConsoleError;
use super::api::DeadLetterQuery;
use serde::Deserialize;
use std::collections::BTreeSet;

/// Every query parameter any page takes (each page reads its own).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct Params {
    pub topic: String,
    pub sub: String,
    pub id: String,
    pub reason: String,
    pub since: String,
    pub until: String,
    pub ids: String,
    pub after: String,
    pub group: String,
    pub job: String,
}

impl Params {
    pub(crate) fn topic(&self) -> Result<&str, ConsoleError> {
        required("topic", &self.topic)
    }

    pub(crate) fn sub(&self) -> Result<&str, ConsoleError> {
        required("sub", &self.sub)
    }

    /// The dead-letter filter these parameters give.
    pub(crate) fn query(&self) -> Result<DeadLetterQuery, ConsoleError> {
        Ok(DeadLetterQuery {
            reason: self.reason.trim().to_owned(),
            since_ms: parse_time("since", &self.since)?,
            until_ms: parse_time("until", &self.until)?,
            ids: parse_ids(&self.ids)?,
        })
    }

    /// The filter parameters (for links that keep the filter).
    pub(crate) fn filter_pairs(&self) -> Vec<(&'static str, &str)> {
        [
            ("reason", self.reason.as_str()),
            ("since", self.since.as_str()),
            ("until", self.until.as_str()),
            ("ids", self.ids.as_str()),
            ("group", self.group.as_str()),
        ]
        .into_iter()
        .filter(|(_, v)| !v.trim().is_empty())
        .collect()
    }
}

fn required<'a>(name: &str, value: &'a str) -> Result<&'a str, ConsoleError> {
    match value.trim() {
        "" => Err(ConsoleError::bad_request(format!("`{name}` is required"))),
        v => Ok(v),
    }
}

/// A time filter: empty (unbounded), milliseconds since the epoch, a
/// duration ago (`90m`, `2h`), or a UTC date and time (`2026-11-30
/// 20:15[:00]`, `T` or a space between).
pub(crate) fn parse_time(field: &str, s: &str) -> Result<u64, ConsoleError> {
    let s = s.trim();
    if s.is_empty() {
        return Ok(0);
    }
    if s.bytes().all(|b| b.is_ascii_digit()) {
        return s.parse().map_err(|_| bad_time(field, s));
    }
    let now = std::time::SystemTime::now();
    let at = if let Ok(ago) = humantime::parse_duration(s) {
        now.checked_sub(ago).ok_or_else(|| bad_time(field, s))?
    } else {
        let full = if s.len() == 16 {
            format!("{s}:00")
        } else {
            s.to_owned()
        };
        humantime::parse_rfc3339_weak(full.trim_end_matches('Z')).map_err(|_| bad_time(field, s))?
    };
    let ms = at
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|_| bad_time(field, s))?
        .as_millis();
    u64::try_from(ms).map_err(|_| bad_time(field, s))
}

fn bad_time(field: &str, s: &str) -> ConsoleError {
    ConsoleError::bad_request(format!(
        "`{field}` is not a time: {} (give a UTC time like 2026-11-30 20:15, a duration ago like 2h, or ms since the epoch)",
        crate::echo(s)
    ))
}

/// Dead-letter ids separated by commas or spaces.
pub(crate) fn parse_ids(s: &str) -> Result<Vec<u64>, ConsoleError> {
    let ids: Result<BTreeSet<u64>, _> = s
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.parse::<u64>().map_err(|_| {
                ConsoleError::bad_request(format!(
                    "`ids` must be entry ids (numbers) separated by commas: {} is not one",
                    crate::echo(p)
                ))
            })
        })
        .collect();
    Ok(ids?.into_iter().collect())
}

pub(crate) fn parse_id(s: &str) -> Result<u64, ConsoleError> {
    required("id", s)?.parse().map_err(|_| {
        ConsoleError::bad_request(format!(
            "`id` must be an entry id (a number), not {}",
            crate::echo(s)
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse_in_every_documented_form_and_bad_ones_are_refused() {
        assert_eq!(parse_time("since", "").unwrap(), 0);
        assert_eq!(
            parse_time("since", "1700000000000").unwrap(),
            1_700_000_000_000
        );
        let t = parse_time("since", "2023-11-14 22:13").unwrap();
        assert_eq!(t, 1_699_999_980_000);
        assert_eq!(
            parse_time("since", "2023-11-14T22:13:20Z").unwrap(),
            1_700_000_000_000
        );
        let ago = parse_time("since", "1h").unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        assert!(ago <= now - 3_600_000 && ago > now - 3_700_000);
        assert!(parse_time("since", "yesterday-ish").is_err());
        assert!(parse_time("until", "2023-13-40 99:00").is_err());
    }

    #[test]
    fn ids_parse_sorted_and_deduplicated() {
        assert_eq!(parse_ids(" 5, 3 3,,9 ").unwrap(), vec![3, 5, 9]);
        assert!(parse_ids("").unwrap().is_empty());
        assert!(parse_ids("4,x").is_err());
        assert!(parse_ids("-1").is_err());
    }
}
