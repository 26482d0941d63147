//! Ports for the servers the tests start.
//!
//! A port the kernel hands out for `bind(:0)` comes from the ephemeral range, the same range it
//! draws the local ports of outgoing connections from. Between the moment a test learns such a
//! port and the moment its server binds it, any of the hundreds of connections a parallel test
//! run opens can take it ("address already in use", seen on kruise-manager's metrics port). Ports
//! below the ephemeral range are never given to outgoing connections, so only another test's
//! server could take one; drawing them at random and checking each is free makes that rare.

use std::net::{Ipv4Addr, TcpListener};
use std::sync::Mutex;

/// Where the draw starts: above the well-known and most registered services' ports.
const LOWEST: u16 = 10_000;
/// Used when the kernel's range cannot be read: Linux's default start of the ephemeral range.
const DEFAULT_EPHEMERAL_START: u16 = 32_768;

/// A TCP port no listener holds now, outside the kernel's ephemeral range.
///
/// Not reserved: the caller's server should bind it soon. Two calls in one process never return
/// the same port.
pub fn free_port() -> std::io::Result<u16> {
    static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    let end = ephemeral_start().max(LOWEST + 1_000);
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..1_000 {
        let port = fastrand::u16(LOWEST..end);
        if given.contains(&port) {
            continue;
        }
        // Unspecified address: a server on any address (loopback, a node's IP) holds the port.
        if TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)).is_ok() {
            given.push(port);
            return Ok(port);
        }
    }
    // Nearly every port below the ephemeral range in use: let the kernel choose.
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port())
}

fn ephemeral_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(DEFAULT_EPHEMERAL_START)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_below_the_ephemeral_range_bindable_and_not_repeated() {
        let start = ephemeral_start();
        let ports: Vec<u16> = (0..50).map(|_| free_port().unwrap()).collect();
        for &port in &ports {
            assert!(
                (LOWEST..start).contains(&port),
                "{port} outside {LOWEST}..{start}"
            );
            TcpListener::bind((Ipv4Addr::LOCALHOST, port)).unwrap();
        }
        let mut unique = ports.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ports.len(), "{ports:?}");
    }
}
