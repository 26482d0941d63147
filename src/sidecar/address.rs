//! The pod's own IP when neither `POD_IP` nor the pod's status gives it.
//!
//! Some providers cannot fill `POD_IP` (the virtual-kubelet library does not resolve
//! `status.podIP`) and report the pod's IP late, after the containers start. The sidecar shares
//! the pod's network namespace, so the address its kernel would send from towards the apiserver
//! is the pod's address on its primary interface: where the kubelet's probes would aim.
//! Connecting a UDP socket only picks the route; nothing is sent. Outside a pod (no
//! `KUBERNETES_SERVICE_HOST`) there is no such address to find, and the sidecar aims at
//! 127.0.0.1.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs, UdpSocket};

/// The pod's address towards the in-cluster apiserver (`KUBERNETES_SERVICE_HOST`, an address
/// or a name), in a pod.
pub fn own_address() -> Option<IpAddr> {
    let host = std::env::var("KUBERNETES_SERVICE_HOST").ok()?;
    let apiserver = match host.parse() {
        Ok(ip) => ip,
        Err(_) => (host.as_str(), 443).to_socket_addrs().ok()?.next()?.ip(),
    };
    address_towards(apiserver)
}

/// The local address this host would send from to `towards`, if it is not a loopback one.
fn address_towards(towards: IpAddr) -> Option<IpAddr> {
    let unspecified = match towards {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    };
    let socket = UdpSocket::bind(SocketAddr::new(unspecified, 0)).ok()?;
    socket.connect(SocketAddr::new(towards, 443)).ok()?;
    let local = socket.local_addr().ok()?.ip();
    (!local.is_loopback() && !local.is_unspecified()).then_some(local)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn towards_loopback_there_is_no_own_address() {
        assert_eq!(address_towards(IpAddr::V4(Ipv4Addr::LOCALHOST)), None);
    }

    #[test]
    fn the_address_is_one_this_host_can_bind() {
        // As in a pod: a network namespace with a default route (RFC 5737's documentation
        // address follows it).
        let anywhere = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
        let ip = address_towards(anywhere).expect("this machine has a default route");
        std::net::TcpListener::bind(SocketAddr::new(ip, 0)).expect("a local address");
    }
}
