//! [`CliError`]: what a command can fail with, and how it is shown. A
//! broker's answer keeps its gRPC status code (`NotFound: topic … not
//! found`) so scripts and people can tell a missing topic from an
//! unreachable broker; usage mistakes exit with 2, everything else with 1.
//! The binary prints the error as one line, `error: <text>`.

use std::fmt;

/// Result alias of the CLI library.
pub type Result<T, E = CliError> = std::result::Result<T, E>;

/// A failed command.
#[derive(Debug)]
pub enum CliError {
    /// The command line asks for something that cannot be done as given
    /// (exit code 2).
    Usage(String),
    /// The broker answered with an error status, or could not be reached
    /// (the code is then `Unavailable` or `DeadlineExceeded`).
    Status {
        /// The gRPC status code.
        code: tonic::Code,
        /// The broker's (or transport's) explanation.
        message: String,
    },
    /// Anything else: a local file, a terminal, an aborted confirmation.
    Other(String),
    /// stdout was closed by its reader (`ricochet … | head`): not worth a
    /// message, the binary exits quietly.
    BrokenPipe,
}

impl CliError {
    /// The process exit code: 2 for usage errors, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Usage(_) => 2,
            _ => 1,
        }
    }

    /// The gRPC code, when the error came from the broker or the connection.
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            CliError::Status { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// The one-line text shown after `error: `.
    pub fn one_line(&self) -> String {
        let s = self.to_string();
        let mut out = String::with_capacity(s.len());
        for (i, part) in s
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .enumerate()
        {
            if i > 0 {
                out.push(' ');
            }
            out.push_str(part);
        }
        out
    }

    pub(crate) fn status(code: tonic::Code, message: impl Into<String>) -> Self {
        CliError::Status {
            code,
            message: message.into(),
        }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CliError::Usage(m) | CliError::Other(m) => f.write_str(m),
            CliError::BrokenPipe => f.write_str("output closed"),
            // `InvalidArgument`, `NotFound`… are the names operators know from
            // gRPC tooling; the Display form of `Code` is a sentence instead.
            CliError::Status { code, message } => write!(f, "{code:?}: {message}"),
        }
    }
}

impl std::error::Error for CliError {}

/// `e` and its sources, joined with `: `, without repeating a source the
/// message already contains.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let text = c.to_string();
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        cur = c.source();
    }
    s
}

/// `message` followed by the causes in `source` it does not already say.
fn with_causes(message: &str, source: Option<&(dyn std::error::Error + 'static)>) -> String {
    let mut message = message.to_owned();
    let mut cur = source;
    while let Some(c) = cur {
        let text = c.to_string();
        if !message.contains(&text) {
            if !message.is_empty() {
                message.push_str(": ");
            }
            message.push_str(&text);
        }
        cur = c.source();
    }
    message
}

impl From<tonic::Status> for CliError {
    fn from(s: tonic::Status) -> Self {
        // Read as the client reads it: kinds and the owner from the code
        // and the structured details, never from the text.
        ricochet_client::__private::error_from_status(s).into()
    }
}

impl From<ricochet_client::Error> for CliError {
    fn from(e: ricochet_client::Error) -> Self {
        use ricochet_client::ErrorKind as K;
        let message = with_causes(e.message(), std::error::Error::source(&e));
        match e.kind() {
            K::Policy => CliError::Usage(format!("invalid policy: {}", e.message())),
            K::Disconnected => CliError::status(tonic::Code::Unavailable, message),
            K::Timeout => CliError::status(tonic::Code::DeadlineExceeded, message),
            K::OwnerDown => CliError::status(
                tonic::Code::Unavailable,
                format!(
                    "the topic's broker {} is down: {message}",
                    e.owner_down().unwrap_or_default()
                ),
            ),
            // The not-owner redirect: say where the owner is.
            K::Redirect => {
                let r = e.redirect();
                CliError::status(
                    tonic::Code::FailedPrecondition,
                    format!(
                        "{message} (its owner is broker {} at {})",
                        r.map_or("", |r| r.owner.as_str()),
                        r.and_then(|r| r.url.as_deref()).unwrap_or("an unknown URL")
                    ),
                )
            }
            _ => match e.grpc_code() {
                Some(code) => CliError::status(tonic::Code::from_i32(code), message),
                None if e.kind() == K::InvalidArgument => {
                    CliError::status(tonic::Code::InvalidArgument, message)
                }
                None => CliError::Other(chain(&e)),
            },
        }
    }
}

impl From<std::io::Error> for CliError {
    fn from(e: std::io::Error) -> Self {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            return CliError::BrokenPipe;
        }
        CliError::Other(chain(&e))
    }
}

impl From<serde_json::Error> for CliError {
    fn from(e: serde_json::Error) -> Self {
        if e.io_error_kind() == Some(std::io::ErrorKind::BrokenPipe) {
            return CliError::BrokenPipe;
        }
        CliError::Other(format!("writing JSON: {e}"))
    }
}

impl From<ricochet_policy::PolicyError> for CliError {
    fn from(e: ricochet_policy::PolicyError) -> Self {
        CliError::Usage(format!("invalid policy: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_is_one_line_with_the_code_name() {
        let e = CliError::from(tonic::Status::invalid_argument(
            "invalid topic name \"a/b\"\n  expected persistent://tenant/namespace/topic",
        ));
        assert_eq!(e.exit_code(), 1);
        assert_eq!(
            e.one_line(),
            "InvalidArgument: invalid topic name \"a/b\" expected persistent://tenant/namespace/topic"
        );
        assert_eq!(CliError::Usage("x".into()).exit_code(), 2);
    }

    #[test]
    fn client_errors_keep_their_code() {
        let mut s = tonic::Status::unavailable("refused");
        s.set_source(std::sync::Arc::new(std::io::Error::other(
            "connection reset",
        )));
        let e = CliError::from(s);
        assert_eq!(e.code(), Some(tonic::Code::Unavailable));
        assert_eq!(e.to_string(), "Unavailable: refused: connection reset");
    }
}
