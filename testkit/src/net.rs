//! Loopback addresses for tests: a port nothing in this process has been
//! given before, for a listener that has to be on a known address (a
//! broker's metrics endpoint, a broker restarted on the same port).

use std::net::{SocketAddr, TcpListener};
use std::sync::Mutex;

/// A free loopback port, never the same one twice in this process (the OS
/// may hand a just-released port out again, and a test may need two).
///
/// Free when chosen: another process can still take it before the caller
/// binds it, so prefer port 0 wherever the listener can report its port.
pub fn free_addr() -> SocketAddr {
    static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    loop {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let addr = l.local_addr().expect("local address");
        let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
        if !given.contains(&addr.port()) {
            given.push(addr.port());
            return addr;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_the_same_port_twice() {
        let ports: Vec<u16> = (0..50).map(|_| free_addr().port()).collect();
        let mut unique = ports.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ports.len(), "{ports:?}");
        assert!(free_addr().ip().is_loopback());
    }
}
