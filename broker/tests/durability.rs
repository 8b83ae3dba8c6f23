//! Crash tests: the broker runs as a child process and is killed with SIGKILL
//! (no clean shutdown, no final flush), then restarted on the same directory.

mod common;
use common::*;
use ricochet_proto::*;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

fn free_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn spawn_broker(dir: &std::path::Path, addr: SocketAddr) -> Proc {
    let child = Command::new(env!("CARGO_BIN_EXE_ricochet-broker"))
        .args([
            "--data-dir",
            dir.to_str().unwrap(),
            "--listen",
            &addr.to_string(),
        ])
        .args(["--metrics-listen", &free_addr().to_string()])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn broker");
    // Owned by the guard from here on, so it is killed and reaped on any panic.
    let proc = Proc(child);
    let url = format!("http://{addr}");
    for _ in 0..200 {
        if tonic::transport::Channel::from_shared(url.clone())
            .unwrap()
            .connect()
            .await
            .is_ok()
        {
            return proc;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("broker did not come up on {addr}");
}

fn kill9(mut p: Proc) {
    // SIGKILL: no signal handler runs, nothing is flushed on the way out.
    p.0.kill().expect("kill");
    p.0.wait().expect("wait");
}

#[tokio::test]
async fn acknowledged_publishes_and_cursors_survive_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let addr = free_addr();
    let url = format!("http://{addr}");
    let broker = spawn_broker(dir.path(), addr).await;

    let mut p = RawProducer::open(&url, "durable", "p").await.unwrap();
    let mut expected = Vec::new();
    for batch in 0..20 {
        let payloads: Vec<String> = (0..50).map(|i| format!("{batch}-{i}")).collect();
        let refs: Vec<&str> = payloads.iter().map(|s| s.as_str()).collect();
        p.send(&refs).await;
        expected.extend(payloads);
    }
    // Consume and ack the first 100 (acks awaited: durable), fail 1 via nack.
    let mut c = RawConsumer::simple(&url, "durable", "s", SubscriptionType::Shared).await;
    c.flow(102).await;
    let got = c.take(101, WAIT).await;
    c.ack(
        got[..100].iter().map(|m| m.id.clone().unwrap()).collect(),
        1,
    )
    .await;
    assert_eq!(c.result(WAIT).await.unwrap().code, 0);
    c.nack(got[100].id.clone().unwrap(), "boom", 2).await;
    assert_eq!(c.result(WAIT).await.unwrap().code, 0);
    c.flow(10).await;
    let again = loop {
        let m = c.next(WAIT).await.expect("the nacked message comes back");
        if m.id.as_ref().unwrap().entry_id == 100 {
            break m;
        }
    };
    assert_eq!(again.delivery_count, 1);
    drop(c);
    drop(p);
    kill9(broker);

    let broker = spawn_broker(dir.path(), addr).await;
    let mut c = RawConsumer::simple(&url, "durable", "s", SubscriptionType::Shared).await;
    c.flow(2000).await;
    let rest = c.take(900, WAIT).await;
    assert!(
        c.next(QUIET).await.is_none(),
        "acked messages are not redelivered"
    );
    let first = &rest[0];
    assert_eq!(first.id.clone().unwrap().entry_id, 100);
    // In flight (count 1) when the broker died; the count never goes back.
    assert!(
        first.delivery_count >= 1,
        "count went backwards: {}",
        first.delivery_count
    );
    let texts: Vec<String> = rest.iter().map(text).collect();
    assert_eq!(texts, expected[100..].to_vec());
    drop(c);
    kill9(broker);
}

#[tokio::test]
async fn repeated_kills_during_publish_lose_no_receipted_message() {
    let dir = tempfile::tempdir().unwrap();
    let addr = free_addr();
    let url = format!("http://{addr}");
    let mut receipted: Vec<String> = Vec::new();
    for round in 0..4 {
        let broker = spawn_broker(dir.path(), addr).await;
        let mut p = RawProducer::open(&url, "kills", "p").await.unwrap();
        // Publish in the background; kill mid-stream.
        let task = tokio::spawn(async move {
            let mut ok = Vec::new();
            for i in 0..10_000 {
                let payload = format!("{round}-{i}");
                let m = p.msg(payload.clone());
                match tokio::time::timeout(Duration::from_secs(2), p.try_send_batch(vec![m])).await
                {
                    Ok(Some(produce_response::Response::Receipts(_))) => ok.push(payload),
                    _ => break,
                }
            }
            ok
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        kill9(broker);
        let ok = task.await.unwrap_or_default();
        assert!(!ok.is_empty(), "round {round} published nothing");
        receipted.extend(ok);
    }
    let broker = spawn_broker(dir.path(), addr).await;
    let mut c = RawConsumer::simple(&url, "kills", "s", SubscriptionType::Exclusive).await;
    c.flow(100_000).await;
    let mut stored = std::collections::HashSet::new();
    while let Some(m) = c.next(Duration::from_millis(500)).await {
        stored.insert(text(&m));
    }
    let lost: Vec<&String> = receipted.iter().filter(|r| !stored.contains(*r)).collect();
    assert!(
        lost.is_empty(),
        "{} receipted messages lost, e.g. {:?}",
        lost.len(),
        lost.first()
    );
    drop(c);
    kill9(broker);
}
