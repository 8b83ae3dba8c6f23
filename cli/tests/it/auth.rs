//! End-to-end tests of the CLI against a broker with authentication on:
//! `token create` (HS256 and ES256) makes tokens the broker accepts,
//! `auth grant|list|whoami|revoke` manage grants, `--token`,
//! `--token-file` and `RICOCHET_TOKEN` carry them, and refusals are one
//! line with the gRPC code.

use std::path::Path;
use std::process::{Output, Stdio};
use std::time::Duration;

use ricochet_testkit::InProcessBroker;
use serde_json::Value;

async fn run(url: &str, args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_ricochet"));
    cmd.args(args)
        .env("RICOCHET_URL", url)
        .env_remove("RICOCHET_TOKEN")
        .env_remove("RICOCHET_TOKEN_FILE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let child = cmd.spawn().expect("spawn ricochet");
    tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("ricochet finishes")
        .expect("ricochet output")
}

async fn ok(url: &str, args: &[&str], envs: &[(&str, &str)]) -> String {
    let out = run(url, args, envs).await;
    assert!(
        out.status.success(),
        "ricochet {args:?} failed:\nstdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_grants_and_refusals_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret.key");
    std::fs::write(&secret, "dev-secret-please-change\n").unwrap();
    let broker = InProcessBroker::start_with(|c| {
        c.auth.enabled = true;
        c.auth.token_secret_file = Some(secret.clone());
        c.auth.superusers = vec!["root".into()];
    })
    .await;
    let url = broker.url();
    let token = |role: &str| {
        let role = role.to_owned();
        let url = url.clone();
        let secret = secret.clone();
        async move {
            ok(
                &url,
                &[
                    "token",
                    "create",
                    "--secret-file",
                    path(&secret),
                    "--subject",
                    &role,
                    "--expires",
                    "1h",
                ],
                &[],
            )
            .await
            .trim()
            .to_owned()
        }
    };
    let root = token("root").await;
    let app = token("app").await;
    assert_eq!(root.split('.').count(), 3, "{root}");
    let root_file = dir.path().join("root.token");
    std::fs::write(&root_file, format!("{root}\n")).unwrap();

    // Anonymous: refused, one line with the code.
    let out = run(&url, &["topics", "list"], &[]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(err.contains("Unauthenticated"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");

    let granted = ok(
        &url,
        &[
            "--token-file",
            path(&root_file),
            "-o",
            "json",
            "auth",
            "grant",
            "--role",
            "app",
            "--resource",
            "acme/orders",
            "-p",
            "produce,consume",
        ],
        &[],
    )
    .await;
    let granted: Value = serde_json::from_str(&granted).unwrap();
    assert_eq!(
        granted[0]["permissions"],
        serde_json::json!(["produce", "consume"])
    );

    let env = [("RICOCHET_TOKEN", app.as_str())];
    ok(&url, &["produce", "acme/orders/new", "-m", "hi"], &env).await;
    // A partitioned topic: created by a superuser, produced to by the app
    // (the partition look-up carries its token too).
    let root_env = [("RICOCHET_TOKEN", root.as_str())];
    ok(
        &url,
        &[
            "topics",
            "create",
            "acme/orders/parted",
            "--partitions",
            "2",
        ],
        &root_env,
    )
    .await;
    let out = run(
        &url,
        &["topics", "update-partitions", "acme/orders/parted", "3"],
        &env,
    )
    .await;
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        err.contains("PermissionDenied") && err.contains("admin"),
        "{err}"
    );
    ok(&url, &["produce", "acme/orders/parted", "-m", "hi"], &env).await;
    let got = ok(
        &url,
        &[
            "-o",
            "json",
            "consume",
            "acme/orders/new",
            "-s",
            "s",
            "-n",
            "1",
            "--timeout",
            "10s",
        ],
        &env,
    )
    .await;
    assert!(got.contains("\"hi\""), "{got}");
    let me: Value =
        serde_json::from_str(&ok(&url, &["-o", "json", "auth", "whoami"], &env).await).unwrap();
    assert_eq!(me["role"], "app");
    assert_eq!(me["superuser"], false);

    // Outside its grants: PERMISSION_DENIED naming the role and permission.
    let out = run(&url, &["dlq", "purge", "acme/orders/new", "s", "-y"], &env).await;
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        err.contains("PermissionDenied") && err.contains("\"app\"") && err.contains("dead-letters"),
        "{err}"
    );
    // Each refusal names the permission the command needs (the look-ups a
    // command makes first never answer for it).
    for (args, needs) in [
        (
            &["produce", "other/ns/t", "-m", "x"][..],
            "lacks the produce permission on persistent://other/ns/t",
        ),
        (
            &[
                "consume",
                "other/ns/t",
                "-s",
                "s",
                "-n",
                "1",
                "--timeout",
                "2s",
            ],
            "lacks the consume permission on persistent://other/ns/t",
        ),
        (
            &["dlq", "list", "other/ns/t", "s"],
            "lacks the dead-letters permission on persistent://other/ns/t",
        ),
        (
            &["topics", "stats", "other/ns/t"],
            "holds no permission on persistent://other/ns/t; seeing it needs one of produce, \
             consume, dead-letters, policy or admin there",
        ),
    ] {
        let out = run(&url, args, &env).await;
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            err.contains("PermissionDenied: role \"app\" ") && err.contains(needs),
            "ricochet {args:?}: {err}"
        );
        assert!(!err.contains("the any"), "{err}");
    }
    // `topics list` shows only what the role may see, partitioned topics
    // included.
    ok(
        &url,
        &["topics", "create", "orders", "--partitions", "2"],
        &root_env,
    )
    .await;
    let listed = ok(&url, &["topics", "list"], &env).await;
    assert!(
        listed.contains("persistent://acme/orders/parted"),
        "{listed}"
    );
    assert!(!listed.contains("public/default"), "{listed}");
    let all = ok(&url, &["topics", "list"], &root_env).await;
    assert!(all.contains("persistent://public/default/orders"), "{all}");

    let listed = ok(&url, &["--token", &root, "auth", "list"], &[]).await;
    assert!(
        listed.contains("app")
            && listed.contains("acme/orders")
            && listed.contains("produce,consume"),
        "{listed}"
    );
    ok(
        &url,
        &[
            "--token",
            &root,
            "auth",
            "revoke",
            "--role",
            "app",
            "--resource",
            "acme/orders",
        ],
        &[],
    )
    .await;
    let out = run(&url, &["produce", "acme/orders/new", "-m", "x"], &env).await;
    assert!(String::from_utf8_lossy(&out.stderr).contains("PermissionDenied"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn es256_tokens_signed_by_the_cli_verify_with_the_public_key() {
    let dir = tempfile::tempdir().unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let private = dir.path().join("private.pem");
    let public = dir.path().join("public.pem");
    std::fs::write(&private, key.serialize_pem()).unwrap();
    std::fs::write(&public, key.public_key_pem()).unwrap();
    let broker = InProcessBroker::start_with(|c| {
        c.auth.enabled = true;
        c.auth.token_public_key_file = Some(public.clone());
        c.auth.superusers = vec!["root".into()];
    })
    .await;
    let url = broker.url();
    let root = ok(
        &url,
        &[
            "token",
            "create",
            "--private-key-file",
            path(&private),
            "--subject",
            "root",
        ],
        &[],
    )
    .await;
    let me = ok(&url, &["--token", root.trim(), "auth", "whoami"], &[]).await;
    assert!(me.contains("root") && me.contains("true"), "{me}");
    // A token signed by another key is refused.
    let other = rcgen::KeyPair::generate().unwrap();
    let other_file = dir.path().join("other.pem");
    std::fs::write(&other_file, other.serialize_pem()).unwrap();
    let forged = ok(
        &url,
        &[
            "token",
            "create",
            "--private-key-file",
            path(&other_file),
            "--subject",
            "root",
        ],
        &[],
    )
    .await;
    let out = run(&url, &["--token", forged.trim(), "auth", "whoami"], &[]).await;
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        err.contains("Unauthenticated") && err.contains("signature"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_speaks_tls_and_mtls_with_its_tls_options() {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
    let dir = tempfile::tempdir().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "test ca");
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let leaf = |cn: &str, names: Vec<String>| {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(names).unwrap();
        p.distinguished_name.push(DnType::CommonName, cn);
        (p.signed_by(&key, &ca).unwrap().pem(), key.serialize_pem())
    };
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let (bc, bk) = leaf("broker", vec!["127.0.0.1".into()]);
    let (cc, ck) = leaf("app", vec!["app".into()]);
    let (bc, bk, cc, ck) = (
        write("b.pem", &bc),
        write("b.key", &bk),
        write("c.pem", &cc),
        write("c.key", &ck),
    );
    let ca_file = write("ca.pem", &ca.pem());
    let broker = InProcessBroker::start_with(|c| {
        c.tls.cert_file = Some(bc.clone());
        c.tls.key_file = Some(bk.clone());
        c.tls.client_ca_file = Some(ca_file.clone());
        c.tls.require_client_cert = true;
    })
    .await;
    let url = format!("https://{}", broker.addr);
    let with_cert = [
        "--tls-ca",
        path(&ca_file),
        "--tls-cert",
        path(&cc),
        "--tls-key",
        path(&ck),
    ];
    let mut args = with_cert.to_vec();
    args.extend(["-o", "json", "auth", "whoami"]);
    let me: Value = serde_json::from_str(&ok(&url, &args, &[]).await).unwrap();
    assert_eq!(me["auth_enabled"], false);
    // The same through the environment.
    let env = [
        ("RICOCHET_TLS_CA", path(&ca_file)),
        ("RICOCHET_TLS_CERT", path(&cc)),
        ("RICOCHET_TLS_KEY", path(&ck)),
    ];
    ok(&url, &["topics", "list"], &env).await;
    // Without a client certificate: refused.
    let out = run(&url, &["--tls-ca", path(&ca_file), "topics", "list"], &[]).await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    // An https URL without a CA: a clear usage error.
    let out = run(&url, &["topics", "list"], &[]).await;
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(err.contains("--tls-ca"), "{err}");

    // A plaintext client of the TLS port is told so (not an HTTP/2 error),
    // on admin calls and when a producer opens, in one line.
    let plain = format!("http://{}", broker.addr);
    let advice = format!("error: the broker at {plain} speaks TLS; use https:// and --tls-ca");
    for args in [
        &["auth", "whoami"][..],
        &["topics", "list"],
        &["produce", "t", "-m", "x"],
    ] {
        let out = run(&plain, args, &[]).await;
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(err.trim(), advice, "ricochet {args:?}");
        assert_eq!(out.status.code(), Some(2), "ricochet {args:?}: {err}");
    }
    // The client library says the same.
    assert!(ricochet_client::speaks_tls(&plain).await);
    let refused = match ricochet_client::Client::connect(plain.clone()).await {
        Ok(client) => client.producer("t").create().await.map(drop).unwrap_err(),
        Err(e) => e,
    };
    assert!(
        refused.to_string().contains("speaks TLS; use https://"),
        "{refused}"
    );
    // A plaintext broker does not: the probe tells the two apart.
    let plaintext = InProcessBroker::start().await;
    assert!(!ricochet_client::speaks_tls(&plaintext.url()).await);
    assert!(!ricochet_client::speaks_tls("http://127.0.0.1:1").await);
}
