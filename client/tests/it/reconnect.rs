//! Transparent reconnects: the broker restarts on the same data directory
//! and port while a producer and a consumer are connected.

use crate::common;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use common::{assert_quiet, recv, text};
use ricochet_broker::{Broker, BrokerConfig};
use ricochet_client::{Client, ErrorKind, InitialPosition};
use ricochet_testkit::free_addr;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

const T: Duration = Duration::from_secs(8);

/// A broker on a fixed address, in its own runtime on its own thread, so
/// that it can be stopped like a process: the broker's graceful shutdown
/// waits for every open stream to end, and the client's streams never do
/// (see the report), so `stop` signals the graceful shutdown, gives it a
/// moment, flushes storage, then drops the runtime, which closes every
/// connection and releases the sled directory.
struct Running {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

async fn start_at(dir: &Path, addr: SocketAddr) -> Running {
    let dir = dir.to_owned();
    let (ready_tx, ready_rx) = oneshot::channel::<()>();
    let (stop, stop_rx) = oneshot::channel::<()>();
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let broker = Broker::builder(BrokerConfig::for_dir(&dir))
                .open()
                .await
                .expect("broker opens");
            let core = broker.core().clone();
            let listener = TcpListener::bind(addr).await.expect("port still free");
            let (graceful_tx, graceful_rx) = oneshot::channel::<()>();
            let serve = tokio::spawn(broker.serve(listener, async {
                let _ = graceful_rx.await;
            }));
            let _ = ready_tx.send(());
            let _ = stop_rx.await;
            let _ = graceful_tx.send(());
            let _ = tokio::time::timeout(Duration::from_millis(100), serve).await;
            core.storage.flush().await.expect("flush");
        });
        // Dropping the runtime drops every connection task.
        drop(rt);
    });
    ready_rx.await.expect("broker thread started");
    Running {
        stop: Some(stop),
        thread: Some(thread),
    }
}

impl Running {
    async fn shutdown(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            tokio::task::spawn_blocking(move || t.join())
                .await
                .expect("join")
                .expect("broker thread");
        }
    }
}

#[tokio::test]
async fn producer_and_consumer_survive_a_broker_restart() {
    let dir = tempfile::tempdir().unwrap();
    let addr = free_addr();
    let broker = start_at(dir.path(), addr).await;
    let client = Client::builder(format!("http://{addr}"))
        .request_timeout(Duration::from_secs(5))
        .reconnect_backoff(Duration::from_millis(20), Duration::from_millis(200))
        .connect()
        .await
        .unwrap();
    let topic = "reconnect";
    let mut consumer = client
        .consumer(topic)
        .subscription("s")
        .initial_position(InitialPosition::Earliest)
        .ack_group_time(Duration::from_millis(5))
        .subscribe()
        .await
        .unwrap();
    let producer = client.producer(topic).create().await.unwrap();
    for i in 0..10 {
        producer.send(format!("before-{i}")).await.unwrap();
    }
    // Consume and ack half; hold the rest unacked across the restart.
    let mut acked = HashSet::new();
    for i in 0..10 {
        let m = recv(&mut consumer, T).await;
        if i < 5 {
            consumer.ack(&m).await.unwrap();
            acked.insert(text(&m));
        }
    }
    // The five acks are durable before the restart (not merely sent).
    consumer.flush().await.unwrap();

    broker.shutdown().await;
    // Sends while the broker is down are queued and resent.
    let mut queued = Vec::new();
    for i in 0..10 {
        queued.push(producer.send_async(format!("during-{i}")).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let broker = start_at(dir.path(), addr).await;

    for q in queued {
        let id = tokio::time::timeout(T, q)
            .await
            .expect("resent in time")
            .expect("stored");
        assert!(!id.is_unknown());
    }
    producer.send("after").await.unwrap();

    // The consumer resubscribed: the 5 unacked come back, then the new
    // messages, each exactly once. (A broker restart loses its in-memory
    // in-flight state, so those deliveries are not counted as failures.)
    let mut seen = Vec::new();
    while seen.len() < 16 {
        let m = recv(&mut consumer, T).await;
        let body = text(&m);
        assert!(!acked.contains(&body), "acked message {body} came back");
        consumer.ack(&m).await.unwrap();
        seen.push(body);
    }
    let unique: HashSet<_> = seen.iter().cloned().collect();
    assert_eq!(unique.len(), seen.len(), "no duplicates: {seen:?}");
    for i in 0..10 {
        assert!(unique.contains(&format!("during-{i}")));
    }
    assert_quiet(&mut consumer, Duration::from_millis(300)).await;
    consumer.close().await.unwrap();
    producer.close().await.unwrap();
    broker.shutdown().await;
}

#[tokio::test]
async fn a_producer_resend_is_deduplicated() {
    // The receipt of a stored batch is lost when the broker stops right
    // after the write: the resend carries the same sequence ids and the
    // broker keeps one copy.
    let dir = tempfile::tempdir().unwrap();
    let addr = free_addr();
    let broker = start_at(dir.path(), addr).await;
    let client = Client::builder(format!("http://{addr}"))
        .reconnect_backoff(Duration::from_millis(20), Duration::from_millis(200))
        .connect()
        .await
        .unwrap();
    let producer = client
        .producer("dedup")
        .name("stable-name")
        .create()
        .await
        .unwrap();
    let first = producer.send("one").await.unwrap();
    assert_eq!(producer.last_sequence_id(), 0);
    broker.shutdown().await;
    let broker = start_at(dir.path(), addr).await;
    producer.send("two").await.unwrap();
    // The broker knew sequence id 0 when the producer reopened.
    assert_eq!(producer.last_sequence_id(), 0);
    producer.close().await.unwrap();
    // A new producer with the same name continues the sequence.
    let again = client
        .producer("dedup")
        .name("stable-name")
        .create()
        .await
        .unwrap();
    assert_eq!(again.last_sequence_id(), 1);
    let mut c = client
        .consumer("dedup")
        .subscription("s")
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await
        .unwrap();
    let m = recv(&mut c, T).await;
    assert_eq!(m.id(), &first);
    assert_eq!(text(&recv(&mut c, T).await), "two");
    assert_quiet(&mut c, Duration::from_millis(200)).await;
    c.close().await.unwrap();
    again.close().await.unwrap();
    broker.shutdown().await;
}

/// A TCP proxy whose connections can be cut, to break the client's streams
/// while the broker stays up.
struct Proxy {
    addr: SocketAddr,
    conns: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let conns = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let list = conns.clone();
        let accept = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let task = tokio::spawn(async move {
                    if let Ok(mut out) = tokio::net::TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                    }
                });
                list.lock().unwrap().push(task);
            }
        });
        Proxy {
            addr,
            conns,
            accept,
        }
    }

    /// Drops every open connection (both directions see a reset/EOF).
    fn cut(&self) {
        for t in self.conns.lock().unwrap().drain(..) {
            t.abort();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        self.accept.abort();
    }
}

#[tokio::test]
async fn consumer_resubscribes_after_a_broken_stream() {
    let env = common::start().await;
    let proxy = Proxy::start(env.broker.addr).await;
    let client = Client::builder(format!("http://{}", proxy.addr))
        .request_timeout(Duration::from_secs(5))
        .reconnect_backoff(Duration::from_millis(20), Duration::from_millis(200))
        .connect()
        .await
        .unwrap();
    let topic = common::topic("cut");
    // Produce through the direct client, so only the consumer is cut.
    let producer = env.client.producer(&topic).create().await.unwrap();
    let mut consumer = client
        .consumer(&topic)
        .subscription("s")
        .initial_position(InitialPosition::Earliest)
        // Acks stay grouped (unsent) when the stream breaks.
        .ack_group_time(Duration::from_secs(60))
        .subscribe()
        .await
        .unwrap();
    for i in 0..10 {
        drop(producer.send_async(format!("m{i}")).await.unwrap());
    }
    producer.flush().await.unwrap();
    let mut held = HashSet::new();
    for i in 0..10 {
        let m = recv(&mut consumer, T).await;
        assert_eq!(m.delivery_count(), 0);
        if i < 5 {
            consumer.ack(&m).await.unwrap();
        } else {
            held.insert(text(&m));
        }
    }
    proxy.cut();
    // The broker saw the consumer go: everything in flight comes back with
    // its count bumped, the five acked before the break too (their acks
    // were never sent; an ack from before the break never applies to a
    // message delivered after it).
    let mut back = HashSet::new();
    for _ in 0..10 {
        let m = recv(&mut consumer, T).await;
        assert_eq!(m.delivery_count(), 1, "{}", text(&m));
        back.insert(text(&m));
        consumer.ack(&m).await.unwrap();
    }
    assert_eq!(back.len(), 10);
    assert!(held.iter().all(|h| back.contains(h)));
    // New messages flow on the new stream.
    producer.send("after").await.unwrap();
    let m = recv(&mut consumer, T).await;
    assert_eq!(text(&m), "after");
    consumer.ack(&m).await.unwrap();
    // Close reports the five acks lost with the break, once.
    match consumer.close().await {
        Err(ref e) if e.kind() == ErrorKind::Unconfirmed => {
            assert_eq!(e.unconfirmed_count().unwrap(), 5)
        }
        other => panic!("expected five unconfirmed acks, got {other:?}"),
    }
    drop(consumer);
    // Everything is acked: a new consumer gets nothing.
    let mut c = env
        .client
        .consumer(&topic)
        .subscription("s")
        .subscribe()
        .await
        .unwrap();
    assert_quiet(&mut c, Duration::from_millis(300)).await;
}

#[tokio::test]
async fn producer_stream_cut_mid_flight_stores_each_message_once() {
    let env = common::start().await;
    let proxy = Proxy::start(env.broker.addr).await;
    let client = Client::builder(format!("http://{}", proxy.addr))
        .reconnect_backoff(Duration::from_millis(10), Duration::from_millis(100))
        .connect()
        .await
        .unwrap();
    let topic = common::topic("cut-producer");
    let producer = client
        .producer(&topic)
        .batch_max_messages(50)
        .create()
        .await
        .unwrap();
    let mut futs = std::collections::VecDeque::new();
    for i in 0..2000 {
        futs.push_back(producer.send_async(format!("{i}")).await.unwrap());
    }
    let mut unknown = 0;
    // Cut once the first batches are receipted, with later ones in the air.
    let first = futs.pop_front().unwrap();
    first.await.unwrap();
    proxy.cut();
    for f in futs {
        let id = tokio::time::timeout(T, f)
            .await
            .expect("in time")
            .expect("stored");
        unknown += usize::from(id.is_unknown());
    }
    producer.close().await.unwrap();
    let mut c = env
        .client
        .consumer(&topic)
        .subscription("s")
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await
        .unwrap();
    for i in 0..2000 {
        let m = recv(&mut c, T).await;
        assert_eq!(text(&m), format!("{i}"), "each message once, in order");
        c.ack(&m).await.unwrap();
    }
    assert_quiet(&mut c, Duration::from_millis(200)).await;
    eprintln!("{unknown} receipts were for already-stored resends");
}
