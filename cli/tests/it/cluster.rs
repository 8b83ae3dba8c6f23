//! `ricochet cluster brokers|lookup` and topic-scoped commands against a
//! stand-in for a cluster's lookup service (`ricochet_testkit::FakeCluster`)
//! routing topics to two real in-process brokers: the tables and JSON, a
//! partitioned topic's owners with one partition's broker down (shown, and
//! a one-line error with exit code 1), `topics stats` and `produce` given the
//! fake's URL reaching the owner, and a standalone broker answering for
//! itself.

use crate::common;

use common::{Env, stderr, u};
use ricochet_proto::BrokerInfo;
use ricochet_proto::partitions::partition_name;
use ricochet_testkit::fake_cluster::fq;
use ricochet_testkit::{FakeAnswer, FakeCluster, InProcessBroker};

fn broker(id: &str, url: &str, live: bool, topics: &[&str]) -> BrokerInfo {
    BrokerInfo {
        id: id.into(),
        url: url.into(),
        live,
        placed_topics: topics.len() as u64 + 1,
        owned_topics: if live { topics.len() as u64 } else { 0 },
        load: 12.5,
        registered_at_ms: 1_764_547_200_000, // 2025-12-01T00:00:00Z
        topics: topics.iter().map(|t| fq(t)).collect(),
        draining: false,
    }
}

#[tokio::test]
async fn cluster_brokers_table_and_json() {
    let fake = FakeCluster::start("prod", FakeAnswer::Unimplemented).await;
    fake.brokers(vec![
        broker("b2", "http://10.0.0.2:6650", false, &[]),
        broker("b1", "http://10.0.0.1:6650", true, &["orders", "audit"]),
    ]);
    let env = Env::at(fake.url());

    let out = env.ok(&["cluster", "brokers"]).await;
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "cluster prod", "{text}");
    let header: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(
        header,
        ["id", "url", "live", "placed", "owned", "load", "registered"]
    );
    let b1: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!(
        &b1[..6],
        ["b1", "http://10.0.0.1:6650", "yes", "3", "2", "12.5"],
        "{text}"
    );
    assert!(b1[6].starts_with("2025-12-01T00:00:00"), "{text}");
    let b2: Vec<&str> = lines[3].split_whitespace().collect();
    assert_eq!(&b2[..5], ["b2", "http://10.0.0.2:6650", "no", "1", "0"]);
    assert_eq!(lines.len(), 4, "no topics unless asked: {text}");

    let out = env.ok(&["cluster", "brokers", "--topics"]).await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(
            "b1 owns 2 topic(s):\n  persistent://public/default/audit\n  persistent://public/default/orders\n"
        ),
        "{text}"
    );
    assert!(text.contains("b2 owns 0 topic(s):"), "{text}");

    let v = env.json(&["cluster", "brokers", "--topics"]).await;
    assert_eq!(v["cluster"], "prod");
    let bs = v["brokers"].as_array().unwrap();
    assert_eq!(bs.len(), 2);
    assert_eq!(bs[0]["id"], "b1");
    assert_eq!(bs[0]["live"], true);
    assert_eq!(u(&bs[0]["placed_topics"]), 3);
    assert_eq!(u(&bs[0]["owned_topics"]), 2);
    assert_eq!(bs[0]["load"], 12.5);
    assert_eq!(u(&bs[0]["registered_at_ms"]), 1_764_547_200_000);
    assert_eq!(bs[0]["topics"].as_array().unwrap().len(), 2);
    assert_eq!(bs[1]["live"], false);
    let v = env.json(&["cluster", "brokers"]).await;
    assert!(v["brokers"][0].get("topics").is_none(), "{v}");
}

#[tokio::test]
async fn cluster_lookup_of_a_topic_and_of_every_partition() {
    let fake = FakeCluster::start("prod", FakeAnswer::Unimplemented).await;
    fake.route(
        "orders",
        FakeAnswer::Owner {
            id: "b1".into(),
            url: "http://10.0.0.1:6650".into(),
            epoch: 42,
        },
    );
    let env = Env::at(fake.url());
    let out = env.ok(&["cluster", "lookup", "orders"]).await;
    let text = String::from_utf8_lossy(&out.stdout);
    let row: Vec<&str> = text.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(
        row,
        [
            "persistent://public/default/orders",
            "b1",
            "http://10.0.0.1:6650",
            "42",
            "yes"
        ],
        "{text}"
    );
    let v = env.json(&["cluster", "lookup", "orders"]).await;
    assert_eq!(v["cluster"], "prod");
    assert_eq!(v["owners"][0]["broker_id"], "b1");
    assert_eq!(u(&v["owners"][0]["epoch"]), 42);
    assert!(v.get("partitions").is_none());

    // A partitioned topic: every partition, one of them on a down broker.
    let base = fq("clicks");
    fake.partitioned(&base, 3);
    fake.route(
        &partition_name(&base, 0),
        FakeAnswer::owner("b1", "http://10.0.0.1:6650"),
    );
    fake.route(
        &partition_name(&base, 1),
        FakeAnswer::Down { id: "b2".into() },
    );
    fake.route(
        &partition_name(&base, 2),
        FakeAnswer::owner("b3", "http://10.0.0.3:6650"),
    );
    let out = env.run(&["cluster", "lookup", "clicks"]).await;
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<Vec<&str>> = text
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 3, "{text}");
    assert_eq!(rows[0][..2], [partition_name(&base, 0).as_str(), "b1"]);
    assert_eq!(
        rows[1],
        [partition_name(&base, 1).as_str(), "b2", "-", "0", "DOWN"]
    );
    assert_eq!(rows[2][..2], [partition_name(&base, 2).as_str(), "b3"]);
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("error: Unavailable: 1 partition(s) of persistent://public/default/clicks are unavailable: broker(s) b2 down"),
        "{err}"
    );

    // An ordinary topic on a down broker: one line, exit 1.
    fake.route("gone", FakeAnswer::Down { id: "b7".into() });
    let out = env.run(&["cluster", "lookup", "gone"]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("error: Unavailable: the topic's broker b7 is down"),
        "{err}"
    );
}

#[tokio::test]
async fn topic_scoped_commands_reach_the_owner() {
    let a = InProcessBroker::start().await;
    let b = InProcessBroker::start().await;
    let fake = FakeCluster::start("prod", FakeAnswer::Unimplemented).await;
    fake.route("routed", FakeAnswer::owner("b", b.url()));
    fake.route("down", FakeAnswer::Down { id: "b5".into() });
    let env = Env::at(fake.url());

    env.ok(&["produce", "routed", "-m", "hello", "-n", "3"])
        .await;
    // The fake serves no Admin: the stats can only come from the owner.
    let v = env.json(&["topics", "stats", "routed"]).await;
    assert_eq!(u(&v["message_count"]), 3, "{v}");
    let on_b = Env::at(b.url());
    let v = on_b.json(&["topics", "stats", "routed"]).await;
    assert_eq!(u(&v["message_count"]), 3);
    let on_a = Env::at(a.url());
    let out = on_a.run(&["topics", "stats", "routed"]).await;
    assert_eq!(out.status.code(), Some(1), "nothing went to a");

    let lines = env
        .json_lines(&["consume", "routed", "-s", "s", "-n", "3"])
        .await;
    assert_eq!(lines.len(), 3);
    let v = env.json(&["subscriptions", "list", "routed"]).await;
    assert!(v.to_string().contains("\"s\""), "{v}");

    let out = env.run(&["topics", "stats", "down"]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("error: Unavailable: the topic's broker b5 is down"),
        "{err}"
    );
}

#[tokio::test]
async fn a_standalone_broker_answers_for_itself() {
    let env = Env::start().await;
    let v = env.json(&["cluster", "brokers"]).await;
    let brokers = v["brokers"].as_array().expect("a list of brokers");
    assert_eq!(brokers.len(), 1, "{v}");
    assert_eq!(brokers[0]["live"], true, "{v}");
    let v = env.json(&["cluster", "lookup", "plain"]).await;
    assert!(v.to_string().contains("127.0.0.1"), "{v}");
    // Topic-scoped commands work on it as before.
    env.ok(&["produce", "plain", "-m", "x"]).await;
    let v = env.json(&["topics", "stats", "plain"]).await;
    assert_eq!(u(&v["message_count"]), 1);
}

/// `cluster move` and `cluster drain` against a real cluster (etcd and two
/// brokers as child processes; skipped without `etcd` unless
/// `RICOCHET_REQUIRE_ETCD=1`): the topic moves with its messages, the
/// drained broker shows as draining and owns nothing, and mistakes exit 1
/// with one line.
#[tokio::test]
async fn cluster_move_and_drain_on_a_real_cluster() {
    let Some(etcd) =
        ricochet_testkit::etcd_or_skip("cluster_move_and_drain_on_a_real_cluster").await
    else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let mut brokers = ricochet_testkit::spawn_cluster(
        &etcd,
        "cli",
        2,
        root.path(),
        std::time::Duration::from_secs(3),
        &ricochet_testkit::SpawnOptions::new(),
    )
    .await;
    let env = Env::at(brokers[0].url());
    env.ok(&["produce", "jobs", "-m", "one", "-m", "two"]).await;
    let owner = env.json(&["cluster", "lookup", "jobs"]).await["owners"][0]["broker_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let other = if owner == "b0" { "b1" } else { "b0" };

    let moved = env.json(&["cluster", "move", "jobs"]).await;
    assert_eq!(moved["to_broker"], other, "{moved}");
    assert_eq!(u(&moved["entries"]), 2, "{moved}");
    let lookup = env.json(&["cluster", "lookup", "jobs"]).await;
    assert_eq!(lookup["owners"][0]["broker_id"], other, "{lookup}");
    let stats = env.json(&["topics", "stats", "jobs"]).await;
    assert_eq!(u(&stats["message_count"]), 2, "{stats}");

    // Draining the broker that now holds it moves it back (the only other).
    let out = env.ok(&["cluster", "drain", other]).await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("broker {other}: 1 topic(s) moved")),
        "{text}"
    );
    assert!(text.contains("persistent://public/default/jobs"), "{text}");
    let brokers_view = env.json(&["cluster", "brokers"]).await;
    let drained = brokers_view["brokers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["id"] == other)
        .unwrap()
        .clone();
    assert_eq!(drained["draining"], true, "{brokers_view}");
    assert_eq!(u(&drained["placed_topics"]), 0, "{brokers_view}");

    // Mistakes: one line, exit 1, nothing moved.
    let out = env.run(&["cluster", "drain", "nope"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("no broker nope"), "{}", stderr(&out));
    let out = env.run(&["cluster", "move", "jobs", "--to", other]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("draining"), "{}", stderr(&out));
    let stats = env.json(&["topics", "stats", "jobs"]).await;
    assert_eq!(u(&stats["message_count"]), 2, "{stats}");

    // Three more topics, all placed on `owner` while `other` drains; then
    // `other` comes back (a restart ends its drain) and a rebalance gives
    // it its share: 4 + 0 becomes 2 + 2.
    for t in ["t1", "t2", "t3"] {
        env.ok(&["produce", t, "-m", "x"]).await;
    }
    let i = if other == "b0" { 0 } else { 1 };
    brokers[i].kill9();
    brokers[i].restart().await;
    // It listens before it joins: wait until it is registered again.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let view = env.json(&["cluster", "brokers"]).await;
        let back = view["brokers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|b| b["id"] == other && b["live"] == true && b["draining"] == false);
        if back {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{view}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let dry = env.json(&["cluster", "rebalance", "--dry-run"]).await;
    let view = env.json(&["cluster", "brokers", "--topics"]).await;
    assert_eq!(dry["moved"].as_array().unwrap().len(), 2, "{dry}\n{view}");
    let out = env.ok(&["cluster", "rebalance"]).await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("moved 2 topic(s)"), "{text}");
    let mut on_other = 0;
    for t in ["jobs", "t1", "t2", "t3"] {
        let l = env.json(&["cluster", "lookup", t]).await;
        on_other += usize::from(l["owners"][0]["broker_id"] == other);
    }
    assert_eq!(on_other, 2);
    let again = env.json(&["cluster", "rebalance", "--dry-run"]).await;
    assert!(again["moved"].as_array().unwrap().is_empty(), "{again}");
}

#[tokio::test]
async fn cluster_brokers_lists_replicated_topics_groups() {
    let fake = FakeCluster::start("prod", FakeAnswer::Unimplemented).await;
    fake.brokers(vec![broker("b1", "http://10.0.0.1:6650", true, &[])]);
    fake.groups(vec![ricochet_proto::ReplicationGroup {
        topic: fq("orders"),
        replicas: 3,
        members: vec!["b1".into(), "b0".into(), "b2".into()],
        leader: "b0".into(),
        last_index: 120,
        member_status: [("b1", 120, "ok"), ("b0", 120, "ok"), ("b2", 7, "lagging")]
            .map(|(id, matched, health)| ricochet_proto::GroupMember {
                broker_id: id.into(),
                matched_index: matched,
                lag: 120 - matched,
                health: health.into(),
            })
            .to_vec(),
        status_age_ms: 900,
    }]);
    let env = Env::at(fake.url());
    let out = env.ok(&["cluster", "brokers"]).await;
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    let header: Vec<&str> = lines[4].split_whitespace().collect();
    assert_eq!(
        header,
        ["replicated", "topic", "replicas", "members", "leader"],
        "{text}"
    );
    let row: Vec<&str> = lines[5].split_whitespace().collect();
    assert_eq!(
        row,
        [fq("orders").as_str(), "3", "b1,b0,b2", "b0"],
        "{text}"
    );
    // Each member's matched index, lag and health.
    let header: Vec<&str> = lines[7].split_whitespace().collect();
    assert_eq!(
        header,
        ["replicated", "topic", "member", "matched", "lag", "health"],
        "{text}"
    );
    let rows: Vec<Vec<&str>> = lines[8..11]
        .iter()
        .map(|l| l.split_whitespace().collect())
        .collect();
    let t = fq("orders");
    assert_eq!(
        rows,
        [
            [t.as_str(), "b1", "120", "0", "ok"],
            [t.as_str(), "b0", "120", "0", "ok"],
            [t.as_str(), "b2", "7", "113", "lagging"],
        ],
        "{text}"
    );
    let v = env.json(&["cluster", "brokers"]).await;
    assert_eq!(v["groups"][0]["replicas"], 3, "{v}");
    assert_eq!(v["groups"][0]["leader"], "b0", "{v}");
    assert_eq!(
        v["groups"][0]["member_status"][2]["health"], "lagging",
        "{v}"
    );
    assert_eq!(v["groups"][0]["member_status"][2]["lag"], 113, "{v}");
}

#[tokio::test]
async fn topics_create_with_replicas_on_a_standalone_broker_is_one_line_and_exit_1() {
    let b = InProcessBroker::start().await;
    let env = Env::at(b.url());
    let out = env
        .run(&["topics", "create", "orders", "--replicas", "3"])
        .await;
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("needs cluster mode"), "{err}");
    // Factor 1 is an ordinary create.
    env.ok(&["topics", "create", "orders", "--replicas", "1"])
        .await;
    // The same for a partitioned topic: refused above 1, nothing created.
    let out = env
        .run(&[
            "topics",
            "create",
            "parted",
            "--partitions",
            "2",
            "--replicas",
            "3",
        ])
        .await;
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("needs cluster mode"), "{err}");
    let listed = String::from_utf8_lossy(&env.ok(&["topics", "list"]).await.stdout).into_owned();
    assert!(!listed.contains("parted"), "{listed}");
    env.ok(&[
        "topics",
        "create",
        "parted",
        "--partitions",
        "2",
        "--replicas",
        "1",
    ])
    .await;
    let listed = String::from_utf8_lossy(&env.ok(&["topics", "list"]).await.stdout).into_owned();
    assert!(listed.contains("parted"), "{listed}");
}

/// `policy`, `dlq` and `topics delete` on a partitioned topic's base name,
/// given one broker of a real three-broker cluster: each covers the
/// partitions on every broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn base_name_commands_cover_every_partition_on_a_real_cluster() {
    let Some(etcd) =
        ricochet_testkit::etcd_or_skip("base_name_commands_cover_every_partition").await
    else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let brokers = ricochet_testkit::spawn_cluster(
        &etcd,
        "cli",
        3,
        root.path(),
        std::time::Duration::from_secs(3),
        &ricochet_testkit::SpawnOptions::new(),
    )
    .await;
    let env = Env::at(brokers[0].url());
    env.ok(&["topics", "create", "orders", "--partitions", "6"])
        .await;
    let mut owners = std::collections::BTreeSet::new();
    for i in 0..6 {
        let l = env
            .json(&["cluster", "lookup", &format!("orders-partition-{i}")])
            .await;
        owners.insert(l["owners"][0]["broker_id"].as_str().unwrap().to_owned());
    }
    assert_eq!(owners.len(), 3, "spread over the three brokers");
    let keys = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l"];
    for key in keys {
        env.ok(&["produce", "orders", "-m", key, "-k", key]).await;
    }
    env.nack_all("orders", "broken").await;

    let list = env.json(&["dlq", "list", "orders", "billing"]).await;
    assert_eq!(u(&list["total"]), keys.len() as u64, "{list}");
    let origins: std::collections::BTreeSet<&str> = list["dead_letters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["origin"]["topic"].as_str().unwrap())
        .collect();
    assert!(
        origins.len() > 1,
        "dead letters of several partitions: {origins:?}"
    );

    let set = env
        .json(&[
            "policy",
            "set",
            "orders",
            "billing",
            "backoff:fixed=1s,max=3",
        ])
        .await;
    assert_eq!(set["source"], "admin", "{set}");
    for i in 0..6 {
        let got = env
            .json(&["policy", "get", &format!("orders-partition-{i}"), "billing"])
            .await;
        assert_eq!(got["source"], "admin", "partition {i}: {got}");
        assert_eq!(
            got["spec"], "backoff:fixed=1s,max=3",
            "partition {i}: {got}"
        );
    }

    let purged = env
        .json(&["dlq", "purge", "orders", "billing", "--yes"])
        .await;
    assert_eq!(u(&purged["purged"]), keys.len() as u64, "{purged}");

    let refused = env.run(&["topics", "delete", "orders", "--yes"]).await;
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        stderr(&refused).contains("subscription"),
        "{}",
        stderr(&refused)
    );
    env.ok(&["topics", "delete", "orders", "--force", "--yes"])
        .await;
    for b in &brokers {
        let list = Env::at(b.url()).json(&["topics", "list"]).await;
        let left: Vec<&serde_json::Value> = list["topics"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| {
                t.as_str()
                    .and_then(|t| t.strip_prefix("persistent://public/default/orders-partition-"))
                    .is_some_and(|i| i.parse::<u32>().is_ok())
            })
            .collect();
        assert!(left.is_empty(), "{}: {left:?}", b.url());
    }
}
