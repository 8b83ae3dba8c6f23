//! `/metrics` behind a bearer token: refused (401) without it or with
//! another, served with it. Its own test binary, since the Prometheus
//! recorder is installed once per process.

use ricochet_testkit::free_addr;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn get(addr: SocketAddr, auth: Option<&str>) -> String {
    let mut s = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match tokio::net::TcpStream::connect(addr).await {
                Ok(s) => break s,
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    })
    .await
    .expect("metrics listener up");
    let header = auth.map_or(String::new(), |a| format!("Authorization: {a}\r\n"));
    s.write_all(
        format!("GET /metrics HTTP/1.1\r\nHost: localhost\r\n{header}Connection: close\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).await.unwrap();
    body
}

#[tokio::test]
async fn metrics_need_the_bearer_token_when_one_is_configured() {
    let addr = free_addr();
    ricochet_broker::install_prometheus_secured(addr, Some(b"scrape-me".to_vec())).unwrap();
    metrics::counter!("ricochet_auth_failures_total").increment(1);
    let anonymous = get(addr, None).await;
    assert!(anonymous.starts_with("HTTP/1.1 401"), "{anonymous}");
    assert!(!anonymous.contains("ricochet_auth_failures_total"));
    let wrong = get(addr, Some("Bearer scrape-mf")).await;
    assert!(wrong.starts_with("HTTP/1.1 401"), "{wrong}");
    let ok = get(addr, Some("Bearer scrape-me")).await;
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    assert!(ok.contains("ricochet_auth_failures_total 1"), "{ok}");
}
