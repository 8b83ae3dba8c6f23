//! `ricochet policy set --key-order [--poison-key-after D]`: set by an
//! operator, shown by `policy get` and `subscriptions stats`; refused on a
//! Shared subscription with one readable line and a non-zero exit.

use crate::common;

use common::{Env, stderr, u};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_set_key_order() {
    let env = Env::start().await;
    // The subscription exists once a consumer has subscribed.
    for (sub, ty) in [("ordered", "exclusive"), ("shared", "shared")] {
        env.ok(&[
            "consume",
            "ko",
            "-s",
            sub,
            "-t",
            ty,
            "-n",
            "1",
            "--timeout",
            "200ms",
        ])
        .await;
    }
    let set = env
        .json(&[
            "policy",
            "set",
            "ko",
            "ordered",
            "backoff:fixed=1s,max=3",
            "--key-order",
            "--poison-key-after",
            "10m",
        ])
        .await;
    assert_eq!(set["source"], "admin");
    assert_eq!(set["key_order"]["poison_after"], "10m");
    let got = env.ok(&["policy", "get", "ko", "ordered"]).await;
    let text = String::from_utf8_lossy(&got.stdout);
    assert!(text.contains("key order, poison after 10m"), "{text}");
    let stats = env.json(&["subscriptions", "stats", "ko", "ordered"]).await;
    assert_eq!(u(&stats["key_order"]["blocked_keys"]), 0, "{stats}");
    // Key order alone, then off again with a policy set without it.
    let alone = env
        .json(&["policy", "set", "ko", "ordered", "--key-order"])
        .await;
    assert!(
        alone["spec"].is_null() && alone["key_order"].is_object(),
        "{alone}"
    );
    let off = env
        .json(&["policy", "set", "ko", "ordered", "backoff:fixed=1s,max=3"])
        .await;
    assert!(off.get("key_order").is_none(), "{off}");
    // And with --clear, the operator's choice (key order included) is gone.
    env.json(&["policy", "set", "ko", "ordered", "--key-order"])
        .await;
    let cleared = env
        .json(&["policy", "set", "ko", "ordered", "--clear"])
        .await;
    assert!(cleared.get("key_order").is_none(), "{cleared}");
    assert_ne!(cleared["source"], "admin", "{cleared}");

    let refused = env
        .run(&["policy", "set", "ko", "shared", "--key-order"])
        .await;
    assert_ne!(refused.status.code(), Some(0));
    let err = stderr(&refused);
    assert!(err.contains("Shared"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}
