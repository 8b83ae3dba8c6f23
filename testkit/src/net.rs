//! Loopback addresses for tests: a port nothing in this process has been
//! given before, for a listener that has to be on a known address (a
//! broker's metrics endpoint, a broker restarted on the same port).
//!
//! The port is chosen outside the kernel's ephemeral range
//! (`/proc/sys/net/ipv4/ip_local_port_range`). A port from that range (what
//! binding port 0 hands out) can be taken, between the test releasing it
//! and the broker binding it, by the source port of any outgoing
//! connection on the machine; session 23's CI run failed that way. The
//! kernel never picks a port outside the range by itself, so only a
//! process that asks for that very port can take one of these.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::ops::RangeInclusive;
use std::sync::Mutex;

/// Where ports outside the ephemeral range are looked for: above the
/// well-known and most registered service ports.
const LOWEST: u16 = 10_000;

/// A free loopback port, never the same one twice in this process (the OS
/// may hand a just-released port out again, and a test may need two),
/// outside the ephemeral range when the kernel says where that is (see the
/// module).
///
/// Free when chosen: another process can still take it before the caller
/// binds it, so prefer port 0 wherever the listener can report its port.
pub fn free_addr() -> SocketAddr {
    static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    let port = match outside_ephemeral(ephemeral_range()) {
        Some(range) => probe(range, &given),
        None => None,
    }
    .unwrap_or_else(|| any_port(&given));
    given.push(port);
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

/// The kernel's ephemeral port range, if it can be read.
fn ephemeral_range() -> Option<RangeInclusive<u16>> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let mut parts = text.split_whitespace().map(str::parse::<u16>);
    let (Some(Ok(lo)), Some(Ok(hi))) = (parts.next(), parts.next()) else {
        return None;
    };
    Some(lo..=hi)
}

/// The larger stretch of ports from [`LOWEST`] up that lies outside
/// `ephemeral`, if one of at least 1 000 ports does.
fn outside_ephemeral(ephemeral: Option<RangeInclusive<u16>>) -> Option<RangeInclusive<u16>> {
    let ephemeral = ephemeral?;
    let below = (*ephemeral.start() > LOWEST).then(|| LOWEST..=ephemeral.start() - 1);
    let above = ephemeral
        .end()
        .checked_add(1)
        .filter(|&p| p >= LOWEST)
        .map(|p| p..=u16::MAX);
    let len = |r: &RangeInclusive<u16>| usize::from(*r.end() - *r.start()) + 1;
    [below, above]
        .into_iter()
        .flatten()
        .filter(|r| len(r) >= 1_000)
        .max_by_key(len)
}

/// A port of `range` not in `given` that can be bound now, starting at a
/// random place (test processes running side by side start apart), or
/// `None` after 1 000 tries.
fn probe(range: RangeInclusive<u16>, given: &[u16]) -> Option<u16> {
    let (start, len) = (
        u64::from(*range.start()),
        u64::from(*range.end() - *range.start()) + 1,
    );
    let first = RandomState::new().build_hasher().finish() % len;
    (0..len.min(1_000))
        .map(|i| (start + (first + i) % len) as u16)
        .find(|p| !given.contains(p) && TcpListener::bind((Ipv4Addr::LOCALHOST, *p)).is_ok())
}

/// A port the OS hands out for port 0, not in `given`.
fn any_port(given: &[u16]) -> u16 {
    loop {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let port = l.local_addr().expect("local address").port();
        if !given.contains(&port) {
            return port;
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

    #[test]
    fn ports_are_chosen_outside_the_ephemeral_range() {
        let Some(ephemeral) = ephemeral_range() else {
            return; // no /proc (not Linux): nothing to stay out of
        };
        if outside_ephemeral(Some(ephemeral.clone())).is_none() {
            return; // the range leaves no room: port 0, as before
        }
        for _ in 0..50 {
            let port = free_addr().port();
            assert!(!ephemeral.contains(&port), "{port} in {ephemeral:?}");
            assert!(port >= LOWEST, "{port}");
        }
    }

    #[test]
    fn the_larger_stretch_outside_the_range_is_used() {
        assert_eq!(outside_ephemeral(Some(32768..=60999)), Some(10_000..=32767));
        assert_eq!(
            outside_ephemeral(Some(10_000..=40_000)),
            Some(40_001..=65535)
        );
        // Only a stretch of at least 1 000 ports counts.
        assert_eq!(outside_ephemeral(Some(10_500..=65_000)), None);
        assert_eq!(outside_ephemeral(Some(1_024..=65_535)), None);
        assert_eq!(outside_ephemeral(None), None);
    }
}
