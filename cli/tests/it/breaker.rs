//! End-to-end tests of the outage breaker in `ricochet`: `policy explain
//! --breaker`, `policy set --breaker` and `policy get`, `subscriptions
//! breaker --open|--close|--auto`, the breaker line of `subscriptions
//! stats`, and bad input (a malformed breaker is a usage error, exit 2;
//! forcing a subscription without a breaker fails with one line, exit 1).

use crate::common;

use common::{Env, stderr, u};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn breaker_set_force_show_and_explain() {
    let env = Env::start().await;
    let text = env
        .ok(&[
            "policy",
            "explain",
            "backoff:fixed=1s,max=3",
            "--breaker",
            "breaker:ratio=0.5,window=200",
        ])
        .await;
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("50% or more of the last 200 settles failed"),
        "{text}"
    );
    assert!(text.contains("5s, 10s, 20s, 40s"), "{text}");
    let ex = env
        .json(&[
            "policy",
            "explain",
            "backoff:fixed=1s,max=3",
            "--breaker",
            "breaker:failures=5,within=2s,probe=1s",
        ])
        .await;
    assert_eq!(ex["breaker"]["probe_waits_ms"][1], 2000, "{ex}");

    // A subscription exists once a consumer has subscribed.
    env.ok(&[
        "consume",
        "brk",
        "-s",
        "ops",
        "-n",
        "1",
        "--timeout",
        "200ms",
    ])
    .await;
    let e = env
        .run(&["subscriptions", "breaker", "brk", "ops", "--open"])
        .await;
    assert_eq!(e.status.code(), Some(1));
    let err = stderr(&e);
    assert!(
        err.contains("has no breaker") && err.lines().count() == 1,
        "{err}"
    );

    let set = env
        .json(&[
            "policy",
            "set",
            "brk",
            "ops",
            "backoff:fixed=1s,max=3",
            "--breaker",
            "breaker:ratio=0.5,window=50,min=10",
        ])
        .await;
    assert_eq!(set["source"], "admin");
    assert_eq!(
        set["breaker"],
        "breaker:ratio=0.5,window=50,min=10,within=10s,probe=5s,max-probe=5m"
    );
    let got = env.json(&["policy", "get", "brk", "ops"]).await;
    assert_eq!(got["breaker"], set["breaker"]);

    let open = env
        .json(&["subscriptions", "breaker", "brk", "ops", "--open"])
        .await;
    assert_eq!(open["state"], "open");
    assert_eq!(open["mode"], "forced_open");
    assert_eq!(u(&open["trips"]), 1);
    let stats = env.json(&["subscriptions", "stats", "brk", "ops"]).await;
    assert_eq!(stats["breaker"]["state"], "open", "{stats}");
    let table = env.ok(&["subscriptions", "stats", "brk", "ops"]).await;
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains("breaker") && table.contains("open since"),
        "{table}"
    );
    let auto = env
        .json(&["subscriptions", "breaker", "brk", "ops", "--auto"])
        .await;
    assert_eq!(
        (&auto["state"], &auto["mode"]),
        (&"open".into(), &"auto".into())
    );
    assert!(u(&auto["next_probe_ms"]) > 0);
    let closed = env
        .json(&["subscriptions", "breaker", "brk", "ops", "--close"])
        .await;
    assert_eq!(closed["state"], "closed");

    // Bad input: usage errors, nothing sent.
    for args in [
        &[
            "policy",
            "set",
            "brk",
            "ops",
            "--breaker",
            "breaker:ratio=2",
        ][..],
        &["subscriptions", "breaker", "brk", "ops"][..],
        &[
            "subscriptions",
            "breaker",
            "brk",
            "ops",
            "--open",
            "--close",
        ][..],
    ] {
        let o = env.run(args).await;
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
    }
    let got = env.json(&["policy", "get", "brk", "ops"]).await;
    assert_eq!(got["breaker"], set["breaker"], "unchanged");
}
