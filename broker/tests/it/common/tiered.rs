//! What the tiered-storage tests share: the RPCs, publishing numbered
//! messages, reading a topic from the earliest position, and the object
//! stores' contents.

use super::*;
use ricochet_broker::storage::tiered::TieredConfig;
use ricochet_proto::tiered_client::TieredClient;
use ricochet_proto::*;
use std::time::Duration;

/// A tier in a local directory (`file://`), offloading only when asked.
pub fn local_tier(root: &std::path::Path) -> TieredConfig {
    TieredConfig {
        url: format!("file://{}", root.display()),
        interval: Duration::from_secs(3600),
        cache_bytes: 1 << 20,
        block_bytes: 16 * 1024,
        ..Default::default()
    }
}

/// A tier on the moto server at `endpoint`, credentials from a file in
/// `dir`.
pub fn s3_tier(endpoint: &str, dir: &std::path::Path) -> TieredConfig {
    TieredConfig {
        url: format!("s3://{}/tiered", ricochet_testkit::moto::BUCKET),
        endpoint: Some(endpoint.to_owned()),
        region: Some("us-east-1".into()),
        allow_http: true,
        credentials_file: Some(ricochet_testkit::MotoServer::credentials_file(dir)),
        interval: Duration::from_secs(3600),
        cache_bytes: 1 << 20,
        block_bytes: 16 * 1024,
        ..Default::default()
    }
}

pub async fn tiered(url: &str) -> TieredClient<tonic::transport::Channel> {
    TieredClient::new(channel(url).await)
}

pub async fn offload(url: &str, topic: &str) -> Result<TieredOffloadResponse, tonic::Status> {
    tiered(url)
        .await
        .offload(TieredOffloadRequest {
            topic: topic.into(),
        })
        .await
        .map(|r| r.into_inner())
}

pub async fn status(url: &str, topic: &str) -> TieredStatusResponse {
    tiered(url)
        .await
        .offload_status(TieredStatusRequest {
            topic: topic.into(),
        })
        .await
        .expect("offload status")
        .into_inner()
}

/// The payload of message `i`: its number, padded to 200 bytes.
pub fn payload(i: u32) -> String {
    format!("m{i:06}-{:193}", "")
}

/// Publishes messages `range` in batches of 10 (one record each).
pub async fn publish(url: &str, topic: &str, range: std::ops::Range<u32>) {
    let mut p = RawProducer::open(url, topic, "").await.unwrap();
    let all: Vec<u32> = range.collect();
    for chunk in all.chunks(10) {
        let texts: Vec<String> = chunk.iter().map(|i| payload(*i)).collect();
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        p.send(&refs).await;
    }
}

/// The numbers of the first `n` messages a new subscription `sub` reads
/// from the earliest position (acked as they come).
pub async fn read_all(url: &str, topic: &str, sub: &str, n: usize) -> Vec<u32> {
    let mut c = RawConsumer::simple(url, topic, sub, SubscriptionType::Exclusive).await;
    c.flow(n as u32).await;
    let got = c.take(n, WAIT).await;
    got.iter()
        .map(|m| text(m)[1..7].parse::<u32>().expect("a numbered payload"))
        .collect()
}

/// The object keys the topic's status says are referenced.
pub fn referenced(s: &TieredStatusResponse) -> Vec<String> {
    let mut keys: Vec<String> = s
        .segments
        .iter()
        .filter(|g| g.state == "remote" || g.state == "offloaded")
        .map(|g| g.object.clone())
        .collect();
    keys.sort();
    keys
}

/// Every file under `root`, as keys relative to it, sorted.
pub fn files_under(root: &std::path::Path) -> Vec<String> {
    fn walk(dir: &std::path::Path, root: &std::path::Path, out: &mut Vec<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, root, out);
            } else if let Ok(rel) = p.strip_prefix(root) {
                out.push(rel.to_string_lossy().into_owned());
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out.sort();
    out
}

/// The segment files of `topic` on local disk under the data dir.
pub fn local_segments(data: &std::path::Path, topic: &str) -> usize {
    let dir = data
        .join("log")
        .join(ricochet_broker::storage::segments::dir_name(topic));
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with(".seg"))
                .count()
        })
        .unwrap_or(0)
}
