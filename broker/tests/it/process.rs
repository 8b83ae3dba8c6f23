//! The broker process's own settings, as the kernel sees them.

/// mimalloc asks for transparent huge pages on its arenas; the broker turns
/// them off for its process at start (each first touch of a fresh region
/// zeroed 2 MiB: 30% of the samples of three R3 brokers, see
/// `docs/src/replication-history-throughput.md`, session 8).
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread")]
async fn the_broker_process_runs_without_transparent_huge_pages() {
    let dir = tempfile::tempdir().expect("temp dir");
    let broker =
        ricochet_testkit::BrokerProcess::spawn(dir.path(), &ricochet_testkit::SpawnOptions::new())
            .await;
    let status =
        std::fs::read_to_string(format!("/proc/{}/status", broker.pid())).expect("its status");
    let thp = status
        .lines()
        .find_map(|l| l.strip_prefix("THP_enabled:"))
        .map(str::trim);
    assert_eq!(thp, Some("0"), "{status}");
}
