//! The `[tiered]` config section: which object store sealed segments are
//! offloaded to (S3-compatible through `object_store`'s `aws` feature, or a
//! local directory), with which credentials, how fast, how much memory
//! reads may cache, and the default offload policy.

use super::policy::OffloadPolicy;
use crate::{StorageError, StorageResult as Result};
use object_store::ObjectStore;
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Tiered storage settings (absent: no second tier).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TieredConfig {
    /// `s3://bucket/prefix` (an S3-compatible server) or
    /// `file:///absolute/directory` (a local or mounted filesystem).
    pub url: String,
    /// The S3 endpoint (default: AWS's, or `AWS_ENDPOINT`).
    pub endpoint: Option<String>,
    /// The S3 region (default: `AWS_REGION`, else `us-east-1`).
    pub region: Option<String>,
    /// Allow a plain-HTTP endpoint (a local test server).
    pub allow_http: bool,
    /// An AWS shared-credentials file (`[profile]` with
    /// `aws_access_key_id` / `aws_secret_access_key` / optional
    /// `aws_session_token`); default: the `AWS_*` environment variables.
    pub credentials_file: Option<PathBuf>,
    /// The profile read from `credentials_file`.
    pub profile: String,
    /// Offload pace in bytes per second (0: as fast as the store takes).
    pub pace_bytes_per_second: u64,
    /// Memory for blocks read back from the object store (an LRU).
    pub cache_bytes: u64,
    /// Bytes fetched per ranged GET (and cached as one block).
    pub block_bytes: u64,
    /// How often the background task looks for segments to offload.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// Default policy: offload sealed segments this old.
    #[serde(with = "humantime_serde")]
    pub offload_after: Option<Duration>,
    /// Default policy: offload while a topic's local segments hold more.
    pub local_limit_bytes: Option<u64>,
    /// Default policy: delete the local copy this long after the offload.
    #[serde(with = "humantime_serde")]
    pub local_delete_lag: Option<Duration>,
    /// Default policy: never delete local copies.
    pub keep_local: bool,
    /// How old an object under a replicated topic's prefix that no record
    /// names (an upload a crash or a lost leadership cut off) must be
    /// before its leader deletes it (default: twice `interval`, at least
    /// a minute).
    #[serde(with = "humantime_serde")]
    pub orphan_after: Option<Duration>,
}

impl Default for TieredConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            endpoint: None,
            region: None,
            allow_http: false,
            credentials_file: None,
            profile: "default".into(),
            pace_bytes_per_second: 0,
            cache_bytes: 64 << 20,
            block_bytes: 1 << 20,
            interval: Duration::from_secs(10),
            offload_after: None,
            local_limit_bytes: None,
            local_delete_lag: None,
            keep_local: false,
            orphan_after: None,
        }
    }
}

/// Where objects go: the store and the key prefix under it.
pub(super) struct Opened {
    pub store: Arc<dyn ObjectStore>,
    pub prefix: String,
}

impl TieredConfig {
    /// The default policy, if the section sets one.
    pub fn default_policy(&self) -> Option<OffloadPolicy> {
        let ms = |d: Option<Duration>| d.map(|d| d.as_millis() as u64);
        let p = OffloadPolicy {
            offload_after_ms: ms(self.offload_after),
            local_limit_bytes: self.local_limit_bytes,
            delete_lag_ms: ms(self.local_delete_lag),
            keep_local: self.keep_local,
        };
        (!p.is_empty()).then_some(p)
    }

    /// Rejects settings that cannot work.
    pub fn validate(&self) -> std::result::Result<(), String> {
        if self.cache_bytes < self.block_bytes {
            return Err("tiered.cache_bytes must hold at least one block (block_bytes)".into());
        }
        if self.block_bytes < 4096 {
            return Err("tiered.block_bytes must be at least 4096".into());
        }
        if self.interval.is_zero() {
            return Err("tiered.interval must be positive".into());
        }
        if !(self.url.starts_with("s3://") || self.url.starts_with("file://")) {
            return Err(format!(
                "tiered.url must be s3://bucket[/prefix] or file:///directory, got {:?}",
                self.url
            ));
        }
        Ok(())
    }

    /// Builds the object store the URL names.
    pub(super) fn open(&self) -> Result<Opened> {
        self.validate().map_err(config_error)?;
        if let Some(path) = self.url.strip_prefix("file://") {
            let root = PathBuf::from(path);
            std::fs::create_dir_all(&root)?;
            let store = LocalFileSystem::new_with_prefix(&root)
                .map_err(|e| config_error(format!("tiered.url {}: {e}", self.url)))?;
            return Ok(Opened {
                store: Arc::new(store),
                prefix: String::new(),
            });
        }
        // object_store's HTTP client brings no TLS crypto provider of its
        // own; the process's default is ring's (as tonic's), unless one
        // was installed already.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let rest = self.url.trim_start_matches("s3://");
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(config_error("tiered.url names no bucket".into()));
        }
        let mut b = AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            .with_client_options(
                object_store::ClientOptions::new()
                    .with_connect_timeout(Duration::from_secs(5))
                    .with_timeout(Duration::from_secs(60)),
            )
            // A few quick retries: an outage is the offloader's to back
            // off from (and a reader's to see), not a call's to hide.
            .with_retry(object_store::RetryConfig {
                max_retries: 3,
                retry_timeout: Duration::from_secs(15),
                ..Default::default()
            })
            // After the client options, which hold it too.
            .with_allow_http(self.allow_http);
        if let Some(e) = &self.endpoint {
            b = b.with_endpoint(e);
        }
        match &self.region {
            Some(r) => b = b.with_region(r),
            None if std::env::var_os("AWS_REGION").is_none() => b = b.with_region("us-east-1"),
            None => {}
        }
        if let Some(file) = &self.credentials_file {
            let c = read_credentials(file, &self.profile)?;
            b = b
                .with_access_key_id(c.key_id)
                .with_secret_access_key(c.secret);
            if let Some(t) = c.token {
                b = b.with_token(t);
            }
        }
        let store = b
            .build()
            .map_err(|e| config_error(format!("tiered: {e}")))?;
        Ok(Opened {
            store: Arc::new(store),
            prefix: prefix.trim_matches('/').to_owned(),
        })
    }
}

fn config_error(why: String) -> StorageError {
    StorageError::Io(std::io::Error::new(std::io::ErrorKind::InvalidInput, why))
}

struct Credentials {
    key_id: String,
    secret: String,
    token: Option<String>,
}

/// Reads `profile` of an AWS shared-credentials file.
fn read_credentials(file: &std::path::Path, profile: &str) -> Result<Credentials> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| config_error(format!("tiered.credentials_file {}: {e}", file.display())))?;
    let (mut key_id, mut secret, mut token) = (None, None, None);
    let mut inside = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('#') || line.starts_with(';') || line.is_empty() {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            inside = name.trim() == profile;
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        if !inside {
            continue;
        }
        let v = v.trim().to_owned();
        match k.trim() {
            "aws_access_key_id" => key_id = Some(v),
            "aws_secret_access_key" => secret = Some(v),
            "aws_session_token" => token = Some(v),
            _ => {}
        }
    }
    match (key_id, secret) {
        (Some(key_id), Some(secret)) => Ok(Credentials {
            key_id,
            secret,
            token,
        }),
        _ => Err(config_error(format!(
            "tiered.credentials_file {}: profile [{profile}] lacks aws_access_key_id or aws_secret_access_key",
            file.display()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_come_from_the_named_profile() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("creds");
        std::fs::write(
            &f,
            "[other]\naws_access_key_id = A\naws_secret_access_key = B\n\n[mine]\n# note\naws_access_key_id=K\naws_secret_access_key = S\naws_session_token = T\n",
        )
        .unwrap();
        let c = read_credentials(&f, "mine").unwrap();
        assert_eq!((c.key_id.as_str(), c.secret.as_str()), ("K", "S"));
        assert_eq!(c.token.as_deref(), Some("T"));
        let e = read_credentials(&f, "absent").err().unwrap().to_string();
        assert!(e.contains("[absent]"), "{e}");
    }

    #[test]
    fn a_bad_url_is_refused() {
        let c = TieredConfig {
            url: "ftp://x".into(),
            ..Default::default()
        };
        assert!(c.validate().unwrap_err().contains("s3://"));
    }
}
