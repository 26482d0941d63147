//! tcpSocket probes, and the dialer shared with httpGet probes.
//!
//! Like kubelet's dialer: one deadline for name resolution and all addresses, errors worded like
//! Go's `net.Dial` (`dial tcp 127.0.0.1:1234: connect: connection refused`).
//!
//! Deliberate deviation: kubelet's ProbeDialer sets SO_LINGER {on, 1 s}. We do not. With a
//! non-zero linger, Linux's close(2) blocks until the FIN is acknowledged (up to 1 s against an
//! unresponsive peer) even on a non-blocking socket; Go parks a spare OS thread for that, but
//! here the close would run on a tokio worker and stall every other probe on it (tokio deprecates
//! `set_linger` for this reason). A normal close still sends FIN; the only difference is that
//! TIME_WAIT handling stays the kernel default.
use std::fmt;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::net::{TcpSocket, TcpStream};
use tokio::time::Instant;

use super::Observation;

pub async fn attempt(host: &str, port: u16, timeout: Duration) -> Observation {
    match dial(host, port, Instant::now() + timeout).await {
        // Nothing is sent; dropping the stream closes the socket at once.
        Ok(_stream) => Observation::succeeded(""),
        Err(err) => Observation::failed(err.to_string()),
    }
}

/// `host:port`, with IPv6 literals bracketed (Go's `net.JoinHostPort`).
pub fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// A dial failure, displayed like Go's `*net.OpError`.
#[derive(Debug)]
pub struct DialError {
    /// The address being dialled (`None` when resolution failed).
    addr: Option<String>,
    kind: DialErrorKind,
}

#[derive(Debug)]
enum DialErrorKind {
    Lookup { host: String, error: String },
    Timeout,
    Connect(io::Error),
    Socket(io::Error),
}

impl DialError {
    pub fn is_timeout(&self) -> bool {
        matches!(self.kind, DialErrorKind::Timeout)
    }
}

/// Go's wording for an errno: the C text with a lower-case first letter
/// ("connection refused", "no route to host", "network is unreachable").
pub(crate) fn errno_text(err: &io::Error) -> String {
    match err.raw_os_error() {
        Some(code) => {
            let desc = nix::errno::Errno::from_raw(code).desc();
            let mut chars = desc.chars();
            match chars.next() {
                Some(first) => first.to_lowercase().chain(chars).collect(),
                None => desc.to_string(),
            }
        }
        None => err.to_string(),
    }
}

impl fmt::Display for DialError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.addr, &self.kind) {
            (_, DialErrorKind::Lookup { host, error }) => {
                write!(f, "dial tcp: lookup {host}: {error}")
            }
            (Some(addr), DialErrorKind::Timeout) => write!(f, "dial tcp {addr}: i/o timeout"),
            (None, DialErrorKind::Timeout) => write!(f, "dial tcp: i/o timeout"),
            (Some(addr), DialErrorKind::Connect(e)) => {
                write!(f, "dial tcp {addr}: connect: {}", errno_text(e))
            }
            (Some(addr), DialErrorKind::Socket(e)) => {
                write!(f, "dial tcp {addr}: socket: {}", errno_text(e))
            }
            (None, DialErrorKind::Connect(e) | DialErrorKind::Socket(e)) => {
                write!(f, "dial tcp: {}", errno_text(e))
            }
        }
    }
}

impl std::error::Error for DialError {}

/// Resolves `host` (IP literal or DNS name) and connects to the first address that answers,
/// all before `deadline`. Like Go's serial dialer, each address gets a fair share of the
/// remaining time (at least 2 s when that much is left).
pub async fn dial(host: &str, port: u16, deadline: Instant) -> Result<TcpStream, DialError> {
    let literal = host.trim_start_matches('[').trim_end_matches(']');
    let addrs: Vec<SocketAddr> = match literal.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => {
            let lookup = tokio::net::lookup_host((literal, port));
            match tokio::time::timeout_at(deadline, lookup).await {
                Err(_) => {
                    return Err(DialError {
                        addr: None,
                        kind: DialErrorKind::Lookup {
                            host: host.to_string(),
                            error: "i/o timeout".into(),
                        },
                    });
                }
                Ok(Err(e)) => {
                    return Err(DialError {
                        addr: None,
                        kind: DialErrorKind::Lookup {
                            host: host.to_string(),
                            error: lookup_error_text(&e),
                        },
                    });
                }
                Ok(Ok(addrs)) => addrs.collect(),
            }
        }
    };
    if addrs.is_empty() {
        return Err(DialError {
            addr: None,
            kind: DialErrorKind::Lookup {
                host: host.to_string(),
                error: "no such host".into(),
            },
        });
    }

    let mut first_error = None;
    let count = addrs.len();
    for (i, addr) in addrs.into_iter().enumerate() {
        let now = Instant::now();
        let remaining = deadline.saturating_duration_since(now);
        let share = partial_timeout(remaining, (count - i) as u32);
        match connect(addr, now + share).await {
            Ok(stream) => return Ok(stream),
            Err(kind) => {
                first_error.get_or_insert(DialError {
                    addr: Some(addr.to_string()),
                    kind,
                });
            }
        }
        if Instant::now() >= deadline {
            break;
        }
    }
    Err(first_error.expect("at least one address was tried"))
}

/// Go's `partialDeadline`: remaining / addresses left, but not below 2 s unless less is left.
fn partial_timeout(remaining: Duration, addrs_left: u32) -> Duration {
    const SANE_MINIMUM: Duration = Duration::from_secs(2);
    let share = remaining / addrs_left.max(1);
    if share < SANE_MINIMUM {
        remaining.min(SANE_MINIMUM)
    } else {
        share
    }
}

fn lookup_error_text(err: &io::Error) -> String {
    // getaddrinfo's "Name or service not known" is Go's "no such host".
    let text = err.to_string();
    if text.contains("not known") || text.contains("No address associated") {
        "no such host".into()
    } else {
        text
    }
}

async fn connect(addr: SocketAddr, deadline: Instant) -> Result<TcpStream, DialErrorKind> {
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4(),
        SocketAddr::V6(_) => TcpSocket::new_v6(),
    }
    .map_err(DialErrorKind::Socket)?;
    match tokio::time::timeout_at(deadline, socket.connect(addr)).await {
        Err(_) => Err(DialErrorKind::Timeout),
        Ok(Err(e)) if e.kind() == io::ErrorKind::TimedOut => Err(DialErrorKind::Timeout),
        Ok(Err(e)) => Err(DialErrorKind::Connect(e)),
        Ok(Ok(stream)) => {
            let _ = stream.set_nodelay(true);
            Ok(stream)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_brackets_ipv6() {
        assert_eq!(join_host_port("10.1.2.3", 80), "10.1.2.3:80");
        assert_eq!(join_host_port("fd00::5", 8080), "[fd00::5]:8080");
        assert_eq!(join_host_port("localhost", 1), "localhost:1");
    }

    #[test]
    fn errno_text_is_go_like() {
        let e = io::Error::from_raw_os_error(nix::libc::ECONNREFUSED);
        assert_eq!(errno_text(&e), "connection refused");
        let e = io::Error::from_raw_os_error(nix::libc::EHOSTUNREACH);
        assert_eq!(errno_text(&e), "no route to host");
    }

    #[test]
    fn partial_deadline_like_go() {
        let s = Duration::from_secs;
        assert_eq!(partial_timeout(s(1), 3), s(1));
        assert_eq!(partial_timeout(s(10), 2), s(5));
        assert_eq!(partial_timeout(s(3), 3), s(2));
    }
}
