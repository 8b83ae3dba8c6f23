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

/// A port chosen ahead can be taken by another process before the broker
/// binds it (CI saw `Address already in use` for a cluster broker): the
/// harness starts the broker again on a fresh address instead of failing.
#[tokio::test(flavor = "multi_thread")]
async fn a_broker_whose_chosen_port_was_taken_is_started_on_another() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let dir = tempfile::tempdir().expect("temp dir");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a port to take");
    let taken_addr = taken.local_addr().expect("its address");
    let calls = AtomicUsize::new(0);
    let (broker, addr, _) = ricochet_testkit::BrokerProcess::spawn_on_free_addr(dir.path(), |a| {
        // The first address handed out is already taken by this test.
        let a = if calls.fetch_add(1, Ordering::SeqCst) == 0 {
            taken_addr
        } else {
            a
        };
        ricochet_testkit::SpawnOptions::new().listen(a)
    })
    .await;
    assert_eq!(calls.load(Ordering::SeqCst), 2, "one retry");
    assert_ne!(addr, taken_addr);
    assert_eq!(broker.url(), format!("http://{addr}"));
    drop(taken);
}
