//! A `[tiered]` section's store identity: what names the object store its
//! objects go to, in one canonical spelling, so two brokers' sections
//! compare equal exactly when they name the same store (a replication
//! group's members must share one). An S3 store is its bucket, its key
//! prefix and its effective endpoint: the section's `endpoint`, else the
//! one the `object_store` client takes from the environment
//! (`AWS_ENDPOINT` / `AWS_ENDPOINT_URL`, read with the client's own key
//! names), else AWS's (`endpoint=aws`; a bucket name is global there);
//! the endpoint as a canonical URL (scheme and host lower case, the
//! scheme's default port left out, no trailing slash, never a user,
//! password or query). A directory store is its absolute path, `.` and
//! `..` and symbolic links resolved (a relative `file://` path is taken
//! from the working directory, as the store opens it). Credentials,
//! region, pace and cache never appear.

use super::TieredConfig;
use object_store::aws::AmazonS3ConfigKey;
use std::path::{Component, Path, PathBuf};

impl TieredConfig {
    /// The store's canonical identity (see the module), with the endpoint
    /// resolved from this process's environment as the client would.
    pub fn identity(&self) -> String {
        // As the client reads them: names and values that are not UTF-8
        // are skipped (`std::env::vars` would panic on one).
        self.identity_in(
            std::env::vars_os()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))),
        )
    }

    /// [`TieredConfig::identity`] with the environment `env` (name,
    /// value) instead of the process's.
    pub fn identity_in(&self, env: impl IntoIterator<Item = (String, String)>) -> String {
        if let Some(path) = self.url.strip_prefix("file://") {
            return format!("file://{}", canonical_dir(Path::new(path)).display());
        }
        let rest = self.url.trim_start_matches("s3://");
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let prefix: Vec<&str> = prefix.split('/').filter(|p| !p.is_empty()).collect();
        let at = if prefix.is_empty() {
            format!("s3://{bucket}")
        } else {
            format!("s3://{bucket}/{}", prefix.join("/"))
        };
        let endpoint = self
            .endpoint
            .clone()
            .or_else(|| env_endpoint(env))
            .map_or_else(|| "aws".to_owned(), |e| canonical_endpoint(&e));
        format!("{at} endpoint={endpoint}")
    }
}

/// The endpoint `AmazonS3Builder::from_env` takes from `env`: the last
/// `AWS_*` variable whose lower-cased name the client parses as its
/// endpoint key (as it applies them in order, the last one wins).
fn env_endpoint(env: impl IntoIterator<Item = (String, String)>) -> Option<String> {
    env.into_iter()
        .filter(|(k, _)| k.starts_with("AWS_"))
        .filter(|(k, _)| {
            matches!(
                k.to_ascii_lowercase().parse::<AmazonS3ConfigKey>(),
                Ok(AmazonS3ConfigKey::Endpoint)
            )
        })
        .map(|(_, v)| v)
        .last()
}

/// `endpoint` as a canonical URL (`aws` for AWS's own hosts); a string
/// that does not parse as one is kept, lower case, without a trailing
/// slash.
fn canonical_endpoint(endpoint: &str) -> String {
    let trimmed = endpoint.trim();
    let Ok(mut url) = url::Url::parse(trimmed) else {
        return trimmed.trim_end_matches('/').to_ascii_lowercase();
    };
    if url
        .host_str()
        .is_some_and(|h| h == "amazonaws.com" || h.ends_with(".amazonaws.com"))
    {
        return "aws".to_owned();
    }
    // Never a credential; the parser already lower-cased the scheme and
    // host and dropped the scheme's default port.
    let _ = url.set_username("");
    let _ = url.set_password(None);
    url.set_query(None);
    url.set_fragment(None);
    let path = url.path().trim_end_matches('/').to_owned();
    url.set_path(&path);
    url.as_str().trim_end_matches('/').to_owned()
}

/// `path` absolute (from the working directory), symbolic links resolved
/// when it exists, else `.` and `..` and repeated slashes resolved in
/// the text; `/` for an empty one.
fn canonical_dir(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(if path.as_os_str().is_empty() {
        Path::new("/")
    } else {
        path
    })
    .unwrap_or_else(|_| path.to_path_buf());
    if let Ok(real) = std::fs::canonicalize(&absolute) {
        return real;
    }
    let mut out = PathBuf::new();
    for c in absolute.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s3(url: &str, endpoint: Option<&str>) -> TieredConfig {
        TieredConfig {
            url: url.into(),
            endpoint: endpoint.map(Into::into),
            ..Default::default()
        }
    }

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_identity_names_the_store_and_never_a_credential() {
        let c = TieredConfig {
            credentials_file: Some("/secret/creds".into()),
            profile: "mine".into(),
            region: Some("eu-west-1".into()),
            ..s3("s3://bucket/some/prefix/", Some("http://127.0.0.1:9000/"))
        };
        let id = c.identity_in(env(&[("AWS_SECRET_ACCESS_KEY", "hush")]));
        assert_eq!(id, "s3://bucket/some/prefix endpoint=http://127.0.0.1:9000");
        // The section's endpoint: the process's environment does not count.
        assert_eq!(c.identity(), id);
        let same = TieredConfig {
            pace_bytes_per_second: 5,
            ..s3("s3://bucket//some//prefix", Some("http://127.0.0.1:9000"))
        };
        assert_eq!(same.identity_in(env(&[])), id);
        assert_ne!(
            s3("s3://bucket/other", c.endpoint.as_deref()).identity_in(env(&[])),
            id
        );
        // A user and password in the endpoint never show.
        let secret = s3("s3://bucket", Some("http://key:hush@Minio.Local:9000/?x=1"));
        let id = secret.identity_in(env(&[]));
        assert_eq!(id, "s3://bucket endpoint=http://minio.local:9000");
        assert!(!id.contains("hush") && !id.contains("key"), "{id}");
    }

    #[test]
    fn an_endpoint_set_only_in_the_environment_is_the_clients() {
        let bare = s3("s3://bucket", None);
        assert_eq!(bare.identity_in(env(&[])), "s3://bucket endpoint=aws");
        let a = bare.identity_in(env(&[("AWS_ENDPOINT", "http://10.0.0.1:9000")]));
        let b = bare.identity_in(env(&[("AWS_ENDPOINT_URL", "http://10.0.0.2:9000")]));
        assert_eq!(a, "s3://bucket endpoint=http://10.0.0.1:9000");
        assert_eq!(b, "s3://bucket endpoint=http://10.0.0.2:9000");
        // The section's endpoint wins over the environment's, as in the
        // client; a name the client does not read is not an endpoint.
        let set = s3("s3://bucket", Some("http://10.0.0.1:9000"));
        assert_eq!(set.identity_in(env(&[("AWS_ENDPOINT", "http://x:1")])), a);
        assert_eq!(
            bare.identity_in(env(&[("ENDPOINT", "http://x:1"), ("AWS_ENDPOINTS", "y")])),
            "s3://bucket endpoint=aws"
        );
    }

    #[test]
    fn one_store_under_two_spellings_is_one_identity() {
        let e = env(&[]);
        let one = |u: &str, ep: &str| s3(u, Some(ep)).identity_in(e.clone());
        let canonical = one("s3://b/p", "http://minio.local:9000");
        for (u, ep) in [
            ("s3://b/p/", "http://minio.local:9000/"),
            ("s3://b//p", "HTTP://MinIO.Local:9000"),
        ] {
            assert_eq!(one(u, ep), canonical, "{u} {ep}");
        }
        // The scheme's default port is no port.
        assert_eq!(
            one("s3://b/p", "http://minio.local:80/"),
            one("s3://b/p", "http://minio.local")
        );
        assert_eq!(
            one("s3://b/p", "https://minio.local:443"),
            one("s3://b/p", "https://minio.local/")
        );
        assert_ne!(one("s3://b/p", "http://minio.local:9001"), canonical);
        // AWS's own hosts are AWS (a bucket name is global there).
        assert_eq!(
            one("s3://b/p", "https://s3.eu-west-1.amazonaws.com"),
            s3("s3://b/p", None).identity_in(e.clone())
        );
    }

    #[test]
    fn a_directory_is_its_absolute_resolved_path() {
        let dir = tempfile::tempdir().unwrap();
        let real = std::fs::canonicalize(dir.path()).unwrap();
        let tier = real.join("tier");
        std::fs::create_dir_all(&tier).unwrap();
        let id = |u: String| {
            TieredConfig {
                url: u,
                ..Default::default()
            }
            .identity_in(env(&[]))
        };
        let canonical = format!("file://{}", tier.display());
        assert_eq!(id(format!("file://{}/", tier.display())), canonical);
        assert_eq!(
            id(format!("file://{}//x/../tier", real.display())),
            canonical
        );
        assert_eq!(id(format!("file://{}/./tier", real.display())), canonical);
        // Through a symbolic link.
        let link = real.join("link");
        std::os::unix::fs::symlink(&tier, &link).unwrap();
        assert_eq!(id(format!("file://{}", link.display())), canonical);
        // A relative path is the working directory's.
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(
            id("file://some/rel/dir".into()),
            format!("file://{}", cwd.join("some/rel/dir").display())
        );
        // A directory not made yet resolves in the text.
        assert_eq!(
            id("file:///nonexistent-ricochet/a/../b/".into()),
            "file:///nonexistent-ricochet/b"
        );
    }
}
