//! Python values into the client's: durations (seconds as a number, or a
//! `datetime.timedelta`), payloads (`bytes`, `bytearray` or `str`), property
//! dicts and PEM material. A value of the wrong type or range is an
//! `InvalidArgumentError` naming the parameter.

use std::collections::HashMap;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::pybacked::{PyBackedBytes, PyBackedStr};

use crate::errors::invalid;

/// A non-negative duration: seconds (`int` or `float`) or a `timedelta`.
pub(crate) fn duration(value: &Bound<'_, PyAny>, what: &str) -> PyResult<Duration> {
    let secs: f64 = if value.hasattr("total_seconds")? {
        value.call_method0("total_seconds")?.extract()?
    } else {
        value.extract().map_err(|_| {
            invalid(format!(
                "{what} must be seconds (a number) or a datetime.timedelta, not {}",
                type_name(value)
            ))
        })?
    };
    Duration::try_from_secs_f64(secs).map_err(|_| {
        invalid(format!(
            "{what} must be a finite, non-negative duration, not {secs}"
        ))
    })
}

/// An optional duration argument.
pub(crate) fn opt_duration(
    value: Option<&Bound<'_, PyAny>>,
    what: &str,
) -> PyResult<Option<Duration>> {
    value.map(|v| duration(v, what)).transpose()
}

/// Payload bytes: `bytes`/`bytearray` as they are, `str` as UTF-8.
pub(crate) fn payload(value: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    if let Ok(b) = value.extract::<PyBackedBytes>() {
        return Ok(b.to_vec());
    }
    if let Ok(s) = value.extract::<PyBackedStr>() {
        return Ok(s.as_bytes().to_vec());
    }
    Err(invalid(format!(
        "the payload must be bytes, bytearray or str, not {}",
        type_name(value)
    )))
}

/// A `dict[str, str]` of message properties.
pub(crate) fn properties(value: Option<&Bound<'_, PyAny>>) -> PyResult<HashMap<String, String>> {
    match value {
        None => Ok(HashMap::new()),
        Some(v) => v.extract().map_err(|_| {
            invalid(format!(
                "properties must be a dict of str to str, not {}",
                type_name(v)
            ))
        }),
    }
}

/// PEM material: `bytes` or a `str` holding PEM text are the PEM; another
/// `str` or an `os.PathLike` names a file to read.
pub(crate) fn pem(value: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<u8>> {
    if let Ok(b) = value.extract::<PyBackedBytes>() {
        return Ok(b.to_vec());
    }
    if let Ok(s) = value.extract::<PyBackedStr>()
        && s.trim_start().starts_with("-----BEGIN")
    {
        return Ok(s.as_bytes().to_vec());
    }
    let path: std::path::PathBuf = value.extract().map_err(|_| {
        invalid(format!(
            "{what} must be PEM bytes or text, or a file path, not {}",
            type_name(value)
        ))
    })?;
    std::fs::read(&path).map_err(|e| invalid(format!("cannot read {what} {}: {e}", path.display())))
}

fn type_name(value: &Bound<'_, PyAny>) -> String {
    value
        .get_type()
        .name()
        .map_or_else(|_| "?".to_owned(), |n| n.to_string())
}
