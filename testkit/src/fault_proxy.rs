//! A TCP proxy that injects network faults between two parties of a test
//! (brokers of a Raft group, a client and a broker): traffic through it
//! can be delayed, cut in one direction (bytes read and discarded, the
//! connection left up, as a one-way partition looks to TCP), or dropped
//! (every connection closed, new ones closed at once, as a peer that went
//! away). Faults apply to connections already open and to new ones, and
//! are lifted with [`FaultProxy::heal`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Which way bytes flow through the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// From whoever connects to the proxy to the upstream.
    ToUpstream,
    /// From the upstream back to whoever connected.
    FromUpstream,
}

#[derive(Debug, Default)]
struct Faults {
    delay_ms: AtomicU64,
    cut_to: AtomicBool,
    cut_from: AtomicBool,
    dropped: AtomicBool,
}

impl Faults {
    fn cut(&self, d: Direction) -> &AtomicBool {
        match d {
            Direction::ToUpstream => &self.cut_to,
            Direction::FromUpstream => &self.cut_from,
        }
    }
}

/// A proxy listening on a loopback port and forwarding to `upstream`.
/// Dropping it stops it and closes its connections.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    faults: Arc<Faults>,
    /// Bumped to close every open connection.
    closer: watch::Sender<u64>,
    task: JoinHandle<()>,
}

impl FaultProxy {
    /// Starts a proxy on `127.0.0.1:0` in front of `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the fault proxy");
        let addr = listener.local_addr().expect("proxy address");
        let faults = Arc::new(Faults::default());
        let (closer, _) = watch::channel(0u64);
        let task = tokio::spawn(accept(listener, upstream, faults.clone(), closer.clone()));
        Self {
            addr,
            faults,
            closer,
            task,
        }
    }

    /// Where to connect instead of the upstream.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://` and [`FaultProxy::addr`], for a gRPC endpoint.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Holds every chunk of bytes this long before forwarding it.
    pub fn delay(&self, by: Duration) {
        self.faults
            .delay_ms
            .store(by.as_millis() as u64, Ordering::SeqCst);
    }

    /// Discards every byte flowing in `direction` (connections stay open).
    pub fn cut(&self, direction: Direction) {
        self.faults.cut(direction).store(true, Ordering::SeqCst);
    }

    /// Discards bytes in both directions (a full partition).
    pub fn isolate(&self) {
        self.cut(Direction::ToUpstream);
        self.cut(Direction::FromUpstream);
    }

    /// Closes every open connection, and every new one at once, until
    /// [`FaultProxy::heal`].
    pub fn drop_connections(&self) {
        self.faults.dropped.store(true, Ordering::SeqCst);
        self.closer.send_modify(|g| *g += 1);
    }

    /// Lifts every fault: no delay, nothing cut, connections accepted.
    pub fn heal(&self) {
        self.faults.delay_ms.store(0, Ordering::SeqCst);
        self.faults.cut_to.store(false, Ordering::SeqCst);
        self.faults.cut_from.store(false, Ordering::SeqCst);
        self.faults.dropped.store(false, Ordering::SeqCst);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
        self.closer.send_modify(|g| *g += 1);
    }
}

async fn accept(
    listener: TcpListener,
    upstream: SocketAddr,
    faults: Arc<Faults>,
    closer: watch::Sender<u64>,
) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        if faults.dropped.load(Ordering::SeqCst) {
            drop(client);
            continue;
        }
        let faults = faults.clone();
        let closed = closer.subscribe();
        tokio::spawn(async move {
            let Ok(server) = TcpStream::connect(upstream).await else {
                return;
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            let to = pump(
                cr,
                sw,
                Direction::ToUpstream,
                faults.clone(),
                closed.clone(),
            );
            let from = pump(sr, cw, Direction::FromUpstream, faults, closed);
            // Either side ending ends the connection.
            tokio::select! {
                _ = to => {}
                _ = from => {}
            }
        });
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    direction: Direction,
    faults: Arc<Faults>,
    mut closed: watch::Receiver<u64>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = tokio::select! {
            r = from.read(&mut buf) => match r {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            _ = closed.changed() => return,
        };
        if faults.dropped.load(Ordering::SeqCst) {
            return;
        }
        let delay = faults.delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        if faults.cut(direction).load(Ordering::SeqCst) {
            continue;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;

    /// An upstream that echoes what it reads and reports it on `seen`.
    async fn echo() -> (SocketAddr, mpsc::UnboundedReceiver<Vec<u8>>) {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr");
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let tx = tx.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                        let _ = tx.send(buf[..n].to_vec());
                    }
                });
            }
        });
        (addr, rx)
    }

    async fn read_within(s: &mut TcpStream, ms: u64) -> Option<Vec<u8>> {
        let mut buf = [0u8; 1024];
        match tokio::time::timeout(Duration::from_millis(ms), s.read(&mut buf)).await {
            Ok(Ok(n)) => Some(buf[..n].to_vec()),
            Ok(Err(_)) => Some(Vec::new()),
            Err(_) => None,
        }
    }

    #[tokio::test]
    async fn passes_delays_cuts_each_direction_and_drops() {
        let (upstream, mut seen) = echo().await;
        let proxy = FaultProxy::start(upstream).await;
        let mut s = TcpStream::connect(proxy.addr()).await.expect("connect");

        // Through, both ways.
        s.write_all(b"one").await.expect("write");
        assert_eq!(
            read_within(&mut s, 2000).await.as_deref(),
            Some(&b"one"[..])
        );
        assert_eq!(seen.recv().await.as_deref(), Some(&b"one"[..]));

        // Delayed.
        proxy.delay(Duration::from_millis(300));
        let t = std::time::Instant::now();
        s.write_all(b"two").await.expect("write");
        assert_eq!(
            read_within(&mut s, 3000).await.as_deref(),
            Some(&b"two"[..])
        );
        assert!(
            t.elapsed() >= Duration::from_millis(600),
            "{:?}",
            t.elapsed()
        );
        assert_eq!(seen.recv().await.as_deref(), Some(&b"two"[..]));
        proxy.heal();

        // Cut towards the upstream: it never sees the bytes.
        proxy.cut(Direction::ToUpstream);
        s.write_all(b"lost").await.expect("write");
        assert_eq!(read_within(&mut s, 500).await, None);
        assert!(seen.try_recv().is_err());
        proxy.heal();

        // Cut back from the upstream: it sees them, the client gets nothing.
        proxy.cut(Direction::FromUpstream);
        s.write_all(b"half").await.expect("write");
        assert_eq!(seen.recv().await.as_deref(), Some(&b"half"[..]));
        assert_eq!(read_within(&mut s, 500).await, None);
        proxy.heal();
        s.write_all(b"back").await.expect("write");
        assert_eq!(
            read_within(&mut s, 2000).await.as_deref(),
            Some(&b"back"[..])
        );
        assert_eq!(seen.recv().await.as_deref(), Some(&b"back"[..]));

        // Dropped: the open connection ends, a new one is closed at once.
        proxy.drop_connections();
        assert_eq!(read_within(&mut s, 2000).await.as_deref(), Some(&b""[..]));
        let mut again = TcpStream::connect(proxy.addr()).await.expect("connect");
        again.write_all(b"x").await.ok();
        assert_eq!(
            read_within(&mut again, 2000).await.as_deref(),
            Some(&b""[..])
        );
        assert!(seen.try_recv().is_err());

        // Healed: new connections pass again.
        proxy.heal();
        let mut fresh = TcpStream::connect(proxy.addr()).await.expect("connect");
        fresh.write_all(b"new").await.expect("write");
        assert_eq!(
            read_within(&mut fresh, 2000).await.as_deref(),
            Some(&b"new"[..])
        );
    }
}
