//! [`Credentials`]: the bearer token a client sends with every call (the
//! `authorization` metadata a broker with authentication requires), added
//! by an interceptor on the client's one channel.

use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::error::{Error, Result};

/// The channel every generated client of a [`crate::Client`] runs on: its
/// connection, with the client's credentials added to each call.
pub type Transport = InterceptedService<Channel, Credentials>;

/// What a client proves itself with: nothing, or a bearer token.
#[derive(Clone, Default)]
pub struct Credentials {
    header: Option<AsciiMetadataValue>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the token.
        f.debug_struct("Credentials")
            .field("token", &self.header.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl Credentials {
    /// No credentials (a broker without authentication).
    pub fn none() -> Self {
        Self::default()
    }

    /// A bearer token (a JWT, e.g. from `ricochet token create`); surrounding
    /// whitespace is ignored.
    pub fn token(token: &str) -> Result<Self> {
        let value: AsciiMetadataValue = MetadataValue::try_from(format!("Bearer {}", token.trim()))
            .map_err(|_| {
                Error::invalid_argument("the token holds characters a header cannot carry")
            })?;
        let mut value = value;
        value.set_sensitive(true);
        Ok(Self {
            header: Some(value),
        })
    }

    /// Whether a token is set.
    pub fn has_token(&self) -> bool {
        self.header.is_some()
    }
}

impl Interceptor for Credentials {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> std::result::Result<tonic::Request<()>, tonic::Status> {
        if let Some(h) = &self.header {
            request.metadata_mut().insert("authorization", h.clone());
        }
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_become_a_sensitive_bearer_header_and_are_not_printed() {
        let mut c = Credentials::token(" abc.def.ghi\n").unwrap();
        assert!(!format!("{c:?}").contains("abc"));
        let r = c.call(tonic::Request::new(())).unwrap();
        let h = r.metadata().get("authorization").unwrap();
        assert_eq!(h.to_str().unwrap(), "Bearer abc.def.ghi");
        assert!(h.is_sensitive());
        assert!(Credentials::token("bad\u{7f}token").is_err());
        let mut none = Credentials::none();
        assert!(
            none.call(tonic::Request::new(()))
                .unwrap()
                .metadata()
                .get("authorization")
                .is_none()
        );
    }
}
