//! Telling "this broker speaks TLS" apart from other failures of a
//! plaintext (`http://`) client. A TLS broker answers the HTTP/2 connection
//! preface with a TLS alert record, which the client's HTTP/2 layer reports
//! as a protocol error ("frame with invalid size") or a cancelled call,
//! saying nothing of TLS. Once a call has failed like that, [`speaks_tls`]
//! asks the address itself: one TCP connection, the preface, and the first
//! bytes of the answer. Nothing is probed while calls succeed.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long the probe waits for the connection and for the answer.
const PROBE_WAIT: Duration = Duration::from_secs(2);

/// What a client that speaks HTTP/2 in the clear sends first (RFC 9113 §3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The advice for a plaintext client of a TLS broker at `url` (the CLI's
/// `--tls-ca` is the client's `ClientBuilder::tls_ca_pem`).
pub fn tls_advice(url: &str) -> String {
    format!("the broker at {url} speaks TLS; use https:// and --tls-ca")
}

/// Whether the broker at `url`, an `http://` URL, expects TLS: it answers
/// the HTTP/2 preface with a TLS record (an alert or a handshake, TLS 1.0
/// to 1.3 framing). `false` for an `https://` URL, an address that cannot
/// be reached, or any other answer.
pub async fn speaks_tls(url: &str) -> bool {
    let Ok(uri) = url.parse::<tonic::codegen::http::Uri>() else {
        return false;
    };
    if uri.scheme_str() != Some("http") {
        return false;
    }
    let Some(host) = uri.host() else {
        return false;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = uri.port_u16().unwrap_or(80);
    let probe = async {
        let mut s = tokio::net::TcpStream::connect((host, port)).await.ok()?;
        s.write_all(PREFACE).await.ok()?;
        let mut first = [0u8; 3];
        s.read_exact(&mut first).await.ok()?;
        Some(first)
    };
    match tokio::time::timeout(PROBE_WAIT, probe).await {
        // Content type 21 (alert) or 22 (handshake), major version 3.
        Ok(Some([0x15 | 0x16, 0x03, minor])) => minor <= 0x04,
        _ => false,
    }
}

/// `e` as the advice to use TLS when it is the kind of failure a plaintext
/// client of a TLS broker gets and the broker at `url` does speak TLS;
/// otherwise `e` as it is.
pub(crate) async fn explain(url: &str, e: crate::Error) -> crate::Error {
    if looks_like_tls_mismatch(&e) && speaks_tls(url).await {
        crate::Error::invalid_argument(tls_advice(url))
    } else {
        e
    }
}

/// A broken HTTP/2 exchange: what a TLS answer to a plaintext client turns
/// into (a protocol error, a cancelled call, a broken connection).
fn looks_like_tls_mismatch(e: &crate::Error) -> bool {
    use crate::ErrorKind as K;
    matches!(e.kind(), K::Disconnected | K::Internal | K::Other)
}
