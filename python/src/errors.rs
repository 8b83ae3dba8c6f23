//! Errors as Python sees them: each `ricochet_client::ErrorKind` becomes an
//! instance of its class in `ricochet.errors` (a `RicochetError` subclass,
//! defined in Python so a class may also derive from a built-in such as
//! `ValueError`), carrying the kind, the gRPC code, the redirect, the
//! unconfirmed count and the cause chain. Argument errors found here are
//! `InvalidArgumentError`s, the same class the client raises for them.

use pyo3::prelude::*;
use pyo3::types::PyDict;
use ricochet_client::{Error, ErrorKind};

/// The Python class and the `kind` string of an error kind.
fn names(kind: ErrorKind) -> (&'static str, &'static str) {
    match kind {
        ErrorKind::NotFound => ("NotFoundError", "not_found"),
        ErrorKind::AlreadyExists => ("AlreadyExistsError", "already_exists"),
        ErrorKind::InvalidArgument => ("InvalidArgumentError", "invalid_argument"),
        ErrorKind::PermissionDenied => ("PermissionDeniedError", "permission_denied"),
        ErrorKind::Unauthenticated => ("UnauthenticatedError", "unauthenticated"),
        ErrorKind::FailedPrecondition => ("FailedPreconditionError", "failed_precondition"),
        ErrorKind::ResourceExhausted => ("ResourceExhaustedError", "resource_exhausted"),
        ErrorKind::Disconnected => ("DisconnectedError", "disconnected"),
        ErrorKind::Unavailable => ("UnavailableError", "unavailable"),
        ErrorKind::OwnerDown => ("OwnerDownError", "owner_down"),
        ErrorKind::Redirect => ("RedirectError", "redirect"),
        ErrorKind::Timeout => ("RicochetTimeoutError", "timeout"),
        ErrorKind::Closed => ("ClosedError", "closed"),
        ErrorKind::QueueFull => ("QueueFullError", "queue_full"),
        ErrorKind::StaleDelivery => ("StaleDeliveryError", "stale_delivery"),
        ErrorKind::Unconfirmed => ("UnconfirmedError", "unconfirmed"),
        ErrorKind::Policy => ("PolicyError", "policy"),
        ErrorKind::DataLoss => ("DataLossError", "data_loss"),
        ErrorKind::Internal => ("InternalError", "internal"),
        // `Other`, and kinds added to the client later.
        _ => ("RicochetError", "other"),
    }
}

/// The Python exception for a client error.
pub(crate) fn to_py(e: &Error) -> PyErr {
    Python::attach(|py| build(py, e).unwrap_or_else(|failed| failed))
}

fn build(py: Python<'_>, e: &Error) -> PyResult<PyErr> {
    let (class, kind) = names(e.kind());
    let kwargs = PyDict::new(py);
    kwargs.set_item("kind", kind)?;
    kwargs.set_item("grpc_code", e.grpc_code())?;
    kwargs.set_item("retryable", e.is_retryable())?;
    kwargs.set_item("unconfirmed_count", e.unconfirmed_count())?;
    if let Some(r) = e.redirect() {
        let d = PyDict::new(py);
        d.set_item("owner", &r.owner)?;
        d.set_item("url", r.url.as_deref())?;
        d.set_item("epoch", r.epoch)?;
        kwargs.set_item("redirect", d)?;
    }
    let mut causes = Vec::new();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        causes.push(s.to_string());
        source = s.source();
    }
    kwargs.set_item("causes", causes)?;
    let exc = py
        .import("ricochet.errors")?
        .getattr(class)?
        .call((e.to_string(),), Some(&kwargs))?;
    Ok(PyErr::from_value(exc))
}

/// An error of `kind` the bindings found themselves (a bad argument, a
/// closed handle), as the matching `ricochet.errors` class.
pub(crate) fn of_kind(kind: ErrorKind, message: impl Into<String>) -> PyErr {
    let message = message.into();
    Python::attach(|py| {
        let (class, kind) = names(kind);
        let made = (|| -> PyResult<PyErr> {
            let kwargs = PyDict::new(py);
            kwargs.set_item("kind", kind)?;
            let exc = py
                .import("ricochet.errors")?
                .getattr(class)?
                .call((message,), Some(&kwargs))?;
            Ok(PyErr::from_value(exc))
        })();
        made.unwrap_or_else(|failed| failed)
    })
}

/// A bad argument: `InvalidArgumentError` (also a `ValueError`).
pub(crate) fn invalid(message: impl Into<String>) -> PyErr {
    of_kind(ErrorKind::InvalidArgument, message)
}

/// A handle used after `close`: `ClosedError`.
pub(crate) fn closed(what: &str) -> PyErr {
    of_kind(ErrorKind::Closed, format!("the {what} is closed"))
}

/// `Result<T, ricochet_client::Error>` into `PyResult<T>`.
pub(crate) trait IntoPy<T> {
    fn py(self) -> PyResult<T>;
}

impl<T> IntoPy<T> for Result<T, Error> {
    fn py(self) -> PyResult<T> {
        self.map_err(|e| to_py(&e))
    }
}
